//! Large same-node messages in one copy: the receiver reads the sender's
//! buffer straight into its own with `process_vm_readv(2)` (Linux's
//! cross-memory attach, CMA), as Open MPI's vader and UCX's `cma`
//! transport do, instead of both copying through the ring.
//!
//! The protocol, on the rings that carry everything else:
//!
//! 1. The sender writes a *request* frame (flags `FIRST | LAST | RNDV`):
//!    the message's tag and length, and as payload the buffer's address in
//!    the sender and a number naming the send. The send's buffer stays
//!    with the sender's loop.
//! 2. The receiver matches the request as it matches any message (so
//!    order and any-source rules are unchanged). When a receive takes it,
//!    the receiver reads the bytes (at most the receive's capacity) and
//!    writes an *ack* frame (flags `ACK`) to the sender: the number and 0,
//!    or the `errno` of a failed read.
//! 3. The ack completes the send and gives its buffer back.
//!
//! The kernel lets a process read another's memory only where `ptrace`
//! would let it (same user, same PID namespace, and under Yama's
//! `ptrace_scope` 1 only a descendant). So each receiver tries a read of
//! every sender's segment header when it connects and records the answer
//! in the ring's line 1, which the sender reads before it chooses: where
//! the read was refused, large messages stream through the ring instead.

use std::io::IoSliceMut;

/// Payload bytes of a request frame: address, number.
pub const REQUEST_LEN: usize = 16;
/// Payload bytes of an ack frame: number, status.
pub const ACK_LEN: usize = 16;

/// A control frame's payload: two words (request: address and number;
/// ack: number and status).
pub fn encode(a: u64, b: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&a.to_ne_bytes());
    out[8..].copy_from_slice(&b.to_ne_bytes());
    out
}

/// The two words of a control frame's payload.
pub fn decode(bytes: &[u8; 16]) -> (u64, u64) {
    let word = |i: usize| u64::from_ne_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
    (word(0), word(8))
}

/// Whether this process may read 8 bytes at `addr` in process `pid` and
/// finds `expect` there.
pub fn can_read(pid: u32, addr: u64, expect: u64) -> bool {
    let mut word = [0u8; 8];
    read(pid, addr, &mut word).is_ok() && u64::from_ne_bytes(word) == expect
}

/// Read `dst.len()` bytes at `addr` in process `pid` into `dst`; the
/// `errno` of a failed read (`EFAULT` for an address the sender does not
/// have, `EPERM` where reading is not allowed, `ESRCH` for a process that
/// is gone).
pub fn read(pid: u32, addr: u64, dst: &mut [u8]) -> Result<(), i32> {
    let mut done = 0usize;
    while done < dst.len() {
        let left = dst.len() - done;
        let local = [IoSliceMut::new(&mut dst[done..])];
        // The remote side is an address in another process, not memory of
        // ours: its iovec is built by hand.
        let remote_iov = libc::iovec {
            iov_base: (addr as usize).wrapping_add(done) as *mut libc::c_void,
            iov_len: left,
        };
        // SAFETY: `local` is one iovec over `dst[done..]`, which we own
        // mutably (`IoSliceMut` is ABI-compatible with `iovec` on Unix); the remote iovec is only read by the kernel, which
        // checks it against the other process's mappings (EFAULT if it
        // is not there). Nothing else in this process is written.
        let n = unsafe {
            libc::process_vm_readv(
                pid as libc::pid_t,
                local.as_ptr().cast::<libc::iovec>(),
                1,
                &remote_iov,
                1,
                0,
            )
        };
        if n <= 0 {
            return Err(if n == 0 {
                libc::EFAULT
            } else {
                std::io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO)
            });
        }
        done += n as usize;
    }
    Ok(())
}

/// Sends whose receiver reads them, until its ack: numbered slots reused
/// (no allocation per send once as many have been in flight).
#[derive(Debug)]
pub struct Waiting<T> {
    slots: Vec<(u32, Option<T>)>,
    free: Vec<u32>,
}

impl<T> Default for Waiting<T> {
    fn default() -> Self {
        Waiting {
            slots: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Waiting<T> {
    /// Keep `v`; its number (slot and generation).
    pub fn insert(&mut self, v: T) -> u64 {
        let i = match self.free.pop() {
            Some(i) => i,
            None => {
                self.slots.push((0, None));
                (self.slots.len() - 1) as u32
            }
        };
        let slot = &mut self.slots[i as usize];
        slot.0 = slot.0.wrapping_add(1);
        slot.1 = Some(v);
        (u64::from(slot.0) << 32) | u64::from(i)
    }

    /// Take back what number `id` names; `None` if no such send waits (a
    /// wrong or repeated ack).
    pub fn take(&mut self, id: u64) -> Option<T> {
        let (gen, i) = ((id >> 32) as u32, id as u32);
        let slot = self.slots.get_mut(i as usize)?;
        if slot.0 != gen || slot.1.is_none() {
            return None;
        }
        self.free.push(i);
        slot.1.take()
    }

    /// Take out every entry `f` picks.
    pub fn take_all(&mut self, f: impl Fn(&T) -> bool) -> Vec<T> {
        let mut out = Vec::new();
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if slot.1.as_ref().is_some_and(&f) {
                out.extend(slot.1.take());
                self.free.push(i as u32);
            }
        }
        out
    }

    /// How many wait.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_reads_itself_and_a_bad_address_is_efault() {
        let src: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
        let mut dst = vec![0u8; src.len()];
        read(std::process::id(), src.as_ptr() as u64, &mut dst).unwrap();
        assert_eq!(src, dst);
        assert_eq!(read(std::process::id(), 8, &mut dst[..8]), Err(libc::EFAULT));
        let w = 0x1234_5678u64;
        assert!(can_read(std::process::id(), &w as *const u64 as u64, w));
        assert!(!can_read(std::process::id(), &w as *const u64 as u64, w + 1));
    }

    #[test]
    fn a_stale_or_repeated_number_takes_nothing() {
        let mut w = Waiting::default();
        let a = w.insert("a");
        assert_eq!(w.take(a), Some("a"));
        assert_eq!(w.take(a), None);
        let b = w.insert("b");
        assert_eq!(b as u32, a as u32, "the slot is reused");
        assert_eq!(w.take(a), None, "the old number is stale");
        assert_eq!(w.take(u64::MAX), None);
        assert_eq!(w.take(b), Some("b"));
        assert_eq!(w.len(), 0);
    }
}
