//! The World's collective calls: each one checks its arguments, builds its
//! schedule (`collectives/<name>.rs`, which also explains the algorithm)
//! and hands it to the engine (`collectives/engine.rs`); the blocking
//! form waits on the [`Request`] the non-blocking one returns.
//!
//! They live here, not beside their schedules, so that the collectives
//! folder never names the [`World`] that holds its engine: schedules and
//! engine are plain parts the World drives.

use super::collectives::on_node::{Call, Kind};
use super::collectives::ops::{Element, Reduction};
use super::collectives::plan::Plan;
use super::collectives::plans;
use super::collectives::request::{check_root, copy_result, Shape};
use super::collectives::schedule::Schedule;
use super::comm::CommView;
use super::node_collectives::OnNode;
use super::request::{Of, Request};
use crate::error::{Error, Result};

impl CommView<'_> {
    /// Every rank's `mine`, in rank order, on every rank
    /// (`size × mine.len()` elements). Every rank passes the same length;
    /// see [`World::allgatherv`](super::World::allgatherv) for different lengths.
    ///
    /// ```no_run
    /// let mut world = fabric_msg::World::init()?;
    /// let ranks = world.allgather(&[world.rank()])?;
    /// assert_eq!(ranks, (0..world.size()).collect::<Vec<u32>>());
    /// # Ok::<(), fabric_msg::Error>(())
    /// ```
    pub fn allgather<T: Element>(&mut self, mine: &[T]) -> Result<Vec<T>> {
        let counts = vec![mine.len(); self.size() as usize];
        let r = self.iallgatherv(mine.to_vec(), &counts)?;
        self.wait(r)
    }

    /// [`World::allgather`](super::World::allgather) with a length per rank: rank `r` contributes
    /// `counts[r]` elements (0 allowed), and every rank passes the same
    /// `counts`.
    pub fn allgatherv<T: Element>(&mut self, mine: &[T], counts: &[usize]) -> Result<Vec<T>> {
        let r = self.iallgatherv(mine.to_vec(), counts)?;
        self.wait(r)
    }

    /// Start a [`World::allgatherv`](super::World::allgatherv); [`World::wait`](super::World::wait) gives its result.
    pub fn iallgatherv<T: Element>(&mut self, mine: Vec<T>, counts: &[usize]) -> Result<Request<T>> {
        let p = plans::allgatherv::<T>(self.rank(), self.size(), mine.len(), counts);
        self.start_planned("allgather", p, mine, None)
    }
}

