//! What a same-node operation reads from or writes into: a [`Buffer`] it
//! owns until its completion gives it back, or memory the caller lends
//! for the operation's life ([`NodeLoop::send_lent`](super::node_loop::NodeLoop::send_lent),
//! [`NodeLoop::recv_lent`](super::node_loop::NodeLoop::recv_lent)): the
//! collectives' working array, so that a large block goes from one
//! rank's array to the other's with no pool buffer on either side (one
//! `process_vm_readv`, where the two processes may read each other).

use crate::memory::buffer::Buffer;
use std::ptr::NonNull;

/// An operation's memory.
#[derive(Debug)]
pub(crate) enum Mem {
    Owned(Buffer),
    Lent(Lent),
}

/// Memory lent by the caller: `cap` bytes at `ptr`, of which `len` are
/// the message (a send's all; a receive's what arrived, all until then).
#[derive(Debug)]
pub(crate) struct Lent {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
}

// SAFETY: a `Lent` is the caller's promise (`send_lent`/`recv_lent`) that
// the memory stays valid, and unwritten by anyone else (for a receive,
// untouched by anyone else), until the operation's completion is handed
// out; the loop that holds it may move between threads as the rest of the
// loop does.
unsafe impl Send for Lent {}

impl Lent {
    /// `cap` bytes at `ptr`, all of them the message until a receive
    /// sets what arrived.
    ///
    /// # Safety
    /// `ptr..ptr + cap` stays valid for reads (and, for a receive, writes),
    /// and nothing else writes it (for a receive, reads or writes it), until
    /// the operation that holds this `Lent` has completed.
    pub(crate) unsafe fn new(ptr: NonNull<u8>, cap: usize) -> Lent {
        Lent { ptr, len: cap, cap }
    }

    /// The message's bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Mem {
    /// The message's bytes (a send's whole; a receive's so far).
    pub(crate) fn len(&self) -> usize {
        match self {
            Mem::Owned(b) => b.len(),
            Mem::Lent(l) => l.len(),
        }
    }

    /// How many bytes a receive may take.
    pub(crate) fn capacity(&self) -> usize {
        match self {
            Mem::Owned(b) => b.capacity(),
            Mem::Lent(l) => l.cap,
        }
    }

    /// Set the length (at most the capacity).
    pub(crate) fn set_len(&mut self, len: usize) {
        match self {
            Mem::Owned(b) => b.set_len(len),
            Mem::Lent(l) => l.len = len.min(l.cap),
        }
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            Mem::Owned(b) => b.as_slice(),
            // SAFETY: `Lent::new`'s promise: `len <= cap` bytes at `ptr`
            // stay valid and unwritten while the operation holds them.
            Mem::Lent(l) => unsafe { std::slice::from_raw_parts(l.ptr.as_ptr(), l.len) },
        }
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        match self {
            Mem::Owned(b) => b.as_mut_slice(),
            // SAFETY: as in `as_slice`; a receive's memory is the
            // operation's alone, and `&mut self` makes this the only view.
            Mem::Lent(l) => unsafe { std::slice::from_raw_parts_mut(l.ptr.as_ptr(), l.len) },
        }
    }

    /// The buffer, for the completion (`None` for lent memory).
    pub(crate) fn into_buffer(self) -> Option<Buffer> {
        match self {
            Mem::Owned(b) => Some(b),
            Mem::Lent(_) => None,
        }
    }

    pub(crate) fn is_lent(&self) -> bool {
        matches!(self, Mem::Lent(_))
    }
}

#[cfg(test)]
mod tests {
    use super::super::node_loop::{LentDone, NodeConfig, NodeLoop};
    use crate::transport::event_loop::{CompletionError, OpKind, Token};
    use std::ptr::NonNull;
    use std::time::{Duration, Instant};

    fn pair(cfg: NodeConfig) -> (NodeLoop, NodeLoop) {
        let mut l: Vec<NodeLoop> = (0..2).map(|r| NodeLoop::create(r, 2, cfg).unwrap()).collect();
        let names: Vec<_> = l.iter().map(NodeLoop::name).collect();
        for x in &mut l {
            for (p, n) in names.iter().enumerate() {
                x.connect(p, n).unwrap();
            }
        }
        let b = l.remove(1);
        (l.remove(0), b)
    }

