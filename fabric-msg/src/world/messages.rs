//! The typed messages' operations in flight: a slot per operation, found
//! again by the token it was posted with (top byte `0xFC`), holding its
//! completion until the [`Request`](super::request::Request) that owns the
//! slot is waited for.
//!
//! Every typed message goes through a buffer of the World's pool: a send
//! copies its elements in before it is posted, a receive lands there and
//! is copied out when waited for. So the application's own memory is never
//! the provider's, and dropping a request is always safe: the slot is
//! marked abandoned (through a list the request shares with this table,
//! as `Drop` has no `&mut World`), and when its completion comes the
//! buffer goes back to the pool. Slots and buffers are reused, so after
//! warm-up nothing here allocates per message.

use super::collectives::io::Pool;
use super::kept::keep;
use crate::transport::event_loop::{Completion, Token};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Top byte of the typed messages' tokens.
pub(crate) const MESSAGE: u64 = 0xFC;

/// Whether `token` is a typed message's.
pub(crate) fn is_message(token: Token) -> bool {
    token.0 >> 56 == MESSAGE
}

/// One operation's slot, with the generation it was opened in (a slot is
/// reused; a stale token never reaches its next user).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ticket {
    slot: u32,
    generation: u32,
}

impl Ticket {
    /// The token to post with.
    pub(crate) fn token(self) -> Token {
        Token((MESSAGE << 56) | (u64::from(self.generation & 0xff_ffff) << 32) | u64::from(self.slot))
    }

    fn of(token: Token) -> Ticket {
        Ticket {
            slot: token.0 as u32,
            generation: ((token.0 >> 32) & 0xff_ffff) as u32,
        }
    }
}

// Slots are reused, never moved per message: boxing the completion
// would allocate for every one.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum State {
    Free,
    Pending { abandoned: bool, recv: bool },
    Done(Completion),
}

#[derive(Debug)]
struct Slot {
    generation: u32,
    state: State,
}

/// Tickets of requests dropped before they were waited for (on any
/// thread), and whether there are any: the World looks at every turn of a
/// wait, and a look at a flag costs no lock. Kept for the process's life
/// (`kept.rs`), so each request holds a plain reference.
#[derive(Debug, Default)]
pub(crate) struct Abandoned {
    list: Mutex<Vec<Ticket>>,
    /// Set after each push, under the lock; cleared by the World before
    /// it takes the list.
    any: AtomicBool,
}

impl Abandoned {
    /// The request of ticket `t` was dropped unwaited.
    pub(crate) fn push(&self, t: Ticket) {
        let mut list = self.list.lock();
        list.push(t);
        self.any.store(true, Ordering::Release);
    }

    /// The tickets pushed since the last take. A push that comes after
    /// the flag was cleared is either taken now (it was in the list when
    /// the lock was taken) or sets the flag again for the next take.
    fn take(&self) -> Vec<Ticket> {
        if !self.any.load(Ordering::Acquire) {
            return Vec::new();
        }
        self.any.store(false, Ordering::Relaxed);
        std::mem::take(&mut *self.list.lock())
    }
}

/// The table of typed operations in flight, and their buffers.
#[derive(Debug)]
pub(crate) struct Messages {
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Buffers of typed messages, reused.
    pub(crate) pool: Pool,
    abandoned: &'static Abandoned,
    /// Tokens of dropped receives to cancel, found by [`Messages::sweep`].
    pub(crate) cancels: Vec<Token>,
}

impl Default for Messages {
    fn default() -> Messages {
        Messages {
            slots: Vec::new(),
            free: Vec::new(),
            pool: Pool::default(),
            abandoned: keep(Abandoned::default()),
            cancels: Vec::new(),
        }
    }
}

