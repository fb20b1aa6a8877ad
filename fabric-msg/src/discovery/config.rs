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
                let text = std::fs::read_to_string(&p).map_err(|e| Error::Config {
                    source_name: p.display().to_string(),
                    message: format!(
                        "cannot read it: {e}{}",
                        if path.is_none() {
                            format!(" (named by {PROVIDERS_ENV})")
                        } else {
                            String::new()
                        }
                    ),
                })?;
                Self::parse(&text, &p.display().to_string())
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
        for name in self.providers.keys() {
            if name.trim().is_empty() {
                return Err(err("a [provider.\"...\"] table has an empty name".into()));
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
        self.providers
            .get(provider)
            .and_then(|s| s.atomics_broken.as_deref())
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
    let msg = e.message().trim().to_string();
    match e.span() {
        Some(span) => {
            let line_no = text[..span.start.min(text.len())].matches('\n').count() + 1;
            let line = text.lines().nth(line_no - 1).unwrap_or("").trim();
            format!("line {line_no} (`{line}`): {msg}")
        }
        None => msg,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_ladder_parses_and_starts_with_rdma() {
        let cfg = LadderConfig::default();
        assert_eq!(cfg.rungs[0].kind, FabricKind::InfiniBand);
        assert_eq!(cfg.rungs[0].provider, "verbs;ofi_rxm");
        let last = cfg.rungs.last().unwrap();
        assert_eq!(last.provider, "sockets", "sockets must be the last resort");
        assert_eq!(cfg.same_host.as_ref().unwrap().provider, "shm");
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
