use std::ffi::c_char;

use super::sys;

/// A PMIx value copied into Rust memory.
#[derive(Debug, PartialEq)]
pub(super) enum Owned {
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
    pub(super) fn data_type(&self) -> sys::DataType {
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

/// Copies what `value` holds, refusing anything longer than `max_len`.
///
/// # Safety
/// `value` is a valid `pmix_value_t` whose pointers, per its type, point
/// at live memory (a byte object's `size` bytes, a NUL-terminated string).
pub(super) unsafe fn copy_value(value: &sys::Value, max_len: usize) -> Owned {
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
pub(super) unsafe fn copy_c_string(ptr: *const c_char, max_len: usize) -> Option<Result<Vec<u8>, ()>> {
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
