//! The World's non-blocking barrier, allreduce, broadcast and reduce (and
//! the starts of their persistent forms) through the node's collective
//! slots, where every rank is on one node: `iallreduce` posts this rank's
//! part at once and the World's turns finish it, so a small non-blocking
//! collective costs what the blocking one does (`node_collectives.rs`,
//! whose protocol this is: `collectives/on_node.rs`), not a message
//! schedule's start and steps.
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
//! - **Larger than a slot**, a call posts its header alone and, once every
//!   rank's agrees, goes on as the message schedule of the blocking call
//!   under the same number (`OnNode::Messages`). **Bad arguments** post a
//!   refusal and fail at once. So a call takes one slot and one number on
//!   every rank whatever becomes of it, and the World goes on after a
//!   failed one.
//! - **A blocking slot call** first finishes every queued one
//!   (`drain_slot_requests`): its number comes after theirs.
//! - **Mismatches** fail the call as the blocking one fails: another kind,
//!   length, root or reduction in a rank's header; a refusal; a probe from
//!   a rank that runs the same number as a message schedule (a collective
//!   without slots), kept by the engine for any queued number
//!   (`Engine::slot_queue`) and heard once the call is the queue's head
//!   (`Engine::slot_request_heard`). Every later call goes on.
//! - **A lost rank** fails every wait, as for any request (`World::turn`).
//!
//! Communicators with slots of their own keep their non-blocking and
//! persistent calls as message schedules.

use super::collectives::on_node::{Call, NodeColl};
use super::collectives::ops::{Element, Reduction};
use super::collectives::plan::Plan;
use super::collectives::request::Shape;
use super::collectives::run::Outcome;
use super::collectives::scope::Scope;
use super::collectives::slot_queue::{Queued, Reads};
use super::comm::CommView;
use super::local::SLEEP_SLICE;
use super::request::{Of, Request};
use super::state::World;
use super::tags;
use crate::error::{Error, Result};
use crate::transport::event_loop::idle::Pause;
use crate::transport::node::slots::SLOTS;
use std::sync::Arc;

impl CommView<'_> {
    /// Start `call` over `data` in the node's slots, if this is a World all
    /// on one node (`Err` gives `data` back: not here; the caller starts a
    /// message schedule). Where the data fits in a slot, the call runs
    /// there; where it does not, its header goes through the slots and,
    /// once every rank's agrees, it goes on as the message schedule `plan`
    /// gives (as a blocking call does); where `check` failed, the refusal
    /// goes through the slots and this rank fails at once.
    pub(crate) fn start_on_node<T: Element>(
        &mut self,
        call: Call,
        check: std::result::Result<(), String>,
        data: Vec<T>,
        reduction: Option<&Reduction<T>>,
        plan: impl FnOnce() -> std::result::Result<Plan, String>,
    ) -> std::result::Result<Result<Request<T>>, Vec<T>> {
        if self.comm.is_some() {
            return Err(data);
        }
        let world = &mut *self.world;
        let Some(nc) = world.node_coll.as_mut() else {
            return Err(data);
        };
        let k = nc.begin_later();
        let _call = world.live.call();
        let scope = Scope::default();
        let mut call = call;
        call.seq = world.coll.number(&scope) & tags::SEQ_MASK;
        let id = world.coll.new_id();
        let me = world.rank();
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
                "{} (collective #{}) on rank {me}: {why}",
                call.what, call.seq
            ))
        });
        let outcome: Outcome<T> = Arc::new(parking_lot::Mutex::new(None));
        let queued = Queued::new(
            (id, k),
            call,
            data,
            reduction.cloned(),
            me,
            outcome.clone(),
            messages,
            refused,
        );
        world.slot_requests.queue.push_back(Box::new(queued));
        world.slot_calls += 1;
        let moved = world.progress_slot_requests();
        if let Some(e) = refusal {
            return Ok(Err(e));
        }
        if let Err(e) = moved {
            return Ok(Err(e));
        }
        Ok(Ok(Request {
            what: call.what,
            of: Of::Run {
                id,
                seq: call.seq,
                outcome,
                shape,
            },
        }))
    }
}

