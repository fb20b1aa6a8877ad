//! Finds the system libfabric, generates Rust bindings for it with bindgen and
//! compiles the C shims bindgen writes for libfabric's `static inline` API.
//!
//! Search order:
//! 1. `LIBFABRIC_INCLUDE_DIR` and `LIBFABRIC_LIB_DIR` (both), or
//! 2. `LIBFABRIC_DIR` (an install prefix holding `include/` and `lib/` or `lib64/`),
//! 3. pkg-config, `libfabric >= 1.17`.
//!
//! Nothing is printed unless something is wrong.

use std::env;
use std::path::{Path, PathBuf};

/// Oldest libfabric API fabric-msg is written against (Debian bookworm ships it).
const MIN_MAJOR: u32 = 1;
const MIN_MINOR: u32 = 17;

const ENV_VARS: &[&str] = &["LIBFABRIC_DIR", "LIBFABRIC_INCLUDE_DIR", "LIBFABRIC_LIB_DIR"];

struct Library {
    include_dirs: Vec<PathBuf>,
    found_by: String,
}

fn main() {
    for var in ENV_VARS {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=wrapper.h");
    println!("cargo:rustc-check-cfg=cfg(libfabric_v2)");

    let lib = match find_library() {
        Ok(lib) => lib,
        Err(why) => fail(&why),
    };

    let header = probe_header(&lib);
    if (header.major, header.minor) < (MIN_MAJOR, MIN_MINOR) {
        fail(&format!(
            "libfabric headers found by {} are version {}.{}; fabric-msg needs at least {MIN_MAJOR}.{MIN_MINOR}.",
            lib.found_by, header.major, header.minor
        ));
    }
    if header.major >= 2 {
        println!("cargo:rustc-cfg=libfabric_v2");
    }
    // Dependents that declare `links`-aware build scripts can read these as
    // DEP_FABRIC_VERSION_MAJOR / DEP_FABRIC_VERSION_MINOR.
    println!("cargo:version_major={}", header.major);
    println!("cargo:version_minor={}", header.minor);

    generate(&lib, header.has_ext);
}

/// Resolve where libfabric is, emitting the link directives as a side effect.
fn find_library() -> Result<Library, String> {
    let var = |name: &str| env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);

    let (include, lib, found_by) = match (
        var("LIBFABRIC_INCLUDE_DIR"),
        var("LIBFABRIC_LIB_DIR"),
        var("LIBFABRIC_DIR"),
    ) {
        (Some(inc), Some(lib), _) => (inc, lib, "LIBFABRIC_INCLUDE_DIR/LIBFABRIC_LIB_DIR".to_string()),
        (Some(_), None, _) | (None, Some(_), _) => {
            return Err("set both LIBFABRIC_INCLUDE_DIR and LIBFABRIC_LIB_DIR, or neither.".into())
        }
        (None, None, Some(prefix)) => {
            // lib/<arch>-linux-gnu is where Debian and Ubuntu put libraries.
            let multiarch = format!(
                "lib/{}-linux-gnu",
                env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default()
            );
            let lib = ["lib64", "lib", multiarch.as_str()]
                .iter()
                .map(|d| prefix.join(d))
                .find(|d| has_libfabric(d))
                .unwrap_or_else(|| prefix.join("lib"));
            (
                prefix.join("include"),
                lib,
                format!("LIBFABRIC_DIR={}", prefix.display()),
            )
        }
        (None, None, None) => {
            return match pkg_config::Config::new()
                .atleast_version(&format!("{MIN_MAJOR}.{MIN_MINOR}"))
                .probe("libfabric")
            {
                Ok(found) => Ok(Library {
                    include_dirs: found.include_paths,
                    found_by: format!("pkg-config (libfabric {})", found.version),
                }),
                Err(e) => Err(pkg_config_failure(&e)),
            };
        }
    };

    if !include.join("rdma/fabric.h").is_file() {
        return Err(format!(
            "{found_by}: no rdma/fabric.h under {}",
            include.display()
        ));
    }
    if !has_libfabric(&lib) {
        return Err(format!(
            "{found_by}: no libfabric.so or libfabric.a in {}",
            lib.display()
        ));
    }
    println!("cargo:rustc-link-search=native={}", lib.display());
    println!("cargo:rustc-link-lib=fabric");
    Ok(Library {
        include_dirs: vec![include],
        found_by,
    })
}

/// pkg-config's own report is a page long; keep the one line that says why.
fn pkg_config_failure(e: &pkg_config::Error) -> String {
    let reason = match e {
        pkg_config::Error::Command { .. } => "pkg-config itself is not installed".to_string(),
        _ => e
            .to_string()
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with("Package libfabric was not found") || l.starts_with("Requested"))
            .unwrap_or("no usable libfabric.pc")
            .to_string(),
    };
    format!("pkg-config: {reason} (need libfabric >= {MIN_MAJOR}.{MIN_MINOR})")
}

