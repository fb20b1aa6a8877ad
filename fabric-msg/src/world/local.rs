//! Same-node ranks over shared memory, beside the fabric the world agreed
//! on (what MPI's shared-memory transport and UCX do).
//!
//! Each rank that shares its node with another opens a second loop
//! (`lane.rs`): fabric-msg's own node loop by default, whatever the
//! world's fabric (`shm` included: the rings are faster than libfabric's
//! shm); or, with `FABRIC_MSG_SHM=libfabric`, an event loop on `shm`,
//! where the world's fabric is not `shm` already. It publishes that
//! loop's name in round 2 beside the main one. Ranks `a` and `b` talk over
//! it iff both are on the same node (the host names of round 1, or
//! `FABRIC_MSG_NODE`) and both published the same kind of name: every
//! rank computes the same pairs from the same table. Every rank stays
//! reachable over the main loop too (RMA, atomics and symmetric memory use
//! only that one).
//!
//! A message from a given rank always arrives on one loop, so exact-source
//! receives go to that loop. A receive from any rank is posted on both
//! loops: the first part to complete is handed out, the others are
//! cancelled (`EventLoop::cancel_recv`).
//!
//! On fabric-msg's node loop no part ever takes a message the other part
//! took too: before the node loop gives a message to its part, the main
//! loop's part is cancelled, and the message goes elsewhere if that part
//! had matched one already (`local/claims.rs`; MPICH's CH4 settles its
//! shared-memory and network halves the same way).
//!
//! libfabric's shm matches on its own, so there both parts can match: a
//! message a cancelled part had matched goes to the oldest receive still
//! waiting that matches it, or is kept here for the next receive it
//! matches, before anything is posted. Every receive, from one rank too,
//! is numbered and kept until it completes, so "oldest" is the order the
//! application posted them in. That takes one more rule where a loop
//! completes receives out of the order it matched them in (ofi_rxm's
//! rendezvous): `local/order.rs`. It does not keep one rank's order where
//! a part that names a tag took a message past an earlier one of the same
//! rank that a later receive from any tag then took (docs/world.md).

mod claims;
pub(crate) mod engine;
mod order;

use super::lane::Side;
use super::tags;
use crate::discovery::profile::WireProfile;
use crate::error::Result;
use crate::memory::buffer::Buffer;
use crate::transport::event_loop::idle::{Idler, Pause, WaitClock};
use crate::transport::event_loop::{
    Completion, CompletionError, EndpointId, EventLoop, PostError, RecvOpts, SleepCheck, Token,
};
use crate::transport::node::segment::SegmentName;
use std::collections::{BTreeMap, VecDeque};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// What one rank publishes in round 2: its endpoint on the agreed fabric,
/// and its shared-memory endpoint or its node segment (or why it has
/// none).
pub(crate) type Address = std::result::Result<(Vec<u8>, WireProfile), String>;

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Published {
    pub main: Address,
    /// libfabric's shm (`FABRIC_MSG_SHM=libfabric`).
    pub local: Address,
    /// fabric-msg's node loop.
    pub node: std::result::Result<SegmentName, String>,
    /// It asks for one matching engine (`local/engine.rs`) and can run it.
    #[serde(default)]
    pub one_engine: bool,
}

/// Longest sleep on the node loop's doorbell in one wait's last stage
/// (the World's waits here, the collectives' in `node_collectives.rs`):
/// what a completion on the main loop (a fabric message, a one-sided
/// operation) can wait beyond its arrival where nothing rings the doorbell
/// for it.
pub(super) const SLEEP_SLICE: Duration = Duration::from_millis(1);

/// The longest sleep on the doorbell alone where ranks are reached over
/// the main loop, operations are awaited on both, and a node peer could
/// not take the doorbell's eventfd (else the wait sleeps on both).
const SPANNING_SLICE: Duration = Duration::from_micros(200);

/// Looks at the node loop between two at the main loop where the node
/// loop carries every rank, the main loop has nothing in flight and the
/// wait is still spinning (after a yield or a sleep the main loop is
/// looked at every time).
const MAIN_EVERY: u32 = 64;

/// Top byte of the tokens an any-source pair is posted with; refused for
/// the application's own operations, as the collectives' `0xFE` is.
pub(crate) const PAIR: u64 = 0xFD;

