//! [`Record`]: the application's own structs as message and collective
//! elements, and [`Reduction::records`], a reduction by a function on
//! whole structs (MPI's derived datatypes with user operations; `MINLOC`
//! is the classic use).
//!
//! ```no_run
//! use bytemuck::{Pod, Zeroable};
//! use fabric_msg::{Record, Reduction, World};
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
//! let mine = MinLoc { value: 1.0 / (1.0 + world.rank() as f64), rank: world.rank() as u64 };
//! let pending = world.iallreduce(
//!     vec![Record(mine)],
//!     Reduction::records(|acc: &mut MinLoc, other: &MinLoc| {
//!         if (other.value, other.rank) < (acc.value, acc.rank) {
//!             *acc = *other;
//!         }
//!     }),
//! )?;
//! // ... compute while it runs ...
//! let Record(least) = world.wait(pending)?[0];
//! # let _ = least;
//! # Ok::<(), fabric_msg::Error>(())
//! ```
//!
//! A `Vec<Record<S>>` is every collective's and typed message's element
//! vector like a `Vec<f64>`: sends and receives, gathers, alltoalls,
//! persistent plans, and reductions and scans with a function. The
//! built-in [`Op`](crate::Op)s have no meaning for a struct and are refused with
//! [`Error::Usage`](crate::Error::Usage).
//!
//! Why `bytemuck::Pod`: a struct goes over the fabric as its bytes, and
//! reading a struct's bytes is sound only if it has no padding and every
//! bit pattern is a value; `Pod` (derived, so checked by the compiler) is
//! the promise of exactly that, and the one the ecosystem uses. `Debug`
//! and `PartialEq` are asked because every element has them. Records
//! travel in the machine's byte order, as numbers do.
//!
//! The schedules count in elements, so a ring or a reduce-scatter cuts a
//! vector of records between records, never through one: long vectors of
//! records reduce with the same algorithms as numbers.

use super::collectives::ops::sealed::Sealed;
use super::collectives::ops::{Element, Op, Reduction};
use bytemuck::Pod;
use std::fmt;

/// One of the application's `Pod` structs as an [`Element`] (see the
/// module's documentation): `Record(s)` to send or reduce it, `.0` (or a
/// `Record(s)` pattern) to take it out.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
#[repr(transparent)]
pub struct Record<S>(pub S);

impl<S: Pod + fmt::Debug + PartialEq + Send + Sync> Sealed for Record<S> {
    const SIZE: usize = std::mem::size_of::<S>();
    const NAME: &'static str = "a Record";
    const INTEGER: bool = false;
    const OPS: bool = false;
    // SAFETY: `S: Pod` implies `Zeroable`: all-zero bytes are a value of `S`.
    const ZERO: Self = Record(unsafe { std::mem::zeroed::<S>() });

    fn write(src: &[Self], dst: &mut [u8]) {
        let bytes: &[u8] = bytemuck::cast_slice(as_structs(src));
        let n = bytes.len().min(dst.len());
        dst[..n].copy_from_slice(&bytes[..n]);
    }

    fn read(src: &[u8], dst: &mut [Self]) {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(as_structs_mut(dst));
        let n = bytes.len().min(src.len());
        bytes[..n].copy_from_slice(&src[..n]);
    }

    /// Never called: `Reduction::check` refuses every `Op` on records
    /// before a collective starts.
    fn combine(_: Op, _: &mut [Self], _: &[u8], _: bool) {}
}

impl<S: Pod + fmt::Debug + PartialEq + Send + Sync> Element for Record<S> {}

impl<S> Record<S> {
    /// `structs` as records, in place (no copy, no allocation).
    pub fn wrap_vec(structs: Vec<S>) -> Vec<Record<S>> {
        // `Record` is `repr(transparent)`, so the standard library reuses
        // the vector's memory for the mapped one.
        structs.into_iter().map(Record).collect()
    }

    /// `records` as the structs they hold, in place.
    pub fn unwrap_vec(records: Vec<Record<S>>) -> Vec<S> {
        records.into_iter().map(|r| r.0).collect()
    }
}

