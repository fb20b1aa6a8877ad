//! The World's blocking barrier, allreduce, broadcast and reduce where
//! every rank is on one node: through the node's collective slots
//! (`collectives/on_node.rs`, which has the protocol) instead of as
//! messages. The calls in `collective_calls.rs` try this first; it
//! declines (`None`) on a communicator, on a World that spans nodes, on
//! libfabric's shm and with `FABRIC_MSG_NODE_COLLECTIVES=0`.

use super::collectives::on_node::{fold_in_rank_order, Call, Differs, Kind, NodeColl};
use super::collectives::ops::{bytes_of, Element, Reduction};
use super::collectives::scope::Scope;
use super::comm::CommView;
use super::state::World;
use super::tags;
use crate::error::{Error, Result};

/// Looks at the slots spun between two turns of the World, where ranks do
/// not outnumber cores.
const SPIN_LOOKS: u32 = 64;

/// How a call went in the slots.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum OnNode {
    /// Finished there.
    Done,
    /// Every rank's header agreed, but the data is larger than a slot:
    /// the call goes on as messages.
    Messages,
}

impl CommView<'_> {
    /// Run `call` over `data` in the node's slots, if this is a World all
    /// on one node; `check` is the argument check, whose failure is
    /// posted so that every rank fails with it. `None`: not here.
    pub(crate) fn on_node<T: Element>(
        &mut self,
        call: Call,
        check: std::result::Result<(), String>,
        data: &mut [T],
        reduction: Option<&Reduction<T>>,
    ) -> Option<Result<OnNode>> {
        if self.comm.is_some() {
            return None;
        }
        let mut nc = self.world.node_coll.take()?;
        let out = self.world.run_on_node(&mut nc, call, check, data, reduction);
        self.world.node_coll = Some(nc);
        Some(out)
    }
}

impl World {
    fn run_on_node<T: Element>(
        &mut self,
        nc: &mut NodeColl,
        mut call: Call,
        check: std::result::Result<(), String>,
        data: &mut [T],
        reduction: Option<&Reduction<T>>,
    ) -> Result<OnNode> {
        let _call = self.live.call();
        call.seq = self.coll.number(&Scope::default()) & tags::SEQ_MASK;
        let k = nc.begin();
        let room = self.wait_on_node(nc, &call, |nc, _| Ok(nc.may_post(k)));
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
            let me = self.rank();
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
            nc.post(k, &call, mine);
            self.wait_on_node(nc, &call, |nc, progress| nc.gather(k, &call, progress))?;
            if !call.in_place() {
                return Ok(OnNode::Messages);
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
        out
    }

    /// Look at the slots until `ready` says so, turning the World between
    /// looks: other requests move on meanwhile, the World's waiting rule
    /// applies, and a lost rank ends the wait. Where the node has a core
    /// per rank, a few looks are spun between turns: a turn costs more
    /// than the whole collective when the others are already there.
    fn wait_on_node(
        &mut self,
        nc: &mut NodeColl,
        call: &Call,
        mut ready: impl FnMut(&mut NodeColl, &mut bool) -> std::result::Result<bool, Differs>,
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
                Ok(true) => return Ok(()),
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
            if progress {
                self.coll.busy();
            }
            self.turn(true)?;
        }
    }
}

/// `data` becomes every rank's data of collective `k` combined in rank
/// order.
fn combine<T: Element>(nc: &mut NodeColl, k: u64, data: &mut [T], r: &Reduction<T>) {
    let (mut acc, mut scratch) = (Vec::with_capacity(data.len()), Vec::new());
    fold_in_rank_order(nc, k, data, r, &mut acc, &mut scratch);
    data.copy_from_slice(&acc);
}
