//! Namespaces have one source of truth: the meta group. The admin changes them with a versioned
//! compare-and-set (`Op::ChangeNamespace`); a node's config file only seeds a brand-new cluster
//! (`Op::SeedNamespaces`, a no-op once the namespaces were ever set), so a stale file on a
//! restarted node can no longer drop a token or loosen a limit.
//!
//! Every lock group keeps a copy (its commands check TTL bounds, waiter and lock limits, and the
//! lock-delay at apply). The copy follows the meta group's: the admin call pushes the change at
//! once, and the meta leader compares every lock group's copy with its own every
//! [`SYNC_EVERY`] and puts or deletes what differs, so a push cut short by a crash heals.

use std::collections::BTreeMap;
use std::time::Duration;

use lockd_core::{Namespace, NamespaceChange, Op, Reply};
use lockd_raft::META_GROUP;

use crate::ask::{answer_of, Query};
use crate::error::{ApiError, ErrorCode};
use crate::service::{Credentials, Service};

/// How often the meta leader brings the lock groups' copies in line.
pub const SYNC_EVERY: Duration = Duration::from_secs(2);

impl Service {
    /// The namespaces and their version, as the meta leader has them (a linearizable read).
    pub async fn namespace_config(
        &self,
        creds: &Credentials,
    ) -> Result<(u64, Vec<Namespace>), ApiError> {
        self.require_admin(creds, "listing namespaces")?;
        let meta = self.route_of(META_GROUP)?;
        answer_of!(self, &meta, Query::NamespaceConfig, NamespaceConfig)
    }

    /// Applies `change` if the namespaces are still at `expected_version`; returns the new
    /// version. The lock groups' copies follow before the call returns (or, if that is cut
    /// short, within [`SYNC_EVERY`]).
    pub async fn change_namespace(
        &self,
        creds: &Credentials,
        expected_version: u64,
        change: NamespaceChange,
    ) -> Result<u64, ApiError> {
        self.require_admin(creds, "changing namespaces")?;
        let meta = self.route_of(META_GROUP)?;
        let op = Op::ChangeNamespace {
            expected_version,
            change,
        };
        let version = match self.propose(&meta, op).await? {
            Reply::NamespacesAt { version, .. } => version,
            other => return Err(ApiError::unexpected("a namespace change", Some(&other))),
        };
        if let Err(e) = self.sync_namespaces().await {
            tracing::warn!(error = %e, "namespace change made; the lock groups follow shortly");
        }
        Ok(version)
    }

    /// The config file's namespaces, for a brand-new cluster only: the meta group takes them if
    /// its namespaces were never set, else keeps its own (and this says so if they differ).
    pub(crate) async fn seed_namespaces(&self, file: &[Namespace]) -> Result<(), ApiError> {
        let meta = self.route_of(META_GROUP)?;
        let op = Op::seed_namespaces(file.to_vec());
        if let Reply::NamespacesAt {
            changed: false,
            version,
        } = self.propose(&meta, op).await?
        {
            let (_, current) = answer_of!(self, &meta, Query::NamespaceConfig, NamespaceConfig)?;
            let by_prefix = |v: &[Namespace]| -> BTreeMap<String, Namespace> {
                v.iter().map(|n| (n.prefix.clone(), n.clone())).collect()
            };
            if by_prefix(&current) != by_prefix(file) {
                tracing::warn!(
                    version,
                    "the config file's namespaces differ from the cluster's; the cluster's stand \
                     (the file only seeds a new cluster): change them with `lockctl namespace`"
                );
            }
        }
        Ok(())
    }

    /// Makes every lock group's namespaces equal to the meta group's: puts what is missing or
    /// different, deletes what meta no longer has. Idempotent.
    pub(crate) async fn sync_namespaces(&self) -> Result<(), ApiError> {
        let meta = self.route_of(META_GROUP)?;
        let (_, want) = answer_of!(self, &meta, Query::NamespaceConfig, NamespaceConfig)?;
        for g in self.lock_group_ids() {
            let group = self.route_of(g)?;
            let have = answer_of!(self, &group, Query::Namespaces, Namespaces)?;
            for ns in &want {
                if !have.contains(ns) {
                    self.propose(&group, Op::put_namespace(ns.clone())).await?;
                }
            }
            for ns in &have {
                if !want.iter().any(|w| w.prefix == ns.prefix) {
                    let op = Op::DeleteNamespace {
                        prefix: ns.prefix.clone(),
                    };
                    self.propose(&group, op).await?;
                }
            }
        }
        Ok(())
    }
}

