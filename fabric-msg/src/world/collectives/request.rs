//! What the collective calls share: the shape of a result within a run's
//! working array, and the checks of roots and counts. The request a
//! non-blocking collective returns is the World's (`world/request.rs`).

use super::ops::Element;
use crate::error::{Error, Result};

/// Which parts of a run's working array make the result, in order.
#[derive(Debug, Clone)]
pub(crate) enum Shape {
    /// All of it.
    Whole,
    /// These `(at, len)` blocks, concatenated.
    Pieces(Vec<(usize, usize)>),
}

/// The result of a run from its working array.
pub(crate) fn extract<T: Element>(work: Vec<T>, shape: &Shape) -> Vec<T> {
    match shape {
        Shape::Whole => work,
        Shape::Pieces(pieces) => {
            let mut out = Vec::with_capacity(pieces.iter().map(|p| p.1).sum());
            for &(at, len) in pieces {
                out.extend_from_slice(work.get(at..at + len).unwrap_or_default());
            }
            out
        }
    }
}

/// Copy a result into the caller's slice, refusing a length that differs
/// (which the algorithms never produce).
pub(crate) fn copy_result<T: Copy>(what: &str, dst: &mut [T], src: &[T]) -> Result<()> {
    if dst.len() != src.len() {
        return Err(Error::Usage(format!(
            "{what}: a result of {} elements for a slice of {}",
            src.len(),
            dst.len()
        )));
    }
    dst.copy_from_slice(src);
    Ok(())
}

/// The rank `root` if it is in a world of `size`, or why not.
pub(crate) fn check_root(root: u32, size: u32) -> Result<(), String> {
    if root < size {
        Ok(())
    } else {
        Err(format!("root {root} is not in this world of {size} ranks"))
    }
}

/// `counts` has one entry per rank and this rank's is `mine`; or why not.
pub(crate) fn check_counts(counts: &[usize], size: u32, rank: u32, mine: usize) -> Result<(), String> {
    if counts.len() != size as usize {
        return Err(format!(
            "{} counts for a world of {size} ranks: give one per rank",
            counts.len()
        ));
    }
    if counts[rank as usize] != mine {
        return Err(format!(
            "counts[{rank}] is {} but this rank contributes {mine} elements",
            counts[rank as usize]
        ));
    }
    Ok(())
}