impl Messages {
    /// A slot for an operation about to be posted: a receive (`recv`) or
    /// a send.
    pub(crate) fn open(&mut self, recv: bool) -> Ticket {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    state: State::Free,
                });
                (self.slots.len() - 1) as u32
            }
        };
        let s = &mut self.slots[slot as usize];
        s.generation = s.generation.wrapping_add(1) & 0xff_ffff;
        s.state = State::Pending {
            abandoned: false,
            recv,
        };
        Ticket {
            slot,
            generation: s.generation,
        }
    }

    /// The list a request puts its ticket on when dropped unwaited.
    pub(crate) fn abandoned(&self) -> &'static Abandoned {
        self.abandoned
    }

    fn slot(&mut self, t: Ticket) -> Option<&mut Slot> {
        self.slots
            .get_mut(t.slot as usize)
            .filter(|s| s.generation == t.generation)
    }

    fn release(&mut self, t: Ticket) {
        if let Some(s) = self.slot(t) {
            if let State::Done(c) = std::mem::replace(&mut s.state, State::Free) {
                self.pool.give_opt(c.buffer);
            }
            self.free.push(t.slot);
        }
    }

    /// The post of `t` failed: its slot is free again.
    pub(crate) fn unpost(&mut self, t: Ticket) {
        self.release(t);
    }

    /// Take the typed messages' completions out of `out`.
    pub(crate) fn absorb(&mut self, out: &mut Vec<Completion>) {
        if !out.iter().any(|c| is_message(c.token)) {
            return;
        }
        if out.iter().all(|c| is_message(c.token)) {
            // The usual batch, a typed message's completion alone: each
            // is moved once, into its slot, with no shift of the others.
            for c in out.drain(..) {
                self.complete(c);
            }
            return;
        }
        let mut i = 0;
        while i < out.len() {
            if is_message(out[i].token) {
                let c = out.remove(i);
                self.complete(c);
            } else {
                i += 1;
            }
        }
    }

    fn complete(&mut self, c: Completion) {
        let t = Ticket::of(c.token);
        let Some(s) = self.slot(t) else {
            self.pool.give_opt(c.buffer);
            return;
        };
        match s.state {
            State::Pending { abandoned: false, .. } => s.state = State::Done(c),
            State::Pending { abandoned: true, .. } => {
                s.state = State::Done(c);
                self.release(t);
            }
            State::Free | State::Done(_) => self.pool.give_opt(c.buffer),
        }
    }

    /// Whether `t` has completed.
    pub(crate) fn is_done(&self, t: Ticket) -> bool {
        self.slots
            .get(t.slot as usize)
            .is_some_and(|s| s.generation == t.generation && matches!(s.state, State::Done(_)))
    }

    /// Whether `t` was posted and has not completed yet.
    pub(crate) fn in_flight(&self, t: Ticket) -> bool {
        self.slots
            .get(t.slot as usize)
            .is_some_and(|s| s.generation == t.generation && matches!(s.state, State::Pending { .. }))
    }

    /// `t`'s completion, once it came; the slot is free again.
    pub(crate) fn take(&mut self, t: Ticket) -> Option<Completion> {
        let s = self.slot(t)?;
        if !matches!(s.state, State::Done(_)) {
            return None;
        }
        let State::Done(c) = std::mem::replace(&mut s.state, State::Free) else {
            return None;
        };
        self.free.push(t.slot);
        Some(c)
    }

    /// Free the slots of requests dropped unwaited: at once if they
    /// completed, at their completion otherwise; the tokens of dropped
    /// receives still posted go to `cancels`, for the World to cancel.
    pub(crate) fn sweep(&mut self) {
        for t in self.abandoned.take() {
            match self.slot(t).map(|s| &mut s.state) {
                Some(State::Pending { abandoned, recv }) => {
                    *abandoned = true;
                    if *recv {
                        self.cancels.push(t.token());
                    }
                }
                Some(State::Done(_)) => self.release(t),
                _ => {}
            }
        }
    }

    /// Operations in flight or completed and not yet taken.
    #[cfg(test)]
    pub(crate) fn in_use(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::{is_message, Messages};
    use crate::memory::buffer::Buffer;
    use crate::transport::event_loop::{Completion, OpKind, Token};

    fn done(token: Token) -> Completion {
        let mut c = Completion::outcome(token, 0, OpKind::Recv, Ok(()));
        c.buffer = Some(Buffer::new(8));
        c
    }

    #[test]
    fn slots_are_reused_and_stale_tokens_never_reach_the_next_user() {
        let mut m = Messages::default();
        let a = m.open(true);
        assert!(is_message(a.token()));
        let mut out = vec![
            done(a.token()),
            Completion::outcome(Token(7), 0, OpKind::Send, Ok(())),
        ];
        m.absorb(&mut out);
        assert_eq!(out.len(), 1, "the application's completion stays");
        assert!(m.is_done(a));
        assert!(m.take(a).is_some());
        assert!(m.take(a).is_none(), "taken once");
        let b = m.open(true);
        assert_ne!(a.token(), b.token(), "same slot, new generation");
        let mut stale = vec![done(a.token())];
        m.absorb(&mut stale);
        assert!(
            !m.is_done(b),
            "a stale token does not complete the slot's new user"
        );
        assert_eq!(m.in_use(), 1);
    }

    #[test]
    fn a_dropped_request_frees_its_slot_when_its_completion_comes() {
        let mut m = Messages::default();
        let a = m.open(true);
        m.abandoned().push(a);
        let _b = m.open(false);
        m.sweep(); // a is pending: marked abandoned, its receive to cancel
        assert_eq!(m.cancels, vec![a.token()]);
        assert_eq!(m.in_use(), 2);
        let mut out = vec![done(a.token())];
        m.absorb(&mut out);
        assert_eq!(m.in_use(), 1, "freed at its completion");
        assert!(m.take(a).is_none());
        let c = m.open(false);
        assert_eq!(m.in_use(), 2);
        m.absorb(&mut vec![done(c.token())]);
        m.abandoned().push(c);
        m.sweep(); // c completed: freed at once
        assert_eq!(m.in_use(), 1);
        assert_eq!(m.cancels.len(), 1, "a send is never cancelled");
    }
}