/// While this node leads the meta group, brings the lock groups' namespaces in line with it
/// every [`SYNC_EVERY`].
pub async fn sync_loop(svc: std::sync::Arc<Service>) {
    loop {
        tokio::time::sleep(SYNC_EVERY).await;
        let leads_meta = svc
            .node
            .group(META_GROUP)
            .is_some_and(|g| g.status().is_leader);
        if leads_meta {
            if let Err(e) = svc.sync_namespaces().await {
                tracing::debug!(error = %e, "the lock groups' namespaces are not in line yet");
            }
        }
    }
}

/// What a put does to the namespace's bearer token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenChange {
    /// A replaced namespace keeps its token; a new one has none.
    Keep,
    /// Callers must present this token from now on (only its digest is kept).
    Set(String),
    /// The namespace is open from now on.
    Clear,
}

impl TokenChange {
    /// From the API's two fields; both at once is refused.
    pub fn from_fields(bearer_token: Option<String>, clear_token: bool) -> Result<Self, ApiError> {
        match (bearer_token, clear_token) {
            (Some(_), true) => Err(ApiError::bad_request(
                "bearer_token and clear_token: give one or neither",
            )),
            (Some(t), false) => {
                if !(8..=256).contains(&t.len()) || !t.bytes().all(|b| b.is_ascii_graphic()) {
                    return Err(ApiError::bad_request(format!(
                        "bearer_token: must be 8-256 printable ASCII characters without spaces \
                         (got {} bytes)",
                        t.len()
                    )));
                }
                Ok(TokenChange::Set(t))
            }
            (None, true) => Ok(TokenChange::Clear),
            (None, false) => Ok(TokenChange::Keep),
        }
    }
}

/// A namespace as the admin API shows it: every setting, and whether a token is required
/// (never the token or its digest).
pub fn spec_of(ns: &Namespace) -> lockd_proto::v1::NamespaceSpec {
    let (safety, fenced_resource) = match &ns.safety {
        lockd_core::SafetyClass::Efficiency => ("efficiency", String::new()),
        lockd_core::SafetyClass::Correctness { fenced_resource } => {
            ("correctness", fenced_resource.clone())
        }
    };
    lockd_proto::v1::NamespaceSpec {
        name: ns.name.clone(),
        prefix: ns.prefix.clone(),
        min_ttl_ms: ns.min_ttl_ms,
        max_ttl_ms: ns.max_ttl_ms,
        default_ttl_ms: ns.default_ttl_ms,
        max_waiters_per_name: ns.max_waiters_per_name,
        max_locks_per_session: ns.max_locks_per_session,
        lock_delay_ms: ns.lock_delay_ms,
        ops_per_s: ns.ops_per_s,
        max_sessions: ns.max_sessions,
        safety: safety.into(),
        fenced_resource,
        token_required: ns.token_sha256.is_some(),
    }
}

