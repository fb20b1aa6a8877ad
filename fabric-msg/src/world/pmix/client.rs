use std::ffi::{c_void, CStr, CString};
use std::fmt;
use std::ptr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use super::checks::{checked_key, checked_namespace, deadline, rank_name, server_timeout};
use super::error::PmixError;
use super::load::{api, detect, Api, Launch};
use super::nb::{
    fence_done, get_done, lock, FenceInputs, FenceRequest, Fetched, GetInputs, GetRequest, Slot,
};
use super::sys::{self, Status};
use super::value::Owned;

// ---------------------------------------------------------------------------
// The connection
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Debug)]
enum Lifecycle {
    Unused,
    Connected,
    Finalized,
    /// `PMIx_Init` did not return within the start timeout.
    Abandoned,
}

/// PMIx_Init runs at most once per process, guarded by this.
static LIFECYCLE: Mutex<Lifecycle> = Mutex::new(Lifecycle::Unused);

/// This process's connection to its launcher's PMIx server.
pub(crate) struct Pmix {
    pub(super) api: &'static Api,
    pub(super) me: sys::Proc,
    namespace: String,
    pub(super) job_size: OnceLock<u32>,
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
    pub(crate) fn connect(timeout: Duration) -> Result<Option<Pmix>, PmixError> {
        let (namespace_var, server) = match detect(|name| std::env::var_os(name)) {
            Launch::Standalone => return Ok(None),
            Launch::Incomplete { present, missing } => {
                return Err(PmixError::IncompleteEnvironment { present, missing })
            }
            Launch::Pmix {
                namespace,
                server_uri_var,
            } => {
                log::debug!("launched under PMIx: namespace {namespace}, server address in {server_uri_var}");
                let uri = std::env::var_os(server_uri_var).unwrap_or_default();
                let uri: String = uri.to_string_lossy().chars().take(200).collect();
                (namespace, format!("{server_uri_var}={uri}"))
            }
        };
        let mut lifecycle = lock(&LIFECYCLE);
        match *lifecycle {
            Lifecycle::Unused => {}
            Lifecycle::Connected => return Err(PmixError::AlreadyUsed { finalized: false }),
            Lifecycle::Finalized | Lifecycle::Abandoned => {
                return Err(PmixError::AlreadyUsed { finalized: true })
            }
        }
        let api = api().map_err(|problem| PmixError::Library {
            namespace: namespace_var.clone(),
            problem,
        })?;
        let (status, me) = init_within(api, timeout).ok_or_else(|| {
            // The thread stays blocked inside PMIx_Init; this process
            // never uses PMIx again.
            *lifecycle = Lifecycle::Abandoned;
            PmixError::InitTimeout {
                namespace: namespace_var.clone(),
                server,
                after: timeout,
            }
        })?;
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
    // Drop finalizes too; this is for a caller that wants the error (the tests).
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn finalize(mut self) -> Result<(), PmixError> {
        self.finalize_once()
    }

    /// Never call `PMIx_Finalize` for this connection: the job has lost a
    /// rank and its server may take seconds to answer, which a launcher's
    /// kill can cut short. The server sees this process exit instead.
    pub(crate) fn skip_finalize(&mut self) {
        if !self.finalized {
            self.finalized = true;
            *lock(&LIFECYCLE) = Lifecycle::Finalized;
            log::debug!("PMIx_Finalize skipped: the world lost a rank");
        }
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

    pub(super) fn proc(&self, rank: u32) -> sys::Proc {
        sys::Proc::new(&self.me.nspace, rank)
    }
}

/// `PMIx_Init` on a thread of its own, waited for at most `timeout`:
/// libpmix has no non-blocking form of it, and a server that accepts the
/// connection and never answers keeps it waiting for ever. `None` when
/// the time ran out; the thread is then left blocked (one small leak), and
/// should PMIx_Init return later, its connection is never used.
fn init_within(api: &'static Api, timeout: Duration) -> Option<(Status, sys::Proc)> {
    let (tx, rx) = std::sync::mpsc::channel();
    let init = api.init;
    let spawned = std::thread::Builder::new()
        .name("fabric-msg-pmix-init".into())
        .spawn(move || {
            let mut me = sys::Proc::undefined();
            // SAFETY: me is a pmix_proc_t for PMIx to fill in; no info
            // array. PMIx_Init runs once per process (LIFECYCLE, held by
            // the caller until this returns or is abandoned).
            let status = unsafe { init(&mut me, ptr::null_mut(), 0) };
            let _ = tx.send((status, me));
        });
    match spawned {
        Ok(_) => rx.recv_timeout(timeout).ok(),
        Err(e) => {
            log::warn!("PMIx_Init without a deadline (no thread for it: {e})");
            let mut me = sys::Proc::undefined();
            // SAFETY: as above, on this thread.
            let status = unsafe { init(&mut me, ptr::null_mut(), 0) };
            Some((status, me))
        }
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
    pub(super) fn get_value(
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
