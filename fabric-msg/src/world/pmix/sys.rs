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
