//! `rma_pingpong`: a ping-pong of RMA writes with immediate data, the way
//! fabtests' RMA tools work: each side writes into the other's registered
//! memory, and the peer learns of it from the write's notice. With
//! `-o read` the client reads the server's memory instead, one read at a
//! time (the server only polls, which manual-progress providers need), and
//! ends with a one-byte write whose notice tells the server it is done.
//!
//! Server: `rma_pingpong [options]`; client: `rma_pingpong [options] ADDRESS`;
//! both in one process over 127.0.0.1: `rma_pingpong --loopback`.
//! `--mr each` registers the same source memory anew for every write (and
//! deregisters it after): the cost that a pool of registered memory saves.

use fabric_msg::{
    negotiate, Access, Buffer, Completion, EventLoop, LadderConfig, Listener, OpKind, Peer, RecvOpts,
    RegionPool, RemoteMemory, SendOpts, Token,
};
use fabric_msg_examples::opts::{parse, Opts, Parsed, Tool, MAX_RMA_SIZE};
use fabric_msg_examples::output::{self, Monitor, Row};
use fabric_msg_examples::session::{accept_serving, loop_config};
use fabric_msg_examples::stats::IterTimes;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// Untagged receives kept posted for write notices that use one up.
const NOTICE_RECVS: u64 = 4;
/// The notice of the write that ends a read run (it fits the 4 bytes of
/// remote CQ data verbs carries).
const READS_DONE: u64 = 0x7fff_ffff;
const NOTICE_TOKEN: u64 = 1 << 32;

fn main() -> ExitCode {
    let o = match parse(Tool::RmaPingPong, std::env::args().skip(1)) {
        Ok(Parsed::Run(o)) => o,
        Ok(Parsed::Help) => {
            print!("{}", Tool::RmaPingPong.usage());
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("rma_pingpong: {e}\n\n{}", Tool::RmaPingPong.usage());
            return ExitCode::from(2);
        }
    };
    match run(&o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rma_pingpong: {e}");
            ExitCode::FAILURE
        }
    }
}

type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn run(o: &Opts) -> AnyResult<()> {
    let req = o.requirements();
    let profile = negotiate(&req, &LadderConfig::load(None)?)?.profile;
    if o.loopback {
        let listener = Listener::bind(("127.0.0.1", 0))?;
        let addr = listener.local_addr()?;
        let (sp, so) = (profile.clone(), o.clone());
        // Each side returns its loop instead of closing it: in one process,
        // shm reaches a peer's endpoint memory directly, so neither may close
        // while the other still progresses (seen as SIGSEGV in fi_cq_readfrom
        // on libfabric 1.17 and 2.1 when the client closed first).
        let server = std::thread::spawn(move || -> AnyResult<Side> {
            let mut s = Side::accept(&sp, &listener, &so)?;
            s.serve(&so)?;
            Ok(s)
        });
        let (client, result) = match Side::connect(&profile, addr, o) {
            Ok(mut c) => {
                let r = c.drive(o);
                (Some(c), r)
            }
            Err(e) => (None, Err(e)),
        };
        if let Err(e) = result {
            std::thread::sleep(Duration::from_millis(200));
            if !server.is_finished() {
                // The process exits with this error; never close the
                // client under a server that still runs.
                std::mem::forget(client);
                return Err(e);
            }
            if let Ok(Err(s)) = server.join() {
                return Err(format!("{e}; server side: {s}").into());
            }
            return Err(e);
        }
        let server = server.join().map_err(|_| "server thread panicked")??;
        drop(client);
        drop(server);
        Ok(())
    } else if let Some(host) = &o.address {
        let addr = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), o.port))?
            .next()
            .ok_or_else(|| format!("{host}: no address"))?;
        Side::connect(&profile, addr, o)?.drive(o)
    } else {
        let listener = Listener::bind(("0.0.0.0", o.bind_port))?;
        Side::accept(&profile, &listener, o)?.serve(o)
    }
}

/// One end: its loop, the peer, its exposed memory and the peer's.
struct Side {
    ev: EventLoop,
    peer: Peer,
    target: fabric_msg::MemoryRegion,
    remote: RemoteMemory,
    out: Vec<Completion>,
    held: Vec<Completion>,
}

