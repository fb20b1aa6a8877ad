//! Reductions of the application's own structs: [`CommView::allreduce_with`]
//! and [`CommView::reduce_with`] combine slices of any
//! [`bytemuck::Pod`] struct with the application's function (MPI's user
//! operations on derived datatypes; `MINLOC` is the classic use).
//!
//! ```no_run
//! use bytemuck::{Pod, Zeroable};
//! use fabric_msg::World;
//!
//! /// The smallest value and the rank that has it.
//! #[derive(Clone, Copy, Pod, Zeroable)]
//! #[repr(C)]
//! struct MinLoc {
//!     value: f64,
//!     rank: u64,
//! }
//!
//! let mut world = World::init()?;
//! let mut m = [MinLoc { value: 1.0 / (1.0 + world.rank() as f64), rank: world.rank() as u64 }];
//! world.allreduce_with(&mut m, |acc: &mut MinLoc, other: &MinLoc| {
//!     if (other.value, other.rank) < (acc.value, acc.rank) {
//!         *acc = *other;
//!     }
//! })?;
//! # Ok::<(), fabric_msg::Error>(())
//! ```
//!
//! Why `Pod`: a struct goes over the fabric as its bytes, and reading a
//! struct's bytes is sound only if it has no padding and every bit pattern
//! is a value; `Pod` (derived, so checked by the compiler) is the promise of
//! exactly that, and the one the ecosystem uses. The function must be
//! associative and commutative, as for [`Reduction::custom`](crate::Reduction::custom),
//! and the same on every rank.
//!
//! How: the structs travel as bytes through the same engine, and are
//! always combined as whole vectors — recursive doubling for the
//! allreduce, the binomial tree for the reduce — because the ring and the
//! reduce-scatter split a vector into blocks of bytes that could cut a
//! struct in two. So a long vector of structs moves ⌈log2 size⌉ times its
//! length instead of about twice; reductions of long vectors of numbers
//! belong in the element forms.

use super::collectives::ops::Reduction;
use super::collectives::request::{check_root, copy_result, Shape};
use super::collectives::{allreduce, reduce};
use super::comm::CommView;
use crate::error::{Error, Result};
use bytemuck::Pod;

impl CommView<'_> {
    /// Combine every rank's `data` struct by struct with `f` (`f(acc,
    /// other)` makes `acc` the combination), every rank getting the
    /// result. Every rank passes as many structs of the same type.
    pub fn allreduce_with<S: Pod>(
        &mut self,
        data: &mut [S],
        f: impl Fn(&mut S, &S) + Send + Sync + 'static,
    ) -> Result<()> {
        let reduction = records("allreduce_with", f)?;
        let bytes: Vec<u8> = bytemuck::cast_slice(data).to_vec();
        let s = allreduce::schedule(
            self.rank(),
            self.size(),
            bytes.len(),
            allreduce::Algorithm::RecursiveDoubling,
        );
        let r = self.start_run("allreduce_with", s, bytes, Some(reduction), Shape::Whole)?;
        let out = self.world.wait(r)?;
        copy_result("allreduce_with", bytemuck::cast_slice_mut(data), &out)
    }

    /// [`CommView::allreduce_with`] whose result only `root` gets (in
    /// `data`; the others' `data` is left as it was).
    pub fn reduce_with<S: Pod>(
        &mut self,
        root: u32,
        data: &mut [S],
        f: impl Fn(&mut S, &S) + Send + Sync + 'static,
    ) -> Result<()> {
        let reduction = records("reduce_with", f)?;
        let (rank, size) = (self.rank(), self.size());
        if let Err(m) = check_root(root, size) {
            return Err(self.refuse("reduce_with", m));
        }
        let bytes: Vec<u8> = bytemuck::cast_slice(data).to_vec();
        let s = reduce::schedule(rank, size, root, bytes.len(), reduce::Algorithm::Binomial);
        let shape = if rank == root {
            Shape::Whole
        } else {
            Shape::Pieces(vec![])
        };
        let r = self.start_run("reduce_with", s, bytes, Some(reduction), shape)?;
        let out = self.world.wait(r)?;
        if rank == root {
            copy_result("reduce_with", bytemuck::cast_slice_mut(data), &out)?;
        }
        Ok(())
    }
}

/// A byte reduction that combines whole structs of `S` with `f`.
fn records<S: Pod>(
    what: &'static str,
    f: impl Fn(&mut S, &S) + Send + Sync + 'static,
) -> Result<Reduction<u8>> {
    let size = std::mem::size_of::<S>();
    if size == 0 {
        return Err(Error::Usage(format!(
            "{what}: {} has no bytes: there is nothing to reduce",
            std::any::type_name::<S>()
        )));
    }
    Ok(Reduction::custom(move |acc: &mut [u8], other: &[u8]| {
        for (a, o) in acc.chunks_exact_mut(size).zip(other.chunks_exact(size)) {
            let mut x: S = bytemuck::pod_read_unaligned(a);
            let y: S = bytemuck::pod_read_unaligned(o);
            f(&mut x, &y);
            a.copy_from_slice(bytemuck::bytes_of(&x));
        }
    }))
}
