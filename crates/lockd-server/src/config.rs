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
//! max_sessions = 2000
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
    /// Live sessions the namespace may hold at once, cluster-wide (0 = unlimited: only the
    /// cluster's 250,000).
    #[serde(default)]
    pub max_sessions: u32,
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

/// The digest of a bearer token that the meta group stores (never the token): `s1$SALT$HASH`,
/// HASH the SHA-256 of a fresh random 16-byte SALT followed by the token, both lower-case hex.
/// The salt makes two namespaces with the same token store different digests, and a leaked
/// backup useless against a table of precomputed hashes. [`token_matches`] checks a token.
pub fn token_digest(token: &str) -> String {
    let salt: [u8; 16] = rand::random();
    let salt = hex(&salt);
    let hash = salted_sha256(&salt, token);
    format!("{}{salt}${hash}", lockd_core::SALTED_DIGEST_PREFIX)
}

/// Whether `token` is the one `digest` was made from: a salted digest ([`token_digest`]) or a
/// plain SHA-256 one, as versions before salting stored.
pub fn token_matches(digest: &str, token: &str) -> bool {
    use sha2::Digest;
    match digest
        .strip_prefix(lockd_core::SALTED_DIGEST_PREFIX)
        .and_then(|rest| rest.split_once('$'))
    {
        Some((salt, hash)) => salted_sha256(salt, token) == hash,
        None => hex(&sha2::Sha256::digest(token.as_bytes())) == digest,
    }
}

fn salted_sha256(salt_hex: &str, token: &str) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(salt_hex.as_bytes());
    h.update(token.as_bytes());
    hex(&h.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
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
            max_sessions: self.max_sessions,
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
            max_sessions = 300
            "#,
        )
        .unwrap();
        let specs = cfg.namespaces().unwrap();
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[0], Namespace::default_namespace());
        assert_eq!(specs[1].lock_delay_ms, 10_000);
        assert_eq!(specs[1].max_ttl_ms, 60_000);
        assert_eq!(specs[1].ops_per_s, 100);
        assert_eq!(specs[1].max_sessions, 300);
        let digest = specs[1].token_sha256.as_deref().unwrap();
        assert!(token_matches(digest, "payouts-token"), "{digest}");
        assert!(!token_matches(digest, "payouts-token2"));
    }

    #[test]
    fn token_digests_are_salted_and_plain_ones_still_match() {
        let (a, b) = (token_digest("abc"), token_digest("abc"));
        assert_ne!(a, b, "a fresh salt each time");
        for d in [&a, &b] {
            assert!(d.starts_with("s1$") && d.len() == 3 + 32 + 1 + 64, "{d}");
            assert!(token_matches(d, "abc"));
            assert!(!token_matches(d, "abd") && !token_matches(d, ""));
            lockd_core::validate_namespace(&Namespace {
                token_sha256: Some(d.clone()),
                ..Namespace::default_namespace()
            })
            .unwrap();
        }
        // A known SHA-256 vector: the plain digests that earlier versions stored.
        let plain = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert!(token_matches(plain, "abc"));
        assert!(!token_matches(plain, "abd"));
        // A digest is never the token: neither form matches its own text.
        assert!(!token_matches(&a, &a) && !token_matches(plain, plain));

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
