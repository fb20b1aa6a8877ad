//! Non-blocking barrier, allreduce, broadcast and reduce (and the starts
//! of their persistent forms) through the node's collective slots: the
//! World's where every rank is on one node, and a communicator's with
//! slots of its own (`comm_slots.rs`: all its members on this node, as
//! `split_shared` gives). `iallreduce` posts this rank's part at once and
//! the World's turns finish it, so a small non-blocking collective costs
//! what the blocking one does (`node_collectives.rs`, whose protocol this
//! is: `collectives/on_node.rs`), not a message schedule's start and
//! steps.
//!
//! Each set of slots has its own queue (the World's, and one per
//! communicator with calls queued), and every turn of the World moves all
//! of them: a rank waiting on one communicator's call still posts its
//! parts of the others', so calls on different communicators may be
//! started in different orders on different ranks, as MPI allows.
//!
//! - **Order.** Each call takes the next slot number `k` and the next
//!   collective number when it starts, as a blocking one does, so every
//!   rank numbers the same calls alike. Calls are kept in a queue in that
//!   order. A turn of the World posts every queued call it has room for
//!   (in order: a slot is reused only once every rank, this one too, is
//!   done with the call `SLOTS` before), then finishes calls from the head
//!   while every header the head needs is in: checked against this rank's
//!   call, combined, and the slot given back (`done`), which must go in
//!   order.
//! - **Larger than a slot**, a call posts its header alone, with its
//!   vector's address. Once every rank's header agrees it goes by one
//!   copy where every rank may read every other's memory, as the blocking
//!   call does, one step a turn (`collectives/queued_copy.rs`: it stays
//!   the head of its queue until no rank reads its vector any more); else
//!   on as the message schedule of the blocking call under the same
//!   number (`OnNode::Messages`). **Bad arguments** post a refusal and
//!   fail at once. So a call takes one slot and one number on
//!   every rank whatever becomes of it, and the World goes on after a
//!   failed one.
//! - **A blocking slot call** first finishes every call queued in the
//!   same slots (`drain_slot_requests`): its number comes after theirs.
//!   Other communicators' queues are not waited for.
//! - **Mismatches** fail the call as the blocking one fails: another kind,
//!   length, root or reduction in a rank's header; a refusal; a probe from
//!   a rank that runs the same number as a message schedule (a collective
//!   without slots), kept by the engine for any queued number
//!   (`Engine::slot_queue`) and heard once the call is the queue's head
//!   (`Engine::slot_request_heard`). Every later call goes on.
//! - **A lost rank** fails every wait, as for any request (`World::turn`).

use super::collectives::on_node::{Call, NodeColl};
use super::collectives::ops::{Element, Reduction};
use super::collectives::plan::Plan;
use super::collectives::request::Shape;
use super::collectives::run::Outcome;
use super::collectives::scope::Scope;
use super::collectives::slot_queue::{Queue, Queued, Reads, Step};
use super::comm::CommView;
use super::local::SLEEP_SLICE;
use super::request::{Of, Request};
use super::state::World;
use super::tags;
use crate::error::{Error, Result};
use crate::transport::event_loop::idle::Pause;
use crate::transport::node::slots::SLOTS;
use parking_lot::Mutex;
use std::sync::Arc;

impl CommView<'_> {
    /// Start `call` over `data` in the node's slots, if this is a World all
    /// on one node or a communicator with slots of its own (`Err` gives
    /// `data` back: not here; the caller starts a message schedule). Where
    /// the data fits in a slot, the call runs there; where it does not,
    /// its header goes through the slots and, once every rank's agrees, it
    /// goes on as the message schedule `plan` gives (as a blocking call
    /// does); where `check` failed, the refusal goes through the slots and
    /// this rank fails at once.
    pub(crate) fn start_on_node<T: Element>(
        &mut self,
        call: Call,
        check: std::result::Result<(), String>,
        data: Vec<T>,
        reduction: Option<&Reduction<T>>,
        plan: impl FnOnce() -> std::result::Result<Plan, String>,
    ) -> std::result::Result<Result<Request<T>>, Vec<T>> {
        let node = match self.comm {
            Some(c) => match &c.node {
                Some(n) => Some(n.clone()),
                None => return Err(data),
            },
            None => None,
        };
        let scope = self.scope();
        let world = &mut *self.world;
        let queued = world.queue_in_slots(node, scope, call, check, data, reduction, plan, None)?;
        Ok(world.started_in_slots(queued))
    }
}

