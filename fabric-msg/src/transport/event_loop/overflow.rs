//! The overflow sink: where the part of a message that does not fit its
//! receive goes, on providers that fail when a message is larger than the
//! receive it matches.
//!
//! `ofi_rxm` (1.17 to 2.x) cannot truncate a message it sends in segments
//! (above 16 KiB, up to 128 KiB): libfabric 1.17 crashes (SIGSEGV in
//! `fi_cq_read`), and every version hands the segments after the cut to the
//! next matching receive as if they were new messages. `shm` (1.17) spins
//! or waits for ever on any message above its 4 KiB inject size that does
//! not fit. `udp;ofi_rxd` stalled after cutting a 70 KB message. docs/decisions.md
//! ("A message larger than its receive") has the source lines.
//!
//! So on those providers every receive is posted with a second piece of
//! memory behind the caller's buffer: this sink, one per process, reserved
//! as address space only (`MAP_NORESERVE`; pages appear where a message's
//! tail is written and are given back when its truncation is reported).
//! The provider then never truncates a message up to the sink's size, the
//! completion says how long the message was, and the loop reports
//! [`CompletionError::Truncated`](super::CompletionError::Truncated) itself.
//! No one reads the sink: several messages may write into it at once.
//!
//! An endpoint that uses the sink is opened with it as its `fid` context, so
//! `raw_recv` (which every receive, internal ones included, goes through)
//! finds it with one load.

use crate::discovery::quirks::Quirks;
use crate::ffi;
use crate::libfabric::RawEndpoint;
use std::os::raw::c_void;
use std::ptr;
use std::sync::OnceLock;

/// The address space asked for; halved while the kernel refuses it (strict
/// overcommit counts even `MAP_NORESERVE`), down to [`LEAST`].
const WANT: usize = 4 << 30;
/// Below this the sink would not cover ofi_rxm's segmented range (128 KiB)
/// with room to spare: no sink, and the endpoint is opened without one.
const LEAST: usize = 1 << 20;

/// One process-wide region that overflowing tails are written into.
pub(crate) struct Sink {
    base: *mut c_void,
    len: usize,
}

// SAFETY: the region is mapped once and never unmapped; Rust code never
// reads or writes it (only providers do, through receives), so sharing the
// pointer between threads shares no Rust-visible data.
unsafe impl Send for Sink {}
// SAFETY: as for Send; `give_back` is an madvise, safe from any thread.
unsafe impl Sync for Sink {}

static SINK: OnceLock<Option<Sink>> = OnceLock::new();

