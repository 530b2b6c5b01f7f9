//! Read-write locks and counting semaphores: the lock modes under names that say what they are.

use crate::{AcquireBuilder, Client, Mode};

/// A read-write lock on one name: any number of readers, or one writer.
///
/// Each side is an ordinary acquire ([`AcquireBuilder`]): try once by default, `.wait(d)` to
/// queue, `.owner(..)` to name the holder; every grant has its own fencing token. Readers and
/// writers share the name's FIFO queue: a reader that arrives after a waiting writer waits
/// behind it, so writers are not starved.
///
/// ```no_run
/// # use std::time::Duration;
/// # async fn f(client: lockd_client::Client) -> Result<(), lockd_client::Error> {
/// let index = client.rwlock("search/shard-17");
/// let reading = index.read().wait(Duration::from_secs(5)).await?;
/// // ... serve queries from the shard ...
/// reading.release().await?;
/// let rebuilding = index.write().wait(Duration::from_secs(60)).await?;
/// // ... rebuild, fencing every write with rebuilding.token() ...
/// rebuilding.release().await
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct RwLock {
    client: Client,
    name: String,
}

/// A counting semaphore on one name: up to `permits` holders at once, each with its own token.
///
/// Every user of a name must agree on `permits`: the service refuses an acquire whose count
/// differs from the holders' (`mode_conflict`, 409) rather than guess which one is meant.
#[derive(Clone, Debug)]
pub struct Semaphore {
    client: Client,
    name: String,
    permits: u32,
}

impl Client {
    /// A read-write lock on `name`.
    pub fn rwlock(&self, name: impl Into<String>) -> RwLock {
        RwLock {
            client: self.clone(),
            name: name.into(),
        }
    }

    /// A semaphore of `permits` (1..=10 000) on `name`. A count out of range is refused by the
    /// service when acquiring, naming the field and the limit.
    pub fn semaphore(&self, name: impl Into<String>, permits: u32) -> Semaphore {
        Semaphore {
            client: self.clone(),
            name: name.into(),
            permits,
        }
    }
}

impl RwLock {
    /// A shared hold: granted beside other readers, never beside a writer.
    pub fn read(&self) -> AcquireBuilder {
        self.client.acquire(self.name.clone()).mode(Mode::Shared)
    }

    /// An exclusive hold: granted when nobody else holds the name.
    pub fn write(&self) -> AcquireBuilder {
        self.client.acquire(self.name.clone()).mode(Mode::Exclusive)
    }

    /// The name the lock lives on.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Semaphore {
    /// One permit.
    pub fn acquire(&self) -> AcquireBuilder {
        self.client
            .acquire(self.name.clone())
            .mode(Mode::Semaphore(self.permits))
    }

    /// How many holders the semaphore admits.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The name the semaphore lives on.
    pub fn name(&self) -> &str {
        &self.name
    }
}