impl CommView<'_> {
    /// Combine every rank's `data` element by element with `op`, and give
    /// every rank the result in `data` (the same bits on every rank). Every
    /// rank passes the same length and the same reduction.
    ///
    /// ```no_run
    /// use fabric_msg::{Op, Reduction};
    /// let mut world = fabric_msg::World::init()?;
    /// let mut residual = [0.25f64, 4.0];
    /// world.allreduce(&mut residual, Op::Sum)?;
    /// let mut norm = [3.0f64];
    /// world.allreduce(&mut norm, Reduction::custom(|acc: &mut [f64], other: &[f64]| {
    ///     for (a, b) in acc.iter_mut().zip(other) {
    ///         *a = a.hypot(*b);
    ///     }
    /// }))?;
    /// # Ok::<(), fabric_msg::Error>(())
    /// ```
    pub fn allreduce<T: Element>(&mut self, data: &mut [T], op: impl Into<Reduction<T>>) -> Result<()> {
        let op = op.into();
        if let Some(t) = self.levels() {
            return self.world.allreduce_two_level(&t, data, op);
        }
        let call = Call::new::<T>(Kind::Allreduce, "allreduce", data.len(), 0).reducing(&op);
        let seq = match self.on_node(call, op.check(), data, Some(&op)).transpose()? {
            Some(OnNode::Done) => return Ok(()),
            Some(OnNode::Messages(seq)) => Some(seq),
            None => None,
        };
        let r = self.iallreduce_messages(data.to_vec(), op, seq)?;
        let out = self.wait(r)?;
        copy_result("allreduce", data, &out)
    }

    /// Start a [`World::allreduce`](super::World::allreduce) of `data`; [`World::wait`](super::World::wait) gives the
    /// result, in `data`'s own allocation: a buffer can go round a loop of
    /// non-blocking allreduces without allocating (a training loop's
    /// gradient buckets, `examples/src/bin/sgd.rs`).
    pub fn iallreduce<T: Element>(
        &mut self,
        data: Vec<T>,
        op: impl Into<Reduction<T>>,
    ) -> Result<Request<T>> {
        let reduction = op.into();
        let call = Call::new::<T>(Kind::Allreduce, "allreduce", data.len(), 0).reducing(&reduction);
        if let Some(t) = self.queue_levels() {
            let check = reduction.check();
            return self.world.start_two_level(&t, call, check, data, Some(reduction));
        }
        let (rank, size, n) = (self.rank(), self.size(), data.len());
        let plan = || plans::allreduce(rank, size, n, &reduction);
        match self.start_on_node(call, reduction.check(), data, Some(&reduction), plan) {
            Ok(started) => started,
            Err(data) => self.iallreduce_messages(data, reduction, None),
        }
    }

    /// [`CommView::iallreduce`] as a message schedule, under a new number
    /// or `seq` (the blocking call's way on where its data is larger than
    /// a slot: `OnNode::Messages`).
    fn iallreduce_messages<T: Element>(
        &mut self,
        data: Vec<T>,
        reduction: Reduction<T>,
        seq: Option<u32>,
    ) -> Result<Request<T>> {
        let p = plans::allreduce(self.rank(), self.size(), data.len(), &reduction);
        self.start_planned_as("allreduce", p, data, Some(reduction), seq)
    }
}

impl CommView<'_> {
    /// Wait until every rank has called `barrier`.
    ///
    /// ```no_run
    /// let mut world = fabric_msg::World::init()?;
    /// world.barrier()?;
    /// # Ok::<(), fabric_msg::Error>(())
    /// ```
    pub fn barrier(&mut self) -> Result<()> {
        if let Some(t) = self.levels() {
            return self.world.barrier_two_level(&t);
        }
        let call = Call::new::<u8>(Kind::Barrier, "barrier", 0, 0);
        let seq = match self.on_node::<u8>(call, Ok(()), &mut [], None).transpose()? {
            Some(OnNode::Done) => return Ok(()),
            Some(OnNode::Messages(seq)) => Some(seq),
            None => None,
        };
        let r = self.ibarrier_messages(seq)?;
        self.wait(r).map(drop)
    }

    /// Start a barrier; [`World::wait`](super::World::wait) returns (an empty vector) once every
    /// rank has started it.
    pub fn ibarrier(&mut self) -> Result<Request<u8>> {
        let call = Call::new::<u8>(Kind::Barrier, "barrier", 0, 0);
        if let Some(t) = self.queue_levels() {
            return self.world.start_two_level(&t, call, Ok(()), Vec::new(), None);
        }
        let (rank, size) = (self.rank(), self.size());
        let plan = || Ok(plans::barrier(rank, size));
        match self.start_on_node(call, Ok(()), Vec::new(), None, plan) {
            Ok(started) => started,
            Err(_) => self.ibarrier_messages(None),
        }
    }

    /// [`CommView::ibarrier`] as a message schedule (`seq`: as
    /// `iallreduce_messages`).
    fn ibarrier_messages(&mut self, seq: Option<u32>) -> Result<Request<u8>> {
        let p = plans::barrier(self.rank(), self.size());
        self.start_planned_as("barrier", Ok(p), Vec::new(), None, seq)
    }
}

