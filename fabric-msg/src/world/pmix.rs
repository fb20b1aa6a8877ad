//! A PMIx client: rank, job size and node-local peers from the launcher
//! (`mpirun`, `srun --mpi=pmix`, `prterun`), and a key-value exchange with
//! a barrier, enough to swap endpoint addresses before the fabric is up.
//!
//! # Loaded at run time
//!
//! libpmix is opened with `dlopen` (`libpmix.so.2`, then `libpmix.so`) the
//! first time a process launched under PMIx calls [`Pmix::connect`], so one
//! binary also starts on hosts without PMIx. A process is "launched under
//! PMIx" when its launcher set `PMIX_NAMESPACE`, `PMIX_RANK` and one of the
//! `PMIX_SERVER_URI*` variables; with none of them `connect` returns
//! `Ok(None)`, with only some it is an error. The library stays loaded for
//! the rest of the process: its progress thread may still run our callbacks
//! after [`Pmix`] is gone.
//!
//! # Timeouts
//!
//! Every operation that waits for other ranks or for the server takes a
//! timeout, and fabric-msg keeps it itself: it uses the non-blocking calls
//! (`PMIx_Fence_nb`, `PMIx_Get_nb`) and waits for their callback with a
//! deadline. It also passes the bound to the server as `PMIX_TIMEOUT`
//! (rounded up to whole seconds, as the attribute wants), which is what
//! lets the server drop the abandoned operation. That alone does not bound
//! the wait (measured with Open MPI 4.1.4's `mpirun`, PMIx 4.2.2):
//!
//! - a fence or get that waits for a rank that never comes does return
//!   `PMIX_ERR_TIMEOUT` after `PMIX_TIMEOUT` seconds;
//! - but a stopped server answers nothing: with `mpirun` stopped, a fence
//!   with a 3 s `PMIX_TIMEOUT` returned after 11 s, when it was resumed;
//! - and a get aimed at a rank that died (under `--enable-recovery`, after a
//!   fence that wrongly succeeded without it) never returned at all, 5 s
//!   `PMIX_TIMEOUT` or not.
//!
//! When our deadline passes first, the operation is abandoned, not
//! cancelled: its inputs and result slot stay alive until PMIx calls back,
//! which it may never do (one small leak per abandoned call). The job's
//! collective state is then unknown; the sensible reaction is
//! [`Pmix::abort`].
//!
//! # Dead ranks
//!
//! Under Open MPI 4.1.4 a rank that dies (even by `SIGKILL`) makes `mpirun`
//! end the whole job: the survivors get `SIGTERM` one second later
//! (`odls_base_sigkill_timeout`), `SIGKILL` one second after that. With
//! `--enable-recovery` they live on, but learn nothing: PMIx 4.2.2 rejects
//! the `PMIX_ERR_PROC_ABORTED` notification `mpirun` builds (it logs
//! `PMIX ERROR: BAD-PARAM ... pmix_event_notification.c`), so no event
//! handler ever hears of the death. A fence that was waiting for the dead
//! rank then ends with `PMIX_ERR_PARTIAL_SUCCESS`.
//!
//! # Thread safety
//!
//! libpmix is thread-safe (every call is handed to its own progress
//! thread), so [`Pmix`] is `Send` and `Sync`. One `Pmix` per process:
//! `PMIx_Init` runs once, and `PMIx_Finalize` when it is dropped.
// Nothing calls this yet: the bootstrap that will is being written.
#![cfg_attr(not(test), allow(dead_code))]

use std::ffi::{c_char, c_int, c_void, CStr, CString, OsString};
use std::fmt;
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// The parts of `pmix_common.h` (PMIx 4.2) this module uses, written out by
/// hand. The `layout_matches_pmix_h` test compiles a C program against the
/// real header and checks every size, offset and constant here.
mod sys {
    use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

    /// `pmix_status_t`.
    pub(super) type Status = c_int;
    /// `pmix_rank_t`.
    pub(super) type Rank = u32;
    /// `pmix_data_type_t`.
    pub(super) type DataType = u16;
    /// `pmix_scope_t`.
    pub(super) type Scope = u8;

    pub(super) const MAX_NSLEN: usize = 255;
    pub(super) const MAX_KEYLEN: usize = 511;

    pub(super) const SUCCESS: Status = 0;
    pub(super) const ERR_TIMEOUT: Status = -24;
    pub(super) const ERR_UNREACH: Status = -25;
    pub(super) const ERR_BAD_PARAM: Status = -27;
    pub(super) const ERR_INIT: Status = -31;
    pub(super) const ERR_NOT_FOUND: Status = -46;
    pub(super) const ERR_COMM_FAILURE: Status = -49;
    pub(super) const ERR_PARTIAL_SUCCESS: Status = -52;
    pub(super) const ERR_LOST_CONNECTION: Status = -61;
    /// Deprecated in 4.x (pmix_deprecated.h) but still what Open MPI sends.
    pub(super) const ERR_PROC_ABORTED: Status = -7;
    pub(super) const PROC_TERMINATED: Status = -111;
    pub(super) const OPERATION_SUCCEEDED: Status = -157;

    /// `PMIX_RANK_UNDEF`.
    pub(super) const RANK_UNDEF: Rank = u32::MAX;
    /// `PMIX_RANK_WILDCARD`: every rank of a namespace.
    pub(super) const RANK_WILDCARD: Rank = u32::MAX - 1;
    /// `PMIX_RANK_VALID`: real ranks are below it, the rest are reserved.
    pub(super) const RANK_VALID: Rank = u32::MAX - 50;

    pub(super) const BOOL: DataType = 1;
    pub(super) const BYTE: DataType = 2;
    pub(super) const STRING: DataType = 3;
    pub(super) const SIZE: DataType = 4;
    pub(super) const INT: DataType = 6;
    pub(super) const INT8: DataType = 7;
    pub(super) const INT16: DataType = 8;
    pub(super) const INT32: DataType = 9;
    pub(super) const INT64: DataType = 10;
    pub(super) const UINT: DataType = 11;
    pub(super) const UINT8: DataType = 12;
    pub(super) const UINT16: DataType = 13;
    pub(super) const UINT32: DataType = 14;
    pub(super) const UINT64: DataType = 15;
    pub(super) const BYTE_OBJECT: DataType = 27;
    pub(super) const PROC_RANK: DataType = 40;

    /// `PMIX_GLOBAL`: share with every process of the job, on any node.
    pub(super) const GLOBAL: Scope = 3;

    pub(super) const JOB_SIZE: &CStr = c"pmix.job.size";
    pub(super) const LOCAL_RANK: &CStr = c"pmix.lrank";
    pub(super) const LOCAL_PEERS: &CStr = c"pmix.lpeers";
    pub(super) const HOSTNAME: &CStr = c"pmix.hname";
    pub(super) const TIMEOUT: &CStr = c"pmix.timeout";
    pub(super) const COLLECT_DATA: &CStr = c"pmix.collect";

    /// `pmix_proc_t`.
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub(super) struct Proc {
        pub(super) nspace: [c_char; MAX_NSLEN + 1],
        pub(super) rank: Rank,
    }

    /// `pmix_byte_object_t`.
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub(super) struct ByteObject {
        pub(super) bytes: *mut c_char,
        pub(super) size: usize,
    }

    /// `pmix_envar_t`: never used, but it is the union's largest member.
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub(super) struct Envar {
        pub(super) envar: *mut c_char,
        pub(super) value: *mut c_char,
        pub(super) separator: c_char,
    }

    /// The `data` union of `pmix_value_t`: the members read or written
    /// here, plus the ones that set its size and alignment. The others are
    /// pointers or narrower integers.
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub(super) union ValueData {
        pub(super) flag: bool,
        pub(super) byte: u8,
        pub(super) string: *mut c_char,
        pub(super) size: usize,
        pub(super) integer: c_int,
        pub(super) int8: i8,
        pub(super) int16: i16,
        pub(super) int32: i32,
        pub(super) int64: i64,
        pub(super) uint: c_uint,
        pub(super) uint8: u8,
        pub(super) uint16: u16,
        pub(super) uint32: u32,
        pub(super) uint64: u64,
        pub(super) rank: Rank,
        pub(super) bo: ByteObject,
        pub(super) tv: libc::timeval,
        pub(super) envar: Envar,
        pub(super) ptr: *mut c_void,
    }

    /// `pmix_value_t`.
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub(super) struct Value {
        pub(super) type_: DataType,
        pub(super) data: ValueData,
    }

    /// `pmix_info_t`.
    #[repr(C)]
    #[derive(Clone, Copy)]
    pub(super) struct Info {
        pub(super) key: [c_char; MAX_KEYLEN + 1],
        /// `pmix_info_directives_t`.
        pub(super) flags: u32,
        pub(super) value: Value,
    }

    /// `pmix_op_cbfunc_t`.
    pub(super) type OpCallback = unsafe extern "C" fn(status: Status, cbdata: *mut c_void);
    /// `pmix_value_cbfunc_t`.
    pub(super) type ValueCallback = unsafe extern "C" fn(status: Status, kv: *mut Value, cbdata: *mut c_void);

    impl Proc {
        /// A process of `nspace` (already checked to fit).
        pub(super) fn new(nspace: &[c_char; MAX_NSLEN + 1], rank: Rank) -> Proc {
            Proc {
                nspace: *nspace,
                rank,
            }
        }

        pub(super) fn undefined() -> Proc {
            Proc {
                nspace: [0; MAX_NSLEN + 1],
                rank: RANK_UNDEF,
            }
        }
    }

    impl Value {
        /// A byte object pointing at `bytes`; PMIx copies it, never writes it.
        pub(super) fn byte_object(bytes: &[u8]) -> Value {
            let bo = if bytes.is_empty() {
                ByteObject {
                    bytes: std::ptr::null_mut(),
                    size: 0,
                }
            } else {
                ByteObject {
                    bytes: bytes.as_ptr().cast_mut().cast(),
                    size: bytes.len(),
                }
            };
            Value {
                type_: BYTE_OBJECT,
                data: ValueData { bo },
            }
        }
    }

    impl Info {
        fn with_value(key: &CStr, value: Value) -> Info {
            let mut info = Info {
                key: [0; MAX_KEYLEN + 1],
                flags: 0,
                value,
            };
            // Our keys are the constants above, all far shorter than the
            // field; the last byte stays NUL whatever happens.
            for (dst, &src) in info.key[..MAX_KEYLEN].iter_mut().zip(key.to_bytes()) {
                *dst = src as c_char;
            }
            info
        }

        pub(super) fn int(key: &CStr, v: c_int) -> Info {
            Info::with_value(
                key,
                Value {
                    type_: INT,
                    data: ValueData { integer: v },
                },
            )
        }

        pub(super) fn flag(key: &CStr, v: bool) -> Info {
            Info::with_value(
                key,
                Value {
                    type_: BOOL,
                    data: ValueData { flag: v },
                },
            )
        }
    }
}

use sys::Status;

