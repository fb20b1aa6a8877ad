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
    /// guards against a schedule's mistake). Where the first place keeps
    /// all of `data` where it is (scan, alltoall, a linear scatter's root),
    /// `data` itself becomes the array, so its elements are not copied
    /// again; the other places are then copies within it.
    pub(crate) fn work<T: Element>(&self, mut data: Vec<T>) -> Result<Vec<T>, String> {
        let keep = self
            .places
            .first()
            .is_some_and(|p| p.from == 0 && p.to == 0 && p.len == data.len() && p.len <= self.len);
        if keep {
            let end = data.len();
            data.resize(self.len, T::ZERO);
            for p in &self.places[1..] {
                let fits = p.from + p.len <= end && p.to + p.len <= self.len;
                let overlaps = p.len > 0 && p.to < p.from + p.len && p.from < p.to + p.len;
                if !fits || (overlaps && p.from != p.to) {
                    return Err(self.misfit(p, end));
                }
                data.copy_within(p.from..p.from + p.len, p.to);
            }
            return Ok(data);
        }
        let mut work = vec![T::ZERO; self.len];
        for p in &self.places {
            let src = data.get(p.from..p.from + p.len);
            let dst = work.get_mut(p.to..p.to + p.len);
            match (src, dst) {
                (Some(s), Some(d)) => d.copy_from_slice(s),
                _ => return Err(self.misfit(p, data.len())),
            }
        }
        Ok(work)
    }

    fn misfit(&self, p: &Place, have: usize) -> String {
        format!(
            "{} elements at {} of {have} do not fit a working array of {} at {}",
            p.len, p.from, self.len, p.to
        )
    }
}
