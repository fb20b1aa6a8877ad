//! A queued call larger than a slot (a non-blocking or persistent
//! `allreduce`, `broadcast` or `reduce`, `slot_queue.rs`) by one copy: the
//! blocking call's steps (`on_node_copy.rs` has them and why they are
//! safe; `world/node_collectives.rs` runs them), taken one turn of the
//! World at a time instead of waiting in place.
//!
//! The call's vector is the memory it offers: its header carries the
//! vector's address (a vector's heap memory does not move while the queue
//! owns it). Once every header is in and says one copy:
//!
//! 1. **Start.** An allreduce folds its own part (reading every other
//!    rank's piece of it) and posts its phase word; a reduce's root folds
//!    all of it; a broadcast's other ranks read the root's data.
//! 2. **Phases** (an allreduce): it waits, queued, for every other rank's
//!    phase word, then reads every other rank's final part.
//! 3. **Lending.** Once it reads nothing more it says `done`, so the next
//!    call's `done` can follow in order. A rank whose memory others may
//!    still read (every rank of an allreduce, a broadcast's root, a
//!    reduce's other ranks) then keeps its vector until every other rank
//!    is done too, and only then gives it back with the result. Until
//!    then the call stays at the head of its queue, so a later call is
//!    finished after it, as `done` must be.
//!
//! A failed read fails the call as the blocking one fails, after the same
//! wait: no rank's memory is given back while another may read it.

use super::on_node::{Call, Differs, NodeColl};
use super::on_node_copy::{self, lends};
use super::ops::{Element, Reduction};

/// Where a queued call by one copy is.
#[derive(Debug)]
pub(crate) enum Copying {
    /// Every header is in and says one copy: nothing read yet.
    Start,
    /// An allreduce's own part is final and said so: it waits for every
    /// other rank's.
    Phases,
    /// `done` is said; the vector waits until no other rank reads it. The
    /// call's result (the failure, if a read failed).
    Lending(Result<(), Differs>),
}

/// What a step did.
#[derive(Debug)]
pub(crate) enum Moved {
    /// Nothing: it waits for other ranks.
    Not,
    /// It moved, and waits for other ranks now.
    On,
    /// It is over: `done` is said and no rank reads its vector any more.
    Over(Result<(), Differs>),
}

/// Take `state` as far as it goes now, for collective `k` over `data`.
pub(crate) fn step<T: Element>(
    state: &mut Copying,
    nc: &mut NodeColl,
    (k, call): (u64, &Call),
    data: &mut [T],
    reduction: Option<&Reduction<T>>,
) -> Moved {
    let me = nc.me();
    let mut moved = false;
    loop {
        let next = match state {
            Copying::Start => match on_node_copy::start(nc, (k, call), data, reduction) {
                Ok(true) => Copying::Phases,
                read => {
                    nc.finish(k);
                    Copying::Lending(read.map(|_| ()))
                }
            },
            Copying::Phases => {
                let read = match nc.phases(k) {
                    Ok(false) => return if moved { Moved::On } else { Moved::Not },
                    Ok(true) => on_node_copy::read_other_parts(nc, k, data),
                    Err(d) => Err(d),
                };
                nc.finish(k);
                Copying::Lending(read)
            }
            Copying::Lending(_) if lends(call, me) && !nc.all_done(k) => {
                return if moved { Moved::On } else { Moved::Not };
            }
            Copying::Lending(read) => {
                let read = std::mem::replace(read, Ok(()));
                return Moved::Over(read);
            }
        };
        *state = next;
        moved = true;
    }
}

/// Whether what a call in `state` waits for may have come: what a sleeper
/// checks once its doorbell is armed.
pub(crate) fn came(state: &Copying, nc: &NodeColl, (k, call): (u64, &Call)) -> bool {
    match state {
        Copying::Start => true,
        Copying::Phases => !matches!(nc.phases(k), Ok(false)),
        Copying::Lending(_) => !lends(call, nc.me()) || nc.all_done(k),
    }
}
