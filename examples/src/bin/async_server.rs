//! `async_server`: many peers served at once on fabric-msg's tokio
//! adapter, one task per peer, each receive under a timeout.
//!
//! ```text
//! async_server [-p PROVIDER] [-B PORT] [--idle-ms MS]     serve until killed
//! async_server --clients N [-p PROVIDER] [--idle-ms MS]   serve N clients of this process, then end
//! ```
//!
//! The server welcomes each peer with a number of its own (tag 3); the
//! peer tags its requests with it (`REQUEST + n`, so one peer's task
//! receives only its peer's requests on any provider, directed receives or
//! not), gets each back upper-cased (tag 2), then says `bye`. Each receive
//! runs under `tokio::time::timeout`: a peer that sends nothing for
//! `--idle-ms` (2000 by default) is given up, its task ends and the others
//! go on. With `--clients N` the process also runs N clients, the last of
//! which goes silent after two requests, and checks every answer: the
//! output ends with `served N-1, gave up 1`.

use fabric_msg::async_loop::{AsyncLoop, LoopHandle};
use fabric_msg::discovery::negotiate::{Capability, Requirements};
use fabric_msg::{
    connect, negotiate, Accepted, Buffer, EndpointId, EventLoop, LadderConfig, Listener, LoopConfig, Peer,
    Profile, RecvOpts, SendOpts, WaitMode,
};
use std::os::fd::AsRawFd;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::unix::AsyncFd;

/// A request's tag is this plus the peer's number.
const REQUEST: u64 = 0x1000;
const REPLY: u64 = 2;
const WELCOME: u64 = 3;
const REQUESTS: usize = 5;

type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

struct Args {
    provider: String,
    port: u16,
    idle: Duration,
    clients: usize,
}

fn parse() -> Result<Args, String> {
    let mut a = Args {
        provider: "tcp;ofi_rxm".into(),
        port: 9230,
        idle: Duration::from_millis(2000),
        clients: 0,
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut val = || it.next().ok_or(format!("{k} needs a value"));
        match k.as_str() {
            "-p" => a.provider = val()?,
            "-B" => a.port = val()?.parse().map_err(|e| format!("-B: {e}"))?,
            "--idle-ms" => {
                a.idle = Duration::from_millis(val()?.parse().map_err(|e| format!("--idle-ms: {e}"))?)
            }
            "--clients" => a.clients = val()?.parse().map_err(|e| format!("--clients: {e}"))?,
            "-h" | "--help" => {
                return Err("usage: async_server [-p PROVIDER] [-B PORT] [--idle-ms MS] [--clients N]".into())
            }
            other => return Err(format!("unknown option {other} (-h for usage)")),
        }
    }
    Ok(a)
}

fn main() -> ExitCode {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("async_server: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("async_server: no tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(a)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("async_server: {e}");
            ExitCode::FAILURE
        }
    }
}

fn profile(provider: &str) -> AnyResult<Profile> {
    let req = Requirements {
        caps: vec![Capability::Tagged],
        provider: Some(provider.into()),
        same_host: provider == "shm",
        ..Default::default()
    };
    Ok(negotiate(&req, &LadderConfig::load(None)?)?.profile)
}

fn loop_config() -> LoopConfig {
    LoopConfig {
        wait: WaitMode::Block,
        ..LoopConfig::default()
    }
}

/// How a peer's task ended.
#[derive(Debug, PartialEq)]
enum Ended {
    Served(usize),
    GaveUp(usize),
}

async fn run(a: Args) -> AnyResult<()> {
    let p = profile(&a.provider)?;
    let mut ev = EventLoop::new(&p, loop_config())?;
    let ep = ev.open_endpoint()?;
    let bind = if a.clients > 0 { 0 } else { a.port };
    let listener = Arc::new(Listener::bind(("127.0.0.1", bind))?);
    let addr = listener.local_addr()?;
    eprintln!(
        "async_server: on {addr} ({}), one task per peer, idle limit {:?}",
        p.provider, a.idle
    );
    let h = AsyncLoop::start(ev);
    let mut clients = Vec::new();
    for i in 0..a.clients {
        let silent = i + 1 == a.clients;
        let p = p.clone();
        clients.push(tokio::spawn(async move { client(i, p, addr, silent).await }));
    }
    // Handshakes advance on the driver without blocking
    // (`Listener::poll_accept` with a zero timeout); between looks this task
    // sleeps on the listening socket, or for at most 2 ms while handshakes
    // are in progress (their own sockets are not watched here).
    let ready = AsyncFd::new(listener.as_raw_fd())?;
    let mut peers = Vec::new();
    while a.clients == 0 || peers.len() < a.clients {
        let l = listener.clone();
        let looked = h
            .with_loop(move |ev| l.poll_accept(ev, ep, Some(Duration::ZERO)))
            .await??;
        let peer = match looked {
            Some(Accepted::Peer(peer)) => peer,
            Some(Accepted::Refused(r)) => {
                eprintln!("async_server: a client was refused: {r}");
                continue;
            }
            None => {
                match listener.poll_within() {
                    None => ready.readable().await?.clear_ready(),
                    Some(d) => {
                        tokio::select! {
                            g = ready.readable() => g?.clear_ready(),
                            _ = tokio::time::sleep(d.min(Duration::from_millis(2))) => {}
                        }
                    }
                }
                continue;
            }
        };
        let n = peers.len();
        let welcome = SendOpts {
            tag: Some(WELCOME),
            data: None,
        };
        h.send(peer, Buffer::from_slice(&(n as u64).to_le_bytes()), welcome)
            .await?
            .result?;
        peers.push(tokio::spawn(serve_peer(h.clone(), ep, peer, n, a.idle)));
    }
    let (mut served, mut gave_up) = (0, 0);
    for t in peers {
        match t.await?? {
            Ended::Served(_) => served += 1,
            Ended::GaveUp(_) => gave_up += 1,
        }
    }
    // The silent client waits for ever: it has been given up, so it goes.
    if let Some(silent) = clients.pop() {
        silent.abort();
    }
    for c in clients {
        c.await??;
    }
    println!("async_server: served {served}, gave up {gave_up}");
    if a.clients > 0 && (served, gave_up) != (a.clients - 1, 1) {
        return Err(format!("expected {} served and 1 given up", a.clients - 1).into());
    }
    drop(ready);
    h.close().await;
    Ok(())
}

