//! The provider ladder: `providers.toml`.
//!
//! The workspace's `providers.toml` is compiled in as the default, so no file
//! is needed at run time. [`LadderConfig::load`] takes, in order, an explicit
//! path, the file named by `FABRIC_MSG_PROVIDERS`, or the built-in default.

use crate::discovery::classify::FabricKind;
use crate::discovery::info::EndpointType;
use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The default ladder, as shipped in the workspace's `providers.toml`.
pub const DEFAULT_PROVIDERS_TOML: &str = include_str!("../../../providers.toml");

/// Environment variable naming a `providers.toml` to use instead of the default.
pub const PROVIDERS_ENV: &str = "FABRIC_MSG_PROVIDERS";

/// Largest ladder file read: the built-in one is a few KiB.
pub const MAX_PROVIDERS_FILE: u64 = 1 << 20;

/// Longest stretch of a line quoted back in an error.
const QUOTE_MAX: usize = 120;

/// One rung of the ladder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rung {
    /// The kind of fabric this rung accepts.
    pub kind: FabricKind,
    /// The libfabric provider name, exactly as `fi_info` prints it.
    pub provider: String,
    /// Endpoint type.
    pub endpoint: RungEndpoint,
    /// `false` keeps the rung in the file but skips it.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Oldest libfabric (`"MAJOR.MINOR"`) this rung may be used with;
    /// older versions pass it over, giving `note` as the reason.
    #[serde(default)]
    pub min_libfabric: Option<String>,
    /// Why the rung needs `min_libfabric`.
    #[serde(default)]
    pub note: Option<String>,
}

impl Rung {
    /// `min_libfabric` as numbers.
    pub fn min_version(&self) -> Option<(u32, u32)> {
        self.min_libfabric.as_deref().and_then(parse_version)
    }
}

fn parse_version(s: &str) -> Option<(u32, u32)> {
    let (a, b) = s.trim().split_once('.')?;
    Some((a.parse().ok()?, b.parse().ok()?))
}

fn yes() -> bool {
    true
}

/// Endpoint types a rung may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RungEndpoint {
    /// `FI_EP_RDM`.
    Rdm,
    /// `FI_EP_MSG`.
    Msg,
}

impl From<RungEndpoint> for EndpointType {
    fn from(e: RungEndpoint) -> Self {
        match e {
            RungEndpoint::Rdm => EndpointType::Rdm,
            RungEndpoint::Msg => EndpointType::Msg,
        }
    }
}

/// Settings for one provider.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSettings {
    /// Environment tunables set before libfabric initialises, unless the
    /// user has already set them.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Frame every message with fabric-msg's header (for providers that
    /// truncate a receive without reporting it).
    #[serde(default)]
    pub framed: bool,
    /// Whether the sender's address the provider reports (`FI_SOURCE`) is
    /// right; `false` makes fabric-msg report none rather than a wrong one.
    #[serde(default = "yes")]
    pub trust_source: bool,
    /// Why the provider's atomics must not be used, if they must not: the
    /// profile then offers none, and `Capability::Atomic` passes the
    /// provider over with this reason.
    #[serde(default)]
    pub atomics_broken: Option<String>,
    /// The first libfabric (`"MAJOR.MINOR"`) whose atomics on this
    /// provider work: `atomics_broken` applies only before it.
    #[serde(default)]
    pub atomics_fixed_in: Option<String>,
    /// Why tagged receives with an ignore mask cannot be trusted against
    /// messages that arrived before them, if they cannot: the profile says
    /// so ([`Profile::tag_mask_defect`](crate::Profile::tag_mask_defect)).
    #[serde(default)]
    pub masked_receives_broken: Option<String>,
    /// The first libfabric (`"MAJOR.MINOR"`) whose masked receives on
    /// this provider work: `masked_receives_broken` applies only before it.
    #[serde(default)]
    pub masked_receives_fixed_in: Option<String>,
    /// Why a peek (`FI_PEEK`) cannot be used, if it cannot: the profile
    /// says so ([`Profile::peek_defect`](crate::Profile::peek_defect)) and
    /// the World's probe refuses with this reason.
    #[serde(default)]
    pub peek_broken: Option<String>,
    /// The first libfabric (`"MAJOR.MINOR"`) whose peeks on this provider
    /// work: `peek_broken` applies only before it.
    #[serde(default)]
    pub peek_fixed_in: Option<String>,
}

