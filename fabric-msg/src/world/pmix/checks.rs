use std::ffi::{c_char, c_int, CString};
use std::time::{Duration, Instant};

use super::error::PmixError;
use super::sys;

// ---------------------------------------------------------------------------
// Checks on what goes in and comes out
// ---------------------------------------------------------------------------

/// A user key as PMIx takes it: not empty, no NUL, at most 511 bytes.
pub(super) fn checked_key(call: &'static str, key: &str) -> Result<CString, PmixError> {
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
pub(super) fn checked_namespace(nspace: &[c_char; sys::MAX_NSLEN + 1]) -> Result<String, String> {
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
pub(super) fn deadline(call: &'static str, timeout: Duration) -> Result<Option<Instant>, PmixError> {
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
pub(super) fn server_timeout(timeout: Duration) -> c_int {
    let secs = timeout
        .as_secs()
        .saturating_add(u64::from(timeout.subsec_nanos() > 0));
    c_int::try_from(secs.max(1)).unwrap_or(c_int::MAX)
}

pub(super) fn rank_name(rank: u32) -> String {
    match rank {
        sys::RANK_WILDCARD => "the job".to_owned(),
        rank => format!("rank {rank}"),
    }
}

pub(super) fn type_name(t: sys::DataType) -> String {
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
