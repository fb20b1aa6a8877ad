//! `hotpath`: the work of one round trip, counted the same way every run.
//!
//! A ping-pong between two processes spins on empty completion-queue reads
//! while the other side works, and how many depends on timing, so under
//! `callgrind` its instruction counts move from run to run. Here two event
//! loops in one thread take turns: one sends (`inject` below the provider's
//! inject size, `send` from it), the other polls until the message is in,
//! reposts its receive and answers, and so on. On `shm` a message is in the
//! receiver's queue when its send returns, so every read finds it: the count
//! is the hot path's, with nothing of the scheduler's.
//! `ci/bench/hotpath.sh` runs it under `callgrind` at two lengths and
//! prints instructions per round trip by library.
//!
//! `-p node` counts fabric-msg's own same-node transport
//! (`transport::node`) the same way: two `NodeLoop`s in one thread.
//!
//!     hotpath [-p PROVIDER|node (default shm)] [-S SIZE (default 8)] [-I ROUND_TRIPS (default 10000)] [--msg]

use fabric_msg::{
    connect, negotiate, Buffer, Completion, EndpointChoice, EventLoop, LadderConfig, Listener, LoopConfig,
    OpKind, Peer, RecvOpts, Requirements, SendOpts, Token,
};
use std::process::ExitCode;
use std::time::{Duration, Instant};

const USAGE: &str =
    "usage: hotpath [-p PROVIDER (default shm)] [-S SIZE (default 8)] [-I ROUND_TRIPS (default 10000)] [--msg]";
const PATIENCE: Duration = Duration::from_secs(30);

