//! Fencing: the storage side of a lock. A lease can run out under a paused process; the store
//! refuses writes carrying a token older than one it has seen, so a stale holder cannot clobber
//! the newer holder's work.
//!
//! The rule, in SQL (see `examples/fenced_postgres.rs`):
//!
//! ```sql
//! UPDATE accounts SET balance = $1, fence = $token
//!  WHERE id = $2 AND fence <= $token;
//! -- 0 rows: a newer holder exists, stop.
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;

use crate::LockGuard;

#[cfg(feature = "http")]
pub mod http;
#[cfg(feature = "postgres")]
pub mod postgres;

/// Storage that applies a write only if the write's fencing token is at least the largest one
/// it has accepted for the key (and then remembers the new token), in one atomic step.
pub trait FencedStore {
    /// The store's own error.
    type Error;

    /// Writes `value` under `key` if `token` ≥ the key's fence; `Ok(false)` if a newer holder's
    /// token is already there (nothing written).
    fn write_fenced(
        &self,
        key: &str,
        value: &str,
        token: u64,
    ) -> impl Future<Output = Result<bool, Self::Error>> + Send;
}

/// Why a fenced write did not happen.
#[derive(Debug, thiserror::Error)]
pub enum FenceError<E> {
    /// The guard's lease is lost: the write was not attempted.
    #[error("the lock is lost; not writing")]
    Lost,
    /// The store has seen a newer token: another holder took over. Stop working.
    #[error("a newer holder exists (the store has a larger fencing token)")]
    Superseded,
    /// The store failed.
    #[error("store error: {0}")]
    Store(E),
}

/// Writes through `store` fenced by `guard`'s token: refuses locally once the guard is lost,
/// and maps "0 rows" to [`FenceError::Superseded`], which it also reports to the service
/// ([`Client::report_fencing_rejected`](crate::Client::report_fencing_rejected)).
pub async fn write_fenced<S: FencedStore>(
    store: &S,
    guard: &LockGuard,
    key: &str,
    value: &str,
) -> Result<(), FenceError<S::Error>> {
    if guard.is_lost() {
        return Err(FenceError::Lost);
    }
    match store.write_fenced(key, value, guard.token()).await {
        Ok(true) => Ok(()),
        Ok(false) => {
            // In the background: the caller must stop now, not after the report's retries.
            guard.report_fencing_rejected_in_background();
            Err(FenceError::Superseded)
        }
        Err(e) => Err(FenceError::Store(e)),
    }
}

/// An in-memory [`FencedStore`]: `key → (fence, value)`. For tests and examples.
#[derive(Debug, Default)]
pub struct MemoryStore {
    rows: Mutex<HashMap<String, (u64, String)>>,
}

impl MemoryStore {
    /// The value and fence stored under `key`.
    pub fn get(&self, key: &str) -> Option<(u64, String)> {
        self.rows.lock().expect("store lock").get(key).cloned()
    }

    /// The write itself, synchronously: what `UPDATE ... WHERE fence <= $token` does.
    pub fn put(&self, key: &str, value: &str, token: u64) -> bool {
        let mut rows = self.rows.lock().expect("store lock");
        let row = rows.entry(key.to_string()).or_insert((0, String::new()));
        if row.0 > token {
            return false;
        }
        *row = (token, value.to_string());
        true
    }
}

impl FencedStore for MemoryStore {
    type Error = std::convert::Infallible;

    async fn write_fenced(&self, key: &str, value: &str, token: u64) -> Result<bool, Self::Error> {
        Ok(self.put(key, value, token))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_token_is_refused_after_a_newer_one() {
        let s = MemoryStore::default();
        assert!(s.put("acct/1", "100", 7));
        assert!(s.put("acct/1", "110", 7), "the same holder may write again");
        assert!(s.put("acct/1", "120", 9));
        assert!(!s.put("acct/1", "stale", 8));
        assert_eq!(s.get("acct/1"), Some((9, "120".into())));
    }
}