const MAX: usize = MAX_RMA_SIZE;

impl Side {
    fn accept(p: &fabric_msg::Profile, listener: &Listener, o: &Opts) -> AnyResult<Side> {
        let mut ev = EventLoop::new(p, loop_config(o))?;
        let ep = ev.open_endpoint()?;
        // Receives go up before the connection starts (iWARP needs that).
        let peer = accept_serving("rma_pingpong", listener, &mut ev, ep, post_notice_recvs)?;
        Side::exchange(ev, peer, o.read)
    }

    fn connect(p: &fabric_msg::Profile, addr: std::net::SocketAddr, o: &Opts) -> AnyResult<Side> {
        let mut ev = EventLoop::new(p, loop_config(o))?;
        let ep = ev.open_endpoint()?;
        let peer = fabric_msg::connect_with(&mut ev, ep, addr, Duration::from_secs(10), |ev, e| {
            post_notice_recvs(ev, e)
        })?;
        Side::exchange(ev, peer, o.read)
    }

    /// Swap memory descriptors in one untagged message each way; with
    /// `read`, each side's memory may be read too.
    fn exchange(mut ev: EventLoop, peer: Peer, read: bool) -> AnyResult<Side> {
        let access = if read { Access::ReadWrite } else { Access::Write };
        let target = ev.register(MAX, access)?;
        if read {
            // What the peer reads, in place before it can see the region.
            let bytes: Vec<u8> = (0..MAX).map(|k| byte(0, k)).collect();
            target.write_at(0, &bytes)?;
        }
        let mine = target.remote().encode();
        ev.send(&peer, Buffer::from_slice(&mine), SendOpts::default(), Token(1))?;
        let mut s = Side {
            ev,
            peer,
            target,
            remote: RemoteMemory::decode(&mine)?, // replaced below
            out: Vec::new(),
            held: Vec::new(),
        };
        s.wait(|c| c.kind == OpKind::Send)?;
        let c = s.wait(|c| c.kind == OpKind::Recv)?;
        let buf = c.buffer.ok_or("descriptor message without a buffer")?;
        s.remote = s.ev.import(buf.as_slice())?;
        let mut b = buf;
        b.set_len(b.capacity());
        s.ev.recv(s.peer.endpoint(), b, RecvOpts::default(), c.token)?;
        Ok(s)
    }

