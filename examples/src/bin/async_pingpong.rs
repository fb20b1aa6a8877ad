//! `async_pingpong`: `pingpong --loopback` through fabric-msg's tokio
//! adapter (`fabric_msg::async_loop`): each side's loop behind its own
//! driver task, a client task and a server task awaiting each operation.
//!
//! `async_pingpong --loopback [pingpong's options]`: the same options and
//! output columns as `pingpong`; `usec/xfer` is one-way. `-c fd` opens the
//! loops to sleep (the driver waits on the CQ's wait fd through tokio),
//! `-c spin` without a wait fd (each awaiting task looks at its loop,
//! yielding to other tasks between looks, for 2 ms of its wait, then the
//! driver looks every millisecond). Client and server in one process
//! only, each a spawned task: for two hosts, use `pingpong`.
//!
//! As `pingpong` does, each side has its next receive posted before the
//! peer can send (`tokio::join!` polls the receive first, so it is posted
//! first) and buffers go round: each completion gives
//! its buffer back for the next operation.

use fabric_msg::async_loop::{AsyncLoop, LoopHandle};
use fabric_msg::{
    connect, negotiate, Buffer, EndpointId, EventLoop, LadderConfig, Listener, Peer, RecvOpts, SendOpts,
};
use fabric_msg_examples::opts::{self, Opts, Parsed, Tool};
use fabric_msg_examples::output::{self, Row};
use fabric_msg_examples::session::{loop_config, AnyResult};
use fabric_msg_examples::stats::IterTimes;
use std::process::ExitCode;
use std::time::{Duration, Instant};

const TAG: u64 = 0x50;