impl CommView<'_> {
    /// Give every rank `root`'s `data`: on the root it is read, on every
    /// other rank overwritten. Every rank passes the same length (a rank
    /// that receives a different length fails with [`Error::Collective`],
    /// and so do the others).
    ///
    /// ```no_run
    /// let mut world = fabric_msg::World::init()?;
    /// let mut params = [0.0f64; 3];
    /// if world.rank() == 0 {
    ///     params = [0.1, 0.01, 1e-6];
    /// }
    /// world.broadcast(0, &mut params)?;
    /// # Ok::<(), fabric_msg::Error>(())
    /// ```
    pub fn broadcast<T: Element>(&mut self, root: u32, data: &mut [T]) -> Result<()> {
        if let Some(t) = self.levels() {
            return self.world.broadcast_two_level(&t, root, data);
        }
        let call = Call::new::<T>(Kind::Broadcast, "broadcast", data.len(), root);
        let check = check_root(root, self.size());
        let seq = match self.on_node(call, check, data, None).transpose()? {
            Some(OnNode::Done) => return Ok(()),
            Some(OnNode::Messages(seq)) => Some(seq),
            None => None,
        };
        let r = self.ibroadcast_messages(root, data.to_vec(), seq)?;
        let out = self.wait(r)?;
        copy_result("broadcast", data, &out)
    }

    /// Start a broadcast of `root`'s `data` (on other ranks only its length
    /// counts); [`World::wait`](super::World::wait) returns root's data on every rank.
    pub fn ibroadcast<T: Element>(&mut self, root: u32, data: Vec<T>) -> Result<Request<T>> {
        let call = Call::new::<T>(Kind::Broadcast, "broadcast", data.len(), root);
        let check = check_root(root, self.size());
        if let Some(t) = self.queue_levels() {
            return self.world.start_two_level(&t, call, check, data, None);
        }
        let (rank, size, n) = (self.rank(), self.size(), data.len());
        let plan = || plans::broadcast::<T>(rank, size, root, n);
        match self.start_on_node(call, check, data, None, plan) {
            Ok(started) => started,
            Err(data) => self.ibroadcast_messages(root, data, None),
        }
    }

    /// [`CommView::ibroadcast`] as a message schedule (`seq`: as
    /// `iallreduce_messages`).
    fn ibroadcast_messages<T: Element>(
        &mut self,
        root: u32,
        data: Vec<T>,
        seq: Option<u32>,
    ) -> Result<Request<T>> {
        let p = plans::broadcast::<T>(self.rank(), self.size(), root, data.len());
        self.start_planned_as("broadcast", p, data, None, seq)
    }
}

impl CommView<'_> {
    /// Collect every rank's `mine` on `root`: there the result is every
    /// rank's block in rank order (`size × mine.len()` elements); elsewhere
    /// it is empty. Every rank passes the same length; see
    /// [`World::gatherv`](super::World::gatherv) for different lengths.
    pub fn gather<T: Element>(&mut self, root: u32, mine: &[T]) -> Result<Vec<T>> {
        let counts = vec![mine.len(); self.size() as usize];
        let r = self.igatherv(root, mine.to_vec(), &counts)?;
        self.wait(r)
    }

    /// [`World::gather`](super::World::gather) with a length per rank: rank `r` contributes
    /// `counts[r]` elements (0 allowed), and every rank passes the same
    /// `counts`.
    ///
    /// ```no_run
    /// let mut world = fabric_msg::World::init()?;
    /// let (rank, size) = (world.rank(), world.size());
    /// let mine: Vec<u32> = vec![rank; rank as usize]; // rank r sends r copies of r
    /// let counts: Vec<usize> = (0..size as usize).collect();
    /// let all = world.gatherv(0, &mine, &counts)?;
    /// if rank == 0 {
    ///     assert_eq!(all.len(), counts.iter().sum::<usize>());
    /// }
    /// # Ok::<(), fabric_msg::Error>(())
    /// ```
    pub fn gatherv<T: Element>(&mut self, root: u32, mine: &[T], counts: &[usize]) -> Result<Vec<T>> {
        let r = self.igatherv(root, mine.to_vec(), counts)?;
        self.wait(r)
    }

    /// Start a [`World::gatherv`](super::World::gatherv); [`World::wait`](super::World::wait) gives its result.
    pub fn igatherv<T: Element>(&mut self, root: u32, mine: Vec<T>, counts: &[usize]) -> Result<Request<T>> {
        let p = plans::gatherv::<T>(self.rank(), self.size(), root, mine.len(), counts);
        self.start_planned("gather", p, mine, None)
    }
}

