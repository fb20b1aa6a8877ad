//! Persistent collectives (MPI-4's `MPI_Allreduce_init` and friends):
//! plan a collective once — its algorithm, its schedule in world ranks,
//! its reduction — and start it many times, each start a [`Request`] like
//! any other.
//!
//! ```no_run
//! use fabric_msg::{Op, World};
//! let mut world = World::init()?;
//! let norm = world.allreduce_init::<f64>(1, Op::Sum)?;
//! let mut v = vec![0.0f64; 1];
//! for step in 0..100 {
//!     v[0] = step as f64;                          // this rank's part
//!     let r = world.start(&norm, v)?;
//!     v = world.wait(r)?;                          // every rank's sum
//! }
//! # Ok::<(), fabric_msg::Error>(())
//! ```
//!
//! What a start saves is the planning: 56 to 141 ns per allreduce (2 to 64
//! ranks, measured in a release build, one million plans each) of a
//! collective that takes 0.6 µs and more; the messages are the same. Every
//! rank plans the same collectives and starts them in the same order as
//! any other collective (each start takes the next collective number of
//! its communicator). A plan holds its communicator's context until it is
//! dropped, as a request does.

use super::collectives::on_node::{Call, Kind, NodeColl};
use super::collectives::ops::{Element, Reduction};
use super::collectives::plan::Plan;
use super::collectives::scope::Scope;
use super::collectives::{plans, scan};
use super::comm::CommView;
use super::comm_handle::TwoLevel;
use super::request::{Of, Request};
use super::state::World;
use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::sync::Arc;

/// A collective planned once, started with [`World::start`] as often as
/// needed.
#[derive(Debug)]
pub struct Persistent<T: Element> {
    what: &'static str,
    /// The schedule (in world ranks), the working array and the result.
    plan: Plan,
    reduction: Option<Reduction<T>>,
    scope: Scope,
    /// Elements every start passes.
    len: usize,
    /// The call as the node's slots check it, for a barrier, allreduce,
    /// broadcast or reduce on a World all on one node or a communicator
    /// with slots of its own, with the communicator's slots (`None`: the
    /// World's): a start goes through them, as the `i…` form does
    /// (`node_requests.rs`).
    slot: Option<(Call, Option<Arc<Mutex<NodeColl>>>)>,
    /// The same call in two levels, where its communicator's blocking
    /// calls run so (`two_level.rs`): a start goes the `i…` form's way
    /// (`two_level_requests.rs`).
    levels: Option<(Call, Arc<TwoLevel>)>,
}

impl<T: Element> Persistent<T> {
    /// `"allreduce"`, `"broadcast"`, `"barrier"`, ...
    pub fn operation(&self) -> &'static str {
        self.what
    }

    /// The elements each start passes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether each start passes no elements (a barrier).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Each `…_init` plans what the non-blocking call of the same name would
