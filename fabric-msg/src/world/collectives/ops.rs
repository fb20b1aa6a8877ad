//! What collectives carry and how they combine it: the [`Element`] types
//! (the primitive integers and floats), the built-in reduction [`Op`]s, and
//! [`Reduction`], which is either an `Op` or the application's own function.
//!
//! Elements travel in the machine's native byte order: every rank of a world
//! must run on the same architecture (the World checks that every rank runs
//! the same provider, not the same CPU).

use std::fmt;
use std::sync::Arc;

/// A built-in reduction.
///
/// Integers wrap on overflow (`Sum`, `Prod`), so every rank computes the same
/// value whatever the order. On floats, `Min` and `Max` follow
/// [`f64::min`]/[`f64::max`]: a NaN loses to a number. The bitwise ops are
/// for integers only; asking for one on floats is an [`Error::Usage`](crate::Error::Usage).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// `a + b` (wrapping on integers).
    Sum,
    /// `a * b` (wrapping on integers).
    Prod,
    /// The smaller.
    Min,
    /// The larger.
    Max,
    /// `a & b` (integers only).
    BitAnd,
    /// `a | b` (integers only).
    BitOr,
    /// `a ^ b` (integers only).
    BitXor,
}

impl Op {
    /// Every built-in op, for tests and tools.
    pub const ALL: [Op; 7] = [
        Op::Sum,
        Op::Prod,
        Op::Min,
        Op::Max,
        Op::BitAnd,
        Op::BitOr,
        Op::BitXor,
    ];

    /// Whether the op is one of the bitwise ones.
    pub fn is_bitwise(self) -> bool {
        matches!(self, Op::BitAnd | Op::BitOr | Op::BitXor)
    }
}

/// The application's own combining function: `f(acc, other)` must set every
/// `acc[i]` to `acc[i] ⊕ other[i]` for an associative and commutative `⊕`.
/// Both slices have the same length (possibly 0).
pub type CombineFn<T> = dyn Fn(&mut [T], &[T]) + Send + Sync;

/// How a reduction combines contributions: a built-in [`Op`] or a function.
///
/// ```
/// use fabric_msg::{Op, Reduction};
/// let sum: Reduction<f64> = Op::Sum.into();
/// let sum_of_squares_style = Reduction::custom(|acc: &mut [f64], other: &[f64]| {
///     for (a, b) in acc.iter_mut().zip(other) {
///         *a = a.hypot(*b);
///     }
/// });
/// # let _ = (sum, sum_of_squares_style);
/// ```
///
/// Every rank must pass the same reduction. A custom function must be
/// associative and commutative: the algorithms combine in tree and ring
/// orders, not in rank order. Each result element is computed in one
/// deterministic order, and ranks receive the same bits, whenever `⊕`
/// gives the same bits for `a ⊕ b` and `b ⊕ a` (true of the built-in ops).
pub enum Reduction<T: Element> {
    /// A built-in op.
    Op(Op),
    /// The application's function.
    Custom(Arc<CombineFn<T>>),
}

impl<T: Element> Reduction<T> {
    /// A reduction by the application's function (see [`CombineFn`]).
    pub fn custom(f: impl Fn(&mut [T], &[T]) + Send + Sync + 'static) -> Reduction<T> {
        Reduction::Custom(Arc::new(f))
    }

    /// `acc ⊕= other`, elements of `other` read from native-endian bytes.
    /// With `other_first`, `acc = other ⊕ acc` instead (the order matters
    /// for bit-identical results, not for the value).
    pub(crate) fn combine_bytes(&self, acc: &mut [T], other: &[u8], other_first: bool, scratch: &mut Vec<T>) {
        match self {
            Reduction::Op(op) => T::combine(*op, acc, other, other_first),
            Reduction::Custom(f) => {
                scratch.clear();
                scratch.resize(acc.len(), T::ZERO);
                T::read(other, scratch);
                if other_first {
                    f(scratch, acc);
                    acc.copy_from_slice(scratch);
                } else {
                    f(acc, scratch);
                }
            }
        }
    }

