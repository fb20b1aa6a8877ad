use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use super::load::Api;
use super::sys::{self, Status};
use super::value::{copy_value, Owned};

// ---------------------------------------------------------------------------
// Bounded non-blocking calls
// ---------------------------------------------------------------------------

/// How many callbacks arrived after their caller had given up waiting.
pub(super) static ABANDONED_COMPLETIONS: AtomicUsize = AtomicUsize::new(0);

/// Locks `m`, carrying on if a panicking thread poisoned it: every value
/// guarded here stays meaningful whatever was interrupted.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Where a PMIx callback leaves its result for the waiting caller.
pub(super) struct Slot<T> {
    result: Mutex<Option<T>>,
    ready: Condvar,
}

impl<T> Slot<T> {
    pub(super) fn new() -> Slot<T> {
        Slot {
            result: Mutex::new(None),
            ready: Condvar::new(),
        }
    }

    pub(super) fn complete(&self, value: T) {
        *lock(&self.result) = Some(value);
        self.ready.notify_all();
    }

    /// The result, or `None` if `deadline` passes first.
    pub(super) fn wait(&self, deadline: Option<Instant>) -> Option<T> {
        let mut result = lock(&self.result);
        loop {
            if let Some(value) = result.take() {
                return Some(value);
            }
            result = match deadline {
                None => self.ready.wait(result).unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let left = deadline
                        .checked_duration_since(Instant::now())
                        .filter(|d| !d.is_zero())?;
                    self.ready
                        .wait_timeout(result, left)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
    }
}

/// `fence`'s arguments to `PMIx_Fence_nb`.
pub(super) struct FenceInputs {
    pub(super) procs: [sys::Proc; 1],
    pub(super) info: [sys::Info; 2],
}

// SAFETY: the arrays hold only integers (the info values are an int and a
// bool; no pointer member is set) and are never written after construction.
unsafe impl Send for FenceInputs {}
// SAFETY: as for Send: immutable plain data.
unsafe impl Sync for FenceInputs {}

pub(super) struct FenceRequest {
    pub(super) inputs: FenceInputs,
    pub(super) done: Slot<Status>,
}

pub(super) unsafe extern "C" fn fence_done(status: Status, cbdata: *mut c_void) {
    // SAFETY: cbdata is the strong reference fence() handed to
    // PMIx_Fence_nb, which calls this exactly once.
    let request = unsafe { Arc::from_raw(cbdata.cast_const().cast::<FenceRequest>()) };
    if Arc::strong_count(&request) == 1 {
        ABANDONED_COMPLETIONS.fetch_add(1, Ordering::Relaxed);
        log::debug!("PMIx_Fence answered (status {status}) after its caller gave up");
    }
    request.done.complete(status);
}

/// `get`'s arguments to `PMIx_Get_nb`.
pub(super) struct GetInputs {
    pub(super) proc: sys::Proc,
    pub(super) key: CString,
    pub(super) info: [sys::Info; 1],
}

// SAFETY: plain data (the info value is an int; no pointer member is set)
// plus an owned CString, never written after construction.
unsafe impl Send for GetInputs {}
// SAFETY: as for Send: immutable after construction.
unsafe impl Sync for GetInputs {}

pub(super) struct GetRequest {
    pub(super) inputs: GetInputs,
    pub(super) api: &'static Api,
    pub(super) max_len: usize,
    pub(super) done: Slot<Fetched>,
}

pub(super) enum Fetched {
    /// PMIx answered with an error status.
    Failed(Status),
    /// PMIx answered with a value, copied out.
    Value(Owned),
}

pub(super) unsafe extern "C" fn get_done(status: Status, value: *mut sys::Value, cbdata: *mut c_void) {
    // SAFETY: cbdata is the strong reference get_owned() handed to
    // PMIx_Get_nb, which calls this exactly once.
    let request = unsafe { Arc::from_raw(cbdata.cast_const().cast::<GetRequest>()) };
    let fetched = if status != sys::SUCCESS {
        // Whatever PMIx passed with an error stays its own: a leak is
        // better than a double free.
        Fetched::Failed(status)
    } else if value.is_null() {
        Fetched::Value(Owned::Missing)
    } else {
        // SAFETY: on success PMIx passes a valid value that now belongs to
        // us (as PMIx_Get hands it to its caller): read it, then release it
        // once, the way PMIX_VALUE_RELEASE does.
        unsafe {
            let owned = copy_value(&*value, request.max_len);
            request.api.release_value(value);
            Fetched::Value(owned)
        }
    };
    if Arc::strong_count(&request) == 1 {
        ABANDONED_COMPLETIONS.fetch_add(1, Ordering::Relaxed);
        log::debug!("PMIx_Get answered after its caller gave up");
    }
    request.done.complete(fetched);
}