impl World {
    /// A call just queued ([`World::queue_in_slots`]) under way: the
    /// queues moved, and its request, or its refusal.
    pub(crate) fn started_in_slots<T: Element>(&mut self, queued: InSlots<T>) -> Result<Request<T>> {
        let _call = self.live.call();
        let moved = self.progress_slot_requests();
        if let Some(e) = queued.refusal {
            return Err(e);
        }
        moved?;
        Ok(Request {
            what: queued.call.what,
            of: Of::Run {
                id: queued.id,
                seq: queued.call.seq,
                outcome: queued.outcome,
                shape: queued.shape,
            },
        })
    }

    /// Queue `call` in the slots `node` (`None`: the World's; `Err` gives
    /// `data` back where there are none), of the communicator `scope`
    /// (also a persistent plan's start, which keeps its communicator's
    /// slots), under the next slot number and the next collective number
    /// there, without moving the queue. With `after`, its data is handed
    /// over there later (a step of a chain in two levels,
    /// `two_level_requests.rs`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn queue_in_slots<T: Element>(
        &mut self,
        node: Option<Arc<Mutex<NodeColl>>>,
        scope: Scope,
        call: Call,
        check: std::result::Result<(), String>,
        data: Vec<T>,
        reduction: Option<&Reduction<T>>,
        plan: impl FnOnce() -> std::result::Result<Plan, String>,
        after: Option<Outcome<T>>,
    ) -> std::result::Result<InSlots<T>, Vec<T>> {
        // The slot number, and this rank's rank there (a root is one).
        let (k, me) = match &node {
            Some(n) => {
                let mut nc = n.lock();
                (nc.begin_later(), nc.me())
            }
            None => match self.node_coll.as_mut() {
                Some(nc) => (nc.begin_later(), nc.me()),
                None => return Err(data),
            },
        };
        let _call = self.live.call();
        let mut call = call;
        call.seq = self.coll.number(&scope) & tags::SEQ_MASK;
        let id = self.coll.new_id();
        // Past a slot, the message schedule goes on under the call's own
        // number, as a blocking call's does: every rank takes one number
        // for the call, whether its headers agree or not.
        let (messages, refused) = match check {
            Err(why) => (None, Some(why)),
            Ok(()) if call.in_place() => (None, None),
            Ok(()) => match plan() {
                Ok(mut p) => {
                    p.sched = scope.to_world(p.sched);
                    (Some((p, call.seq)), None)
                }
                Err(why) => (None, Some(why)),
            },
        };
        let shape = messages.as_ref().map_or(Shape::Whole, |(p, _)| p.shape.clone());
        let refusal = refused.as_ref().map(|why| {
            Error::Usage(format!(
                "{} (collective #{}) on rank {}: {why}",
                call.what,
                call.seq,
                self.rank()
            ))
        });
        let outcome: Outcome<T> = Arc::new(parking_lot::Mutex::new(None));
        let mut queued = Queued::new(
            (id, k),
            call,
            data,
            reduction.cloned(),
            me,
            outcome.clone(),
            messages,
            refused,
        );
        if let Some(a) = after {
            queued = queued.after(a);
        }
        self.slot_requests.push(node, scope, Box::new(queued));
        self.slot_calls += 1;
        Ok(InSlots {
            id,
            call,
            outcome,
            shape,
            refusal,
        })
    }
}

