//! A collective in flight: [`Request`], and [`World::wait`] and
//! [`World::test`], which progress the collectives until it ends.

use super::ops::{Element, Reduction};
use super::schedule::Schedule;
use crate::error::{Error, Result};
use crate::world::World;
use std::marker::PhantomData;
use std::sync::Arc;

/// Which parts of a run's working array make the result, in order.
#[derive(Debug, Clone)]
pub(crate) enum Shape {
    /// All of it.
    Whole,
    /// These `(at, len)` blocks, concatenated.
    Pieces(Vec<(usize, usize)>),
}

/// A collective started with one of the `i…` methods ([`World::iallreduce`],
/// [`World::ibarrier`], ...). It progresses whenever the World is polled —
/// [`World::poll`], [`World::test`], [`World::wait`] or another collective's
/// wait — and [`World::wait`] gives its result.
///
/// Every rank must start the same collectives in the same order. Dropping
/// a request does not stop the collective (the other ranks still need this
/// rank's part); its result is discarded when it ends.
#[must_use = "a collective's result comes from World::wait"]
#[derive(Debug)]
pub struct Request<T: Element> {
    seq: u32,
    /// Held while someone may collect the result (see `Engine::end`).
    _alive: Arc<()>,
    shape: Shape,
    what: &'static str,
    _t: PhantomData<fn() -> T>,
}

impl<T: Element> Request<T> {
    /// The collective's number: the world's collectives are numbered from 0
    /// in the order every rank starts them.
    pub fn number(&self) -> u32 {
        self.seq
    }

    /// `"allreduce"`, `"barrier"`, ...
    pub fn operation(&self) -> &'static str {
        self.what
    }
}

impl World {
    /// Start a collective of this rank's `sched` over `work`.
    pub(crate) fn start_run<T: Element>(
        &mut self,
        what: &'static str,
        sched: Schedule,
        work: Vec<T>,
        reduction: Option<Reduction<T>>,
        shape: Shape,
    ) -> Result<Request<T>> {
        let _call = self.live.call();
        let (engine, mut io) = self.engine_io();
        let (seq, alive) = engine.start(&mut io, what, sched, work, reduction);
        Ok(Request {
            seq,
            _alive: alive,
            shape,
            what,
            _t: PhantomData,
        })
    }

    /// Refuse a collective for a bad argument (`Error::Usage`), telling the
    /// other ranks so that none waits for this one.
    pub(crate) fn refuse(&mut self, what: &'static str, message: String) -> Error {
        let _call = self.live.call();
        let (engine, mut io) = self.engine_io();
        engine.refuse(&mut io, what, message)
    }

    /// Whether `req` has ended (its result or error is ready for
    /// [`World::wait`]). Progresses every collective in flight, without
    /// waiting.
    pub fn test<T: Element>(&mut self, req: &Request<T>) -> Result<bool> {
        let _call = self.live.call();
        let (engine, mut io) = self.engine_io();
        if engine.running(req.seq) {
            engine.poll_once(&mut io)?;
        }
        Ok(!self.coll.running(req.seq))
    }

    /// Wait for `req` and return its result: what each `i…` method says.
    /// Fails with [`Error::RankLost`] as soon as any rank is lost, and with
    /// [`Error::Collective`] when a rank saw the collective go wrong.
    /// Completions of the application's own operations that arrive
    /// meanwhile are kept for its next [`World::poll`].
    pub fn wait<T: Element>(&mut self, req: Request<T>) -> Result<Vec<T>> {
        let _call = self.live.call();
        loop {
            if let Some(result) = self.coll.take(req.seq) {
                let work = result?.downcast::<Vec<T>>().map_err(|_| {
                    Error::Usage(format!(
                        "{} #{}: the result is not a Vec<{}>",
                        req.what,
                        req.seq,
                        T::NAME
                    ))
                })?;
                return Ok(extract(*work, &req.shape));
            }
            if !self.coll.running(req.seq) {
                return Err(Error::Usage(format!(
                    "{} #{} is neither in flight nor finished: was it waited for already?",
                    req.what, req.seq
                )));
            }
            let (engine, mut io) = self.engine_io();
            if !engine.poll_once(&mut io)? {
                engine.idle();
            }
        }
    }
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
pub(crate) fn copy_result<T: Element>(what: &str, dst: &mut [T], src: &[T]) -> Result<()> {
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
