//! Probe: who sent the next message, with what tag, and how large it is,
//! before receiving it ([`CommView::iprobe`], [`CommView::probe`]); and the
//! matched probe, which takes that very message so that no other receive
//! can ([`CommView::improbe`], [`CommView::mprobe`]), then receives it
//! ([`CommView::mrecv`], [`CommView::mrecv_into`],
//! [`CommView::mrecv_value`]): MPI's `Iprobe`/`Probe`/`Improbe`/`Mprobe`/`Mrecv`.
//!
//! ```no_run
//! use fabric_msg::World;
//! let mut world = World::init()?;
//! if world.rank() == 0 {
//!     // A message of a length rank 0 does not know in advance.
//!     let m = world.mprobe(None, Some(7))?;
//!     let env = m.envelope();
//!     let data: Vec<f64> = world.mrecv(m)?;
//!     println!("{} values from rank {}", data.len(), env.source);
//! } else {
//!     world.send(0, 7, &vec![1.0f64; 100 * world.rank() as usize])?;
//! }
//! # Ok::<(), fabric_msg::Error>(())
//! ```
//!
//! A probe looks at the messages that have arrived and wait for a receive,
//! through the provider's `FI_PEEK` (`transport/event_loop/peek.rs`) on
//! the loop that carries the source (both loops, and the any-source
//! left-overs of `local.rs`, for any source). A matched probe then posts a
//! receive for exactly the tag found — this communicator, that source,
//! that tag — into a buffer of the World's pool of exactly the message's
//! length, before anything else is posted: it takes the oldest waiting
//! message with that tag, which is the one the probe found. So a matched
//! message is the application's even if it posts other receives before
//! `mrecv`; dropping a [`Matched`] discards its message.
//!
//! Limits: where the provider cannot peek — libfabric's shm before 1.19,
//! which a World on one node uses unless `FABRIC_MSG_SHM=0`, and endpoints
//! that frame messages — a probe fails with [`Error::Unsupported`] saying
//! so. A blocking probe looks again and again (each look is a peek and its
//! completion); between looks it yields for 2 ms, then sleeps 100 µs, so
//! it neither holds a shared core nor misses a message by long.

use super::collectives::ops::Element;
use super::comm::CommView;
use super::messages::{Abandoned, Ticket};
use super::request::{unpack_into, Status};
use super::tags;
use crate::error::{Error, Result};
use crate::transport::event_loop::RecvOpts;
use serde::de::DeserializeOwned;
use std::time::{Duration, Instant};

/// A waiting message as a probe saw it: who sent it (in the
/// communicator's ranks), its tag, and its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Envelope {
    /// The sender's rank in the communicator probed.
    pub source: u32,
    /// The message's tag.
    pub tag: u32,
    /// Its length in bytes.
    pub bytes: usize,
}

impl Envelope {
    /// The message's length in elements of `T` (MPI's `Get_count`), or
    /// `None` if it is not a whole number of them.
    pub fn count<T: Element>(&self) -> Option<usize> {
        (self.bytes % T::SIZE == 0).then_some(self.bytes / T::SIZE)
    }
}

/// A message a matched probe took: receive it with [`CommView::mrecv`],
/// [`CommView::mrecv_into`] or [`CommView::mrecv_value`] (on any view of
/// the same World). Dropping it discards the message.
#[must_use = "a matched message is received with mrecv; dropped, it is discarded"]
#[derive(Debug)]
pub struct Matched {
    envelope: Envelope,
    ticket: Option<Ticket>,
    abandoned: &'static Abandoned,
}

impl Matched {
    /// Who sent it, its tag and length.
    pub fn envelope(&self) -> Envelope {
        self.envelope
    }
}

impl Drop for Matched {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take() {
            self.abandoned.push(t);
        }
    }
}

/// Which loop a look goes to.
#[derive(Clone, Copy)]
enum Side {
    Main,
    Shm,
}

