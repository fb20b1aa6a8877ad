//! [`Request`]: one kind of handle for every non-blocking operation of the
//! World and its communicators — typed messages (`isend`, `irecv`) and
//! collectives (`iallreduce`, `ibarrier`, ...) — and the waits over one or
//! many: [`World::test`], [`World::wait`], [`World::wait_status`],
//! [`World::wait_all`], [`World::wait_any`], [`World::wait_some`],
//! [`World::test_all`].
//!
//! Each wait moves every operation in flight on (the collectives' schedules,
//! the typed messages, and the application's own token operations, whose
//! completions are kept for its next [`World::poll`]), and passes idle time
//! as every wait of the World does: spin, then yield, then sleep in the
//! completion queue's wait (`transport/event_loop/idle.rs`).

use super::collectives::ops::Element;
use super::collectives::request::{extract, Shape};
use super::collectives::run::Outcome;
use super::collectives::scope::Scope;
use super::messages::{Abandoned, Ticket};
use super::state::World;
use super::tags;
use crate::error::{Error, Result};
use crate::transport::event_loop::{Completion, CompletionError};

/// An operation in flight, started with one of the `i…` methods of the
/// World or of a communicator's view: a typed message
/// ([`World::isend`], [`World::irecv`]) or a collective
/// ([`World::iallreduce`], [`World::ibarrier`], ...). It progresses
/// whenever the World is polled or waited on; [`World::wait`] gives its
/// result: a receive's elements, a collective's result, nothing (an empty
/// vector) for a send.
///
/// Dropping a request never frees memory the provider may still write:
/// typed messages go through buffers of the World's pool, which return to
/// the pool when the dropped operation completes. A dropped send still
/// goes (its failure, if any, is not reported: a lost rank still fails the
/// next wait). A dropped receive is cancelled at the World's next wait or
/// poll; if a message had matched it first, that message is discarded. A
/// collective goes on (the other ranks still need this rank's part) and
/// its result is discarded. Every rank must start the same collectives of a communicator
/// in the same order.
#[must_use = "an operation's result comes from World::wait"]
#[derive(Debug)]
pub struct Request<T: Element> {
    pub(crate) what: &'static str,
    pub(crate) of: Of<T>,
}

/// What a request waits for.
#[derive(Debug)]
pub(crate) enum Of<T: Element> {
    /// A collective's run.
    Run {
        /// The engine's number for it.
        id: u32,
        /// Its number in its communicator.
        seq: u32,
        outcome: Outcome<T>,
        shape: Shape,
    },
    /// A typed message.
    Message {
        ticket: Ticket,
        /// A receive's vector, to fill; `None` for a send.
        into: Option<Vec<T>>,
        /// Its communicator (for the source's rank; holds its context).
        scope: Scope,
        /// Where the ticket goes if the request is dropped unwaited.
        abandoned: &'static Abandoned,
    },
    /// A one-sided operation on symmetric memory (`one_sided.rs`).
    OneSided {
        ticket: Ticket,
        /// The registered memory a put wrote from or a get reads into,
        /// kept for reuse once the operation is done.
        scratch: Option<crate::memory::mr::MemoryRegion>,
        /// Elements a get brings (1 for an atomic, 0 for a put).
        count: usize,
        /// The target rank.
        rank: u32,
        abandoned: &'static Abandoned,
    },
    /// Finished as it started: a same-node one-sided operation on mapped
    /// symmetric memory (`node_symmetric.rs`), with its result.
    Ready { out: Vec<T>, status: Status },
    /// Waited for already.
    Finished,
}

impl<T: Element> Request<T> {
    /// A collective's number in its communicator (numbered from 0 in the
    /// order every member starts them); `None` for a message.
    pub fn number(&self) -> Option<u32> {
        match &self.of {
            Of::Run { seq, .. } => Some(*seq),
            _ => None,
        }
    }

    /// `"allreduce"`, `"barrier"`, `"isend"`, `"irecv"`, ...
    pub fn operation(&self) -> &'static str {
        self.what
    }
}

impl<T: Element> Drop for Request<T> {
    fn drop(&mut self) {
        match &self.of {
            Of::Message {
                ticket, abandoned, ..
            }
            | Of::OneSided {
                ticket, abandoned, ..
            } => abandoned.push(*ticket),
            _ => {}
        }
    }
}

/// What a finished operation says of itself: for a receive, who sent what
/// it took; for other operations, this rank, tag 0, and the result's
/// length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    /// The sender's rank, in the communicator's ranks.
    pub source: u32,
    /// The message's tag.
    pub tag: u32,
    /// Elements received (or in the result).
    pub count: usize,
}

