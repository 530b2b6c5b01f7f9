//! What tests of lockd-client and lockctl share: the test namespaces, client options, polling.

use std::time::Duration;

use lockd_client::ClientOptions;

/// Names under `fast/` may have leases of 1–15 s (the default namespace needs ≥ 5 s).
pub const NAMESPACES: &str = r#"
[[namespace]]
name = "fast"
prefix = "fast/"
min_ttl_ms = 1000
default_ttl_ms = 3000
max_ttl_ms = 15000
"#;

/// Options for test clients: namespace `fast`, the given TTL.
pub fn options(ttl: Duration) -> ClientOptions {
    ClientOptions {
        client_name: "test".into(),
        ttl,
        namespace: "fast".into(),
        ..Default::default()
    }
}

/// Options that fail fast (for probes).
pub fn quick() -> ClientOptions {
    ClientOptions {
        request_timeout: Duration::from_millis(500),
        retry: lockd_client::RetryPolicy {
            max_attempts: 1,
            ..Default::default()
        },
        ..options(Duration::from_secs(3))
    }
}

/// Polls `f` every 20 ms until it is true or `limit` passes.
pub async fn eventually<F, Fut>(limit: Duration, what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + limit;
    while !f().await {
        assert!(
            tokio::time::Instant::now() < end,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Cluster tests of one test binary run one at a time under `cargo test` (threads); under
/// nextest each test is its own process and the `clusters` test group serialises them.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