// ---------------------------------------------------------------------------
// The library
// ---------------------------------------------------------------------------

/// Names tried, in order, by `dlopen`.
const LIBRARY_NAMES: [&CStr; 2] = [c"libpmix.so.2", c"libpmix.so"];

/// Every libpmix function this module calls, resolved once.
struct Api {
    /// The name `dlopen` succeeded with.
    library: &'static str,
    init: unsafe extern "C" fn(*mut sys::Proc, *mut sys::Info, usize) -> Status,
    finalize: unsafe extern "C" fn(*const sys::Info, usize) -> Status,
    abort: unsafe extern "C" fn(c_int, *const c_char, *mut sys::Proc, usize) -> Status,
    put: unsafe extern "C" fn(sys::Scope, *const c_char, *mut sys::Value) -> Status,
    commit: unsafe extern "C" fn() -> Status,
    fence_nb: unsafe extern "C" fn(
        *const sys::Proc,
        usize,
        *const sys::Info,
        usize,
        sys::OpCallback,
        *mut c_void,
    ) -> Status,
    get_nb: unsafe extern "C" fn(
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
    fn status_text(&self, status: Status) -> String {
        // SAFETY: PMIx_Error_string takes any status and returns a pointer
        // to a static string (or NULL); copy_c_string checks and bounds it.
        let text = unsafe { copy_c_string((self.error_string)(status), 200) };
        match text {
            Some(Ok(bytes)) => String::from_utf8_lossy(&bytes).into_owned(),
            _ => "no description from PMIx".to_owned(),
        }
    }

    /// `PMIx_Get_version`, e.g. "OpenPMIx 4.2.2rc2 (...)".
    fn version(&self) -> String {
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
    unsafe fn release_value(&self, value: *mut sys::Value) {
        // SAFETY: per the contract, a live PMIx-allocated value, released
        // exactly once.
        unsafe {
            (self.value_destruct)(value);
            libc::free(value.cast());
        }
    }
}

static API: OnceLock<Result<Api, String>> = OnceLock::new();

/// The library, loaded on first use. The error says what `dlopen` or
/// `dlsym` reported.
fn api() -> Result<&'static Api, String> {
    API.get_or_init(|| load(&LIBRARY_NAMES))
        .as_ref()
        .map_err(Clone::clone)
}

/// Opens the first of `names` that loads and resolves every symbol.
fn load(names: &[&'static CStr]) -> Result<Api, String> {
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
enum Launch {
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

fn detect(env: impl Fn(&str) -> Option<OsString>) -> Launch {
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

// ---------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------

/// What went wrong talking to PMIx. The message names the call, PMIx's own
/// status and text where there is one, and what to do about it.
#[derive(Debug)]
#[non_exhaustive]
pub(crate) enum PmixError {
    /// Some of the variables a PMIx launcher sets are present, others not.
    IncompleteEnvironment {
        /// The variables that are set.
        present: Vec<&'static str>,
        /// The variables that are missing.
        missing: Vec<&'static str>,
    },
    /// Launched under PMIx, but libpmix could not be loaded or is unusable.
    Library {
        /// `PMIX_NAMESPACE`, to show who launched us.
        namespace: String,
        /// What `dlopen`/`dlsym` said.
        problem: String,
    },
    /// `connect` was called while a [`Pmix`] exists, or after one was
    /// finalized.
    AlreadyUsed {
        /// True if the earlier connection has been finalized.
        finalized: bool,
    },
    /// A PMIx call returned an error status.
    Call {
        /// The PMIx function, e.g. `PMIx_Fence`.
        call: &'static str,
        /// The `pmix_status_t` (negative).
        status: i32,
        /// `PMIx_Error_string` for it.
        text: String,
        /// What was asked, e.g. "key `addr` of rank 2".
        context: String,
    },
    /// The deadline passed before PMIx answered.
    Timeout {
        /// The PMIx function.
        call: &'static str,
        /// The bound that expired.
        after: Duration,
        /// What was asked.
        context: String,
    },
    /// An argument cannot be given to PMIx (NUL byte, too long, reserved).
    InvalidArgument {
        /// The PMIx function it was meant for.
        call: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// PMIx returned something that failed a check.
    BadValue {
        /// The PMIx function.
        call: &'static str,
        /// What was asked.
        context: String,
        /// What is wrong with the answer.
        problem: String,
    },
}

impl PmixError {
    /// True for both kinds of timeout: the server's `PMIX_ERR_TIMEOUT` and
    /// our own deadline.
    pub(crate) fn is_timeout(&self) -> bool {
        matches!(
            self,
            PmixError::Timeout { .. }
                | PmixError::Call {
                    status: sys::ERR_TIMEOUT,
                    ..
                }
        )
    }

    /// The PMIx function the error is about, if any.
    pub(crate) fn call(&self) -> Option<&'static str> {
        match self {
            PmixError::Call { call, .. }
            | PmixError::Timeout { call, .. }
            | PmixError::InvalidArgument { call, .. }
            | PmixError::BadValue { call, .. } => Some(call),
            PmixError::Library { .. } => Some("dlopen"),
            PmixError::IncompleteEnvironment { .. } | PmixError::AlreadyUsed { .. } => Some("PMIx_Init"),
        }
    }
}

/// What to do about `status` returned by `call`.
fn advice(call: &str, status: Status) -> &'static str {
    match status {
        _ if call == "PMIx_Init" => {
            "could not connect to the launcher's PMIx server: check that the launcher is still \
             running and that its PMIx is compatible with the library loaded here (PMIx 4 clients \
             need a server of PMIx v2 or newer), or unset the PMIX_* variables to run without a \
             launcher"
        }
        sys::ERR_TIMEOUT => {
            "a rank did not get there in time, or the launcher stopped answering: check that \
             every rank makes the same calls (put/commit before the fence, every rank in the \
             fence), or give a longer timeout"
        }
        sys::ERR_PARTIAL_SUCCESS | sys::ERR_PROC_ABORTED | sys::PROC_TERMINATED => {
            "a rank of the job terminated during the operation; the job cannot complete \
             collective steps any more and should abort"
        }
        sys::ERR_NOT_FOUND => {
            "PMIx has no such key for that rank: a rank must put() and commit() a key before \
             the fence that precedes the get(); job information may not be provided by this \
             launcher at all"
        }
        sys::ERR_UNREACH | sys::ERR_LOST_CONNECTION | sys::ERR_COMM_FAILURE => {
            "the PMIx server (mpirun, orted, slurmstepd, prted) is unreachable: the launcher has \
             probably exited or is tearing the job down"
        }
        sys::ERR_INIT => "PMIx is not initialised in this process (was it finalized?)",
        sys::ERR_BAD_PARAM => "PMIx rejected the arguments: this is a fabric-msg bug, please report it",
        _ => "see the launcher's output for the cause",
    }
}

impl fmt::Display for PmixError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PmixError::IncompleteEnvironment { present, missing } => write!(
                f,
                "PMIx_Init not attempted: the environment has {} but not {}; a launcher's PMIx \
                 set-up is incomplete (or the variables were inherited from one): launch through \
                 mpirun/srun/prterun, or unset every PMIX_* variable to run standalone",
                present.join(", "),
                missing.join(", ")
            ),
            PmixError::Library { namespace, problem } => write!(
                f,
                "launched by a PMIx launcher (PMIX_NAMESPACE={namespace}) but the PMIx client \
                 library could not be used: {problem}; install it (Debian/Ubuntu: apt-get install \
                 libpmix2, RHEL/Fedora: dnf install pmix) or put the directory holding \
                 libpmix.so.2 on LD_LIBRARY_PATH"
            ),
            PmixError::AlreadyUsed { finalized: false } => write!(
                f,
                "PMIx_Init not called again: this process already has a Pmix connection; share \
                 that one (it is Sync)"
            ),
            PmixError::AlreadyUsed { finalized: true } => write!(
                f,
                "PMIx_Init not called again: this process already finalized PMIx, which cannot \
                 be initialised twice; keep the first Pmix for the life of the process"
            ),
            PmixError::Call {
                call,
                status,
                text,
                context,
            } => write!(
                f,
                "{call} failed for {context}: PMIx status {status} ({text}); {}",
                advice(call, *status)
            ),
            PmixError::Timeout { call, after, context } => write!(
                f,
                "{call} timed out for {context}: no answer within {after:?}; {}",
                advice(call, sys::ERR_TIMEOUT)
            ),
            PmixError::InvalidArgument { call, problem } => write!(f, "{call} not called: {problem}"),
            PmixError::BadValue {
                call,
                context,
                problem,
            } => write!(
                f,
                "{call} returned an unusable value for {context}: {problem}; the launcher's PMIx \
                 server provides something other than what PMIx 4 documents"
            ),
        }
    }
}

impl std::error::Error for PmixError {}

// ---------------------------------------------------------------------------
// The connection
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Debug)]
enum Lifecycle {
    Unused,
    Connected,
    Finalized,
}

/// PMIx_Init runs at most once per process, guarded by this.
static LIFECYCLE: Mutex<Lifecycle> = Mutex::new(Lifecycle::Unused);

/// Locks `m`, carrying on if a panicking thread poisoned it: every value
/// guarded here stays meaningful whatever was interrupted.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Bound on the lookups of job information (job size, local rank, peers,
/// host name), which libpmix answers from what the server gave it at
/// start-up.
const INFO_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest `PMIX_LOCAL_PEERS` string accepted (about 100 000 ranks).
const MAX_PEERS_TEXT: usize = 1 << 20;
/// Longest host name accepted.
const MAX_HOSTNAME: usize = 4096;

/// This process's connection to its launcher's PMIx server.
pub(crate) struct Pmix {
    api: &'static Api,
    me: sys::Proc,
    namespace: String,
    job_size: OnceLock<u32>,
    finalized: bool,
}

impl fmt::Debug for Pmix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pmix")
            .field("namespace", &self.namespace)
            .field("rank", &self.me.rank)
            .field("library", &self.api.library)
            .finish()
    }
}