impl World {
    /// Move the queued calls on: post each one there is room for, in
    /// order, then finish calls from the head while their headers are all
    /// in (or fail the head where they disagree). Whether anything moved.
    pub(crate) fn progress_slot_requests(&mut self) -> Result<bool> {
        if self.slot_requests.is_empty() {
            return Ok(false);
        }
        // Out of the World while a blocking slot call runs: that call
        // drained the queue first.
        let Some(mut nc) = self.node_coll.take() else {
            return Ok(false);
        };
        let moved = self.move_queue(&mut nc);
        self.node_coll = Some(nc);
        Ok(moved)
    }

    fn move_queue(&mut self, nc: &mut NodeColl) -> bool {
        let mut moved = false;
        // This rank reads its own part of a call back from its slot too
        // (`fold_in_rank_order`), so it reuses a slot only once it has
        // finished the call before in it, whatever the others' `done`.
        let oldest = self.slot_requests.queue.front().map_or(0, |q| q.k());
        for q in self.slot_requests.queue.iter_mut() {
            if q.posted() {
                continue;
            }
            if q.k() >= oldest + SLOTS as u64 || !nc.may_post(q.k()) {
                break;
            }
            q.post(nc);
            moved = true;
        }
        let me = self.rank();
        while let Some(head) = self.slot_requests.queue.front() {
            if !head.posted() {
                break;
            }
            let (k, call) = (head.k(), *head.call());
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
                    // A rank that runs this number as messages says so by a
                    // probe, which this rank hears only while it waits for
                    // it in the slots.
                    let (engine, mut io) = self.engine_io();
                    match engine.slot_request_heard(&mut io, call.seq, call.what) {
                        Some(h) => Some(h),
                        None => break,
                    }
                }
                Err(d) => Some((d.rank, d.message)),
            };
            let Some(mut head) = self.slot_requests.queue.pop_front() else {
                break;
            };
            match failed {
                None => {
                    let (engine, mut io) = self.engine_io();
                    head.complete(nc, engine, &mut io);
                }
                Some((rank, message)) => head.fail(Error::Collective {
                    operation: call.what,
                    seq: call.seq,
                    rank,
                    message,
                }),
            }
            nc.finish(k);
            moved = true;
        }
        let q = &self.slot_requests.queue;
        let numbers = q.front().zip(q.back()).map(|(a, b)| (a.call().seq, b.call().seq));
        self.coll.slot_queue(numbers);
        moved
    }

    /// Something moved in the World: the slots' waiting rule starts over.
    pub(crate) fn slot_requests_busy(&mut self) {
        if let Some(nc) = self.node_coll.as_mut() {
            nc.idle.busy();
        }
    }

    /// Pass the time after a turn that found nothing while calls are
    /// queued, by the slots' waiting rule (`NodeColl::idle`, as a blocking
    /// call in the slots waits: where ranks outnumber cores it yields at
    /// once, where the World's own rule would spin first): spin, yield,
    /// then sleep at most a slice on the doorbell, unless what the queue's
    /// head waits for (room to post, or a header) has come. Every post and
    /// every `done` rings it.
    pub(crate) fn idle_for_slot_requests(&mut self) {
        let (Some(nc), Some(l)) = (self.node_coll.as_mut(), self.local.as_ref()) else {
            self.coll.idle();
            return;
        };
        match nc.idle.next() {
            Pause::Spin => return std::hint::spin_loop(),
            Pause::Yield => return std::thread::yield_now(),
            Pause::Block => {}
        }
        let Some(head) = self.slot_requests.queue.front() else {
            return;
        };
        let (k, posted) = (head.k(), head.posted());
        l.side.sleep_unless(SLEEP_SLICE, || {
            if posted {
                nc.header_came(k)
            } else {
                nc.room_came(k)
            }
        });
    }

    /// Finish every queued call, waiting as any wait of the World does:
    /// before a blocking call in the slots, which comes after them.
    pub(crate) fn drain_slot_requests(&mut self) -> Result<()> {
        while !self.slot_requests.is_empty() {
            self.turn(true)?;
        }
        Ok(())
    }
}