impl World {
    /// Whether `req` has finished (its result or error is ready for
    /// [`World::wait`]). Moves every operation in flight on, without
    /// waiting.
    pub fn test<T: Element>(&mut self, req: &Request<T>) -> Result<bool> {
        let _call = self.live.call();
        if !self.finished(req) {
            self.turn(false)?;
        }
        Ok(self.finished(req))
    }

    /// Whether every request of `reqs` has finished (MPI's `MPI_Testall`,
    /// without consuming them: [`World::wait_all`] then returns at once).
    pub fn test_all<T: Element>(&mut self, reqs: &[Request<T>]) -> Result<bool> {
        let _call = self.live.call();
        if !reqs.iter().all(|r| self.finished(r)) {
            self.turn(false)?;
        }
        Ok(reqs.iter().all(|r| self.finished(r)))
    }

    /// Wait for `req` and return its result: a receive's elements, a
    /// collective's result, an empty vector for a send. Fails with
    /// [`Error::RankLost`] as soon as any rank is lost, with
    /// [`Error::Collective`] when a rank saw a collective go wrong, with
    /// [`Error::Truncated`] or [`Error::Message`] when a message did.
    pub fn wait<T: Element>(&mut self, req: Request<T>) -> Result<Vec<T>> {
        self.wait_status(req).map(|(v, _)| v)
    }

    /// [`World::wait`], with who sent a received message, its tag and its
    /// length.
    pub fn wait_status<T: Element>(&mut self, mut req: Request<T>) -> Result<(Vec<T>, Status)> {
        // One that finished as it started (a same-node one-sided operation)
        // needs no call: nothing can stall.
        if let Of::Ready { .. } = req.of {
            if let Some(done) = self.conclude(&mut req) {
                return done;
            }
        }
        let _call = self.live.call();
        self.wait_in_call(&mut req)
    }

    /// Move everything on until `req` has finished, and give its result
    /// (inside a liveness call the caller holds).
    fn wait_in_call<T: Element>(&mut self, req: &mut Request<T>) -> Result<(Vec<T>, Status)> {
        loop {
            if let Some(done) = self.conclude(req) {
                return done;
            }
            self.turn(true)?;
        }
    }

    /// Wait for every request, in order, and return their results in the
    /// same order; the first failure ends the wait (the requests not yet
    /// waited for are dropped: see [`Request`]).
    pub fn wait_all<T: Element>(&mut self, reqs: Vec<Request<T>>) -> Result<Vec<Vec<T>>> {
        let _call = self.live.call();
        let mut out = Vec::with_capacity(reqs.len());
        for mut r in reqs {
            out.push(self.wait_in_call(&mut r)?.0);
        }
        Ok(out)
    }

    /// Wait until one of `reqs` finishes; take it out (its place becomes
    /// `None`, as MPI's `MPI_REQUEST_NULL`) and return its index, result
    /// and status. `Ok(None)` if every place is `None`. When several have
    /// finished, the first in order is taken.
    pub fn wait_any<T: Element>(
        &mut self,
        reqs: &mut [Option<Request<T>>],
    ) -> Result<Option<(usize, Vec<T>, Status)>> {
        let _call = self.live.call();
        if reqs.iter().all(Option::is_none) {
            return Ok(None);
        }
        loop {
            for (i, slot) in reqs.iter_mut().enumerate() {
                let Some(r) = slot.as_mut() else { continue };
                if let Some(done) = self.conclude(r) {
                    *slot = None;
                    return done.map(|(v, s)| Some((i, v, s)));
                }
            }
            self.turn(true)?;
        }
    }

    /// Wait until at least one of `reqs` finishes, and take out every one
    /// that has (their places become `None`): index, result and status of
    /// each, in index order. Empty if every place is `None`. A failed
    /// operation ends the wait with its error: the places not reached stay,
    /// the results already taken in this call are dropped.
    pub fn wait_some<T: Element>(
        &mut self,
        reqs: &mut [Option<Request<T>>],
    ) -> Result<Vec<(usize, Vec<T>, Status)>> {
        let mut out = Vec::new();
        let Some(first) = self.wait_any(reqs)? else {
            return Ok(out);
        };
        out.push(first);
        for (i, slot) in reqs.iter_mut().enumerate() {
            let Some(r) = slot.as_mut() else { continue };
            if let Some(done) = self.conclude(r) {
                *slot = None;
                let (v, s) = done?;
                out.push((i, v, s));
            }
        }
        out.sort_unstable_by_key(|d| d.0);
        Ok(out)
    }