    /// Poll both loops until `want` lent operations have finished on each.
    fn finish(a: &mut NodeLoop, b: &mut NodeLoop, want: usize) -> (Vec<LentDone>, Vec<LentDone>) {
        let (mut da, mut db, mut scratch) = (Vec::new(), Vec::new(), Vec::new());
        let until = Instant::now() + Duration::from_secs(10);
        while da.len() < want || db.len() < want {
            a.poll(&mut scratch);
            b.poll(&mut scratch);
            assert!(scratch.is_empty(), "no owned operation was posted");
            a.take_lent(&mut da);
            b.take_lent(&mut db);
            assert!(
                Instant::now() < until,
                "{} and {} of {want} in 10 s",
                da.len(),
                db.len()
            );
        }
        (da, db)
    }

    fn pattern(len: usize, seed: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + seed) as u8).collect()
    }

    /// From one working array to another: through the ring (small, and
    /// over one frame) and by single copy (large), the receive posted
    /// first or after the message came; a receive too small gets its
    /// capacity and `Truncated`.
    #[test]
    fn lent_memory_goes_whole_from_array_to_array() {
        for cfg in [
            NodeConfig::default(),
            NodeConfig {
                single_copy_from: 32 << 10,
                ..NodeConfig::default()
            },
        ] {
            for (len, receive_first) in [(8, true), (20_000, false), (100_000, true), (1 << 20, false)] {
                let (mut a, mut b) = pair(cfg);
                let src = pattern(len, len);
                let mut dst = vec![0u8; len];
                let post_recv = |b: &mut NodeLoop, dst: &mut Vec<u8>| {
                    let into = NonNull::new(dst.as_mut_ptr()).unwrap();
                    // SAFETY: `dst` lives, untouched, until `finish` has
                    // taken this receive's completion.
                    unsafe { b.recv_lent(Some(0), 5, 0, into, len, Token(2)) }.unwrap();
                };
                if receive_first {
                    post_recv(&mut b, &mut dst);
                }
                let data = NonNull::new(src.as_ptr().cast_mut()).unwrap();
                // SAFETY: `src` lives, unwritten, until its completion.
                unsafe { a.send_lent(1, 5, data, len, Token(1)) }.unwrap();
                if !receive_first {
                    let mut scratch = Vec::new();
                    for _ in 0..1000 {
                        a.poll(&mut scratch);
                        b.poll(&mut scratch);
                    }
                    post_recv(&mut b, &mut dst);
                }
                let (da, db) = finish(&mut a, &mut b, 1);
                assert_eq!(
                    (da[0].token, da[0].kind, da[0].len),
                    (Token(1), OpKind::Send, len)
                );
                assert_eq!(
                    (db[0].token, db[0].kind, db[0].len),
                    (Token(2), OpKind::Recv, len)
                );
                assert!(db[0].result.is_ok(), "{:?}", db[0].result);
                assert!(dst == src, "{len} bytes, receive first {receive_first}");
            }
            // Truncation into a smaller lent receive: its capacity arrives.
            let (mut a, mut b) = pair(cfg);
            let src = pattern(50_000, 3);
            let mut dst = vec![0u8; 10_000];
            let into = NonNull::new(dst.as_mut_ptr()).unwrap();
            // SAFETY: as above.
            unsafe { b.recv_lent(None, 6, 0, into, dst.len(), Token(4)) }.unwrap();
            let data = NonNull::new(src.as_ptr().cast_mut()).unwrap();
            // SAFETY: as above.
            unsafe { a.send_lent(1, 6, data, src.len(), Token(3)) }.unwrap();
            let (_, db) = finish(&mut a, &mut b, 1);
            assert_eq!(db[0].len, 10_000);
            assert!(matches!(
                db[0].result,
                Err(CompletionError::Truncated {
                    message_len: Some(50_000),
                    buffer_len: 10_000
                })
            ));
            assert!(dst[..] == src[..10_000]);
            // A lent receive is not taken back by cancel.
            let mut keep = [0u8; 8];
            let into = NonNull::new(keep.as_mut_ptr()).unwrap();
            // SAFETY: `keep` outlives `b`, which is dropped below first.
            unsafe { b.recv_lent(None, 7, 0, into, 8, Token(9)) }.unwrap();
            assert!(b.cancel_recv(Token(9)).is_none());
            drop(b);
        }
    }
}