/// `&[Record<S>]` as `&[S]` (the same memory: `Record` is transparent).
fn as_structs<S: Pod>(r: &[Record<S>]) -> &[S] {
    // SAFETY: `Record<S>` is `repr(transparent)` over `S`: the same size,
    // alignment and bits, so a slice of one is a slice of the other, with
    // the same length and lifetime.
    unsafe { std::slice::from_raw_parts(r.as_ptr().cast::<S>(), r.len()) }
}

/// `&mut [Record<S>]` as `&mut [S]`.
fn as_structs_mut<S: Pod>(r: &mut [Record<S>]) -> &mut [S] {
    // SAFETY: as in `as_structs`, borrowed exclusively.
    unsafe { std::slice::from_raw_parts_mut(r.as_mut_ptr().cast::<S>(), r.len()) }
}

impl<S: Pod + fmt::Debug + PartialEq + Send + Sync> Reduction<Record<S>> {
    /// A reduction of records by `f` on one struct at a time: `f(acc,
    /// other)` makes `acc` the combination. It must be associative and
    /// commutative (associative only for a scan), and the same on every
    /// rank, as for [`Reduction::custom`].
    pub fn records(f: impl Fn(&mut S, &S) + Send + Sync + 'static) -> Reduction<Record<S>> {
        Reduction::custom(move |acc: &mut [Record<S>], other: &[Record<S>]| {
            for (a, o) in acc.iter_mut().zip(other) {
                f(&mut a.0, &o.0);
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytemuck::Zeroable;

    #[derive(Clone, Copy, Debug, PartialEq, Pod, Zeroable)]
    #[repr(C)]
    struct MinLoc {
        value: f64,
        rank: u64,
    }

    fn least() -> Reduction<Record<MinLoc>> {
        Reduction::records(|a: &mut MinLoc, o: &MinLoc| {
            if (o.value, o.rank) < (a.value, a.rank) {
                *a = *o;
            }
        })
    }

    #[test]
    fn records_go_to_bytes_and_back_whole() {
        let v = [
            Record(MinLoc { value: 2.5, rank: 7 }),
            Record(MinLoc { value: -1.0, rank: 3 }),
        ];
        let mut bytes = vec![0u8; 2 * <Record<MinLoc> as Sealed>::SIZE];
        Record::write(&v, &mut bytes);
        let mut back = [Record::<MinLoc>::ZERO; 2];
        Record::read(&bytes, &mut back);
        assert_eq!(back, v);
        assert_eq!(Record::<MinLoc>::ZERO, Record(MinLoc::zeroed()));
    }

    #[test]
    fn a_record_reduction_combines_struct_by_struct_in_either_order() {
        let r = least();
        let a = [
            Record(MinLoc { value: 1.0, rank: 0 }),
            Record(MinLoc { value: 5.0, rank: 0 }),
        ];
        let b = [
            Record(MinLoc { value: 1.0, rank: 4 }),
            Record(MinLoc { value: 2.0, rank: 4 }),
        ];
        let mut bytes = vec![0u8; 2 * <Record<MinLoc> as Sealed>::SIZE];
        Record::write(&b, &mut bytes);
        for other_first in [false, true] {
            let mut acc = a;
            r.combine_bytes(&mut acc, &bytes, other_first, &mut Vec::new());
            assert_eq!(acc, [a[0], b[1]], "other_first {other_first}");
        }
    }

    #[test]
    fn built_in_ops_on_records_are_refused_with_what_to_do() {
        let e = Reduction::<Record<MinLoc>>::Op(Op::Sum).check().unwrap_err();
        assert!(e.contains("Sum") && e.contains("Reduction::records"), "{e}");
        assert!(least().check().is_ok());
    }

    #[test]
    fn wrapping_a_vector_keeps_its_memory() {
        let v = vec![MinLoc { value: 0.5, rank: 1 }; 100];
        let at = v.as_ptr() as usize;
        let r = Record::wrap_vec(v);
        assert_eq!(r.as_ptr() as usize, at);
        let back = Record::unwrap_vec(r);
        assert_eq!(back.as_ptr() as usize, at);
        assert_eq!(back[99], MinLoc { value: 0.5, rank: 1 });
    }
}
