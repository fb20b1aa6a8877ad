//! `async_rma_pingpong`: `rma_pingpong --loopback` through fabric-msg's
//! tokio adapter (`fabric_msg::async_loop`): each side's loop behind its
//! own driver task, a client task and a server task awaiting each
//! operation, on a runtime of two workers.
//!
//! `async_rma_pingpong --loopback [rma_pingpong's options]`, with
//! `rma_pingpong`'s output columns (`usec/xfer` is one way):
//! - `-o write` (the default): each side writes into the other's
//!   registered memory with `LoopHandle::write_data` and learns of the
//!   peer's write from `LoopHandle::remote_write`;
//! - `-o read`: the client reads the server's memory with
//!   `LoopHandle::read`, one read at a time, and ends with a write whose
//!   notice tells the server it is done.
//!
//! Client and server in one process only. Notices must reach
//! `remote_write`: on a fabric whose notices use up a receive (providers
//! in `FI_RX_CQ_DATA` mode, or no remote CQ data) the tool says so and
//! stops; `rma_pingpong` serves those.

use fabric_msg::async_loop::{AsyncLoop, LoopHandle};
use fabric_msg::{
    connect, negotiate, Access, EndpointId, EventLoop, LadderConfig, Listener, MemoryRegion, Peer,
    RemoteMemory,
};
use fabric_msg_examples::opts::{self, Opts, Parsed, Tool, MAX_RMA_SIZE};
use fabric_msg_examples::output::{self, Row};
use fabric_msg_examples::session::{loop_config, AnyResult};
use fabric_msg_examples::stats::IterTimes;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The notice of the write that ends a read run.
const READS_DONE: u64 = 0x7fff_ffff;