    /// Wait for a completion matching `want`, failing on errors. Notices
    /// that used up a receive give it back.
    fn wait(&mut self, want: impl Fn(&Completion) -> bool) -> AnyResult<Completion> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(i) = self.held.iter().position(&want) {
                let mut c = self.held.remove(i);
                c.result
                    .clone()
                    .map_err(|e| format!("{:?} failed: {e}", c.kind))?;
                if c.kind == OpKind::RemoteWrite {
                    if let Some(mut b) = c.buffer.take() {
                        b.set_len(b.capacity());
                        // Put the notice's receive back. After the last
                        // notice the peer may already have left in good
                        // order (its write and notice completed, it closed):
                        // the receive for a notice that will never come is
                        // then refused, and that is no error; any other
                        // loss is. Seen on siw0 between two hosts, where the
                        // notice is a message and its receive is reposted.
                        match self
                            .ev
                            .recv(self.peer.endpoint(), b, RecvOpts::default(), c.token)
                        {
                            Err(fabric_msg::PostError {
                                error: fabric_msg::Error::PeerLost { why, .. },
                                ..
                            }) if why == fabric_msg::LossKind::Departed.to_string() => {}
                            r => r?,
                        }
                    }
                }
                return Ok(c);
            }
            if Instant::now() > deadline {
                return Err("no completion within 30 s: is the peer alive?".into());
            }
            self.ev.poll(&mut self.out, Some(Duration::from_millis(100)))?;
            self.held.append(&mut self.out);
        }
    }

    fn notice(&mut self, seq: u64) -> AnyResult<()> {
        let c = self.wait(|c| c.kind == OpKind::RemoteWrite)?;
        if c.data != Some(seq) {
            return Err(format!("notice {:?}, expected {seq}: lost or reordered", c.data).into());
        }
        Ok(())
    }

    fn check(&self, seq: u64, len: usize) -> AnyResult<()> {
        let mut got = vec![0u8; len];
        self.target.read_at(0, &mut got)?;
        if let Some(k) = got.iter().enumerate().position(|(k, &b)| b != byte(seq, k)) {
            return Err(format!("transfer {seq}: byte {k} of {len} is wrong").into());
        }
        Ok(())
    }

    fn serve(&mut self, o: &Opts) -> AnyResult<()> {
        if o.read {
            // The client reads what `exchange` put in place, and says when
            // it is done; polling meanwhile gives manual-progress providers
            // their progress. A busy target (`--idle-ms`) polls only now
            // and then: its progress thread, if any, serves the reads.
            if o.idle_ms > 0 {
                while !self.held.iter().any(|c| c.kind == OpKind::RemoteWrite) {
                    std::thread::sleep(Duration::from_millis(o.idle_ms));
                    self.ev.poll(&mut self.out, Some(Duration::ZERO))?;
                    self.held.append(&mut self.out);
                }
            }
            return self.notice(READS_DONE);
        }
        let source = self.ev.register(MAX, Access::Read)?;
        for (seq, size) in rounds(o) {
            self.notice(seq)?;
            if o.verify {
                self.check(seq, size)?;
                let mut bytes = vec![0u8; size];
                self.target.read_at(0, &mut bytes)?;
                source.write_at(0, &bytes)?;
            }
            self.ev.write_data(
                &self.peer,
                source.local(0, size)?,
                &self.remote,
                0,
                seq,
                Token(seq),
            )?;
            self.wait(|c| c.kind == OpKind::Write)?;
        }
        Ok(())
    }

    /// `-o read`: read `size` bytes of the server's memory per iteration.
    fn drive_reads(&mut self, o: &Opts) -> AnyResult<()> {
        let monitor = Monitor::start(Tool::RmaPingPong, !o.json);
        monitor.watch_losses(self.ev.loss_alarm());
        monitor.arm();
        let sink = self.ev.register(MAX, Access::ReadWrite)?;
        header(o, self.ev.profile());
        let mut seq = 0u64;
        for &size in &o.sizes {
            timed(o, &monitor, size, 1, |_, posted| {
                seq += 1;
                if o.verify {
                    sink.write_at(0, &vec![!byte(0, 0); size])?;
                }
                self.ev
                    .read(&self.peer, sink.local(0, size)?, &self.remote, 0, Token(seq))?;
                posted();
                self.wait(|c| c.kind == OpKind::Read)?;
                if o.verify {
                    let mut got = vec![0u8; size];
                    sink.read_at(0, &mut got)?;
                    if let Some(k) = got.iter().enumerate().position(|(k, &b)| b != byte(0, k)) {
                        return Err(format!("read {seq}: byte {k} of {size} is wrong").into());
                    }
                }
                Ok(())
            })?;
        }
        monitor.finish();
        self.ev.write_data(
            &self.peer,
            sink.local(0, 1)?,
            &self.remote,
            0,
            READS_DONE,
            Token(0),
        )?;
        self.wait(|c| c.kind == OpKind::Write)?;
        Ok(())
    }

    fn drive(&mut self, o: &Opts) -> AnyResult<()> {
        if o.read {
            return self.drive_reads(o);
        }
        let monitor = Monitor::start(Tool::RmaPingPong, !o.json);
        monitor.watch_losses(self.ev.loss_alarm());
        monitor.arm();
        let pool: RegionPool = self.ev.register_pool(MAX, 1, Access::Read)?;
        let mut plain = vec![0u8; MAX];
        header(o, self.ev.profile());
        let mut seq_all = rounds(o).into_iter().peekable();
        while let Some(&(_, size)) = seq_all.peek() {
            timed(o, &monitor, size, 2, |i, posted| {
                let (seq, _) = seq_all.next().expect("rounds cover every iteration");
                let fill: Vec<u8> = if o.verify || i == 0 {
                    (0..size).map(|k| byte(seq, k)).collect()
                } else {
                    Vec::new()
                };
                if o.register_each {
                    // The same memory every time, registered anew: only the
                    // registration differs from the pooled case.
                    if !fill.is_empty() {
                        plain[..size].copy_from_slice(&fill);
                    }
                    // SAFETY: `plain` outlives the loop's use of it: the
                    // region is dropped here, and the write holding it is
                    // waited for below, before `plain` is touched again.
                    let src = unsafe {
                        self.ev
                            .register_borrowed(plain.as_mut_ptr(), size, Access::Read)?
                    };
                    self.ev
                        .write_data(&self.peer, src.all(), &self.remote, 0, seq, Token(seq))?;
                    posted();
                    drop(src); // deregistered once the write completes
                } else {
                    let slot = pool.take().ok_or("pool slot still in use")?;
                    slot.write_at(0, &fill)?;
                    self.ev
                        .write_data(&self.peer, slot.local(size)?, &self.remote, 0, seq, Token(seq))?;
                    posted();
                }
                self.wait(|c| c.kind == OpKind::Write)?;
                self.notice(seq)?;
                if o.verify {
                    self.check(seq, size)?;
                }
                Ok(())
            })?;
        }
        monitor.finish();
        Ok(())
    }
}