impl CommView<'_> {
    /// Whether a message from `from` (`None`: any rank) with `tag`
    /// (`None`: any tag) is waiting, without receiving it: its envelope,
    /// or `None`. A message still on its way is not waiting yet.
    pub fn iprobe(&mut self, from: Option<u32>, tag: Option<u32>) -> Result<Option<Envelope>> {
        self.look("iprobe", from, tag).map(|f| f.map(|(env, _)| env))
    }

    /// Wait until a message from `from` (`None`: any rank) with `tag`
    /// (`None`: any tag) waits; its envelope. The message is not received:
    /// a receive (or another probe) may take it next.
    pub fn probe(&mut self, from: Option<u32>, tag: Option<u32>) -> Result<Envelope> {
        self.look_until("probe", from, tag).map(|(env, _)| env)
    }

    /// [`CommView::iprobe`], taking the message found for a later
    /// [`CommView::mrecv`]: no other receive can take it.
    pub fn improbe(&mut self, from: Option<u32>, tag: Option<u32>) -> Result<Option<Matched>> {
        match self.look("improbe", from, tag)? {
            Some((env, _)) => self.take_matched("improbe", env).map(Some),
            None => Ok(None),
        }
    }

    /// [`CommView::probe`], taking the message found for a later
    /// [`CommView::mrecv`]: no other receive can take it.
    pub fn mprobe(&mut self, from: Option<u32>, tag: Option<u32>) -> Result<Matched> {
        let (env, _) = self.look_until("mprobe", from, tag)?;
        self.take_matched("mprobe", env)
    }

    /// Receive a matched message as elements of `T`, all of them.
    pub fn mrecv<T: Element>(&mut self, m: Matched) -> Result<Vec<T>> {
        let n = m.envelope.count::<T>().unwrap_or(0);
        let mut v = vec![T::ZERO; n];
        self.mrecv_into(m, &mut v)?;
        Ok(v)
    }

    /// Receive a matched message into `data` (which must hold it): its
    /// status.
    pub fn mrecv_into<T: Element>(&mut self, m: Matched, data: &mut [T]) -> Result<Status> {
        let room = data.len();
        self.finish_matched("mrecv", m, |bytes, source, tag| {
            unpack_into::<T>("mrecv", bytes, room, source, tag).map(|count| {
                T::read(bytes, &mut data[..count]);
                Status { source, tag, count }
            })
        })
    }

    /// Receive a matched message as a serde value (sent with
    /// [`CommView::send_value`]).
    pub fn mrecv_value<V: DeserializeOwned>(&mut self, m: Matched) -> Result<V> {
        self.finish_matched("mrecv_value", m, |bytes, source, tag| {
            postcard::from_bytes::<V>(bytes).map_err(|e| Error::Message {
                operation: "mrecv_value",
                peer: format!("from rank {source}"),
                message: format!(
                    "{} bytes with tag {tag} do not decode as a {} ({e}): sender and receiver must agree on \
                     the type",
                    bytes.len(),
                    std::any::type_name::<V>()
                ),
            })
        })
    }

    /// Post the receive that takes the message `env` describes: exactly
    /// its source and tag, exactly its length.
    fn take_matched(&mut self, what: &'static str, env: Envelope) -> Result<Matched> {
        let ticket = self.post_recv(what, Some(env.source), Some(env.tag), env.bytes)?;
        Ok(Matched {
            envelope: env,
            ticket: Some(ticket),
            abandoned: self.world.msgs.abandoned(),
        })
    }

    fn finish_matched<R>(
        &mut self,
        what: &'static str,
        mut m: Matched,
        take: impl FnOnce(&[u8], u32, u32) -> Result<R>,
    ) -> Result<R> {
        let Some(ticket) = m.ticket.take() else {
            return Err(Error::Usage(format!(
                "{what}: this matched message was received already"
            )));
        };
        let env = m.envelope;
        self.take_received(what, ticket, |bytes, _, _| take(bytes, env.source, env.tag))
    }

    /// Look until a matching message waits.
    fn look_until(
        &mut self,
        what: &'static str,
        from: Option<u32>,
        tag: Option<u32>,
    ) -> Result<(Envelope, u64)> {
        let started = Instant::now();
        loop {
            if let Some(found) = self.look(what, from, tag)? {
                return Ok(found);
            }
            self.world.turn(false)?;
            if started.elapsed() < Duration::from_millis(2) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }

    /// One look for a waiting message: its envelope and World tag.
    fn look(
        &mut self,
        what: &'static str,
        from: Option<u32>,
        tag: Option<u32>,
    ) -> Result<Option<(Envelope, u64)>> {
        let from_world = match from {
            Some(r) => Some(self.world_rank(r)?),
            None => None,
        };
        let scope = self.scope();
        let class = tags::user_class(scope.ctx);
        let want = tags::matcher(class, from_world, tag);
        let world = &mut *self.world;
        let _call = world.live.call();
        if let Some(r) = world.live.first_lost() {
            return Err(world.lost(r));
        }
        let mut sides = [Some(Side::Main), None];
        if let Some(l) = world.local.as_mut() {
            if let Some(found) = l.peek_kept(want) {
                return Ok(Some(envelope(&scope, found)));
            }
            // With one matching engine every application message waits
            // in the node loop's matcher, the fabric's too.
            let engine = l.one_engine();
            let main = !engine
                && match from_world {
                    Some(w) => !l.carries(w),
                    None => !l.carries_all(),
                };
            let here = engine
                || match from_world {
                    Some(w) => l.carries(w),
                    None => true,
                };
            let main = main.then_some(Side::Main);
            sides = match (here, l.side.peek(want)) {
                (false, _) => [main, None],
                // The node loop knows its waiting messages itself.
                (true, Ok(Some(found))) => return Ok(Some(envelope(&scope, found))),
                (true, Ok(None)) => [main, None],
                (true, Err(())) => [main, Some(Side::Shm)],
            };
        }
        for side in sides.into_iter().flatten() {
            let ticket = world.msgs.open(false);
            let opts = RecvOpts {
                tag: Some(want),
                from: None,
            };
            let (ev, ep) = match (side, world.local.as_mut().map(|l| &mut l.side)) {
                (Side::Shm, Some(super::lane::Side::Shm { ev, ep, .. })) => (ev, *ep),
                _ => (&mut world.ev, world.ep),
            };
            let posted = if class == tags::CLASS_USER {
                ev.peek(ep, opts, ticket.token())
            } else {
                ev.as_world().peek(ep, opts, ticket.token())
            };
            if let Err(e) = posted {
                world.msgs.unpost(ticket);
                return Err(match e {
                    Error::Usage(m) => Error::Usage(format!("{what}: {m}")),
                    other => other,
                });
            }
            let c = world.wait_ticket(ticket)?;
            if let Err(e) = c.result {
                return Err(world.explain_message(what, true, e, from.unwrap_or(u32::MAX), tag.unwrap_or(0)));
            }
            if let Some(p) = c.peeked {
                return Ok(Some(envelope(&scope, (c.tag, p.len))));
            }
        }
        Ok(None)
    }
}

/// The envelope of a message with World tag `tag` and `len` bytes, in the
/// ranks of `scope`.
fn envelope(scope: &super::collectives::scope::Scope, (tag, len): (u64, usize)) -> (Envelope, u64) {
    let env = Envelope {
        source: scope.rank_of(tags::source_of(tag)).unwrap_or(u32::MAX),
        tag: tags::user_tag_of(tag),
        bytes: len,
    };
    (env, tag)
}
