//! Small things a World keeps until the process ends, so that what refers
//! to them on every call (a World call's guard, each request) holds a
//! plain `&'static` reference: an `Arc` would cost two locked
//! instructions (its count up and down) each time, and a reference into
//! the World itself would borrow it for as long as the request or the call
//! lives. A few dozen bytes a World. They are listed in a static, so
//! LeakSanitizer (`ci/asan.sh`) sees them reachable, not lost.

use parking_lot::Mutex;
use std::any::Any;

/// `value`, kept until the process ends.
pub(crate) fn keep<T: Any + Send + Sync>(value: T) -> &'static T {
    static KEPT: Mutex<Vec<&'static (dyn Any + Send + Sync)>> = Mutex::new(Vec::new());
    let kept: &'static T = Box::leak(Box::new(value));
    KEPT.lock().push(kept);
    kept
}