/// The whole ladder configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LadderConfig {
    /// Format version; 1.
    pub version: u32,
    /// Rungs, most preferred first.
    #[serde(rename = "rung")]
    pub rungs: Vec<Rung>,
    /// The rung used for peers on the same host, when allowed.
    #[serde(default)]
    pub same_host: Option<Rung>,
    /// Per-provider settings, by provider name.
    #[serde(default, rename = "provider")]
    pub providers: BTreeMap<String, ProviderSettings>,
    /// Where this configuration came from (a path or `built-in`).
    #[serde(skip)]
    pub origin: String,
}

impl Default for LadderConfig {
    fn default() -> Self {
        Self::parse(DEFAULT_PROVIDERS_TOML, "built-in providers.toml")
            .expect("the built-in providers.toml parses")
    }
}

impl LadderConfig {
    /// Parse a ladder from TOML text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self> {
        let mut cfg: LadderConfig = toml::from_str(text).map_err(|e| Error::Config {
            source_name: origin.to_string(),
            message: describe_toml_error(text, &e),
        })?;
        cfg.origin = origin.to_string();
        cfg.validate()?;
        Ok(cfg)
    }

    /// Load from `path`, else from `$FABRIC_MSG_PROVIDERS`, else the built-in default.
    pub fn load(path: Option<&Path>) -> Result<Self> {
        let chosen: Option<PathBuf> = match path {
            Some(p) => Some(p.to_path_buf()),
            None => std::env::var_os(PROVIDERS_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
        };
        match chosen {
            None => Ok(Self::default()),
            Some(p) => {
                let origin = p.display().to_string();
                let named = if path.is_none() {
                    format!(" (named by {PROVIDERS_ENV})")
                } else {
                    String::new()
                };
                let text = read_bounded(&p).map_err(|message| Error::Config {
                    source_name: origin.clone(),
                    message: format!("{message}{named}"),
                })?;
                Self::parse(&text, &origin)
            }
        }
    }

    fn validate(&self) -> Result<()> {
        let err = |message: String| Error::Config {
            source_name: self.origin.clone(),
            message,
        };
        if self.version != 1 {
            return Err(err(format!(
                "key `version`: {} is not a version this fabric-msg reads (1)",
                self.version
            )));
        }
        if self.rungs.is_empty() {
            return Err(err("no [[rung]] entries: the ladder needs at least one".into()));
        }
        for (i, r) in self.rungs.iter().chain(self.same_host.iter()).enumerate() {
            if r.provider.trim().is_empty() {
                return Err(err(format!("rung {}: key `provider` is empty", i + 1)));
            }
        }
        for (i, r) in self.rungs.iter().enumerate() {
            if let Some(v) = &r.min_libfabric {
                if parse_version(v).is_none() {
                    return Err(err(format!(
                        "rung {} ({}): key `min_libfabric` = {v:?} is not MAJOR.MINOR, e.g. \"1.19\"",
                        i + 1,
                        r.provider
                    )));
                }
            }
        }
        for (name, settings) in &self.providers {
            if name.trim().is_empty() {
                return Err(err("a [provider.\"...\"] table has an empty name".into()));
            }
            let fixed = [
                ("atomics_fixed_in", &settings.atomics_fixed_in),
                ("masked_receives_fixed_in", &settings.masked_receives_fixed_in),
            ];
            for (key, value) in fixed {
                if let Some(v) = value.as_deref().filter(|v| parse_version(v).is_none()) {
                    return Err(err(format!(
                        "[provider.\"{name}\"] key `{key}` = {:?} is not MAJOR.MINOR, e.g. \"2.2\"",
                        quote(v)
                    )));
                }
            }
            for (key, value) in &settings.env {
                if let Some(why) = env_problem(key, value) {
                    return Err(err(format!(
                        "[provider.\"{name}\".env] key {:?}: {why}",
                        quote(key)
                    )));
                }
            }
        }
        Ok(())
    }

    /// Whether the ladder asks for framing on `provider`.
    pub fn framed(&self, provider: &str) -> bool {
        self.providers.get(provider).is_some_and(|s| s.framed)
    }

    /// Whether `provider`'s reported source addresses can be used.
    pub fn trust_source(&self, provider: &str) -> bool {
        self.providers.get(provider).map_or(true, |s| s.trust_source)
    }

    /// Why `provider`'s atomics are not to be used, if they are not.
    pub fn atomics_broken(&self, provider: &str) -> Option<&str> {
        self.atomics_broken_in(provider, crate::ffi::runtime_version())
    }

    /// [`LadderConfig::atomics_broken`] for libfabric `version`.
    pub fn atomics_broken_in(&self, provider: &str, version: (u32, u32)) -> Option<&str> {
        let s = self.providers.get(provider)?;
        broken_before(&s.atomics_broken, &s.atomics_fixed_in, version)
    }

    /// Why masked tagged receives on `provider` cannot be trusted with the
    /// running libfabric, if they cannot.
    pub fn masked_receives_broken(&self, provider: &str) -> Option<&str> {
        self.masked_receives_broken_in(provider, crate::ffi::runtime_version())
    }

    /// [`LadderConfig::masked_receives_broken`] for libfabric `version`.
    pub fn masked_receives_broken_in(&self, provider: &str, version: (u32, u32)) -> Option<&str> {
        let s = self.providers.get(provider)?;
        broken_before(&s.masked_receives_broken, &s.masked_receives_fixed_in, version)
    }

    /// Why peeks (`FI_PEEK`) on `provider` cannot be used with the running
    /// libfabric, if they cannot.
    pub fn peek_broken(&self, provider: &str) -> Option<&str> {
        self.peek_broken_in(provider, crate::ffi::runtime_version())
    }

    /// [`LadderConfig::peek_broken`] for libfabric `version`.
    pub fn peek_broken_in(&self, provider: &str, version: (u32, u32)) -> Option<&str> {
        let s = self.providers.get(provider)?;
        broken_before(&s.peek_broken, &s.peek_fixed_in, version)
    }

    /// Environment tunables for `provider`.
    pub fn env_for(&self, provider: &str) -> impl Iterator<Item = (&String, &String)> {
        self.providers
            .get(provider)
            .into_iter()
            .flat_map(|s| s.env.iter())
    }
}

