//! Non-blocking collectives queued in the node's slots, the World's and
//! its communicators', as plain parts: each call with its data and where
//! its result goes, and what one step of it does in the slots
//! (`on_node.rs`). The World's side, when calls are posted and finished,
//! is `world/node_requests.rs`.

use super::engine::Engine;
use super::io::Io;
use super::on_node::{fold_in_rank_order, Call, Differs, Kind, NodeColl};
use super::ops::{bytes_of, Element, Reduction};
use super::plan::Plan;
use super::queued_copy::{self, Copying, Moved};
use super::run::Outcome;
use super::scope::Scope;
use crate::error::Error;
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;

/// Calls queued in one set of slots, oldest first.
pub(crate) type Queue = VecDeque<Box<dyn SlotRequest>>;

/// The queued calls: the World's in its own slots, and each
/// communicator's with slots of its own in those.
#[derive(Default)]
pub(crate) struct SlotRequests {
    pub(crate) queue: Queue,
    /// One entry per communicator with calls queued, dropped once empty.
    pub(crate) comms: Vec<CommRequests>,
}

/// A communicator's queued calls, with its slots and its scope: they
/// keep the communicator's context taken until its calls are finished,
/// even after its handle is dropped.
pub(crate) struct CommRequests {
    pub(crate) node: Arc<Mutex<NodeColl>>,
    pub(crate) scope: Scope,
    pub(crate) queue: Queue,
}

impl std::fmt::Debug for SlotRequests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotRequests")
            .field("queued", &self.len())
            .finish()
    }
}

impl SlotRequests {
    /// Whether the call the engine numbered `id` is still queued.
    pub(crate) fn holds(&self, id: u32) -> bool {
        self.queues().any(|q| q.iter().any(|r| r.id() == id))
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty() && self.comms.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.queues().map(|q| q.len()).sum()
    }

    /// Whether every queue's next call waits for data a chain's step on
    /// the fabric hands over (`Queued::after`), so nothing a peer writes
    /// in the slots moves it.
    pub(crate) fn waits_elsewhere(&self) -> bool {
        let mut fronts = self.queues().filter_map(|q| q.front()).peekable();
        fronts.peek().is_some() && fronts.all(|f| !f.posted() && !f.ready())
    }

    /// Whether the communicator with slots `node` has calls queued.
    pub(crate) fn holds_comm(&self, node: &Arc<Mutex<NodeColl>>) -> bool {
        self.comms.iter().any(|c| Arc::ptr_eq(&c.node, node))
    }

    /// Queue `call` in the slots `node` (`None`: the World's), of the
    /// communicator `scope`.
    pub(crate) fn push(
        &mut self,
        node: Option<Arc<Mutex<NodeColl>>>,
        scope: Scope,
        call: Box<dyn SlotRequest>,
    ) {
        let Some(node) = node else {
            return self.queue.push_back(call);
        };
        match self.comms.iter_mut().find(|c| Arc::ptr_eq(&c.node, &node)) {
            Some(c) => c.queue.push_back(call),
            None => self.comms.push(CommRequests {
                node,
                scope,
                queue: VecDeque::from([call]),
            }),
        }
    }

    fn queues(&self) -> impl Iterator<Item = &Queue> {
        std::iter::once(&self.queue).chain(self.comms.iter().map(|c| &c.queue))
    }
}

/// Which headers of its slot a queued call reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reads {
    /// Those its kind needs (a broadcast's other ranks the root's alone,
    /// its root and a reduce's other ranks nobody's: `NodeColl::only`).
    ByKind,
    /// Every rank's: a call that goes on as messages, so that no rank
    /// sends to one that disagreed.
    All,
    /// Nobody's: a refusal, posted for the others to read.
    Nobody,
}

/// One queued call with its element type erased.
pub(crate) trait SlotRequest: Send {
    fn id(&self) -> u32;
    fn k(&self) -> u64;
    fn call(&self) -> &Call;
    fn posted(&self) -> bool;
    /// Whether it may be posted: a call whose data comes from the step
    /// before it in a chain of two levels (`world/two_level_requests.rs`)
    /// waits for that step; any other is ready at once.
    fn ready(&self) -> bool;
    /// Whether every header it reads came and agreed (it is past
    /// `gather`, in its own steps).
    fn gathered(&self) -> bool;
    fn reads(&self) -> Reads;
    /// Post this rank's part of slot `k` (room was checked).
    fn post(&mut self, nc: &mut NodeColl);
    /// Every header it reads is in and agrees: take the call as far as it
    /// goes now (the result from the slots, the message schedule started
    /// in `scope`'s communicator, or one copy's steps). It says `done`
    /// itself (`NodeColl::finish`) before it is over.
    fn step(&mut self, nc: &mut NodeColl, scope: &Scope, engine: &mut Engine, io: &mut Io<'_>) -> Step;
    /// Whether what it waits for may have come (its doorbell is armed).
    fn came(&self, nc: &NodeColl) -> bool;
    fn fail(&mut self, e: Error);
}

/// What a queued call's step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// Nothing: it waits for other ranks, at the head of its queue.
    Waits,
    /// It moved, and still waits, at the head (a call by one copy).
    Moved,
    /// It took the one copy: count it (`WorldStats`), and step again.
    Copies,
    /// It is over, its `done` said: out of the queue.
    Over,
}

