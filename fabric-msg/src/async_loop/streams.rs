//! Multi-receive buffers behind the handles: one post, many completions.
//! Each buffer in flight has a stream of its own (not a slot: a slot holds
//! one result), under a token with [`STREAM`] set, where its completions
//! queue until its [`MultiRecv`](super::MultiRecv) takes them. The table
//! lives in the handles' shared state (`async_loop/shared.rs`), which
//! routes completions here; `async_loop/multi_recv.rs` posts and reads.
//!
//! The loop releases a multi-receive buffer when it hands out its last
//! completion, and a piece's bytes can then no longer be read through the
//! loop. The stream holds that buffer from then until the last completion
//! is taken, so every piece before it can still be read
//! ([`Streams::bytes`]), as on the blocking loop within one batch.

use crate::memory::buffer::Buffer;
use crate::transport::event_loop::{Completion, EventLoop, Token};
use std::collections::VecDeque;
use std::task::Waker;

/// Set in a stream's token; the rest is its index. Slots' tokens are
/// their index in the table, and the loop's own are the top two values.
const STREAM: u64 = 1 << 62;

/// One multi-receive buffer's completions.
#[derive(Default)]
struct Stream {
    /// Completions not yet taken, oldest first.
    queue: VecDeque<Completion>,
    /// The task that awaits the next one.
    waker: Option<Waker>,
    /// The buffer, back from the loop with the last completion (which is
    /// in `queue`), until that completion is taken.
    held: Option<Buffer>,
    /// The last completion came: the buffer is off the loop.
    ended: bool,
    /// The loop closed before the last completion came; told once.
    closed: bool,
    /// Its `MultiRecv` was dropped: what comes is dropped, and the stream
    /// goes with the last completion.
    dropped: bool,
    /// In use. A free entry keeps its queue's room for the next buffer, so
    /// a buffer posted again allocates nothing.
    live: bool,
}

/// Every stream, in a table whose entries are reused.
#[derive(Default)]
pub(super) struct Streams {
    list: Vec<Stream>,
    free: Vec<usize>,
}

/// Whether `t` is a stream's token.
pub(super) fn is_stream(t: Token) -> bool {
    t.0 & STREAM != 0 && t.0 < Token::PEER_LOST.0
}

/// What the next look at a stream gives.
// A completion is held in place: boxing it would allocate per piece.
#[allow(clippy::large_enum_variant)]
pub(super) enum Next {
    /// A completion; the last one carries the buffer.
    Piece(Completion),
    /// The loop closed before the buffer came back.
    Closed,
    /// Nothing more: the last completion was taken.
    Ended,
    /// Nothing yet.
    Empty,
}

/// What a dropped stream asks of the loop.
pub(super) enum Dropped {
    /// Nothing: its buffer is off the loop already (or it was not a
    /// stream).
    Gone,
    /// Cancel its buffer, still posted; the stream goes when the cancel's
    /// completion (or a last piece) comes.
    Cancel,
}

impl Streams {
    fn get(&mut self, t: Token) -> Option<&mut Stream> {
        self.list.get_mut((t.0 & !STREAM) as usize).filter(|s| s.live)
    }

    /// A new stream's token.
    pub(super) fn open(&mut self) -> Token {
        let i = self.free.pop().unwrap_or_else(|| {
            self.list.push(Stream::default());
            self.list.len() - 1
        });
        self.list[i].live = true;
        Token(STREAM | i as u64)
    }

    /// Free stream `t`'s entry, keeping its queue's room.
    pub(super) fn remove(&mut self, t: Token) {
        let i = (t.0 & !STREAM) as usize;
        if let Some(s) = self.list.get_mut(i).filter(|s| s.live) {
            let mut queue = std::mem::take(&mut s.queue);
            queue.clear();
            *s = Stream {
                queue,
                ..Stream::default()
            };
            self.free.push(i);
        }
    }

    /// A completion of stream `c.token` came: queued, its task woken; or
    /// dropped, if the stream was. Whether it was the last (a completion
    /// that gives the buffer back, or a failed one).
    pub(super) fn arrived(&mut self, mut c: Completion) -> bool {
        let last = c.buffer.is_some() || c.result.is_err();
        let token = c.token;
        let Some(s) = self.get(token) else {
            log::warn!("async loop: a completion of a multi-receive buffer nobody holds dropped");
            return false;
        };
        if s.dropped {
            if last {
                self.remove(token);
            }
            return last;
        }
        if last {
            s.ended = true;
            s.held = c.buffer.take();
        }
        s.queue.push_back(c);
        if let Some(w) = s.waker.take() {
            w.wake();
        }
        last
    }

    /// Take stream `t`'s next completion; `waker` is woken when one comes
    /// if there is none.
    pub(super) fn next(&mut self, t: Token, waker: &Waker) -> Next {
        let Some(s) = self.get(t) else {
            return Next::Ended;
        };
        if let Some(mut c) = s.queue.pop_front() {
            if s.queue.is_empty() && s.ended {
                c.buffer = s.held.take();
            }
            return Next::Piece(c);
        }
        if s.closed {
            s.closed = false;
            return Next::Closed;
        }
        if s.ended {
            return Next::Ended;
        }
        match &s.waker {
            Some(w) if w.will_wake(waker) => {}
            _ => s.waker = Some(waker.clone()),
        }
        Next::Empty
    }

    /// `f` on the bytes of `piece`, a completion of stream `t` already
    /// taken: through `ev` while the buffer is posted, from the held buffer
    /// once it is back. `None` once the buffer was taken with the last
    /// completion (read the piece from it), or for a completion that is not
    /// one of this stream's pieces.
    pub(super) fn bytes<R>(
        &mut self,
        t: Token,
        ev: Option<&EventLoop>,
        piece: &Completion,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Option<R> {
        if piece.token != t {
            return None;
        }
        let (offset, len) = piece.multi?;
        let s = self.get(t)?;
        if let Some(b) = s.held.as_ref() {
            return b.payload_at(offset, len).map(f);
        }
        if s.ended {
            return None;
        }
        ev?.multi_recv_bytes(piece).map(f)
    }

    /// Stream `t`'s `MultiRecv` was dropped: pieces not taken are dropped,
    /// and the stream with them if its buffer is off the loop.
    pub(super) fn drop_stream(&mut self, t: Token) -> Dropped {
        let Some(s) = self.get(t) else {
            return Dropped::Gone;
        };
        if s.ended {
            self.remove(t);
            return Dropped::Gone;
        }
        s.dropped = true;
        s.queue.clear();
        s.waker = None;
        Dropped::Cancel
    }

    /// The loop closed: each stream whose buffer was still posted is told
    /// once, and dropped ones go. How many streams ended here.
    pub(super) fn close(&mut self) -> usize {
        let mut ended = 0;
        for i in 0..self.list.len() {
            let s = &mut self.list[i];
            if !s.live || s.ended {
                continue;
            }
            ended += 1;
            if s.dropped {
                self.remove(Token(STREAM | i as u64));
            } else {
                s.ended = true;
                s.closed = true;
                if let Some(w) = s.waker.take() {
                    w.wake();
                }
            }
        }
        ended
    }
}
