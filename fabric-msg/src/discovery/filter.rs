//! Provider restrictions: `FI_PROVIDER` in libfabric's syntax, or the
//! application's own choice of provider.

/// A provider restriction: `FI_PROVIDER` (libfabric's syntax: a comma list,
/// `^` in front to exclude) or the application's `provider`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderFilter {
    /// Where it came from, e.g. `FI_PROVIDER=tcp`.
    pub origin: String,
    names: Vec<String>,
    exclude: bool,
    /// A listed core provider admits its layered forms.
    layered: bool,
}

impl ProviderFilter {
    /// Parse `FI_PROVIDER`'s value.
    pub fn from_fi_provider(value: &str) -> Self {
        let (exclude, list) = match value.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, value),
        };
        ProviderFilter {
            origin: format!("FI_PROVIDER={value}"),
            names: list
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect(),
            exclude,
            layered: true,
        }
    }

    /// Exactly one provider, as `fabric_info -p` asks.
    pub fn exactly(name: &str) -> Self {
        ProviderFilter {
            origin: format!("-p {name}"),
            names: vec![name.to_string()],
            exclude: false,
            layered: false,
        }
    }

    /// One provider as libfabric's hints and fabtests' `-p` match it: a
    /// core provider admits its layered forms (`tcp` admits `tcp;ofi_rxm`).
    pub fn like_libfabric(name: &str) -> Self {
        ProviderFilter {
            layered: true,
            ..ProviderFilter::exactly(name)
        }
    }

    /// Whether the provider `name` (e.g. `tcp;ofi_rxm`) passes. Like
    /// libfabric, a listed core provider admits its layered forms
    /// (`FI_PROVIDER=tcp` admits `tcp;ofi_rxm`) unless the filter came from
    /// [`ProviderFilter::exactly`].
    pub fn allows(&self, name: &str) -> bool {
        let core = name.split(';').next().unwrap_or(name);
        let listed = self
            .names
            .iter()
            .any(|n| n == name || (self.layered && n == core));
        listed != self.exclude
    }
}
