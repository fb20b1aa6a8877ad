use std::ffi::{c_char, c_int, c_void, CStr, OsString};
use std::sync::OnceLock;

use super::sys::{self, Status};
use super::value::copy_c_string;

// ---------------------------------------------------------------------------
// The library
// ---------------------------------------------------------------------------

/// Names tried, in order, by `dlopen`.
const LIBRARY_NAMES: [&CStr; 2] = [c"libpmix.so.2", c"libpmix.so"];

/// Every libpmix function this module calls, resolved once.
pub(super) struct Api {
    /// The name `dlopen` succeeded with.
    pub(super) library: &'static str,
    pub(super) init: unsafe extern "C" fn(*mut sys::Proc, *mut sys::Info, usize) -> Status,
    pub(super) finalize: unsafe extern "C" fn(*const sys::Info, usize) -> Status,
    pub(super) abort: unsafe extern "C" fn(c_int, *const c_char, *mut sys::Proc, usize) -> Status,
    pub(super) put: unsafe extern "C" fn(sys::Scope, *const c_char, *mut sys::Value) -> Status,
    pub(super) commit: unsafe extern "C" fn() -> Status,
    pub(super) fence_nb: unsafe extern "C" fn(
        *const sys::Proc,
        usize,
        *const sys::Info,
        usize,
        sys::OpCallback,
        *mut c_void,
    ) -> Status,
    pub(super) get_nb: unsafe extern "C" fn(
        *const sys::Proc,
        *const c_char,
        *const sys::Info,
        usize,
        sys::ValueCallback,
        *mut c_void,
    ) -> Status,
    error_string: unsafe extern "C" fn(Status) -> *const c_char,
    value_destruct: unsafe extern "C" fn(*mut sys::Value),
    get_version: unsafe extern "C" fn() -> *const c_char,
}

impl Api {
    /// `PMIx_Error_string` for `status`, or a placeholder if PMIx gives
    /// nothing usable.
    pub(super) fn status_text(&self, status: Status) -> String {
        // SAFETY: PMIx_Error_string takes any status and returns a pointer
        // to a static string (or NULL); copy_c_string checks and bounds it.
        let text = unsafe { copy_c_string((self.error_string)(status), 200) };
        match text {
            Some(Ok(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
            _ => "no description from PMIx".to_owned(),
        }
    }

    /// `PMIx_Get_version`, e.g. "OpenPMIx 4.2.2rc2 (...)".
    pub(super) fn version(&self) -> String {
        // SAFETY: PMIx_Get_version returns a pointer to a static string.
        let text = unsafe { copy_c_string((self.get_version)(), 200) };
        match text {
            Some(Ok(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
            _ => "unknown version".to_owned(),
        }
    }

    /// Frees a value PMIx allocated and handed to us: `PMIX_VALUE_RELEASE`,
    /// which pmix_common.h defines as `PMIx_Value_destruct` then `free`
    /// (PMIx 4.2 has no `PMIx_Value_free` symbol).
    ///
    /// # Safety
    /// `value` came from PMIx (allocated with malloc) and is not used again.
    pub(super) unsafe fn release_value(&self, value: *mut sys::Value) {
        // SAFETY: per the contract, a live PMIx-allocated value, released
        // exactly once.
        unsafe {
            (self.value_destruct)(value);
            libc::free(value.cast());
        }
    }
}

pub(super) static API: OnceLock<Result<Api, String>> = OnceLock::new();

/// The library, loaded on first use. The error says what `dlopen` or
/// `dlsym` reported.
pub(super) fn api() -> Result<&'static Api, String> {
    API.get_or_init(|| load(&LIBRARY_NAMES))
        .as_ref()
        .map_err(Clone::clone)
}

/// Opens the first of `names` that loads and resolves every symbol.
pub(super) fn load(names: &[&'static CStr]) -> Result<Api, String> {
    let mut failures = Vec::new();
    for &name in names {
        // SAFETY: name is NUL-terminated. The handle is never closed: PMIx
        // starts threads that must not outlive its code.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if handle.is_null() {
            failures.push(dl_error());
            continue;
        }
        let library = name.to_str().unwrap_or("libpmix");
        // SAFETY: handle is a live dlopen handle, and each type below is the
        // exact signature pmix.h (PMIx 4.2) declares for the symbol named.
        return unsafe {
            Ok(Api {
                library,
                init: symbol(handle, library, c"PMIx_Init")?,
                finalize: symbol(handle, library, c"PMIx_Finalize")?,
                abort: symbol(handle, library, c"PMIx_Abort")?,
                put: symbol(handle, library, c"PMIx_Put")?,
                commit: symbol(handle, library, c"PMIx_Commit")?,
                fence_nb: symbol(handle, library, c"PMIx_Fence_nb")?,
                get_nb: symbol(handle, library, c"PMIx_Get_nb")?,
                error_string: symbol(handle, library, c"PMIx_Error_string")?,
                value_destruct: symbol(handle, library, c"PMIx_Value_destruct")?,
                get_version: symbol(handle, library, c"PMIx_Get_version")?,
            })
        };
    }
    Err(failures.join("; "))
}

/// Looks `name` up in `handle` as a function pointer of type `F`.
///
/// # Safety
/// `handle` is a live `dlopen` handle and `F` is an `extern "C" fn` type
/// matching the C declaration of `name`.
unsafe fn symbol<F: Copy>(handle: *mut c_void, library: &str, name: &CStr) -> Result<F, String> {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<*mut c_void>());
    // SAFETY: handle is live and name NUL-terminated (caller, type).
    let address = unsafe { libc::dlsym(handle, name.as_ptr()) };
    if address.is_null() {
        return Err(format!(
            "{library} has no symbol {}: {} (it is older than PMIx 4)",
            name.to_string_lossy(),
            dl_error()
        ));
    }
    // SAFETY: F is a function pointer type of the symbol's real signature
    // (caller), the same size as the address (checked above).
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&address) })
}

