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

/// The parts of `pmix_common.h` (PMIx 4.2) this module uses, written out by
/// hand. The `layout_matches_pmix_h` test compiles a C program against the
/// real header and checks every size, offset and constant here.
mod sys;

mod checks;
mod client;
mod error;
mod job;
mod load;
mod nb;
mod value;

pub(crate) use client::Pmix;
pub(crate) use error::PmixError;

/// For the fuzz targets: `PMIX_LOCAL_PEERS` as the client parses it.
pub(crate) fn fuzz_local_peers(text: &[u8], size: u32, me: u32) -> bool {
    job::parse_peers(text, size, me).is_ok()
}

#[cfg(test)]
mod tests_layout;
#[cfg(test)]
mod tests_mpirun;
#[cfg(test)]
mod tests_srun;
#[cfg(test)]
mod tests_unit;
