use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, OsString};
use std::mem::size_of;
use std::ptr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::checks::{checked_key, checked_namespace, deadline, server_timeout};
use super::error::PmixError;
use super::job::parse_peers;
use super::load::{api, detect, load, Launch};
use super::nb::{
    fence_done, get_done, FenceInputs, FenceRequest, Fetched, GetInputs, GetRequest, Slot,
    ABANDONED_COMPLETIONS,
};
use super::sys;
use super::value::{copy_value, Owned};

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