/// A call queued in the slots: its engine-wide id, its call with its
/// number, where its result goes and in what shape, and the refusal its
/// own arguments gave.
pub(crate) struct InSlots<T: Element> {
    pub(crate) id: u32,
    pub(crate) call: Call,
    pub(crate) outcome: Outcome<T>,
    pub(crate) shape: Shape,
    pub(crate) refusal: Option<Error>,
}

impl World {
    /// Move the queued calls on, in every set of slots: post each one
    /// there is room for, in order, then finish calls from the head while
    /// their headers are all in (or fail the head where they disagree);
    /// and the chains of calls in two levels (`two_level_requests.rs`),
    /// whose steps hand their data to calls queued here. Whether anything
    /// moved.
    pub(crate) fn progress_slot_requests(&mut self) -> Result<bool> {
        let moved = self.move_slot_requests()?;
        if !self.advance_chains() {
            return Ok(moved);
        }
        // A step handed its data to a queued call: post it now.
        self.move_slot_requests()?;
        self.advance_chains();
        Ok(true)
    }

    fn move_slot_requests(&mut self) -> Result<bool> {
        if self.slot_requests.is_empty() {
            return Ok(false);
        }
        let mut moved = false;
        // Out of the World while a blocking slot call runs: that call
        // drained the queue first.
        if !self.slot_requests.queue.is_empty() {
            if let Some(mut nc) = self.node_coll.take() {
                let mut queue = std::mem::take(&mut self.slot_requests.queue);
                moved |= self.move_queue(&mut nc, &mut queue, &Scope::default());
                self.slot_requests.queue = queue;
                self.node_coll = Some(nc);
            }
        }
        if !self.slot_requests.comms.is_empty() {
            let mut comms = std::mem::take(&mut self.slot_requests.comms);
            for c in comms.iter_mut() {
                // Held by a blocking call of that communicator, which
                // drained its queue first.
                if let Some(mut nc) = c.node.try_lock() {
                    moved |= self.move_queue(&mut nc, &mut c.queue, &c.scope);
                }
            }
            comms.retain(|c| !c.queue.is_empty());
            self.slot_requests.comms = comms;
        }
        Ok(moved)
    }

    fn move_queue(&mut self, nc: &mut NodeColl, queue: &mut Queue, scope: &Scope) -> bool {
        let mut moved = false;
        // This rank reads its own part of a call back from its slot too
        // (`fold_in_rank_order`), so it reuses a slot only once it has
        // finished the call before in it, whatever the others' `done`.
        let oldest = queue.front().map_or(0, |q| q.k());
        for q in queue.iter_mut() {
            if q.posted() {
                continue;
            }
            // In order: a call whose data the step before it in a chain
            // has not handed over yet holds back the ones after it.
            if !q.ready() || q.k() >= oldest + SLOTS as u64 || !nc.may_post(q.k()) {
                break;
            }
            q.post(nc);
            moved = true;
        }
        let me = nc.me();
        while let Some(head) = queue.front_mut() {
            if !head.posted() {
                break;
            }
            let (k, call) = (head.k(), *head.call());
            if !head.gathered() {
                if nc.reading() != Some(k) {
                    let reads = head.reads();
                    nc.read_call(k, &call, me, reads == Reads::ByKind);
                    if reads == Reads::Nobody {
                        nc.only(None);
                    }
                }
                let mut progress = false;
                let failed = match nc.gather(k, &call, &mut progress) {
                    Ok(true) => None,
                    Ok(false) => {
                        moved |= progress;
                        // A rank that runs this number as messages says so
                        // by a probe, which this rank hears only while it
                        // waits for it in the slots.
                        let (engine, mut io) = self.engine_io();
                        match engine.slot_request_heard(&mut io, scope, call.seq, call.what) {
                            Some(h) => Some(h),
                            None => break,
                        }
                    }
                    Err(d) => Some((d.rank, d.message)),
                };
                if let Some((rank, message)) = failed {
                    head.fail(Error::Collective {
                        operation: call.what,
                        seq: call.seq,
                        rank,
                        message,
                    });
                    nc.finish(k);
                    queue.pop_front();
                    moved = true;
                    continue;
                }
            }
            // Its own steps: done at once, or (by one copy) over several
            // turns, the head meanwhile.
            let (engine, mut io) = self.engine_io();
            match head.step(nc, scope, engine, &mut io) {
                Step::Waits => break,
                Step::Moved => {
                    moved = true;
                    break;
                }
                Step::Copies => self.single_copy_calls += 1,
                Step::Over => {
                    queue.pop_front();
                }
            }
            moved = true;
        }
        let numbers = queue
            .front()
            .zip(queue.back())
            .map(|(a, b)| (a.call().seq, b.call().seq));
        self.coll.slot_queue(scope, numbers);
        // The waiting rule starts over here: a communicator's queue is gone
        // once empty, so the World's turns would not reset its slots' rule,
        // and the next call's wait would begin by sleeping.
        if moved {
            nc.idle.busy();
        }
        moved
    }

