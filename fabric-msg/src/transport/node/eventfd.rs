//! A rank's doorbell eventfd (`doorbell.rs` says what it is for): made by
//! the segment's owner, and checked by a peer that took a descriptor of it
//! before it writes anything to it.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A new non-blocking eventfd, for a segment's owner.
pub(super) fn new_eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: a plain system call with integer arguments.
    let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor the kernel just returned, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Whether `fd` is an eventfd: what a descriptor taken from a peer must be
/// before anything is written to it (its number came from shared memory,
/// and writing to a file or socket of the peer's would corrupt it).
pub(super) fn is_eventfd(fd: &OwnedFd) -> bool {
    let link = format!("/proc/self/fd/{}", fd.as_raw_fd());
    std::fs::read_link(link).is_ok_and(|target| target.as_os_str() == "anon_inode:[eventfd]")
}
