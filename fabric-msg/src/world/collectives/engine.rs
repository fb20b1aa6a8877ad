//! Runs schedules on the World's endpoints, through its event loops (the
//! main one, and the same-node shm one where there is one: `Io::lane`).
//!
//! Every collective is a [`Run`]: its schedule, its working array and where
//! it stands. Runs live in the [`Engine`] (one per World) until they finish,
//! so several may be in flight, and they progress whenever the World polls:
//! in `World::wait`, `World::test` and the application's own `World::poll`.
//! Operations of a run carry tokens from a reserved range ([`is_reserved`]):
//! the engine takes their completions before the application sees any, and
//! keeps the application's completions that arrive during a wait for its
//! next `World::poll`.
//!
//! Failure: a lost rank fails every run with `Error::RankLost` (the World's
//! liveness, one atomic load per poll). A failure only this rank can see
//! (a message of the wrong length, a failed receive, a bad argument) fails
//! the run here and sends a notice to every other rank, whose run of the
//! same collective then fails too, naming this rank, instead of waiting for
//! messages that will never come. Every rank keeps one receive posted for
//! notices.
//!
//! Nothing here knows the `World` type: the World hands the engine an [`Io`]
//! of its parts.

use super::io::{decode, forged, is_reserved, Failure, Io, Kind, Shared, NOTICE_MAX};
use super::notice::{decode_notice, notice_lane, Notices};
use super::on_node::{another_collective, with_article};
use super::ops::{Element, Reduction};
use super::probe::Probes;
use super::run::{Outcome, Progress, Run, Spare};
use super::schedule::Schedule;
use super::scope::Scope;
use crate::error::{Error, Result};
use crate::memory::buffer::Buffer;
use crate::transport::event_loop::idle::{Idler, Pause};
use crate::transport::event_loop::Completion;
use crate::transport::liveness::LOSS_GRACE;
use crate::world::tags;
use std::time::Duration;

/// Every collective of one World: its numbering, the runs in flight, the
/// finished ones and the application's completions kept during waits.
pub(crate) struct Engine {
    /// The next run's engine-wide number (its tokens').
    next_id: u32,
    /// The next collective's number in each context (its tags'): every
    /// member of a communicator numbers its collectives alike.
    next_seq: Vec<u32>,
    runs: Vec<Box<dyn Progress>>,
    sh: Shared,
    stash: Vec<Completion>,
    batch: Vec<Completion>,
    /// Notices heard and to post (`notice.rs`).
    notes: Notices,
    /// How a wait passes the time between empty looks: the rule every
    /// wait of the World follows (`transport/event_loop/idle.rs`).
    idle: Idler,
    /// Runs that failed while the provider could still touch their working
    /// arrays (see `Engine::retire`).
    orphans: Vec<Box<dyn Progress>>,
    /// Containers of finished runs, for the next runs (at most `SPARES`).
    spares: Vec<Spare>,
    /// Runs that may yet probe the ranks they wait for (`probe.rs`).
    probes: Probes,
    /// The collective this rank runs in the node's slots, outside the
    /// engine (`World::run_on_node`): its communicator and number. Notices
    /// about it are kept for that call's wait (`slot_call_heard`).
    in_slots: Option<(Scope, u32)>,
    /// Non-blocking calls queued in the slots (`world/node_requests.rs`),
    /// the World's and its communicators': for each context with some,
    /// the numbers of the oldest and the newest. Notices about any number
    /// between are kept for `slot_request_heard`: a probe is sent once
    /// per run.
    slot_queue: Vec<(u8, u32, u32)>,
}

/// Finished runs' containers kept: as many as runs usually in flight at once.
const SPARES: usize = 8;

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("next_id", &self.next_id)
            .field("runs", &self.runs.len())
            .field("kept_completions", &self.stash.len())
            .field("idle", &self.idle)
            .finish()
    }
}