pub(crate) fn is_pair(t: Token) -> bool {
    t.0 >> 56 == PAIR
}

/// Pair numbers: 48 bits, below the top byte, above the half's index.
const ID_MASK: u64 = (1 << 48) - 1;

/// The token of half `h` of pair `id`.
fn half(id: u64, h: u8) -> Token {
    Token((PAIR << 56) | (id << 8) | u64::from(h))
}

/// One receive of the application, in one part on the loop that carries
/// its rank, or in parts on both loops (from any rank).
#[derive(Debug)]
struct Pair {
    user: Token,
    /// What it matches, and the size posted.
    want: (u64, u64),
    capacity: usize,
    /// One half was handed out (or the post failed): the other is left over.
    delivered: bool,
    /// Parts posted: `first..halves`; 0 is on the main loop, the others
    /// on shm.
    first: u8,
    halves: u8,
    /// Halves still in flight (posted, their completion not yet sorted).
    left: u8,
    /// Whether half 0, on the main loop, is among them.
    main_out: bool,
}

/// The same-node loop and what it carries.
#[derive(Debug)]
pub(crate) struct Local {
    pub(crate) side: Side,
    /// World size, and this rank.
    size: u32,
    me: u32,
    /// Every rank's messages come over this loop (the whole world on one
    /// node): a receive from any rank is posted here alone.
    all: bool,
    /// Looks since the main loop was last polled (`poll`).
    main_skipped: u32,
    next_pair: u64,
    /// By number, so oldest first.
    pairs: BTreeMap<u64, Pair>,
    /// Messages a cancelled half had matched first, oldest first.
    unclaimed: VecDeque<Completion>,
    /// Completions of halves held back until an older pair's half on the
    /// same loop is sorted (`local/order.rs`), in arrival order.
    held: Vec<Completion>,
    /// Receives satisfied from `unclaimed`, handed out at the next poll.
    ready: Vec<Completion>,
    spares: Vec<Buffer>,
    batch: Vec<Completion>,
    /// Scratch for the looks of `poll` and `local/claims.rs`.
    more: Vec<Completion>,
    /// Paired receives the node loop asks about (`local/claims.rs`).
    asked: Vec<Token>,
    /// Every application message matched on the node loop, the fabric's
    /// too (`local/engine.rs`), where the World agreed on it.
    engine: Option<engine::Engine>,
    /// How `poll` passes the time between empty looks at both loops: the
    /// World's rule (`transport/event_loop/idle.rs`), yielding where it
    /// would sleep (no one fd serves both loops).
    pub(crate) idle: Idler,
}

impl Local {
    /// What `local_wiring.rs` wires up.
    pub(super) fn new(side: Side, size: u32, me: u32, idle: Idler) -> Local {
        Local {
            all: (0..size).all(|r| side.carries(r)),
            main_skipped: 0,
            side,
            size,
            me,
            next_pair: 0,
            pairs: BTreeMap::new(),
            unclaimed: VecDeque::new(),
            held: Vec::new(),
            ready: Vec::new(),
            spares: Vec::new(),
            batch: Vec::new(),
            more: Vec::new(),
            asked: Vec::new(),
            engine: None,
            idle,
        }
    }

    /// Whether `rank` is reached over the same-node loop.
    pub(crate) fn carries(&self, rank: u32) -> bool {
        self.side.carries(rank)
    }

    /// Whether same-node ranks talk over fabric-msg's node transport (not
    /// libfabric's shm).
    pub(crate) fn is_node(&self) -> bool {
        matches!(self.side, Side::Node(_))
    }

    /// Whether every rank, this one included, is reached over the
    /// same-node loop (the main loop then carries no messages).
    pub(crate) fn carries_all(&self) -> bool {
        self.all
    }

    /// The other ranks reached over the same-node loop, ascending.
    pub(crate) fn ranks(&self) -> Vec<u32> {
        (0..self.size)
            .filter(|&r| r != self.me && self.side.carries(r))
            .collect()
    }