fn main() -> ExitCode {
    let (mut provider, mut size, mut trips, mut tagged) = ("shm".to_string(), 8usize, 10_000usize, true);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        if a == "--msg" {
            tagged = false;
            continue;
        }
        let Some(v) = it.next() else {
            eprintln!("hotpath: {a} needs a value\n{USAGE}");
            return ExitCode::from(2);
        };
        let number = |v: &str| v.parse::<usize>().map_err(|_| format!("{a} {v}: not a number"));
        let set = match a.as_str() {
            "-p" => {
                provider = v;
                Ok(())
            }
            "-S" => number(&v).map(|n| size = n),
            "-I" => number(&v).map(|n| trips = n),
            _ => Err(format!("unknown option {a}")),
        };
        if let Err(e) = set {
            eprintln!("hotpath: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    }
    let result = if provider == "node" {
        run_node(size, trips)
    } else {
        run(&provider, size, trips, tagged)
    };
    match result {
        Ok(line) => {
            println!("{line}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("hotpath: {e}");
            ExitCode::FAILURE
        }
    }
}

/// One side: its loop, its peer, the buffer its receive goes back up with.
struct Side {
    ev: EventLoop,
    peer: Peer,
    out: Vec<Completion>,
    spare: Vec<Buffer>,
}

impl Side {
    fn post_recv(&mut self, buf: Buffer, seq: u64, tagged: bool) -> Result<(), String> {
        let opts = RecvOpts {
            tag: tagged.then_some((seq & 0xffff, 0)),
            from: None,
        };
        self.ev
            .recv(self.peer.endpoint(), buf, opts, Token(seq))
            .map_err(|e| e.error.to_string())
    }

    /// Send message `seq` (injected when it fits). With the loops' zero
    /// `post_timeout` a full queue fails at once: the caller progresses the
    /// other side and tries again (only while shm sets up the connection).
    fn send(&mut self, seq: u64, size: usize, inject: bool, tagged: bool) -> Result<(), String> {
        let opts = SendOpts {
            tag: tagged.then_some(seq & 0xffff),
            data: None,
        };
        let mut buf = self.spare.pop().ok_or("no send buffer back yet")?;
        buf.set_len(size);
        if inject {
            let r = self
                .ev
                .inject(&self.peer, buf.as_slice(), opts)
                .map_err(|e| e.to_string());
            self.spare.push(buf);
            r
        } else {
            self.ev.send(&self.peer, buf, opts, Token(seq)).map_err(|e| {
                self.spare.extend(e.buffer);
                e.error.to_string()
            })
        }
    }

    /// `send`, progressing `other` while the provider has no room yet.
    fn send_while(
        &mut self,
        other: &mut Side,
        seq: u64,
        size: usize,
        inject: bool,
        tagged: bool,
    ) -> Result<(), String> {
        let until = Instant::now() + PATIENCE;
        loop {
            match self.send(seq, size, inject, tagged) {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() > until => return Err(e),
                Err(_) => {
                    other
                        .ev
                        .poll(&mut other.out, Some(Duration::ZERO))
                        .map_err(|e| e.to_string())?;
                    if !other.out.is_empty() {
                        return Err("a completion during the warm-up".into());
                    }
                }
            }
        }
    }

    /// Poll until the receive of message `seq` is in; repost its buffer
    /// for message `seq + 1`. Send completions bring buffers back.
    fn receive(&mut self, seq: u64, tagged: bool) -> Result<(), String> {
        // The clock is read only once a poll came back empty (never on shm):
        // the count is fabric-msg's, not the tool's.
        let mut until = None;
        loop {
            self.ev
                .poll(&mut self.out, Some(Duration::ZERO))
                .map_err(|e| e.to_string())?;
            let mut got = None;
            for c in self.out.iter_mut() {
                if let Err(e) = &c.result {
                    return Err(format!("{:?} of message {} failed: {e}", c.kind, c.token.0));
                }
                match c.kind {
                    OpKind::Recv => got = c.buffer.take(),
                    OpKind::Send => self.spare.extend(c.buffer.take()),
                    other => return Err(format!("unexpected {other:?} completion")),
                }
            }
            self.out.clear();
            if let Some(b) = got {
                return self.post_recv(b, seq + 1, tagged);
            }
            if Instant::now() > *until.get_or_insert_with(|| Instant::now() + PATIENCE) {
                return Err(format!("message {seq} not received after {PATIENCE:?}"));
            }
        }
    }
}

fn run(provider: &str, size: usize, trips: usize, tagged: bool) -> Result<String, String> {
    let same_host = provider == "shm";
    let req = Requirements {
        provider: Some(provider.into()),
        domain: if same_host {
            Some("shm".into())
        } else {
            Some("lo".into())
        },
        endpoint: EndpointChoice::Rdm,
        same_host,
        ..Default::default()
    };
    let profile = negotiate(&req, &LadderConfig::load(None).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?
        .profile;
    let inject = size < profile.inject_size;
    // One side accepts on a thread of its own and comes back: from then on
    // this thread drives both loops.
    let listener = Listener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    // Posts fail at once on a full queue (see `Side::send_while`).
    let cfg = LoopConfig {
        post_timeout: Some(Duration::ZERO),
        ..LoopConfig::default()
    };
    let (p, c) = (profile.clone(), cfg.clone());
    let accepting = std::thread::spawn(move || -> Result<(EventLoop, Peer), String> {
        let mut ev = EventLoop::new(&p, c).map_err(|e| e.to_string())?;
        let ep = ev.open_endpoint().map_err(|e| e.to_string())?;
        let peer = listener.accept(&mut ev, ep).map_err(|e| e.to_string())?;
        Ok((ev, peer))
    });
    let mut ev = EventLoop::new(&profile, cfg.clone()).map_err(|e| e.to_string())?;
    let ep = ev.open_endpoint().map_err(|e| e.to_string())?;
    let peer = connect(&mut ev, ep, addr, PATIENCE).map_err(|e| e.to_string())?;
    let (bev, bpeer) = accepting.join().map_err(|_| "the accepting thread panicked")??;
    let side = |ev, peer| Side {
        ev,
        peer,
        out: Vec::with_capacity(64),
        spare: (0..4).map(|_| Buffer::new(size)).collect(),
    };
    let (mut a, mut b) = (side(ev, peer), side(bev, bpeer));
    a.post_recv(Buffer::new(size), 0, tagged)?;
    b.post_recv(Buffer::new(size), 0, tagged)?;
    // The first message each way, while shm connects the two.
    a.send_while(&mut b, 0, size, inject, tagged)?;
    b.receive(0, tagged)?;
    b.send_while(&mut a, 0, size, inject, tagged)?;
    a.receive(0, tagged)?;
    let started = Instant::now();
    for i in 1..=trips as u64 {
        a.send(i, size, inject, tagged)?;
        b.receive(i, tagged)?;
        b.send(i, size, inject, tagged)?;
        a.receive(i, tagged)?;
    }
    let elapsed = started.elapsed();
    Ok(format!(
        "hotpath: {trips} round trips of {size} B ({}, {}) on {} in one thread, {:.3} us each",
        if tagged { "tagged" } else { "untagged" },
        if inject { "inject" } else { "send" },
        profile.provider,
        elapsed.as_secs_f64() * 1e6 / trips.max(1) as f64
    ))
}

/// Poll `l` until the receive of message `seq` is in; repost it for
/// message `seq + 1`. Send completions bring buffers back to `spare`.
/// A message larger than the ring needs its sender polled too: `sender`.
fn node_receive(
    l: &mut fabric_msg::transport::node::NodeLoop,
    mut sender: Option<(&mut fabric_msg::transport::node::NodeLoop, &mut Vec<Buffer>)>,
    out: &mut Vec<fabric_msg::transport::node::NodeCompletion>,
    spare: &mut Vec<Buffer>,
    seq: u64,
) -> Result<(), String> {
    let mut until = None;
    loop {
        if let Some((s, s_spare)) = sender.as_mut() {
            s.poll(out);
            s_spare.extend(out.drain(..).map(|c| c.buffer));
        }
        l.poll(out);
        let mut got = None;
        for c in out.drain(..) {
            if let Err(e) = &c.result {
                return Err(format!("{:?} of message {} failed: {e}", c.kind, c.token.0));
            }
            match c.kind {
                OpKind::Recv => got = Some(c.buffer),
                _ => spare.push(c.buffer),
            }
        }
        if let Some(b) = got {
            let peer = 1 - l.me();
            return l
                .recv(Some(peer), (seq + 1) & 0xffff, 0, b, Token(seq + 1))
                .map_err(|e| e.to_string());
        }
        if Instant::now() > *until.get_or_insert_with(|| Instant::now() + PATIENCE) {
            return Err(format!("message {seq} not received after {PATIENCE:?}"));
        }
    }
}

/// `run` on two same-node loops: inject up to a frame, send above.
fn run_node(size: usize, trips: usize) -> Result<String, String> {
    use fabric_msg::transport::node::{NodeConfig, NodeLoop};
    let cfg = NodeConfig::default();
    let inject = size <= cfg.max_frame;
    let mut a = NodeLoop::create(0, 2, cfg).map_err(|e| e.to_string())?;
    let mut b = NodeLoop::create(1, 2, cfg).map_err(|e| e.to_string())?;
    let names = [a.name(), b.name()];
    for side in [&mut a, &mut b] {
        for (p, n) in names.iter().enumerate() {
            side.connect(p, n).map_err(|e| e.to_string())?;
        }
    }
    let (mut out, mut spare_a, mut spare_b) = (
        Vec::with_capacity(16),
        vec![Buffer::new(size)],
        vec![Buffer::new(size)],
    );
    a.recv(Some(1), 0, 0, Buffer::new(size), Token(0))
        .map_err(|e| e.to_string())?;
    b.recv(Some(0), 0, 0, Buffer::new(size), Token(0))
        .map_err(|e| e.to_string())?;
    let send = |l: &mut NodeLoop, spare: &mut Vec<Buffer>, seq: u64| -> Result<(), String> {
        let to = 1 - l.me();
        let mut buf = spare.pop().ok_or("no send buffer back yet")?;
        buf.set_len(size);
        if inject {
            let sent = l
                .inject(to, seq & 0xffff, buf.as_slice())
                .map_err(|e| e.to_string())?;
            spare.push(buf);
            sent.then_some(()).ok_or_else(|| "the ring is full".to_string())
        } else {
            l.send(to, seq & 0xffff, buf, Token(u64::MAX))
                .map_err(|e| e.to_string())
        }
    };
    let started = Instant::now();
    for i in 0..=trips as u64 {
        send(&mut a, &mut spare_a, i)?;
        node_receive(
            &mut b,
            (!inject).then_some((&mut a, &mut spare_a)),
            &mut out,
            &mut spare_b,
            i,
        )?;
        send(&mut b, &mut spare_b, i)?;
        node_receive(
            &mut a,
            (!inject).then_some((&mut b, &mut spare_b)),
            &mut out,
            &mut spare_a,
            i,
        )?;
    }
    let elapsed = started.elapsed();
    Ok(format!(
        "hotpath: {trips} round trips of {size} B (tagged, {}) on node in one thread, {:.3} us each",
        if inject { "inject" } else { "send" },
        elapsed.as_secs_f64() * 1e6 / trips.max(1) as f64
    ))
}
