//! `spmd`: the same program on every rank. Each rank sends sequenced,
//! checksummed tagged messages to the next rank around a ring and checks
//! every byte of what the previous rank sent; then rank 0 gathers one line
//! from every rank and prints a summary. Non-zero exit if anything was lost,
//! duplicated, reordered or damaged, or a rank went away.
//!
//! ```text
//! mpirun -np 4 target/release/spmd                    # PMIx (Open MPI)
//! srun --mpi=pmix -n 4 target/release/spmd            # PMIx (Slurm)
//! for r in 0 1 2 3; do FABRIC_MSG_RANK=$r FABRIC_MSG_SIZE=4 \
//!     FABRIC_MSG_ROOT=127.0.0.1:9300 target/release/spmd & done; wait
//! target/release/spmd                                 # a world of one
//! ```
//!
//! usage: spmd [-n MESSAGES] [-S BYTES] [-w WINDOW] [-r RECEIVES] [--json]
//!             [--exit-early RANK] [--hold SECONDS] [--announce]
//!
//! `-w` bounds the sends in flight and, unless `-r` says otherwise, the
//! receives posted ahead. `-w 5000 -r 64` is a flood without
//! application-level credits: each rank posts all its sends at once while
//! its neighbour keeps only 64 receives posted, so most messages arrive
//! before their receive (unexpected) and the fabric must hold or refuse them.
//!
//! `--exit-early RANK` makes that rank leave without finishing right after
//! the world forms, and `--hold` makes every rank wait that long before the
//! ring; `--announce` prints `rank R/N: ring running` once the world has
//! formed: all three are for failure tests.

use fabric_msg::prelude::*;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const RING: u32 = 1;
const REPORT: u32 = 2;
/// Sequence number (u64) and checksum (u64) at the front of each message.
const HEAD: usize = 16;

struct Opts {
    messages: u64,
    size: usize,
    window: usize,
    recvs: Option<usize>,
    json: bool,
    exit_early: Option<u32>,
    hold: Duration,
    announce: bool,
}

fn parse() -> Result<Opts, String> {
    let mut o = Opts {
        messages: 1000,
        size: 4096,
        window: 64,
        recvs: None,
        json: false,
        exit_early: None,
        hold: Duration::ZERO,
        announce: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val =
            |what: &str| -> Result<String, String> { args.next().ok_or(format!("{a} needs {what}")) };
        let num = |s: String| {
            s.parse::<u64>()
                .map_err(|_| format!("{a}: {s:?} is not a whole number"))
        };
        match a.as_str() {
            "-n" => o.messages = num(val("a number of messages")?)?,
            "-S" => o.size = num(val("a size in bytes")?)? as usize,
            "-w" => o.window = num(val("a window")?)?.clamp(1, 1 << 20) as usize,
            "-r" => o.recvs = Some(num(val("a number of receives")?)?.clamp(1, 4096) as usize),
            "--json" => o.json = true,
            "--exit-early" => o.exit_early = Some(num(val("a rank")?)? as u32),
            "--hold" => o.hold = Duration::from_secs(num(val("seconds")?)?),
            "--announce" => o.announce = true,
            "-h" | "--help" => {
                return Err("usage: spmd [-n MESSAGES] [-S BYTES] [-w WINDOW] [-r RECEIVES] [--json] [--exit-early RANK] [--hold SECONDS] [--announce]".into())
            }
            other => return Err(format!("unknown option {other}; try --help")),
        }
    }
    if o.size < HEAD || o.size > 64 << 20 {
        return Err(format!("-S {}: between {HEAD} bytes and 64 MiB", o.size));
    }
    Ok(o)
}

/// FNV-1a over the payload after the head.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The bytes `src` sends as message `seq`: a pattern no other message has.
fn fill(buf: &mut [u8], src: u32, seq: u64) {
    let mut x = (u64::from(src) << 40) ^ seq.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5555;
    for b in buf[HEAD..].iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let sum = checksum(&buf[HEAD..]);
    buf[..8].copy_from_slice(&seq.to_le_bytes());
    buf[8..16].copy_from_slice(&sum.to_le_bytes());
}

#[derive(Default)]
struct Tally {
    sent: u64,
    received: u64,
    bad: u64,
    out_of_order: u64,
    next_seq: u64,
    seen: Vec<bool>,
}

