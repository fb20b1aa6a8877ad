//! libfabric's flag bits by name (capabilities, `mode`, `mr_mode`), and which
//! of them exist in which libfabric series.
//!
//! The tables name bits for reports and read them back from recorded
//! `fi_info` text, which may come from either series whichever headers this
//! crate was built with. Bits both series define come from the bindings.
//! Bits only one series defines are written here as numbers, and where the
//! compiled headers do define them a compile-time check holds the number to
//! the header's value:
//!
//! - retired in 2.0 (`mode`): `FI_LOCAL_MR` (the pre-1.5 spelling of
//!   `FI_MR_LOCAL`), `FI_NOTIFY_FLAGS_ONLY`, `FI_RESTRICTED_COMP`,
//!   `FI_BUFFERED_RECV`. 2.x headers drop them or define them as 0.
//! - new in 2.0 (capabilities): `FI_TAGGED_DIRECTED_RECV` and
//!   `FI_TAGGED_MULTI_RECV` (bits 45 and 46, which 1.x used only as memory
//!   registration flags). Bit 48 is `FI_VARIABLE_MSG` in 1.x and
//!   `FI_EXACT_DIRECTED_RECV` in 2.x; it is named as the compiled headers
//!   name it, which is how a provider fills it in for the API version
//!   fabric-msg asks for.
//!
//! 2.0 and 2.1 add no `mr_mode` bit: `FI_MR_DMABUF` and `FI_MR_SINGLE_USE`
//! are flags of `fi_mr_regattr`, not modes.

use crate::ffi;

/// `FI_LOCAL_MR`, a `mode` bit of libfabric 1.x (retired in 2.0).
pub const FI_LOCAL_MR: u64 = 1 << 55;
/// `FI_NOTIFY_FLAGS_ONLY`, a `mode` bit of libfabric 1.x (retired in 2.0).
pub const FI_NOTIFY_FLAGS_ONLY: u64 = 1 << 54;
/// `FI_RESTRICTED_COMP`, a `mode` bit of libfabric 1.x (retired in 2.0).
pub const FI_RESTRICTED_COMP: u64 = 1 << 53;
/// `FI_BUFFERED_RECV`, a `mode` bit of libfabric 1.x (retired in 2.0).
pub const FI_BUFFERED_RECV: u64 = 1 << 51;
/// `FI_TAGGED_DIRECTED_RECV`, a capability new in libfabric 2.0.
pub const FI_TAGGED_DIRECTED_RECV: u64 = 1 << 45;
/// `FI_TAGGED_MULTI_RECV`, a capability new in libfabric 2.0.
pub const FI_TAGGED_MULTI_RECV: u64 = 1 << 46;
/// Bit 48 of `caps`: `FI_VARIABLE_MSG` in 1.x, `FI_EXACT_DIRECTED_RECV` in 2.x.
const CAP_BIT_48: u64 = 1 << 48;

// The numbers above are libfabric's, checked against the headers that have them.
#[cfg(not(libfabric_v2))]
const _: () = assert!(
    FI_LOCAL_MR == ffi::FI_LOCAL_MR as u64
        && FI_NOTIFY_FLAGS_ONLY == ffi::FI_NOTIFY_FLAGS_ONLY as u64
        && FI_RESTRICTED_COMP == ffi::FI_RESTRICTED_COMP as u64
        && FI_BUFFERED_RECV == ffi::FI_BUFFERED_RECV as u64
        && CAP_BIT_48 == ffi::FI_VARIABLE_MSG as u64
);
#[cfg(libfabric_v2)]
const _: () = assert!(
    FI_TAGGED_DIRECTED_RECV == ffi::FI_TAGGED_DIRECTED_RECV as u64
        && FI_TAGGED_MULTI_RECV == ffi::FI_TAGGED_MULTI_RECV as u64
        && CAP_BIT_48 == ffi::FI_EXACT_DIRECTED_RECV as u64
);