fn has_libfabric(dir: &Path) -> bool {
    dir.join("libfabric.so").exists() || dir.join("libfabric.a").exists()
}

/// Stop the build with one message saying what to install or set.
fn fail(why: &str) -> ! {
    eprintln!(
        "\nerror: libfabric not found or unusable: {why}\n\
         \n  fabric-msg needs the libfabric development files (headers, libfabric.so, libfabric.pc), version {MIN_MAJOR}.{MIN_MINOR} or newer.\
         \n  Debian/Ubuntu:  sudo apt-get install libfabric-dev   (or run: bash ci/setup.sh)\
         \n  Fedora/RHEL:    sudo dnf install libfabric-devel\
         \n  Installed elsewhere? Set LIBFABRIC_DIR=<prefix>, or LIBFABRIC_INCLUDE_DIR and LIBFABRIC_LIB_DIR,\
         \n  or add its pkgconfig directory to PKG_CONFIG_PATH.\n"
    );
    std::process::exit(1);
}

struct HeaderInfo {
    major: u32,
    minor: u32,
    has_ext: bool,
}

/// Ask the C preprocessor which header version is in use and whether
/// `fi_ext.h` exists, so that gating follows the headers actually compiled.
fn probe_header(lib: &Library) -> HeaderInfo {
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let probe = out.join("version_probe.c");
    std::fs::write(
        &probe,
        "#include <rdma/fabric.h>\n\
         fabric_msg_major FI_MAJOR_VERSION\n\
         fabric_msg_minor FI_MINOR_VERSION\n\
         #if __has_include(<rdma/fi_ext.h>)\n\
         fabric_msg_has_ext 1\n\
         #else\n\
         fabric_msg_has_ext 0\n\
         #endif\n",
    )
    .expect("write version probe into OUT_DIR");
    let mut build = cc::Build::new();
    build.file(&probe).cargo_warnings(false);
    for dir in &lib.include_dirs {
        build.include(dir);
    }
    let expanded = match build.try_expand() {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) => fail(&format!(
            "the C preprocessor could not read rdma/fabric.h ({}): {e}",
            lib.found_by
        )),
    };
    // Line markers may split `name value` across lines: drop them and read
    // the token that follows each name.
    let tokens: Vec<&str> = expanded
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .flat_map(str::split_whitespace)
        .collect();
    let field = |name: &str| -> u32 {
        tokens
            .windows(2)
            .find(|w| w[0] == name)
            .and_then(|w| w[1].trim_end_matches(['U', 'u']).parse().ok())
            .unwrap_or_else(|| {
                fail(&format!(
                    "could not read {name} from rdma/fabric.h ({})",
                    lib.found_by
                ))
            })
    };
    HeaderInfo {
        major: field("fabric_msg_major"),
        minor: field("fabric_msg_minor"),
        has_ext: field("fabric_msg_has_ext") == 1,
    }
}

fn generate(lib: &Library, has_ext: bool) {
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let wrapper = manifest.join("wrapper.h");
    let shims = out.join("fabric_shims");

    let mut clang_args: Vec<String> = lib
        .include_dirs
        .iter()
        .map(|d| format!("-I{}", d.display()))
        .collect();
    if has_ext {
        clang_args.push("-DFABRIC_MSG_HAVE_FI_EXT_H".into());
    }

    let bindings = bindgen::Builder::default()
        .header(wrapper.to_string_lossy())
        .clang_args(&clang_args)
        .allowlist_function("fi_.*")
        .allowlist_type("fi_.*|fid.*")
        .allowlist_var("FI_.*|OFI_.*")
        // Types the C library already defines for us; libc's are ABI-identical.
        .blocklist_type("iovec")
        .blocklist_type("sockaddr")
        .blocklist_type("timespec")
        .prepend_enum_name(false)
        .derive_default(true)
        .wrap_static_fns(true)
        .wrap_static_fns_path(&shims)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()))
        .generate()
        .unwrap_or_else(|e| fail(&format!("bindgen could not parse the libfabric headers: {e}")));
    bindings
        .write_to_file(out.join("bindings.rs"))
        .expect("write bindings.rs into OUT_DIR");

    // bindgen wrote fabric_shims.c: one exported function per static inline
    // (`fi_send` -> `fi_send__extern`); the generated Rust links to those.
    let mut build = cc::Build::new();
    build
        .file(shims.with_extension("c"))
        .include(&manifest)
        .warnings(false)
        .cargo_warnings(false);
    for dir in &lib.include_dirs {
        build.include(dir);
    }
    if has_ext {
        build.define("FABRIC_MSG_HAVE_FI_EXT_H", None);
    }
    build.compile("fabric_msg_shims");
}