/// One size's warm-up and measured iterations (`one(i, posted)` does
/// iteration `i` and calls `posted()` once its operation is posted), its
/// progress line, and its row: `xfers` transfers per iteration. Each
/// iteration's time runs from one post to the next (the clock is read
/// while the operation is on its way, off the critical path), the last
/// one's to its end.
fn timed(
    o: &Opts,
    monitor: &Monitor,
    size: usize,
    xfers: usize,
    mut one: impl FnMut(usize, &mut dyn FnMut()) -> AnyResult<()>,
) -> AnyResult<()> {
    let mut started = Instant::now();
    let mut times = IterTimes::new(o.iters);
    monitor.begin(size, o.warmup + o.iters);
    for i in 0..o.warmup + o.iters {
        monitor.tick(i);
        if i == o.warmup {
            started = Instant::now();
            times.start(started);
        }
        let measured = i > o.warmup;
        one(i, &mut || {
            if measured {
                times.lap(xfers); // the previous iteration, post to post
            }
        })?;
    }
    if o.iters > 0 {
        times.lap(xfers); // the last iteration
    }
    let row = Row {
        bytes: size,
        sent: o.iters,
        acked: o.iters,
        elapsed: times.elapsed_since(started),
        xfers_per_iter: xfers,
        tail: times.tail(),
    };
    output::report_row(o.json, &row);
    Ok(())
}

fn post_notice_recvs(ev: &mut EventLoop, ep: fabric_msg::EndpointId) -> fabric_msg::Result<()> {
    for i in 0..NOTICE_RECVS {
        ev.recv(ep, Buffer::new(256), RecvOpts::default(), Token(NOTICE_TOKEN + i))?;
    }
    Ok(())
}

/// (sequence number, size) of every transfer, warm-up included.
fn rounds(o: &Opts) -> Vec<(u64, usize)> {
    let per = o.warmup + o.iters;
    o.sizes
        .iter()
        .enumerate()
        .flat_map(|(n, &size)| (0..per).map(move |i| ((n * per + i) as u64, size)))
        .collect()
}

fn byte(seq: u64, k: usize) -> u8 {
    (seq as usize).wrapping_mul(131).wrapping_add(k) as u8
}

fn header(o: &Opts, p: &fabric_msg::Profile) {
    if o.read {
        let mut text = "RMA read, one at a time: time per read (a round trip)".to_string();
        let mut extra = serde_json::json!({ "op": "read" });
        output::progress(o, &mut extra, &mut text);
        output::header_with(o.json, "rma_pingpong", p, extra, &text);
        return;
    }
    let mr = if o.register_each { "each" } else { "pool" };
    let text = format!(
        "RMA write ping-pong, source memory {}",
        if o.register_each {
            "registered per write"
        } else {
            "pooled"
        }
    );
    let (mut text, mut extra) = (text, serde_json::json!({ "mr": mr }));
    output::progress(o, &mut extra, &mut text);
    output::header_with(o.json, "rma_pingpong", p, extra, &text);
}
