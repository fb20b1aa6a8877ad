//! One-sided operations and atomics as futures: a peer's registered
//! memory read, written or updated from a task.
//!
//! The local side of a read or write is part of a [`MemoryRegion`] (a
//! [`Local`]), not a buffer lent to the loop: the operation in flight holds
//! the region (`memory/mr.rs`, "Ownership"), so a future dropped before
//! its completion leaves the region registered and its memory allocated
//! until the provider is done with it, as the blocking loop does. Nothing
//! is cancelled: a write whose future was dropped may still land.
//!
//! Each is posted as the blocking loop posts it (the same checks of the
//! remote bounds, access and alignment before anything reaches libfabric)
//! but never waits holding the loop: where the loop has no room for
//! another operation the post is retried after a look and the runtime's
//! turn, as a receive is ([`LoopHandle::recv`]).
//!
//! [`MemoryRegion`]: crate::MemoryRegion

use super::handle::LoopHandle;
use super::op::{self, OnDrop};
use super::shared::failing_fast;
use crate::error::{Error, Result};
use crate::memory::mr::Local;
use crate::memory::remote::RemoteMemory;
use crate::transport::event_loop::rma::Atomic;
use crate::transport::event_loop::{Completion, EventLoop, Peer, Token};
use std::time::Instant;

impl LoopHandle {
    /// Read `local.len()` bytes of `peer`'s memory at `offset` of
    /// `remote` into `local` ([`EventLoop::read`]). The completion says
    /// whether it worked (a revoked key or a lost peer fail there); the
    /// `Err` is a post the loop refused (bounds, access, a closed loop).
    ///
    /// Where the provider's data progress is manual (tcp;ofi_rxm), the
    /// target's loop must be looked at for the read to be served: a target
    /// behind an idle [`AsyncLoop`](super::AsyncLoop) answers when its
    /// wait fd wakes its driver, or within
    /// [`IDLE_PERIOD`](super::IDLE_PERIOD) on a loop without one (2 ms a
    /// read measured there, 25 µs with a wait fd: docs/async.md).
    pub async fn read(
        &self,
        peer: Peer,
        local: Local<'_>,
        remote: &RemoteMemory,
        offset: u64,
    ) -> Result<Completion> {
        self.one_sided(|ev, t| ev.read(&peer, local, remote, offset, t))
            .await
    }

    /// Write `local` into `peer`'s memory at `offset` of `remote`
    /// ([`EventLoop::write`]); completes once the provider is done with
    /// `local` (with the delivery guarantee the provider gives writes).
    pub async fn write(
        &self,
        peer: Peer,
        local: Local<'_>,
        remote: &RemoteMemory,
        offset: u64,
    ) -> Result<Completion> {
        self.one_sided(|ev, t| ev.write(&peer, local, remote, offset, t))
            .await
    }

    /// Write `local` into `peer`'s memory at `offset` of `remote`, then tell
    /// the peer with `data` ([`EventLoop::write_data`]): the peer's
    /// [`LoopHandle::remote_write`] (or, where the notice uses up a
    /// receive, an untagged receive it posted) gets a
    /// [`RemoteWrite`](crate::OpKind::RemoteWrite) completion carrying
    /// `data`, once the bytes are in place.
    pub async fn write_data(
        &self,
        peer: Peer,
        local: Local<'_>,
        remote: &RemoteMemory,
        offset: u64,
        data: u64,
    ) -> Result<Completion> {
        self.one_sided(|ev, t| ev.write_data(&peer, local, remote, offset, data, t))
            .await
    }

    /// The next notice of a peer's [`write_data`](LoopHandle::write_data)
    /// to this loop: a [`RemoteWrite`](crate::OpKind::RemoteWrite)
    /// completion with the peer's `data` (and its source where the
    /// provider says), in the order they came. Notices that came while no
    /// future awaited one are kept, the oldest first, up to
    /// 1,024 (then the oldest is dropped, saying so); one handed to a
    /// future dropped before it took it goes to the next (one already
    /// waiting, or the next to ask). Where the
    /// fabric's notices use up a receive (providers with `FI_RX_CQ_DATA`,
    /// and fabric-msg's follow-up message where the fabric has no remote
    /// CQ data), they complete the untagged receives the application
    /// posted instead, as kind `RemoteWrite`, as on the blocking loop.
    pub async fn remote_write(&self) -> Result<Completion> {
        let t = match self.shared().lock().await_notice()? {
            Ok(c) => return Ok(c),
            Err(t) => t,
        };
        op::wait(self.shared().clone(), t, OnDrop::Forget)
            .await
            .map_err(|e| e.error)
    }

    /// A u64 atomic on `peer`'s memory at `offset` of `remote`
    /// ([`EventLoop::atomic`]): a fetched value comes back in the
    /// completion's [`value`](Completion::value). Atomics through a handle
    /// and through the blocking loop of the same fabric use one carrier,
    /// so they are atomic with respect to each other.
    ///
    /// Where the fabric's atomics are emulated, the target's loop applies
    /// the request when it is looked at: behind an [`AsyncLoop`] that is
    /// whenever one of its futures or its driver looks, so a target with
    /// nothing in flight answers within its driver's sleep (its wait fd
    /// wakes it; on a loop without one, within
    /// [`IDLE_PERIOD`](super::IDLE_PERIOD)).
    ///
    /// [`AsyncLoop`]: super::AsyncLoop
    pub async fn atomic(
        &self,
        peer: Peer,
        op: Atomic,
        remote: &RemoteMemory,
        offset: u64,
    ) -> Result<Completion> {
        self.one_sided(|ev, t| ev.atomic(&peer, op, remote, offset, t))
            .await
    }

    /// Post with `post` (retried while the loop has no room, see the
    /// module) and await its completion.
    async fn one_sided(
        &self,
        mut post: impl FnMut(&mut EventLoop, Token) -> Result<()>,
    ) -> Result<Completion> {
        let mut since: Option<Instant> = None;
        let t = loop {
            let posted = self
                .shared()
                .lock()
                .post_bare(|ev, t| failing_fast(ev, |ev| post(ev, t)));
            match posted {
                Ok(t) => break t,
                Err(Error::QueueFull {
                    call,
                    in_flight,
                    code,
                    ..
                }) => {
                    let started = *since.get_or_insert_with(Instant::now);
                    self.look_for_room(started, call, in_flight, code)?;
                    tokio::task::yield_now().await;
                }
                Err(e) => return Err(e),
            }
        };
        op::wait(self.shared().clone(), t, OnDrop::GoOn)
            .await
            .map_err(|e| e.error)
    }
}
