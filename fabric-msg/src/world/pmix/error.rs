use std::fmt;
use std::time::Duration;

use super::sys::{self, Status};

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
    /// `PMIx_Init` got no answer from the server the environment names.
    InitTimeout {
        /// `PMIX_NAMESPACE`.
        namespace: String,
        /// The server-address variable and its value (shortened).
        server: String,
        /// The start-up timeout that passed.
        after: Duration,
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
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn is_timeout(&self) -> bool {
        matches!(
            self,
            PmixError::Timeout { .. }
                | PmixError::InitTimeout { .. }
                | PmixError::Call {
                    status: sys::ERR_TIMEOUT,
                    ..
                }
        )
    }

    /// The PMIx function the error is about, if any.
    #[cfg_attr(not(test), allow(dead_code))]
    pub(crate) fn call(&self) -> Option<&'static str> {
        match self {
            PmixError::Call { call, .. }
            | PmixError::Timeout { call, .. }
            | PmixError::InvalidArgument { call, .. }
            | PmixError::BadValue { call, .. } => Some(call),
            PmixError::Library { .. } => Some("dlopen"),
            PmixError::IncompleteEnvironment { .. }
            | PmixError::AlreadyUsed { .. }
            | PmixError::InitTimeout { .. } => Some("PMIx_Init"),
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
            PmixError::InitTimeout {
                namespace,
                server,
                after,
            } => write!(
                f,
                "PMIx_Init got no answer within {after:?} (the start timeout) from the PMIx server at \
                 {server} (PMIX_NAMESPACE={namespace}): the server there is stopped, overloaded or not a \
                 PMIx server; if this process was not started by mpirun, srun or prterun, the PMIX_* \
                 variables are stale (inherited from another job): unset them"
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
