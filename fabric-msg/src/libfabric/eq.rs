//! The event queue connected (MSG) endpoints report connection management
//! on: its owner, and reading one event, at once or with a deadline. The
//! connection steps themselves are in `transport/event_loop/cm.rs`.

use super::fabric::{close_fid, Fabric};
use super::info::Info;
use crate::error::{check, strerror, Error, Result};
use crate::ffi;
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// An event queue (`fi_eq_open`), holding its fabric.
pub(crate) struct Eq {
    raw: NonNull<ffi::fid_eq>,
    _fabric: Arc<Fabric>,
}

// SAFETY: read by the loop that owns it (through `&mut` of the loop).
unsafe impl Send for Eq {}
// SAFETY: see Send.
unsafe impl Sync for Eq {}

/// One event read from the EQ.
pub(crate) enum CmEvent {
    /// A connection request on the passive endpoint: its info (to open an
    /// endpoint from, or to reject) and the connection data the
    /// connecting side passed to `fi_connect`.
    ConnReq {
        info: Info,
        data: Vec<u8>,
    },
    Connected {
        fid: *mut ffi::fid,
    },
    Shutdown {
        fid: *mut ffi::fid,
    },
    /// A connection attempt failed (`fi_eq_readerr`): which fid, and why.
    Failed {
        fid: *mut ffi::fid,
        message: String,
    },
}

// Room for a cm entry and the connection data a provider may attach (tcp
// carries up to 256 bytes, verbs 55; longer data is cut, never overrun).
#[repr(C, align(8))]
struct CmBuf([u8; 512]);

impl Eq {
    /// Open an event queue of 64 entries with no wait object (it is polled).
    pub(crate) fn open(fabric: &Arc<Fabric>) -> Result<Arc<Eq>> {
        let mut attr = ffi::fi_eq_attr {
            size: 64,
            wait_obj: ffi::FI_WAIT_NONE,
            ..Default::default()
        };
        let mut raw = ptr::null_mut();
        // SAFETY: the fabric is open; attr lives for the call.
        check("fi_eq_open", unsafe {
            ffi::fi_eq_open(fabric.raw(), &mut attr, &mut raw, ptr::null_mut())
        })?;
        let raw = NonNull::new(raw).ok_or(Error::NoData { call: "fi_eq_open" })?;
        Ok(Arc::new(Eq {
            raw,
            _fabric: fabric.clone(),
        }))
    }

    pub(super) fn fid(&self) -> *mut ffi::fid {
        // SAFETY: raw is open while self lives; only the field's address is taken.
        unsafe { &mut (*self.raw.as_ptr()).fid }
    }

    /// The next connection-management event, if one is there; never waits.
    pub(crate) fn try_next(&self) -> Result<Option<CmEvent>> {
        loop {
            let mut event = 0u32;
            let mut buf = CmBuf([0; 512]);
            // SAFETY: the EQ is open; buf is large and aligned enough for an
            // fi_eq_cm_entry plus connection data, and the provider copies
            // at most buf.0.len() bytes.
            let rc = unsafe {
                ffi::fi_eq_read(
                    self.raw.as_ptr(),
                    &mut event,
                    buf.0.as_mut_ptr().cast(),
                    buf.0.len(),
                    0,
                )
            };
            if rc >= 0 {
                let head = std::mem::size_of::<ffi::fi_eq_cm_entry>();
                // SAFETY: a successful read of a CM event fills an fi_eq_cm_entry.
                let entry = unsafe { &*(buf.0.as_ptr() as *const ffi::fi_eq_cm_entry) };
                let got = (rc as usize).min(buf.0.len());
                match event {
                    ffi::FI_CONNREQ => {
                        let data = buf.0[head.min(got)..got].to_vec();
                        // SAFETY: a connection request's info is the
                        // provider's gift to us, to free once.
                        let Some(info) = (unsafe { Info::from_raw(entry.info) }) else {
                            log::warn!("a connection request without its info: ignored");
                            continue;
                        };
                        return Ok(Some(CmEvent::ConnReq { info, data }));
                    }
                    ffi::FI_CONNECTED => return Ok(Some(CmEvent::Connected { fid: entry.fid })),
                    ffi::FI_SHUTDOWN => return Ok(Some(CmEvent::Shutdown { fid: entry.fid })),
                    other => log::debug!("ignoring event queue event {other}"),
                }
            } else if rc == -(ffi::FI_EAVAIL as isize) {
                let mut err = ffi::fi_eq_err_entry::default();
                // SAFETY: the EQ reported an error entry; err is a valid out-struct.
                let rc = unsafe { ffi::fi_eq_readerr(self.raw.as_ptr(), &mut err, 0) };
                check("fi_eq_readerr", rc as i64)?;
                let code = err.err.unsigned_abs();
                return Ok(Some(CmEvent::Failed {
                    fid: err.fid,
                    message: format!(
                        "connection failed: {} (provider errno {}): {}",
                        strerror(code),
                        err.prov_errno,
                        connect_hint(code, err.prov_errno)
                    ),
                }));
            } else if rc == -(ffi::FI_EAGAIN as isize) {
                return Ok(None);
            } else {
                return Err(Error::from_rc("fi_eq_read", rc as i64));
            }
        }
    }

    /// Wait up to `timeout` for the next connection-management event.
    pub(crate) fn next(&self, timeout: Duration) -> Result<CmEvent> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.try_next()? {
                return Ok(e);
            }
            if Instant::now() >= deadline {
                return Err(Error::Handshake {
                    peer: "fabric".into(),
                    message: format!(
                        "no connection event within {timeout:?}: the peer stalled or cannot reach us"
                    ),
                });
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

impl Drop for Eq {
    fn drop(&mut self) {
        // SAFETY: opened by fi_eq_open; every endpoint and passive endpoint
        // bound to it holds an Arc to this value and is closed already.
        unsafe { close_fid("event queue", &mut (*self.raw.as_ptr()).fid) }
    }
}

/// What to check after a failed connect, by its error: the provider's
/// own errno where it gives one (verbs gives the kernel's, negated), else
/// the `fi_eq_err_entry`'s.
fn connect_hint(code: u32, prov_errno: i32) -> &'static str {
    let errno = match prov_errno {
        0 => code as i32,
        e => e.saturating_abs(),
    };
    match errno {
        libc::EADDRINUSE => {
            "this host's port for the connection is still held (iWARP shares TCP's ports, and one closed a \
             moment ago may still hold its port): try again"
        }
        libc::ECONNREFUSED => "is the peer listening at that address and port yet?",
        _ => "is the peer's address reachable on this fabric?",
    }
}

#[cfg(test)]
mod tests {
    use super::connect_hint;

    #[test]
    fn a_failed_connect_says_what_to_check_by_its_error() {
        // siw's refusal of a port still held: provider errno -98.
        assert!(connect_hint(libc::EIO as u32, -libc::EADDRINUSE).contains("try again"));
        assert!(connect_hint(libc::EADDRINUSE as u32, 0).contains("try again"));
        assert!(connect_hint(libc::ECONNREFUSED as u32, 0).contains("listening"));
        assert!(connect_hint(libc::ETIMEDOUT as u32, 0).contains("reachable"));
    }
}
