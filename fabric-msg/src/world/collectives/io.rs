//! What the collectives' engine posts with: the World's parts ([`Io`]),
//! the reserved tokens, the buffer pool, and one post that never waits for
//! room in the provider's queue.

use crate::error::Error;
use crate::memory::buffer::Buffer;
use crate::transport::event_loop::{
    Completion, CompletionError, EndpointId, EventLoop, Peer, PostError, Token,
};
use crate::world::lane::Lane;
use crate::world::liveness::Liveness;
use crate::world::local::Local;
use crate::world::tags;
use std::sync::Arc;
use std::time::Duration;

/// The World's parts a run posts with: the main loop, and the
/// shared-memory loop for ranks on this node where there is one
/// (`world/local.rs`). [`Io::lane`] says which carries a peer.
#[derive(Debug)]
pub(crate) struct Io<'a> {
    pub ev: &'a mut EventLoop,
    pub ep: EndpointId,
    pub peers: &'a [Peer],
    pub local: Option<&'a mut Local>,
    pub rank: u32,
    /// `Arc`'d, so that a run may record a loss (`Liveness::lose`).
    pub live: &'a Arc<Liveness>,
}

impl Io<'_> {
    /// The loop and address that carry messages to and from `peer`.
    /// The World's sends go through here too, so the rule is in one place.
    pub(crate) fn lane(&mut self, peer: u32) -> Lane<'_> {
        match self.local.as_deref_mut() {
            Some(l) if l.carries(peer) => l.side.lane(peer).expect("carried"),
            _ => Lane::Fabric {
                ev: &mut *self.ev,
                ep: self.ep,
                peer: &self.peers[peer as usize],
            },
        }
    }

    /// Whether a message in the World's class came from another sender
    /// than the rank its tag names: sent by no rank of this world. Where
    /// the provider says who sent a message (`FI_SOURCE`), every rank is
    /// in the lane's AV, so a sender the provider cannot name (no source
    /// on a loop that reports sources: `FI_ADDR_NOTAVAIL`, as libfabric
    /// 2.1's shm gives for an endpoint outside the AV) is no rank either;
    /// on the node loop, the ring names its one writer.
    pub(crate) fn forged(&mut self, c: &Completion) -> bool {
        let claimed = tags::source_of(c.tag);
        if claimed as usize >= self.peers.len() {
            return true;
        }
        self.lane(claimed).forged(c, claimed)
    }

    /// Whether either loop frames messages (then no zero-copy transfers).
    pub(crate) fn framed(&self) -> bool {
        self.ev.framed() || self.local.as_ref().is_some_and(|l| l.side.framed())
    }

    /// The largest payload both loops inject.
    pub(crate) fn inject_max(&self) -> usize {
        let main = self.ev.inject_max();
        self.local
            .as_ref()
            .map_or(main, |l| main.min(l.side.inject_max()))
    }

    /// Whether both loops fail a post the provider refuses at once
    /// (`EventLoop::set_fail_fast`) instead of waiting for room: on while the
    /// collectives post, which keep what was refused and post it at their
    /// next progress. Returns the old setting.
    pub(crate) fn fail_fast(&mut self, on: bool) -> bool {
        if let Some(l) = self.local.as_mut() {
            l.side.set_fail_fast(on);
        }
        self.ev.set_fail_fast(on)
    }

    /// Poll both loops (see `Local::poll`), or the main one alone.
    pub(crate) fn poll(
        &mut self,
        out: &mut Vec<Completion>,
        timeout: Option<Duration>,
    ) -> crate::error::Result<usize> {
        match self.local.as_mut() {
            Some(l) => l.poll(self.ev, self.ep, out, timeout),
            None => self.ev.poll(out, timeout),
        }
    }
}

/// Top byte of every token the collectives use; `World::send` and
/// `World::recv` refuse it.
pub(crate) const RESERVED: u64 = 0xFE;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Send = 1,
    Recv = 2,
    NoticeSend = 3,
    NoticeRecv = 4,
    /// A send straight from a run's working array.
    BorrowedSend = 5,
}

/// The token of operation `index` of kind `kind` of the engine's run `id`
/// (the run's engine-wide number, mod 2^20, not its number in its
/// communicator: tokens never leave this rank).
pub(crate) fn token(kind: Kind, id: u32, index: u32) -> Token {
    Token(
        (RESERVED << 56) | ((kind as u64) << 52) | (u64::from(id & tags::SEQ_MASK) << 32) | u64::from(index),
    )
}

/// Whether `token` is one of the collectives' own.
pub(crate) fn is_reserved(token: Token) -> bool {
    token.0 >> 56 == RESERVED
}

pub(crate) fn decode(token: Token) -> (u64, u32, u32) {
    (
        (token.0 >> 52) & 0xf,
        ((token.0 >> 32) as u32) & tags::SEQ_MASK,
        token.0 as u32,
    )
}

/// Longest failure notice, in bytes.
pub(crate) const NOTICE_MAX: usize = 1024;
/// Receives a run keeps posted beyond its current round.
pub(crate) const AHEAD: usize = 64;
/// How long a failure notice is retried while a rank's queue is full.
pub(crate) const NOTICE_PATIENCE: Duration = Duration::from_secs(10);
/// Buffers and bytes the pool keeps for reuse.
pub(crate) const POOL_BUFFERS: usize = 256;
pub(crate) const POOL_BYTES: usize = 64 << 20;