impl CommView<'_> {
    /// Combine every rank's `data` element by element with `op`; on `root`,
    /// `data` becomes the result, elsewhere it is left as it was. Every
    /// rank passes the same length and the same reduction.
    ///
    /// ```no_run
    /// use fabric_msg::Op;
    /// let mut world = fabric_msg::World::init()?;
    /// let mut worst = [world.rank() as f64 * 0.5];
    /// world.reduce(0, &mut worst, Op::Max)?;
    /// # Ok::<(), fabric_msg::Error>(())
    /// ```
    pub fn reduce<T: Element>(
        &mut self,
        root: u32,
        data: &mut [T],
        op: impl Into<Reduction<T>>,
    ) -> Result<()> {
        let op = op.into();
        if let Some(t) = self.levels() {
            return self.world.reduce_two_level(&t, root, data, op);
        }
        let call = Call::new::<T>(Kind::Reduce, "reduce", data.len(), root).reducing(&op);
        let check = check_root(root, self.size()).and_then(|()| op.check());
        let seq = match self.on_node(call, check, data, Some(&op)).transpose()? {
            Some(OnNode::Done) => return Ok(()),
            Some(OnNode::Messages(seq)) => Some(seq),
            None => None,
        };
        let r = self.ireduce_messages(root, data.to_vec(), op, seq)?;
        let out = self.wait(r)?;
        if self.rank() == root {
            copy_result("reduce", data, &out)?;
        }
        Ok(())
    }

    /// Start a [`World::reduce`](super::World::reduce); [`World::wait`](super::World::wait) gives the result on
    /// `root` and an empty vector elsewhere.
    pub fn ireduce<T: Element>(
        &mut self,
        root: u32,
        data: Vec<T>,
        op: impl Into<Reduction<T>>,
    ) -> Result<Request<T>> {
        let reduction = op.into();
        let call = Call::new::<T>(Kind::Reduce, "reduce", data.len(), root).reducing(&reduction);
        let check = check_root(root, self.size()).and_then(|()| reduction.check());
        if let Some(t) = self.queue_levels() {
            return self.world.start_two_level(&t, call, check, data, Some(reduction));
        }
        let (rank, size, n) = (self.rank(), self.size(), data.len());
        let plan = || plans::reduce(rank, size, root, n, &reduction);
        match self.start_on_node(call, check, data, Some(&reduction), plan) {
            Ok(started) => started,
            Err(data) => self.ireduce_messages(root, data, reduction, None),
        }
    }

    /// [`CommView::ireduce`] as a message schedule (`seq`: as
    /// `iallreduce_messages`).
    fn ireduce_messages<T: Element>(
        &mut self,
        root: u32,
        data: Vec<T>,
        reduction: Reduction<T>,
        seq: Option<u32>,
    ) -> Result<Request<T>> {
        let p = plans::reduce(self.rank(), self.size(), root, data.len(), &reduction);
        self.start_planned_as("reduce", p, data, Some(reduction), seq)
    }
}

impl CommView<'_> {
    /// Combine every rank's `data` element by element with `op`, and give
    /// rank `r` the `counts[r]` elements of block `r` of the result (blocks
    /// in rank order, 0 elements allowed). `data.len()` is the sum of
    /// `counts`; every rank passes the same `counts` and reduction.
    ///
    /// ```no_run
    /// use fabric_msg::Op;
    /// let mut world = fabric_msg::World::init()?;
    /// let size = world.size() as usize;
    /// let counts = vec![2; size];
    /// let mine = world.reduce_scatter(&vec![1u64; 2 * size], &counts, Op::Sum)?;
    /// assert_eq!(mine, [size as u64, size as u64]);
    /// # Ok::<(), fabric_msg::Error>(())
    /// ```
    pub fn reduce_scatter<T: Element>(
        &mut self,
        data: &[T],
        counts: &[usize],
        op: impl Into<Reduction<T>>,
    ) -> Result<Vec<T>> {
        let r = self.ireduce_scatter(data.to_vec(), counts, op)?;
        self.wait(r)
    }

    /// Start a [`World::reduce_scatter`](super::World::reduce_scatter); [`World::wait`](super::World::wait) gives this rank's
    /// block.
    pub fn ireduce_scatter<T: Element>(
        &mut self,
        data: Vec<T>,
        counts: &[usize],
        op: impl Into<Reduction<T>>,
    ) -> Result<Request<T>> {
        let reduction = op.into();
        let p = plans::reduce_scatter(self.rank(), self.size(), data.len(), counts, &reduction);
        self.start_planned("reduce_scatter", p, data, Some(reduction))
    }
}

