//! Namespaces as operators write them (TOML), split into what the replicated core enforces and
//! what this node enforces (ops/s budget, bearer token).
//!
//! ```toml
//! [[namespace]]
//! name = "payouts"
//! prefix = "payouts/"
//! max_ttl_ms = 30000
//! lock_delay_ms = 10000
//! ops_per_s = 5000
//! safety = "correctness"
//! fenced_resource = "payouts DB: UPDATE ... WHERE fence <= $token"
//! token = "s3cret-payouts"
//! ```

use std::path::Path;

use lockd_core::{limits, validate_namespace, Namespace, SafetyClass};
use serde::Deserialize;

/// The file: a list of namespaces. A `default` entry (prefix "") overrides the built-in default.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default, rename = "namespace")]
    pub namespaces: Vec<NamespaceConfig>,
    /// The node's settings (`cli::config_file_env` reads them before the flags are parsed).
    #[serde(default)]
    pub server: Option<toml::Table>,
}

/// One namespace. Every limit has the default of the built-in `default` namespace.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NamespaceConfig {
    pub name: String,
    #[serde(default)]
    pub prefix: String,
    #[serde(default = "d_min_ttl")]
    pub min_ttl_ms: u64,
    #[serde(default = "d_max_ttl")]
    pub max_ttl_ms: u64,
    #[serde(default = "d_ttl")]
    pub default_ttl_ms: u64,
    #[serde(default = "d_waiters")]
    pub max_waiters_per_name: u32,
    #[serde(default = "d_locks")]
    pub max_locks_per_session: u32,
    #[serde(default)]
    pub lock_delay_ms: u64,
    /// Requests per second this node accepts for the namespace's names (0 = unlimited).
    #[serde(default)]
    pub ops_per_s: u32,
    /// `efficiency` (default) or `correctness`.
    #[serde(default = "d_safety")]
    pub safety: String,
    /// Required for `correctness`: the resource that checks fencing tokens, and how.
    #[serde(default)]
    pub fenced_resource: Option<String>,
    /// Bearer token callers must present for this namespace's names (none = open).
    #[serde(default)]
    pub token: Option<String>,
}

fn d_min_ttl() -> u64 {
    limits::DEFAULT_MIN_TTL_MS
}
fn d_max_ttl() -> u64 {
    limits::DEFAULT_MAX_TTL_MS
}
fn d_ttl() -> u64 {
    limits::DEFAULT_TTL_MS
}
fn d_waiters() -> u32 {
    limits::DEFAULT_MAX_WAITERS_PER_NAME
}
fn d_locks() -> u32 {
    limits::DEFAULT_MAX_LOCKS_PER_SESSION
}
fn d_safety() -> String {
    "efficiency".into()
}

/// SHA-256 of a bearer token, lower-case hex: what the meta group stores and requests are checked
/// against.
pub fn token_digest(token: &str) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(token.as_bytes()))
}

impl NamespaceConfig {
    fn into_namespace(self) -> Result<Namespace, String> {
        let safety = match self.safety.as_str() {
            "efficiency" => SafetyClass::Efficiency,
            "correctness" => SafetyClass::Correctness {
                fenced_resource: self.fenced_resource.clone().ok_or_else(|| {
                    format!(
                        "namespace '{}': correctness needs fenced_resource",
                        self.name
                    )
                })?,
            },
            other => {
                return Err(format!(
                    "namespace '{}': safety must be 'efficiency' or 'correctness', not '{other}'",
                    self.name
                ))
            }
        };
        let core = Namespace {
            name: self.name.clone(),
            prefix: self.prefix,
            min_ttl_ms: self.min_ttl_ms,
            max_ttl_ms: self.max_ttl_ms,
            default_ttl_ms: self.default_ttl_ms,
            max_waiters_per_name: self.max_waiters_per_name,
            max_locks_per_session: self.max_locks_per_session,
            lock_delay_ms: self.lock_delay_ms,
            safety,
            ops_per_s: self.ops_per_s,
            token_sha256: self.token.as_deref().map(token_digest),
        };
        if let Some(t) = &self.token {
            if t.len() < 8 {
                return Err(format!(
                    "namespace '{}': token must be at least 8 bytes",
                    self.name
                ));
            }
        }
        validate_namespace(&core).map_err(|e| format!("namespace '{}': {e}", self.name))?;
        Ok(core)
    }
}

impl FileConfig {
    pub fn load(path: &Path) -> Result<FileConfig, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Every namespace, the default one first (built in unless the file overrides it).
    pub fn namespaces(&self) -> Result<Vec<Namespace>, String> {
        let mut specs = Vec::new();
        if !self.namespaces.iter().any(|n| n.prefix.is_empty()) {
            specs.push(Namespace::default_namespace());
        }
        for n in &self.namespaces {
            specs.push(n.clone().into_namespace()?);
        }
        specs.sort_by(|a, b| a.prefix.cmp(&b.prefix));
        for w in specs.windows(2) {
            if w[0].prefix == w[1].prefix {
                return Err(format!("two namespaces share prefix '{}'", w[0].prefix));
            }
        }
        let mut names: Vec<_> = specs.iter().map(|n| &n.name).collect();
        names.sort();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("two namespaces share name '{}'", w[0]));
        }
        Ok(specs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_namespaces_with_defaults_and_rejects_bad_ones() {
        let cfg: FileConfig = toml::from_str(
            r#"
            [[namespace]]
            name = "payouts"
            prefix = "payouts/"
            lock_delay_ms = 10000
            safety = "correctness"
            fenced_resource = "payouts DB fence column"
            token = "payouts-token"
            ops_per_s = 100
            "#,
        )
        .unwrap();
        let specs = cfg.namespaces().unwrap();
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[0], Namespace::default_namespace());
        assert_eq!(specs[1].lock_delay_ms, 10_000);
        assert_eq!(specs[1].max_ttl_ms, 60_000);
        assert_eq!(specs[1].ops_per_s, 100);
        assert_eq!(
            specs[1].token_sha256.as_deref(),
            Some(token_digest("payouts-token").as_str())
        );
        // A known SHA-256 vector.
        assert_eq!(
            token_digest("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );

        let bad: FileConfig = toml::from_str(
            "[[namespace]]\nname = \"p\"\nprefix = \"p/\"\nsafety = \"correctness\"\n",
        )
        .unwrap();
        assert!(bad.namespaces().unwrap_err().contains("fenced_resource"));
        let bad: FileConfig =
            toml::from_str("[[namespace]]\nname = \"p\"\nprefix = \"p\"\n").unwrap();
        assert!(bad.namespaces().unwrap_err().contains("must end with '/'"));
        assert!(toml::from_str::<FileConfig>("[[namespace]]\nname = \"p\"\nttl = 1\n").is_err());
    }
}