/// Names of the capability bits fabric-msg reports (`fi_info.caps`).
pub const CAP_NAMES: &[(&str, u64)] = &[
    ("FI_MSG", ffi::FI_MSG as u64),
    ("FI_RMA", ffi::FI_RMA as u64),
    ("FI_TAGGED", ffi::FI_TAGGED as u64),
    ("FI_ATOMIC", ffi::FI_ATOMIC as u64),
    ("FI_MULTICAST", ffi::FI_MULTICAST as u64),
    ("FI_COLLECTIVE", ffi::FI_COLLECTIVE as u64),
    ("FI_READ", ffi::FI_READ as u64),
    ("FI_WRITE", ffi::FI_WRITE as u64),
    ("FI_RECV", ffi::FI_RECV as u64),
    ("FI_SEND", ffi::FI_SEND as u64),
    ("FI_REMOTE_READ", ffi::FI_REMOTE_READ as u64),
    ("FI_REMOTE_WRITE", ffi::FI_REMOTE_WRITE as u64),
    ("FI_MULTI_RECV", ffi::FI_MULTI_RECV as u64),
    ("FI_REMOTE_CQ_DATA", ffi::FI_REMOTE_CQ_DATA as u64),
    ("FI_TRIGGER", ffi::FI_TRIGGER as u64),
    ("FI_FENCE", ffi::FI_FENCE as u64),
    ("FI_AV_USER_ID", ffi::FI_AV_USER_ID as u64),
    ("FI_PEER", ffi::FI_PEER as u64),
    ("FI_TAGGED_DIRECTED_RECV", FI_TAGGED_DIRECTED_RECV),
    ("FI_TAGGED_MULTI_RECV", FI_TAGGED_MULTI_RECV),
    ("FI_HMEM", ffi::FI_HMEM as u64),
    #[cfg(not(libfabric_v2))]
    ("FI_VARIABLE_MSG", CAP_BIT_48),
    #[cfg(libfabric_v2)]
    ("FI_EXACT_DIRECTED_RECV", CAP_BIT_48),
    ("FI_RMA_PMEM", ffi::FI_RMA_PMEM as u64),
    ("FI_SOURCE_ERR", ffi::FI_SOURCE_ERR as u64),
    ("FI_LOCAL_COMM", ffi::FI_LOCAL_COMM as u64),
    ("FI_REMOTE_COMM", ffi::FI_REMOTE_COMM as u64),
    ("FI_SHARED_AV", ffi::FI_SHARED_AV as u64),
    ("FI_RMA_EVENT", ffi::FI_RMA_EVENT as u64),
    ("FI_SOURCE", ffi::FI_SOURCE as u64),
    ("FI_NAMED_RX_CTX", ffi::FI_NAMED_RX_CTX as u64),
    ("FI_DIRECTED_RECV", ffi::FI_DIRECTED_RECV as u64),
];

/// Names of the memory-registration mode bits (`domain_attr.mr_mode`).
pub const MR_MODE_NAMES: &[(&str, u64)] = &[
    ("FI_MR_LOCAL", ffi::FI_MR_LOCAL as u64),
    ("FI_MR_RAW", ffi::FI_MR_RAW as u64),
    ("FI_MR_VIRT_ADDR", ffi::FI_MR_VIRT_ADDR as u64),
    ("FI_MR_ALLOCATED", ffi::FI_MR_ALLOCATED as u64),
    ("FI_MR_PROV_KEY", ffi::FI_MR_PROV_KEY as u64),
    ("FI_MR_MMU_NOTIFY", ffi::FI_MR_MMU_NOTIFY as u64),
    ("FI_MR_RMA_EVENT", ffi::FI_MR_RMA_EVENT as u64),
    ("FI_MR_ENDPOINT", ffi::FI_MR_ENDPOINT as u64),
    ("FI_MR_HMEM", ffi::FI_MR_HMEM as u64),
    ("FI_MR_COLLECTIVE", ffi::FI_MR_COLLECTIVE as u64),
];

/// Names of the mode bits (`fi_info.mode`) of either series.
pub const MODE_NAMES: &[(&str, u64)] = &[
    ("FI_CONTEXT", ffi::FI_CONTEXT as u64),
    ("FI_MSG_PREFIX", ffi::FI_MSG_PREFIX as u64),
    ("FI_ASYNC_IOV", ffi::FI_ASYNC_IOV as u64),
    ("FI_RX_CQ_DATA", ffi::FI_RX_CQ_DATA as u64),
    ("FI_LOCAL_MR", FI_LOCAL_MR),
    ("FI_NOTIFY_FLAGS_ONLY", FI_NOTIFY_FLAGS_ONLY),
    ("FI_RESTRICTED_COMP", FI_RESTRICTED_COMP),
    ("FI_CONTEXT2", ffi::FI_CONTEXT2 as u64),
    ("FI_BUFFERED_RECV", FI_BUFFERED_RECV),
];