impl Pmix {
    /// Connects to the launcher's PMIx server (`PMIx_Init`).
    ///
    /// `Ok(None)` when the process was not launched under PMIx (none of
    /// `PMIX_NAMESPACE`, `PMIX_RANK`, `PMIX_SERVER_URI*` is set); libpmix
    /// is then not even loaded. An error when it was, but libpmix cannot be
    /// loaded or `PMIx_Init` fails, when only some of the variables are
    /// set, and on a second call in one process.
    pub(crate) fn connect() -> Result<Option<Pmix>, PmixError> {
        let namespace_var = match detect(|name| std::env::var_os(name)) {
            Launch::Standalone => return Ok(None),
            Launch::Incomplete { present, missing } => {
                return Err(PmixError::IncompleteEnvironment { present, missing })
            }
            Launch::Pmix {
                namespace,
                server_uri_var,
            } => {
                log::debug!("launched under PMIx: namespace {namespace}, server address in {server_uri_var}");
                namespace
            }
        };
        let mut lifecycle = lock(&LIFECYCLE);
        match *lifecycle {
            Lifecycle::Unused => {}
            Lifecycle::Connected => return Err(PmixError::AlreadyUsed { finalized: false }),
            Lifecycle::Finalized => return Err(PmixError::AlreadyUsed { finalized: true }),
        }
        let api = api().map_err(|problem| PmixError::Library {
            namespace: namespace_var.clone(),
            problem,
        })?;
        let mut me = sys::Proc::undefined();
        // SAFETY: me is a pmix_proc_t for PMIx to fill in; no info array.
        let status = unsafe { (api.init)(&mut me, ptr::null_mut(), 0) };
        if status != sys::SUCCESS {
            return Err(PmixError::Call {
                call: "PMIx_Init",
                status,
                text: api.status_text(status),
                context: format!(
                    "namespace {namespace_var} with {} ({})",
                    api.library,
                    api.version()
                ),
            });
        }
        *lifecycle = Lifecycle::Connected;
        drop(lifecycle);
        // From here on `pmix` finalizes when dropped, on error paths too.
        let mut pmix = Pmix {
            api,
            me,
            namespace: String::new(),
            job_size: OnceLock::new(),
            finalized: false,
        };
        pmix.namespace = checked_namespace(&me.nspace).map_err(|problem| PmixError::BadValue {
            call: "PMIx_Init",
            context: "this process's namespace".to_owned(),
            problem,
        })?;
        if me.rank >= sys::RANK_VALID {
            return Err(PmixError::BadValue {
                call: "PMIx_Init",
                context: "this process's rank".to_owned(),
                problem: format!("rank {:#x} is one of PMIx's reserved values", me.rank),
            });
        }
        log::debug!(
            "PMIx: rank {} of namespace {} ({})",
            me.rank,
            pmix.namespace,
            api.version()
        );
        Ok(Some(pmix))
    }

    /// This process's rank in its job.
    pub(crate) fn rank(&self) -> u32 {
        self.me.rank
    }

    /// The job's PMIx namespace.
    pub(crate) fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Calls `PMIx_Finalize` and reports its error, which dropping only logs.
    pub(crate) fn finalize(mut self) -> Result<(), PmixError> {
        self.finalize_once()
    }

    fn finalize_once(&mut self) -> Result<(), PmixError> {
        if self.finalized {
            return Ok(());
        }
        self.finalized = true;
        *lock(&LIFECYCLE) = Lifecycle::Finalized;
        // SAFETY: PMIx_Init succeeded for this Pmix and this is the one
        // matching PMIx_Finalize; no info array. libpmix bounds its wait for
        // the server's acknowledgement (2 s in 4.2).
        let status = unsafe { (self.api.finalize)(ptr::null(), 0) };
        self.check("PMIx_Finalize", status, || "this process".to_owned())
    }

    /// A `Call` error for a failed status, `Ok` for success.
    fn check(
        &self,
        call: &'static str,
        status: Status,
        context: impl FnOnce() -> String,
    ) -> Result<(), PmixError> {
        if status == sys::SUCCESS {
            Ok(())
        } else {
            Err(PmixError::Call {
                call,
                status,
                text: self.api.status_text(status),
                context: context(),
            })
        }
    }

    fn proc(&self, rank: u32) -> sys::Proc {
        sys::Proc::new(&self.me.nspace, rank)
    }
}

impl Drop for Pmix {
    fn drop(&mut self) {
        if let Err(e) = self.finalize_once() {
            log::warn!("{e}");
        }
    }
}

// ---------------------------------------------------------------------------
// Job information
// ---------------------------------------------------------------------------

impl Pmix {
    /// Number of processes in the job (`PMIX_JOB_SIZE`).
    pub(crate) fn job_size(&self) -> Result<u32, PmixError> {
        if let Some(&size) = self.job_size.get() {
            return Ok(size);
        }
        let context = || "PMIX_JOB_SIZE of the job".to_owned();
        let size: u32 = self.get_unsigned(sys::RANK_WILDCARD, sys::JOB_SIZE, context)?;
        if size == 0 || self.me.rank >= size {
            return Err(PmixError::BadValue {
                call: "PMIx_Get",
                context: context(),
                problem: format!(
                    "job size {size} does not include this process's rank {}",
                    self.me.rank
                ),
            });
        }
        Ok(*self.job_size.get_or_init(|| size))
    }

    /// This process's rank among the job's processes on this node
    /// (`PMIX_LOCAL_RANK`).
    pub(crate) fn local_rank(&self) -> Result<u16, PmixError> {
        let context = || "PMIX_LOCAL_RANK of this process".to_owned();
        let local: u16 = self.get_unsigned(self.me.rank, sys::LOCAL_RANK, context)?;
        let size = self.job_size()?;
        if u32::from(local) >= size {
            return Err(PmixError::BadValue {
                call: "PMIx_Get",
                context: context(),
                problem: format!("local rank {local} is not below the job size {size}"),
            });
        }
        Ok(local)
    }

    /// The ranks of this job on this node, this one included, in the
    /// server's order (`PMIX_LOCAL_PEERS`).
    pub(crate) fn local_peers(&self) -> Result<Vec<u32>, PmixError> {
        let context = || "PMIX_LOCAL_PEERS of this node".to_owned();
        let text = match self.get_value(
            self.proc(sys::RANK_WILDCARD),
            sys::LOCAL_PEERS,
            MAX_PEERS_TEXT,
            INFO_TIMEOUT,
        )? {
            Owned::String(text) => text,
            other => return Err(self.wrong_type(other, "a string", &context(), MAX_PEERS_TEXT)),
        };
        let size = self.job_size()?;
        parse_peers(&text, size, self.me.rank).map_err(|problem| PmixError::BadValue {
            call: "PMIx_Get",
            context: context(),
            problem,
        })
    }

    /// The name of the node this process runs on, as the launcher knows it
    /// (`PMIX_HOSTNAME`).
    pub(crate) fn hostname(&self) -> Result<String, PmixError> {
        let context = || "PMIX_HOSTNAME of this process".to_owned();
        match self.get_value(self.proc(self.me.rank), sys::HOSTNAME, MAX_HOSTNAME, INFO_TIMEOUT)? {
            Owned::String(text) if !text.is_empty() => {
                String::from_utf8(text).map_err(|_| PmixError::BadValue {
                    call: "PMIx_Get",
                    context: context(),
                    problem: "the host name is not UTF-8".to_owned(),
                })
            }
            other => Err(self.wrong_type(other, "a non-empty string", &context(), MAX_HOSTNAME)),
        }
    }

    /// A job-information value of any integer type that fits in `T`.
    fn get_unsigned<T: TryFrom<u64>>(
        &self,
        rank: u32,
        key: &'static CStr,
        context: impl Fn() -> String,
    ) -> Result<T, PmixError> {
        // Room for a wrongly typed string to be reported as one.
        let number = match self.get_value(self.proc(rank), key, 64, INFO_TIMEOUT)? {
            Owned::Unsigned(n) => Some(n),
            Owned::Signed(n) => u64::try_from(n).ok(),
            other => return Err(self.wrong_type(other, "an integer", &context(), 64)),
        };
        number
            .and_then(|n| T::try_from(n).ok())
            .ok_or_else(|| PmixError::BadValue {
                call: "PMIx_Get",
                context: context(),
                problem: format!("the value is out of range for a {}", std::any::type_name::<T>()),
            })
    }

    fn wrong_type(&self, got: Owned, wanted: &str, context: &str, max_len: usize) -> PmixError {
        let problem = match got {
            Owned::TooLong { len: Some(len), .. } => {
                format!("the value is {len} bytes long, more than the {max_len} allowed")
            }
            Owned::TooLong { len: None, .. } => {
                format!("the value is longer than the {max_len} bytes allowed")
            }
            Owned::Missing => "PMIx reported success but gave no value".to_owned(),
            Owned::Malformed(why) => why,
            other => format!(
                "expected {wanted}, got a value of type {}",
                type_name(other.data_type())
            ),
        };
        PmixError::BadValue {
            call: "PMIx_Get",
            context: context.to_owned(),
            problem,
        }
    }
}

/// Parses `PMIX_LOCAL_PEERS`: comma-separated decimal ranks, each below
/// `size`, no repeats, `me` among them.
fn parse_peers(text: &[u8], size: u32, me: u32) -> Result<Vec<u32>, String> {
    let text = std::str::from_utf8(text).map_err(|_| "the rank list is not text".to_owned())?;
    let mut peers = Vec::new();
    for item in text.split(',') {
        let item = item.trim();
        let rank: u32 = item
            .parse()
            .map_err(|_| format!("`{item}` in \"{text}\" is not a rank"))?;
        if rank >= size {
            return Err(format!(
                "rank {rank} in \"{text}\" is outside the job (size {size})"
            ));
        }
        if peers.contains(&rank) {
            return Err(format!("rank {rank} appears twice in \"{text}\""));
        }
        peers.push(rank);
    }
    if !peers.contains(&me) {
        return Err(format!("\"{text}\" does not include this process's rank {me}"));
    }
    Ok(peers)
}

// ---------------------------------------------------------------------------
// Exchange
// ---------------------------------------------------------------------------

impl Pmix {
    /// Publishes `bytes` under `key` for every rank of the job
    /// (`PMIx_Put`, `PMIX_GLOBAL` scope, a byte object). Nothing leaves
    /// this process before [`commit`](Pmix::commit).
    pub(crate) fn put(&self, key: &str, bytes: &[u8]) -> Result<(), PmixError> {
        let ckey = checked_key("PMIx_Put", key)?;
        if key.starts_with("pmix") {
            // PMIx_Put returns success for these and silently drops them.
            return Err(PmixError::InvalidArgument {
                call: "PMIx_Put",
                problem: format!("key `{key}` starts with \"pmix\", which PMIx reserves for itself"),
            });
        }
        let mut value = sys::Value::byte_object(bytes);
        // SAFETY: ckey is NUL-terminated; value points into `bytes`, which
        // outlives the call; PMIx_Put copies key and value before it returns
        // and never writes through the byte pointer.
        let status = unsafe { (self.api.put)(sys::GLOBAL, ckey.as_ptr(), &mut value) };
        self.check("PMIx_Put", status, || {
            format!("key `{key}` ({} bytes)", bytes.len())
        })
    }

    /// Sends everything put so far to the server (`PMIx_Commit`).
    pub(crate) fn commit(&self) -> Result<(), PmixError> {
        // SAFETY: no arguments; PMIx is initialised while self exists.
        let status = unsafe { (self.api.commit)() };
        self.check("PMIx_Commit", status, || "the values put so far".to_owned())
    }