    /// Whether `req` has finished, without progress.
    fn finished<T: Element>(&self, req: &Request<T>) -> bool {
        match &req.of {
            Of::Run { id, outcome, .. } => outcome.lock().is_some() || !self.run_in_flight(*id),
            Of::Message { ticket, .. } | Of::OneSided { ticket, .. } => self.msgs.is_done(*ticket),
            Of::Ready { .. } | Of::Finished => true,
        }
    }

    /// Whether the collective `id` is still in flight: a run of the
    /// engine's, a call in the node's slots (`node_requests.rs`), or a
    /// call in two levels (`two_level_requests.rs`).
    fn run_in_flight(&self, id: u32) -> bool {
        self.coll.running(id) || self.slot_requests.holds(id) || self.chains.iter().any(|c| c.id() == id)
    }

    /// `req`'s result if it has finished (then it is `Finished`).
    fn conclude<T: Element>(&mut self, req: &mut Request<T>) -> Option<Result<(Vec<T>, Status)>> {
        let rank = self.rank();
        match &mut req.of {
            Of::Run {
                id,
                seq,
                outcome,
                shape,
            } => {
                let taken = outcome.lock().take();
                if let Some(result) = taken {
                    let out = result.map(|work| {
                        let v = extract(work, shape);
                        let count = v.len();
                        (
                            v,
                            Status {
                                source: rank,
                                tag: 0,
                                count,
                            },
                        )
                    });
                    req.of = Of::Finished;
                    // A step that read a dead rank's memory fails before
                    // the lifeline hears of it, and records the loss:
                    // the request fails with the loss, as a blocking call.
                    return Some(self.settled(out));
                }
                if self.run_in_flight(*id) {
                    return None;
                }
                let e = Error::Usage(format!(
                    "{} #{seq} is neither in flight nor finished: was it waited for already?",
                    req.what
                ));
                req.of = Of::Finished;
                Some(Err(e))
            }
            Of::Message { ticket, .. } => {
                let c = self.msgs.take(*ticket)?;
                let Of::Message { into, scope, .. } = std::mem::replace(&mut req.of, Of::Finished) else {
                    return None;
                };
                Some(self.message_result(req.what, c, into, &scope))
            }
            Of::OneSided { ticket, .. } => {
                let c = self.msgs.take(*ticket)?;
                let Of::OneSided {
                    scratch, count, rank, ..
                } = std::mem::replace(&mut req.of, Of::Finished)
                else {
                    return None;
                };
                Some(self.one_sided_result(req.what, c, scratch, count, rank))
            }
            Of::Ready { .. } => match std::mem::replace(&mut req.of, Of::Finished) {
                Of::Ready { out, status } => Some(Ok((out, status))),
                _ => None,
            },
            Of::Finished => Some(Err(Error::Usage(format!(
                "{}: this request was waited for already",
                req.what
            )))),
        }
    }

    /// A typed message's result from its completion: a receive's elements
    /// copied out of the pool's buffer (into `into`, within its capacity),
    /// or what went wrong.
    fn message_result<T: Element>(
        &mut self,
        what: &'static str,
        mut c: Completion,
        into: Option<Vec<T>>,
        scope: &Scope,
    ) -> Result<(Vec<T>, Status)> {
        let buffer = c.buffer.take();
        let source = scope.rank_of(tags::source_of(c.tag)).unwrap_or(u32::MAX);
        let tag = tags::user_tag_of(c.tag);
        let out = match (c.result, into) {
            (Err(e), into) => Err(self.explain_message(what, into.is_some(), e, source, tag)),
            (Ok(()), None) => Ok((
                Vec::new(),
                Status {
                    source: self.rank(),
                    tag: 0,
                    count: 0,
                },
            )),
            (Ok(()), Some(mut v)) => {
                let bytes = buffer.as_ref().map_or(&[][..], |b| b.as_slice());
                unpack(what, bytes, &mut v, source, tag).map(|count| (v, Status { source, tag, count }))
            }
        };
        self.msgs.pool.give_opt(buffer);
        out
    }

    /// A typed message's failure on the fabric, as the World's error: the
    /// loss of a rank where one explains it.
    pub(crate) fn explain_message(
        &self,
        what: &'static str,
        recv: bool,
        e: CompletionError,
        source: u32,
        tag: u32,
    ) -> Error {
        if let Some(r) = self.live.first_lost() {
            return self.lost(r);
        }
        match e {
            CompletionError::Truncated {
                message_len,
                buffer_len,
            } => Error::Truncated {
                operation: what,
                source_rank: if source == u32::MAX {
                    "an unreported rank".into()
                } else {
                    source.to_string()
                },
                tag: tag.to_string(),
                len: message_len,
                capacity: buffer_len,
            },
            other => Error::Message {
                operation: what,
                peer: if recv { "(receive)" } else { "(send)" }.into(),
                message: other.to_string(),
            },
        }
    }

