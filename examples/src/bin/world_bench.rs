//! `world_bench`: the OSU micro-benchmarks' measurements on the World, one
//! subcommand each, run under any of the World's launchers.
//!
//! ```text
//! mpirun -np 2 target/release/world_bench latency       # osu_latency
//! mpirun -np 2 target/release/world_bench bw            # osu_bw
//! mpirun -np 8 target/release/world_bench barrier       # osu_barrier
//! mpirun -np 8 target/release/world_bench bcast         # osu_bcast
//! mpirun -np 8 target/release/world_bench allreduce     # osu_allreduce
//! mpirun -np 8 target/release/world_bench reduce        # osu_reduce (to rank 0)
//! mpirun -np 8 target/release/world_bench scatter       # osu_scatter
//! mpirun -np 8 target/release/world_bench alltoall      # osu_alltoall
//! mpirun -np 8 target/release/world_bench scan          # f32 sum, as allreduce
//! ```
//!
//! What is timed is what OSU times. `latency`: ranks 0 and 1 ping-pong,
//! half the round trip. `bw`: rank 0 sends windows of 64 messages, rank 1
//! answers each window with a small ack; bytes per second. `barrier`,
//! `bcast` (from rank 0), `allreduce`, `reduce` (to rank 0) and `scan` (f32 sum, OSU's
//! `MPI_FLOAT`), `scatter` (from rank 0, the size being each rank's block,
//! as OSU's) and `alltoall` (the size being each pair's block): each
//! rank times each call, with an untimed barrier between calls (none for
//! `barrier`); each rank's mean is gathered on rank 0, which prints the mean
//! over ranks (OSU's "Avg Latency"), the fastest and the slowest rank's
//! mean. Rank 0 prints; a progress line goes to stderr on a terminal.
//!
//! Beside OSU's columns, the distribution: p50, p99, p99.9 and max of the
//! per-iteration times (`latency`: round trip / 2; `bw`: a window's time
//! per message; collectives: the SLOWEST rank of each call, which is what
//! a bulk-synchronous step waits for). For the collectives every rank keeps
//! its call times in a vector sized before the loop, and one allreduce
//! (max) of that vector after the loop finds each call's slowest rank.

use fabric_msg::{Buffer, Completion, Token, World};
use fabric_msg_examples::output::{self, Monitor};
use fabric_msg_examples::say;
use fabric_msg_examples::stats::{self, IterTimes, Tail};
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[path = "world_bench/collective.rs"]
mod collective;
use collective::collective;

