//! The rest of the World's collective calls, in the manner of
//! `collective_calls.rs`: scatter(v), alltoall(v), scan and exscan,
//! reduce-scatter with equal blocks, and the non-blocking gather and
//! allgather of equal lengths. Each checks its arguments (refusing a bad
//! one on every rank, so none waits), builds its schedule
//! (`collectives/scatter.rs`, `alltoall.rs`, `scan.rs`, ... explain the
//! algorithms) and starts it; the blocking form waits on the
//! [`Request`] of the non-blocking one.

use super::collectives::ops::{Element, Reduction};
use super::collectives::request::copy_result;
use super::collectives::{plans, scan};
use super::comm::CommView;
use super::request::Request;
use crate::error::Result;

impl CommView<'_> {
    /// Give rank `r` the `n` elements of block `r` of `root`'s `data`
    /// (`size × n` elements on the root; on other ranks `data` is not read
    /// and may be empty). Every rank passes the same `n`; see
    /// [`World::scatterv`](super::World::scatterv) for different lengths.
    ///
    /// ```no_run
    /// let mut world = fabric_msg::World::init()?;
    /// let (rank, size) = (world.rank(), world.size());
    /// let work: Vec<u64> = if rank == 0 { (0..2 * u64::from(size)).collect() } else { vec![] };
    /// let mine = world.scatter(0, &work, 2)?;
    /// assert_eq!(mine, [2 * u64::from(rank), 2 * u64::from(rank) + 1]);
    /// # Ok::<(), fabric_msg::Error>(())
    /// ```
    pub fn scatter<T: Element>(&mut self, root: u32, data: &[T], n: usize) -> Result<Vec<T>> {
        let data = if self.rank() == root {
            data.to_vec()
        } else {
            Vec::new()
        };
        let r = self.iscatter(root, data, n)?;
        self.wait(r)
    }

    /// Start a [`World::scatter`](super::World::scatter); [`World::wait`](super::World::wait) gives this rank's block.
    pub fn iscatter<T: Element>(&mut self, root: u32, data: Vec<T>, n: usize) -> Result<Request<T>> {
        let counts = vec![n; self.size() as usize];
        self.iscatterv(root, data, &counts)
    }

    /// [`World::scatter`](super::World::scatter) with a length per rank: rank `r` gets the
    /// `counts[r]` elements of block `r` (0 allowed; blocks in rank order,
    /// so `data` on the root has the sum of `counts`). Every rank passes
    /// the same `counts`.
    ///
    /// ```no_run
    /// let mut world = fabric_msg::World::init()?;
    /// let (rank, size) = (world.rank(), world.size());
    /// let counts: Vec<usize> = (0..size as usize).collect(); // rank r gets r elements
    /// let rows: Vec<f64> = if rank == 0 { vec![1.5; counts.iter().sum()] } else { vec![] };
    /// let mine = world.scatterv(0, &rows, &counts)?;
    /// assert_eq!(mine.len(), rank as usize);
    /// # Ok::<(), fabric_msg::Error>(())
    /// ```
    pub fn scatterv<T: Element>(&mut self, root: u32, data: &[T], counts: &[usize]) -> Result<Vec<T>> {
        let data = if self.rank() == root {
            data.to_vec()
        } else {
            Vec::new()
        };
        let r = self.iscatterv(root, data, counts)?;
        self.wait(r)
    }

    /// Start a [`World::scatterv`](super::World::scatterv); [`World::wait`](super::World::wait) gives this rank's block.
    pub fn iscatterv<T: Element>(&mut self, root: u32, data: Vec<T>, counts: &[usize]) -> Result<Request<T>> {
        let p = plans::scatterv::<T>(self.rank(), self.size(), root, data.len(), counts);
        self.start_planned("scatter", p, data, None)
    }
}