    /// Barrier across every rank of the job (`PMIx_Fence_nb`); with
    /// `collect_data`, every rank's committed values come back with it, so
    /// the gets that follow are answered locally.
    ///
    /// Returns a timeout error if not every rank arrived within `timeout`
    /// (see the module docs for how the bound is kept).
    pub(crate) fn fence(&self, collect_data: bool, timeout: Duration) -> Result<(), PmixError> {
        let context = || format!("all ranks of {}", self.namespace);
        let deadline = deadline("PMIx_Fence", timeout)?;
        let request = Arc::new(FenceRequest {
            inputs: FenceInputs {
                procs: [self.proc(sys::RANK_WILDCARD)],
                info: [
                    sys::Info::int(sys::TIMEOUT, server_timeout(timeout)),
                    sys::Info::flag(sys::COLLECT_DATA, collect_data),
                ],
            },
            done: Slot::new(),
        });
        let cbdata = Arc::into_raw(Arc::clone(&request)).cast_mut().cast::<c_void>();
        let inputs = &request.inputs;
        // SAFETY: the arrays live in the request, which stays alive until
        // fence_done has run: cbdata is a strong reference handed to PMIx,
        // released by the callback (or below if PMIx refuses the call).
        let status = unsafe {
            (self.api.fence_nb)(
                inputs.procs.as_ptr(),
                inputs.procs.len(),
                inputs.info.as_ptr(),
                inputs.info.len(),
                fence_done,
                cbdata,
            )
        };
        if status != sys::SUCCESS {
            // SAFETY: PMIx did not accept the request, so it will not call
            // back: the reference handed over comes back here, once.
            drop(unsafe { Arc::from_raw(cbdata.cast::<FenceRequest>()) });
            if status == sys::OPERATION_SUCCEEDED {
                return Ok(());
            }
            return self.check("PMIx_Fence", status, context);
        }
        match request.done.wait(deadline) {
            Some(status) => self.check("PMIx_Fence", status, context),
            None => Err(PmixError::Timeout {
                call: "PMIx_Fence",
                after: timeout,
                context: context(),
            }),
        }
    }

    /// The value `rank` put under `key`, which must be a byte object of at
    /// most `max_len` bytes (`PMIx_Get_nb`). Waits up to `timeout` for the
    /// value to appear.
    pub(crate) fn get(
        &self,
        rank: u32,
        key: &str,
        max_len: usize,
        timeout: Duration,
    ) -> Result<Vec<u8>, PmixError> {
        let ckey = checked_key("PMIx_Get", key)?;
        let context = || format!("key `{key}` of rank {rank}");
        let size = self.job_size()?;
        if rank >= size {
            return Err(PmixError::InvalidArgument {
                call: "PMIx_Get",
                problem: format!("rank {rank} is outside the job (size {size})"),
            });
        }
        match self.get_owned(self.proc(rank), ckey, max_len, timeout, &context)? {
            Owned::Bytes(bytes) => Ok(bytes),
            other => Err(self.wrong_type(other, "a byte object (as put() stores)", &context(), max_len)),
        }
    }

    /// Looks up one of PMIx's own keys.
    fn get_value(
        &self,
        proc: sys::Proc,
        key: &'static CStr,
        max_len: usize,
        timeout: Duration,
    ) -> Result<Owned, PmixError> {
        let name = key.to_string_lossy();
        let context = || format!("{name} of {}", rank_name(proc.rank));
        self.get_owned(proc, key.to_owned(), max_len, timeout, &context)
    }

    /// `PMIx_Get_nb` with a deadline; the value is copied out (bounded by
    /// `max_len`) and released inside the callback.
    fn get_owned(
        &self,
        proc: sys::Proc,
        key: CString,
        max_len: usize,
        timeout: Duration,
        context: &dyn Fn() -> String,
    ) -> Result<Owned, PmixError> {
        let deadline = deadline("PMIx_Get", timeout)?;
        let request = Arc::new(GetRequest {
            inputs: GetInputs {
                proc,
                key,
                info: [sys::Info::int(sys::TIMEOUT, server_timeout(timeout))],
            },
            api: self.api,
            max_len,
            done: Slot::new(),
        });
        let cbdata = Arc::into_raw(Arc::clone(&request)).cast_mut().cast::<c_void>();
        let inputs = &request.inputs;
        // SAFETY: proc, key and info live in the request, which stays alive
        // until get_done has run (libpmix keeps pointers to the key and info
        // until then): cbdata is a strong reference handed to PMIx, released
        // by the callback, or below if PMIx refuses the call.
        let status = unsafe {
            (self.api.get_nb)(
                &inputs.proc,
                inputs.key.as_ptr(),
                inputs.info.as_ptr(),
                inputs.info.len(),
                get_done,
                cbdata,
            )
        };
        if status != sys::SUCCESS {
            // SAFETY: PMIx did not accept the request (OPERATION_SUCCEEDED
            // also means no callback), so the reference comes back here, once.
            drop(unsafe { Arc::from_raw(cbdata.cast::<GetRequest>()) });
            if status == sys::OPERATION_SUCCEEDED {
                return Ok(Owned::Missing);
            }
            return Err(PmixError::Call {
                call: "PMIx_Get",
                status,
                text: self.api.status_text(status),
                context: context(),
            });
        }
        match request.done.wait(deadline) {
            Some(Fetched::Value(owned)) => Ok(owned),
            Some(Fetched::Failed(status)) => Err(PmixError::Call {
                call: "PMIx_Get",
                status,
                text: self.api.status_text(status),
                context: context(),
            }),
            None => Err(PmixError::Timeout {
                call: "PMIx_Get",
                after: timeout,
                context: context(),
            }),
        }
    }

    /// Asks the launcher to kill every process of the job (`PMIx_Abort` on
    /// the whole namespace), with `status` as the job's exit status.
    ///
    /// The message is also written to stderr, because Open MPI 4.1.4's
    /// `mpirun` does not print it. A `status` of 0 is sent as 1: `mpirun`
    /// would report the killed job as a success otherwise.
    ///
    /// `Ok(())` means the launcher accepted the request; under Open MPI
    /// 4.1.4 that is what happens, and `SIGTERM` follows about a second
    /// later. The caller should stop working and exit with `status`.
    pub(crate) fn abort(&self, status: i32, msg: &str) -> Result<(), PmixError> {
        let cmsg = CString::new(msg).map_err(|_| PmixError::InvalidArgument {
            call: "PMIx_Abort",
            problem: "the message contains a NUL byte".to_owned(),
        })?;
        let status = if status == 0 {
            log::warn!("PMIx_Abort with status 0 would look like success to the launcher; sending 1");
            1
        } else {
            status
        };
        eprintln!(
            "fabric-msg: rank {} of PMIx namespace {} aborts the job (status {status}): {msg}",
            self.me.rank, self.namespace
        );
        // SAFETY: cmsg is NUL-terminated and outlives the call; a NULL proc
        // array means every process of our namespace.
        let rc = unsafe { (self.api.abort)(status, cmsg.as_ptr(), ptr::null_mut(), 0) };
        self.check("PMIx_Abort", rc, || format!("the job {}", self.namespace))
    }
}

// ---------------------------------------------------------------------------
// Bounded non-blocking calls
// ---------------------------------------------------------------------------

/// How many callbacks arrived after their caller had given up waiting.
static ABANDONED_COMPLETIONS: AtomicUsize = AtomicUsize::new(0);

/// Where a PMIx callback leaves its result for the waiting caller.
struct Slot<T> {
    result: Mutex<Option<T>>,
    ready: Condvar,
}

impl<T> Slot<T> {
    fn new() -> Slot<T> {
        Slot {
            result: Mutex::new(None),
            ready: Condvar::new(),
        }
    }

    fn complete(&self, value: T) {
        *lock(&self.result) = Some(value);
        self.ready.notify_all();
    }