fn main() -> ExitCode {
    let o = match opts::parse(Tool::RmaPingPong, std::env::args().skip(1)) {
        Ok(Parsed::Run(o)) => o,
        Ok(Parsed::Help) => {
            println!(
                "async_rma_pingpong: rma_pingpong --loopback through the tokio adapter\n\n{}",
                Tool::RmaPingPong.usage()
            );
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("async_rma_pingpong: {e}");
            return ExitCode::from(2);
        }
    };
    if !o.loopback || o.register_each || o.idle_ms > 0 {
        eprintln!(
            "async_rma_pingpong: only --loopback (client and server in this process), without --mr each or \
             --idle-ms; use rma_pingpong for those"
        );
        return ExitCode::from(2);
    }
    match run(&o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("async_rma_pingpong: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One side: its handle and peer, its own region (the peer writes or
/// reads it), its source of writes, and the peer's region.
#[derive(Clone)]
struct Side {
    h: LoopHandle,
    peer: Peer,
    target: Arc<MemoryRegion>,
    source: Arc<MemoryRegion>,
    remote: Arc<RemoteMemory>,
}

/// One loop, connected, with its regions registered: (loop, endpoint,
/// peer, target, source).
type Opened = (EventLoop, EndpointId, Peer, MemoryRegion, MemoryRegion);

fn register(mut ev: EventLoop, ep: EndpointId, peer: Peer, read: bool) -> fabric_msg::Result<Opened> {
    let target = ev.register(MAX_RMA_SIZE, if read { Access::ReadWrite } else { Access::Write })?;
    if read {
        let bytes: Vec<u8> = (0..MAX_RMA_SIZE).map(|k| byte(0, k)).collect();
        target.write_at(0, &bytes)?;
    }
    let source = ev.register(MAX_RMA_SIZE, Access::ReadWrite)?;
    Ok((ev, ep, peer, target, source))
}

fn run(o: &Opts) -> AnyResult<()> {
    let profile = negotiate(&o.requirements(), &LadderConfig::load(None)?)?.profile;
    if profile.cq_data_size == 0 || profile.mode.iter().any(|m| m == "FI_RX_CQ_DATA") {
        return Err(format!(
            "{}: a write's notice uses up a receive here (no remote CQ data, or FI_RX_CQ_DATA mode), where \
             this tool awaits notices with LoopHandle::remote_write; use rma_pingpong",
            profile.provider
        )
        .into());
    }
    // Connected before the runtime starts: the bootstrap is blocking.
    let listener = Listener::bind(("127.0.0.1", 0))?;
    let addr = listener.local_addr()?;
    let (sp, cfg, read) = (profile.clone(), loop_config(o), o.read);
    let scfg = cfg.clone();
    let server = std::thread::spawn(move || -> fabric_msg::Result<Opened> {
        let mut ev = EventLoop::new(&sp, scfg)?;
        let ep = ev.open_endpoint()?;
        let peer = listener.accept(&mut ev, ep)?;
        register(ev, ep, peer, read)
    });
    let mut ev = EventLoop::new(&profile, cfg)?;
    let ep = ev.open_endpoint()?;
    let peer = connect(&mut ev, ep, addr, Duration::from_secs(20))?;
    let (mut cev, _, cpeer, ctarget, csource) = register(ev, ep, peer, read)?;
    let (mut sev, _, speer, starget, ssource) = server.join().map_err(|_| "the server thread panicked")??;
    // Both in this process: each brings in the other's descriptor.
    let cremote = cev.import(&starget.remote().encode())?;
    let sremote = sev.import(&ctarget.remote().encode())?;
    header(o, &profile);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async {
        let client = Side {
            h: AsyncLoop::start(cev),
            peer: cpeer,
            target: Arc::new(ctarget),
            source: Arc::new(csource),
            remote: Arc::new(cremote),
        };
        let server = Side {
            h: AsyncLoop::start(sev),
            peer: speer,
            target: Arc::new(starget),
            source: Arc::new(ssource),
            remote: Arc::new(sremote),
        };
        let result = both(o, &client, &server).await;
        // The server's loop closes first, then the client's: libfabric
        // 1.17's shm crashed when two loops of one process closed at once.
        server.h.close().await;
        client.h.close().await;
        result
    })
}

type TaskResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Every size: the server's task and the client's, each spawned (as in a
/// tokio program whose main spawns its work).
async fn both(o: &Opts, client: &Side, server: &Side) -> TaskResult<()> {
    let mut seq = 0u64;
    for &size in &o.sizes {
        let n = (o.warmup + o.iters) as u64;
        let (so, s) = (o.clone(), server.clone());
        let serving = tokio::spawn(async move {
            if so.read {
                notice(&s.h, READS_DONE).await
            } else {
                echo(&so, &s, size, seq, n).await
            }
        });
        let (co, c) = (o.clone(), client.clone());
        let row = tokio::spawn(async move {
            if co.read {
                reads(&co, &c, size).await
            } else {
                ping(&co, &c, size, seq).await
            }
        })
        .await
        .map_err(|e| format!("the client task: {e}"))??;
        serving.await.map_err(|e| format!("the server task: {e}"))??;
        output::report_row(o.json, &row);
        seq += n;
    }
    Ok(())
}

/// The next notice, which must carry `seq`.
async fn notice(h: &LoopHandle, seq: u64) -> TaskResult<()> {
    let c = h.remote_write().await?;
    c.result?;
    if c.data != Some(seq) {
        return Err(format!("notice {:?}, expected {seq}: lost or reordered", c.data).into());
    }
    Ok(())
}

/// Write `size` bytes of transfer `seq` from `s`'s source into the peer's
/// region, with `seq` as the notice; once it completed, the source may be
/// written again.
async fn write(o: &Opts, s: &Side, size: usize, seq: u64, fill: bool) -> TaskResult<()> {
    if fill || o.verify {
        let bytes: Vec<u8> = (0..size).map(|k| byte(seq, k)).collect();
        s.source.write_at(0, &bytes)?;
    }
    let c =
        s.h.write_data(s.peer, s.source.local(0, size)?, &s.remote, 0, seq)
            .await?;
    c.result?;
    Ok(())
}

/// With `--verify`: whether transfer `seq` of `size` bytes is in `s`'s
/// region.
fn check(o: &Opts, s: &Side, seq: u64, size: usize) -> TaskResult<()> {
    if !o.verify {
        return Ok(());
    }
    let mut got = vec![0u8; size];
    s.target.read_at(0, &mut got)?;
    if let Some(k) = got.iter().enumerate().position(|(k, &b)| b != byte(seq, k)) {
        return Err(format!("transfer {seq}: byte {k} of {size} is wrong").into());
    }
    Ok(())
}

/// The client's side of `-o write`: `o.warmup + o.iters` round trips of
/// `size` bytes from sequence number `first`, timed after the warm-up.
async fn ping(o: &Opts, s: &Side, size: usize, first: u64) -> TaskResult<Row> {
    let mut clock = Clock::new(o);
    for i in 0..o.warmup + o.iters {
        clock.begin(i);
        let seq = first + i as u64;
        // The answer's notice is awaited beside the write (its future is
        // polled first, so it waits before the write goes).
        let (back, sent) = tokio::join!(notice(&s.h, seq), write(o, s, size, seq, i == 0));
        sent?;
        back?;
        check(o, s, seq, size)?;
        clock.end(i, 2);
    }
    Ok(clock.row(size, 2))
}

/// The server's side of `-o write`: each notice answered with a write of
/// what arrived.
async fn echo(o: &Opts, s: &Side, size: usize, first: u64, n: u64) -> TaskResult<()> {
    for seq in first..first + n {
        notice(&s.h, seq).await?;
        check(o, s, seq, size)?;
        write(o, s, size, seq, seq == first).await?;
    }
    Ok(())
}

/// The client's side of `-o read`: reads of `size` bytes, one at a time,
/// then the write whose notice tells the server it is done.
async fn reads(o: &Opts, s: &Side, size: usize) -> TaskResult<Row> {
    let mut clock = Clock::new(o);
    for i in 0..o.warmup + o.iters {
        clock.begin(i);
        if o.verify {
            s.source.write_at(0, &vec![!byte(0, 0); size])?;
        }
        let c = s.h.read(s.peer, s.source.local(0, size)?, &s.remote, 0).await?;
        c.result?;
        if o.verify {
            let mut got = vec![0u8; size];
            s.source.read_at(0, &mut got)?;
            if let Some(k) = got.iter().enumerate().position(|(k, &b)| b != byte(0, k)) {
                return Err(format!("read {i}: byte {k} of {size} is wrong").into());
            }
        }
        clock.end(i, 1);
    }
    let row = clock.row(size, 1);
    let c =
        s.h.write_data(s.peer, s.source.local(0, 1)?, &s.remote, 0, READS_DONE)
            .await?;
    c.result?;
    Ok(row)
}

/// One size's timing: iterations from `o.warmup` on are timed, each
/// from the end of the one before.
struct Clock {
    times: IterTimes,
    started: Instant,
    warmup: usize,
    iters: usize,
}

impl Clock {
    fn new(o: &Opts) -> Clock {
        Clock {
            times: IterTimes::new(o.iters),
            started: Instant::now(),
            warmup: o.warmup,
            iters: o.iters,
        }
    }

    /// Iteration `i` begins: the first timed one starts the clock.
    fn begin(&mut self, i: usize) {
        if i == self.warmup {
            self.started = Instant::now();
            self.times.start(self.started);
        }
    }

    /// Iteration `i`, of `xfers` transfers, is over.
    fn end(&mut self, i: usize, xfers: usize) {
        if i >= self.warmup {
            self.times.lap(xfers);
        }
    }

    fn row(&self, size: usize, xfers: usize) -> Row {
        Row {
            bytes: size,
            sent: self.iters,
            acked: self.iters,
            elapsed: self.times.elapsed_since(self.started),
            xfers_per_iter: xfers,
            tail: self.times.tail(),
        }
    }
}

fn byte(seq: u64, k: usize) -> u8 {
    (seq as usize).wrapping_mul(131).wrapping_add(k) as u8
}

fn header(o: &Opts, p: &fabric_msg::Profile) {
    let (text, extra) = if o.read {
        (
            "RMA read through the tokio adapter, one at a time: time per read (a round trip)",
            serde_json::json!({ "op": "read" }),
        )
    } else {
        (
            "RMA write ping-pong through the tokio adapter, source memory registered once",
            serde_json::json!({ "op": "write" }),
        )
    };
    output::header_with(o.json, "async_rma_pingpong", p, extra, text);
}
