//! The World's blocking barrier, allreduce, broadcast and reduce where
//! every rank is on one node: through the node's collective slots
//! (`collectives/on_node.rs`, which has the protocol) instead of as
//! messages; an allreduce, broadcast or reduce larger than a slot by
//! reads of the other ranks' memory (`collectives/on_node_copy.rs`) where
//! the kernel allows them. The calls in `collective_calls.rs` try this first; it
//! declines (`None`) on a World that spans nodes, on a communicator whose
//! members do (`comm_slots.rs`), on libfabric's shm and with
//! `FABRIC_MSG_NODE_COLLECTIVES=0`.

use super::collectives::on_node::{fold_in_rank_order, Call, Differs, Kind, NodeColl};
use super::collectives::on_node_copy;
use super::collectives::ops::{bytes_of, Element, Reduction};
use super::collectives::scope::Scope;
use super::comm::CommView;
use super::local::SLEEP_SLICE;
use super::state::World;
use super::tags;
use crate::error::{Error, Result};
use crate::transport::event_loop::idle::Pause;

/// Looks at the slots spun between two turns of the World, where ranks do
/// not outnumber cores.
const SPIN_LOOKS: u32 = 64;

/// Slot calls between two turns of the World that look at its main loop.
/// A slot call reads nothing of the main loop, and the main loop's
/// progress thread (`transport/progress.rs`) wakes, taking a core from a
/// rank that spins, for every period in which the loop was not read: a
/// program of back-to-back small collectives kept it waking every
/// millisecond. With a look every 64 calls it finds the loop read and
/// sleeps longer. 2-rank barrier and allreduce, `world_bench
/// barrier|allreduce -S 8 -I 50000`, p99.9: 27-60 µs before, 0.6-17 µs
/// after (docs/benchmarks.md).
const MAIN_EVERY_CALLS: u64 = 64;

/// How a call went in the slots.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum OnNode {
    /// Finished there.
    Done,
    /// Every rank's header agreed, but the data is larger than a slot:
    /// the call goes on as messages, under the number it took here (its
    /// slot call sends none), as a non-blocking call does
    /// (`node_requests.rs`): the forms meet, and a call whose headers
    /// disagreed took as many numbers on every rank.
    Messages(u32),
}

impl CommView<'_> {
    /// Run `call` over `data` in the node's slots, if this is a World all
    /// on one node or a communicator with slots of its own
    /// (`comm_slots.rs`); `check` is the argument check, whose failure is
    /// posted so that every rank fails with it. `None`: not here.
    pub(crate) fn on_node<T: Element>(
        &mut self,
        call: Call,
        check: std::result::Result<(), String>,
        data: &mut [T],
        reduction: Option<&Reduction<T>>,
    ) -> Option<Result<OnNode>> {
        let slots = match self.comm {
            Some(c) => c.node.is_some(),
            None => self.world.node_coll.is_some(),
        };
        if !slots {
            return None;
        }
        if self.world.slot_calls % MAIN_EVERY_CALLS == 0 {
            if let Some(l) = self.world.local.as_mut() {
                l.look_at_main_next();
            }
            if let Err(e) = self.world.turn(false) {
                return Some(Err(e));
            }
        }
        // Non-blocking calls in the same slots come first: their numbers
        // are before this one's (`node_requests.rs`).
        let node = self.comm.and_then(|c| c.node.as_ref());
        if let Err(e) = self.world.drain_slot_requests(node) {
            return Some(Err(e));
        }
        let scope = self.scope();
        let out = match self.comm {
            Some(c) => {
                let mut nc = c.node.as_ref()?.lock();
                self.world
                    .run_on_node(&mut nc, &scope, call, check, data, reduction)
            }
            None => {
                let mut nc = self.world.node_coll.take()?;
                let out = self
                    .world
                    .run_on_node(&mut nc, &scope, call, check, data, reduction);
                self.world.node_coll = Some(nc);
                out
            }
        };
        self.world.slot_calls += 1;
        Some(out)
    }
}

