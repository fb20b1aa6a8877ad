//! Atomics this process applies with its own CPU: fabric-msg's emulated
//! atomics at their target (`am_wire.rs`) and same-node atomics on mapped
//! symmetric memory (`world/node_symmetric.rs`). Both go through
//! [`apply_word`] (`Atomic::apply_to` in `rma.rs`), so every operation on a word is one of the CPU's
//! atomic instructions, SeqCst: one total order for every operation on
//! the word, whoever applies it.

use crate::discovery::atomic::AtomicKind;
use std::sync::atomic::{AtomicU64, Ordering};

/// `kind` with `operand` (and `compare`) applied to `w`; its value before.
pub(crate) fn apply_word(w: &AtomicU64, kind: AtomicKind, operand: u64, compare: u64) -> u64 {
    let o = Ordering::SeqCst;
    match kind {
        AtomicKind::Add | AtomicKind::FetchAdd => w.fetch_add(operand, o),
        AtomicKind::Swap => w.swap(operand, o),
        AtomicKind::CompareSwap => match w.compare_exchange(compare, operand, o, o) {
            Ok(v) | Err(v) => v,
        },
        AtomicKind::FetchMin => w.fetch_min(operand, o),
        AtomicKind::FetchMax => w.fetch_max(operand, o),
        AtomicKind::Read => w.load(o),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::event_loop::rma::Atomic;

    #[test]
    fn each_operation_returns_the_old_value_and_leaves_the_new() {
        let w = AtomicU64::new(10);
        assert_eq!(Atomic::FetchAdd(5).apply_to(&w), 10);
        assert_eq!(Atomic::Add(1).apply_to(&w), 15);
        assert_eq!(Atomic::Swap(3).apply_to(&w), 16);
        assert_eq!(Atomic::CompareSwap { expected: 4, new: 9 }.apply_to(&w), 3);
        assert_eq!(w.load(Ordering::Relaxed), 3, "a failed compare leaves the word");
        assert_eq!(Atomic::CompareSwap { expected: 3, new: 9 }.apply_to(&w), 3);
        assert_eq!(Atomic::FetchMin(2).apply_to(&w), 9);
        assert_eq!(Atomic::FetchMax(7).apply_to(&w), 2);
        assert_eq!(Atomic::Read.apply_to(&w), 7);
    }
}