/// The last `dlerror()` text.
fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string that stays
    // valid until the next dl* call on this thread; it is copied at once.
    let text = unsafe { copy_c_string(libc::dlerror(), 4096) };
    match text {
        Some(Ok(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
        _ => "dlerror gave no reason".to_owned(),
    }
}

// ---------------------------------------------------------------------------
// Were we launched under PMIx?
// ---------------------------------------------------------------------------

/// The server-address variables PMIx 4.2 clients look for, newest first.
const SERVER_URI_VARS: [&str; 5] = [
    "PMIX_SERVER_URI41",
    "PMIX_SERVER_URI4",
    "PMIX_SERVER_URI3",
    "PMIX_SERVER_URI21",
    "PMIX_SERVER_URI2",
];

#[derive(Debug, PartialEq)]
pub(super) enum Launch {
    /// No PMIx variables at all: not launched by a PMIx launcher.
    Standalone,
    /// Everything `PMIx_Init` needs is there.
    Pmix {
        namespace: String,
        server_uri_var: &'static str,
    },
    /// Some variables are set, some are missing.
    Incomplete {
        present: Vec<&'static str>,
        missing: Vec<&'static str>,
    },
}

pub(super) fn detect(env: impl Fn(&str) -> Option<OsString>) -> Launch {
    let namespace = env("PMIX_NAMESPACE");
    let rank = env("PMIX_RANK");
    let uri = SERVER_URI_VARS.iter().copied().find(|var| env(var).is_some());
    let mut present = Vec::new();
    let mut missing = Vec::new();
    for (name, set) in [
        ("PMIX_NAMESPACE", namespace.is_some()),
        ("PMIX_RANK", rank.is_some()),
    ] {
        if set {
            present.push(name);
        } else {
            missing.push(name);
        }
    }
    match uri {
        Some(var) => present.push(var),
        None => missing.push("PMIX_SERVER_URI41 (or URI4, URI3, URI21, URI2)"),
    }
    match (namespace, uri) {
        _ if present.is_empty() => Launch::Standalone,
        (Some(namespace), Some(server_uri_var)) if missing.is_empty() => Launch::Pmix {
            namespace: namespace.to_string_lossy().into_owned(),
            server_uri_var,
        },
        _ => Launch::Incomplete { present, missing },
    }
}
