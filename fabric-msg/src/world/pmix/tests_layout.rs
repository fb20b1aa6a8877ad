use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::mem::{align_of, offset_of, size_of};
use std::process::Command;

use super::sys::{self, Status};

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
    let dir = TempDir(std::env::temp_dir().join(format!("fabric-msg-pmix-layout-{}", std::process::id())));
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