fn main() -> ExitCode {
    let o = match opts::parse(Tool::PingPong, std::env::args().skip(1)) {
        Ok(Parsed::Run(o)) => o,
        Ok(Parsed::Help) => {
            println!(
                "async_pingpong: pingpong --loopback through the tokio adapter\n\n{}",
                Tool::PingPong.usage()
            );
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("async_pingpong: {e}");
            return ExitCode::from(2);
        }
    };
    if !o.loopback {
        eprintln!(
            "async_pingpong: only --loopback (client and server in this process); use pingpong between hosts"
        );
        return ExitCode::from(2);
    }
    match run(&o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("async_pingpong: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One side: its handle, endpoint and peer.
#[derive(Clone)]
struct Side {
    h: LoopHandle,
    ep: EndpointId,
    peer: Peer,
}

fn run(o: &Opts) -> AnyResult<()> {
    let profile = negotiate(&o.requirements(), &LadderConfig::load(None)?)?.profile;
    // Connected before the runtime starts: the bootstrap is blocking.
    let listener = Listener::bind(("127.0.0.1", 0))?;
    let addr = listener.local_addr()?;
    let (sp, cfg) = (profile.clone(), loop_config(o));
    let scfg = cfg.clone();
    let server = std::thread::spawn(move || -> fabric_msg::Result<(EventLoop, EndpointId, Peer)> {
        let mut ev = EventLoop::new(&sp, scfg)?;
        let ep = ev.open_endpoint()?;
        let peer = listener.accept(&mut ev, ep)?;
        Ok((ev, ep, peer))
    });
    let mut ev = EventLoop::new(&profile, cfg)?;
    let ep = ev.open_endpoint()?;
    let peer = connect(&mut ev, ep, addr, Duration::from_secs(20))?;
    let (sev, sep, speer) = server.join().map_err(|_| "the server thread panicked")??;
    output::header(o, &profile);
    let flavor = std::env::var("FABRIC_MSG_ASYNC_RUNTIME").unwrap_or_default();
    if flavor == "per-side" {
        return per_side(o, (ev, ep, peer), (sev, sep, speer));
    }
    // FABRIC_MSG_ASYNC_RUNTIME=current: both sides, their drivers and
    // tasks on one thread (a current-thread runtime); otherwise two workers.
    let rt = if flavor == "current" {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()?
    };
    rt.block_on(async {
        let client = Side {
            h: AsyncLoop::start(ev),
            ep,
            peer,
        };
        let server = Side {
            h: AsyncLoop::start(sev),
            ep: sep,
            peer: speer,
        };
        for &size in &o.sizes {
            let n = o.warmup + o.iters;
            let echo = tokio::spawn(serve(server.h.clone(), server.ep, server.peer, size, n));
            let row = ping_task(o, &client, size).await?;
            echo.await.map_err(|e| format!("the server task: {e}"))??;
            output::report(o, &row);
        }
        client.h.close().await;
        server.h.close().await;
        Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    })
    .map_err(|e| e.to_string())?;
    Ok(())
}

/// FABRIC_MSG_ASYNC_RUNTIME=per-side: each side on a current-thread
/// runtime of its own, on a thread of its own (as the blocking tool gives
/// each side a thread): what the adapter costs when the two sides do not
/// take turns on one worker.
fn per_side(
    o: &Opts,
    client: (EventLoop, EndpointId, Peer),
    server: (EventLoop, EndpointId, Peer),
) -> AnyResult<()> {
    let current = || tokio::runtime::Builder::new_current_thread().enable_all().build();
    let (srt, crt) = (current()?, current()?);
    let sizes = o.sizes.clone();
    let n = o.warmup + o.iters;
    let echo = std::thread::spawn(move || {
        srt.block_on(async move {
            let (ev, ep, peer) = server;
            let h = AsyncLoop::start(ev);
            for size in sizes {
                // A spawned task, not the future `block_on` polls itself:
                // tokio wakes that one through its driver (an eventfd
                // write for every look of a spinning wait).
                tokio::spawn(serve(h.clone(), ep, peer, size, n))
                    .await
                    .map_err(|e| format!("the server task: {e}"))??;
            }
            h.close().await;
            Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
        })
    });
    let (ev, ep, peer) = client;
    let client = crt.block_on(async {
        let client = Side {
            h: AsyncLoop::start(ev),
            ep,
            peer,
        };
        for &size in &o.sizes {
            let row = ping_task(o, &client, size).await?;
            output::report(o, &row);
        }
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>(client)
    });
    // The server's loop closes first, on its thread, then ours: libfabric
    // 1.17's shm crashed when two loops of one process closed at once.
    let served = echo.join().map_err(|_| "the server thread panicked")?;
    let client = client.map_err(|e| e.to_string())?;
    crt.block_on(client.h.close());
    served.map_err(|e| e.to_string())?;
    Ok(())
}

fn opts() -> (SendOpts, RecvOpts) {
    (
        SendOpts {
            tag: Some(TAG),
            data: None,
        },
        RecvOpts {
            tag: Some((TAG, 0)),
            from: None,
        },
    )
}

type TaskResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// `ping` as a spawned task, as in a tokio program whose main spawns its
/// work: on the runtime's workers, not in the future `block_on` polls
/// itself (which tokio wakes through its driver, a system call per look).
async fn ping_task(o: &Opts, client: &Side, size: usize) -> TaskResult<Row> {
    let (o, client) = (o.clone(), client.clone());
    tokio::spawn(async move { ping(&o, &client, size).await })
        .await
        .map_err(|e| format!("the client task: {e}"))?
}

/// The client: warm-up, then `o.iters` timed round trips of `size` bytes.
async fn ping(o: &Opts, s: &Side, size: usize) -> TaskResult<Row> {
    let (send, recv) = opts();
    let (mut tx, mut rx) = (Buffer::new(size.max(1)), Buffer::new(size.max(1)));
    tx.as_mut_slice().fill(1);
    tx.set_len(size);
    let inject = injects(&s.h, size).await?;
    let mut times = IterTimes::new(o.iters);
    let mut started = Instant::now();
    for i in 0..o.warmup + o.iters {
        if i == o.warmup {
            started = Instant::now();
            times.start(started);
        }
        let (back, sent) = tokio::join!(
            s.h.recv(s.ep, rx, recv),
            sent_back(&s.h, s.peer, tx, send, inject)
        );
        tx = sent?;
        let back = back?;
        back.result?;
        rx = back.buffer.ok_or("a receive completed without its buffer")?;
        if rx.len() != size {
            return Err(format!("a reply of {} bytes, not {size}", rx.len()).into());
        }
        if i >= o.warmup {
            times.lap(2);
        }
    }
    Ok(Row {
        bytes: size,
        sent: o.iters,
        acked: o.iters,
        elapsed: times.elapsed_since(started),
        xfers_per_iter: 2,
        tail: times.tail(),
    })
}

/// Whether messages of `size` bytes are injected: below the provider's
/// inject size, as `pingpong` and fabtests do.
async fn injects(h: &LoopHandle, size: usize) -> TaskResult<bool> {
    Ok(size < h.with_loop(|ev| ev.inject_max()).await?)
}

/// Send `tx`; the buffer back once it may be used again: at once where it
/// is injected (`LoopHandle::inject`, no send completion), once the send
/// completed otherwise.
async fn sent_back(
    h: &LoopHandle,
    peer: Peer,
    tx: Buffer,
    send: SendOpts,
    inject: bool,
) -> TaskResult<Buffer> {
    if inject {
        h.inject(peer, tx.as_slice(), send).await?;
        return Ok(tx);
    }
    let sent = h.send(peer, tx, send).await?;
    sent.result?;
    Ok(sent.buffer.ok_or("a send completed without its buffer")?)
}

/// The server: `n` messages received, each answered once the next
/// receive is posted.
async fn serve(h: LoopHandle, ep: EndpointId, peer: Peer, size: usize, n: usize) -> TaskResult<()> {
    let (send, recv) = opts();
    let mut tx = Buffer::new(size.max(1));
    tx.as_mut_slice().fill(2);
    tx.set_len(size);
    let inject = injects(&h, size).await?;
    let first = h.recv(ep, Buffer::new(size.max(1)), recv).await?;
    first.result?;
    let mut rx = first.buffer.ok_or("a receive completed without its buffer")?;
    for i in 0..n {
        tx = if i + 1 < n {
            let (next, sent) = tokio::join!(h.recv(ep, rx, recv), sent_back(&h, peer, tx, send, inject));
            let next = next?;
            next.result?;
            rx = next.buffer.ok_or("a receive completed without its buffer")?;
            sent?
        } else {
            sent_back(&h, peer, tx, send, inject).await?
        };
    }
    Ok(())
}
