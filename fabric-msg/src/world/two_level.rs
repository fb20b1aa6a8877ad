//! The blocking `allreduce`, `barrier`, `reduce` and `broadcast` of the
//! World, and of any communicator, whose ranks span nodes where
//! fabric-msg's node transport joins the ranks of each node: in two
//! levels, as Open MPI's `coll/han` and MPICH's node-aware algorithms
//! do, so that one rank a node (its leader) crosses the fabric instead of
//! every rank.
//!
//! 1. **To the leader**, in the node's shared-memory slots: every rank of
//!    the node posts its data and goes on; the leader (the node's lowest
//!    world rank) folds them (`allreduce`), or waits for every rank
//!    (`barrier`).
//! 2. **Between leaders**, on the fabric: the leaders' communicator runs
//!    the same collective as messages.
//! 3. **From the leader**, in the slots again: the leader posts the result
//!    (or, for a barrier, nothing), which every rank of its node waits for.
//!
//! `reduce` runs the same steps towards its root: the leaders reduce to
//! the root's node leader, which hands the result down where the root is
//! not itself (only the root keeps it); the other ranks go on once their
//! part is given. `broadcast` has one node step a rank: on
//! the root's node the root posts first and its leader then broadcasts
//! to the others; elsewhere the leader receives, then hands down. Where
//! the root is, on the leaders' level, is the place of its node by lowest
//! rank (`same_node::leader_places`), which every rank computes alike from
//! the table of nodes.
//!
//! Data too large for a slot goes on in steps 1 and 3 as the node
//! communicator's message schedules (over the node transport), once every
//! rank's header agreed, as the slots always do.
//!
//! **When.** Chosen once, at start-up (`World::set_up_two_level`), from
//! what every rank knows alike (the table of nodes, and whether every rank
//! published a node-transport endpoint), then agreed: every rank made its
//! node communicator with slots (or is alone on its node), and has
//! `node_collectives` on. Every call of a World so set up goes through the
//! two levels, whatever its length, so no rank can choose differently from
//! another. `FABRIC_MSG_NODE_COLLECTIVES=0`, libfabric's shm
//! (`FABRIC_MSG_SHM=libfabric`) or one node: messages, as before.
//!
//! **Communicators.** Where the World runs in two levels, so do the
//! communicators whose ranks span nodes with some node holding several of
//! them. A communicator of the same ranks in the same order as the one it
//! was split from (a `dup`) shares that one's two levels: the program's
//! collectives on the two are in one order on every rank (were they not,
//! the program would deadlock wherever collectives synchronize, which MPI
//! calls erroneous), so the shared node and leaders' communicators number
//! them alike. Any other makes its own when it is made: `CommView::split`
//! carries each rank's node in its allgather, so every rank decides alike,
//! and the node's and leaders' communicators are agreed as the World's
//! are. They take two more context ids while it lives, so it makes them
//! only while at least half of the ids are free on all its ranks; past
//! that, or where the two splits find none free, its collectives stay
//! flat. Roots and the ranks a failure names are the communicator's;
//! `TwoLevel` maps them to world ranks.
//!
//! **Failures reach every rank** of an `allreduce` or a `barrier` (for
//! the others, see below). Each step runs on every rank whatever the step
//! before gave it, so that every communicator numbers its collectives
//! alike afterwards: a rank whose step failed refuses the next ones
//! instead of running them. A leader refuses the leaders' step (the other
//! leaders fail with its reason) and its node's last step (its node's
//! ranks fail with it); a node's rank refuses the last step too. So a
//! length, op or kind that differs anywhere, a bad argument on any rank,
//! or a lost rank fails the call on every rank, with the first failure's
//! text inside, as the flat schedules do.
//!
//! **Results.** The built-in ops and `Reduction::custom` are associative
//! and commutative (`collectives/ops.rs`): the two levels fold in another
//! order than the flat schedules, and every rank still gets the same bits
//! (the leaders' allreduce gives its leaders the same bits, and each
//! leader hands them on).
//!
//! `reduce` and `broadcast` fail where data is waited for: a broadcast's
//! root node finishes before the leaders' step, and a leader whose
//! reduce only sends towards the root goes on, as a root and a sender do
//! in the flat schedules; the ranks downstream of a failure all fail.
//!
//! The non-blocking and persistent forms take the same steps, as a chain
//! each rank's turns move on (`two_level_requests.rs`).

