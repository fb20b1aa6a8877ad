//! A handle on another process that says when it has ended: a pidfd
//! (`pidfd_open(2)`, Linux 5.3), which refers to that one process even
//! after its pid is reused, and becomes readable when it exits.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// A handle on a peer's process that says when it has ended.
#[derive(Debug)]
pub(crate) struct Watch {
    fd: OwnedFd,
}

impl Watch {
    /// Watch process `pid`; `None` where the kernel has no pidfds (older
    /// than 5.3) or the process is gone already.
    pub(crate) fn open(pid: u32) -> Option<Watch> {
        // SAFETY: a plain system call with two integer arguments.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
        if raw < 0 {
            return None;
        }
        // SAFETY: a descriptor the kernel just returned, owned by nothing
        // else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
        Some(Watch { fd })
    }

    /// This process's own descriptor of the process's descriptor `fd`
    /// (`pidfd_getfd(2)`, Linux 5.6; the kernel allows it where this
    /// process may ptrace that one). `None` where it refuses or the
    /// descriptor is closed. What it refers to is the caller's to check.
    pub(crate) fn take(&self, fd: i32) -> Option<OwnedFd> {
        // SAFETY: a plain system call with integer arguments.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_getfd, self.fd.as_raw_fd(), fd, 0) };
        if raw < 0 {
            return None;
        }
        // SAFETY: a descriptor the kernel just returned (close-on-exec),
        // owned by nothing else.
        Some(unsafe { OwnedFd::from_raw_fd(raw as i32) })
    }

    /// Whether the process has ended.
    pub(crate) fn gone(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one pollfd we own; timeout 0, so it never blocks.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n > 0 && p.revents & libc::POLLIN != 0
    }
}
