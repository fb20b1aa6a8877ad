//! Reductions and scans of slices of the application's own structs, in
//! place: [`CommView::allreduce_with`], [`CommView::reduce_with`],
//! [`CommView::scan_with`] and [`CommView::exscan_with`] combine any
//! [`bytemuck::Pod`] struct with the application's function (MPI's user
//! operations on derived datatypes; `MINLOC` is the classic use). They
//! are the blocking forms of the element calls on [`Record`]s with
//! [`Reduction::records`], which the non-blocking and persistent forms
//! use directly (see `record.rs`).
//!
//! ```no_run
//! use bytemuck::{Pod, Zeroable};
//! use fabric_msg::World;
//!
//! /// The smallest value and the rank that has it.
//! #[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
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
//! The function must be associative and commutative (associative only
//! for the scans, which combine in rank order), and the same on every
//! rank. The structs are combined whole; the algorithms are those of the
//! numbers (a long vector of structs goes round a ring, cut between
//! structs).

use super::collectives::ops::Reduction;
use super::collectives::request::copy_result;
use super::comm::CommView;
use super::record::Record;
use crate::error::Result;
use bytemuck::Pod;
use std::fmt::Debug;

impl CommView<'_> {
    /// Combine every rank's `data` struct by struct with `f` (`f(acc,
    /// other)` makes `acc` the combination), every rank getting the
    /// result. Every rank passes as many structs of the same type.
    pub fn allreduce_with<S: Pod + Debug + PartialEq + Send + Sync>(
        &mut self,
        data: &mut [S],
        f: impl Fn(&mut S, &S) + Send + Sync + 'static,
    ) -> Result<()> {
        let r = self.iallreduce(records(data), Reduction::records(f))?;
        let out = self.wait(r)?;
        copy_result("allreduce_with", data, &Record::unwrap_vec(out))
    }

    /// [`CommView::allreduce_with`] whose result only `root` gets (in
    /// `data`; the others' `data` is left as it was).
    pub fn reduce_with<S: Pod + Debug + PartialEq + Send + Sync>(
        &mut self,
        root: u32,
        data: &mut [S],
        f: impl Fn(&mut S, &S) + Send + Sync + 'static,
    ) -> Result<()> {
        let r = self.ireduce(root, records(data), Reduction::records(f))?;
        let out = self.wait(r)?;
        if self.rank() == root {
            copy_result("reduce_with", data, &Record::unwrap_vec(out))?;
        }
        Ok(())
    }

    /// Inclusive prefix combination of structs (see
    /// [`CommView::scan`]): rank `r`'s `data` becomes `x0 ⊕ … ⊕ xr`, struct
    /// by struct, combined in rank order with `f(acc, other)`, where
    /// `acc` holds the lower ranks' part.
    pub fn scan_with<S: Pod + Debug + PartialEq + Send + Sync>(
        &mut self,
        data: &mut [S],
        f: impl Fn(&mut S, &S) + Send + Sync + 'static,
    ) -> Result<()> {
        let r = self.iscan(records(data), Reduction::records(f))?;
        let out = self.wait(r)?;
        copy_result("scan_with", data, &Record::unwrap_vec(out))
    }

    /// Exclusive prefix combination of structs (see
    /// [`CommView::exscan`]): rank `r > 0` gets `x0 ⊕ … ⊕ x(r-1)`; rank 0
    /// gets `None`.
    pub fn exscan_with<S: Pod + Debug + PartialEq + Send + Sync>(
        &mut self,
        data: &[S],
        f: impl Fn(&mut S, &S) + Send + Sync + 'static,
    ) -> Result<Option<Vec<S>>> {
        let r = self.iexscan(records(data), Reduction::records(f))?;
        let out = self.wait(r)?;
        Ok((self.rank() != 0).then(|| Record::unwrap_vec(out)))
    }
}

/// A copy of `data` as records.
fn records<S: Copy>(data: &[S]) -> Vec<Record<S>> {
    data.iter().copied().map(Record).collect()
}