use super::collectives::on_node::{Call, Kind};
use super::collectives::ops::{Element, Reduction};
use super::collectives::request::{check_root, copy_result};
use super::comm::CommView;
use super::comm_handle::TwoLevel;
use super::node_collectives::OnNode;
use super::state::World;
use crate::error::{Error, Result};
use std::sync::Arc;

impl World {
    /// Make the two levels where `wanted` (the same on every rank: the
    /// World spans nodes and every rank has the node transport), and keep
    /// them if every rank can use them. Collective.
    pub(super) fn set_up_two_level(&mut self, wanted: bool, nodes: &[String]) -> Result<()> {
        if wanted {
            let ids = super::same_node::node_ids(nodes);
            self.two_level = self.whole().make_levels(&ids)?.map(Arc::new);
        }
        Ok(())
    }

    /// Sub-communicators the World keeps for itself: where it runs its
    /// collectives in two levels (it spans nodes), its node's and its node
    /// leaders', 2; otherwise 0. They count against the limit on live
    /// communicators (`MAX_CONTEXTS - 1`) as the application's do.
    pub fn own_communicators(&self) -> u32 {
        if self.two_level.is_some() {
            2
        } else {
            0
        }
    }

    /// The two levels, if this World runs its blocking collectives
    /// in them.
    pub(super) fn two_level(&self) -> Option<Arc<TwoLevel>> {
        self.two_level.clone()
    }

    /// `allreduce` in two levels (see the file's comment).
    pub(super) fn allreduce_two_level<T: Element>(
        &mut self,
        t: &TwoLevel,
        data: &mut [T],
        op: Reduction<T>,
    ) -> Result<()> {
        self.in_two_levels(t, "allreduce", data, Some(op))
    }

    /// `barrier` in two levels (see the file's comment).
    pub(super) fn barrier_two_level(&mut self, t: &TwoLevel) -> Result<()> {
        self.in_two_levels::<u8>(t, "barrier", &mut [], None)
    }