impl CommView<'_> {
    /// Start a collective of this rank's `sched` (in the communicator's
    /// ranks) over `work`, under the number `seq` a call in the slots took
    /// (`OnNode::Messages`), or a new one.
    fn start_run_as<T: Element>(
        &mut self,
        what: &'static str,
        (sched, work, reduction): (Schedule, Vec<T>, Option<Reduction<T>>),
        shape: Shape,
        seq: Option<u32>,
    ) -> Result<Request<T>> {
        let scope = self.scope();
        let world = &mut *self.world;
        let _call = world.live.call();
        let (engine, mut io) = world.engine_io();
        let sched = scope.to_world(sched);
        let (id, seq, outcome) = match seq {
            None => engine.start(&mut io, &scope, what, sched, work, reduction),
            Some(seq) => {
                let id = engine.new_id();
                let outcome =
                    engine.start_as(&mut io, &scope, what, (sched, work, reduction), (id, seq), None);
                (id, seq, outcome)
            }
        };
        Ok(Request {
            what,
            of: Of::Run {
                id,
                seq,
                outcome,
                shape,
            },
        })
    }

    /// Start the collective `plan` describes over the caller's `data`, or
    /// refuse it on every rank with the reason a check gave.
    pub(crate) fn start_planned<T: Element>(
        &mut self,
        what: &'static str,
        plan: std::result::Result<Plan, String>,
        data: Vec<T>,
        reduction: Option<Reduction<T>>,
    ) -> Result<Request<T>> {
        self.start_planned_as(what, plan, data, reduction, None)
    }

    /// [`CommView::start_planned`] under the number `seq` a call in the
    /// slots took (refused under it too), or a new one.
    fn start_planned_as<T: Element>(
        &mut self,
        what: &'static str,
        plan: std::result::Result<Plan, String>,
        data: Vec<T>,
        reduction: Option<Reduction<T>>,
        seq: Option<u32>,
    ) -> Result<Request<T>> {
        match plan.and_then(|p| p.work(data).map(|work| (p, work))) {
            Ok((p, work)) => self.start_run_as(what, (p.sched, work, reduction), p.shape, seq),
            Err(m) => Err(self.refuse_as(what, m, seq)),
        }
    }

    /// Refuse a collective for a bad argument (`Error::Usage`), telling the
    /// other ranks so that none waits for this one.
    pub(crate) fn refuse(&mut self, what: &'static str, message: String) -> Error {
        self.refuse_as(what, message, None)
    }

    /// [`CommView::refuse`] under the number `seq` taken before, or a new
    /// one.
    pub(crate) fn refuse_as(&mut self, what: &'static str, message: String, seq: Option<u32>) -> Error {
        let scope = self.scope();
        let world = &mut *self.world;
        let _call = world.live.call();
        let (engine, mut io) = world.engine_io();
        engine.refuse(&mut io, &scope, (what, message), seq)
    }

    /// [`World::test`](super::World::test).
    pub fn test<T: Element>(&mut self, req: &Request<T>) -> Result<bool> {
        self.world.test(req)
    }

    /// [`World::wait`](super::World::wait).
    pub fn wait<T: Element>(&mut self, req: Request<T>) -> Result<Vec<T>> {
        self.world.wait(req)
    }
}
