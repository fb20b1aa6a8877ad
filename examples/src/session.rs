//! What `pingpong` and `bandwidth` share around their measuring loops:
//! negotiation, the out-of-band bootstrap (server, client, or both in one
//! process), the control messages that keep the two sides in step, and the
//! end of a run. The control messages themselves are in `control.rs`.
//!
//! The client decides what to measure and sends it as a [`Plan`]; the
//! server follows it, so the two cannot disagree on sizes or counts. For
//! each size the server posts its receives and then says [`Ctrl::Ready`];
//! at the end both sides send [`Ctrl::Done`] and wait for the other's, so
//! neither leaves while a message is still on its way (a message injected
//! on a manual-progress provider leaves only while its sender progresses).
//!
//! Control messages are untagged; data is tagged (tag = sequence number,
//! 16 bits) unless `--msg`. Every message is sent only once the receiver
//! has a receive posted for it (iWARP ends a connection otherwise), and
//! where control and data share the untagged queue a side never has both
//! kinds posted in an order that could match the wrong one.

use crate::control::CTRL_CAP;
pub use crate::control::{Ctrl, Plan};
use crate::opts::{Opts, Parsed, Tool};
use crate::output::{self, Monitor, Row};
use fabric_msg::{
    connect_with, negotiate, Accepted, Buffer, Completion, EndpointId, Error, EventLoop, LadderConfig,
    Listener, LoopConfig, OpKind, Peer, Profile, RecvOpts, SendOpts, Token,
};
use std::collections::VecDeque;
use std::net::ToSocketAddrs;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// Errors of the tools.
pub type AnyError = Box<dyn std::error::Error + Send + Sync>;
/// Result of the tools.
pub type AnyResult<T> = Result<T, AnyError>;

/// Time allowed for each step of the out-of-band handshake.
pub const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest total of message buffers one side allocates.
pub const BUFFER_BUDGET: usize = 1 << 30;

/// Tokens of control operations have this bit; data tokens are sequence
/// numbers.
const CTRL: u64 = 1 << 63;
/// Control buffers per side: receives kept posted, messages not yet
/// read, and sends in flight.
const CTRL_BUFFERS: usize = 8;

/// One end of a connected run: the loop, the peer, and the control
/// messages in flight. The tools' loops post data and call [`Side::poll`].
#[derive(Debug)]
pub struct Side {
    /// The event loop.
    pub ev: EventLoop,
    /// The other side.
    pub peer: Peer,
    out: Vec<Completion>,
    ctrl_free: Vec<Buffer>,
    ctrl_in: VecDeque<Buffer>,
    ctrl_sending: usize,
    /// Control receives to keep posted (0: the tool posts them).
    ctrl_depth: usize,
    monitor: Option<Arc<Monitor>>,
    /// Payloads below this many bytes are injected (fabtests' rule:
    /// `size < inject_size`, less fabric-msg's 16-byte header where
    /// messages are framed).
    inject_below: usize,
    tagged: bool,
    /// Buffers of data sends that completed in a batch beside the one
    /// [`Side::wait_send`] returned, for its next calls.
    sent: Vec<Buffer>,
}

fn ctrl_buffers() -> Vec<Buffer> {
    (0..CTRL_BUFFERS).map(|_| Buffer::new(CTRL_CAP)).collect()
}

fn post_ctrl(ev: &mut EventLoop, ep: EndpointId, pool: &mut Vec<Buffer>) -> fabric_msg::Result<()> {
    let b = pool.pop().ok_or_else(|| Error::Closed {
        what: "control buffers (all in use)".into(),
    })?;
    ev.recv(ep, b, RecvOpts::default(), Token(CTRL))?;
    Ok(())
}

impl Side {
    fn new(ev: EventLoop, peer: Peer, ctrl_free: Vec<Buffer>, ctrl_depth: usize, tagged: bool) -> Side {
        let overhead = if ev.framed() { 16 } else { 0 };
        let inject_below = ev.profile().inject_size.saturating_sub(overhead);
        Side {
            ev,
            peer,
            out: Vec::with_capacity(64),
            sent: Vec::with_capacity(64),
            ctrl_free,
            ctrl_in: VecDeque::with_capacity(CTRL_BUFFERS),
            ctrl_sending: 0,
            ctrl_depth,
            monitor: None,
            inject_below,
            tagged,
        }
    }

