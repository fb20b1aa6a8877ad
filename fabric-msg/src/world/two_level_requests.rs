//! The non-blocking `iallreduce`, `ibarrier`, `ireduce` and `ibroadcast`
//! (and the starts of their persistent forms) of a World or communicator
//! whose blocking calls run in two levels (`two_level.rs`): the same three
//! steps, as a chain a rank's turns move on, so that a program with calls
//! in flight (a training loop's gradient buckets) crosses the fabric once
//! a node, as the blocking call does, not as a flat message schedule among
//! every rank.
//!
//! **Numbers first.** Every step that takes a number takes it when the
//! call starts, in the order the blocking call takes them: each node step
//! its slot and its number in the node's communicator (queued in its slots,
//! `node_requests.rs`), a leader its number among the leaders. So calls
//! started in one order are numbered alike on every rank, however far each
//! rank's chains have moved, and a blocking call after them comes after
//! them everywhere (it first finishes the node's queued calls).
//!
//! **Data after.** A node step whose data comes from the step before is
//! queued without it and posted once it is handed over
//! (`Queued::after`); calls queued behind it in the same slots wait, so
//! the slots keep their order. The leaders' step starts, under the number
//! it took, once the step before is over.
//!
//! **Failures** go down the chain as in the blocking call: a step whose
//! step before failed refuses (the leaders' step with
//! [`CommView::refuse_as`], a node step with a refusal in its slot), so
//! every rank downstream fails with the first failure's text, and every
//! number is used on every rank. The chain's result is its first failure.
//!
//! **A request dropped** in flight leaves its chain running to the end:
//! other ranks wait for its parts.

use super::collectives::on_node::{Call, Kind};
use super::collectives::ops::{Element, Reduction};
use super::collectives::plans;
use super::collectives::request::Shape;
use super::collectives::run::Outcome;
use super::comm_handle::TwoLevel;
use super::request::{Of, Request};
use super::state::World;
use super::two_level_chain::{Chain, Link};
use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::sync::Arc;

/// The steps a rank takes, in order (those of the blocking calls in
/// `two_level.rs`).
#[derive(Clone, Copy)]
enum Step {
    /// In the node's slots: this kind, from or to this node rank.
    Node(Kind, u32),
    Leaders,
}

