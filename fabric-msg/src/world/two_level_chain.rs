//! A non-blocking collective in two levels as a chain of its steps on
//! this rank (`two_level_requests.rs` starts them): each step's result
//! handed to the next, node steps through the node's slots, the leaders'
//! step on the fabric, failures passed down. This file names nothing that
//! holds the World, which holds the chains in flight.

use super::collectives::engine::Engine;
use super::collectives::io::Io;
use super::collectives::ops::{Element, Reduction};
use super::collectives::plan::Plan;
use super::collectives::request::{extract, Shape};
use super::collectives::run::Outcome;
use super::comm_handle::TwoLevel;
use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::sync::Arc;

/// A chain in flight, its element type erased.
pub(crate) trait Chained: Send {
    /// The id its request waits on.
    fn id(&self) -> u32;
    /// Take it as far as it goes now: whether it moved, whether it is over.
    fn advance(&mut self, engine: &mut Engine, io: &mut Io<'_>) -> (bool, bool);
}

impl std::fmt::Debug for dyn Chained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "chain #{}", self.id())
    }
}

/// One step of a chain on this rank.
// At most three a call, in a deque made once per call: boxing the plan
// would allocate once more per leader.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Link<T: Element> {
    /// In its node's slots, queued when the chain started: its data is
    /// handed over by `handoff`, its result comes to `outcome`.
    Node {
        handoff: Outcome<T>,
        outcome: Outcome<T>,
        shape: Shape,
    },
    /// Among the node leaders, on the fabric, under the number `seq` taken
    /// when the chain started.
    Leaders {
        seq: u32,
        plan: std::result::Result<Plan, String>,
        reduction: Option<Reduction<T>>,
    },
}

/// One call on this rank: the steps it has left, the one running, what
/// goes on to the next, and where the request finds its result.
pub(crate) struct Chain<T: Element> {
    pub(crate) id: u32,
    pub(crate) what: &'static str,
    pub(crate) t: Arc<TwoLevel>,
    pub(crate) links: VecDeque<Link<T>>,
    /// The step running, its result and shape, and whether it is a node
    /// step.
    pub(crate) running: Option<(Outcome<T>, Shape, bool)>,
    /// What the last step over gave: the caller's data before the first.
    pub(crate) carry: Result<Vec<T>>,
    /// The first failure, which is the chain's.
    pub(crate) failed: Option<Error>,
    /// Elements each node step carries.
    pub(crate) n: usize,
    /// Whether the result stays on this rank (not on a reduce's others).
    pub(crate) keeps: bool,
    /// The request's result.
    pub(crate) out: Outcome<T>,
}

impl<T: Element> Chained for Chain<T> {
    fn id(&self) -> u32 {
        self.id
    }

    fn advance(&mut self, engine: &mut Engine, io: &mut Io<'_>) -> (bool, bool) {
        let mut moved = false;
        loop {
            if let Some((outcome, shape, node)) = &self.running {
                let Some(over) = outcome.lock().take() else {
                    return (moved, false);
                };
                // A node step's failure names ranks of the node's
                // communicator: said in the caller's, as the blocking call does.
                self.carry = match over {
                    Ok(work) => Ok(extract(work, shape)),
                    Err(e) if *node => Err(self.t.in_callers_ranks(e)),
                    Err(e) => Err(e),
                };
                self.running = None;
            }
            let carry = match std::mem::replace(&mut self.carry, Ok(Vec::new())) {
                Ok(v) => Ok(v),
                Err(e) => {
                    let reason = e.to_string();
                    self.failed.get_or_insert(e);
                    Err(reason)
                }
            };
            moved = true;
            match self.links.pop_front() {
                None => {
                    let result = match self.failed.take() {
                        Some(e) => Err(e),
                        None => carry.map_err(Error::Usage).map(|mut v| {
                            if !self.keeps {
                                v.clear();
                            }
                            v
                        }),
                    };
                    *self.out.lock() = Some(result);
                    return (moved, true);
                }
                Some(Link::Node {
                    handoff,
                    outcome,
                    shape,
                }) => {
                    let handed = carry.map_err(Error::Usage).map(|mut v| {
                        // A reduce's other ranks get nothing back from the
                        // step before: the vector's memory, refilled.
                        if v.len() != self.n {
                            v.clear();
                            v.resize(self.n, T::ZERO);
                        }
                        v
                    });
                    *handoff.lock() = Some(handed);
                    self.running = Some((outcome, shape, true));
                }
                Some(Link::Leaders { seq, plan, reduction }) => {
                    // (Only a leader has this step.)
                    let Some(l) = self.t.leaders.as_ref() else {
                        self.carry = carry.map_err(Error::Usage);
                        continue;
                    };
                    // Its plan over the data, started under its number, or
                    // refused with the reason (the step before's failure).
                    let scope = &l.scope;
                    match carry.and_then(|v| plan.and_then(|p| p.work(v).map(|work| (p, work)))) {
                        Ok((p, work)) => {
                            let run = (scope.to_world(p.sched), work, reduction);
                            let id = engine.new_id();
                            let outcome = engine.start_as(io, scope, self.what, run, (id, seq), None);
                            self.running = Some((outcome, p.shape, false));
                        }
                        Err(reason) => {
                            self.carry = Err(engine.refuse(io, scope, (self.what, reason), Some(seq)));
                        }
                    }
                }
            }
        }
    }
}