impl CommView<'_> {
    /// Send block `q` of `data` to rank `q`, for every rank `q`, and
    /// return every rank's block for this one, in rank order. `data` holds
    /// `size` blocks of `n = data.len() / size` elements; every rank passes
    /// the same length (a length that is not a multiple of the world's size
    /// is refused). See [`World::alltoallv`](super::World::alltoallv) for different lengths.
    ///
    /// ```no_run
    /// let mut world = fabric_msg::World::init()?;
    /// let (rank, size) = (world.rank(), world.size());
    /// // Block q says "from rank, for q".
    /// let out: Vec<u32> = (0..size).flat_map(|q| [rank, q]).collect();
    /// let got = world.alltoall(&out)?;
    /// let want: Vec<u32> = (0..size).flat_map(|q| [q, rank]).collect();
    /// assert_eq!(got, want);
    /// # Ok::<(), fabric_msg::Error>(())
    /// ```
    pub fn alltoall<T: Element>(&mut self, data: &[T]) -> Result<Vec<T>> {
        let r = self.ialltoall(data.to_vec())?;
        self.wait(r)
    }

    /// Start a [`World::alltoall`](super::World::alltoall); [`World::wait`](super::World::wait) gives the blocks this
    /// rank receives, in rank order.
    pub fn ialltoall<T: Element>(&mut self, data: Vec<T>) -> Result<Request<T>> {
        let p = plans::alltoall(self.rank(), self.size(), data.len());
        self.start_planned("alltoall", p, data, None)
    }

    /// [`World::alltoall`](super::World::alltoall) with a length per pair: this rank sends the
    /// `send_counts[q]` elements of block `q` of `data` (blocks in rank
    /// order) to rank `q`, and receives `recv_counts[q]` elements from each
    /// rank `q`. Rank `q`'s `recv_counts[r]` must equal rank `r`'s
    /// `send_counts[q]`; where they differ, the receiving rank sees a
    /// message of the wrong length and every rank fails with
    /// [`Error::Collective`](crate::Error::Collective).
    ///
    /// ```no_run
    /// let mut world = fabric_msg::World::init()?;
    /// let (rank, size) = (world.rank() as usize, world.size() as usize);
    /// // Rank r sends q + 1 copies of r to each rank q.
    /// let send: Vec<usize> = (0..size).map(|q| q + 1).collect();
    /// let recv = vec![rank + 1; size];
    /// let data: Vec<u16> = vec![rank as u16; send.iter().sum()];
    /// let got = world.alltoallv(&data, &send, &recv)?;
    /// assert_eq!(got.len(), size * (rank + 1));
    /// # Ok::<(), fabric_msg::Error>(())
    /// ```
    pub fn alltoallv<T: Element>(
        &mut self,
        data: &[T],
        send_counts: &[usize],
        recv_counts: &[usize],
    ) -> Result<Vec<T>> {
        let r = self.ialltoallv(data.to_vec(), send_counts, recv_counts)?;
        self.wait(r)
    }

    /// Start a [`World::alltoallv`](super::World::alltoallv); [`World::wait`](super::World::wait) gives the blocks this
    /// rank receives, in rank order.
    pub fn ialltoallv<T: Element>(
        &mut self,
        data: Vec<T>,
        send_counts: &[usize],
        recv_counts: &[usize],
    ) -> Result<Request<T>> {
        let p = plans::alltoallv(self.rank(), self.size(), data.len(), send_counts, recv_counts);
        self.start_planned("alltoall", p, data, None)
    }
}

impl CommView<'_> {
    /// Inclusive prefix reduction: rank `r`'s `data` becomes
    /// `x0 ⊕ x1 ⊕ … ⊕ xr` element by element, where `xq` is rank `q`'s
    /// `data`, combined in rank order (a custom reduction need be
    /// associative, not commutative). Every rank passes the same length and
    /// reduction.
    ///
    /// ```no_run
    /// use fabric_msg::Op;
    /// let mut world = fabric_msg::World::init()?;
    /// let mut offset = [world.rank() as u64 + 1];
    /// world.scan(&mut offset, Op::Sum)?; // 1, 1 + 2, 1 + 2 + 3, ...
    /// # Ok::<(), fabric_msg::Error>(())
    /// ```
    pub fn scan<T: Element>(&mut self, data: &mut [T], op: impl Into<Reduction<T>>) -> Result<()> {
        let r = self.iscan(data.to_vec(), op)?;
        let out = self.wait(r)?;
        copy_result("scan", data, &out)
    }

    /// Start a [`World::scan`](super::World::scan); [`World::wait`](super::World::wait) gives this rank's prefix.
    pub fn iscan<T: Element>(&mut self, data: Vec<T>, op: impl Into<Reduction<T>>) -> Result<Request<T>> {
        self.start_scan("scan", data, op.into(), scan::Kind::Inclusive)
    }

    /// Exclusive prefix reduction: rank `r > 0` gets
    /// `x0 ⊕ … ⊕ x(r-1)`, the combination of every lower rank's `data` in
    /// rank order; rank 0, which has no lower rank, gets `None` (MPI leaves
    /// its buffer undefined). Every rank passes the same length and
    /// reduction.
    ///
    /// ```no_run
    /// use fabric_msg::Op;
    /// let mut world = fabric_msg::World::init()?;
    /// let mine = vec![7u64; world.rank() as usize % 3]; // this rank's items
    /// // Where this rank's items start in the concatenation of all ranks'.
    /// let start = world.exscan(&[mine.len() as u64], Op::Sum)?.map_or(0, |s| s[0]);
    /// # let _ = start;
    /// # Ok::<(), fabric_msg::Error>(())
    /// ```
    pub fn exscan<T: Element>(&mut self, data: &[T], op: impl Into<Reduction<T>>) -> Result<Option<Vec<T>>> {
        let r = self.iexscan(data.to_vec(), op)?;
        let out = self.wait(r)?;
        Ok((self.rank() != 0).then_some(out))
    }

    /// Start a [`World::exscan`](super::World::exscan); [`World::wait`](super::World::wait) gives this rank's prefix,
    /// and on rank 0 an empty vector.
    pub fn iexscan<T: Element>(&mut self, data: Vec<T>, op: impl Into<Reduction<T>>) -> Result<Request<T>> {
        self.start_scan("exscan", data, op.into(), scan::Kind::Exclusive)
    }

    fn start_scan<T: Element>(
        &mut self,
        what: &'static str,
        data: Vec<T>,
        reduction: Reduction<T>,
        kind: scan::Kind,
    ) -> Result<Request<T>> {
        let p = plans::scan(self.rank(), self.size(), data.len(), kind, &reduction);
        self.start_planned(what, p, data, Some(reduction))
    }
}