/// start, with the same arguments except that the data is a length; a
/// bad argument is an [`Error::Usage`] on this rank (no other rank is
/// waiting yet).
impl CommView<'_> {
    /// Plan an allreduce of `len` elements with `op` (see
    /// [`CommView::iallreduce`]).
    pub fn allreduce_init<T: Element>(
        &mut self,
        len: usize,
        op: impl Into<Reduction<T>>,
    ) -> Result<Persistent<T>> {
        let op = op.into();
        let p = plans::allreduce(self.rank(), self.size(), len, &op);
        let lane = self.slot_lane();
        let slot = Call::new::<T>(Kind::Allreduce, "allreduce", len, 0).reducing(&op);
        self.plan("allreduce", p, Some(op), len)
            .map(|p| p.in_slots(slot, lane))
    }

    /// Plan a reduce of `len` elements to `root` with `op` (see
    /// [`CommView::ireduce`]).
    pub fn reduce_init<T: Element>(
        &mut self,
        root: u32,
        len: usize,
        op: impl Into<Reduction<T>>,
    ) -> Result<Persistent<T>> {
        let op = op.into();
        let p = plans::reduce(self.rank(), self.size(), root, len, &op);
        let lane = self.slot_lane();
        let slot = Call::new::<T>(Kind::Reduce, "reduce", len, root).reducing(&op);
        self.plan("reduce", p, Some(op), len)
            .map(|p| p.in_slots(slot, lane))
    }

    /// Plan a broadcast of `len` elements from `root` (see
    /// [`CommView::ibroadcast`]).
    pub fn broadcast_init<T: Element>(&mut self, root: u32, len: usize) -> Result<Persistent<T>> {
        let p = plans::broadcast::<T>(self.rank(), self.size(), root, len);
        let lane = self.slot_lane();
        let slot = Call::new::<T>(Kind::Broadcast, "broadcast", len, root);
        self.plan("broadcast", p, None, len)
            .map(|p| p.in_slots(slot, lane))
    }

    /// Plan a barrier (see [`CommView::ibarrier`]).
    pub fn barrier_init(&mut self) -> Result<Persistent<u8>> {
        let p = plans::barrier(self.rank(), self.size());
        let lane = self.slot_lane();
        let slot = Call::new::<u8>(Kind::Barrier, "barrier", 0, 0);
        self.plan("barrier", Ok(p), None, 0)
            .map(|p| p.in_slots(slot, lane))
    }

    /// Plan an allgather of `len` elements from every rank (see
    /// [`CommView::iallgather`]).
    pub fn allgather_init<T: Element>(&mut self, len: usize) -> Result<Persistent<T>> {
        let counts = vec![len; self.size() as usize];
        let p = plans::allgatherv::<T>(self.rank(), self.size(), len, &counts);
        self.plan("allgather", p, None, len)
    }

    /// Plan a gather of `len` elements from every rank on `root` (see
    /// [`CommView::igather`]).
    pub fn gather_init<T: Element>(&mut self, root: u32, len: usize) -> Result<Persistent<T>> {
        let counts = vec![len; self.size() as usize];
        let p = plans::gatherv::<T>(self.rank(), self.size(), root, len, &counts);
        self.plan("gather", p, None, len)
    }

    /// Plan a scatter of `n` elements to every rank from `root` (see
    /// [`CommView::iscatter`]): each start passes `size × n` elements on
    /// the root and none elsewhere.
    pub fn scatter_init<T: Element>(&mut self, root: u32, n: usize) -> Result<Persistent<T>> {
        let (rank, size) = (self.rank(), self.size());
        let counts = vec![n; size as usize];
        let len = if rank == root { n * size as usize } else { 0 };
        let p = plans::scatterv::<T>(rank, size, root, len, &counts);
        self.plan("scatter", p, None, len)
    }

    /// Plan an alltoall of `len` elements, `size` equal blocks (see
    /// [`CommView::ialltoall`]).
    pub fn alltoall_init<T: Element>(&mut self, len: usize) -> Result<Persistent<T>> {
        let p = plans::alltoall(self.rank(), self.size(), len);
        self.plan("alltoall", p, None, len)
    }

    /// Plan an inclusive scan of `len` elements with `op` (see
    /// [`CommView::iscan`]).
    pub fn scan_init<T: Element>(
        &mut self,
        len: usize,
        op: impl Into<Reduction<T>>,
    ) -> Result<Persistent<T>> {
        let op = op.into();
        let p = plans::scan(self.rank(), self.size(), len, scan::Kind::Inclusive, &op);
        self.plan("scan", p, Some(op), len)
    }

    /// Plan an exclusive scan of `len` elements with `op` (see
    /// [`CommView::iexscan`]; rank 0's result is empty).
    pub fn exscan_init<T: Element>(
        &mut self,
        len: usize,
        op: impl Into<Reduction<T>>,
    ) -> Result<Persistent<T>> {
        let op = op.into();
        let p = plans::scan(self.rank(), self.size(), len, scan::Kind::Exclusive, &op);
        self.plan("exscan", p, Some(op), len)
    }

    /// Plan a reduce-scatter of `len` elements into `size` equal blocks
    /// (see [`CommView::ireduce_scatter_block`]).
    pub fn reduce_scatter_block_init<T: Element>(
        &mut self,
        len: usize,
        op: impl Into<Reduction<T>>,
    ) -> Result<Persistent<T>> {
        let op = op.into();
        let p = plans::reduce_scatter_block(self.rank(), self.size(), len, &op);
        self.plan("reduce_scatter", p, Some(op), len)
    }

    fn plan<T: Element>(
        &mut self,
        what: &'static str,
        plan: std::result::Result<Plan, String>,
        reduction: Option<Reduction<T>>,
        len: usize,
    ) -> Result<Persistent<T>> {
        let mut plan = plan.map_err(|m| Error::Usage(format!("{what}_init: {m}")))?;
        let scope = self.scope();
        plan.sched = scope.to_world(plan.sched);
        Ok(Persistent {
            what,
            plan,
            reduction,
            scope,
            len,
            slot: None,
            levels: None,
        })
    }
}