/// The namespace a put asks for: zero limits take the built-in defaults, the token follows
/// `token` (`current`: the namespace of that prefix now). Every rule of the core is checked
/// here, so a bad put is a 400 naming the field before anything is proposed.
pub fn namespace_of(
    spec: lockd_proto::v1::NamespaceSpec,
    token: &TokenChange,
    current: Option<&Namespace>,
) -> Result<Namespace, ApiError> {
    let d = Namespace::default_namespace();
    let or = |v: u64, default: u64| if v == 0 { default } else { v };
    let safety = match spec.safety.as_str() {
        "" | "efficiency" if spec.fenced_resource.is_empty() => lockd_core::SafetyClass::Efficiency,
        "" | "efficiency" => {
            return Err(ApiError::bad_request(
                "fenced_resource: only a correctness namespace names a fenced resource",
            ))
        }
        "correctness" if spec.fenced_resource.trim().is_empty() => {
            return Err(ApiError::bad_request(
                "fenced_resource: a correctness namespace must name the resource that checks \
                 fencing tokens, and how",
            ))
        }
        "correctness" => lockd_core::SafetyClass::Correctness {
            fenced_resource: spec.fenced_resource,
        },
        other => {
            return Err(ApiError::bad_request(format!(
                "safety: 'efficiency' or 'correctness', not '{other}'"
            )))
        }
    };
    let token_sha256 = match token {
        TokenChange::Keep => current.and_then(|c| c.token_sha256.clone()),
        TokenChange::Set(t) => Some(crate::config::token_digest(t)),
        TokenChange::Clear => None,
    };
    let ns = Namespace {
        name: spec.name,
        prefix: spec.prefix,
        min_ttl_ms: or(spec.min_ttl_ms, d.min_ttl_ms),
        max_ttl_ms: or(spec.max_ttl_ms, d.max_ttl_ms),
        default_ttl_ms: or(spec.default_ttl_ms, d.default_ttl_ms),
        max_waiters_per_name: if spec.max_waiters_per_name == 0 {
            d.max_waiters_per_name
        } else {
            spec.max_waiters_per_name
        },
        max_locks_per_session: if spec.max_locks_per_session == 0 {
            d.max_locks_per_session
        } else {
            spec.max_locks_per_session
        },
        lock_delay_ms: spec.lock_delay_ms,
        safety,
        ops_per_s: spec.ops_per_s,
        token_sha256,
        max_sessions: spec.max_sessions,
    };
    lockd_core::validate_namespace(&ns).map_err(ApiError::from)?;
    Ok(ns)
}

/// A new namespace's name: 1-64 of `A-Z a-z 0-9 . _ -`, like a cluster's name (it appears in
/// metrics labels and logs). Only the front door checks it: namespaces made before the rule
/// still replay.
fn check_namespace_name(name: &str) -> Result<(), ApiError> {
    let ok = (1..=lockd_core::limits::MAX_NAMESPACE_NAME_BYTES).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        return Ok(());
    }
    Err(ApiError::bad_request(format!(
        "namespace.name: '{}' must be 1-64 of A-Z a-z 0-9 . _ -",
        name.escape_debug()
    )))
}

impl Service {
    /// Creates or replaces the namespace `spec` describes (see [`namespace_of`]) if the
    /// namespaces are still at `expected_version`.
    pub async fn put_namespace(
        &self,
        creds: &Credentials,
        expected_version: u64,
        spec: lockd_proto::v1::NamespaceSpec,
        token: TokenChange,
    ) -> Result<u64, ApiError> {
        self.require_admin(creds, "changing namespaces")?;
        check_namespace_name(&spec.name)?;
        let (_, all) = self.namespace_config(creds).await?;
        if let Some(other) = all
            .iter()
            .find(|n| n.name == spec.name && n.prefix != spec.prefix)
        {
            return Err(ApiError::new(
                ErrorCode::NamespaceNameTaken,
                format!(
                    "namespace.name: '{}' is already the name of prefix '{}'",
                    spec.name, other.prefix
                ),
            ));
        }
        let current = all.iter().find(|n| n.prefix == spec.prefix);
        let ns = namespace_of(spec, &token, current)?;
        self.change_namespace(creds, expected_version, NamespaceChange::put(ns))
            .await
    }

    /// Deletes the namespace `name` if the namespaces are still at `expected_version`.
    pub async fn delete_namespace(
        &self,
        creds: &Credentials,
        expected_version: u64,
        name: &str,
    ) -> Result<u64, ApiError> {
        self.require_admin(creds, "changing namespaces")?;
        let (_, all) = self.namespace_config(creds).await?;
        let Some(ns) = all.iter().find(|n| n.name == name) else {
            return Err(ApiError::new(
                ErrorCode::NamespaceNotFound,
                format!("name: namespace '{name}' does not exist"),
            ));
        };
        let prefix = ns.prefix.clone();
        self.change_namespace(creds, expected_version, NamespaceChange::Delete { prefix })
            .await
    }
}