const USAGE: &str = "\
usage: world_bench latency|bw|barrier|bcast|allreduce|reduce|scatter|alltoall|scan [options]
OSU-style measurements between the ranks of a World (mpirun, srun --mpi=pmix,
the FABRIC_MSG_RANK/SIZE/ROOT rendezvous, or alone).

  -S SIZES|all    message sizes in bytes, a comma list, or all: powers of two
                  (latency 0 and 1 B to 4 MiB; bw 1 B to 4 MiB; bcast 1 B to
                  1 MiB; allreduce 4 B to 1 MiB, as OSU's defaults; scatter
                  and alltoall 1 B to 1 MiB per rank; scan 4 B to 1 MiB)
  -I ITERATIONS   timed iterations per size (default 1000; 100 above 8 KiB)
  -W WARMUP       untimed iterations first (default 100; 10 above 8 KiB)
  -w WINDOW       bw: messages in flight per window (default 64)
  --json          one JSON object per size: bytes, avg_us, iterations,
                  p50_us, p99_us, p999_us, min_us, max_us (per-iteration
                  times; collectives: the slowest rank of each call),
                  rank_min_us and rank_max_us (collectives: the fastest and
                  slowest rank's mean), mb_per_sec for bw; a header first
  --stats         rank 0's counters at the end (World::stats: its loops,
                  and messages and bytes with each rank)
  --by-value      bcast, allreduce and reduce: the non-blocking forms and
                  wait (the vector moves in and out), not the blocking
                  slice forms (with --reversed too)
  --reversed      barrier, bcast, allreduce, reduce: on a communicator of
                  the whole World in reverse rank order (its own node
                  leaders and its own two levels where ranks span nodes;
                  bcast from and reduce to its rank 0, the World's last)
  --any-source    latency: each receive is from any rank (MPI_ANY_SOURCE),
                  not from the peer; where the World has a node loop
                  beside its fabric, such a receive is posted on both
  -h, --help      this text

Columns (as OSU's): Size, Avg Latency(us), Min Latency(us), Max Latency(us),
Iterations. For the collectives Avg is the mean over ranks of each rank's
mean time per call, Min and Max the fastest and the slowest rank's mean.
For latency they are the mean, fastest and slowest round trip / 2. Then
p50, p99, p99.9 and max of the per-iteration times (collectives: of each
call's slowest rank; bw: of each window's time per message).
FABRIC_MSG_ITER_TIMES=off: bw without per-window times.";

/// Above this many bytes a size uses the large iteration counts.
const LARGE: usize = 8192;
const MAX_SIZE: usize = 64 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Bench {
    Latency,
    Bw,
    Barrier,
    Bcast,
    Allreduce,
    Reduce,
    Scatter,
    Alltoall,
    Scan,
}

impl Bench {
    fn name(self) -> &'static str {
        match self {
            Bench::Latency => "latency",
            Bench::Bw => "bw",
            Bench::Barrier => "barrier",
            Bench::Bcast => "bcast",
            Bench::Allreduce => "allreduce",
            Bench::Reduce => "reduce",
            Bench::Scatter => "scatter",
            Bench::Alltoall => "alltoall",
            Bench::Scan => "scan",
        }
    }

    fn default_sizes(self) -> Vec<usize> {
        let pow = |from: u32, to: u32| (from..=to).map(|p| 1usize << p).collect::<Vec<_>>();
        match self {
            Bench::Latency => [vec![0], pow(0, 22)].concat(),
            Bench::Bw => pow(0, 22),
            Bench::Barrier => vec![0],
            Bench::Bcast | Bench::Scatter | Bench::Alltoall => pow(0, 20),
            Bench::Allreduce | Bench::Reduce | Bench::Scan => pow(2, 20),
        }
    }
}

#[derive(Debug)]
struct Opts {
    bench: Bench,
    sizes: Vec<usize>,
    iters: Option<usize>,
    warmup: Option<usize>,
    window: usize,
    json: bool,
    stats: bool,
    by_value: bool,
    reversed: bool,
    any_source: bool,
}

fn number(name: &str, v: &str) -> Result<usize, String> {
    v.parse::<usize>()
        .map_err(|_| format!("{name} {v}: not a non-negative number"))
}

fn parse(args: impl IntoIterator<Item = String>) -> Result<Option<Opts>, String> {
    let mut it = args.into_iter();
    let bench = match it.next().as_deref() {
        Some("latency") => Bench::Latency,
        Some("bw") => Bench::Bw,
        Some("barrier") => Bench::Barrier,
        Some("bcast") => Bench::Bcast,
        Some("allreduce") => Bench::Allreduce,
        Some("reduce") => Bench::Reduce,
        Some("scatter") => Bench::Scatter,
        Some("alltoall") => Bench::Alltoall,
        Some("scan") => Bench::Scan,
        Some("-h" | "--help") => return Ok(None),
        Some(other) => {
            return Err(format!(
            "unknown benchmark `{other}`: latency, bw, barrier, bcast, allreduce, scatter, alltoall or scan"
        ))
        }
        None => {
            return Err(
                "name a benchmark: latency, bw, barrier, bcast, allreduce, scatter, alltoall or scan".into(),
            )
        }
    };
    let mut o = Opts {
        bench,
        sizes: bench.default_sizes(),
        iters: None,
        warmup: None,
        window: 64,
        json: false,
        stats: false,
        by_value: false,
        reversed: false,
        any_source: false,
    };
    while let Some(a) = it.next() {
        let mut val = |n: &str| it.next().ok_or_else(|| format!("{n} needs a value"));
        match a.as_str() {
            "-S" => {
                let v = val("-S")?;
                o.sizes = if v == "all" {
                    bench.default_sizes()
                } else {
                    v.split(',').map(|s| number("-S", s)).collect::<Result<_, _>>()?
                };
                if let Some(s) = o.sizes.iter().find(|&&s| s > MAX_SIZE) {
                    return Err(format!("-S {s}: at most {MAX_SIZE} bytes (64 MiB)"));
                }
                if matches!(bench, Bench::Allreduce | Bench::Reduce | Bench::Scan)
                    && o.sizes.iter().any(|s| s % 4 != 0)
                {
                    return Err(
                        "-S: allreduce, reduce and scan sizes are whole f32s (multiples of 4 bytes)".into(),
                    );
                }
            }
            "-I" => {
                let n = number("-I", &val("-I")?)?;
                if n == 0 {
                    return Err("-I 0: at least one iteration".into());
                }
                o.iters = Some(n);
            }
            "-W" => o.warmup = Some(number("-W", &val("-W")?)?),
            "-w" if bench == Bench::Bw => {
                o.window = number("-w", &val("-w")?)?;
                if !(1..=4096).contains(&o.window) {
                    return Err(format!("-w {}: the window is 1 to 4096 messages", o.window));
                }
            }
            "--json" => o.json = true,
            "--stats" => o.stats = true,
            "--by-value" => o.by_value = true,
            "--reversed" => o.reversed = true,
            "--any-source" if bench == Bench::Latency => o.any_source = true,
            "-h" | "--help" => return Ok(None),
            other => return Err(format!("unknown option `{other}`; try --help")),
        }
    }
    if bench == Bench::Barrier {
        o.sizes = vec![0];
    }
    let blocking = matches!(
        bench,
        Bench::Barrier | Bench::Bcast | Bench::Allreduce | Bench::Reduce
    );
    if o.reversed && !blocking {
        return Err("--reversed: barrier, bcast, allreduce or reduce".into());
    }
    Ok(Some(o))
}

impl Opts {
    fn iters(&self, size: usize) -> usize {
        self.iters.unwrap_or(if size > LARGE { 100 } else { 1000 })
    }
    fn warmup(&self, size: usize) -> usize {
        self.warmup.unwrap_or(if size > LARGE { 10 } else { 100 })
    }
}

/// One row: microseconds and iterations (and MB/s for bw).
#[derive(Debug)]
struct Row {
    bytes: usize,
    avg: f64,
    min: f64,
    max: f64,
    iters: usize,
    mb_per_sec: Option<f64>,
    /// Per-iteration percentiles (collectives: of each call's slowest rank).
    tail: Option<Tail>,
    /// `min` and `max` are over ranks' means (collectives), not iterations.
    over_ranks: bool,
}

/// Width of each percentile column.
const TAIL_WIDTH: usize = 10;

fn main() -> ExitCode {
    let o = match parse(std::env::args().skip(1)) {
        Ok(Some(o)) => o,
        Ok(None) => {
            say!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("world_bench: {e}");
            return ExitCode::from(2);
        }
    };
    let mut world = match World::init() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("world_bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    match run(&mut world, &o) {
        Ok(()) => match world.finish() {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("world_bench: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("world_bench: rank {}: {e}", world.rank());
            ExitCode::FAILURE
        }
    }
}

fn run(world: &mut World, o: &Opts) -> fabric_msg::Result<()> {
    let (rank, size) = (world.rank(), world.size());
    if matches!(o.bench, Bench::Latency | Bench::Bw) && size < 2 {
        return Err(fabric_msg::Error::Usage(format!(
            "{} needs two ranks (ranks 0 and 1 measure; others wait)",
            o.bench.name()
        )));
    }
    let monitor = (rank == 0).then(|| Monitor::start_named("world_bench", !o.json));
    if rank == 0 {
        header(world, o);
    }
    if let Some(m) = &monitor {
        m.arm();
    }
    // --reversed: the whole World in reverse rank order, as a communicator.
    let reversed = match o.reversed {
        true => world.split(Some(0), -i64::from(rank))?,
        false => None,
    };
    for &bytes in &o.sizes {
        let (iters, warmup) = (o.iters(bytes), o.warmup(bytes));
        if let Some(m) = &monitor {
            m.begin(bytes, warmup + iters);
        }
        let tick = |i: usize| {
            if let Some(m) = &monitor {
                m.tick(i);
            }
        };
        let row = match o.bench {
            Bench::Latency => latency(world, bytes, warmup, iters, o.any_source, tick)?,
            Bench::Bw => bandwidth(world, bytes, warmup, iters, o.window, tick)?,
            _ => collective(
                world,
                reversed.as_ref(),
                (o.bench, o.by_value),
                bytes,
                warmup,
                iters,
                tick,
            )?,
        };
        if let (0, Some(row)) = (rank, row) {
            report(o, &row);
        }
        world.barrier()?;
    }
    if let Some(m) = &monitor {
        m.finish();
    }
    if o.stats && rank == 0 {
        let st = world.stats();
        output::loop_stats(o.json, "rank 0 fabric", &st.fabric);
        if let Some(local) = &st.local {
            output::loop_stats(o.json, "rank 0 shared memory", local);
        }
        for r in &st.ranks {
            say!(
                "{}",
                if o.json {
                    serde_json::json!({"stats": "rank 0 with rank", "rank": r.rank,
                        "sent_msgs": r.sent.messages, "sent_bytes": r.sent.bytes,
                        "received_msgs": r.received.messages, "received_bytes": r.received.bytes})
                    .to_string()
                } else {
                    format!(
                        "#   with rank {}: sent {} ({} B), received {} ({} B)",
                        r.rank, r.sent.messages, r.sent.bytes, r.received.messages, r.received.bytes
                    )
                }
            );
        }
    }
    Ok(())
}

fn header(world: &World, o: &Opts) {
    let p = world.profile();
    let what = match o.bench {
        Bench::Allreduce | Bench::Scan => ", f32 sum",
        Bench::Reduce => ", f32 sum, root 0",
        Bench::Bcast | Bench::Scatter => ", root 0",
        Bench::Alltoall => ", bytes per pair",
        Bench::Bw => ", window",
        _ => "",
    };
    if o.json {
        say!(
            "{}",
            serde_json::json!({"tool": "world_bench", "benchmark": o.bench.name(), "ranks": world.size(),
                "launcher": world.launcher(), "provider": p.provider, "fabric_kind": p.fabric_kind,
                "domain": p.domain, "window": (o.bench == Bench::Bw).then_some(o.window),
                "shm_ranks": world.shm_ranks()})
        );
        return;
    }
    let window = if o.bench == Bench::Bw {
        format!(" {}", o.window)
    } else {
        String::new()
    };
    say!(
        "# world_bench {}: {} ranks ({}), {} ({}) domain {}{what}{window}",
        o.bench.name(),
        world.size(),
        world.launcher(),
        p.provider,
        p.fabric_kind,
        p.domain
    );
    if !world.shm_ranks().is_empty() {
        say!("# {}", world.shm_report());
    }
    match o.bench {
        Bench::Bw => say!(
            "{:<10}{:>20}{:>12}{}",
            "# Size",
            "Bandwidth (MB/s)",
            "Iterations",
            stats::columns(TAIL_WIDTH)
        ),
        Bench::Barrier => say!(
            "{:>17}{:>18}{:>18}{:>12}{}",
            "# Avg Latency(us)",
            "Min Latency(us)",
            "Max Latency(us)",
            "Iterations",
            stats::columns(TAIL_WIDTH)
        ),
        _ => say!(
            "{:<10}{:>18}{:>18}{:>18}{:>12}{}",
            "# Size",
            "Avg Latency(us)",
            "Min Latency(us)",
            "Max Latency(us)",
            "Iterations",
            stats::columns(TAIL_WIDTH)
        ),
    }
}

fn report(o: &Opts, r: &Row) {
    if o.json {
        let mut v = serde_json::json!({"bytes": r.bytes, "avg_us": r.avg, "iterations": r.iters});
        if r.over_ranks {
            v["rank_min_us"] = r.min.into();
            v["rank_max_us"] = r.max.into();
        } else if o.bench != Bench::Bw {
            v["min_us"] = r.min.into();
            v["max_us"] = r.max.into();
        }
        if let Some(t) = &r.tail {
            t.add_json(&mut v);
        }
        if let Some(mb) = r.mb_per_sec {
            v["mb_per_sec"] = mb.into();
        }
        say!("{v}");
        return;
    }
    let tail = stats::cells(r.tail.as_ref(), TAIL_WIDTH);
    match (o.bench, r.mb_per_sec) {
        (Bench::Bw, Some(mb)) => say!("{:<10}{:>20.2}{:>12}{tail}", r.bytes, mb, r.iters),
        (Bench::Barrier, _) => say!(
            "{:>17.2}{:>18.2}{:>18.2}{:>12}{tail}",
            r.avg,
            r.min,
            r.max,
            r.iters
        ),
        _ => say!(
            "{:<10}{:>18.2}{:>18.2}{:>18.2}{:>12}{tail}",
            r.bytes,
            r.avg,
            r.min,
            r.max,
            r.iters
        ),
    }
}

/// Completions taken from the World and not yet waited for, and the
/// vector each poll fills (kept, so that a wait allocates nothing).
#[derive(Default)]
struct Done {
    kept: Vec<Completion>,
    batch: Vec<Completion>,
}

/// Wait for the completion with `token`, keeping others in `done`.
fn wait_for(world: &mut World, done: &mut Done, token: Token) -> fabric_msg::Result<Completion> {
    loop {
        if let Some(i) = done.kept.iter().position(|c| c.token == token) {
            let c = done.kept.swap_remove(i);
            if let Err(e) = &c.result {
                return Err(fabric_msg::Error::Usage(format!("{:?} failed: {e}", c.kind)));
            }
            return Ok(c);
        }
        world.poll(&mut done.batch, Some(Duration::from_secs(60)))?;
        if done.batch.is_empty() {
            return Err(fabric_msg::Error::Usage(
                "no completion for 60 s: is the peer alive?".into(),
            ));
        }
        done.kept.append(&mut done.batch);
    }
}

const PING: u32 = 1;
const ACK: u32 = 2;

/// osu_latency: ranks 0 and 1; the next receive is posted before each send.
fn latency(
    world: &mut World,
    bytes: usize,
    warmup: usize,
    iters: usize,
    any_source: bool,
    tick: impl Fn(usize),
) -> fabric_msg::Result<Option<Row>> {
    let rank = world.rank();
    if rank > 1 {
        return Ok(None);
    }
    let peer = 1 - rank;
    let mut done = Done::default();
    let mut send_buf = Some(Buffer::new(bytes));
    let mut recv_buf = Some(Buffer::new(bytes));
    let (mut sum, mut min, mut max) = (0.0f64, f64::MAX, 0.0f64);
    let mut times = IterTimes::always(iters);
    for i in 0..warmup + iters {
        let t = Instant::now();
        world.recv_buffer(
            (!any_source).then_some(peer),
            Some(PING),
            recv_buf.take().unwrap_or_else(|| Buffer::new(bytes)),
            Token(1),
        )?;
        if rank == 0 {
            world.send_buffer(
                peer,
                PING,
                send_buf.take().unwrap_or_else(|| Buffer::new(bytes)),
                Token(2),
            )?;
            recv_buf = wait_for(world, &mut done, Token(1))?.buffer;
        } else {
            recv_buf = wait_for(world, &mut done, Token(1))?.buffer;
            world.send_buffer(
                peer,
                PING,
                send_buf.take().unwrap_or_else(|| Buffer::new(bytes)),
                Token(2),
            )?;
        }
        send_buf = wait_for(world, &mut done, Token(2))?.buffer;
        if let Some(b) = recv_buf.as_mut() {
            b.set_len(bytes.min(b.capacity()));
        }
        if i >= warmup {
            let half = t.elapsed() / 2;
            times.record(half.as_nanos() as u64);
            let us = half.as_secs_f64() * 1e6;
            sum += us;
            min = min.min(us);
            max = max.max(us);
        }
        tick(i + 1);
    }
    Ok((rank == 0).then_some(Row {
        bytes,
        avg: sum / iters as f64,
        min,
        max,
        iters,
        mb_per_sec: None,
        tail: times.tail(),
        over_ranks: false,
    }))
}

/// osu_bw: rank 0 sends windows of `window` messages; rank 1 has them
/// posted and acks each window.
fn bandwidth(
    world: &mut World,
    bytes: usize,
    warmup: usize,
    iters: usize,
    window: usize,
    tick: impl Fn(usize),
) -> fabric_msg::Result<Option<Row>> {
    let rank = world.rank();
    if rank > 1 {
        return Ok(None);
    }
    let mut bufs: Vec<Buffer> = (0..window).map(|_| Buffer::new(bytes)).collect();
    let mut ack = Some(Buffer::new(4));
    let mut done = Done::default();
    let mut times = IterTimes::new(if rank == 0 { iters } else { 0 });
    let mut start = Instant::now();
    for i in 0..warmup + iters {
        if i == warmup {
            start = Instant::now();
            times.start(start);
        }
        if rank == 0 {
            world.recv_buffer(
                Some(1),
                Some(ACK),
                ack.take().unwrap_or_else(|| Buffer::new(4)),
                Token(9),
            )?;
            for (k, b) in bufs.drain(..).enumerate() {
                world.send_buffer(1, PING, b, Token(100 + k as u64))?;
            }
            ack = wait_for(world, &mut done, Token(9))?.buffer;
            for k in 0..window {
                let c = wait_for(world, &mut done, Token(100 + k as u64))?;
                bufs.push(c.buffer.unwrap_or_else(|| Buffer::new(bytes)));
            }
            if i >= warmup {
                times.lap(window); // the window's time per message
            }
        } else {
            for (k, b) in bufs.drain(..).enumerate() {
                world.recv_buffer(Some(0), Some(PING), b, Token(100 + k as u64))?;
            }
            for k in 0..window {
                let c = wait_for(world, &mut done, Token(100 + k as u64))?;
                let mut b = c.buffer.unwrap_or_else(|| Buffer::new(bytes));
                b.set_len(bytes.min(b.capacity()));
                bufs.push(b);
            }
            world.send_buffer(0, ACK, ack.take().unwrap_or_else(|| Buffer::new(4)), Token(9))?;
            ack = wait_for(world, &mut done, Token(9))?.buffer;
        }
        tick(i + 1);
    }
    let secs = times.elapsed_since(start).as_secs_f64();
    let messages = (iters * window) as f64;
    Ok((rank == 0).then(|| Row {
        bytes,
        avg: secs * 1e6 / messages,
        min: secs * 1e6 / messages,
        max: secs * 1e6 / messages,
        iters,
        mb_per_sec: Some(bytes as f64 * messages / secs / 1e6),
        tail: times.tail(),
        over_ranks: false,
    }))
}