    /// Refuse a reduction the element type does not have.
    pub(crate) fn check(&self) -> Result<(), String> {
        match self {
            Reduction::Op(op) if !T::OPS => Err(format!(
                "{op:?} has no meaning for {}: combine records with a function (Reduction::records)",
                T::NAME
            )),
            Reduction::Op(op) if op.is_bitwise() && !T::INTEGER => Err(format!(
                "{op:?} is a bitwise op, for integers only; {} is a float type",
                T::NAME
            )),
            _ => Ok(()),
        }
    }
}

impl<T: Element> Clone for Reduction<T> {
    fn clone(&self) -> Self {
        match self {
            Reduction::Op(op) => Reduction::Op(*op),
            Reduction::Custom(f) => Reduction::Custom(f.clone()),
        }
    }
}

impl<T: Element> From<Op> for Reduction<T> {
    fn from(op: Op) -> Self {
        Reduction::Op(op)
    }
}

impl<T: Element> fmt::Debug for Reduction<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reduction::Op(op) => write!(f, "{op:?}"),
            Reduction::Custom(_) => f.write_str("Custom(fn)"),
        }
    }
}

pub(crate) mod sealed {
    /// What the collectives need of an element; implemented in this file
    /// only, so the set of element types stays closed.
    pub trait Sealed: Copy + Send + Sync + 'static {
        /// Bytes per element.
        const SIZE: usize;
        /// The Rust name, for messages.
        const NAME: &'static str;
        /// Whether the bitwise ops apply.
        const INTEGER: bool;
        /// Whether the built-in ops apply at all (not to a `Record`).
        const OPS: bool;
        /// A value to fill scratch space with.
        const ZERO: Self;
        /// `src` as native-endian bytes into `dst` (`dst.len() == src.len() * SIZE`).
        fn write(src: &[Self], dst: &mut [u8]);
        /// Native-endian bytes `src` into `dst` (`src.len() == dst.len() * SIZE`).
        fn read(src: &[u8], dst: &mut [Self]);
        /// `acc[i] = acc[i] op other[i]` (or `other[i] op acc[i]`), `other`
        /// as native-endian bytes of `acc.len()` elements.
        fn combine(op: super::Op, acc: &mut [Self], other: &[u8], other_first: bool);
    }
}

/// The bytes of `s`, in place.
pub(crate) fn bytes_of<T: Element>(s: &[T]) -> &[u8] {
    // SAFETY: `T` is a primitive number or a `Record` of a `Pod` struct
    // (Element is sealed to those): no padding, every byte initialised; the
    // slice covers exactly the elements' memory, borrowed shared for as
    // long as `s` is.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

/// The bytes of `s`, in place, to write into.
pub(crate) fn bytes_of_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `bytes_of`, borrowed exclusively; every bit pattern is
    // a valid primitive number, and a valid `Pod` struct, so any bytes
    // written leave valid elements.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

/// A type messages and collectives carry: `i8`..`i64`, `u8`..`u64`, `f32`
/// and `f64`, which the built-in [`Op`]s reduce, and the application's
/// own structs as [`Record`](crate::Record)s, which functions reduce.
/// Sealed: other types cannot implement it.
pub trait Element: sealed::Sealed + PartialEq + fmt::Debug {}

/// One loop per op, so each can be vectorised.
macro_rules! combine_loop {
    ($t:ty, $acc:expr, $other:expr, $first:expr, |$a:ident, $b:ident| $e:expr) => {{
        let chunks = $other.chunks_exact(<$t as sealed::Sealed>::SIZE);
        if $first {
            for (x, c) in $acc.iter_mut().zip(chunks) {
                let $a = <$t>::from_ne_bytes(c.try_into().unwrap_or_default());
                let $b = *x;
                *x = $e;
            }
        } else {
            for (x, c) in $acc.iter_mut().zip(chunks) {
                let $a = *x;
                let $b = <$t>::from_ne_bytes(c.try_into().unwrap_or_default());
                *x = $e;
            }
        }
    }};
}

/// Native-endian bytes in and out, as one copy: the same bytes
/// `to_ne_bytes`/`from_ne_bytes` give, element by element (which did not
/// vectorise: a 64 KiB message took tens of microseconds to pack).
macro_rules! bytes_io {
    ($t:ty) => {
        fn write(src: &[Self], dst: &mut [u8]) {
            let n = std::mem::size_of_val(src).min(dst.len());
            // SAFETY: `Self` is a primitive number (the trait is sealed to
            // them): no padding, every byte initialised, so its memory may
            // be read as `n` bytes; `n` is within both slices, which cannot
            // overlap (one is borrowed shared, the other exclusively).
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr().cast::<u8>(), dst.as_mut_ptr(), n) }
        }
        fn read(src: &[u8], dst: &mut [Self]) {
            let n = std::mem::size_of_val(dst).min(src.len());
            // SAFETY: every bit pattern is a valid primitive number, so
            // writing any `n` bytes into `dst` leaves valid elements (a
            // trailing partial element keeps its other bytes); `n` is within
            // both slices; a byte copy needs no alignment.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast::<u8>(), n) }
        }
    };
}

