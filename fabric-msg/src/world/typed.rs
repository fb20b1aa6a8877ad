//! Typed point-to-point messages on a communicator (and on the World, its
//! whole view): slices of [`Element`]s, blocking ([`CommView::send`],
//! [`CommView::recv`]) or with a [`Request`] ([`CommView::isend`],
//! [`CommView::irecv`]), and serde values ([`CommView::send_value`],
//! [`CommView::recv_value`]).
//!
//! ```no_run
//! use fabric_msg::World;
//! let mut world = World::init()?;
//! let (rank, size) = (world.rank(), world.size());
//! let (left, right) = ((rank + size - 1) % size, (rank + 1) % size);
//! // A halo exchange: both receives and both sends in flight, then wait.
//! let edge = vec![rank as f64; 64];
//! let reqs = vec![
//!     world.irecv(Some(left), Some(0), vec![0.0f64; 64])?,
//!     world.irecv(Some(right), Some(1), vec![0.0f64; 64])?,
//!     world.isend(right, 0, &edge)?,
//!     world.isend(left, 1, &edge)?,
//! ];
//! let done = world.wait_all(reqs)?;
//! let (from_left, from_right) = (&done[0], &done[1]);
//! # let _ = (from_left, from_right);
//! # Ok::<(), fabric_msg::Error>(())
//! ```
//!
//! Elements go through a buffer of the World's pool: a send copies them in
//! when it is posted (so its slice is free again at once, and a request
//! needs no borrow), a receive copies them out when waited for. A copy per
//! message is the price of needing no `unsafe` and no scope; for messages
//! of megabytes the token interface's registered [`Buffer`](crate::Buffer)s
//! avoid it. Why `Element` and not any `bytemuck::Pod`: one element trait
//! for messages and collectives keeps one vocabulary, and the built-in
//! reductions need to know the numbers; a `Pod` struct goes as a
//! [`Record`](crate::Record) (its bytes, one copy), any other as a serde value.
//!
//! A receive takes the first matching message from `from` (`None`: any
//! rank of the communicator) with `tag` (`None`: any tag); messages from
//! one rank with one tag arrive in the order they were sent. A message
//! larger than the receive fails it with [`Error::Truncated`] (the message
//! is consumed); a length that is not a whole number of elements, or a
//! value that does not decode, with [`Error::Message`].

use super::collectives::ops::Element;
use super::comm::CommView;
use super::messages::Ticket;
use super::request::{unpack_into, Of, Request, Status};
use super::tags;
use crate::error::{Error, Result};
use crate::memory::buffer::Buffer;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// The largest serde value [`CommView::send_value`] sends and
/// [`CommView::recv_value`] receives, encoded (postcard): 1 MiB. Larger
/// data goes as slices.
pub const VALUE_MAX: usize = 1 << 20;

