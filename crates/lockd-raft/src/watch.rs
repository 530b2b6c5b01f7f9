//! A watch channel whose wake-up order is deterministic.
//!
//! `tokio::sync::watch` spreads its receivers over 8 `Notify`s chosen with tokio's thread-local
//! RNG, which cannot be seeded on stable tokio, so the order in which receivers wake varies from
//! run to run. That is harmless in production but breaks a seeded simulation's replay. This
//! channel keeps one `Notify` (waiters wake in the order they started waiting) and is used for
//! lockd-raft's own watches and, through `raft::runtime`, for openraft's.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use tokio::sync::Notify;

struct Shared<T> {
    value: RwLock<(T, u64)>,
    senders: AtomicUsize,
    notify: Notify,
}

/// The sending half; cloneable. The channel closes when the last sender is dropped.
pub(crate) struct Sender<T>(Arc<Shared<T>>);

/// A receiving half; remembers the last version it saw.
pub(crate) struct Receiver<T> {
    shared: Arc<Shared<T>>,
    seen: u64,
}

/// The channel closed (every sender dropped).
#[derive(Debug)]
pub(crate) struct Closed;

pub type Ref<'a, T> = ReadRef<'a, T>;

/// A read guard on the current value.
pub struct ReadRef<'a, T>(RwLockReadGuard<'a, (T, u64)>);

impl<T> std::ops::Deref for ReadRef<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0 .0
    }
}

pub(crate) fn channel<T>(init: T) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        value: RwLock::new((init, 0)),
        senders: AtomicUsize::new(1),
        notify: Notify::new(),
    });
    (Sender(shared.clone()), Receiver { shared, seen: 0 })
}

impl<T> Shared<T> {
    fn read(&self) -> RwLockReadGuard<'_, (T, u64)> {
        self.value.read().unwrap_or_else(|e| e.into_inner())
    }
}

impl<T> Sender<T> {
    /// A channel with no receiver yet.
    pub(crate) fn new(init: T) -> Sender<T> {
        channel(init).0
    }

    /// Stores `value` and wakes every receiver; returns the previous value.
    pub(crate) fn send_replace(&self, value: T) -> T {
        let old = {
            let mut g = self.0.value.write().unwrap_or_else(|e| e.into_inner());
            g.1 += 1;
            std::mem::replace(&mut g.0, value)
        };
        self.0.notify.notify_waiters();
        old
    }

    /// Modifies the value in place; wakes receivers only if `modify` returns true.
    pub(crate) fn send_if_modified(&self, modify: impl FnOnce(&mut T) -> bool) -> bool {
        let changed = {
            let mut g = self.0.value.write().unwrap_or_else(|e| e.into_inner());
            let changed = modify(&mut g.0);
            if changed {
                g.1 += 1;
            }
            changed
        };
        if changed {
            self.0.notify.notify_waiters();
        }
        changed
    }

    pub(crate) fn borrow(&self) -> Ref<'_, T> {
        ReadRef(self.0.read())
    }

    pub(crate) fn subscribe(&self) -> Receiver<T> {
        let seen = self.0.read().1;
        Receiver {
            shared: self.0.clone(),
            seen,
        }
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.0.senders.fetch_add(1, Ordering::AcqRel);
        Sender(self.0.clone())
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if self.0.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.notify.notify_waiters();
        }
    }
}

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Self {
        Receiver {
            shared: self.shared.clone(),
            seen: self.seen,
        }
    }
}

impl<T> Receiver<T> {
    /// Waits for a value newer than the last one seen; errors once the channel closed.
    pub(crate) async fn changed(&mut self) -> Result<(), Closed> {
        loop {
            let notified = self.shared.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let version = self.shared.read().1;
            if version != self.seen {
                self.seen = version;
                return Ok(());
            }
            if self.shared.senders.load(Ordering::Acquire) == 0 {
                return Err(Closed);
            }
            notified.await;
        }
    }

    pub(crate) fn borrow(&self) -> Ref<'_, T> {
        ReadRef(self.shared.read())
    }

    pub(crate) fn borrow_and_update(&mut self) -> Ref<'_, T> {
        let g = self.shared.read();
        self.seen = g.1;
        ReadRef(g)
    }

    /// Waits until the value satisfies `f` (checking the current one first).
    pub(crate) async fn wait_for(&mut self, f: impl Fn(&T) -> bool) -> Result<(), Closed> {
        loop {
            if f(&self.borrow_and_update()) {
                return Ok(());
            }
            self.changed().await?;
        }
    }
}