/// toml's errors carry a byte span; say the line, and quote it.
fn describe_toml_error(text: &str, e: &toml::de::Error) -> String {
    let msg = quote(e.message().trim());
    match e.span() {
        Some(span) => {
            let start = (0..=span.start.min(text.len()))
                .rev()
                .find(|&i| text.is_char_boundary(i))
                .unwrap_or(0);
            let line_no = text[..start].matches('\n').count() + 1;
            let line = text.lines().nth(line_no - 1).unwrap_or("").trim();
            format!("line {line_no} (`{}`): {msg}", quote(line))
        }
        None => msg,
    }
}

/// At most `QUOTE_MAX` characters of `s`, marked where cut.
fn quote(s: &str) -> String {
    match s.char_indices().nth(QUOTE_MAX) {
        Some((cut, _)) => format!("{}... ({} bytes in all)", &s[..cut], s.len()),
        None => s.to_string(),
    }
}

/// Why an `env` entry cannot be set as an environment variable, if it
/// cannot: `set_var` panics on an empty name, `=` in a name, or a NUL.
fn env_problem(key: &str, value: &str) -> Option<&'static str> {
    if key.is_empty() {
        Some("an environment variable needs a name")
    } else if !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        || key.as_bytes()[0].is_ascii_digit()
    {
        Some("an environment variable name is letters, digits and `_`, not starting with a digit (e.g. FI_TCP_IFACE)")
    } else if value.contains('\0') {
        Some("the value contains a NUL byte, which no environment variable can hold")
    } else {
        None
    }
}