    /// Give a receive matching `want` the oldest left-over message it
    /// matches: its completion comes with the next poll. The buffer back
    /// if none matches.
    pub(crate) fn claim(
        &mut self,
        want: (u64, u64),
        mut buf: Buffer,
        token: Token,
    ) -> std::result::Result<(), Buffer> {
        let Some(i) = self.unclaimed.iter().position(|c| tags::matches(c.tag, want)) else {
            return Err(buf);
        };
        let Some(mut c) = self.unclaimed.remove(i) else {
            return Err(buf);
        };
        let arrived = c.buffer.take();
        if let (Ok(()), Some(b)) = (&c.result, &arrived) {
            let n = b.len();
            if n <= buf.capacity() {
                buf.set_len(n);
                buf.as_mut_slice().copy_from_slice(b.as_slice());
            } else {
                buf.set_len(0);
                c.result = Err(CompletionError::Truncated {
                    message_len: Some(n),
                    buffer_len: buf.capacity(),
                });
            }
        } else {
            buf.set_len(0);
        }
        if let Some(b) = arrived {
            self.give_spare(b);
        }
        c.buffer = Some(buf);
        c.token = token;
        self.ready.push(c);
        Ok(())
    }

    /// The World tag and length of the oldest left-over message that a
    /// receive matching `want` would take (a probe's look here).
    pub(crate) fn peek_kept(&self, want: (u64, u64)) -> Option<(u64, usize)> {
        let c = self.unclaimed.iter().find(|c| tags::matches(c.tag, want))?;
        let len = match (&c.result, &c.buffer) {
            (Ok(()), Some(b)) => b.len(),
            (
                Err(CompletionError::Truncated {
                    message_len: Some(n), ..
                }),
                _,
            ) => *n,
            _ => 0,
        };
        Some((c.tag, len))
    }

    fn give_spare(&mut self, b: Buffer) {
        if self.spares.len() < 64 {
            self.spares.push(b);
        }
    }

    fn spare(&mut self, capacity: usize) -> Buffer {
        match self.spares.iter().position(|b| b.capacity() == capacity) {
            Some(i) => {
                let mut b = self.spares.swap_remove(i);
                b.set_len(capacity);
                b
            }
            None => Buffer::new(capacity),
        }
    }