impl Sink {
    /// The process's sink, mapped on first use; `None` if the kernel
    /// refused even [`LEAST`] bytes of address space.
    pub(crate) fn get() -> Option<&'static Sink> {
        SINK.get_or_init(Sink::map).as_ref()
    }

    /// The sink if some endpoint already mapped it.
    pub(crate) fn mapped() -> Option<&'static Sink> {
        SINK.get().and_then(Option::as_ref)
    }

    fn map() -> Option<Sink> {
        let mut len = WANT;
        while len >= LEAST {
            // SAFETY: an anonymous private mapping at an address the kernel
            // chooses touches no existing memory.
            let base = unsafe {
                libc::mmap(
                    ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if base != libc::MAP_FAILED {
                return Some(Sink { base, len });
            }
            len /= 2;
        }
        log::warn!(
            "no address space for the receive overflow sink (mmap of {LEAST} bytes refused): a message larger \
             than its receive may crash or hang ofi_rxm and shm (docs/reliability.md, \"Truncation\")"
        );
        None
    }

    /// What `fi_endpoint` is given as the endpoint's context, for `of`.
    pub(crate) fn context(&'static self) -> *mut c_void {
        (self as *const Sink).cast_mut().cast()
    }

    /// The sink of an endpoint opened with [`Sink::context`], if it was.
    ///
    /// # Safety
    /// `raw` must be an open endpoint.
    #[inline]
    pub(crate) unsafe fn of(raw: RawEndpoint) -> Option<&'static Sink> {
        // SAFETY: raw is open (the caller's promise).
        let context = unsafe { raw.context() };
        // Compared, never dereferenced: whatever a provider left in the
        // context, only the sink's own address selects the sink.
        Sink::mapped().filter(|sink| ptr::eq(context.cast_const(), sink.context().cast_const()))
    }

    /// The iovec that follows a receive's own.
    #[inline]
    pub(crate) fn iov(&self) -> libc::iovec {
        libc::iovec {
            iov_base: self.base,
            iov_len: self.len,
        }
    }

    /// Return the pages a message's tail made resident (a truncation was
    /// just reported). A tail being written meanwhile gets fresh pages.
    pub(crate) fn give_back(&self) {
        // SAFETY: the range is this process's own anonymous mapping, which
        // no Rust code reads; MADV_DONTNEED only drops its pages.
        let rc = unsafe { libc::madvise(self.base, self.len, libc::MADV_DONTNEED) };
        if rc != 0 {
            log::debug!(
                "madvise(MADV_DONTNEED) of the overflow sink: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Whether receives need the sink: on the providers above
/// ([`Quirks::cuts_oversized_badly`](crate::discovery::quirks::Quirks::cuts_oversized_badly)),
/// when receives take a second iovec without a descriptor (no `FI_MR_LOCAL`).
/// Only over cores that need no registration (tcp, udp; shm itself): over
/// a core that does (`verbs`), rxm registers a receive's memory itself for
/// a rendezvous read, and would pin the whole sink, whatever `mr_mode` it
/// shows the application.
pub(crate) fn needs_sink(quirks: &Quirks, iov_limit: usize, mr_local: bool) -> bool {
    quirks.cuts_oversized_badly && iov_limit >= 2 && !mr_local
}

impl Sink {
    /// `calls.rs`'s `raw_recv` with the overflow sink behind the buffer.
    ///
    /// # Safety
    /// As for `raw_recv`: `raw` is an enabled endpoint, `len` writable bytes
    /// at `bufp` and the context `ctx` stay valid until the completion.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(super) unsafe fn recv(
        &self,
        raw: RawEndpoint,
        bufp: *mut c_void,
        len: usize,
        desc: *mut c_void,
        src: ffi::fi_addr_t,
        tag: Option<(u64, u64)>,
        ctx: *mut c_void,
    ) -> isize {
        let iov = [
            libc::iovec {
                iov_base: bufp,
                iov_len: len,
            },
            self.iov(),
        ];
        let mut descs = [desc, ptr::null_mut()];
        // SAFETY: the caller's promises for `bufp`, `raw` and `ctx`; the sink's
        // memory is valid for its length for the life of the process.
        unsafe { raw.recv2(&iov, &mut descs, src, tag, ctx) }
    }
}

#[cfg(test)]
mod tests {
    use super::{needs_sink, Sink, LEAST};
    use crate::discovery::quirks::Quirks;

    #[test]
    fn the_affected_providers_take_the_sink() {
        assert!(needs_sink(&Quirks::of("tcp;ofi_rxm"), 4, false));
        assert!(needs_sink(&Quirks::of("shm"), 4, false));
        assert!(needs_sink(&Quirks::of("udp;ofi_rxd"), 4, false));
        assert!(!needs_sink(&Quirks::of("tcp"), 4, false));
        assert!(!needs_sink(&Quirks::of("sockets"), 8, false));
        // verbs;ofi_rxm needs a descriptor for every piece.
        assert!(!needs_sink(&Quirks::of("verbs;ofi_rxm"), 4, true));
        assert!(!needs_sink(&Quirks::of("verbs;ofi_rxm"), 4, false));
        assert!(!needs_sink(&Quirks::of("shm"), 1, false));
    }

    #[test]
    fn the_sink_is_mapped_once_and_large() {
        let a = Sink::get().expect("a sink on this machine");
        assert!(a.len >= LEAST);
        assert!(std::ptr::eq(a, Sink::get().unwrap()));
        a.give_back();
    }
}
