//! The World's counters ([`World::stats`]): its loops' [`LoopStats`], and
//! the traffic with each rank over the fabric and the node's shared memory
//! together.

use super::state::World;
use crate::ffi;
use crate::transport::event_loop::{LoopStats, Peer, Traffic};

/// One rank's traffic with this one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RankStats {
    /// The rank.
    pub rank: u32,
    /// Messages to it.
    pub sent: Traffic,
    /// Messages from it (where the sender is known: see
    /// [`LoopStats::received_from_unknown`]).
    pub received: Traffic,
}

/// What [`World::stats`] reports. Messages include the World's own
/// (collectives' steps, notices): they are what crossed the fabric.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorldStats {
    /// Every rank, this one included (a message to oneself counts), by rank.
    pub ranks: Vec<RankStats>,
    /// The fabric's loop.
    pub fabric: LoopStats,
    /// The shared-memory loop for ranks on this node, if there is one.
    pub local: Option<LoopStats>,
    /// Collectives that went through the node's shared-memory slots
    /// (blocking ones on a World all on one node, or a communicator all on
    /// this node: `collectives/on_node.rs`; the World's non-blocking ones
    /// whose data fits a slot: `node_requests.rs`), their data too where it
    /// fit a slot.
    pub node_collectives: u64,
    /// Of `node_collectives`, the `allreduce`, `broadcast` and `reduce`
    /// calls larger than a slot whose data the ranks read from each
    /// other's memory in one copy (`collectives/on_node_copy.rs`), where
    /// every rank may read every other's.
    pub node_single_copy_collectives: u64,
    /// The `allreduce`, `barrier`, `reduce` and `broadcast` calls, blocking
    /// or not, of the World and its communicators that ran in two levels
    /// (each node's ranks to their leader in shared memory, the leaders on
    /// the fabric, back in shared memory: `world/two_level.rs`), where they
    /// span nodes. Their node steps count in
    /// `node_collectives` too.
    pub two_level_collectives: u64,
    /// Of `two_level_collectives`, the non-blocking and persistent ones
    /// (`world/two_level_requests.rs`).
    pub two_level_requests: u64,
}

impl World {
    /// What this rank has sent, received, waited for and refused so far.
    pub fn stats(&self) -> WorldStats {
        let fabric = self.ev.stats();
        let local = self.local.as_ref().map(|l| l.side.stats());
        let of = |stats: &LoopStats, peer: &Peer| {
            stats
                .peers
                .iter()
                .find(|p| {
                    p.addr == peer.fi_addr()
                        && (p.endpoint == peer.endpoint() || peer.fi_addr() != ffi::FI_ADDR_UNSPEC)
                })
                .map(|p| (p.sent, p.received))
                .unwrap_or_default()
        };
        let sum = |a: Traffic, b: Traffic| Traffic {
            messages: a.messages + b.messages,
            bytes: a.bytes + b.bytes,
        };
        let ranks = (0..self.size())
            .map(|r| {
                let (mut sent, mut received) = self
                    .peers
                    .get(r as usize)
                    .map(|p| of(&fabric, p))
                    .unwrap_or_default();
                let on_node = self
                    .local
                    .as_ref()
                    .zip(local.as_ref())
                    .and_then(|(l, s)| l.side.traffic_with(s, r));
                if let Some((s, rcv)) = on_node {
                    sent = sum(sent, s);
                    received = sum(received, rcv);
                }
                RankStats {
                    rank: r,
                    sent,
                    received,
                }
            })
            .collect();
        WorldStats {
            ranks,
            fabric,
            local,
            node_collectives: self.slot_calls,
            node_single_copy_collectives: self.single_copy_calls,
            two_level_collectives: self.two_level_calls,
            two_level_requests: self.two_level_requests,
        }
    }
}