    /// Whether messages of `size` bytes go out with `fi_inject`, as
    /// fabtests sends those below the provider's inject size.
    #[inline]
    pub fn injects(&self, size: usize) -> bool {
        size < self.inject_below
    }

    #[inline]
    fn send_opts(&self, seq: usize) -> SendOpts {
        SendOpts {
            tag: self.tagged.then_some(seq as u64 & 0xffff),
            data: None,
        }
    }

    #[inline]
    fn recv_opts(&self, seq: usize) -> RecvOpts {
        RecvOpts {
            tag: self.tagged.then_some((seq as u64 & 0xffff, 0)),
            from: None,
        }
    }

    /// Post a receive for data message `seq` into `buf` (its capacity).
    #[inline]
    pub fn recv(&mut self, mut buf: Buffer, seq: usize) -> AnyResult<()> {
        buf.set_len(buf.capacity());
        let opts = self.recv_opts(seq);
        self.ev.recv(self.peer.endpoint(), buf, opts, Token(seq as u64))?;
        Ok(())
    }

    /// Send `buf` (its `len()` bytes) as data message `seq`.
    #[inline]
    pub fn send(&mut self, buf: Buffer, seq: usize) -> AnyResult<()> {
        let opts = self.send_opts(seq);
        self.ev.send(&self.peer, buf, opts, Token(seq as u64))?;
        Ok(())
    }

    /// Inject `bytes` as data message `seq` (no completion).
    #[inline]
    pub fn inject(&mut self, bytes: &[u8], seq: usize) -> AnyResult<()> {
        let opts = self.send_opts(seq);
        self.ev.inject(&self.peer, bytes, opts)?;
        Ok(())
    }

    /// Receive into caller memory (`pingpong --borrowed`).
    ///
    /// # Safety
    /// As [`EventLoop::recv_borrowed`]: the `len` bytes at `data` stay
    /// valid and untouched until the completion comes back.
    pub unsafe fn recv_borrowed(&mut self, data: *mut u8, len: usize, seq: usize) -> AnyResult<()> {
        let opts = self.recv_opts(seq);
        // SAFETY: the caller keeps the memory valid as documented above.
        unsafe {
            self.ev
                .recv_borrowed(self.peer.endpoint(), data, len, opts, Token(seq as u64))?
        };
        Ok(())
    }

    /// Send caller memory (`pingpong --borrowed`).
    ///
    /// # Safety
    /// As [`EventLoop::send_borrowed`]: the `len` bytes at `data` stay
    /// valid and unwritten until the completion comes back.
    pub unsafe fn send_borrowed(&mut self, data: *const u8, len: usize, seq: usize) -> AnyResult<()> {
        let opts = self.send_opts(seq);
        // SAFETY: the caller keeps the memory valid as documented above.
        unsafe {
            self.ev
                .send_borrowed(&self.peer, data, len, opts, Token(seq as u64))?
        };
        Ok(())
    }

    /// Post one control receive (for the next control message the peer
    /// sends). See the module docs for when.
    pub fn post_ctrl_recv(&mut self) -> AnyResult<()> {
        post_ctrl(&mut self.ev, self.peer.endpoint(), &mut self.ctrl_free)?;
        Ok(())
    }

    /// Send a control message: injected if small enough and `reliable` is
    /// not asked; otherwise sent from a buffer whose completion
    /// [`Side::flush`] waits for.
    pub fn send_ctrl(&mut self, c: &Ctrl, reliable: bool) -> AnyResult<()> {
        let mut b = self.ctrl_free.pop().ok_or("control buffers all in use")?;
        b.set_len(b.capacity());
        let n = c.encode(b.as_mut_slice());
        if !reliable && self.injects(n) {
            let r = self
                .ev
                .inject(&self.peer, &b.as_slice()[..n], SendOpts::default());
            self.ctrl_free.push(b);
            r?;
        } else {
            b.set_len(n);
            self.ev.send(&self.peer, b, SendOpts::default(), Token(CTRL))?;
            self.ctrl_sending += 1;
        }
        Ok(())
    }

