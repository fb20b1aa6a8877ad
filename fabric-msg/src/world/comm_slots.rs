//! A communicator's own collective slots (`collectives/on_node.rs`), so
//! that its blocking barrier, allreduce, broadcast and reduce run in
//! shared memory as the World's do when all its members share this node:
//! the node communicator of `split_shared` above all, inside a World that
//! spans nodes.
//!
//! Made when the communicator is (`CommView::split`): every member
//! creates a segment of its own for the slots, the members exchange the
//! segments' names in one allgather on the new communicator and map each
//! other's, and agree in a second whether every member mapped every
//! segment. Only then does any member use them; otherwise its collectives
//! stay message schedules. A member that cannot take part (the members
//! span nodes, libfabric's shm carries the node, or
//! `FABRIC_MSG_NODE_COLLECTIVES=0`) still takes part in both allgathers,
//! with nothing to offer, so every member runs the same collectives.
//!
//! A fresh segment per communicator means a context id used again by a
//! later communicator never meets an earlier one's stamps. The segments
//! go with the last mapping: every member's `Comm` and its clones.

use super::collectives::on_node::NodeColl;
use super::comm::{Comm, CommView};
use super::lane::Side;
use super::node_symmetric::{name_of, name_words, NAME_WORDS};
use super::startup::oversubscribed;
use crate::error::Result;
use crate::transport::node::segment::{Segment, HEADER};
use crate::transport::node::slots::{Slots, AREA};
use std::sync::Arc;

impl CommView<'_> {
    /// Give `comm`, just split from this view's communicator with this
    /// rank a member, slots of its own where every member can use them.
    pub(crate) fn give_slots(&mut self, comm: &mut Comm) -> Result<()> {
        let world = &mut *self.world;
        let on_node = world.local.as_ref().is_some_and(|l| {
            let ranks = l.ranks();
            matches!(l.side, Side::Node(_))
                && comm
                    .members()
                    .iter()
                    .all(|w| *w == world.rank() || ranks.contains(w))
        });
        let own = if world.node_collectives && on_node && comm.size() > 1 {
            match Segment::create(HEADER + AREA) {
                Ok(s) => Some(Arc::new(s)),
                Err(e) => {
                    log::warn!("no collective slots for a communicator: {e}");
                    None
                }
            }
        } else {
            None
        };
        let names = world.on(comm).allgather(&name_words(own.as_deref()))?;
        let mut slots = Vec::with_capacity(comm.size() as usize);
        if let Some(own) = own {
            for (r, words) in names.chunks_exact(NAME_WORDS).enumerate() {
                if r as u32 == comm.rank() {
                    slots.push(Slots::new(own.clone(), HEADER));
                    continue;
                }
                match name_of(words).filter(|n| n.len == (HEADER + AREA) as u64) {
                    Some(n) => match Segment::attach(&n) {
                        Ok(seg) => slots.push(Slots::new(Arc::new(seg), HEADER)),
                        Err(e) => {
                            log::warn!(
                                "a communicator's rank {r}'s collective slots are not mapped here: {e}"
                            );
                            break;
                        }
                    },
                    None => break,
                }
            }
        }
        // Each member's posts ring the doorbell its owner sleeps on: the one
        // in the owner's node segment, not in the communicator's.
        let slots: Vec<Slots> = match world.local.as_ref() {
            Some(l) => slots
                .into_iter()
                .zip(comm.members().iter())
                .map_while(|(s, &w)| l.side.slots_of(w).map(|node| s.ringing(&node)))
                .collect(),
            None => Vec::new(),
        };
        let mapped = slots.len() == comm.size() as usize;
        let all = world.on(comm).allgather(&[u8::from(mapped)])?;
        if all.iter().all(|&m| m == 1) {
            let mut idle = world.coll.idler();
            idle.busy();
            let spin = !oversubscribed(world.local_ranks().len().max(comm.size() as usize));
            comm.node = Some(Arc::new(parking_lot::Mutex::new(NodeColl::new(
                slots,
                comm.rank(),
                spin,
                idle,
            ))));
        }
        Ok(())
    }
}