impl World {
    /// Start `call` (its kind, length and root in `t`'s communicator) in
    /// two levels over `data`, where `check` is this rank's argument check:
    /// a request like any other collective's. A failed check fails here at
    /// once, after its refusals went down the chain.
    pub(crate) fn start_two_level<T: Element>(
        &mut self,
        t: &Arc<TwoLevel>,
        call: Call,
        check: std::result::Result<(), String>,
        data: Vec<T>,
        reduction: Option<Reduction<T>>,
    ) -> Result<Request<T>> {
        let _call = self.live.call();
        let (what, n, root) = (call.what, call.n, call.root);
        // Where the root is, whatever this rank's check said (a bad op on
        // one rank must not change its node's steps: the blocking call
        // takes the same ones); a root out of range is on no node.
        let (here, place) = (t.on_my_node(root), t.place_of(root));
        let mut steps = Vec::with_capacity(3);
        let to_leader = match call.kind {
            Kind::Barrier => Kind::Barrier,
            _ => Kind::Reduce,
        };
        match (call.kind, here) {
            (Kind::Allreduce | Kind::Barrier | Kind::Reduce, _) => {
                steps.push(Step::Node(to_leader, 0));
                steps.push(Step::Leaders);
                if call.kind != Kind::Reduce || matches!(here, Some(r) if r != 0) {
                    steps.push(Step::Node(Kind::Broadcast, 0));
                }
            }
            (_, Some(r)) => steps.extend([Step::Node(Kind::Broadcast, r), Step::Leaders]),
            (_, None) => steps.extend([Step::Leaders, Step::Node(Kind::Broadcast, 0)]),
        }
        let (node_rank, node_size) = (t.node.rank(), t.node.size());
        let mut links = VecDeque::with_capacity(steps.len());
        let mut number = None;
        for step in steps {
            match step {
                Step::Node(kind, from) => {
                    // Alone on its node: no node step (as the blocking call).
                    let Some(slots) = t.node.node.clone() else {
                        continue;
                    };
                    let mut c = Call::new::<T>(kind, what, n, from);
                    let r = match kind {
                        Kind::Reduce => reduction.as_ref(),
                        _ => None,
                    };
                    if let Some(r) = r {
                        c = c.reducing(r);
                    }
                    let plan = || match (kind, r) {
                        (Kind::Reduce, Some(r)) => plans::reduce(node_rank, node_size, from, n, r),
                        (Kind::Broadcast, _) => plans::broadcast::<T>(node_rank, node_size, from, n),
                        (Kind::Barrier, _) => Ok(plans::barrier(node_rank, node_size)),
                        _ => Err(format!("{what}: no reduction for its node step")),
                    };
                    let handoff: Outcome<T> = Default::default();
                    let scope = t.node.scope.clone();
                    let Ok(q) = self.queue_in_slots(
                        Some(slots),
                        scope,
                        c,
                        Ok(()),
                        Vec::new(),
                        r,
                        plan,
                        Some(handoff.clone()),
                    ) else {
                        continue;
                    };
                    number.get_or_insert(q.call.seq);
                    links.push_back(Link::Node {
                        handoff,
                        outcome: q.outcome,
                        shape: q.shape,
                    });
                }
                Step::Leaders => {
                    let Some(l) = t.leaders.as_ref() else {
                        continue;
                    };
                    let seq = self.coll.reserve(&l.scope);
                    number.get_or_insert(seq);
                    let (lr, ls) = (l.rank(), l.size());
                    let plan = match (call.kind, place, reduction.as_ref()) {
                        (Kind::Barrier, ..) => Ok(plans::barrier(lr, ls)),
                        (Kind::Allreduce, _, Some(op)) => plans::allreduce(lr, ls, n, op),
                        (Kind::Reduce, Some(p), Some(op)) => plans::reduce(lr, ls, p, n, op),
                        (Kind::Broadcast, Some(p), _) => plans::broadcast::<T>(lr, ls, p, n),
                        _ => Err("no root".to_string()),
                    };
                    let reduction = reduction.clone();
                    links.push_back(Link::Leaders { seq, plan, reduction });
                }
            }
        }
        let refusal = check.as_ref().err().map(|why| {
            Error::Usage(format!(
                "{what} (collective #{}) on rank {}: {why}",
                number.unwrap_or_default(),
                self.rank()
            ))
        });
        let id = self.coll.new_id();
        let out: Outcome<T> = Default::default();
        let chain = Chain {
            id,
            what,
            t: t.clone(),
            links,
            running: None,
            carry: check.map(|()| data).map_err(Error::Usage),
            failed: None,
            n,
            keeps: call.kind != Kind::Reduce || t.rank_of(self.rank()) == Some(root),
            out: out.clone(),
        };
        self.chains.push(Box::new(chain));
        self.two_level_calls += 1;
        self.two_level_requests += 1;
        let moved = self.progress_slot_requests();
        if let Some(e) = refusal {
            return Err(e);
        }
        moved?;
        Ok(Request {
            what,
            of: Of::Run {
                id,
                seq: number.unwrap_or_default(),
                outcome: out,
                shape: Shape::Whole,
            },
        })
    }

    /// Move every chain as far as it goes: whether one moved.
    pub(crate) fn advance_chains(&mut self) -> bool {
        if self.chains.is_empty() {
            return false;
        }
        let mut chains = std::mem::take(&mut self.chains);
        let mut moved = false;
        let (engine, mut io) = self.engine_io();
        chains.retain_mut(|c| {
            let (m, over) = c.advance(engine, &mut io);
            moved |= m;
            !over
        });
        self.chains = chains;
        moved
    }
}