    /// Post a receive in message class `class` (the communicator's, see
    /// `tags.rs`) from world rank `from` (`None`: any rank) with `tag`
    /// (`None`: any). Every receive is numbered and kept here until it completes,
    /// so a message that a cancelled part took can be given to the oldest
    /// receive still waiting that matches it, in the order the receives
    /// were posted, whichever loop they wait on.
    ///
    /// From one rank: one part, on the loop that carries it. From any
    /// rank: one part on each loop (`main`'s endpoint `main_ep` gets `buf`,
    /// the shm loop buffers of the same size). Where shm matches masked
    /// receives wrongly (before libfabric 1.19: `Profile::tag_mask_defect`)
    /// and the tag is given, the shm side is one exact receive per
    /// same-node rank, so no masked receive is ever posted there.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn recv(
        &mut self,
        main: &mut EventLoop,
        main_ep: EndpointId,
        class: u64,
        from: Option<u32>,
        tag: Option<u32>,
        buf: Buffer,
        token: Token,
    ) -> std::result::Result<(), PostError> {
        let want = tags::matcher(class, from, tag);
        if self.all {
            // One loop carries every rank: no parts to pair, no left-overs
            // to hand out, so the receive is the application's own.
            return self.side.post(class, want, buf, token);
        }
        if self.engine.is_some() && tags::is_user(class) {
            // One engine matches every rank's messages: the receive may
            // have taken an announced message at once, whose data is
            // fetched now.
            self.side.post(class, want, buf, token)?;
            let mut ready = std::mem::take(&mut self.ready);
            self.fetch_matched(main, main_ep, &mut ready);
            self.ready = ready;
            return Ok(());
        }
        let id = self.next_pair;
        self.next_pair = (self.next_pair + 1) & ID_MASK;
        let capacity = buf.capacity();
        let mut waiting = Pair {
            user: token,
            want,
            capacity,
            delivered: false,
            first: 0,
            halves: 1,
            left: 0,
            main_out: false,
        };
        // The shm parts first, on buffers of the loop's own.
        let sides: Vec<(u64, u64)> = match (from, tag) {
            (Some(r), _) if self.carries(r) => {
                waiting.first = 1;
                return match self.side.post(class, want, buf, half(id, 1)) {
                    Ok(()) => {
                        waiting.halves = 2;
                        waiting.left = 1;
                        self.pairs.insert(id, waiting);
                        Ok(())
                    }
                    Err(e) => Err(e),
                };
            }
            (Some(_), _) => Vec::new(),
            (None, _) if self.is_node() => {
                // One part on the node loop, paired with the main loop's
                // (`local/claims.rs`); none there if a message that came
                // before it matches it now.
                let spare = self.spare(capacity);
                match self.side.post_paired(class, want, spare, half(id, 1)) {
                    Ok(now) => {
                        waiting.halves = 2;
                        waiting.left = 1;
                        if now {
                            waiting.first = 1;
                            self.pairs.insert(id, waiting);
                            self.give_spare(buf);
                            return Ok(());
                        }
                    }
                    Err(e) => {
                        if let Some(b) = e.buffer {
                            self.give_spare(b);
                        }
                        return Err(PostError {
                            error: e.error,
                            buffer: Some(buf),
                        });
                    }
                }
                Vec::new()
            }
            (None, Some(_)) if self.side.exact_only() && self.ranks().len() < usize::from(u8::MAX) => self
                .ranks()
                .into_iter()
                .map(|r| tags::matcher(class, Some(r), tag))
                .collect(),
            (None, _) => vec![want],
        };
        let mut failed = None;
        for m in sides {
            let spare = self.spare(capacity);
            if let Err(e) = self.side.post(class, m, spare, half(id, waiting.halves)) {
                if let Some(b) = e.buffer {
                    self.give_spare(b);
                }
                failed = Some(e.error);
                break;
            }
            waiting.halves += 1;
            waiting.left += 1;
        }
        let posted = match failed {
            Some(error) => Err(PostError {
                error,
                buffer: Some(buf),
            }),
            None => {
                let opts = RecvOpts {
                    tag: Some(want),
                    from: None,
                };
                tags::post_recv_in(main, class, main_ep, buf, opts, half(id, 0))
            }
        };
        match posted {
            Ok(()) => {
                waiting.left += 1;
                waiting.main_out = true;
                self.pairs.insert(id, waiting);
                Ok(())
            }
            Err(e) => {
                // The shm parts alone would take messages the caller never
                // sees complete: cancel them; whatever they matched
                // meanwhile is given out as a left-over.
                let halves = waiting.halves;
                if waiting.left > 0 {
                    waiting.delivered = true;
                    self.pairs.insert(id, waiting);
                }
                self.cancel_halves(main, main_ep, id, 1, halves, None);
                Err(e)
            }
        }
    }

    /// Cancel the receive the application posted with `user` (its request
    /// was dropped): every part still posted. Its completion comes as the
    /// first part's, cancelled or with a message; a message it was given
    /// from the left-overs already is in `ready`.
    pub(crate) fn cancel_user(
        &mut self,
        main: &mut EventLoop,
        main_ep: EndpointId,
        user: Token,
    ) -> Result<()> {
        if self.all || self.engine.is_some() {
            return self.side.cancel(user);
        }
        let found = self.pairs.iter().find(|(_, p)| p.user == user && !p.delivered);
        if let Some((&id, p)) = found {
            let (first, halves) = (p.first, p.halves);
            self.cancel_halves(main, main_ep, id, first, halves, None);
        }
        Ok(())
    }

    /// Cancel the parts `first..halves` of receive `id` (0 on the main
    /// loop, the others on shm), except `but`.
    fn cancel_halves(
        &mut self,
        main: &mut EventLoop,
        main_ep: EndpointId,
        id: u64,
        first: u8,
        halves: u8,
        but: Option<u8>,
    ) {
        for h in (first..halves).filter(|&h| Some(h) != but) {
            let r = if h == 0 {
                main.cancel_recv(main_ep, half(id, 0)).map(drop)
            } else {
                self.side.cancel(half(id, h))
            };
            if let Err(e) = r {
                log::warn!("cannot cancel part of a receive: {e}");
            }
        }
    }

    /// Poll both loops (`main` first), for up to `timeout`, in zero-time
    /// looks so neither waits while the other has work. `out` is cleared.
    pub(crate) fn poll(
        &mut self,
        main: &mut EventLoop,
        main_ep: EndpointId,
        out: &mut Vec<Completion>,
        timeout: Option<Duration>,
    ) -> Result<usize> {
        out.clear();
        // The clock is read only once a look has found nothing, never for
        // a zero timeout (the collectives' and requests' looks), and while
        // the wait spins only every `CLOCK_EVERY`th look (`WaitClock`).
        let mut clock = WaitClock::new(timeout);
        loop {
            out.append(&mut self.ready);
            // Where every rank's messages come over the node loop, the main
            // loop carries only this rank's one-sided operations and what
            // its progress thread keeps going: look at it every
            // `MAIN_EVERY` looks unless it has operations in flight.
            self.main_skipped += 1;
            if !self.all || self.main_skipped >= MAIN_EVERY || main.in_flight() > 0 {
                self.main_skipped = 0;
                let mut batch = std::mem::take(&mut self.batch);
                main.poll(&mut batch, Some(Duration::ZERO))?;
                self.batch = batch;
                self.sort(main, main_ep, out);
            }
            if self.all && out.is_empty() {
                // No parts, so nothing to sort: straight into `out`.
                self.side.poll_now(out)?;
            } else {
                let mut batch = std::mem::take(&mut self.batch);
                self.side.poll_now(&mut batch)?;
                self.batch = batch;
                // Messages that wait for an answer about a receive from
                // any rank move once it is given.
                while self.answer_claims(main, main_ep)? {
                    let mut more = std::mem::take(&mut self.more);
                    self.side.poll_now(&mut more)?;
                    self.batch.append(&mut more);
                    self.more = more;
                }
                self.sort(main, main_ep, out);
            }
            if !out.is_empty() {
                self.idle.busy();
                return Ok(out.len());
            }
            if let Some(t) = timeout {
                if t.is_zero() || clock.look().is_some_and(|now| clock.passed(now)) {
                    return Ok(0);
                }
            }
            match self.idle.next() {
                Pause::Spin => std::hint::spin_loop(),
                pause => {
                    clock.paused();
                    if pause == Pause::Yield {
                        std::thread::yield_now();
                    } else {
                        let left = clock.left(Instant::now()).unwrap_or(SLEEP_SLICE);
                        self.sleep(main, left.min(SLEEP_SLICE));
                    }
                    // A yield or a sleep may have lasted long: look at the
                    // main loop next (emulated atomics for peers wait for
                    // this rank's poll of it).
                    self.main_skipped = MAIN_EVERY;
                }
            }
        }
    }

    /// A wait's sleep, for at most `slice`, on what can end it: the main
    /// loop's wait fd where nothing is awaited on the node loop; that fd
    /// and the node doorbell at once where something is, and every node
    /// peer took the doorbell's eventfd; else the doorbell alone, which
    /// fabric traffic does not ring (so never while the main loop says a
    /// completion may be pending, and for at most [`SPANNING_SLICE`] where
    /// ranks off this node talk over the main loop). docs/onnode.md,
    /// "Which of the two a World's wait sleeps on", has what each cost.
    fn sleep(&mut self, main: &mut EventLoop, slice: Duration) {
        let fd = main.wait_fd().map(|fd| fd.as_raw_fd());
        match (main.prepare_sleep(), fd) {
            (SleepCheck::PollFirst, Some(_)) => {
                // The provider holds work only a look drives (a connection
                // being set up): look again after giving the core away.
                std::thread::yield_now();
                return;
            }
            (SleepCheck::Sleep(at_most), Some(fd)) => {
                let slice = at_most.map_or(slice, |t| t.min(slice));
                if !self.side.awaits() {
                    main.sleep_on_fd(slice);
                    return;
                }
                if self.side.sleep_beside(fd, slice) {
                    return;
                }
            }
            _ => {}
        }
        let cap = if self.all { SLEEP_SLICE } else { SPANNING_SLICE };
        self.side.sleep(slice.min(cap));
    }

    /// Look at the main loop at the next poll, whatever the count since
    /// the last look.
    pub(crate) fn look_at_main_next(&mut self) {
        self.main_skipped = MAIN_EVERY;
    }

    /// Drop what is kept for receives that will never come (at the end).
    pub(crate) fn forget(&mut self) {
        self.unclaimed.clear();
        self.held.clear();
        self.ready.clear();
    }
}