impl CommView<'_> {
    /// Combine every rank's `data` element by element with `op`, cut the
    /// result into `size` equal blocks and give rank `r` block `r`
    /// (MPI's reduce_scatter_block). `data.len()` is a multiple of the
    /// world's size; every rank passes the same length and reduction. See
    /// [`World::reduce_scatter`](super::World::reduce_scatter) for blocks of different lengths.
    ///
    /// ```no_run
    /// use fabric_msg::Op;
    /// let mut world = fabric_msg::World::init()?;
    /// let size = world.size() as usize;
    /// let mine = world.reduce_scatter_block(&vec![2i32; 3 * size], Op::Sum)?;
    /// assert_eq!(mine, [2 * size as i32; 3]);
    /// # Ok::<(), fabric_msg::Error>(())
    /// ```
    pub fn reduce_scatter_block<T: Element>(
        &mut self,
        data: &[T],
        op: impl Into<Reduction<T>>,
    ) -> Result<Vec<T>> {
        let r = self.ireduce_scatter_block(data.to_vec(), op)?;
        self.wait(r)
    }

    /// Start a [`World::reduce_scatter_block`](super::World::reduce_scatter_block); [`World::wait`](super::World::wait) gives this
    /// rank's block.
    pub fn ireduce_scatter_block<T: Element>(
        &mut self,
        data: Vec<T>,
        op: impl Into<Reduction<T>>,
    ) -> Result<Request<T>> {
        let reduction = op.into();
        let p = plans::reduce_scatter_block(self.rank(), self.size(), data.len(), &reduction);
        self.start_planned("reduce_scatter", p, data, Some(reduction))
    }
}

impl CommView<'_> {
    /// Start a [`World::gather`](super::World::gather); [`World::wait`](super::World::wait) gives every rank's block
    /// in rank order on `root`, and an empty vector elsewhere.
    ///
    /// ```no_run
    /// let mut world = fabric_msg::World::init()?;
    /// let pending = world.igather(0, vec![world.rank() as f32; 4])?;
    /// // ... compute while it runs ...
    /// let all = world.wait(pending)?;
    /// # let _ = all;
    /// # Ok::<(), fabric_msg::Error>(())
    /// ```
    pub fn igather<T: Element>(&mut self, root: u32, mine: Vec<T>) -> Result<Request<T>> {
        let counts = vec![mine.len(); self.size() as usize];
        self.igatherv(root, mine, &counts)
    }

    /// Start a [`World::allgather`](super::World::allgather); [`World::wait`](super::World::wait) gives every rank's
    /// block in rank order.
    ///
    /// ```no_run
    /// let mut world = fabric_msg::World::init()?;
    /// let pending = world.iallgather(vec![world.rank()])?;
    /// let ranks = world.wait(pending)?;
    /// assert_eq!(ranks, (0..world.size()).collect::<Vec<u32>>());
    /// # Ok::<(), fabric_msg::Error>(())
    /// ```
    pub fn iallgather<T: Element>(&mut self, mine: Vec<T>) -> Result<Request<T>> {
        let counts = vec![mine.len(); self.size() as usize];
        self.iallgatherv(mine, &counts)
    }
}
