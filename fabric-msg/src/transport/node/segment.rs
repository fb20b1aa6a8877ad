//! A rank's shared segment: anonymous shared memory that the other ranks on
//! its node map.
//!
//! The segment is a `memfd` (`memfd_create(2)`): it has no name in
//! `/dev/shm` or anywhere else, so nothing is left behind whichever way a
//! process ends, `SIGKILL` included; the kernel frees it when the last
//! mapping and descriptor of it are gone. A peer maps it by opening
//! `/proc/<pid>/fd/<fd>` of the owner, which the kernel allows to a process
//! of the same user that may read the owner's memory (`PTRACE_MODE_READ`,
//! the check `process_vm_readv` makes too). Where it refuses (another user,
//! another PID namespace, a hardened `ptrace` policy), attaching fails with
//! a message that says so (the World's says to run with
//! `FABRIC_MSG_SHM=libfabric`).
//!
//! The first cache line holds a header the owner writes before it
//! publishes the segment's [`SegmentName`]: a magic word, the owner's pid,
//! a random cookie, the length, and the address the owner mapped it at. A
//! peer checks all four after mapping, so a name that points at a recycled
//! pid's descriptor, or at anything other than the segment announced, is
//! refused before any of it is used. Byte 48 of the line is the owner's
//! doorbell, the futex word it sleeps on (`doorbell.rs`). A segment made
//! [`Segment::with_bell`] also has an eventfd: its number is at byte 40,
//! and byte 56 counts the peers that could not take it (`doorbell.rs`
//! says why it exists).

use super::eventfd::{is_eventfd, new_eventfd};
use super::pidfd::Watch;
use crate::error::{Error, Result};
use std::ffi::CStr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

/// "fmsgnode" in ASCII: the segment header's first word.
const MAGIC: u64 = 0x666d_7367_6e6f_6465;

/// The largest segment a peer may announce (and this rank create): 1 GiB.
pub const MAX_LEN: u64 = 1 << 30;

/// Bytes the header takes: one cache line.
pub const HEADER: usize = 64;

/// The header's word with the owner's eventfd number plus one (0: none).
const BELL_FD: usize = 5;
/// The header's word counting peers that could not take the eventfd.
const UNREACHED: usize = 7;

/// What a peer needs to map a segment; published through the World's
/// exchange (or any other channel).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SegmentName {
    /// The owner's process id.
    pub pid: u32,
    /// The owner's descriptor of the memfd.
    pub fd: i32,
    /// The segment's length in bytes.
    pub len: u64,
    /// A random number the owner wrote into the header.
    pub cookie: u64,
}

/// A mapping of a segment: this rank's own, or a peer's.
#[derive(Debug)]
pub struct Segment {
    base: NonNull<u8>,
    len: usize,
    /// The owner keeps its memfd open so that peers can open it through
    /// `/proc`; a peer closes its descriptor once it has mapped.
    fd: Option<OwnedFd>,
    name: SegmentName,
    /// The doorbell's eventfd: the owner's, or this peer's descriptor of
    /// it (`doorbell.rs`).
    bell: Option<OwnedFd>,
}

// SAFETY: a `Segment` is a mapping of shared memory, usable from any
// thread; what is read and written in it is up to the ring code, which
// uses atomics for every word two processes both touch.
unsafe impl Send for Segment {}
// SAFETY: through `&Segment` one gets only the header's atomics and raw
// addresses (`at`), whose use the ring code fences itself; the mapping
// itself never changes while the `Segment` lives.
unsafe impl Sync for Segment {}

impl Segment {
    /// Create this rank's segment of `len` bytes (at least the header),
    /// zeroed, with the header written.
    pub fn create(len: usize) -> Result<Segment> {
        if len < HEADER || len as u64 > MAX_LEN {
            return Err(Error::Usage(format!(
                "a node segment must be between {HEADER} and {MAX_LEN} bytes, not {len}"
            )));
        }
        let label: &CStr = c"fabric-msg-node";
        // SAFETY: `label` is a NUL-terminated string; the call has no
        // other input.
        let raw = unsafe { libc::memfd_create(label.as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(io_error("memfd_create for the node segment"));
        }
        // SAFETY: `raw` is a descriptor memfd_create just returned, owned
        // by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain system call on a descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io_error("ftruncate of the node segment"));
        }
        let base = map(&fd, len, "mapping this rank's node segment")?;
        let cookie = getrandom::u64()
            .map_err(|e| Error::Usage(format!("no random cookie for the node segment: {e}")))?;
        let name = SegmentName {
            pid: std::process::id(),
            fd: fd.as_raw_fd(),
            len: len as u64,
            cookie,
        };
        let seg = Segment {
            base,
            len,
            fd: Some(fd),
            name,
            bell: None,
        };
        let h = seg.header();
        h[1].store(u64::from(name.pid), Ordering::Relaxed);
        h[2].store(name.cookie, Ordering::Relaxed);
        h[3].store(name.len, Ordering::Relaxed);
        h[4].store(seg.base.as_ptr() as u64, Ordering::Relaxed);
        h[0].store(MAGIC, Ordering::Release);
        Ok(seg)
    }