macro_rules! integer {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            const NAME: &'static str = stringify!($t);
            const INTEGER: bool = true;
            const OPS: bool = true;
            const ZERO: Self = 0;
            bytes_io!($t);
            fn combine(op: Op, acc: &mut [Self], other: &[u8], first: bool) {
                match op {
                    Op::Sum => combine_loop!($t, acc, other, first, |a, b| a.wrapping_add(b)),
                    Op::Prod => combine_loop!($t, acc, other, first, |a, b| a.wrapping_mul(b)),
                    Op::Min => combine_loop!($t, acc, other, first, |a, b| a.min(b)),
                    Op::Max => combine_loop!($t, acc, other, first, |a, b| a.max(b)),
                    Op::BitAnd => combine_loop!($t, acc, other, first, |a, b| a & b),
                    Op::BitOr => combine_loop!($t, acc, other, first, |a, b| a | b),
                    Op::BitXor => combine_loop!($t, acc, other, first, |a, b| a ^ b),
                }
            }
        }
        impl Element for $t {}
    )*};
}

macro_rules! float {
    ($($t:ty),*) => {$(
        impl sealed::Sealed for $t {
            const SIZE: usize = std::mem::size_of::<$t>();
            const NAME: &'static str = stringify!($t);
            const INTEGER: bool = false;
            const OPS: bool = true;
            const ZERO: Self = 0.0;
            bytes_io!($t);
            fn combine(op: Op, acc: &mut [Self], other: &[u8], first: bool) {
                match op {
                    Op::Sum => combine_loop!($t, acc, other, first, |a, b| a + b),
                    Op::Prod => combine_loop!($t, acc, other, first, |a, b| a * b),
                    Op::Min => combine_loop!($t, acc, other, first, |a, b| a.min(b)),
                    Op::Max => combine_loop!($t, acc, other, first, |a, b| a.max(b)),
                    // Refused before any collective starts (`Reduction::check`).
                    Op::BitAnd | Op::BitOr | Op::BitXor => {}
                }
            }
        }
        impl Element for $t {}
    )*};
}

integer!(i8, i16, i32, i64, u8, u16, u32, u64);
float!(f32, f64);