    /// Something moved in the World: the slots' waiting rule starts over.
    pub(crate) fn slot_requests_busy(&mut self) {
        if let Some(nc) = self.node_coll.as_mut() {
            nc.idle.busy();
        }
        for c in &self.slot_requests.comms {
            if let Some(mut nc) = c.node.try_lock() {
                nc.idle.busy();
            }
        }
    }

    /// Pass the time after a turn that found nothing while calls are
    /// queued, by the slots' waiting rule (`NodeColl::idle`, as a blocking
    /// call in the slots waits: where ranks outnumber cores it yields at
    /// once, where the World's own rule would spin first): spin, yield,
    /// then sleep at most a slice on the doorbell, unless what the head of
    /// some queue waits for (room to post, or a header) has come. Every
    /// post and every `done` rings it, in any of this rank's slots.
    pub(crate) fn idle_for_slot_requests(&mut self) {
        let Some(l) = self.local.as_ref() else {
            return self.coll.idle();
        };
        // The rule of the first queue's slots (a communicator's held by a
        // blocking call of its own is passed over).
        let world_queued = !self.slot_requests.queue.is_empty();
        let pause = match self.node_coll.as_mut().filter(|_| world_queued) {
            Some(nc) => Some(nc.idle.next()),
            None => self
                .slot_requests
                .comms
                .iter()
                .find_map(|c| c.node.try_lock().map(|mut nc| nc.idle.next())),
        };
        match pause {
            None => return self.coll.idle(),
            Some(Pause::Spin) => return std::hint::spin_loop(),
            Some(Pause::Yield) => return std::thread::yield_now(),
            Some(Pause::Block) => {}
        }
        let came = |nc: &NodeColl, q: &Queue| q.front().is_some_and(|h| h.came(nc));
        let (world, requests) = (self.node_coll.as_ref(), &self.slot_requests);
        l.side.sleep_unless(SLEEP_SLICE, || {
            world.is_some_and(|nc| came(nc, &requests.queue))
                || requests
                    .comms
                    .iter()
                    .any(|c| c.node.try_lock().is_some_and(|nc| came(&nc, &c.queue)))
        });
    }

    /// Finish every call queued in the slots `node` (`None`: the
    /// World's), waiting as any wait of the World does: before a blocking
    /// call in the same slots, which comes after them.
    pub(crate) fn drain_slot_requests(&mut self, node: Option<&Arc<Mutex<NodeColl>>>) -> Result<()> {
        loop {
            let queued = match node {
                None => !self.slot_requests.queue.is_empty(),
                Some(n) => self.slot_requests.holds_comm(n),
            };
            if !queued {
                return Ok(());
            }
            self.turn(true)?;
        }
    }
}
