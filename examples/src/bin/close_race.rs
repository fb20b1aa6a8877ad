//! `close_race`: close an event loop right after its peer received a burst
//! of its messages, as a program that ends without a goodbye does.
//!
//! `ofi_rxm` over verbs without a shared receive context (RoCE, InfiniBand)
//! gives receive credits back to the sender in messages of its own, sent as
//! the receiver reposts its buffers. Such a message that reached the sender
//! after its last read of the completion queue is found by rxm's close:
//! `rxm_close_conn` (libfabric 1.17 and 2.1) closes the connection's MSG
//! endpoint, then reads the MSG completion queue and reposts each receive
//! buffer it finds on the endpoint it has just closed (SIGSEGV). fabric-msg
//! reads its completion queue for 5 ms before it closes such an endpoint,
//! so rxm finds nothing that came before; this tool is that check in the VM
//! matrix (`ci/matrix/negotiate-guest.sh`, `roce-rdm-close-race`).
//!
//! Each round connects two loops in this process, sends `-m` messages from
//! one to the other, and once the last one is received waits `-w`
//! milliseconds without reading either queue (the credits arrive) and drops
//! the sender's loop, then the receiver's.
//!
//!     close_race [-p PROVIDER] [-d DOMAIN] [-n ROUNDS] [-m MESSAGES] [-w MS]

use fabric_msg::{
    connect, negotiate, Buffer, Completion, EventLoop, LadderConfig, Listener, LoopConfig, OpKind, RecvOpts,
    Requirements, SendOpts, Token,
};
use std::process::ExitCode;
use std::time::{Duration, Instant};

const USAGE: &str =
    "usage: close_race [-p PROVIDER] [-d DOMAIN] [-n ROUNDS (default 20)] [-m MESSAGES (default 1000)] [-w MS (default 20)]";
/// Sends in flight, and receives posted.
const WINDOW: usize = 64;
const LEN: usize = 64;
const PATIENCE: Duration = Duration::from_secs(60);

fn main() -> ExitCode {
    let mut req = Requirements::default();
    let (mut rounds, mut messages, mut wait_ms) = (20u32, 1000usize, 20u64);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let Some(v) = it.next() else {
            eprintln!("close_race: {a} needs a value\n{USAGE}");
            return ExitCode::from(2);
        };
        let number = |v: &str| v.parse::<usize>().map_err(|_| format!("{a} {v}: not a number"));
        let set = match a.as_str() {
            "-p" => {
                req.provider = Some(v);
                Ok(())
            }
            "-d" => {
                req.domain = Some(v);
                Ok(())
            }
            "-n" => number(&v).map(|n| rounds = n as u32),
            "-m" => number(&v).map(|n| messages = n),
            "-w" => number(&v).map(|n| wait_ms = n as u64),
            _ => Err(format!("unknown option {a}")),
        };
        if let Err(e) = set {
            eprintln!("close_race: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    }
    match run(&req, rounds, messages, Duration::from_millis(wait_ms)) {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("close_race: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Poll `ev` once, briefly; any failed completion is an error.
fn poll(ev: &mut EventLoop, out: &mut Vec<Completion>) -> Result<(), String> {
    ev.poll(out, Some(Duration::from_millis(1)))
        .map_err(|e| e.to_string())?;
    match out.iter().find_map(|c| c.result.as_ref().err()) {
        Some(e) => Err(format!("a completion failed: {e}")),
        None => Ok(()),
    }
}

fn run(req: &Requirements, rounds: u32, messages: usize, wait: Duration) -> Result<String, String> {
    let found =
        negotiate(req, &LadderConfig::load(None).map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
    let profile = found.profile;
    let started = Instant::now();
    for round in 0..rounds {
        // The receiver accepts on a thread of its own, then comes back here:
        // from then on one thread drives both loops, so what is read when
        // is decided here alone.
        let listener = Listener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let p = profile.clone();
        let accepting = std::thread::spawn(move || -> Result<_, String> {
            let mut ev = EventLoop::new(&p, LoopConfig::default()).map_err(|e| e.to_string())?;
            let ep = ev.open_endpoint().map_err(|e| e.to_string())?;
            for _ in 0..WINDOW {
                ev.recv(ep, Buffer::new(LEN), RecvOpts::default(), Token(1))
                    .map_err(|e| e.to_string())?;
            }
            listener.accept(&mut ev, ep).map_err(|e| e.to_string())?;
            Ok((ev, ep))
        });
        let mut tx = EventLoop::new(&profile, LoopConfig::default()).map_err(|e| e.to_string())?;
        let tx_ep = tx.open_endpoint().map_err(|e| e.to_string())?;
        let peer = connect(&mut tx, tx_ep, addr, PATIENCE).map_err(|e| e.to_string())?;
        let (mut rx, rx_ep) = accepting.join().map_err(|_| "the accepting thread panicked")??;

        let (mut sent, mut done, mut received) = (0usize, 0usize, 0usize);
        let mut out = Vec::new();
        let until = Instant::now() + PATIENCE;
        while received < messages || done < messages {
            if Instant::now() > until {
                return Err(format!(
                    "round {round}: {received} of {messages} received, {done} sends complete after {PATIENCE:?}"
                ));
            }
            while sent < messages && sent - done < WINDOW {
                let mut b = Buffer::new(LEN);
                b.as_mut_slice().fill(sent as u8);
                tx.send(&peer, b, SendOpts::default(), Token(2))
                    .map_err(|e| e.error.to_string())?;
                sent += 1;
            }
            poll(&mut tx, &mut out)?;
            done += out.iter().filter(|c| c.kind == OpKind::Send).count();
            out.clear();
            poll(&mut rx, &mut out)?;
            for c in out.drain(..) {
                let b = c.buffer.ok_or("a receive without its buffer")?;
                if b.as_slice() != [received as u8; LEN] {
                    return Err(format!(
                        "round {round}: message {received} arrived wrong or out of order"
                    ));
                }
                received += 1;
                rx.recv(rx_ep, b, RecvOpts::default(), Token(1))
                    .map_err(|e| e.to_string())?;
            }
        }
        // The receiver reposted its buffers as the messages came, and its
        // rxm sent credits back: they arrive while neither loop reads.
        std::thread::sleep(wait);
        drop(tx);
        drop(rx);
    }
    Ok(format!(
        "close_race: {rounds} rounds of {messages} messages on {} domain {}, each sender's loop closed {:?} \
         after its last message was received, in {:.1} s",
        profile.provider,
        profile.domain,
        wait,
        started.elapsed().as_secs_f64()
    ))
}