    /// `broadcast` in two levels: on the root's node, from the root in its
    /// slots first, then its leader to the other leaders on the fabric;
    /// on every other node, the leader receives that, then hands it down
    /// in its slots. One node step on every rank, so the node
    /// communicators stay numbered alike even where ranks name different
    /// roots (which the slots' header check then reports).
    pub(super) fn broadcast_two_level<T: Element>(
        &mut self,
        t: &TwoLevel,
        root: u32,
        data: &mut [T],
    ) -> Result<()> {
        const WHAT: &str = "broadcast";
        self.two_level_calls += 1;
        let check = check_root(root, t.size());
        let place = check.as_ref().ok().and_then(|()| t.place_of(root));
        let among_leaders = |mut c: CommView<'_>, data: &mut [T]| match place {
            Some(p) => c.broadcast(p, data),
            None => Err(c.refuse(WHAT, "no root".into())),
        };
        let outcome = match t.on_my_node(root) {
            Some(here) => {
                let first = self.node_broadcast(t, WHAT, here, data, None);
                let second = self.leaders_step(t, WHAT, &first, |c| among_leaders(c, data));
                first.and(second)
            }
            None => {
                let args = check.map_err(Error::Usage);
                let stepped = self.leaders_step(t, WHAT, &args, |c| among_leaders(c, data));
                // A leader's refusal, else (on the others) the bad root.
                let first = stepped.and(args);
                let reason = first.as_ref().err().map(|e| e.to_string());
                let second = self.hand_down_from_leader(t, WHAT, data, reason);
                first.and(second)
            }
        };
        self.settled(outcome)
    }

    /// `reduce` in two levels: every node folds to its leader in its
    /// slots, the leaders reduce to the root's leader on the fabric, and,
    /// where the root is not its node's leader, that leader hands the
    /// result down in its slots (only the root keeps it). Elsewhere a rank
    /// goes on once its part is given, as a sender does in the flat
    /// schedules, and does not learn of a failure past it. A leader that
    /// is not the root folds into a copy: `data` stays as it was
    /// everywhere but on the root. Ranks of a node that name different
    /// roots number their node's collectives differently from then on:
    /// the next one there fails on both sides with the difference.
    pub(super) fn reduce_two_level<T: Element>(
        &mut self,
        t: &TwoLevel,
        root: u32,
        data: &mut [T],
        op: Reduction<T>,
    ) -> Result<()> {
        const WHAT: &str = "reduce";
        self.two_level_calls += 1;
        let check = check_root(root, t.size());
        let place = check.as_ref().ok().and_then(|()| t.place_of(root));
        let here = t.on_my_node(root);
        let leader = t.node.rank() == 0;
        let mut copy = Vec::new();
        let work: &mut [T] = if leader && here != Some(0) {
            copy.extend_from_slice(data);
            &mut copy
        } else {
            &mut *data
        };
        let first = self.gather_to_leader(t, WHAT, work, Some(&op), check);
        let second = self.leaders_step(t, WHAT, &first, |mut c| match place {
            Some(p) => c.reduce(p, work, op),
            None => Err(c.refuse(WHAT, "no root".into())),
        });
        let reason = first.as_ref().and(second.as_ref()).err().map(|e| e.to_string());
        // Only where the root is not its node's leader is there a third
        // step: that node's leader hands the result down, and only the
        // root keeps it.
        let third = match here {
            Some(0) | None => Ok(()),
            Some(r) if t.node.rank() == r => self.hand_down_from_leader(t, WHAT, data, reason),
            Some(_) if leader => self.hand_down_from_leader(t, WHAT, &mut copy, reason),
            Some(_) => {
                let mut discard = data.to_vec();
                self.hand_down_from_leader(t, WHAT, &mut discard, reason)
            }
        };
        self.settled(first.and(second).and(third))
    }

    /// The three steps: with `op` an allreduce of `data`, without one a
    /// barrier. Each runs whatever the one before gave (a failed rank
    /// refuses the rest), so every communicator's numbering stays alike.
    fn in_two_levels<T: Element>(
        &mut self,
        t: &TwoLevel,
        what: &'static str,
        data: &mut [T],
        op: Option<Reduction<T>>,
    ) -> Result<()> {
        self.two_level_calls += 1;
        let first = self.gather_to_leader(t, what, data, op.as_ref(), Ok(()));
        let second = self.leaders_step(t, what, &first, |mut c| match op {
            Some(op) => c.allreduce(data, op),
            None => c.barrier(),
        });
        let reason = first.as_ref().and(second.as_ref()).err().map(|e| e.to_string());
        let third = self.hand_down_from_leader(t, what, data, reason);
        self.settled(first.and(second).and(third))
    }

    /// Step 2, on the leaders: `run` on their communicator where this
    /// rank's step before went well (`before`), else a refusal with its
    /// reason, which fails the other leaders with it; nothing on a rank
    /// that is not its node's leader.
    fn leaders_step(
        &mut self,
        t: &TwoLevel,
        what: &'static str,
        before: &Result<()>,
        run: impl FnOnce(CommView<'_>) -> Result<()>,
    ) -> Result<()> {
        match (&t.leaders, before) {
            (None, _) => Ok(()),
            (Some(l), Ok(())) => run(self.on(l)),
            (Some(l), Err(e)) => Err(self.on(l).refuse(what, e.to_string())),
        }
    }

    /// Step 1 on `node`: every rank's `data` folded on the leader with
    /// `op`, or (no `op`) every rank there before the leader goes on;
    /// refused where `args` (the caller's own argument check) failed.
    fn gather_to_leader<T: Element>(
        &mut self,
        t: &TwoLevel,
        what: &'static str,
        data: &mut [T],
        op: Option<&Reduction<T>>,
        args: std::result::Result<(), String>,
    ) -> Result<()> {
        let (call, check) = match op {
            Some(op) => (
                Call::new::<T>(Kind::Reduce, what, data.len(), 0).reducing(op),
                op.check(),
            ),
            None => (Call::new::<T>(Kind::Barrier, what, 0, 0), Ok(())),
        };
        let check = args.and(check);
        let node = &t.node;
        match self.on(node).on_node(call, check.clone(), data, op) {
            None => check.map_err(Error::Usage), // alone on its node
            Some(Err(e)) => Err(t.in_callers_ranks(e)),
            Some(Ok(OnNode::Done)) => Ok(()),
            Some(Ok(OnNode::Messages(_))) => {
                // Only data larger than a slot goes on: a barrier has none.
                let Some(op) = op.cloned() else {
                    return Ok(());
                };
                let leader = node.rank() == 0;
                let r = self.on(node).ireduce(0, data.to_vec(), op)?;
                let out = self.on(node).wait(r)?;
                if leader {
                    copy_result(what, data, &out)?;
                }
                Ok(())
            }
        }
    }

    /// Step 3 on `node`: the leader's `data` to every rank of its node, or
    /// (with a `refusal`) the failure of an earlier step to all of them.
    fn hand_down_from_leader<T: Element>(
        &mut self,
        t: &TwoLevel,
        what: &'static str,
        data: &mut [T],
        refusal: Option<String>,
    ) -> Result<()> {
        self.node_broadcast(t, what, 0, data, refusal)
    }

    /// `from`'s `data` (a rank of `node`) to every rank of `node`, in its
    /// slots or past them as messages, or (with a `refusal`) that failure
    /// to all of them.
    fn node_broadcast<T: Element>(
        &mut self,
        t: &TwoLevel,
        what: &'static str,
        from: u32,
        data: &mut [T],
        refusal: Option<String>,
    ) -> Result<()> {
        let call = Call::new::<T>(Kind::Broadcast, what, data.len(), from);
        let check = refusal.map_or(Ok(()), Err);
        let node = &t.node;
        match self.on(node).on_node(call, check.clone(), data, None) {
            None => check.map_err(Error::Usage), // alone on its node
            Some(Err(e)) => Err(t.in_callers_ranks(e)),
            Some(Ok(OnNode::Done)) => Ok(()),
            Some(Ok(OnNode::Messages(_))) => {
                let r = self.on(node).ibroadcast(from, data.to_vec())?;
                let out = self.on(node).wait(r)?;
                copy_result(what, data, &out)
            }
        }
    }
}