/// How a queued call goes on once its headers agree.
// A queued call is boxed already (`Box<dyn SlotRequest>`): boxing the plan
// too would allocate once more per call larger than a slot.
#[allow(clippy::large_enum_variant)]
enum Then {
    /// Its data is in the slots: the result is read there.
    InPlace,
    /// Its data is larger than a slot: its header offers the vector's
    /// address, and once every header is in, it goes by one copy where
    /// every rank's may (`queued_copy.rs`), as a blocking call does; else
    /// on as this message schedule (in world ranks) under its own number
    /// (its slot call sends no message), as a blocking call's does
    /// (`OnNode::Messages`).
    Larger { plan: Plan, seq: u32 },
    /// By one copy, at this step.
    Copy(Copying),
    /// Its arguments failed their check on this rank: the refusal is
    /// posted, so the others fail with the reason and the slots stay in
    /// step.
    Refused(String),
}

pub(crate) struct Queued<T: Element> {
    id: u32,
    k: u64,
    call: Call,
    posted: bool,
    gathered: bool,
    then: Then,
    /// Where larger than a slot, the memory it offers the others to read:
    /// never grown or replaced while queued, so its address stays.
    data: Vec<T>,
    reduction: Option<Reduction<T>>,
    me: u32,
    outcome: Outcome<T>,
    /// Where its data comes from the step before it in a chain of two
    /// levels: that step's result is handed over here (`Err`: this call
    /// posts a refusal with its reason instead), and until it is, the call
    /// is not posted.
    after: Option<Outcome<T>>,
}

impl<T: Element> Queued<T> {
    /// Call `call` (numbered `id` by the engine, slot number `k`) over
    /// `data`, on rank `me`; its result goes to `outcome`. `messages`: the
    /// schedule and number it goes on with where its data is larger than
    /// a slot; `refused`: why its arguments failed their check.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        (id, k): (u32, u64),
        call: Call,
        data: Vec<T>,
        reduction: Option<Reduction<T>>,
        me: u32,
        outcome: Outcome<T>,
        messages: Option<(Plan, u32)>,
        refused: Option<String>,
    ) -> Queued<T> {
        let then = match (refused, messages) {
            (Some(why), _) => Then::Refused(why),
            (None, Some((plan, seq))) => Then::Larger { plan, seq },
            (None, None) => Then::InPlace,
        };
        Queued {
            id,
            k,
            call,
            posted: false,
            gathered: false,
            then,
            data,
            reduction,
            me,
            outcome,
            after: None,
        }
    }

    /// The same call, whose data is handed over by `after` once the step
    /// before it is over (`data` is then only its length's placeholder).
    pub(crate) fn after(mut self, after: Outcome<T>) -> Queued<T> {
        self.after = Some(after);
        self
    }
}

impl<T: Element> SlotRequest for Queued<T> {
    fn id(&self) -> u32 {
        self.id
    }

    fn k(&self) -> u64 {
        self.k
    }

    fn call(&self) -> &Call {
        &self.call
    }

    fn posted(&self) -> bool {
        self.posted
    }

    fn ready(&self) -> bool {
        self.after.as_ref().map_or(true, |a| a.lock().is_some())
    }

    fn gathered(&self) -> bool {
        self.gathered
    }

    fn reads(&self) -> Reads {
        match self.then {
            Then::InPlace => Reads::ByKind,
            Then::Larger { .. } | Then::Copy(_) => Reads::All,
            Then::Refused(_) => Reads::Nobody,
        }
    }