impl CommView<'_> {
    /// Send `data` to rank `to` with `tag`, and wait until it has left
    /// (its buffer is the World's; `data` is free at once).
    pub fn send<T: Element>(&mut self, to: u32, tag: u32, data: &[T]) -> Result<()> {
        let r = self.isend(to, tag, data)?;
        self.world.wait(r).map(drop)
    }

    /// Receive into `data` from rank `from` (`None`: any) with `tag`
    /// (`None`: any), and wait for it: who sent it, its tag and how many
    /// elements it had (the rest of `data` is left as it was).
    pub fn recv<T: Element>(
        &mut self,
        from: Option<u32>,
        tag: Option<u32>,
        data: &mut [T],
    ) -> Result<Status> {
        let room = data.len();
        self.blocking_recv("recv", from, tag, room * T::SIZE, |bytes, source, tag| {
            unpack_into::<T>("recv", bytes, room, source, tag).map(|count| {
                T::read(bytes, &mut data[..count]);
                Status { source, tag, count }
            })
        })
    }

    /// Start sending `data` to rank `to` with `tag`: it is copied into a
    /// buffer of the World's now, so `data` is free at once. Wait for the
    /// request (or drop it: the send still goes).
    pub fn isend<T: Element>(&mut self, to: u32, tag: u32, data: &[T]) -> Result<Request<T>> {
        let mut buf = self.world.msgs.pool.take(data.len() * T::SIZE);
        T::write(data, buf.as_mut_slice());
        let ticket = self.post_send("isend", to, tag, buf)?;
        Ok(self.request("isend", ticket, None))
    }

    /// Start a receive from rank `from` (`None`: any) with `tag` (`None`:
    /// any) of up to `buf.capacity()` elements; [`World::wait`](crate::World::wait)
    /// gives `buf` back holding what arrived. Reusing the vector that
    /// comes back keeps receives free of allocation.
    pub fn irecv<T: Element>(
        &mut self,
        from: Option<u32>,
        tag: Option<u32>,
        buf: Vec<T>,
    ) -> Result<Request<T>> {
        let room = buf.capacity().max(buf.len());
        let ticket = self.post_recv("irecv", from, tag, room * T::SIZE)?;
        Ok(self.request("irecv", ticket, Some(buf)))
    }

    /// Send a serde value (encoded with postcard, at most [`VALUE_MAX`]
    /// bytes) to rank `to` with `tag`, and wait until it has left.
    pub fn send_value<V: Serialize>(&mut self, to: u32, tag: u32, value: &V) -> Result<()> {
        let mut buf = self.world.msgs.pool.take(VALUE_MAX);
        let len = match postcard::to_slice(value, buf.as_mut_slice()) {
            Ok(encoded) => encoded.len(),
            Err(e) => {
                self.world.msgs.pool.give(buf);
                return Err(Error::Message {
                    operation: "send_value",
                    peer: format!("to rank {to}"),
                    message: format!(
                        "cannot encode the value within {VALUE_MAX} bytes ({e}): send large data as slices"
                    ),
                });
            }
        };
        buf.set_len(len);
        let ticket = self.post_send("send_value", to, tag, buf)?;
        let r: Request<u8> = self.request("send_value", ticket, None);
        self.world.wait(r).map(drop)
    }

    /// Receive a serde value sent with [`CommView::send_value`] from rank
    /// `from` (`None`: any) with `tag` (`None`: any), and wait for it. A
    /// message that does not decode as a `V` fails with
    /// [`Error::Message`], naming the sender.
    pub fn recv_value<V: DeserializeOwned>(
        &mut self,
        from: Option<u32>,
        tag: Option<u32>,
    ) -> Result<(V, Status)> {
        self.blocking_recv(
            "recv_value",
            from,
            tag,
            VALUE_MAX,
            |bytes, source, tag| match postcard::from_bytes::<V>(bytes) {
                Ok(v) => Ok((
                    v,
                    Status {
                        source,
                        tag,
                        count: bytes.len(),
                    },
                )),
                Err(e) => Err(Error::Message {
                    operation: "recv_value",
                    peer: format!("from rank {source}"),
                    message: format!(
                        "{} bytes with tag {tag} do not decode as a {} ({e}): sender and receiver \
                     must agree on the type",
                        bytes.len(),
                        std::any::type_name::<V>()
                    ),
                }),
            },
        )
    }

    /// Post a receive of up to `bytes` bytes and wait for it; `take` turns
    /// what arrived (its bytes, the sender in this communicator's ranks,
    /// the tag) into the result. The pool's buffer goes back either way.
    fn blocking_recv<R>(
        &mut self,
        what: &'static str,
        from: Option<u32>,
        tag: Option<u32>,
        bytes: usize,
        take: impl FnOnce(&[u8], u32, u32) -> Result<R>,
    ) -> Result<R> {
        let ticket = self.post_recv(what, from, tag, bytes)?;
        self.take_received(what, ticket, take)
    }

    /// Wait for the receive `ticket` and turn what arrived into the
    /// result with `take`; the pool's buffer goes back either way.
    pub(super) fn take_received<R>(
        &mut self,
        what: &'static str,
        ticket: Ticket,
        take: impl FnOnce(&[u8], u32, u32) -> Result<R>,
    ) -> Result<R> {
        let scope = self.scope();
        let mut c = self.world.wait_ticket(ticket)?;
        let buffer = c.buffer.take();
        let source = scope.rank_of(tags::source_of(c.tag)).unwrap_or(u32::MAX);
        let tag = tags::user_tag_of(c.tag);
        let out = match c.result {
            Err(e) => Err(self.world.explain_message(what, true, e, source, tag)),
            Ok(()) => take(buffer.as_ref().map_or(&[][..], |b| b.as_slice()), source, tag),
        };
        self.world.msgs.pool.give_opt(buffer);
        out
    }

    /// Post `buf` to rank `to` with `tag` under a new ticket.
    fn post_send(&mut self, what: &'static str, to: u32, tag: u32, buf: Buffer) -> Result<Ticket> {
        let to_world = match self.world_rank(to) {
            Ok(w) => w,
            Err(e) => {
                self.world.msgs.pool.give(buf);
                return Err(e);
            }
        };
        let class = tags::user_class(self.scope().ctx);
        let world = &mut *self.world;
        let _call = world.live.call();
        let ticket = world.msgs.open(false);
        match world.post_send(class, to_world, tag, buf, ticket.token()) {
            Ok(()) => Ok(ticket),
            Err(e) => {
                world.msgs.unpost(ticket);
                world.msgs.pool.give_opt(e.buffer);
                Err(prefix(what, e.error))
            }
        }
    }

    /// Post a receive of up to `bytes` bytes under a new ticket.
    pub(super) fn post_recv(
        &mut self,
        what: &'static str,
        from: Option<u32>,
        tag: Option<u32>,
        bytes: usize,
    ) -> Result<Ticket> {
        let from_world = match from {
            Some(r) => Some(self.world_rank(r)?),
            None => None,
        };
        let class = tags::user_class(self.scope().ctx);
        let world = &mut *self.world;
        let _call = world.live.call();
        let buf = world.msgs.pool.take(bytes);
        let ticket = world.msgs.open(true);
        match world.post_recv(class, from_world, tag, buf, ticket.token()) {
            Ok(()) => Ok(ticket),
            Err(e) => {
                world.msgs.unpost(ticket);
                world.msgs.pool.give_opt(e.buffer);
                Err(prefix(what, e.error))
            }
        }
    }

    fn request<T: Element>(
        &mut self,
        what: &'static str,
        ticket: Ticket,
        into: Option<Vec<T>>,
    ) -> Request<T> {
        Request {
            what,
            of: Of::Message {
                ticket,
                into,
                scope: self.scope(),
                abandoned: self.world.msgs.abandoned(),
            },
        }
    }
}

/// A usage error named for the call that made it; other errors as they are.
fn prefix(what: &'static str, e: Error) -> Error {
    match e {
        Error::Usage(m) => Error::Usage(format!("{what}: {m}")),
        other => other,
    }
}