impl World {
    fn run_on_node<T: Element>(
        &mut self,
        nc: &mut NodeColl,
        scope: &Scope,
        mut call: Call,
        check: std::result::Result<(), String>,
        data: &mut [T],
        reduction: Option<&Reduction<T>>,
    ) -> Result<OnNode> {
        let _call = self.live.call();
        call.seq = self.coll.number(scope) & tags::SEQ_MASK;
        self.coll.in_slots(Some((scope, call.seq)));
        let k = nc.begin();
        // Set where the call ran by one copy (`on_node_copy.rs`): whether
        // others may be reading this rank's memory until they say they are
        // done.
        let mut copied: Option<bool> = None;
        let room = self.wait_on_node(nc, &call, |nc, _| Ok(nc.may_post(k)), |nc| nc.room_came(k));
        let out = room.and_then(|()| {
            if let Err(reason) = check {
                nc.refuse(k, &call, &reason);
                return Err(Error::Usage(format!(
                    "{} (collective #{}) on rank {}: {reason}",
                    call.what,
                    call.seq,
                    self.rank()
                )));
            }
            let me = nc.me();
            let carries = match call.kind {
                Kind::Allreduce | Kind::Reduce => true,
                Kind::Broadcast => me == call.root,
                Kind::Barrier | Kind::Refused => false,
            };
            let mine: &[u8] = if carries && call.in_place() {
                bytes_of(data)
            } else {
                &[]
            };
            // Data larger than a slot (never a barrier's) is offered for the
            // others to read in one copy.
            let at = if call.in_place() { 0 } else { data.as_ptr() as u64 };
            nc.post(k, &call, mine, at);
            // In place, a broadcast's root and a reduce's other ranks post
            // and go, and a broadcast's other ranks read the root alone. A
            // call on to messages waits for every header, so that no rank
            // sends to one that failed the check.
            match call.kind {
                _ if !call.in_place() => {}
                Kind::Broadcast if me != call.root => nc.only(Some(call.root)),
                Kind::Broadcast => nc.only(None),
                Kind::Reduce if me != call.root => nc.only(None),
                _ => {}
            }
            let gather = |nc: &mut NodeColl, progress: &mut bool| nc.gather(k, &call, progress);
            self.wait_on_node(nc, &call, gather, |nc| nc.header_came(k))?;
            if !call.in_place() {
                if !nc.single_copy(k) {
                    return Ok(OnNode::Messages(call.seq));
                }
                // Who must wait until no one reads its memory.
                copied = Some(on_node_copy::lends(&call, me));
                self.single_copy_calls += 1;
                return self.run_single_copy(nc, scope, k, &call, data, reduction);
            }
            match (call.kind, reduction) {
                (Kind::Allreduce, Some(r)) => combine(nc, k, data, r),
                (Kind::Reduce, Some(r)) if me == call.root => combine(nc, k, data, r),
                (Kind::Broadcast, _) if me != call.root => T::read(nc.data(k, call.root, call.bytes()), data),
                _ => {}
            }
            Ok(OnNode::Done)
        });
        nc.finish(k);
        self.coll.in_slots(None);
        let Some(lent) = copied else {
            return out;
        };
        // Whatever happened here, no one may still read `data` once this
        // returns.
        let wait = if lent {
            let all_done = |nc: &mut NodeColl, _: &mut bool| Ok(nc.all_done(k));
            self.wait_on_node(nc, &call, all_done, |nc| nc.all_done(k))
        } else {
            Ok(())
        };
        // A lost rank is why others left early (and a read of their memory
        // failed, or their part never came): say so.
        self.settled(out.and_then(|done| wait.map(|()| done)))
    }

    /// A call larger than a slot, by reads of the others' memory
    /// (`collectives/on_node_copy.rs` has the steps and why they are safe).
    fn run_single_copy<T: Element>(
        &mut self,
        nc: &mut NodeColl,
        scope: &Scope,
        k: u64,
        call: &Call,
        data: &mut [T],
        reduction: Option<&Reduction<T>>,
    ) -> Result<OnNode> {
        let live = self.live.clone();
        let failed = |d: Differs| {
            if d.gone {
                // Its process is gone: the World has lost that rank, as its
                // lifeline will soon say too (`settled` reports the loss).
                live.lose(
                    scope.world_rank(d.rank),
                    format!("its process is gone ({})", d.message),
                );
            }
            Error::Collective {
                operation: call.what,
                seq: call.seq,
                rank: d.rank,
                message: d.message,
            }
        };
        // An allreduce then reads the others' final parts.
        if on_node_copy::start(nc, (k, call), data, reduction).map_err(&failed)? {
            self.wait_on_node(
                nc,
                call,
                |nc, _| nc.phases(k),
                |nc| !matches!(nc.phases(k), Ok(false)),
            )?;
            on_node_copy::read_other_parts(nc, k, data).map_err(failed)?;
        }
        Ok(OnNode::Done)
    }

    /// Look at the slots until `ready` says so, turning the World between
    /// looks: other requests move on meanwhile and a lost rank ends the
    /// wait. Where the node has a core per rank, a few looks are spun
    /// between turns (a turn costs more than the whole collective when
    /// the others are already there). Between turns the World's waiting
    /// rule applies (`nc.idle`): spin, yield, and at last sleep on the
    /// doorbell, which every post and every `done` rings; `came` is what
    /// the sleeper checks once its doorbell is armed, so a post is never
    /// slept through.
    fn wait_on_node(
        &mut self,
        nc: &mut NodeColl,
        call: &Call,
        mut ready: impl FnMut(&mut NodeColl, &mut bool) -> std::result::Result<bool, Differs>,
        came: impl Fn(&NodeColl) -> bool,
    ) -> Result<()> {
        let spins = if nc.spin { SPIN_LOOKS } else { 1 };
        loop {
            let mut progress = false;
            let mut look = 0;
            let now = loop {
                let now = ready(nc, &mut progress);
                look += 1;
                if !matches!(now, Ok(false)) || look == spins {
                    break now;
                }
                std::hint::spin_loop();
            };
            match now {
                Ok(true) => {
                    nc.idle.busy();
                    return Ok(());
                }
                Ok(false) => {}
                Err(d) => {
                    return Err(Error::Collective {
                        operation: call.what,
                        seq: call.seq,
                        rank: d.rank,
                        message: d.message,
                    })
                }
            }
            let turned = self.turn(false)?;
            let (engine, mut io) = self.engine_io();
            if let Some((rank, message)) = engine.slot_call_heard(&mut io, call.what) {
                // Another rank failed this call, or runs it as messages.
                return Err(Error::Collective {
                    operation: call.what,
                    seq: call.seq,
                    rank,
                    message,
                });
            }
            if turned || progress {
                nc.idle.busy();
                continue;
            }
            match nc.idle.next() {
                Pause::Spin => std::hint::spin_loop(),
                Pause::Yield => std::thread::yield_now(),
                Pause::Block => match self.local.as_ref() {
                    Some(l) => l.side.sleep_unless(SLEEP_SLICE, || came(nc)),
                    None => std::thread::yield_now(),
                },
            }
        }
    }
}

/// `data` becomes every rank's data of collective `k` combined in rank
/// order.
fn combine<T: Element>(nc: &mut NodeColl, k: u64, data: &mut [T], r: &Reduction<T>) {
    let mut scratch = Vec::new();
    fold_in_rank_order(nc, k, data, r, &mut scratch);
}
