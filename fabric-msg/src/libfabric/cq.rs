//! The completion queue: opening it (with a wait fd where asked), reading
//! a batch of entries, reading an error entry and its text, the
//! `fi_trywait` check before sleeping on the fd, and the handle the
//! progress thread drives it through.

use super::fabric::{close_fid, Domain};
use crate::error::{check, Error, Result};
use crate::ffi;
use std::os::raw::c_void;
use std::ptr::{self, NonNull};
use std::sync::Arc;

/// Entries read per `fi_cq_read`.
pub(crate) const CQ_BATCH: usize = 32;

/// A completion queue (`fi_cq_open`), holding its domain.
pub(crate) struct Cq {
    raw: NonNull<ffi::fid_cq>,
    /// `FI_CQ_FORMAT_TAGGED`, or `FI_CQ_FORMAT_DATA`.
    tagged: bool,
    wait_fd: Option<i32>,
    capacity: usize,
    domain: Arc<Domain>,
}

// SAFETY: a CQ is read by the loop that owns it (through `&mut` of the
// loop); the progress thread reaches it only through a `CqProgress`, whose
// creation states the threading level that allows it.
unsafe impl Send for Cq {}
// SAFETY: see Send; every `&self` method is a libfabric call the loop
// makes from its own thread.
unsafe impl Sync for Cq {}

impl Cq {
    /// Open a CQ of `size` entries, in the tagged format or the data
    /// format, with a wait fd if `wait_fd` (an error if the provider has
    /// none: open again without).
    pub(crate) fn open(domain: &Arc<Domain>, size: usize, tagged: bool, wait_fd: bool) -> Result<Arc<Cq>> {
        let mut attr = ffi::fi_cq_attr {
            size,
            format: if tagged {
                ffi::FI_CQ_FORMAT_TAGGED
            } else {
                ffi::FI_CQ_FORMAT_DATA
            },
            wait_obj: if wait_fd {
                ffi::FI_WAIT_FD
            } else {
                ffi::FI_WAIT_NONE
            },
            ..Default::default()
        };
        let mut raw = ptr::null_mut();
        // SAFETY: the domain is open; attr lives for the call.
        check("fi_cq_open", unsafe {
            ffi::fi_cq_open(domain.raw(), &mut attr, &mut raw, ptr::null_mut())
        })?;
        let raw = NonNull::new(raw).ok_or(Error::NoData { call: "fi_cq_open" })?;
        let mut cq = Cq {
            raw,
            tagged,
            wait_fd: None,
            capacity: attr.size,
            domain: domain.clone(),
        };
        if wait_fd {
            let mut fd: i32 = -1;
            // SAFETY: FI_GETWAIT on a CQ opened with FI_WAIT_FD writes an int.
            let rc = unsafe {
                ffi::fi_control(
                    &mut (*cq.raw.as_ptr()).fid,
                    ffi::FI_GETWAIT as i32,
                    (&mut fd as *mut i32).cast(),
                )
            };
            if rc == 0 && fd >= 0 {
                cq.wait_fd = Some(fd);
            }
        }
        Ok(Arc::new(cq))
    }

    pub(super) fn fid(&self) -> *mut ffi::fid {
        // SAFETY: raw is open while self lives; only the field's address is taken.
        unsafe { &mut (*self.raw.as_ptr()).fid }
    }

    /// Entries in the tagged format (else the data format, tag 0).
    pub(crate) fn tagged(&self) -> bool {
        self.tagged
    }

    /// The fd to sleep on, after [`Cq::try_wait`] says so.
    pub(crate) fn wait_fd(&self) -> Option<i32> {
        self.wait_fd
    }

    /// The size libfabric granted.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    /// Read up to [`CQ_BATCH`] entries into `into` (with their sources if
    /// `with_source`): `fi_cq_read`'s count, `-FI_EAGAIN` when empty,
    /// `-FI_EAVAIL` when an error entry is next ([`Cq::read_error`]).
    #[inline]
    pub(crate) fn read(&self, into: &mut CqEntries, with_source: bool) -> isize {
        // The buffer must have the CQ's own entry format: entries are
        // written back to back at that format's size.
        let buf: *mut c_void = if self.tagged {
            into.tagged.as_mut_ptr().cast()
        } else {
            into.data.as_mut_ptr().cast()
        };
        // SAFETY: the CQ is open; `buf` holds CQ_BATCH entries of the CQ's
        // format and `srcs` as many addresses.
        unsafe {
            if with_source {
                ffi::fi_cq_readfrom(self.raw.as_ptr(), buf, CQ_BATCH, into.srcs.as_mut_ptr())
            } else {
                ffi::fi_cq_read(self.raw.as_ptr(), buf, CQ_BATCH)
            }
        }
    }

    /// Read the error entry `read` announced (`-FI_EAVAIL`) into `into`:
    /// 1, or `-FI_EAGAIN` if there was none after all.
    pub(crate) fn read_error(&self, into: &mut CqError) -> isize {
        into.entry = ffi::fi_cq_err_entry::default();
        // The provider's error data is copied into `into`, not lent: a lent
        // buffer lives only until the CQ's next read (libfabric 2.1 frees it
        // there), which a progress thread may make at any time.
        into.entry.err_data = into.data.as_mut_ptr().cast();
        into.entry.err_data_size = into.data.len();
        // SAFETY: the CQ is open; the entry is a valid out-struct whose
        // err_data is valid for err_data_size bytes during the call.
        unsafe { ffi::fi_cq_readerr(self.raw.as_ptr(), &mut into.entry, 0) }
    }