    /// [`Segment::create`], with an eventfd beside the doorbell, whose
    /// number peers read from the header (`doorbell.rs`). Published before
    /// the segment's name is, as the rest of the header.
    pub fn with_bell(len: usize) -> Result<Segment> {
        let mut seg = Segment::create(len)?;
        let bell = new_eventfd().map_err(|source| Error::Io {
            context: "eventfd for the node segment's doorbell".into(),
            source,
        })?;
        seg.header()[BELL_FD].store(bell.as_raw_fd() as u64 + 1, Ordering::Release);
        seg.bell = Some(bell);
        Ok(seg)
    }

    /// Take this process's descriptor of the owner's eventfd, if its
    /// header names one, through `watch` (the owner's pidfd;
    /// `pidfd_getfd(2)`), and keep it only if it is an eventfd. Where that
    /// fails, count this peer in the header as one the owner cannot rely on
    /// to wake it that way. Returns whether the eventfd was taken.
    pub(crate) fn reach_bell(&mut self, watch: Option<&Watch>) -> bool {
        if self.is_own() {
            return self.bell.is_some();
        }
        let number = self.header()[BELL_FD].load(Ordering::Acquire);
        if number == 0 {
            return false;
        }
        let taken = i32::try_from(number - 1)
            .ok()
            .and_then(|n| watch?.take(n))
            .filter(is_eventfd);
        let reached = taken.is_some();
        if !reached {
            self.header()[UNREACHED].fetch_add(1, Ordering::Relaxed);
        }
        self.bell = taken;
        reached
    }

    /// Write `fd` into the header as the eventfd's number.
    #[cfg(test)]
    pub(crate) fn name_bell_for_test(&mut self, fd: RawFd) {
        self.header()[BELL_FD].store(fd as u64 + 1, Ordering::Release);
    }

    /// This process's descriptor of the doorbell's eventfd, if any.
    pub(crate) fn bell(&self) -> Option<RawFd> {
        self.bell.as_ref().map(|b| b.as_raw_fd())
    }

    /// Whether this segment has an eventfd and every peer that attached
    /// took it ([`Segment::reach_bell`] counts those that could not), so a
    /// sleep beside a descriptor (`doorbell.rs`) is woken by each of them.
    pub(crate) fn all_reach_bell(&self) -> bool {
        self.bell.is_some() && self.header()[UNREACHED].load(Ordering::Relaxed) == 0
    }