/// Receive and send buffers, reused across rounds and collectives (each
/// keeps its registration where the provider needs one).
#[derive(Debug, Default)]
pub(crate) struct Pool {
    free: Vec<Buffer>,
    bytes: usize,
}

impl Pool {
    /// A buffer of `len` bytes (its capacity may be larger).
    pub(crate) fn take(&mut self, len: usize) -> Buffer {
        let best = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.capacity() >= len)
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i);
        match best {
            Some(i) => {
                let mut b = self.free.swap_remove(i);
                self.bytes -= b.capacity();
                b.set_len(len);
                b
            }
            None => Buffer::new(len),
        }
    }

    pub(crate) fn give(&mut self, b: Buffer) {
        if self.free.len() < POOL_BUFFERS && self.bytes + b.capacity() <= POOL_BYTES {
            self.bytes += b.capacity();
            self.free.push(b);
        }
    }
}

/// What runs share: the buffer pool.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub(crate) pool: Pool,
}

/// Why a run stopped, before it is known whether a lost rank explains it.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) message: String,
    /// How long to wait for liveness to name a lost rank first.
    pub(crate) grace: Duration,
}

impl Failure {
    pub(crate) fn seen(message: String) -> Failure {
        Failure {
            message,
            grace: Duration::ZERO,
        }
    }
}

/// What a message in the World's class that no rank sent ([`Io::forged`])
/// ends its receive with.
pub(crate) fn forged(claimed: u32) -> CompletionError {
    CompletionError::Failed {
        code: crate::error::ErrorCode(crate::ffi::FI_EIO),
        text: crate::error::strerror(crate::ffi::FI_EIO),
        prov_errno: 0,
        prov_text: format!(
            "a message that claims to come from rank {claimed} came from another address: a forged message \
             in the World's tag class, sent by no rank of this world; dropped, and this collective cannot \
             complete"
        ),
    }
}

pub(crate) fn post_failed(sh: &mut Shared, e: PostError, what: &str) -> Failure {
    if let Some(b) = e.buffer {
        sh.pool.give(b);
    }
    Failure::seen(format!("posting {what} failed: {}", e.error))
}

/// A message laid out for the provider.
#[derive(Debug)]
pub(crate) struct Outgoing {
    pub(crate) peer: u32,
    pub(crate) tag: u64,
    pub(crate) buf: Buffer,
    /// Small enough for `fi_tinject`: no completion, the buffer is free at once.
    pub(crate) inject: bool,
}

/// Post `o` once, without waiting for room: `Ok(Some(o))` back when the
/// provider's queue is full (the caller keeps it for later).
pub(crate) fn post_outgoing(
    io: &mut Io<'_>,
    sh: &mut Shared,
    o: Outgoing,
    t: Token,
) -> Result<Option<Outgoing>, Failure> {
    let what = |e: &Error| Failure::seen(format!("posting a send to rank {} failed: {e}", o.peer));
    if o.inject {
        return match io.lane(o.peer).inject(o.tag, o.buf.as_slice()) {
            Ok(()) => {
                sh.pool.give(o.buf);
                Ok(None)
            }
            Err(Error::QueueFull { .. }) => Ok(Some(o)),
            Err(e) => Err(what(&e)),
        };
    }
    match io.lane(o.peer).send(false, o.tag, o.buf, t) {
        Ok(()) => Ok(None),
        Err(PostError {
            error: Error::QueueFull { .. },
            buffer: Some(buf),
        }) => Ok(Some(Outgoing { buf, ..o })),
        Err(e) => {
            let f = what(&e.error);
            sh.pool.give_opt(e.buffer);
            Err(f)
        }
    }
}

impl Pool {
    pub(crate) fn give_opt(&mut self, b: Option<Buffer>) {
        if let Some(b) = b {
            self.give(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{decode, is_reserved, token, Kind, Pool, POOL_BUFFERS};
    use crate::memory::buffer::Buffer;
    use crate::transport::event_loop::Token;
    use crate::world::tags;

    #[test]
    fn tokens_carry_kind_number_and_index_in_the_reserved_range() {
        let t = token(Kind::Recv, tags::SEQ_MASK + 3, 77);
        assert!(is_reserved(t));
        assert_eq!(decode(t), (Kind::Recv as u64, 2, 77));
        assert!(!is_reserved(Token(0)) && !is_reserved(Token(u64::MAX >> 8)));
        assert!(!is_reserved(Token::REMOTE));
    }

    #[test]
    fn the_pool_reuses_the_smallest_buffer_that_fits() {
        let mut p = Pool::default();
        p.give(Buffer::new(100));
        p.give(Buffer::new(10));
        p.give(Buffer::new(1000));
        let b = p.take(50);
        assert_eq!((b.capacity(), b.len()), (100, 50));
        assert_eq!(p.take(2000).capacity(), 2000, "nothing fits: a new one");
        assert_eq!(p.bytes, 1010);
        for _ in 0..POOL_BUFFERS * 2 {
            p.give(Buffer::new(1));
        }
        assert!(p.free.len() <= POOL_BUFFERS);
    }
}