/// The text of a ladder file: a regular file of at most
/// [`MAX_PROVIDERS_FILE`] bytes, read no further than that (a FIFO, a
/// device or `/dev/zero` is refused before reading).
fn read_bounded(path: &Path) -> std::result::Result<String, String> {
    use std::io::Read;
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read it: {e}"))?;
    if !meta.is_file() {
        return Err(format!(
            "not a regular file ({}): give the path of a providers.toml",
            if meta.is_dir() {
                "a directory"
            } else {
                "a device, FIFO or socket"
            }
        ));
    }
    let file = std::fs::File::open(path).map_err(|e| format!("cannot read it: {e}"))?;
    let mut bytes = Vec::new();
    file.take(MAX_PROVIDERS_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if bytes.len() as u64 > MAX_PROVIDERS_FILE {
        return Err(format!(
            "larger than {MAX_PROVIDERS_FILE} bytes: this is not a ladder (the built-in one is {} bytes)",
            DEFAULT_PROVIDERS_TOML.len()
        ));
    }
    String::from_utf8(bytes)
        .map_err(|e| format!("not UTF-8 text (byte {} is not)", e.utf8_error().valid_up_to()))
}

/// `broken`, unless `fixed_in` names a version at or below `version`.
fn broken_before<'a>(
    broken: &'a Option<String>,
    fixed_in: &Option<String>,
    version: (u32, u32),
) -> Option<&'a str> {
    let fixed = fixed_in.as_deref().and_then(parse_version);
    if fixed.is_some_and(|f| version >= f) {
        return None;
    }
    broken.as_deref()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomics_broken_holds_only_before_the_version_that_fixed_them() {
        let text = r#"
version = 1
[[rung]]
kind = "roce"
provider = "verbs"
endpoint = "msg"
[provider."verbs"]
atomics_broken = "operands by address"
atomics_fixed_in = "2.2"
"#;
        let cfg = LadderConfig::parse(text, "test").unwrap();
        assert_eq!(
            cfg.atomics_broken_in("verbs", (1, 17)),
            Some("operands by address")
        );
        assert_eq!(
            cfg.atomics_broken_in("verbs", (2, 1)),
            Some("operands by address")
        );
        assert_eq!(cfg.atomics_broken_in("verbs", (2, 2)), None);
        assert_eq!(cfg.atomics_broken_in("tcp", (1, 17)), None);
        let bad = text.replace("\"2.2\"", "\"soon\"");
        let e = LadderConfig::parse(&bad, "test").unwrap_err().to_string();
        assert!(e.contains("atomics_fixed_in") && e.contains("MAJOR.MINOR"), "{e}");
    }

    #[test]
    fn the_built_in_ladder_distrusts_shm_masked_receives_before_1_19() {
        let cfg = LadderConfig::default();
        let why = cfg
            .masked_receives_broken_in("shm", (1, 17))
            .expect("shm 1.17 is flagged");
        assert!(why.contains("ignore"), "{why}");
        assert!(cfg.masked_receives_broken_in("shm", (1, 18)).is_some());
        assert_eq!(cfg.masked_receives_broken_in("shm", (1, 19)), None);
        assert_eq!(cfg.masked_receives_broken_in("shm", (2, 1)), None);
        assert_eq!(cfg.masked_receives_broken_in("tcp;ofi_rxm", (1, 17)), None);
        let bad = DEFAULT_PROVIDERS_TOML.replace(
            "masked_receives_fixed_in = \"1.19\"",
            "masked_receives_fixed_in = \"next\"",
        );
        let e = LadderConfig::parse(&bad, "test").unwrap_err().to_string();
        assert!(
            e.contains("masked_receives_fixed_in") && e.contains("MAJOR.MINOR"),
            "{e}"
        );
    }

    #[test]
    fn built_in_ladder_parses_and_starts_with_rdma() {
        let cfg = LadderConfig::default();
        assert_eq!(cfg.rungs[0].kind, FabricKind::InfiniBand);
        assert_eq!(cfg.rungs[0].provider, "verbs;ofi_rxm");
        let last = cfg.rungs.last().unwrap();
        assert_eq!(last.provider, "sockets", "sockets must be the last resort");
        assert_eq!(cfg.same_host.as_ref().unwrap().provider, "shm");
    }

    /// Each of these made `set_var` panic (exit 101) before they were
    /// refused here.
    #[test]
    fn env_entries_that_cannot_be_set_are_refused_by_name() {
        for (entry, why) in [
            ("\"\" = \"1\"", "needs a name"),
            ("\"A=B\" = \"1\"", "letters, digits and `_`"),
            ("\"FI_X\" = \"a\\u0000b\"", "NUL"),
            ("\"9X\" = \"1\"", "not starting with a digit"),
        ] {
            let text = format!(
                "version = 1\n[[rung]]\nkind = \"tcp\"\nprovider = \"tcp\"\nendpoint = \"rdm\"\n\
                 [provider.tcp.env]\n{entry}\n"
            );
            let e = LadderConfig::parse(&text, "my.toml").unwrap_err().to_string();
            assert!(
                e.contains("[provider.\"tcp\".env]") && e.contains(why),
                "{entry}: {e}"
            );
        }
    }

    #[test]
    fn files_that_are_not_ladders_are_refused_before_reading_them_whole() {
        let e = LadderConfig::load(Some(Path::new("/dev/zero")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a regular file"), "{e}");
        let e = LadderConfig::load(Some(Path::new("/"))).unwrap_err().to_string();
        assert!(e.contains("a directory"), "{e}");
        let dir = std::env::temp_dir().join(format!("ladder-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = LadderConfig::load(Some(&fifo)).unwrap_err().to_string();
        assert!(e.contains("FIFO"), "a FIFO is refused, not waited on: {e}");
        let big = dir.join("big.toml");
        std::fs::write(&big, vec![b'#'; MAX_PROVIDERS_FILE as usize + 1]).unwrap();
        let e = LadderConfig::load(Some(&big)).unwrap_err().to_string();
        assert!(e.contains("larger than"), "{e}");
        // A long bad line is quoted in part, not whole.
        let long = dir.join("long.toml");
        std::fs::write(&long, format!("version = 1\nx = {}\n", "y".repeat(500_000))).unwrap();
        let e = LadderConfig::load(Some(&long)).unwrap_err().to_string();
        assert!(
            e.len() < 1000 && e.contains("line 2"),
            "{} bytes: {}",
            e.len(),
            &e[..200.min(e.len())]
        );
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn misspelt_key_names_line_and_key() {
        let text = "version = 1\n[[rung]]\nkind = \"tcp\"\nprovdier = \"tcp\"\nendpoint = \"rdm\"\n";
        let e = LadderConfig::parse(text, "my.toml").unwrap_err().to_string();
        assert!(e.starts_with("my.toml: line 4"), "{e}");
        assert!(e.contains("provdier"), "{e}");
    }

    #[test]
    fn unknown_kind_lists_the_valid_ones() {
        let text = "version = 1\n[[rung]]\nkind = \"myrinet\"\nprovider = \"mx\"\nendpoint = \"rdm\"\n";
        let e = LadderConfig::parse(text, "x.toml").unwrap_err().to_string();
        assert!(
            e.contains("line 3") && e.contains("myrinet") && e.contains("infiniband"),
            "{e}"
        );
    }

    #[test]
    fn wrong_version_and_empty_ladder_are_errors() {
        let e = LadderConfig::parse(
            "version = 2\n[[rung]]\nkind=\"tcp\"\nprovider=\"tcp\"\nendpoint=\"msg\"\n",
            "v",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("`version`"), "{e}");
        let e = LadderConfig::parse("version = 1\nrung = []\n", "v")
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least one"), "{e}");
    }

    #[test]
    fn provider_env_settings_are_read() {
        let text = "version = 1\n[[rung]]\nkind=\"tcp\"\nprovider=\"tcp\"\nendpoint=\"msg\"\n\
                    [provider.\"tcp;ofi_rxm\".env]\nFI_OFI_RXM_USE_SRX = \"1\"\n";
        let cfg = LadderConfig::parse(text, "t").unwrap();
        let env: Vec<_> = cfg.env_for("tcp;ofi_rxm").collect();
        assert_eq!(env, [(&"FI_OFI_RXM_USE_SRX".to_string(), &"1".to_string())]);
        assert_eq!(cfg.env_for("tcp").count(), 0);
    }

    #[test]
    fn missing_file_says_which() {
        let e = LadderConfig::load(Some(Path::new("/nonexistent/providers.toml")))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("/nonexistent/providers.toml: cannot read it"),
            "{e}"
        );
    }
}