/// The rank a loss explains a failure with, waiting up to `grace`.
fn lost(io: &Io<'_>, grace: Duration) -> Option<Error> {
    io.live.first_lost_within(grace).map(|rank| Error::RankLost {
        rank,
        why: io.live.why(rank).unwrap_or_default(),
    })
}

impl Engine {
    pub(crate) fn new(idle: Idler) -> Engine {
        Engine {
            next_id: 0,
            next_seq: vec![0; tags::MAX_CONTEXTS as usize],
            runs: Vec::new(),
            sh: Shared::default(),
            stash: Vec::new(),
            batch: Vec::new(),
            notes: Notices::default(),
            idle,
            orphans: Vec::new(),
            spares: Vec::new(),
            probes: Probes::default(),
            in_slots: None,
            slot_queue: Vec::new(),
        }
    }

    /// Post the receives for other ranks' notices (`Notices::listen`).
    pub(crate) fn listen(&mut self, io: &mut Io<'_>) -> Result<()> {
        self.notes.listen(io)
    }

    /// The next collective's number in `scope`'s context.
    pub(crate) fn number(&mut self, scope: &Scope) -> u32 {
        let next = &mut self.next_seq[usize::from(scope.ctx)];
        let seq = *next;
        *next = next.wrapping_add(1);
        seq
    }

    /// [`Engine::number`] for a collective started (or refused) later under it.
    pub(crate) fn reserve(&mut self, scope: &Scope) -> u32 {
        let seq = self.number(scope) & tags::SEQ_MASK;
        self.notes.reserved.push((scope.ctx, seq)); // its notices are kept
        seq
    }

    /// A new communicator on context `ctx` (every member calls this at
    /// once): it numbers its collectives from 0, and notices kept of an
    /// earlier communicator on the same context are dropped.
    pub(crate) fn open_context(&mut self, ctx: u8) {
        self.next_seq[usize::from(ctx)] = 0;
        self.notes.heard.retain(|n| n.ctx != ctx);
        self.notes.reserved.retain(|r| r.0 != ctx);
    }

    /// Start a run of `sched` (in `scope`'s world ranks); returns its
    /// engine-wide id, its number in its communicator and where its result
    /// will be.
    pub(crate) fn start<T: Element>(
        &mut self,
        io: &mut Io<'_>,
        scope: &Scope,
        what: &'static str,
        sched: Schedule,
        work: Vec<T>,
        reduction: Option<Reduction<T>>,
    ) -> (u32, u32, Outcome<T>) {
        let seq = self.number(scope);
        let id = self.new_id();
        let outcome = self.start_as(io, scope, what, (sched, work, reduction), (id, seq), None);
        (id, seq, outcome)
    }

    /// [`Engine::start`] under an id and a number taken before, its
    /// result to `outcome` if given (a non-blocking call whose headers
    /// agreed in the node's slots, `world/node_requests.rs`).
    pub(crate) fn start_as<T: Element>(
        &mut self,
        io: &mut Io<'_>,
        scope: &Scope,
        what: &'static str,
        (sched, work, reduction): (Schedule, Vec<T>, Option<Reduction<T>>),
        (id, seq): (u32, u32),
        outcome: Option<Outcome<T>>,
    ) -> Outcome<T> {
        self.notes.unreserve(scope.ctx, seq);
        let spare = self.spares.pop().unwrap_or_default();
        let mut run = Run::new(what, (id, seq, scope.clone()), sched, work, reduction, spare);
        if let Some(o) = outcome {
            run.outcome = o;
        }
        let outcome = run.outcome.clone();
        self.runs.push(Box::new(run));
        self.probes.started(id);
        if let Err(e) = self.notes.listen(io) {
            log::warn!("cannot listen for other ranks' collective failures: {e}");
        }
        self.progress(io);
        outcome
    }