    /// Tell the client that receives for size `index` are posted.
    pub fn ready(&mut self, index: usize) -> AnyResult<()> {
        self.send_ctrl(&Ctrl::Ready { index }, false)
    }

    /// `done` messages of the current size are finished (for the progress
    /// line and the stall watchdog).
    #[inline]
    pub fn tick(&self, done: usize) {
        if let Some(m) = &self.monitor {
            m.tick(done);
        }
    }

    /// Wait (spinning or blocking, as `-c` says) for completions and hand
    /// each data completion to `f`; control completions are kept for
    /// [`Side::wait_ctrl`]. A failed operation is an error, and so is the
    /// peer's loss (its process ended or stopped: the bootstrap's
    /// lifeline). The watchdog thread ends the process if the peer goes
    /// silent otherwise.
    #[inline]
    pub fn poll(&mut self, mut f: impl FnMut(&mut Side, &mut Completion) -> AnyResult<()>) -> AnyResult<()> {
        let mut out = std::mem::take(&mut self.out);
        let r = self
            .ev
            .poll(&mut out, None)
            .map_err(AnyError::from)
            .and_then(|_| {
                // By reference: a completion is a few hundred bytes, and only
                // its buffer needs to move.
                for c in out.iter_mut() {
                    if let (OpKind::PeerLost, Err(e)) = (c.kind, &c.result) {
                        return Err(format!("{e}").into());
                    }
                    if c.token.0 & CTRL != 0 {
                        self.on_ctrl(c)?;
                    } else if let Err(e) = &c.result {
                        return Err(format!("{:?} of message {} failed: {e}", c.kind, c.token.0).into());
                    } else {
                        f(self, c)?;
                    }
                }
                Ok(())
            });
        out.clear();
        self.out = out;
        r
    }

    fn on_ctrl(&mut self, c: &mut Completion) -> AnyResult<()> {
        if let Err(e) = &c.result {
            return Err(format!("control {:?} failed: {e}", c.kind).into());
        }
        let b = c.buffer.take().ok_or("control completion without its buffer")?;
        match c.kind {
            OpKind::Send => {
                self.ctrl_sending -= 1;
                self.ctrl_free.push(b);
            }
            OpKind::Recv => {
                self.ctrl_in.push_back(b);
                if self.ctrl_in.len() + self.ctrl_depth > CTRL_BUFFERS - 2 {
                    return Err("the peer sends control messages faster than they are read".into());
                }
                if self.ctrl_depth > 0 {
                    self.post_ctrl_recv()?;
                }
            }
            other => return Err(format!("unexpected {other:?} completion for a control message").into()),
        }
        Ok(())
    }

    /// The next control message; data completions meanwhile go to `f`.
    pub fn wait_ctrl_with(
        &mut self,
        mut f: impl FnMut(&mut Side, &mut Completion) -> AnyResult<()>,
    ) -> AnyResult<Ctrl> {
        loop {
            if let Some(b) = self.ctrl_in.pop_front() {
                let c = Ctrl::decode(b.as_slice());
                self.ctrl_free.push(b);
                return match c? {
                    Ctrl::Refused(why) => Err(format!("the server refused: {why}").into()),
                    c => Ok(c),
                };
            }
            self.poll(&mut f)?;
        }
    }

    /// The next control message, with no data expected meanwhile.
    pub fn wait_ctrl(&mut self) -> AnyResult<Ctrl> {
        self.wait_ctrl_with(|_, c| {
            Err(format!(
                "{:?} of message {} completed while only a control message was expected",
                c.kind, c.token.0
            )
            .into())
        })
    }

    /// Wait for a data send to complete and give back its buffer; no
    /// receive may complete meanwhile. Sends that complete in the same
    /// batch are kept for the next calls: each call gives back one buffer,
    /// and none is lost (a batch of several once dropped all but the last,
    /// and `bandwidth` then waited for ever for its window's buffers).
    pub fn wait_send(&mut self) -> AnyResult<Buffer> {
        while self.sent.is_empty() {
            let mut sent = std::mem::take(&mut self.sent);
            let r = self.poll(|_, c| match c.kind {
                OpKind::Send => {
                    sent.push(c.buffer.take().ok_or("a send completes with its buffer")?);
                    Ok(())
                }
                OpKind::Recv => Err(format!("message {} arrived while none was expected", c.token.0).into()),
                other => Err(format!("unexpected {other:?} completion while sending").into()),
            });
            self.sent = sent;
            r?;
        }
        Ok(self.sent.pop().expect("a buffer, by the loop's condition"))
    }

