//! A rank's part of a collective together with where its input goes: the
//! schedule, the length of its working array, which stretches of the
//! caller's data are copied where in that array before the first round,
//! and which parts of the array are the result. The collectives whose
//! input is not simply the working array (scatter, alltoall, scan) build
//! one of these.

use super::ops::Element;
use super::request::Shape;
use super::schedule::Schedule;

/// `len` elements of the caller's data from `from` go to `to` in the
/// working array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Place {
    pub from: usize,
    pub to: usize,
    pub len: usize,
}

/// One rank's schedule, working array and result.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub sched: Schedule,
    /// Elements in the working array.
    pub len: usize,
    /// Where the caller's data goes (the rest of the array starts as zeros).
    pub places: Vec<Place>,
    pub shape: Shape,
}

impl Plan {
    /// The working array for the caller's `data`, or why `data` is too
    /// short for the places (the calls check lengths first, so this only
    /// guards against a schedule's mistake).
    pub(crate) fn work<T: Element>(&self, data: &[T]) -> Result<Vec<T>, String> {
        let mut work = vec![T::ZERO; self.len];
        for p in &self.places {
            let src = data.get(p.from..p.from + p.len);
            let dst = work.get_mut(p.to..p.to + p.len);
            match (src, dst) {
                (Some(s), Some(d)) => d.copy_from_slice(s),
                _ => {
                    return Err(format!(
                        "{} elements at {} of {} do not fit a working array of {} at {}",
                        p.len,
                        p.from,
                        data.len(),
                        self.len,
                        p.to
                    ))
                }
            }
        }
        Ok(work)
    }
}