    /// The provider's own text for an error entry read by [`Cq::read_error`].
    pub(crate) fn error_text(&self, err: &CqError) -> String {
        let mut text = [0 as std::os::raw::c_char; 256];
        // SAFETY: the CQ is open; the error data is `err`'s own copy, valid
        // for the call; fi_cq_strerror writes at most text.len() bytes into
        // `text` and returns a C string valid while both are.
        unsafe {
            let p = ffi::fi_cq_strerror(
                self.raw.as_ptr(),
                err.entry.prov_errno,
                err.data.as_ptr().cast(),
                text.as_mut_ptr(),
                text.len(),
            );
            if p.is_null() {
                String::new()
            } else {
                std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        }
    }

    /// `fi_trywait` on this CQ: whether sleeping on its wait fd now is safe
    /// (nothing is pending that the fd would not announce).
    pub(crate) fn try_wait(&self) -> bool {
        let mut fids = [ptr::null_mut::<ffi::fid>(); 1];
        // SAFETY: the CQ and its fabric are open; fi_trywait reads `fids`
        // for the call only.
        unsafe {
            fids[0] = &mut (*self.raw.as_ptr()).fid;
            ffi::fi_trywait(self.domain.fabric().raw(), fids.as_mut_ptr(), 1) == 0
        }
    }

    /// A handle through which another thread drives this CQ's progress.
    ///
    /// # Safety
    /// The CQ's domain is at `FI_THREAD_SAFE`, and the handle is dropped
    /// (its thread joined) before this CQ closes.
    pub(crate) unsafe fn progress_handle(&self) -> CqProgress {
        CqProgress {
            raw: self.raw,
            tagged: self.tagged,
        }
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: opened by fi_cq_open; every endpoint bound to it holds an
        // Arc to this value and is closed already.
        unsafe { close_fid("completion queue", &mut (*self.raw.as_ptr()).fid) }
    }
}

/// Where [`Cq::read`] reads entries to: one batch in each format, and the
/// source addresses. Kept by the loop, not zeroed on every read: an empty
/// poll is the hot path of a spinning loop.
pub(crate) struct CqEntries {
    pub(crate) tagged: Box<[ffi::fi_cq_tagged_entry; CQ_BATCH]>,
    pub(crate) data: Box<[ffi::fi_cq_data_entry; CQ_BATCH]>,
    pub(crate) srcs: Box<[ffi::fi_addr_t; CQ_BATCH]>,
}

impl Default for CqEntries {
    fn default() -> Self {
        CqEntries {
            tagged: Box::new([ffi::fi_cq_tagged_entry::default(); CQ_BATCH]),
            data: Box::new([ffi::fi_cq_data_entry::default(); CQ_BATCH]),
            srcs: Box::new([ffi::FI_ADDR_NOTAVAIL; CQ_BATCH]),
        }
    }
}

impl CqEntries {
    /// Entry `i` of the last read, in the tagged format whatever the CQ's.
    #[inline]
    pub(crate) fn entry(&self, i: usize, tagged: bool) -> ffi::fi_cq_tagged_entry {
        if tagged {
            self.tagged[i]
        } else {
            let d = &self.data[i];
            ffi::fi_cq_tagged_entry {
                op_context: d.op_context,
                flags: d.flags,
                len: d.len,
                buf: d.buf,
                data: d.data,
                tag: 0,
            }
        }
    }
}

/// A CQ error entry with its own copy of the provider's error data.
pub(crate) struct CqError {
    pub(crate) entry: ffi::fi_cq_err_entry,
    data: [u8; 256],
}

impl Default for CqError {
    fn default() -> Self {
        CqError {
            entry: ffi::fi_cq_err_entry::default(),
            data: [0; 256],
        }
    }
}

/// A CQ as the progress thread holds it ([`Cq::progress_handle`]).
pub(crate) struct CqProgress {
    raw: NonNull<ffi::fid_cq>,
    tagged: bool,
}

// SAFETY: made only for a CQ of a domain at FI_THREAD_SAFE, where libfabric
// takes calls on it from any thread, concurrently with the loop's own; the
// maker keeps the CQ open while the handle lives.
unsafe impl Send for CqProgress {}

impl CqProgress {
    /// Run the provider's progress: `fi_cq_read` with a count of 0, which
    /// in libfabric 1.17 and 2.1 (`ofi_cq_readfrom`) runs progress and
    /// copies no entry. `-FI_EAGAIN` or `-FI_EAVAIL` are the usual answers.
    pub(crate) fn drive(&self) -> isize {
        // One entry of the CQ's format, never written (count 0), passed so
        // that no provider meets a null buffer.
        let mut tagged_entry = ffi::fi_cq_tagged_entry::default();
        let mut data_entry = ffi::fi_cq_data_entry::default();
        let buf: *mut c_void = if self.tagged {
            (&mut tagged_entry as *mut ffi::fi_cq_tagged_entry).cast()
        } else {
            (&mut data_entry as *mut ffi::fi_cq_data_entry).cast()
        };
        // SAFETY: the CQ is open and thread-safe (the maker's promise); a
        // count of 0 copies nothing into `buf`, which is valid anyway.
        unsafe { ffi::fi_cq_read(self.raw.as_ptr(), buf, 0) }
    }
}
