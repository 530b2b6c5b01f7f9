//! Fencing for PostgreSQL (cargo feature `postgres`): one fence row per protected resource,
//! checked and raised inside the caller's own transaction.
//!
//! The application's tables need no fence column. Every transaction that writes under a lock
//! first calls [`fence`] with the lock's token and a resource name (often the lock's name):
//!
//! ```sql
//! INSERT INTO lockd_fences (resource, token) VALUES ($1, $2)
//! ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token
//!  WHERE lockd_fences.token <= EXCLUDED.token
//! RETURNING token;
//! -- no row: a newer holder has fenced this resource; roll back.
//! ```
//!
//! Why it is safe: the upsert locks the resource's fence row until the transaction ends. A
//! holder's writes commit only together with its fence; a newer holder's fence waits for that
//! commit, then raises the token; an older holder's fence after that finds a larger token and
//! returns no row, so its transaction rolls back and writes nothing. A holder that paused past
//! its lease can therefore never commit after its successor has written. The fence must be the
//! first statement that touches the protected data in the transaction (the row lock taken before
//! any write is what orders holders).
//!
//! ```no_run
//! # async fn demo(db: &mut tokio_postgres::Client, guard: &lockd_client::LockGuard)
//! # -> Result<(), Box<dyn std::error::Error>> {
//! use lockd_client::fence::postgres::{fence, Superseded};
//! let tx = db.transaction().await?;
//! match fence(&tx, guard.name(), guard.token()).await? {
//!     Ok(()) => {}
//!     Err(Superseded { newer }) => return Err(format!("a newer holder ({newer}) took over").into()),
//! }
//! tx.execute("UPDATE payouts SET state = 'paid' WHERE batch = $1", &[&48213i64]).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```

use tokio_postgres::GenericClient;

/// The fence table's name.
pub const TABLE: &str = "lockd_fences";

/// Creates the fence table if it does not exist: `resource text PRIMARY KEY, token bigint`.
pub async fn ensure_schema<C: GenericClient>(client: &C) -> Result<(), tokio_postgres::Error> {
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS lockd_fences (
                 resource text PRIMARY KEY,
                 token bigint NOT NULL CHECK (token >= 0)
             )",
        )
        .await
}

/// A newer holder has fenced the resource: roll back and stop working.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a newer holder has fenced this resource (its token is {newer})")]
pub struct Superseded {
    /// The token the resource is fenced with now.
    pub newer: u64,
}

/// Why a fence could not be checked at all.
#[derive(Debug, thiserror::Error)]
pub enum FenceDbError {
    /// The database failed (the transaction should be rolled back).
    #[error("database: {0}")]
    Db(#[from] tokio_postgres::Error),
    /// The token does not fit PostgreSQL's `bigint` (above 2^63 - 1).
    #[error("fencing token {0} does not fit a bigint")]
    TokenTooLarge(u64),
}

/// In the caller's transaction: raises `resource`'s fence to `token`, or reports the newer token
/// that is already there. Equal tokens pass (the same holder writes again). Call it before the
/// transaction's first write to the protected data, and roll back on `Err(Superseded)`.
pub async fn fence<C: GenericClient>(
    tx: &C,
    resource: &str,
    token: u64,
) -> Result<Result<(), Superseded>, FenceDbError> {
    let t = i64::try_from(token).map_err(|_| FenceDbError::TokenTooLarge(token))?;
    let raised = tx
        .query_opt(
            "INSERT INTO lockd_fences (resource, token) VALUES ($1, $2)
             ON CONFLICT (resource) DO UPDATE SET token = EXCLUDED.token
              WHERE lockd_fences.token <= EXCLUDED.token
             RETURNING token",
            &[&resource, &t],
        )
        .await?;
    if raised.is_some() {
        return Ok(Ok(()));
    }
    // Not raised: the row exists with a larger token (and this transaction holds no lock on it
    // now; reading it is for the message only).
    let newer: i64 = tx
        .query_one(
            "SELECT token FROM lockd_fences WHERE resource = $1",
            &[&resource],
        )
        .await?
        .get(0);
    Ok(Err(Superseded {
        newer: u64::try_from(newer).unwrap_or(0),
    }))
}

/// The token `resource` is fenced with, if any.
pub async fn current<C: GenericClient>(
    client: &C,
    resource: &str,
) -> Result<Option<u64>, tokio_postgres::Error> {
    Ok(client
        .query_opt(
            "SELECT token FROM lockd_fences WHERE resource = $1",
            &[&resource],
        )
        .await?
        .map(|r| u64::try_from(r.get::<_, i64>(0)).unwrap_or(0)))
}