/// Every `mr_mode` bit the running libfabric defines (both series define
/// the same ones).
pub const ALL_MR_MODE: u64 = (ffi::FI_MR_LOCAL
    | ffi::FI_MR_RAW
    | ffi::FI_MR_VIRT_ADDR
    | ffi::FI_MR_ALLOCATED
    | ffi::FI_MR_PROV_KEY
    | ffi::FI_MR_MMU_NOTIFY
    | ffi::FI_MR_RMA_EVENT
    | ffi::FI_MR_ENDPOINT
    | ffi::FI_MR_HMEM
    | ffi::FI_MR_COLLECTIVE) as u64;

/// Every `mode` bit libfabric `version` (`(major, minor)` of the library
/// loaded) defines: the 1.x-only bits are offered to 1.x only.
pub fn all_mode(version: (u32, u32)) -> u64 {
    let both = ffi::FI_CONTEXT as u64
        | ffi::FI_CONTEXT2 as u64
        | ffi::FI_MSG_PREFIX as u64
        | ffi::FI_ASYNC_IOV as u64
        | ffi::FI_RX_CQ_DATA as u64;
    if version.0 >= 2 {
        both
    } else {
        both | FI_LOCAL_MR | FI_NOTIFY_FLAGS_ONLY | FI_RESTRICTED_COMP | FI_BUFFERED_RECV
    }
}

/// The names of the bits of `bits` according to `table`; unknown bits are
/// shown in hex.
pub fn bit_names(bits: u64, table: &[(&str, u64)]) -> Vec<String> {
    let mut rest = bits;
    let mut out = Vec::new();
    for (name, bit) in table {
        if bits & bit != 0 {
            out.push((*name).to_string());
            rest &= !bit;
        }
    }
    if rest != 0 {
        out.push(format!("{rest:#x}"));
    }
    out
}

/// The bits named in `list` (`[ FI_MSG, FI_RMA ]` as `fi_info` prints it);
/// names not in `table` are ignored.
pub(crate) fn bits_from_names(list: &str, table: &[(&str, u64)]) -> u64 {
    list.trim_matches(|c| c == '[' || c == ']' || c == ' ')
        .split(',')
        .map(str::trim)
        .filter_map(|n| table.iter().find(|(name, _)| *name == n).map(|(_, b)| *b))
        .fold(0, |acc, b| acc | b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_two_names_share_a_bit_and_every_bit_is_one_bit() {
        for table in [CAP_NAMES, MR_MODE_NAMES, MODE_NAMES] {
            for (i, (name, bit)) in table.iter().enumerate() {
                assert_eq!(bit.count_ones(), 1, "{name} = {bit:#x}");
                for (other, b) in &table[i + 1..] {
                    assert_ne!(bit, b, "{name} and {other}");
                }
            }
        }
    }

    #[test]
    fn retired_mode_bits_are_offered_to_1x_only() {
        let retired = FI_LOCAL_MR | FI_NOTIFY_FLAGS_ONLY | FI_RESTRICTED_COMP | FI_BUFFERED_RECV;
        assert_eq!(all_mode((1, 17)) & retired, retired);
        assert_eq!(all_mode((2, 1)) & retired, 0);
        assert_eq!(
            all_mode((2, 1)) & ffi::FI_CONTEXT2 as u64,
            ffi::FI_CONTEXT2 as u64
        );
    }

    #[test]
    fn names_of_either_series_read_back() {
        let mode = bits_from_names("[ FI_LOCAL_MR, FI_CONTEXT2, FI_NOT_A_BIT ]", MODE_NAMES);
        assert_eq!(mode, FI_LOCAL_MR | ffi::FI_CONTEXT2 as u64);
        assert_eq!(bit_names(mode, MODE_NAMES), ["FI_LOCAL_MR", "FI_CONTEXT2"]);
        let caps = bits_from_names("[ FI_MSG, FI_TAGGED_MULTI_RECV ]", CAP_NAMES);
        assert_eq!(bit_names(caps, CAP_NAMES), ["FI_MSG", "FI_TAGGED_MULTI_RECV"]);
    }

    #[test]
    fn bit_names_show_unknown_bits_in_hex() {
        let names = bit_names(ffi::FI_MSG as u64 | (1 << 63), CAP_NAMES);
        assert_eq!(names, ["FI_MSG", "0x8000000000000000"]);
    }
}