    /// Wait for every control send to complete.
    pub fn flush(&mut self) -> AnyResult<()> {
        while self.ctrl_sending > 0 {
            self.poll(|_, c| Err(format!("unexpected {:?} completion at the end", c.kind).into()))?;
        }
        Ok(())
    }

    /// End the run: send Done, wait for the peer's, and for ours to leave.
    fn finish(&mut self) -> AnyResult<()> {
        self.send_ctrl(&Ctrl::Done, true)?;
        match self.wait_ctrl()? {
            Ctrl::Done => self.flush(),
            other => Err(format!("expected the peer's Done, got {other:?}").into()),
        }
    }
}

/// A measuring tool: its loops for one size, each side.
pub trait Bench: Sized {
    /// Control receives the client keeps posted at all times; 0 when the
    /// tool posts each one itself, where control and data are both
    /// untagged and must not be confused.
    const CLIENT_CTRL_DEPTH: usize;

    /// The tool's state for these options.
    fn new(o: &Opts) -> Self;

    /// Messages one size of `plan` takes, warm-up included.
    fn messages(plan: &Plan) -> usize {
        plan.messages()
    }

    /// Client: run size `k` of `plan` (the server is ready) and return the
    /// measurement. Before the last reply of the size can arrive, post the
    /// control receive for the message that follows it (Ready or Done),
    /// unless `CLIENT_CTRL_DEPTH` keeps them posted.
    fn client(&mut self, side: &mut Side, plan: &Plan, k: usize) -> AnyResult<Row>;

    /// Server: post the receives for size `k`, call [`Side::ready`], and
    /// serve the size. After the last data receive of the last size, post
    /// a control receive (for the client's Done) before replying.
    fn server(&mut self, side: &mut Side, plan: &Plan, k: usize) -> AnyResult<()>;
}

/// The tool's `main`: parse, run, and exit 0, 1 (failed) or 2 (usage).
pub fn main<B: Bench>(tool: Tool) -> ExitCode {
    let o = match crate::opts::parse(tool, std::env::args().skip(1)) {
        Ok(Parsed::Run(o)) => o,
        Ok(Parsed::Help) => {
            print!("{}", tool.usage());
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("{}: {e}\n\n{}", tool.name(), tool.usage());
            return ExitCode::from(2);
        }
    };
    match run::<B>(&o) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            report_error(tool, &*e);
            ExitCode::FAILURE
        }
    }
}

