//! Copies in and out of registered memory that something else may be
//! changing at the same moment: a peer's RMA or atomic (the NIC, or the
//! provider inside this process), or this process's own emulated atomics,
//! which the event loop applies with CPU atomics (`transport/event_loop/
//! am_wire.rs`) while another thread may be copying the same words. A plain
//! `memcpy` beside an atomic write is a data race in Rust's memory model;
//! these copies use relaxed atomic loads and stores instead, eight bytes at
//! a time where the address is aligned, one byte at a time at the edges.
//! What they guarantee is no more than a plain copy would in practice:
//! each aligned word is old or new, never torn, and nothing outside the
//! range is touched.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// Copy `out.len()` bytes from `src` into `out`.
///
/// # Safety
/// `src..src + out.len()` is live memory that nothing frees during the
/// call, and `out` does not overlap it.
pub(crate) unsafe fn copy_out(src: *const u8, out: &mut [u8]) {
    let len = out.len();
    let head = src.align_offset(8).min(len);
    let words = (len - head) / 8;
    for (i, o) in out.iter_mut().enumerate().take(head) {
        // SAFETY: in range (the caller's promise); any byte address is
        // aligned for AtomicU8, and only atomic accesses are made here.
        *o = unsafe { AtomicU8::from_ptr(src.add(i).cast_mut()) }.load(Ordering::Relaxed);
    }
    for w in 0..words {
        let at = head + w * 8;
        // SAFETY: in range; `src + head` is 8-byte aligned, so is each word.
        let v = unsafe { AtomicU64::from_ptr(src.add(at).cast::<u64>().cast_mut()) }.load(Ordering::Relaxed);
        out[at..at + 8].copy_from_slice(&v.to_ne_bytes());
    }
    for (i, o) in out.iter_mut().enumerate().skip(head + words * 8) {
        // SAFETY: as for the head.
        *o = unsafe { AtomicU8::from_ptr(src.add(i).cast_mut()) }.load(Ordering::Relaxed);
    }
}

/// Copy `bytes` to `dst`.
///
/// # Safety
/// `dst..dst + bytes.len()` is live memory that nothing frees during the
/// call, and `bytes` does not overlap it.
pub(crate) unsafe fn copy_in(dst: *mut u8, bytes: &[u8]) {
    let len = bytes.len();
    let head = dst.align_offset(8).min(len);
    let words = (len - head) / 8;
    for (i, &b) in bytes.iter().enumerate().take(head) {
        // SAFETY: as in `copy_out`.
        unsafe { AtomicU8::from_ptr(dst.add(i)) }.store(b, Ordering::Relaxed);
    }
    for w in 0..words {
        let at = head + w * 8;
        let v = u64::from_ne_bytes(bytes[at..at + 8].try_into().expect("eight bytes"));
        // SAFETY: in range; 8-byte aligned (see `copy_out`).
        unsafe { AtomicU64::from_ptr(dst.add(at).cast::<u64>()) }.store(v, Ordering::Relaxed);
    }
    for (i, &b) in bytes.iter().enumerate().skip(head + words * 8) {
        // SAFETY: as for the head.
        unsafe { AtomicU8::from_ptr(dst.add(i)) }.store(b, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::{copy_in, copy_out};

    #[test]
    fn every_alignment_and_length_copies_exactly_its_range() {
        let mut mem = vec![0u8; 64];
        for start in 0..9 {
            for len in 0..40 {
                mem.iter_mut().for_each(|b| *b = 0xAA);
                let data: Vec<u8> = (0..len as u8)
                    .map(|i| i.wrapping_mul(7).wrapping_add(1))
                    .collect();
                // SAFETY: start + len <= 48 < 64: in range of `mem`.
                unsafe { copy_in(mem.as_mut_ptr().add(start), &data) };
                assert!(mem[..start].iter().all(|&b| b == 0xAA), "{start} {len}");
                assert_eq!(&mem[start..start + len], &data[..], "{start} {len}");
                assert!(mem[start + len..].iter().all(|&b| b == 0xAA), "{start} {len}");
                let mut out = vec![0u8; len];
                // SAFETY: as above.
                unsafe { copy_out(mem.as_ptr().add(start), &mut out) };
                assert_eq!(out, data, "{start} {len}");
            }
        }
    }
}