impl World {
    /// Start a planned collective with `data` (its planned length; empty
    /// for a barrier): a request whose [`World::wait`] gives the result, as
    /// the `i…` form's would. A wrong length is refused on this rank and
    /// the other ranks are told, as for any collective's bad argument.
    pub fn start<T: Element>(&mut self, p: &Persistent<T>, data: Vec<T>) -> Result<Request<T>> {
        let wrong_length = (data.len() != p.len).then(|| {
            format!(
                "started with {} elements, planned for {}: every start passes the planned length",
                data.len(),
                p.len
            )
        });
        // Where it spans nodes, in two levels, as the `i…` form.
        if let Some((call, t)) = p.levels.as_ref().filter(|(_, t)| t.may_queue()) {
            let check = wrong_length.map_or(Ok(()), Err);
            return self.start_two_level(t, *call, check, data, p.reduction.clone());
        }
        // On a World all on one node or a communicator with slots, through
        // the slots (a wrong length is refused there, so every rank's slots
        // stay in step).
        let data = match &p.slot {
            Some((call, node)) => {
                let check = wrong_length.clone().map_or(Ok(()), Err);
                let plan = || Ok(p.plan.clone());
                let (node, scope) = (node.clone(), p.scope.clone());
                let reduction = p.reduction.as_ref();
                match self.queue_in_slots(node, scope, *call, check, data, reduction, plan, None) {
                    Ok(queued) => return self.started_in_slots(queued),
                    Err(declined) => declined,
                }
            }
            None => data,
        };
        let _call = self.live.call();
        let (engine, mut io) = self.engine_io();
        let work = match wrong_length {
            Some(m) => Err(m),
            None => p.plan.work(data),
        };
        let work = match work {
            Ok(w) => w,
            Err(m) => return Err(engine.refuse(&mut io, &p.scope, (p.what, m), None)),
        };
        let (id, seq, outcome) = engine.start(
            &mut io,
            &p.scope,
            p.what,
            p.plan.sched.clone(),
            work,
            p.reduction.clone(),
        );
        Ok(Request {
            what: p.what,
            of: Of::Run {
                id,
                seq,
                outcome,
                shape: p.plan.shape.clone(),
            },
        })
    }
}

impl<T: Element> Persistent<T> {
    /// This plan with its call in the node's slots, where its
    /// communicator has slots (`lane`, from [`CommView::slot_lane`]), or
    /// in two levels, where it spans nodes (`levels`).
    fn in_slots(mut self, call: Call, (lane, levels): Lane) -> Persistent<T> {
        self.slot = lane.map(|node| (call, node));
        self.levels = levels.map(|t| (call, t));
        self
    }
}

/// Where a persistent call of a communicator goes: its slots
/// ([`CommView::slot_lane`]), and its two levels where it has them.
type Lane = (Option<Option<Arc<Mutex<NodeColl>>>>, Option<Arc<TwoLevel>>);

impl CommView<'_> {
    /// The slots a persistent call of this communicator goes through:
    /// `Some(None)` the World's (where it is all on one node: a start
    /// finds out), `Some(Some(..))` the communicator's own, `None` none
    /// (its calls are message schedules).
    fn slot_lane(&self) -> Lane {
        let lane = match self.comm {
            None => Some(None),
            Some(c) => c.node.clone().map(Some),
        };
        (lane, self.levels())
    }
}