impl CommView<'_> {
    /// This communicator's two levels, where its ranks span nodes and
    /// some node has several of them (`nodes`: each rank's node, the same
    /// on every rank), and every rank can use them: its node's
    /// communicator has slots, or it is alone there, and collectives in
    /// shared memory are on. `None` otherwise, or where a rank found no
    /// context id free for them (the collectives then stay flat).
    /// Collective.
    pub(super) fn make_levels(&mut self, nodes: &[u32]) -> Result<Option<TwoLevel>> {
        if !super::same_node::spans(nodes) {
            return Ok(None);
        }
        // Every rank runs both splits and the agreement whatever its own
        // split gave (a split that finds no context id free fails alike
        // everywhere, but a rank's own refusal would not), so that the
        // ranks stay in step; any rank without its two says so.
        let node = self.split_shared();
        let leader = matches!(&node, Ok(n) if n.rank() == 0);
        let leaders = self.split(leader.then_some(0), i64::from(self.rank()));
        let made = match (node, leaders) {
            (Ok(node), Ok(leaders)) => Some((node, leaders)),
            (node, leaders) => {
                for e in [node.err(), leaders.err()].into_iter().flatten() {
                    match e {
                        Error::Usage(m) => log::debug!("collectives stay flat: {m}"),
                        e => return Err(e),
                    }
                }
                None
            }
        };
        let places: Arc<[u32]> = super::same_node::leader_places(nodes).into();
        let ready = made.as_ref().is_some_and(|(node, leaders)| {
            // A leader's rank among the leaders is where the others look
            // for its node's roots; checked, since the two were made apart.
            let placed = match leaders {
                Some(l) => places.get(self.rank() as usize) == Some(&l.rank()),
                None => places.len() == self.size() as usize,
            };
            self.world.node_collectives && placed && (node.size() == 1 || node.node.is_some())
        });
        let all = self.allgather(&[u8::from(ready)])?;
        match made {
            Some((node, leaders)) if all.iter().all(|&r| r == 1) => Ok(Some(TwoLevel {
                node,
                leaders,
                places,
                members: self.comm.map(|c| c.members().into()),
                uses: Default::default(),
            })),
            _ => {
                log::debug!("collectives stay flat: not every rank has its node's slots");
                Ok(None)
            }
        }
    }
}