    /// Wait for a typed message's completion (of a blocking call). If the
    /// wait fails, the operation is left to complete on its own.
    pub(crate) fn wait_ticket(&mut self, t: Ticket) -> Result<Completion> {
        loop {
            if let Some(c) = self.msgs.take(t) {
                return Ok(c);
            }
            if let Err(e) = self.turn(true) {
                self.msgs.abandoned().push(t);
                return Err(e);
            }
        }
    }

    /// One step for every operation in flight: a look at the completion
    /// queues (the collectives take theirs, the typed messages theirs, the
    /// application's are kept for its next poll); with `idle`, pass the
    /// time as waits do when nothing came.
    pub(crate) fn turn(&mut self, idle: bool) -> Result<bool> {
        if let Some(r) = self.live.first_lost() {
            return Err(self.lost(r));
        }
        self.cancel_dropped();
        // The slots first: a call whose headers are all in finishes
        // without waiting on the completion queues. While calls are queued
        // there, a wait never sleeps in the completion queue, which a post
        // in the slots does not wake: it naps on the doorbell below, which
        // every post rings.
        let slots = self.progress_slot_requests()?;
        // Where every queue's next call waits for a chain's step on the
        // fabric (`two_level_requests.rs`), sleep there, as for any run.
        let elsewhere = self.slot_requests.waits_elsewhere();
        let may_sleep = idle && !slots && (self.slot_requests.is_empty() || elsewhere);
        let (engine, mut io) = self.engine_io();
        let any = engine.poll_once(&mut io, may_sleep)? | slots | self.progress_slot_requests()?;
        self.msgs.absorb(self.coll.kept_mut());
        if any {
            self.moved = self.moved.wrapping_add(1);
            self.slot_requests_busy();
        } else if idle && !self.slot_requests.is_empty() && !elsewhere {
            self.idle_for_slot_requests();
        } else if idle {
            self.coll.idle();
        }
        Ok(any)
    }
}

impl World {
    /// Cancel the receives whose requests were dropped (`messages.rs`):
    /// each then completes cancelled, or with a message it had taken,
    /// which is discarded.
    pub(crate) fn cancel_dropped(&mut self) {
        self.msgs.sweep();
        if self.msgs.cancels.is_empty() {
            return;
        }
        for t in std::mem::take(&mut self.msgs.cancels) {
            let r = match self.local.as_mut() {
                Some(l) => l.cancel_user(&mut self.ev, self.ep, t),
                None => self.ev.cancel_recv(self.ep, t).map(drop),
            };
            if let Err(e) = r {
                log::warn!("cannot cancel a dropped receive ({:#x}): {e}", t.0);
            }
        }
    }
}

/// Copy a received message's `bytes` into `v` (within its capacity);
/// the element count, or why the message does not fit.
pub(crate) fn unpack<T: Element>(
    what: &'static str,
    bytes: &[u8],
    v: &mut Vec<T>,
    source: u32,
    tag: u32,
) -> Result<usize> {
    let room = v.capacity().max(v.len());
    unpack_into::<T>(what, bytes, room, source, tag).inspect(|&count| {
        v.clear();
        v.resize(count, T::ZERO);
        T::read(bytes, v);
    })
}

/// Check a received message against a receive of `room` elements: the
/// element count, or why not.
pub(crate) fn unpack_into<T: Element>(
    what: &'static str,
    bytes: &[u8],
    room: usize,
    source: u32,
    tag: u32,
) -> Result<usize> {
    if bytes.len() % T::SIZE != 0 {
        return Err(Error::Message {
            operation: what,
            peer: format!("from rank {source}"),
            message: format!(
                "a message of {} bytes (tag {tag}) is not a whole number of {} ({} bytes each): \
                 sender and receiver must use the same element type",
                bytes.len(),
                T::NAME,
                T::SIZE
            ),
        });
    }
    let count = bytes.len() / T::SIZE;
    if count > room {
        return Err(Error::Truncated {
            operation: what,
            source_rank: source.to_string(),
            tag: tag.to_string(),
            len: Some(bytes.len()),
            capacity: room * T::SIZE,
        });
    }
    Ok(count)
}