    fn post(&mut self, nc: &mut NodeColl) {
        // The step before handed over its data, or its failure, which this
        // call passes on to the others as a refusal.
        if let Some(handed) = self.after.take().and_then(|a| a.lock().take()) {
            match handed {
                Ok(data) => self.data = data,
                Err(e) => self.then = Then::Refused(e.to_string()),
            }
        }
        self.posted = true;
        let carries = match self.call.kind {
            Kind::Allreduce | Kind::Reduce => true,
            Kind::Broadcast => self.me == self.call.root,
            Kind::Barrier | Kind::Refused => false,
        };
        match &self.then {
            Then::InPlace if carries => nc.post(self.k, &self.call, bytes_of(&self.data), 0),
            Then::InPlace => nc.post(self.k, &self.call, &[], 0),
            // The header alone (the length every rank checks), with the
            // vector's address for one copy.
            Then::Larger { .. } | Then::Copy(_) => {
                nc.post(self.k, &self.call, &[], self.data.as_ptr() as u64)
            }
            Then::Refused(why) => nc.refuse(self.k, &self.call, why),
        }
    }

    fn step(&mut self, nc: &mut NodeColl, scope: &Scope, engine: &mut Engine, io: &mut Io<'_>) -> Step {
        self.gathered = true;
        let (k, call, me) = (self.k, self.call, self.me);
        if let Then::Copy(state) = &mut self.then {
            let mut moved = queued_copy::step(state, nc, (k, &call), &mut self.data, self.reduction.as_ref());
            // A lent vector waits for every rank's `done`, which a lost
            // rank never gives: the loss is said as soon as it is seen.
            if let Copying::Lending(Err(d)) = state {
                say_lost(d, scope, io);
            }
            if let Moved::Over(Err(d)) = &mut moved {
                say_lost(d, scope, io);
            }
            let read = match moved {
                Moved::Not => return Step::Waits,
                Moved::On => return Step::Moved,
                Moved::Over(read) => read,
            };
            let data = std::mem::take(&mut self.data);
            let result = read.map(|()| data).map_err(|d| Error::Collective {
                operation: call.what,
                seq: call.seq,
                rank: d.rank,
                message: d.message,
            });
            *self.outcome.lock() = Some(result);
            return Step::Over;
        }
        if matches!(self.then, Then::Larger { .. }) && nc.single_copy(k) {
            self.then = Then::Copy(Copying::Start);
            return Step::Copies;
        }
        let mut data = std::mem::take(&mut self.data);
        match std::mem::replace(&mut self.then, Then::InPlace) {
            Then::Refused(why) => self.fail(Error::Usage(format!("{}: {why}", call.what))),
            Then::Larger { plan, seq } => match plan.work(data) {
                Ok(work) => {
                    let run = (plan.sched, work, self.reduction.take());
                    let outcome = Some(self.outcome.clone());
                    engine.start_as(io, scope, call.what, run, (self.id, seq), outcome);
                }
                Err(m) => self.fail(Error::Usage(format!("{}: {m}", call.what))),
            },
            // (A call by one copy went its own way above.)
            Then::InPlace | Then::Copy(_) => {
                match (call.kind, &self.reduction) {
                    (Kind::Allreduce, Some(r)) => fold_in_rank_order(nc, k, &mut data, r, &mut Vec::new()),
                    (Kind::Reduce, Some(r)) if me == call.root => {
                        fold_in_rank_order(nc, k, &mut data, r, &mut Vec::new())
                    }
                    // As the message schedule gives it: the result on the
                    // root, nothing elsewhere (the vector's memory kept,
                    // for a chain of two levels to hand on).
                    (Kind::Reduce, _) => data.clear(),
                    (Kind::Broadcast, _) if me != call.root => {
                        T::read(nc.data(k, call.root, call.bytes()), &mut data)
                    }
                    _ => {}
                }
                *self.outcome.lock() = Some(Ok(data));
            }
        }
        nc.finish(k);
        Step::Over
    }

    fn came(&self, nc: &NodeColl) -> bool {
        match (&self.then, self.posted, self.gathered) {
            // What it waits for comes over the fabric, not the doorbell.
            (_, false, _) if !self.ready() => false,
            (_, false, _) => nc.room_came(self.k),
            (Then::Copy(state), _, true) => queued_copy::came(state, nc, (self.k, &self.call)),
            _ => nc.header_came(self.k),
        }
    }

    fn fail(&mut self, e: Error) {
        *self.outcome.lock() = Some(Err(e));
    }
}

/// Where a read found `d.rank`'s process gone, record that the World has
/// lost it (as its lifeline will soon say too), once.
fn say_lost(d: &mut Differs, scope: &Scope, io: &Io<'_>) {
    if d.gone {
        io.live.lose(
            scope.world_rank(d.rank),
            format!("its process is gone ({})", d.message),
        );
        d.gone = false;
    }
}
