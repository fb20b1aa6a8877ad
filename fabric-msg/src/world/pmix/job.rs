//! What PMIx says of the job: its size, this process's local rank, the
//! ranks on this node and the node's name, each checked (type, range,
//! length) before it is believed.

use super::checks::type_name;
use super::client::Pmix;
use super::error::PmixError;
use super::sys::{self};
use super::value::Owned;
use std::ffi::CStr;
use std::time::Duration;

/// Bound on the lookups of job information (job size, local rank, peers,
/// host name), which libpmix answers from what the server gave it at
/// start-up.
pub(super) const INFO_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest `PMIX_LOCAL_PEERS` string accepted (about 100 000 ranks).
const MAX_PEERS_TEXT: usize = 1 << 20;
/// Longest host name accepted.
const MAX_HOSTNAME: usize = 4096;

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

    pub(super) fn wrong_type(&self, got: Owned, wanted: &str, context: &str, max_len: usize) -> PmixError {
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
pub(super) fn parse_peers(text: &[u8], size: u32, me: u32) -> Result<Vec<u32>, String> {
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