/// Print an error; negotiation failures list every reason, one a line.
pub fn report_error(tool: Tool, e: &(dyn std::error::Error + 'static)) {
    if let Some(Error::NoFabric { wanted, reasons }) = e.downcast_ref::<Error>() {
        eprintln!("{}: no usable fabric for {wanted}", tool.name());
        for r in reasons {
            eprintln!("  {r}");
        }
        eprintln!("Change -p, -e, -d or --msg, or FI_PROVIDER; `fabric_info` shows what this host offers.");
    } else {
        eprintln!("{}: {e}", tool.name());
    }
}

fn run<B: Bench>(o: &Opts) -> AnyResult<()> {
    let found = negotiate(&o.requirements(), &LadderConfig::load(None)?)?;
    let profile = found.profile;
    let plan = Plan::from_opts(o);
    if o.loopback || o.address.is_some() {
        plan.check(o.tool, &profile, profile.max_msg_size)?;
    }
    let monitor = Monitor::start(o.tool, true);
    let r = if o.loopback {
        let listener = Listener::bind(("127.0.0.1", 0))?;
        let addr = listener.local_addr()?;
        let (sp, so) = (profile.clone(), o.clone());
        let server = std::thread::spawn(move || {
            // The client cannot finish without the server: a server-side
            // failure ends the process with its own reason.
            if let Err(e) = serve::<B>(&listener, &sp, &so, None) {
                eprintln!("{}: server side: {e}", so.tool.name());
                std::process::exit(1);
            }
        });
        client::<B>(o, &profile, addr, &monitor, Some(server))
    } else if let Some(host) = &o.address {
        client::<B>(o, &profile, (host.as_str(), o.port), &monitor, None)
    } else {
        let listener = Listener::bind(("0.0.0.0", o.bind_port))?;
        eprintln!(
            "{}: server on {} ({}, {}), waiting for a client",
            o.tool.name(),
            listener.local_addr()?,
            profile.provider,
            profile.endpoint_type
        );
        serve::<B>(&listener, &profile, o, Some(&monitor))
    };
    monitor.finish();
    r
}

/// A server's accept: wait for a peer whose handshake succeeds, printing
/// one line for each connection refused meanwhile (who, why) instead of
/// giving up: a port scan or a misconfigured client does not end a server.
pub fn accept_serving(
    tool: &str,
    listener: &Listener,
    ev: &mut EventLoop,
    ep: EndpointId,
    mut prepost: impl FnMut(&mut EventLoop, EndpointId) -> fabric_msg::Result<()>,
) -> fabric_msg::Result<Peer> {
    loop {
        match listener.poll_accept_with(ev, ep, None, &mut prepost)? {
            Some(Accepted::Peer(peer)) => return Ok(peer),
            Some(Accepted::Refused(r)) => eprintln!("{tool}: {r}; still waiting for a client"),
            None => {}
        }
    }
}

/// The event loop the options ask for (`-c`, `--spin-us`, `--progress-us`).
pub fn loop_config(o: &Opts) -> LoopConfig {
    LoopConfig {
        wait: o.wait,
        spin_before_block: Duration::from_micros(o.spin_us),
        progress_thread: if o.progress_us > 0 {
            fabric_msg::ProgressThread::On
        } else {
            fabric_msg::ProgressThread::Off
        },
        progress_period: Duration::from_micros(o.progress_us.max(1)),
        ..Default::default()
    }
}

fn client<B: Bench>(
    o: &Opts,
    profile: &Profile,
    addr: impl ToSocketAddrs,
    monitor: &Arc<Monitor>,
    server: Option<std::thread::JoinHandle<()>>,
) -> AnyResult<()> {
    let plan = Plan::from_opts(o);
    let mut ev = EventLoop::new(profile, loop_config(o))?;
    let ep = ev.open_endpoint()?;
    let mut ctrl = ctrl_buffers();
    // Ready for size 0 may come as soon as the plan is out.
    let posted = B::CLIENT_CTRL_DEPTH.max(1);
    let peer = match connect_with(&mut ev, ep, addr, BOOTSTRAP_TIMEOUT, |ev, e| {
        (0..posted).try_for_each(|_| post_ctrl(ev, e, &mut ctrl))
    }) {
        Ok(peer) => peer,
        Err(e) => return settle(server, Err(connect_failed(o, e))),
    };
    let mut side = Side::new(ev, peer, ctrl, B::CLIENT_CTRL_DEPTH, plan.tagged);
    let r = client_plan::<B>(o, profile, &plan, &mut side, monitor);
    // With --loopback the server thread ends before this side's loop
    // closes: shm (1.17) gives an endpoint in the same process its peer's
    // region by pointer, and closing it under a polling server crashes.
    let r = settle(server, r);
    drop(side);
    r
}

/// After the client side of `--loopback` is done: on success the server
/// thread must end too; on failure its own reason (usually the cause: it
/// closed the connection) gets a moment to be printed first.
fn settle(server: Option<std::thread::JoinHandle<()>>, r: AnyResult<()>) -> AnyResult<()> {
    let Some(server) = server else { return r };
    if r.is_ok() {
        return server.join().map_err(|_| "server thread panicked".into());
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    while !server.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    r
}

fn connect_failed(o: &Opts, e: Error) -> AnyError {
    match e {
        Error::Io { .. } => format!(
            "{e}: is a {0} server listening there? Start one with `{0} -B PORT` and connect with -P PORT",
            o.tool.name()
        )
        .into(),
        e => AnyError::from(e),
    }
}

fn client_plan<B: Bench>(
    o: &Opts,
    profile: &Profile,
    plan: &Plan,
    side: &mut Side,
    monitor: &Arc<Monitor>,
) -> AnyResult<()> {
    plan.check(o.tool, profile, side.peer.agreement.max_msg_size)?;
    side.monitor = Some(monitor.clone());
    monitor.watch_losses(side.ev.loss_alarm());
    monitor.arm();
    side.send_ctrl(&Ctrl::Plan(plan.clone()), false)?;
    let mut bench = B::new(o);
    for (k, &size) in plan.sizes.iter().enumerate() {
        match side.wait_ctrl()? {
            Ctrl::Ready { index } if index == k => {}
            other => return Err(format!("expected Ready for size {k}, got {other:?}").into()),
        }
        if k == 0 {
            output::header(o, profile);
        }
        monitor.begin(size, B::messages(plan));
        let row = bench.client(side, plan, k)?;
        output::report(o, &row);
    }
    // After the peers' Done, so that every message either side sent is
    // counted on both (the last reply's completion could still be unread
    // before: 26 sent against 27 received, once in CI).
    side.finish()?;
    if o.stats {
        output::loop_stats(o.json, "client", &side.ev.stats());
    }
    Ok(())
}

fn serve<B: Bench>(
    listener: &Listener,
    profile: &Profile,
    o: &Opts,
    monitor: Option<&Arc<Monitor>>,
) -> AnyResult<()> {
    let mut ev = EventLoop::new(profile, loop_config(o))?;
    let ep = ev.open_endpoint()?;
    let mut ctrl = ctrl_buffers();
    let peer = accept_serving(o.tool.name(), listener, &mut ev, ep, |ev, e| {
        post_ctrl(ev, e, &mut ctrl)
    })?;
    let mut side = Side::new(ev, peer, ctrl, 0, false);
    side.monitor = monitor.cloned();
    if let Some(m) = monitor {
        m.watch_losses(side.ev.loss_alarm());
        m.arm();
    }
    let plan = match side.wait_ctrl()? {
        Ctrl::Plan(p) => p,
        other => return Err(format!("expected the client's plan, got {other:?}").into()),
    };
    if let Err(why) = plan.check(o.tool, profile, side.peer.agreement.max_msg_size) {
        // Reliable, so the reason reaches the client before we go.
        side.send_ctrl(&Ctrl::Refused(why.clone()), true)?;
        side.flush()?;
        return Err(format!("refused the client's plan: {why}").into());
    }
    side.tagged = plan.tagged;
    let mut bench = B::new(o);
    for (k, &size) in plan.sizes.iter().enumerate() {
        if let Some(m) = monitor {
            m.begin(size, B::messages(&plan));
        }
        bench.server(&mut side, &plan, k)?;
    }
    // After the peers' Done, so that every message either side sent is
    // counted on both (the last reply's completion could still be unread
    // before: 26 sent against 27 received, once in CI).
    side.finish()?;
    if o.stats {
        output::loop_stats(o.json, "server", &side.ev.stats());
    }
    Ok(())
}

/// Grow `pool` to `count` buffers of at least `capacity` bytes, replacing
/// smaller ones (outside any measured loop). New buffers are [`touched`].
pub fn provision(pool: &mut Vec<Buffer>, count: usize, capacity: usize) {
    pool.retain(|b| b.capacity() >= capacity);
    pool.truncate(count);
    while pool.len() < count {
        pool.push(touched(capacity));
    }
}

/// A buffer of `capacity` bytes whose every byte has been written once, as
/// fabtests' tools `memset` theirs (with a non-zero byte, so the compiler
/// cannot drop the writes as redundant after `calloc`). A large `Buffer::new` comes from
/// `calloc`, whose fresh pages are the kernel's shared zero page until
/// written: a peer that reads such a buffer (shm's `process_vm_readv`)
/// reads one cached page over and over, which made our 1 MiB shm
/// ping-pong look faster than it is.
pub fn touched(capacity: usize) -> Buffer {
    let mut b = Buffer::new(capacity);
    b.as_mut_slice().fill(0x5a);
    b
}

#[cfg(test)]
mod tests;