/// `src` as native-endian bytes (a new vector).
#[cfg(test)]
pub(crate) fn to_bytes<T: Element>(src: &[T]) -> Vec<u8> {
    let mut v = vec![0u8; src.len() * T::SIZE];
    T::write(src, &mut v);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reduce<T: Element>(r: &Reduction<T>, a: &[T], b: &[T], other_first: bool) -> Vec<T> {
        let mut acc = a.to_vec();
        r.combine_bytes(&mut acc, &to_bytes(b), other_first, &mut Vec::new());
        acc
    }

    #[test]
    fn integer_ops_match_their_definitions_and_wrap() {
        let (a, b) = ([250u8, 3, 0b1100], [10u8, 7, 0b1010]);
        let r = |op: Op| reduce(&Reduction::Op(op), &a, &b, false);
        assert_eq!(r(Op::Sum), [4, 10, 0b10110]);
        assert_eq!(r(Op::Prod), [196, 21, 120]);
        assert_eq!(r(Op::Min), [10, 3, 0b1010]);
        assert_eq!(r(Op::Max), [250, 7, 0b1100]);
        assert_eq!(r(Op::BitAnd), [10 & 250, 3, 0b1000]);
        assert_eq!(r(Op::BitOr), [250 | 10, 7, 0b1110]);
        assert_eq!(r(Op::BitXor), [250 ^ 10, 4, 0b0110]);
        let big = reduce(&Reduction::Op(Op::Sum), &[i64::MAX], &[1], true);
        assert_eq!(big, [i64::MIN]);
    }

    #[test]
    fn float_ops_and_the_order_of_operands() {
        let r = Reduction::<f64>::Op(Op::Min);
        assert_eq!(reduce(&r, &[1.5, f64::NAN], &[-2.0, 4.0], false), [-2.0, 4.0]);
        // min(-0, +0) is either zero: other_first decides which one comes out,
        // so partners that agree on the order agree on the bits.
        let m1 = reduce(&r, &[-0.0f64], &[0.0], false)[0].to_bits();
        let m2 = reduce(&r, &[0.0f64], &[-0.0], true)[0].to_bits();
        assert_eq!(m1, m2);
        assert_eq!(reduce(&Reduction::Op(Op::Prod), &[3.0f32], &[0.5], false), [1.5]);
    }

    #[test]
    fn bitwise_ops_on_floats_are_refused_with_the_reason() {
        let e = Reduction::<f32>::Op(Op::BitXor).check().unwrap_err();
        assert!(e.contains("BitXor") && e.contains("f32"), "{e}");
        assert!(Reduction::<u16>::Op(Op::BitXor).check().is_ok());
        assert!(Reduction::<f64>::custom(|_, _| {}).check().is_ok());
    }

    #[test]
    fn custom_functions_see_typed_slices_in_the_order_asked() {
        // A non-commutative function shows which operand came first.
        let r = Reduction::<i32>::custom(|acc, other| {
            for (a, b) in acc.iter_mut().zip(other) {
                *a = *a * 10 + *b;
            }
        });
        assert_eq!(reduce(&r, &[1, 2], &[3, 4], false), [13, 24]);
        assert_eq!(reduce(&r, &[1, 2], &[3, 4], true), [31, 42]);
        assert_eq!(reduce(&r, &[], &[], true), Vec::<i32>::new());
    }

    #[test]
    fn bytes_round_trip_for_every_type() {
        fn rt<T: Element>(v: &[T]) {
            let b = to_bytes(v);
            assert_eq!(b.len(), v.len() * T::SIZE);
            let mut back = vec![T::ZERO; v.len()];
            T::read(&b, &mut back);
            assert_eq!(back, v, "{}", T::NAME);
        }
        rt(&[i8::MIN, -1, 0, i8::MAX]);
        rt(&[i16::MIN, 7]);
        rt(&[i32::MIN, 7]);
        rt(&[i64::MIN, 7]);
        rt(&[u8::MAX, 7]);
        rt(&[u16::MAX, 7]);
        rt(&[u32::MAX, 7]);
        rt(&[u64::MAX, 7]);
        rt(&[f32::MIN_POSITIVE, -0.0]);
        rt(&[f64::MAX, 1e-300]);
    }
}