    /// A number no run has, for a request the World finishes itself (a
    /// non-blocking call in the node's slots, `world/node_requests.rs`).
    pub(crate) fn new_id(&mut self) -> u32 {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1);
        id
    }

    /// A collective refused for bad arguments: it still takes its number
    /// (or has `seq`, taken before), and the other ranks hear of it, so no
    /// rank waits for this one.
    pub(crate) fn refuse(
        &mut self,
        io: &mut Io<'_>,
        scope: &Scope,
        (what, message): (&'static str, String),
        seq: Option<u32>,
    ) -> Error {
        let seq = seq.unwrap_or_else(|| self.number(scope));
        self.notes.unreserve(scope.ctx, seq);
        self.notes.notify(io, &mut self.sh, scope, seq, &message);
        self.progress(io);
        let rank = io.rank;
        Error::Usage(format!("{what} (collective #{seq}) on rank {rank}: {message}"))
    }

    /// End run `i` with `failure`: a lost rank if liveness names one
    /// (within the failure's grace), otherwise a failure seen here, which
    /// every other rank is told of.
    fn fail(&mut self, io: &mut Io<'_>, i: usize, failure: Failure) {
        let run = self.runs.remove(i);
        let (seq, what, scope) = (run.seq(), run.what(), run.scope().clone());
        let error = match lost(io, failure.grace) {
            Some(e) => e,
            None => {
                self.notes.notify(io, &mut self.sh, &scope, seq, &failure.message);
                Error::Collective {
                    operation: what,
                    seq: seq & tags::SEQ_MASK,
                    rank: io.rank,
                    message: failure.message,
                }
            }
        };
        run.fail(error);
        self.retire(run);
    }

    /// Drop a run that ended in failure, unless the provider may still
    /// read or write its working array: then keep it (and its memory) until
    /// its last operation completes or the engine is dropped, which is after
    /// the World's event loop closed its endpoint.
    fn retire(&mut self, run: Box<dyn Progress>) {
        if run.busy() {
            self.orphans.push(run);
        }
    }

    /// Move runs on: losses, notices, finished rounds, posts that found the
    /// provider's queue full. Posts made here fail at once on a full queue
    /// instead of waiting in the loop for room (`Io::fail_fast`): what could
    /// not be posted is kept and tried again at the next progress, where
    /// losses and other ranks' notices are seen.
    pub(crate) fn progress(&mut self, io: &mut Io<'_>) {
        let saved = io.fail_fast(true);
        self.progress_runs(io);
        let (notes, sh) = (&mut self.notes, &mut self.sh);
        self.probes.send_due(&self.runs, |ctx, seq, peers, what| {
            notes.send(io, sh, ctx, seq, peers, true, what)
        });
        self.notes.flush(io, &mut self.sh);
        io.fail_fast(saved);
    }

    fn progress_runs(&mut self, io: &mut Io<'_>) {
        if !self.runs.is_empty() {
            if let Some(e) = lost(io, Duration::ZERO) {
                for run in std::mem::take(&mut self.runs) {
                    let e = match &e {
                        Error::RankLost { rank, why } => Error::RankLost {
                            rank: *rank,
                            why: why.clone(),
                        },
                        _ => Error::Usage(e.to_string()),
                    };
                    run.fail(e);
                    self.retire(run);
                }
            }
        }
        self.apply_notices(io);
        let mut i = 0;
        while i < self.runs.len() {
            match self.runs[i].advance(io, &mut self.sh) {
                Ok(false) => i += 1,
                Ok(true) => {
                    let mut run = self.runs.remove(i);
                    if self.spares.len() < SPARES {
                        self.spares.push(run.spare());
                    }
                    run.succeed();
                }
                Err(f) => self.fail(io, i, f),
            }
        }
    }

    /// Fail the runs other ranks said failed, and those another rank runs
    /// under another name (its probe says so: `probe.rs`); keep notices of
    /// collectives this rank has not reached; forget those it finished.
    fn apply_notices(&mut self, io: &mut Io<'_>) {
        if self.notes.heard.is_empty() {
            return;
        }
        for n in std::mem::take(&mut self.notes.heard) {
            let this = self
                .runs
                .iter()
                .position(|r| r.scope().ctx == n.ctx && r.seq() & tags::SEQ_MASK == n.seq);
            if let (Some(i), true) = (this, n.probe) {
                let what = self.runs[i].what();
                if n.text != what {
                    let message = another_collective(n.rank, &n.text, n.seq, what, n.seq);
                    self.fail(io, i, Failure::seen(message));
                }
            } else if let Some(i) = this {
                let run = self.runs.remove(i);
                let error = Error::Collective {
                    operation: run.what(),
                    seq: n.seq,
                    rank: n.rank,
                    message: n.text,
                };
                run.fail(error);
                self.retire(run);
            } else if n.seq.wrapping_sub(self.next_seq[usize::from(n.ctx)]) & tags::SEQ_MASK
                < (tags::SEQ_MASK >> 1)
                || self.notes.for_reserved(&n)
                || self
                    .in_slots
                    .as_ref()
                    .is_some_and(|(s, seq)| (s.ctx, *seq) == (n.ctx, n.seq))
                || self.slot_queue.iter().any(|&(ctx, lo, hi)| {
                    n.ctx == ctx
                        && n.seq.wrapping_sub(lo) & tags::SEQ_MASK <= hi.wrapping_sub(lo) & tags::SEQ_MASK
                })
            {
                self.notes.heard.push(n);
            }
        }
    }

    /// Take one of the collectives' completions; `false` if it is the
    /// application's.
    fn absorb(&mut self, io: &mut Io<'_>, c: Completion) -> Option<Completion> {
        if !is_reserved(c.token) {
            return Some(c);
        }
        let (kind, id, index) = decode(c.token);
        let run = self.runs.iter().position(|r| r.id() & tags::SEQ_MASK == id);
        let same = |r: &dyn Progress| r.id() & tags::SEQ_MASK == id;
        if run.is_none() && (kind == Kind::Recv as u64 || kind == Kind::BorrowedSend as u64) {
            // A run that failed already: an orphan's operation may release
            // its memory; otherwise the completion is of no use.
            if let Some(o) = self.orphans.iter_mut().find(|o| same(o.as_ref())) {
                if kind == Kind::Recv as u64 {
                    o.arrived(index, c, &mut self.sh).ok();
                } else {
                    o.borrowed_sent(index);
                }
                self.orphans.retain(|o| o.busy());
            } else {
                self.sh.pool.give_opt(c.buffer);
            }
            return None;
        }
        match kind {
            k if k == Kind::Recv as u64 => {
                let mut c = c;
                if c.result.is_ok() && io.forged(&c) {
                    // Dropped: the run fails on it, naming it, and tells the others.
                    c.result = Err(forged(tags::source_of(c.tag)));
                }
                if let Some(i) = run {
                    if let Err(f) = self.runs[i].arrived(index, c, &mut self.sh) {
                        self.fail(io, i, f);
                    }
                }
            }
            k if k == Kind::BorrowedSend as u64 => {
                if let Some(i) = run {
                    self.runs[i].borrowed_sent(index);
                    if let Err(e) = &c.result {
                        let failure = Failure {
                            message: format!("a send failed: {e}"),
                            grace: LOSS_GRACE,
                        };
                        self.fail(io, i, failure);
                    }
                }
            }
            k if k == Kind::NoticeRecv as u64 => {
                if c.result.is_ok() && io.forged(&c) {
                    log::warn!(
                        "a failure notice that claims to come from rank {} came from another address: dropped",
                        tags::source_of(c.tag)
                    );
                } else if c.result.is_ok() {
                    let rank = tags::source_of(c.tag);
                    match c.buffer.as_ref().and_then(|b| decode_notice(b.as_slice(), rank)) {
                        Some(n) => self.notes.heard.push(n),
                        None => log::warn!(
                            "a failure notice from rank {rank} of {} bytes is malformed (a context below {} \
                             and a collective number first): dropped",
                            c.buffer.as_ref().map_or(0, |b| b.len()),
                            tags::MAX_CONTEXTS
                        ),
                    }
                }
                self.notes.posted = false;
                let buf = c.buffer.unwrap_or_else(|| Buffer::new(NOTICE_MAX));
                let (lane, from) = notice_lane(index);
                if let Err(e) = self.notes.post_recv(io, buf, lane, from) {
                    log::warn!("cannot listen for other ranks' collective failures: {e}");
                }
            }
            _ => {
                let failed = c.result.as_ref().err().map(|e| e.to_string());
                self.sh.pool.give_opt(c.buffer);
                if let (Some(e), Some(i), true) = (failed, run, kind == Kind::Send as u64) {
                    let failure = Failure {
                        message: format!("a send failed: {e}"),
                        grace: LOSS_GRACE,
                    };
                    self.fail(io, i, failure);
                }
            }
        }
        None
    }

    /// Whether a poll that brought none of the collectives' completions
    /// leaves something to do: a rank was lost (every run fails), a notice
    /// is to be posted or applied, or a run has posts the provider refused.
    /// Otherwise no run can move before one of its operations completes,
    /// and a wait skips the progress pass between empty polls (the pass
    /// costs as much as an empty poll on shm).
    fn pending_work(&mut self, io: &Io<'_>) -> bool {
        !self.notes.out.is_empty()
            || !self.notes.heard.is_empty()
            || (!self.runs.is_empty()
                && (io.live.first_lost().is_some()
                    || self.runs.iter().any(|r| r.stalled())
                    || self.probes.due(self.idle.sleeping())))
    }

    /// Take the collectives' completions out of `out` (the application's
    /// stay, in order) and move the runs on.
    pub(crate) fn filter(&mut self, io: &mut Io<'_>, out: &mut Vec<Completion>) {
        if !out.iter().any(|c| is_reserved(c.token)) {
            if self.pending_work(io) {
                self.progress(io);
            }
            return;
        }
        let mut keep = Vec::with_capacity(out.len());
        out.drain(..).for_each(|c| keep.extend(self.absorb(io, c)));
        *out = keep;
        self.progress(io);
    }

    /// One look at the completion queue (or, with `may_sleep`, one wait,
    /// once idling has gone on long enough to sleep and no refused post
    /// waits to be posted again); the application's completions are kept
    /// for its next poll. `Ok(true)` if anything completed. A test (of a
    /// request, or by a future) never sleeps: it passes `may_sleep` false,
    /// whatever state an earlier wait left the idling in.
    pub(crate) fn poll_once(&mut self, io: &mut Io<'_>, may_sleep: bool) -> Result<bool> {
        let timeout = if may_sleep && self.idle.sleeping() && !self.pending_work(io) {
            Duration::from_millis(20)
        } else {
            Duration::ZERO
        };
        let mut batch = std::mem::take(&mut self.batch);
        let polled = io.poll(&mut batch, Some(timeout));
        let n = batch.len();
        if self.stash.is_empty() && !batch.iter().any(|c| is_reserved(c.token)) {
            // The application's alone: kept whole, not moved one by one.
            std::mem::swap(&mut self.stash, &mut batch);
        }
        for c in batch.drain(..) {
            if let Some(app) = self.absorb(io, c) {
                self.stash.push(app);
            }
        }
        self.batch = batch;
        if n > 0 || self.pending_work(io) {
            self.progress(io);
        }
        if n > 0 {
            self.idle.busy();
        }
        match polled {
            Ok(_) => Ok(n > 0),
            Err(e) => Err(lost(io, Duration::ZERO).unwrap_or(e)),
        }
    }

    /// Pass the time between polls that found nothing: spin, then yield,
    /// and once that has gone on long enough nothing here (the next
    /// `poll_once` sleeps in the loop's own wait).
    pub(crate) fn idle(&mut self) {
        match self.idle.next() {
            Pause::Spin => std::hint::spin_loop(),
            Pause::Yield => std::thread::yield_now(),
            Pause::Block => {}
        }
    }

    /// The World's waiting rule, for a wait of its own.
    pub(crate) fn idler(&self) -> Idler {
        self.idle
    }

    /// This rank runs collective `seq` of `scope` in the node's slots (until
    /// `None`): notices about it wait for `slot_call_heard`.
    pub(crate) fn in_slots(&mut self, call: Option<(&Scope, u32)>) {
        self.in_slots = call.map(|(scope, seq)| (scope.clone(), seq & tags::SEQ_MASK));
    }

    /// What another rank said of the collective this rank runs in the slots
    /// (`what`): the rank and why the call fails. A failure notice is that
    /// rank's failure. A probe means that rank runs this number as a message
    /// schedule (the non-blocking or persistent form, or another
    /// collective), which waits for messages no rank in the slots sends: the
    /// call fails here, and every other rank is told.
    pub(crate) fn slot_call_heard(&mut self, io: &mut Io<'_>, what: &str) -> Option<(u32, String)> {
        let (scope, seq) = self.in_slots.clone()?;
        self.heard_of(io, &scope, seq, what)
    }

    /// The non-blocking calls queued in the slots of `scope`'s
    /// communicator run from number `lo` to `hi` (`None`: none is queued).
    pub(crate) fn slot_queue(&mut self, scope: &Scope, numbers: Option<(u32, u32)>) {
        let ctx = scope.ctx;
        self.slot_queue.retain(|&(c, ..)| c != ctx);
        if let Some((lo, hi)) = numbers {
            self.slot_queue
                .push((ctx, lo & tags::SEQ_MASK, hi & tags::SEQ_MASK));
        }
    }

    /// [`Engine::slot_call_heard`] for the non-blocking call `seq` of
    /// `scope`'s communicator in the slots, at the head of its queue.
    pub(crate) fn slot_request_heard(
        &mut self,
        io: &mut Io<'_>,
        scope: &Scope,
        seq: u32,
        what: &str,
    ) -> Option<(u32, String)> {
        self.heard_of(io, scope, seq & tags::SEQ_MASK, what)
    }

    fn heard_of(&mut self, io: &mut Io<'_>, scope: &Scope, seq: u32, what: &str) -> Option<(u32, String)> {
        let ctx = scope.ctx;
        let i = self
            .notes
            .heard
            .iter()
            .position(|n| n.ctx == ctx && n.seq == seq)?;
        let n = self.notes.heard.swap_remove(i);
        if !n.probe {
            return Some((n.rank, n.text));
        }
        let message = format!(
            "rank {} runs collective #{seq} as {} message schedule (a collective without slots) where this \
             rank runs the {what} in the node's slots: every rank must call the same collectives in the same \
             order",
            n.rank,
            with_article(&n.text)
        );
        self.notes.notify(io, &mut self.sh, scope, seq, &message);
        self.progress(io);
        Some((n.rank, message))
    }

    /// Whether run `id` is still in flight.
    pub(crate) fn running(&self, id: u32) -> bool {
        self.runs.iter().any(|r| r.id() == id)
    }

    /// Runs in flight, and failure notices not yet posted.
    pub(crate) fn in_flight(&self) -> usize {
        self.runs.len() + self.notes.out.len()
    }

    /// The completions kept for the application, to take some out of.
    pub(crate) fn kept_mut(&mut self) -> &mut Vec<Completion> {
        &mut self.stash
    }

    /// Those completions, oldest first, appended to `out`.
    pub(crate) fn take_kept(&mut self, out: &mut Vec<Completion>) -> usize {
        let n = self.stash.len();
        out.append(&mut self.stash);
        n
    }
}
