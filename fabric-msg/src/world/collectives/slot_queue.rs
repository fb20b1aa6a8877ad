//! The World's non-blocking collectives queued in the node's slots, as
//! plain parts: each call with its data and where its result goes, and
//! what one step of it does in the slots (`on_node.rs`). The World's side,
//! when calls are posted and finished, is `world/node_requests.rs`.

use super::on_node::{fold_in_rank_order, Call, Kind, NodeColl};
use super::ops::{bytes_of, Element, Reduction};
use super::run::Outcome;
use crate::error::Error;
use std::collections::VecDeque;

/// The queued calls, oldest first.
#[derive(Default)]
pub(crate) struct SlotRequests {
    pub(crate) queue: VecDeque<Box<dyn SlotRequest>>,
}

impl std::fmt::Debug for SlotRequests {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotRequests")
            .field("queued", &self.queue.len())
            .finish()
    }
}

impl SlotRequests {
    /// Whether the call the engine numbered `id` is still queued.
    pub(crate) fn holds(&self, id: u32) -> bool {
        self.queue.iter().any(|q| q.id() == id)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }
}

/// One queued call with its element type erased.
pub(crate) trait SlotRequest: Send {
    fn id(&self) -> u32;
    fn k(&self) -> u64;
    fn call(&self) -> &Call;
    fn posted(&self) -> bool;
    /// Post this rank's part of slot `k` (room was checked).
    fn post(&mut self, nc: &mut NodeColl);
    /// Every header is in and agrees: the result, from the slots.
    fn complete(&mut self, nc: &mut NodeColl);
    fn fail(&mut self, e: Error);
}

pub(crate) struct Queued<T: Element> {
    id: u32,
    k: u64,
    call: Call,
    posted: bool,
    data: Vec<T>,
    reduction: Option<Reduction<T>>,
    me: u32,
    outcome: Outcome<T>,
}

impl<T: Element> Queued<T> {
    /// Call `call` (numbered `id` by the engine, slot number `k`) over
    /// `data`, on rank `me`; its result goes to `outcome`.
    pub(crate) fn new(
        id: u32,
        k: u64,
        call: Call,
        data: Vec<T>,
        reduction: Option<Reduction<T>>,
        me: u32,
        outcome: Outcome<T>,
    ) -> Queued<T> {
        Queued {
            id,
            k,
            call,
            posted: false,
            data,
            reduction,
            me,
            outcome,
        }
    }
}

impl<T: Element> SlotRequest for Queued<T> {
    fn id(&self) -> u32 {
        self.id
    }

    fn k(&self) -> u64 {
        self.k
    }

    fn call(&self) -> &Call {
        &self.call
    }

    fn posted(&self) -> bool {
        self.posted
    }

    fn post(&mut self, nc: &mut NodeColl) {
        let carries = match self.call.kind {
            Kind::Allreduce | Kind::Reduce => true,
            Kind::Broadcast => self.me == self.call.root,
            Kind::Barrier | Kind::Refused => false,
        };
        let mine: &[u8] = if carries { bytes_of(&self.data) } else { &[] };
        nc.post(self.k, &self.call, mine, 0);
        self.posted = true;
    }

    fn complete(&mut self, nc: &mut NodeColl) {
        let (k, call, me) = (self.k, self.call, self.me);
        let mut data = std::mem::take(&mut self.data);
        match (call.kind, &self.reduction) {
            (Kind::Allreduce, Some(r)) => fold_in_rank_order(nc, k, &mut data, r, &mut Vec::new()),
            (Kind::Reduce, Some(r)) if me == call.root => {
                fold_in_rank_order(nc, k, &mut data, r, &mut Vec::new())
            }
            // As the message schedule gives it: the result on the root,
            // nothing elsewhere.
            (Kind::Reduce, _) => data = Vec::new(),
            (Kind::Broadcast, _) if me != call.root => {
                T::read(nc.data(k, call.root, call.bytes()), &mut data)
            }
            _ => {}
        }
        *self.outcome.lock() = Some(Ok(data));
    }

    fn fail(&mut self, e: Error) {
        *self.outcome.lock() = Some(Err(e));
    }
}