/// One peer's task: answer its requests until `bye`, or give it up after
/// `idle` without one.
async fn serve_peer(h: LoopHandle, ep: EndpointId, peer: Peer, n: usize, idle: Duration) -> AnyResult<Ended> {
    let recv = RecvOpts {
        from: None,
        tag: Some((REQUEST + n as u64, 0)),
    };
    let reply = SendOpts {
        tag: Some(REPLY),
        data: None,
    };
    let mut answered = 0;
    loop {
        let c = match tokio::time::timeout(idle, h.recv(ep, Buffer::new(256), recv)).await {
            Err(_) => {
                // The timeout dropped the receive's future, which cancels
                // the receive (see async_loop's docs): the peer's later
                // messages wait for a receive nobody posts.
                eprintln!("async_server: peer {n}: nothing for {idle:?} after {answered} requests: given up");
                return Ok(Ended::GaveUp(answered));
            }
            Ok(c) => c?,
        };
        c.result?;
        let mut b = c.buffer.ok_or("a receive without its buffer")?;
        if b.as_slice() == b"bye" {
            return Ok(Ended::Served(answered));
        }
        b.as_mut_slice().make_ascii_uppercase();
        h.send(peer, b, reply).await?.result?;
        answered += 1;
    }
}

/// A client of this process: `REQUESTS` requests and `bye`, or (`silent`)
/// two requests and then nothing until the server has given it up.
async fn client(i: usize, p: Profile, addr: std::net::SocketAddr, silent: bool) -> AnyResult<()> {
    let (ev, ep, peer) = tokio::task::spawn_blocking(move || -> fabric_msg::Result<_> {
        let mut ev = EventLoop::new(&p, loop_config())?;
        let ep = ev.open_endpoint()?;
        let peer = connect(&mut ev, ep, addr, Duration::from_secs(20))?;
        Ok((ev, ep, peer))
    })
    .await??;
    let h = AsyncLoop::start(ev);
    let welcome = RecvOpts {
        from: None,
        tag: Some((WELCOME, 0)),
    };
    let c = h.recv(ep, Buffer::new(8), welcome).await?;
    c.result?;
    let me = c.buffer.ok_or("a welcome without its buffer")?;
    let me = u64::from_le_bytes(
        me.as_slice()
            .try_into()
            .map_err(|_| "a welcome of the wrong size")?,
    );
    let send = SendOpts {
        tag: Some(REQUEST + me),
        data: None,
    };
    let recv = RecvOpts {
        from: None,
        tag: Some((REPLY, 0)),
    };
    let n = if silent { 2 } else { REQUESTS };
    for k in 0..n {
        let msg = format!("hello {k} from client {i}");
        let (back, sent) = tokio::join!(
            h.recv(ep, Buffer::new(256), recv),
            h.send(peer, Buffer::from_slice(msg.as_bytes()), send)
        );
        sent?.result?;
        let back = back?;
        back.result?;
        let got = back.buffer.ok_or("a reply without its buffer")?;
        if got.as_slice() != msg.to_ascii_uppercase().as_bytes() {
            return Err(format!(
                "client {i}: sent {msg:?}, got {:?}",
                String::from_utf8_lossy(got.as_slice())
            )
            .into());
        }
    }
    if silent {
        // Quiet, connected, alive: the server gives it up; then `run`
        // aborts this task.
        std::future::pending::<()>().await;
    }
    h.send(peer, Buffer::from_slice(b"bye"), send).await?.result?;
    h.close().await;
    Ok(())
}