impl Tally {
    fn check(&mut self, bytes: &[u8], src: u32, size: usize) {
        self.received += 1;
        if bytes.len() != size {
            self.bad += 1;
            return;
        }
        let seq = u64::from_le_bytes(bytes[..8].try_into().unwrap_or_default());
        let mut expect = vec![0u8; size];
        fill(&mut expect, src, seq);
        let fresh = self.seen.get(seq as usize).is_some_and(|s| !s);
        if !fresh || expect != bytes {
            self.bad += 1;
            return;
        }
        self.seen[seq as usize] = true;
        if seq != self.next_seq {
            self.out_of_order += 1;
        }
        self.next_seq = seq + 1;
    }
}

fn main() -> ExitCode {
    let opts = match parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("spmd: {e}");
            return ExitCode::from(2);
        }
    };
    let init = Instant::now();
    let mut world = match World::init() {
        Ok(w) => w,
        Err(e) => {
            eprintln!("spmd: {e}");
            return ExitCode::FAILURE;
        }
    };
    if opts.exit_early == Some(world.rank()) {
        eprintln!(
            "spmd: rank {} leaving without finishing (--exit-early)",
            world.rank()
        );
        std::process::exit(3);
    }
    let formed = init.elapsed();
    if opts.announce {
        // For the failure tests: the world is formed, the ring starts.
        println!("rank {}/{}: ring running", world.rank(), world.size());
        std::io::Write::flush(&mut std::io::stdout()).ok();
    }
    match run(&mut world, &opts, formed) {
        Ok(ok) => {
            let finished = world.finish();
            if let Err(e) = &finished {
                eprintln!("spmd: {e}");
            }
            if ok && finished.is_ok() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("spmd: rank {}: {e}", world.rank());
            // The others may still be waiting for this rank: end the job.
            world.abort(1, &format!("rank {}: {e}", world.rank()))
        }
    }
}