    /// Map a peer's segment from its name, checking that it is what the
    /// name says.
    pub fn attach(name: &SegmentName) -> Result<Segment> {
        if name.len < HEADER as u64 || name.len > MAX_LEN || name.fd < 0 {
            return Err(Error::PeerMismatch(format!(
                "a peer announced a node segment of {} bytes at descriptor {}: not a segment fabric-msg makes \
                 ({HEADER}..={MAX_LEN} bytes)",
                name.len, name.fd
            )));
        }
        let path = format!("/proc/{}/fd/{}\0", name.pid, name.fd);
        // SAFETY: `path` is NUL-terminated; open has no other input.
        let raw = unsafe { libc::open(path.as_ptr().cast(), libc::O_RDWR | libc::O_CLOEXEC) };
        if raw < 0 {
            let e = std::io::Error::last_os_error();
            return Err(Error::Io {
                context: format!(
                    "opening the node segment of process {} ({}): the kernel lets a process open another's \
                     memory only when it may read it (same user, same PID namespace, ptrace policy); \
                     these two processes cannot use fabric-msg's same-node transport with each other: \
                     run them as one user in one PID namespace, or talk over a fabric",
                    name.pid,
                    path.trim_end_matches('\0')
                ),
                source: e,
            });
        }
        // SAFETY: a descriptor open just returned, owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: fstat fills the struct it is given; zeroed is a valid
        // `stat`.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above, on a descriptor we own.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io_error("fstat of a peer's node segment"));
        }
        if st.st_size as u64 != name.len {
            return Err(Error::PeerMismatch(format!(
                "process {}'s descriptor {} is {} bytes long, not the {} its node segment was announced with",
                name.pid, name.fd, st.st_size, name.len
            )));
        }
        let len = name.len as usize;
        let base = map(&fd, len, "mapping a peer's node segment")?;
        let seg = Segment {
            base,
            len,
            fd: None,
            name: *name,
            bell: None,
        };
        let h = seg.header();
        let found = (
            h[0].load(Ordering::Acquire),
            h[1].load(Ordering::Relaxed),
            h[2].load(Ordering::Relaxed),
            h[3].load(Ordering::Relaxed),
        );
        if found != (MAGIC, u64::from(name.pid), name.cookie, name.len) {
            return Err(Error::PeerMismatch(format!(
                "process {}'s descriptor {} is not the node segment announced (header {found:x?}): \
                 the process may have been replaced",
                name.pid, name.fd
            )));
        }
        Ok(seg)
    }

    /// The name peers attach with (this rank's own segment).
    pub fn name(&self) -> SegmentName {
        self.name
    }

    /// Whether this is this rank's own segment.
    pub fn is_own(&self) -> bool {
        self.fd.is_some()
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a segment has at least its header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The address of byte `offset`, which with `len` more bytes must lie
    /// inside the segment (checked: a panic here is a bug in the layout).
    pub(crate) fn at(&self, offset: usize, len: usize) -> NonNull<u8> {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "node segment layout: {offset}+{len} outside {} bytes",
            self.len
        );
        // SAFETY: in bounds of the mapping, checked just above.
        unsafe { NonNull::new_unchecked(self.base.as_ptr().add(offset)) }
    }

    /// Where the owner has the segment mapped, in its own address space
    /// (what a peer reads to learn whether it may read the owner's memory;
    /// `single_copy`).
    pub(crate) fn owner_base(&self) -> u64 {
        self.header()[4].load(Ordering::Relaxed)
    }

    /// The header's first word, which every segment has.
    pub(crate) const MAGIC: u64 = MAGIC;

    fn header(&self) -> &[AtomicU64; 8] {
        // SAFETY: the mapping is at least HEADER (64) bytes, page-aligned,
        // and lives as long as `self`; the header's words are only ever
        // accessed as atomics.
        unsafe { &*self.base.as_ptr().cast::<[AtomicU64; 8]>() }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: `base` and `len` are the mapping made in create/attach;
        // nothing borrows it past `self` (rings hold their segment).
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

fn map(fd: &OwnedFd, len: usize, what: &str) -> Result<NonNull<u8>> {
    // SAFETY: a fresh shared mapping of a descriptor we hold; the kernel
    // picks the address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io_error(what));
    }
    NonNull::new(p.cast()).ok_or_else(|| Error::Usage(format!("{what}: mmap returned null")))
}

fn io_error(what: &str) -> Error {
    Error::Io {
        context: what.to_string(),
        source: std::io::Error::last_os_error(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_sees_what_the_owner_wrote() {
        let own = Segment::create(4096).unwrap();
        let peer = Segment::attach(&own.name()).unwrap();
        assert!(own.is_own() && !peer.is_own());
        // SAFETY: 8 bytes inside both mappings, past the header.
        unsafe { own.at(64, 8).as_ptr().cast::<u64>().write(0xabcd) };
        // SAFETY: as above.
        assert_eq!(unsafe { peer.at(64, 8).as_ptr().cast::<u64>().read() }, 0xabcd);
    }

    #[test]
    fn a_wrong_name_is_refused_before_use() {
        let own = Segment::create(4096).unwrap();
        let n = own.name();
        for bad in [
            SegmentName {
                cookie: n.cookie ^ 1,
                ..n
            },
            SegmentName { len: 8192, ..n },
            SegmentName {
                len: MAX_LEN + 1,
                ..n
            },
            SegmentName { fd: -1, ..n },
            SegmentName { fd: 0, ..n },
            SegmentName { pid: u32::MAX, ..n },
        ] {
            let e = Segment::attach(&bad).unwrap_err().to_string();
            assert!(!e.is_empty(), "{bad:?}");
        }
        assert!(Segment::create(10).is_err());
    }
}