    /// The result, or `None` if `deadline` passes first.
    fn wait(&self, deadline: Option<Instant>) -> Option<T> {
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
struct FenceInputs {
    procs: [sys::Proc; 1],
    info: [sys::Info; 2],
}

// SAFETY: the arrays hold only integers (the info values are an int and a
// bool; no pointer member is set) and are never written after construction.
unsafe impl Send for FenceInputs {}
// SAFETY: as for Send: immutable plain data.
unsafe impl Sync for FenceInputs {}

struct FenceRequest {
    inputs: FenceInputs,
    done: Slot<Status>,
}

unsafe extern "C" fn fence_done(status: Status, cbdata: *mut c_void) {
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
struct GetInputs {
    proc: sys::Proc,
    key: CString,
    info: [sys::Info; 1],
}

// SAFETY: plain data (the info value is an int; no pointer member is set)
// plus an owned CString, never written after construction.
unsafe impl Send for GetInputs {}
// SAFETY: as for Send: immutable after construction.
unsafe impl Sync for GetInputs {}

struct GetRequest {
    inputs: GetInputs,
    api: &'static Api,
    max_len: usize,
    done: Slot<Fetched>,
}

enum Fetched {
    /// PMIx answered with an error status.
    Failed(Status),
    /// PMIx answered with a value, copied out.
    Value(Owned),
}

/// A PMIx value copied into Rust memory.
#[derive(Debug, PartialEq)]
enum Owned {
    Bytes(Vec<u8>),
    /// Without its NUL.
    String(Vec<u8>),
    Unsigned(u64),
    Signed(i64),
    /// Longer than allowed (`len` is unknown for an over-long string).
    TooLong {
        type_: sys::DataType,
        len: Option<usize>,
    },
    /// A type we do not read.
    Other(sys::DataType),
    /// Claims to be of a type but its contents are impossible.
    Malformed(String),
    /// Success without a value.
    Missing,
}

impl Owned {
    fn data_type(&self) -> sys::DataType {
        match self {
            Owned::Bytes(_) => sys::BYTE_OBJECT,
            Owned::String(_) => sys::STRING,
            Owned::Unsigned(_) => sys::UINT64,
            Owned::Signed(_) => sys::INT64,
            Owned::TooLong { type_, .. } | Owned::Other(type_) => *type_,
            Owned::Malformed(_) | Owned::Missing => 0,
        }
    }
}

unsafe extern "C" fn get_done(status: Status, value: *mut sys::Value, cbdata: *mut c_void) {
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

/// Copies what `value` holds, refusing anything longer than `max_len`.
///
/// # Safety
/// `value` is a valid `pmix_value_t` whose pointers, per its type, point
/// at live memory (a byte object's `size` bytes, a NUL-terminated string).
unsafe fn copy_value(value: &sys::Value, max_len: usize) -> Owned {
    let data = &value.data;
    // SAFETY: every union read below is of the member the type tag says PMIx
    // wrote (bool through its byte, so any non-zero value is accepted), and
    // pointers are dereferenced only as the caller's contract allows.
    unsafe {
        match value.type_ {
            sys::BYTE_OBJECT => {
                let bo = data.bo;
                if bo.size > max_len {
                    Owned::TooLong {
                        type_: sys::BYTE_OBJECT,
                        len: Some(bo.size),
                    }
                } else if bo.size == 0 {
                    Owned::Bytes(Vec::new())
                } else if bo.bytes.is_null() {
                    Owned::Malformed(format!("a byte object of {} bytes with no data", bo.size))
                } else {
                    // bo.bytes points at bo.size bytes (caller).
                    Owned::Bytes(std::slice::from_raw_parts(bo.bytes.cast::<u8>(), bo.size).to_vec())
                }
            }
            sys::STRING => match copy_c_string(data.string, max_len) {
                None => Owned::Malformed("a NULL string".to_owned()),
                Some(Err(())) => Owned::TooLong {
                    type_: sys::STRING,
                    len: None,
                },
                Some(Ok(bytes)) => Owned::String(bytes),
            },
            sys::BOOL | sys::BYTE | sys::UINT8 => Owned::Unsigned(u64::from(data.uint8)),
            sys::UINT16 => Owned::Unsigned(u64::from(data.uint16)),
            sys::UINT32 | sys::PROC_RANK => Owned::Unsigned(u64::from(data.uint32)),
            sys::UINT64 => Owned::Unsigned(data.uint64),
            sys::UINT => Owned::Unsigned(u64::from(data.uint)),
            sys::SIZE => Owned::Unsigned(data.size as u64),
            sys::INT8 => Owned::Signed(i64::from(data.int8)),
            sys::INT16 => Owned::Signed(i64::from(data.int16)),
            sys::INT32 => Owned::Signed(i64::from(data.int32)),
            sys::INT64 => Owned::Signed(data.int64),
            sys::INT => Owned::Signed(i64::from(data.integer)),
            other => Owned::Other(other),
        }
    }
}

/// Copies a NUL-terminated string of at most `max_len` bytes: `None` for a
/// NULL pointer, `Err` if no NUL comes within `max_len` bytes.
///
/// # Safety
/// `ptr` is NULL or points at a NUL-terminated string, or at least at
/// `max_len + 1` readable bytes.
unsafe fn copy_c_string(ptr: *const c_char, max_len: usize) -> Option<Result<Vec<u8>, ()>> {
    if ptr.is_null() {
        return None;
    }
    // SAFETY: strnlen reads at most max_len + 1 bytes and stops at the NUL
    // (caller's contract).
    let len = unsafe { libc::strnlen(ptr, max_len.saturating_add(1)) };
    if len > max_len {
        return Some(Err(()));
    }
    // SAFETY: the len bytes before the NUL are readable (strnlen found them).
    Some(Ok(
        unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) }.to_vec()
    ))
}

// ---------------------------------------------------------------------------
// Checks on what goes in and comes out
// ---------------------------------------------------------------------------

/// A user key as PMIx takes it: not empty, no NUL, at most 511 bytes.
fn checked_key(call: &'static str, key: &str) -> Result<CString, PmixError> {
    let problem = if key.is_empty() {
        "the key is empty".to_owned()
    } else if key.len() > sys::MAX_KEYLEN {
        format!(
            "the key is {} bytes long, PMIx keys hold at most {}",
            key.len(),
            sys::MAX_KEYLEN
        )
    } else {
        match CString::new(key) {
            Ok(ckey) => return Ok(ckey),
            Err(_) => format!("the key {key:?} contains a NUL byte"),
        }
    };
    Err(PmixError::InvalidArgument { call, problem })
}

/// The namespace `PMIx_Init` filled in: NUL-terminated within the field,
/// not empty, UTF-8.
fn checked_namespace(nspace: &[c_char; sys::MAX_NSLEN + 1]) -> Result<String, String> {
    let bytes: Vec<u8> = nspace.iter().map(|&c| c as u8).collect();
    let end = bytes
        .iter()
        .position(|&b| b == 0)
        .ok_or("the namespace is not NUL-terminated")?;
    if end == 0 {
        return Err("the namespace is empty".to_owned());
    }
    String::from_utf8(bytes[..end].to_vec()).map_err(|_| "the namespace is not UTF-8".to_owned())
}

/// The deadline for `timeout` from now (`None`: too far to represent);
/// a zero timeout is refused.
fn deadline(call: &'static str, timeout: Duration) -> Result<Option<Instant>, PmixError> {
    if timeout.is_zero() {
        return Err(PmixError::InvalidArgument {
            call,
            problem: "the timeout is zero".to_owned(),
        });
    }
    Ok(Instant::now().checked_add(timeout))
}

/// `timeout` for `PMIX_TIMEOUT`: whole seconds, rounded up, at least 1
/// (0 would mean "wait forever").
fn server_timeout(timeout: Duration) -> c_int {
    let secs = timeout
        .as_secs()
        .saturating_add(u64::from(timeout.subsec_nanos() > 0));
    c_int::try_from(secs.max(1)).unwrap_or(c_int::MAX)
}

fn rank_name(rank: u32) -> String {
    match rank {
        sys::RANK_WILDCARD => "the job".to_owned(),
        rank => format!("rank {rank}"),
    }
}

fn type_name(t: sys::DataType) -> String {
    let name = match t {
        sys::BOOL => "PMIX_BOOL",
        sys::BYTE => "PMIX_BYTE",
        sys::STRING => "PMIX_STRING",
        sys::SIZE => "PMIX_SIZE",
        sys::INT => "PMIX_INT",
        sys::INT8 | sys::INT16 | sys::INT32 | sys::INT64 => "a signed integer",
        sys::UINT | sys::UINT8 | sys::UINT16 | sys::UINT32 | sys::UINT64 => "an unsigned integer",
        sys::BYTE_OBJECT => "PMIX_BYTE_OBJECT",
        sys::PROC_RANK => "PMIX_PROC_RANK",
        _ => "",
    };
    if name.is_empty() {
        format!("number {t}")
    } else {
        format!("{name} ({t})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::mem::{align_of, offset_of, size_of};
    use std::process::{Command, Output};

    // -----------------------------------------------------------------------
    // The hand-written ABI against the real pmix.h
    // -----------------------------------------------------------------------

    /// (C expression, what the Rust side says it is).
    fn numeric_checks() -> Vec<(&'static str, i128)> {
        fn n(v: usize) -> i128 {
            v as i128
        }
        vec![
            ("sizeof(pmix_proc_t)", n(size_of::<sys::Proc>())),
            ("_Alignof(pmix_proc_t)", n(align_of::<sys::Proc>())),
            ("offsetof(pmix_proc_t, nspace)", n(offset_of!(sys::Proc, nspace))),
            (
                "sizeof(((pmix_proc_t*)0)->nspace)",
                n(size_of::<[c_char; sys::MAX_NSLEN + 1]>()),
            ),
            ("offsetof(pmix_proc_t, rank)", n(offset_of!(sys::Proc, rank))),
            ("sizeof(pmix_rank_t)", n(size_of::<sys::Rank>())),
            ("(pmix_rank_t)-1 > 0", 1),
            ("sizeof(pmix_status_t)", n(size_of::<Status>())),
            ("(pmix_status_t)-1 < 0", 1),
            ("sizeof(pmix_data_type_t)", n(size_of::<sys::DataType>())),
            ("(pmix_data_type_t)-1 > 0", 1),
            ("sizeof(pmix_scope_t)", n(size_of::<sys::Scope>())),
            ("(pmix_scope_t)-1 > 0", 1),
            ("sizeof(pmix_info_directives_t)", n(size_of::<u32>())),
            ("sizeof(pmix_byte_object_t)", n(size_of::<sys::ByteObject>())),
            ("_Alignof(pmix_byte_object_t)", n(align_of::<sys::ByteObject>())),
            (
                "offsetof(pmix_byte_object_t, bytes)",
                n(offset_of!(sys::ByteObject, bytes)),
            ),
            (
                "offsetof(pmix_byte_object_t, size)",
                n(offset_of!(sys::ByteObject, size)),
            ),
            ("sizeof(pmix_envar_t)", n(size_of::<sys::Envar>())),
            ("_Alignof(pmix_envar_t)", n(align_of::<sys::Envar>())),
            ("sizeof(pmix_value_t)", n(size_of::<sys::Value>())),
            ("_Alignof(pmix_value_t)", n(align_of::<sys::Value>())),
            ("offsetof(pmix_value_t, type)", n(offset_of!(sys::Value, type_))),
            ("offsetof(pmix_value_t, data)", n(offset_of!(sys::Value, data))),
            ("sizeof(((pmix_value_t*)0)->data)", n(size_of::<sys::ValueData>())),
            (
                "__alignof__(((pmix_value_t*)0)->data)",
                n(align_of::<sys::ValueData>()),
            ),
            ("sizeof(((pmix_value_t*)0)->data.flag)", n(size_of::<bool>())),
            ("sizeof(((pmix_value_t*)0)->data.byte)", n(size_of::<u8>())),
            (
                "sizeof(((pmix_value_t*)0)->data.string)",
                n(size_of::<*mut c_char>()),
            ),
            ("sizeof(((pmix_value_t*)0)->data.size)", n(size_of::<usize>())),
            ("sizeof(((pmix_value_t*)0)->data.integer)", n(size_of::<c_int>())),
            ("sizeof(((pmix_value_t*)0)->data.int8)", n(size_of::<i8>())),
            ("sizeof(((pmix_value_t*)0)->data.int16)", n(size_of::<i16>())),
            ("sizeof(((pmix_value_t*)0)->data.int32)", n(size_of::<i32>())),
            ("sizeof(((pmix_value_t*)0)->data.int64)", n(size_of::<i64>())),
            (
                "sizeof(((pmix_value_t*)0)->data.uint)",
                n(size_of::<std::ffi::c_uint>()),
            ),
            ("sizeof(((pmix_value_t*)0)->data.uint8)", n(size_of::<u8>())),
            ("sizeof(((pmix_value_t*)0)->data.uint16)", n(size_of::<u16>())),
            ("sizeof(((pmix_value_t*)0)->data.uint32)", n(size_of::<u32>())),
            ("sizeof(((pmix_value_t*)0)->data.uint64)", n(size_of::<u64>())),
            ("sizeof(((pmix_value_t*)0)->data.rank)", n(size_of::<sys::Rank>())),
            (
                "sizeof(((pmix_value_t*)0)->data.bo)",
                n(size_of::<sys::ByteObject>()),
            ),
            (
                "sizeof(((pmix_value_t*)0)->data.tv)",
                n(size_of::<libc::timeval>()),
            ),
            (
                "sizeof(((pmix_value_t*)0)->data.envar)",
                n(size_of::<sys::Envar>()),
            ),
            (
                "sizeof(((pmix_value_t*)0)->data.ptr)",
                n(size_of::<*mut c_void>()),
            ),
            ("sizeof(pmix_info_t)", n(size_of::<sys::Info>())),
            ("_Alignof(pmix_info_t)", n(align_of::<sys::Info>())),
            ("offsetof(pmix_info_t, key)", n(offset_of!(sys::Info, key))),
            (
                "sizeof(((pmix_info_t*)0)->key)",
                n(size_of::<[c_char; sys::MAX_KEYLEN + 1]>()),
            ),
            ("offsetof(pmix_info_t, flags)", n(offset_of!(sys::Info, flags))),
            ("offsetof(pmix_info_t, value)", n(offset_of!(sys::Info, value))),
            ("PMIX_MAX_NSLEN", n(sys::MAX_NSLEN)),
            ("PMIX_MAX_KEYLEN", n(sys::MAX_KEYLEN)),
            ("PMIX_SUCCESS", sys::SUCCESS.into()),
            ("PMIX_ERR_TIMEOUT", sys::ERR_TIMEOUT.into()),
            ("PMIX_ERR_UNREACH", sys::ERR_UNREACH.into()),
            ("PMIX_ERR_BAD_PARAM", sys::ERR_BAD_PARAM.into()),
            ("PMIX_ERR_INIT", sys::ERR_INIT.into()),
            ("PMIX_ERR_NOT_FOUND", sys::ERR_NOT_FOUND.into()),
            ("PMIX_ERR_COMM_FAILURE", sys::ERR_COMM_FAILURE.into()),
            ("PMIX_ERR_PARTIAL_SUCCESS", sys::ERR_PARTIAL_SUCCESS.into()),
            ("PMIX_ERR_LOST_CONNECTION", sys::ERR_LOST_CONNECTION.into()),
            ("PMIX_ERR_PROC_ABORTED", sys::ERR_PROC_ABORTED.into()),
            ("PMIX_PROC_TERMINATED", sys::PROC_TERMINATED.into()),
            ("PMIX_OPERATION_SUCCEEDED", sys::OPERATION_SUCCEEDED.into()),
            ("PMIX_RANK_UNDEF", sys::RANK_UNDEF.into()),
            ("PMIX_RANK_WILDCARD", sys::RANK_WILDCARD.into()),
            ("PMIX_RANK_VALID", sys::RANK_VALID.into()),
            ("PMIX_BOOL", sys::BOOL.into()),
            ("PMIX_BYTE", sys::BYTE.into()),
            ("PMIX_STRING", sys::STRING.into()),
            ("PMIX_SIZE", sys::SIZE.into()),
            ("PMIX_INT", sys::INT.into()),
            ("PMIX_INT8", sys::INT8.into()),
            ("PMIX_INT16", sys::INT16.into()),
            ("PMIX_INT32", sys::INT32.into()),
            ("PMIX_INT64", sys::INT64.into()),
            ("PMIX_UINT", sys::UINT.into()),
            ("PMIX_UINT8", sys::UINT8.into()),
            ("PMIX_UINT16", sys::UINT16.into()),
            ("PMIX_UINT32", sys::UINT32.into()),
            ("PMIX_UINT64", sys::UINT64.into()),
            ("PMIX_BYTE_OBJECT", sys::BYTE_OBJECT.into()),
            ("PMIX_PROC_RANK", sys::PROC_RANK.into()),
            ("PMIX_GLOBAL", sys::GLOBAL.into()),
            // The functions' C types are the ones the `Api` fields spell out.
            (
                "__builtin_types_compatible_p(__typeof__(PMIx_Init), \
                 pmix_status_t (pmix_proc_t *, pmix_info_t *, size_t))",
                1,
            ),
            (
                "__builtin_types_compatible_p(__typeof__(PMIx_Finalize), \
                 pmix_status_t (const pmix_info_t *, size_t))",
                1,
            ),
            (
                "__builtin_types_compatible_p(__typeof__(PMIx_Abort), \
                 pmix_status_t (int, const char *, pmix_proc_t *, size_t))",
                1,
            ),
            (
                "__builtin_types_compatible_p(__typeof__(PMIx_Put), \
                 pmix_status_t (pmix_scope_t, const char *, pmix_value_t *))",
                1,
            ),
            (
                "__builtin_types_compatible_p(__typeof__(PMIx_Commit), pmix_status_t (void))",
                1,
            ),
            (
                "__builtin_types_compatible_p(__typeof__(PMIx_Fence_nb), \
                 pmix_status_t (const pmix_proc_t *, size_t, const pmix_info_t *, size_t, \
                 void (*)(pmix_status_t, void *), void *))",
                1,
            ),
            (
                "__builtin_types_compatible_p(__typeof__(PMIx_Get_nb), \
                 pmix_status_t (const pmix_proc_t *, const char *, const pmix_info_t *, size_t, \
                 void (*)(pmix_status_t, pmix_value_t *, void *), void *))",
                1,
            ),
            (
                "__builtin_types_compatible_p(__typeof__(PMIx_Error_string), \
                 const char *(pmix_status_t))",
                1,
            ),
            (
                "__builtin_types_compatible_p(__typeof__(PMIx_Value_destruct), void (pmix_value_t *))",
                1,
            ),
            (
                "__builtin_types_compatible_p(__typeof__(PMIx_Get_version), const char *(void))",
                1,
            ),
        ]
    }

    fn string_checks() -> Vec<(&'static str, &'static CStr)> {
        vec![
            ("PMIX_JOB_SIZE", sys::JOB_SIZE),
            ("PMIX_LOCAL_RANK", sys::LOCAL_RANK),
            ("PMIX_LOCAL_PEERS", sys::LOCAL_PEERS),
            ("PMIX_HOSTNAME", sys::HOSTNAME),
            ("PMIX_TIMEOUT", sys::TIMEOUT),
            ("PMIX_COLLECT_DATA", sys::COLLECT_DATA),
        ]
    }

    /// `pkg-config --cflags pmix`, or a failure that says what to install.
    fn pmix_cflags() -> Vec<String> {
        let out = Command::new("pkg-config").args(["--cflags", "pmix"]).output().unwrap_or_else(|e| {
            panic!("cannot run pkg-config ({e}): install pkg-config and libpmix-dev; this test checks the hand-written PMIx ABI against pmix.h")
        });
        assert!(
            out.status.success(),
            "pkg-config finds no pmix: {}install libpmix-dev (Debian/Ubuntu) or pmix-devel (RHEL/Fedora), \
             or point PKG_CONFIG_PATH at pmix.pc; this test checks the hand-written PMIx ABI against pmix.h",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn layout_matches_pmix_h() {
        let numbers = numeric_checks();
        let strings = string_checks();
        let mut c =
            String::from("#include <stddef.h>\n#include <stdio.h>\n#include <pmix.h>\nint main(void) {\n");
        for (expr, _) in &numbers {
            c += &format!("    printf(\"%s\\t%lld\\n\", \"{expr}\", (long long)({expr}));\n");
        }
        for (name, _) in &strings {
            c += &format!("    printf(\"%s\\t%s\\n\", \"{name}\", {name});\n");
        }
        c += "    return 0;\n}\n";

        /// Removed however the test ends.
        struct TempDir(std::path::PathBuf);
        impl Drop for TempDir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let dir =
            TempDir(std::env::temp_dir().join(format!("fabric-msg-pmix-layout-{}", std::process::id())));
        std::fs::create_dir_all(&dir.0).expect("create a temporary directory");
        let source = dir.0.join("layout.c");
        let program = dir.0.join("layout");
        std::fs::write(&source, &c).expect("write the C program");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
        let out = Command::new(&cc)
            .arg("-std=gnu11")
            .args(pmix_cflags())
            .arg("-o")
            .arg(&program)
            .arg(&source)
            .output()
            .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}` ({e}): install gcc or set CC"));
        assert!(
            out.status.success(),
            "compiling against pmix.h failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = Command::new(&program).output().expect("run the layout program");
        assert!(out.status.success());

        let stdout = String::from_utf8(out.stdout).expect("the layout program prints text");
        let printed: HashMap<&str, &str> = stdout.lines().filter_map(|line| line.split_once('\t')).collect();
        let mut wrong = Vec::new();
        for (expr, rust) in &numbers {
            match printed.get(expr).map(|v| v.parse::<i128>()) {
                Some(Ok(c)) if c == *rust => {}
                other => wrong.push(format!("{expr}: C says {other:?}, Rust says {rust}")),
            }
        }
        for (name, rust) in &strings {
            let rust = rust.to_str().unwrap();
            if printed.get(name) != Some(&rust) {
                wrong.push(format!(
                    "{name}: C says {:?}, Rust says {rust:?}",
                    printed.get(name)
                ));
            }
        }
        assert!(
            wrong.is_empty(),
            "the Rust mirror of pmix.h is wrong:\n{}",
            wrong.join("\n")
        );
        assert_eq!(printed.len(), numbers.len() + strings.len(), "{stdout}");
    }

    // -----------------------------------------------------------------------
    // Pure logic
    // -----------------------------------------------------------------------

    fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let vars: HashMap<String, OsString> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |name| vars.get(name).cloned()
    }

    #[test]
    fn detect_reads_the_launchers_variables() {
        assert_eq!(detect(env_of(&[])), Launch::Standalone);
        // Variables PMIx users set themselves do not count as a launch.
        assert_eq!(
            detect(env_of(&[("PMIX_MCA_ptl", "tcp"), ("OMPI_MCA_x", "1")])),
            Launch::Standalone
        );
        // What Open MPI 4.1.4's mpirun sets.
        let mpirun = [
            ("PMIX_NAMESPACE", "1972502529"),
            ("PMIX_RANK", "0"),
            ("PMIX_SERVER_URI2", "1972502528.0;tcp4://127.0.0.1:35277"),
            ("PMIX_SERVER_URI21", "1972502528.0;tcp4://127.0.0.1:35277"),
            ("PMIX_SERVER_URI3", "1972502528.0;tcp4://127.0.0.1:35277"),
            ("PMIX_SERVER_URI4", "1972502528.0;tcp4://127.0.0.1:35277"),
            ("PMIX_SERVER_URI41", "1972502528.0;tcp4://127.0.0.1:35277"),
        ];
        assert_eq!(
            detect(env_of(&mpirun)),
            Launch::Pmix {
                namespace: "1972502529".into(),
                server_uri_var: "PMIX_SERVER_URI41"
            }
        );
        // An older server that only publishes v2 addresses.
        assert_eq!(
            detect(env_of(&[
                ("PMIX_NAMESPACE", "ns"),
                ("PMIX_RANK", "3"),
                ("PMIX_SERVER_URI2", "x")
            ])),
            Launch::Pmix {
                namespace: "ns".into(),
                server_uri_var: "PMIX_SERVER_URI2"
            }
        );
        match detect(env_of(&[("PMIX_NAMESPACE", "ns")])) {
            Launch::Incomplete { present, missing } => {
                assert_eq!(present, ["PMIX_NAMESPACE"]);
                assert_eq!(missing.len(), 2, "{missing:?}");
            }
            other => panic!("{other:?}"),
        }
        match detect(env_of(&[("PMIX_RANK", "1"), ("PMIX_SERVER_URI4", "x")])) {
            Launch::Incomplete { missing, .. } => assert_eq!(missing, ["PMIX_NAMESPACE"]),
            other => panic!("{other:?}"),
        }
        let err = PmixError::IncompleteEnvironment {
            present: vec!["PMIX_RANK"],
            missing: vec!["PMIX_NAMESPACE"],
        };
        let text = err.to_string();
        assert!(
            text.contains("PMIX_RANK") && text.contains("PMIX_NAMESPACE") && text.contains("unset"),
            "{text}"
        );
    }

    #[test]
    fn peers_are_parsed_and_checked() {
        assert_eq!(parse_peers(b"0,1,2", 3, 1), Ok(vec![0, 1, 2]));
        assert_eq!(parse_peers(b"4, 6", 8, 6), Ok(vec![4, 6]));
        assert_eq!(parse_peers(b"5", 8, 5), Ok(vec![5]));
        for (text, size, me) in [
            (&b""[..], 3, 0),
            (b"0,,1", 3, 0),
            (b"0,1,", 3, 0),
            (b"0,x", 3, 0),
            (b"-1,0", 3, 0),
            (b"0,3", 3, 0),
            (b"0,0", 3, 0),
            (b"0,1", 3, 2),
            (b"4294967296", 3, 0),
            (b"0,\xff", 3, 0),
        ] {
            assert!(
                parse_peers(text, size, me).is_err(),
                "{:?} accepted",
                String::from_utf8_lossy(text)
            );
        }
    }

    #[test]
    fn keys_are_checked_before_pmix_sees_them() {
        assert!(checked_key("PMIx_Put", "fabric-msg.addr").is_ok());
        assert!(checked_key("PMIx_Put", &"k".repeat(sys::MAX_KEYLEN)).is_ok());
        for bad in ["", "a\0b", &"k".repeat(sys::MAX_KEYLEN + 1)] {
            let err = checked_key("PMIx_Put", bad).unwrap_err();
            assert!(
                matches!(err, PmixError::InvalidArgument { call: "PMIx_Put", .. }),
                "{err:?}"
            );
            assert!(err.to_string().starts_with("PMIx_Put not called: "), "{err}");
        }
    }

    #[test]
    fn namespace_is_checked() {
        let mut ns = [0 as c_char; sys::MAX_NSLEN + 1];
        assert!(checked_namespace(&ns).is_err(), "empty");
        for (dst, &src) in ns.iter_mut().zip(b"1972502529") {
            *dst = src as c_char;
        }
        assert_eq!(checked_namespace(&ns).as_deref(), Ok("1972502529"));
        let full = [b'x' as c_char; sys::MAX_NSLEN + 1];
        assert!(checked_namespace(&full).is_err(), "no NUL");
        ns[0] = 0xff_u8 as c_char;
        assert!(checked_namespace(&ns).is_err(), "not UTF-8");
    }

    #[test]
    fn a_missing_library_is_reported_with_what_to_do() {
        let problem = load(&[c"libpmix-fabric-msg-test-absent.so.9"])
            .err()
            .expect("no such library");
        assert!(
            problem.contains("libpmix-fabric-msg-test-absent.so.9"),
            "{problem}"
        );
        let err = PmixError::Library {
            namespace: "1234".into(),
            problem,
        };
        let text = err.to_string();
        for part in [
            "PMIX_NAMESPACE=1234",
            "libpmix-fabric-msg-test-absent.so.9",
            "apt-get install libpmix2",
        ] {
            assert!(text.contains(part), "{part:?} missing from: {text}");
        }
        // libc has no PMIx_Init: the symbol check names what is missing.
        let problem = load(&[c"libc.so.6"]).err().expect("libc is no PMIx");
        assert!(problem.contains("no symbol PMIx_Init"), "{problem}");
    }

    #[test]
    fn server_timeouts_round_up_and_never_mean_forever() {
        assert_eq!(server_timeout(Duration::from_millis(1)), 1);
        assert_eq!(server_timeout(Duration::from_secs(2)), 2);
        assert_eq!(server_timeout(Duration::from_millis(2500)), 3);
        assert_eq!(server_timeout(Duration::MAX), c_int::MAX);
        assert!(deadline("PMIx_Fence", Duration::ZERO).is_err());
        assert_eq!(deadline("PMIx_Fence", Duration::MAX).unwrap(), None);
    }

    #[test]
    fn values_are_copied_with_bounds() {
        let bytes = *b"hello";
        let value = sys::Value::byte_object(&bytes);
        // SAFETY: value points at `bytes`.
        unsafe {
            assert_eq!(copy_value(&value, 5), Owned::Bytes(b"hello".to_vec()));
            assert_eq!(
                copy_value(&value, 4),
                Owned::TooLong {
                    type_: sys::BYTE_OBJECT,
                    len: Some(5)
                }
            );
        }
        let empty = sys::Value::byte_object(&[]);
        // SAFETY: an empty byte object has no pointer to follow.
        assert_eq!(unsafe { copy_value(&empty, 0) }, Owned::Bytes(Vec::new()));
        let broken = sys::Value {
            type_: sys::BYTE_OBJECT,
            data: sys::ValueData {
                bo: sys::ByteObject {
                    bytes: ptr::null_mut(),
                    size: 3,
                },
            },
        };
        // SAFETY: the null pointer is checked before any read.
        assert!(matches!(unsafe { copy_value(&broken, 10) }, Owned::Malformed(_)));

        let text = c"0,1,2";
        let string = sys::Value {
            type_: sys::STRING,
            data: sys::ValueData {
                string: text.as_ptr().cast_mut(),
            },
        };
        // SAFETY: string points at a NUL-terminated string.
        unsafe {
            assert_eq!(copy_value(&string, 5), Owned::String(b"0,1,2".to_vec()));
            assert_eq!(
                copy_value(&string, 4),
                Owned::TooLong {
                    type_: sys::STRING,
                    len: None
                }
            );
        }
        let null = sys::Value {
            type_: sys::STRING,
            data: sys::ValueData {
                string: ptr::null_mut(),
            },
        };
        // SAFETY: the null pointer is checked before any read.
        assert!(matches!(unsafe { copy_value(&null, 5) }, Owned::Malformed(_)));

        let cases = [
            (
                sys::Value {
                    type_: sys::UINT32,
                    data: sys::ValueData { uint32: 3 },
                },
                Owned::Unsigned(3),
            ),
            (
                sys::Value {
                    type_: sys::UINT16,
                    data: sys::ValueData { uint16: 65535 },
                },
                Owned::Unsigned(65535),
            ),
            (
                sys::Value {
                    type_: sys::INT,
                    data: sys::ValueData { integer: -4 },
                },
                Owned::Signed(-4),
            ),
            (
                sys::Value {
                    type_: sys::PROC_RANK,
                    data: sys::ValueData { rank: 9 },
                },
                Owned::Unsigned(9),
            ),
            (
                sys::Value {
                    type_: 39,
                    data: sys::ValueData { ptr: ptr::null_mut() },
                },
                Owned::Other(39),
            ),
        ];
        for (value, expected) in cases {
            // SAFETY: plain numbers, or a type that is not read.
            assert_eq!(unsafe { copy_value(&value, 0) }, expected);
        }
    }

    #[test]
    fn errors_say_which_call_what_status_and_what_to_do() {
        let err = PmixError::Call {
            call: "PMIx_Fence",
            status: sys::ERR_PARTIAL_SUCCESS,
            text: "PARTIAL SUCCESS".into(),
            context: "all ranks of 123".into(),
        };
        let text = err.to_string();
        for part in ["PMIx_Fence", "-52", "PARTIAL SUCCESS", "terminated", "abort"] {
            assert!(text.contains(part), "{part:?} missing from: {text}");
        }
        assert!(!err.is_timeout());
        let server = PmixError::Call {
            call: "PMIx_Get",
            status: sys::ERR_TIMEOUT,
            text: "TIMEOUT".into(),
            context: "k".into(),
        };
        let ours = PmixError::Timeout {
            call: "PMIx_Get",
            after: Duration::from_secs(2),
            context: "k".into(),
        };
        assert!(server.is_timeout() && ours.is_timeout());
        assert!(
            ours.to_string().contains("PMIx_Get timed out") && ours.to_string().contains("2s"),
            "{ours}"
        );
    }

    #[test]
    fn slot_waits_until_its_deadline_or_its_value() {
        let slot = Arc::new(Slot::<u32>::new());
        let start = Instant::now();
        assert_eq!(slot.wait(Some(start + Duration::from_millis(50))), None);
        assert!(start.elapsed() >= Duration::from_millis(50));
        let writer = Arc::clone(&slot);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            writer.complete(7);
        });
        assert_eq!(slot.wait(Some(Instant::now() + Duration::from_secs(10))), Some(7));
        t.join().unwrap();
    }

    #[test]
    fn a_callback_after_the_caller_gave_up_is_harmless() {
        let request = Arc::new(FenceRequest {
            inputs: FenceInputs {
                procs: [sys::Proc::undefined()],
                info: [
                    sys::Info::int(sys::TIMEOUT, 1),
                    sys::Info::flag(sys::COLLECT_DATA, false),
                ],
            },
            done: Slot::new(),
        });
        let cbdata = Arc::into_raw(Arc::clone(&request)).cast_mut().cast::<c_void>();
        assert_eq!(
            request.done.wait(Some(Instant::now() + Duration::from_millis(1))),
            None
        );
        let before = ABANDONED_COMPLETIONS.load(Ordering::Relaxed);
        drop(request);
        // SAFETY: cbdata is the one reference handed out above, as PMIx would
        // hold it; fence_done takes it back.
        unsafe { fence_done(sys::ERR_TIMEOUT, cbdata) };
        assert!(ABANDONED_COMPLETIONS.load(Ordering::Relaxed) > before);
    }

    /// The get callback copies the value and frees it the way PMIx wants;
    /// this needs libpmix, but not a server.
    #[test]
    fn get_callback_copies_then_releases_the_value() {
        let api = api().unwrap_or_else(|e| panic!("libpmix is needed for this test (install libpmix2): {e}"));
        let request = Arc::new(GetRequest {
            inputs: GetInputs {
                proc: sys::Proc::undefined(),
                key: c"k".to_owned(),
                info: [sys::Info::int(sys::TIMEOUT, 1)],
            },
            api,
            max_len: 16,
            done: Slot::new(),
        });
        // SAFETY: a value allocated with malloc as PMIx does, filled with a
        // malloc'd byte object; get_done takes both over.
        let value = unsafe {
            let bytes = libc::malloc(3).cast::<u8>();
            assert!(!bytes.is_null());
            bytes.copy_from_nonoverlapping(b"abc".as_ptr(), 3);
            let value = libc::malloc(size_of::<sys::Value>()).cast::<sys::Value>();
            assert!(!value.is_null());
            value.write(sys::Value {
                type_: sys::BYTE_OBJECT,
                data: sys::ValueData {
                    bo: sys::ByteObject {
                        bytes: bytes.cast(),
                        size: 3,
                    },
                },
            });
            value
        };
        let cbdata = Arc::into_raw(Arc::clone(&request)).cast_mut().cast::<c_void>();
        // SAFETY: cbdata is a reference handed over as to PMIx_Get_nb, and
        // value is ours to give away.
        unsafe { get_done(sys::SUCCESS, value, cbdata) };
        match request.done.wait(None) {
            Some(Fetched::Value(Owned::Bytes(b))) => assert_eq!(b, b"abc"),
            _ => panic!("the callback did not deliver the bytes"),
        }
    }

    // -----------------------------------------------------------------------
    // Under a real launcher
    // -----------------------------------------------------------------------

    /// Set (to the child test's name) in processes the tests below start.
    const CHILD_ENV: &str = "FABRIC_MSG_PMIX_TEST_CHILD";
    const CHILD_OK: &str = "PMIX-CHILD-OK";

    /// Is this process the `name` child of one of the tests below?
    fn child_mode(name: &str) -> bool {
        std::env::var(CHILD_ENV).as_deref() == Ok(name)
    }

    /// `name`'s path as the test harness knows it.
    fn test_path(name: &str) -> String {
        let module = module_path!();
        let module = module.split_once("::").map_or(module, |(_, rest)| rest);
        format!("{module}::{name}")
    }

    fn describe(out: &Output) -> String {
        format!(
            "status {}\n--- stdout\n{}--- stderr\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// Runs the child test `child` as `np` ranks under mpirun, all of it
    /// bounded by `limit`. As root mpirun needs `--allow-run-as-root`; with
    /// more ranks than cores, `--oversubscribe`.
    fn mpirun(np: u32, child: &str, limit: Duration) -> Output {
        let exe = std::env::current_exe().expect("the test binary's path");
        let out = Command::new("timeout")
            .args(["--kill-after=10", &limit.as_secs().to_string()])
            .args([
                "mpirun",
                "--allow-run-as-root",
                "--oversubscribe",
                "-np",
                &np.to_string(),
                "-x",
                CHILD_ENV,
            ])
            .arg(&exe)
            .args([&test_path(child), "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, child)
            .output()
            .unwrap_or_else(|e| panic!("cannot run `timeout` (coreutils): {e}"));
        match out.status.code() {
            Some(127) => panic!(
                "mpirun not found: install openmpi-bin (Debian/Ubuntu)\n{}",
                describe(&out)
            ),
            Some(124) => panic!("mpirun ran past {limit:?} and was stopped\n{}", describe(&out)),
            _ => out,
        }
    }

    /// The connection of a child that mpirun started.
    fn connect_child() -> Pmix {
        match Pmix::connect() {
            Ok(Some(pmix)) => pmix,
            Ok(None) => panic!("mpirun set no PMIx variables"),
            Err(e) => panic!("{e}"),
        }
    }

    /// Asserts mpirun succeeded and every rank printed its OK line once.
    fn assert_ranks_ok(out: &Output, child: &str, np: u32) {
        assert!(out.status.success(), "mpirun failed\n{}", describe(out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        for rank in 0..np {
            let line = format!("{CHILD_OK} {child} rank={rank} ");
            // libtest's "test ... " may precede it on the same line.
            let count = stdout.lines().filter(|l| l.contains(&line)).count();
            assert_eq!(
                count,
                1,
                "rank {rank} printed {count} OK lines\n{}",
                describe(out)
            );
        }
    }

    const EXCHANGE_KEY: &str = "fabric-msg.test.blob";

    /// The blob rank `rank` publishes: its length and every byte depend on
    /// the rank.
    fn blob(rank: u32) -> Vec<u8> {
        (0..300 + 97 * rank as usize)
            .map(|i| (i as u32 * 31 + rank * 17 + (i as u32 >> 8)) as u8)
            .collect()
    }

    #[test]
    fn mpirun_three_ranks_exchange() {
        let out = mpirun(3, "child_exchange", Duration::from_secs(90));
        assert_ranks_ok(&out, "child_exchange", 3);
    }

    #[test]
    fn child_exchange() {
        if !child_mode("child_exchange") {
            return; // a no-op unless mpirun_three_ranks_exchange started us
        }
        let pmix = connect_child();
        let rank = pmix.rank();
        let size = pmix.job_size().expect("job size");
        assert_eq!(size, 3);
        assert!(rank < size);
        assert!(!pmix.namespace().is_empty());
        let peers = pmix.local_peers().expect("local peers");
        assert!(peers.contains(&rank), "{peers:?}");
        assert_eq!(peers.len(), 3, "one node runs every rank: {peers:?}");
        let local_rank = pmix.local_rank().expect("local rank");
        assert!(
            usize::from(local_rank) < peers.len(),
            "local rank {local_rank}, peers {peers:?}"
        );
        let host = pmix.hostname().expect("host name");
        assert!(!host.is_empty());

        let second = Pmix::connect().expect_err("a second connect must be refused");
        assert!(
            matches!(second, PmixError::AlreadyUsed { finalized: false }),
            "{second}"
        );
        assert!(matches!(
            pmix.put("pmix.mine", b"x"),
            Err(PmixError::InvalidArgument { .. })
        ));
        assert!(matches!(
            pmix.put("nul\0key", b"x"),
            Err(PmixError::InvalidArgument { .. })
        ));
        assert!(matches!(
            pmix.get(size, EXCHANGE_KEY, 10, Duration::from_secs(1)),
            Err(PmixError::InvalidArgument { .. })
        ));

        pmix.put(EXCHANGE_KEY, &blob(rank)).expect("put");
        pmix.commit().expect("commit");
        pmix.fence(true, Duration::from_secs(30)).expect("fence");
        for peer in (0..size).filter(|&r| r != rank) {
            let expected = blob(peer);
            let got = pmix
                .get(peer, EXCHANGE_KEY, 4096, Duration::from_secs(10))
                .expect("get");
            assert_eq!(got.len(), expected.len(), "length of rank {peer}'s blob");
            for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
                assert_eq!(g, e, "byte {i} of rank {peer}'s blob");
            }
            let err = pmix
                .get(peer, EXCHANGE_KEY, 10, Duration::from_secs(10))
                .expect_err("over-long value");
            assert!(err.to_string().contains("more than the 10 allowed"), "{err}");
            let err = pmix
                .get(peer, "pmix.hname", 4096, Duration::from_secs(10))
                .expect_err("a string");
            assert!(err.to_string().contains("expected a byte object"), "{err}");
        }
        pmix.finalize().expect("finalize");
        let again = Pmix::connect().expect_err("PMIx cannot be initialised twice");
        assert!(
            matches!(again, PmixError::AlreadyUsed { finalized: true }),
            "{again}"
        );
        println!("{CHILD_OK} child_exchange rank={rank} size={size} local_rank={local_rank} peers={peers:?} host={host}");
    }

    /// Our own deadline for the timeout test: not whole seconds, so it
    /// passes before the server's `PMIX_TIMEOUT` (3 s).
    const BOUND: Duration = Duration::from_millis(2500);
    const SLACK: Duration = Duration::from_millis(1500);

    #[test]
    fn mpirun_fence_and_get_time_out() {
        let out = mpirun(3, "child_fence_timeout", Duration::from_secs(90));
        assert_ranks_ok(&out, "child_fence_timeout", 3);
    }

    #[test]
    fn child_fence_timeout() {
        if !child_mode("child_fence_timeout") {
            return; // a no-op unless mpirun_fence_and_get_time_out started us
        }
        let pmix = connect_child();
        let rank = pmix.rank();
        if rank == 2 {
            // Never fences, never puts; outlives what the others do.
            std::thread::sleep(BOUND * 4);
            println!("{CHILD_OK} child_fence_timeout rank={rank} stayed away");
            return;
        }
        let start = Instant::now();
        let err = pmix
            .fence(false, BOUND)
            .expect_err("the fence completed without rank 2");
        let fence_took = start.elapsed();
        assert!(err.is_timeout() && err.call() == Some("PMIx_Fence"), "{err}");
        assert!(err.to_string().contains("PMIx_Fence"), "{err}");
        assert!(
            fence_took >= BOUND && fence_took <= BOUND + SLACK,
            "the fence took {fence_took:?}: {err}"
        );

        // The server gives up at 3 s and calls back into the request we
        // abandoned: that must be harmless.
        let wait = Instant::now();
        while ABANDONED_COMPLETIONS.load(Ordering::Relaxed) == 0 && wait.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let late = ABANDONED_COMPLETIONS.load(Ordering::Relaxed);
        assert!(
            late >= 1,
            "the server never answered the abandoned fence (PMIX_TIMEOUT 3 s)"
        );

        let start = Instant::now();
        let err = pmix
            .get(2, "fabric-msg.test.never-put", 64, BOUND)
            .expect_err("rank 2 never put this");
        let get_took = start.elapsed();
        assert!(err.is_timeout() && err.to_string().contains("PMIx_Get"), "{err}");
        assert!(
            get_took >= BOUND && get_took <= BOUND + SLACK,
            "the get took {get_took:?}: {err}"
        );
        println!("{CHILD_OK} child_fence_timeout rank={rank} fence={fence_took:?} get={get_took:?} late_callbacks={late}");
    }

    #[test]
    fn mpirun_abort_ends_the_job() {
        let start = Instant::now();
        let out = mpirun(3, "child_abort", Duration::from_secs(60));
        let took = start.elapsed();
        assert_eq!(
            out.status.code(),
            Some(7),
            "mpirun should exit with the abort status\n{}",
            describe(&out)
        );
        assert!(
            took < Duration::from_secs(20),
            "the job took {took:?} to end\n{}",
            describe(&out)
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("aborts the job (status 7): fabric-msg test abort"),
            "{}",
            describe(&out)
        );
        assert!(
            !String::from_utf8_lossy(&out.stdout).contains("survived"),
            "{}",
            describe(&out)
        );
    }

    #[test]
    fn child_abort() {
        if !child_mode("child_abort") {
            return; // a no-op unless mpirun_abort_ends_the_job started us
        }
        let pmix = connect_child();
        if pmix.rank() == 1 {
            assert!(matches!(
                pmix.abort(7, "nul\0inside"),
                Err(PmixError::InvalidArgument { .. })
            ));
            pmix.abort(7, "fabric-msg test abort").expect("abort");
        }
        std::thread::sleep(Duration::from_secs(30));
        println!("rank {} survived the abort", pmix.rank());
    }

    #[test]
    fn connect_without_pmix_env_returns_none() {
        // In a child process: removing variables from this one would race
        // with the other tests.
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut cmd = Command::new(exe);
        cmd.args([
            &test_path("child_without_pmix"),
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, "child_without_pmix");
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("PMIX_") {
                cmd.env_remove(name);
            }
        }
        let out = cmd.output().expect("run the test binary");
        assert!(out.status.success(), "{}", describe(&out));
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(&format!("{CHILD_OK} child_without_pmix")),
            "{}",
            describe(&out)
        );
    }

    #[test]
    fn child_without_pmix() {
        if !child_mode("child_without_pmix") {
            return; // a no-op unless connect_without_pmix_env_returns_none started us
        }
        assert!(Pmix::connect().expect("connect without PMIx").is_none());
        assert!(
            API.get().is_none(),
            "libpmix was loaded although no launcher asked for it"
        );
        println!("{CHILD_OK} child_without_pmix");
    }
}