fn run(world: &mut World, o: &Opts, formed: Duration) -> Result<bool, fabric_msg::Error> {
    let (rank, size) = (world.rank(), world.size());
    let (next, prev) = ((rank + 1) % size, (rank + size - 1) % size);
    if rank == 0 {
        if let Some(why) = world.fabric_report() {
            eprintln!("spmd: {why}");
        }
    }
    if rank == 0 {
        // Every rank's report, posted before the ring so none arrives unexpected.
        for _ in 1..size {
            world.recv_buffer(None, Some(REPORT), Buffer::new(64 << 10), Token(3))?;
        }
    }
    std::thread::sleep(o.hold);
    let start = Instant::now();
    let mut t = Tally {
        seen: vec![false; o.messages as usize],
        ..Default::default()
    };
    let mut posted_recvs = 0u64;
    let mut in_flight_sends = 0usize;
    let mut free: Vec<Buffer> = (0..o.window).map(|_| Buffer::new(o.size)).collect();
    for _ in 0..o.recvs.unwrap_or(o.window).min(o.messages as usize) {
        world.recv_buffer(Some(prev), Some(RING), Buffer::new(o.size), Token(0))?;
        posted_recvs += 1;
    }
    let mut done: Vec<Completion> = Vec::new();
    let mut reports: Vec<Completion> = Vec::new();
    while t.received < o.messages || t.sent < o.messages || in_flight_sends > 0 {
        while t.sent < o.messages && in_flight_sends < o.window {
            let mut buf = free.pop().unwrap_or_else(|| Buffer::new(o.size));
            buf.set_len(o.size);
            fill(buf.as_mut_slice(), rank, t.sent);
            world.send_buffer(next, RING, buf, Token(1))?;
            t.sent += 1;
            in_flight_sends += 1;
        }
        world.poll(&mut done, Some(Duration::from_secs(60)))?;
        if done.is_empty() {
            return Err(fabric_msg::Error::Usage(format!(
                "no progress for 60 s (sent {}, received {} of {})",
                t.sent, t.received, o.messages
            )));
        }
        for c in done.drain(..) {
            if let Err(e) = &c.result {
                return Err(fabric_msg::Error::Usage(format!("{:?} failed: {e}", c.kind)));
            }
            match c.kind {
                OpKind::Send => {
                    in_flight_sends -= 1;
                    free.extend(c.buffer);
                }
                OpKind::Recv if c.token == Token(3) => reports.push(c),
                OpKind::Recv => {
                    let (src, tag) = (world.source(&c), world.tag(&c));
                    let buf = c.buffer.unwrap_or_else(|| Buffer::new(o.size));
                    if src != prev || tag != RING {
                        t.bad += 1;
                    }
                    t.check(buf.as_slice(), src, o.size);
                    if posted_recvs < o.messages {
                        world.recv_buffer(Some(prev), Some(RING), buf, Token(0))?;
                        posted_recvs += 1;
                    }
                }
                _ => {}
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    // The library's own counters agree with what this program counted (they
    // also hold the World's own messages, so they may be higher). A
    // receive's sender is known to them where the provider names it.
    let st = world.stats();
    let unknown = st.fabric.received_from_unknown.messages
        + st.local.as_ref().map_or(0, |l| l.received_from_unknown.messages);
    let counted = st.ranks[next as usize].sent.messages >= t.sent
        && st.ranks[prev as usize].received.messages + unknown >= t.received;
    if !counted {
        eprintln!("spmd: rank {rank}: World::stats disagrees with the ring's own count: {st:?}");
    }
    let ok = t.bad == 0 && t.seen.iter().all(|s| *s) && counted;
    let provider = world.profile().provider.clone();
    let line = if o.json {
        format!(
            "{{\"rank\":{rank},\"size\":{size},\"launcher\":\"{}\",\"provider\":\"{provider}\",\"sent\":{},\"received\":{},\"bad\":{},\"out_of_order\":{},\"bytes\":{},\"seconds\":{secs:.6},\"ok\":{ok}}}",
            world.launcher(), t.sent, t.received, t.bad, t.out_of_order, o.size
        )
    } else {
        format!(
            "rank {rank}/{size}: sent {} to rank {next}, received {} from rank {prev}, {} bad, {} out of order: {} ({} via {})",
            t.sent,
            t.received,
            t.bad,
            t.out_of_order,
            if ok { "every byte verified" } else { "FAILED" },
            provider,
            world.launcher()
        )
    };
    gather_and_report(world, o, line, ok, (secs, formed), reports)
}

/// Every rank sends its line to rank 0, which prints them in rank order
/// and a summary.
fn gather_and_report(
    world: &mut World,
    o: &Opts,
    line: String,
    ok: bool,
    (secs, formed): (f64, Duration),
    early: Vec<Completion>,
) -> Result<bool, fabric_msg::Error> {
    let (rank, size) = (world.rank(), world.size());
    let mut done = Vec::new();
    if rank != 0 {
        let mut msg = vec![u8::from(ok)];
        msg.extend_from_slice(line.as_bytes());
        world.send_buffer(0, REPORT, Buffer::from_slice(&msg), Token(2))?;
        loop {
            world.poll(&mut done, Some(Duration::from_secs(60)))?;
            if done.iter().any(|c| c.kind == OpKind::Send) {
                return Ok(ok);
            }
            if done.is_empty() {
                return Err(fabric_msg::Error::Usage("rank 0 took no report for 60 s".into()));
            }
        }
    }
    let mut lines: Vec<Option<(bool, String)>> = (0..size).map(|_| None).collect();
    lines[0] = Some((ok, line));
    let mut got = 1;
    done.extend(early);
    while got < size {
        if done.is_empty() {
            world.poll(&mut done, Some(Duration::from_secs(60)))?;
        }
        if done.is_empty() {
            return Err(fabric_msg::Error::Usage(format!(
                "only {got} of {size} reports in 60 s"
            )));
        }
        for c in done.drain(..) {
            if c.kind != OpKind::Recv {
                continue;
            }
            let src = world.source(&c) as usize;
            let bytes = c
                .buffer
                .as_ref()
                .map(|b| b.as_slice().to_vec())
                .unwrap_or_default();
            if let (Some(slot), Some((&flag, text))) = (lines.get_mut(src), bytes.split_first()) {
                if slot.is_none() {
                    *slot = Some((flag == 1, String::from_utf8_lossy(text).into_owned()));
                    got += 1;
                }
            }
        }
    }
    let all_ok = lines.iter().all(|l| l.as_ref().is_some_and(|(ok, _)| *ok));
    for (_, l) in lines.iter().flatten() {
        println!("{l}");
    }
    let total = o.messages * u64::from(size);
    let provider = world.profile().provider.clone();
    if o.json {
        println!(
            "{{\"summary\":true,\"size\":{size},\"launcher\":\"{}\",\"provider\":\"{provider}\",\"messages\":{total},\"bytes\":{},\"seconds\":{secs:.6},\"init_ms\":{:.1},\"ok\":{all_ok}}}",
            world.launcher(),
            o.size,
            formed.as_secs_f64() * 1e3
        );
    } else {
        println!(
            "summary: ring of {size} rank(s) over {provider} ({}): {total} messages of {} bytes, {}, {:.0} messages/s on rank 0; world formed in {:.1} ms",
            world.launcher(),
            o.size,
            if all_ok { "every byte verified on every rank" } else { "FAILED" },
            o.messages as f64 / secs.max(1e-9),
            formed.as_secs_f64() * 1e3
        );
    }
    Ok(all_ok)
}
