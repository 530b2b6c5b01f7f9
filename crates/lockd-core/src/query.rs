//! Read-only views of the state, for `GET /v1/locks/{name}`, sessions and debugging.

use std::collections::BTreeMap;

use crate::machine::LockTable;
use crate::types::{ClusterTiming, LockMode, SessionId, Token, WaiterId};

/// One hold of a lock.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HolderInfo {
    pub session: SessionId,
    pub owner: String,
    pub token: Token,
    pub mode: LockMode,
    pub held_for_ms: u64,
    pub reentry: u32,
}

/// One queued acquire; `position` counts from 1 at the head.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct WaiterInfo {
    pub waiter: WaiterId,
    pub session: SessionId,
    pub owner: String,
    pub mode: LockMode,
    pub position: u32,
    pub waited_ms: u64,
    pub deadline_ms: u64,
}

/// Everything known about one name.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LockInfo {
    pub name: String,
    pub namespace: String,
    pub holders: Vec<HolderInfo>,
    pub waiters: Vec<WaiterInfo>,
    /// Group time at which a pending lock-delay ends.
    pub lock_delay_until_ms: Option<u64>,
}

/// A session's holds and waits.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionInfo {
    pub session: SessionId,
    pub client: String,
    pub ttl_ms: u64,
    pub opened_at_ms: u64,
    /// (name, token) of every hold, by name.
    pub held: Vec<(String, Token)>,
    /// (name, waiter, position) of every queued acquire, by name.
    pub waits: Vec<(String, WaiterId, u32)>,
}

/// One line of a session listing.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SessionSummary {
    pub session: SessionId,
    pub client: String,
    pub ttl_ms: u64,
    pub opened_at_ms: u64,
    pub held: u32,
    pub waits: u32,
}

impl LockTable {
    /// The name of the namespace `session` was opened in (empty for a session restored from a
    /// format-1 snapshot), or `None` if the session does not exist here.
    pub fn session_namespace(&self, session: SessionId) -> Option<&str> {
        self.sessions.get(&session).map(|s| &*s.namespace)
    }

    /// Up to `limit` sessions with ids above `after`, in id order (a page of a listing).
    pub fn session_page(&self, after: Option<SessionId>, limit: usize) -> Vec<SessionSummary> {
        use std::ops::Bound;
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        self.session_ids
            .range((from, Bound::Unbounded))
            .take(limit)
            .map(|&id| {
                let s = &self.sessions[&id];
                SessionSummary {
                    session: id,
                    client: s.client.to_string(),
                    ttl_ms: s.ttl_ms,
                    opened_at_ms: s.opened_at_ms,
                    held: s.held.len() as u32,
                    waits: s.waits.len() as u32,
                }
            })
            .collect()
    }

    /// The record of `name` as of group time `now_ms` (for `held_for_ms`); `None` if the name is
    /// free, has nobody waiting and no lock-delay.
    pub fn lock_info(&self, name: &str, now_ms: u64) -> Option<LockInfo> {
        let lock = self.locks.get(name)?;
        let now = now_ms.max(self.now_ms);
        Some(LockInfo {
            name: name.to_string(),
            namespace: self.namespace_for(name).name.clone(),
            holders: lock
                .holders
                .iter()
                .map(|h| HolderInfo {
                    session: h.session,
                    owner: h.owner.to_string(),
                    token: h.token,
                    mode: h.mode,
                    held_for_ms: now.saturating_sub(h.granted_at_ms),
                    reentry: h.reentry,
                })
                .collect(),
            waiters: lock
                .waiters()
                .iter()
                .enumerate()
                .map(|(i, w)| WaiterInfo {
                    waiter: w.id,
                    session: w.session,
                    owner: w.owner.to_string(),
                    mode: w.mode,
                    position: i as u32 + 1,
                    waited_ms: now.saturating_sub(w.enqueued_at_ms),
                    deadline_ms: w.deadline_ms,
                })
                .collect(),
            lock_delay_until_ms: (lock.delay_until_ms() != 0).then_some(lock.delay_until_ms()),
        })
    }

    /// What `session` was opened with, `(client, TTL, namespace)`: the values another group
    /// adopts it with (`Op::AdoptAndAcquire`). `None` if it has no lease here.
    pub fn session_opening(&self, session: SessionId) -> Option<(String, u64, String)> {
        let s = self.sessions.get(&session)?;
        Some((s.client.to_string(), s.ttl_ms, s.namespace.to_string()))
    }

    /// The holds and waits of `session`, or `None` if it does not exist.
    pub fn session_info(&self, session: SessionId) -> Option<SessionInfo> {
        let s = self.sessions.get(&session)?;
        Some(SessionInfo {
            session,
            client: s.client.to_string(),
            ttl_ms: s.ttl_ms,
            opened_at_ms: s.opened_at_ms,
            held: s.held.iter().map(|(n, t)| (n.to_string(), *t)).collect(),
            waits: s
                .waits
                .iter()
                .map(|(n, id)| {
                    let pos = self
                        .locks
                        .get(n)
                        .and_then(|l| l.waiters().iter().position(|w| w.id == *id));
                    (n.to_string(), *id, pos.map_or(0, |p| p as u32 + 1))
                })
                .collect(),
        })
    }

    /// `(name, waiter, ms left at group time now_ms)` of every wait `session` has queued:
    /// what a node the session's stream moves to needs to relay their outcomes.
    pub fn session_waits(&self, session: SessionId, now_ms: u64) -> Vec<(String, WaiterId, u64)> {
        let Some(s) = self.sessions.get(&session) else {
            return Vec::new();
        };
        s.waits
            .iter()
            .filter_map(|(n, id)| {
                let w = self.locks.get(n)?.waiters().iter().find(|w| w.id == *id)?;
                Some((n.to_string(), *id, w.deadline_ms.saturating_sub(now_ms)))
            })
            .collect()
    }
}

/// One name in a contention report, as of the scan's group time.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Contended {
    pub name: String,
    pub namespace: String,
    pub holders: u32,
    pub waiters: u32,
    /// How long the oldest current hold has lasted (0 if the name is free).
    pub held_for_ms: u64,
    /// How long the longest-waiting queued acquire has waited (0 if nobody waits).
    pub longest_wait_ms: u64,
}

/// The top names of one replica by three measures, each list longest first, ties by name.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ContentionScan {
    pub most_waiters: Vec<Contended>,
    pub longest_waits: Vec<Contended>,
    pub longest_held: Vec<Contended>,
    /// How many records the scan read (every name that is held, waited on or delayed).
    pub scanned: u64,
}

/// The `top` largest `(key, name)` pairs seen, in memory bounded by `top`.
struct TopN<'a> {
    top: usize,
    heap: std::collections::BinaryHeap<std::cmp::Reverse<(u64, std::cmp::Reverse<&'a str>)>>,
}

impl<'a> TopN<'a> {
    fn new(top: usize) -> Self {
        TopN {
            top,
            heap: std::collections::BinaryHeap::with_capacity(top + 1),
        }
    }

    /// Offers `name` with `key`; a zero key never ranks. Equal keys rank by name, smallest first.
    fn offer(&mut self, key: u64, name: &'a str) {
        if key == 0 || self.top == 0 {
            return;
        }
        let item = std::cmp::Reverse((key, std::cmp::Reverse(name)));
        if self.heap.len() < self.top {
            self.heap.push(item);
        } else if self.heap.peek().is_some_and(|min| item < *min) {
            self.heap.pop();
            self.heap.push(item);
        }
    }

    /// The names, largest key first.
    fn names(self) -> Vec<&'a str> {
        let mut v: Vec<_> = self.heap.into_vec();
        v.sort();
        v.into_iter()
            .map(|std::cmp::Reverse((_, std::cmp::Reverse(n)))| n)
            .collect()
    }
}

/// One step of a chunked pass for the longest holds ([`LockTable::held_chunk`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HeldChunk {
    /// The chunk's `top` names by how long their oldest hold has lasted, longest first.
    pub longest_held: Vec<Contended>,
    /// Records the chunk read.
    pub scanned: u64,
    /// Whether the pass has reached the end of the table.
    pub done: bool,
}

impl LockTable {
    /// The `top` names with the most waiters, the longest current wait and the longest current
    /// hold, as of group time `now_ms`, among names in the namespaces `namespaces` names
    /// (every name if `None`): [`LockTable::waiting`] and one [`LockTable::held_chunk`] over
    /// the whole table.
    pub fn contention(
        &self,
        top: usize,
        now_ms: u64,
        namespaces: Option<&[String]>,
    ) -> ContentionScan {
        let mut scan = self.waiting(top, now_ms, namespaces);
        let held = self.held_chunk(0, usize::MAX, top, now_ms, namespaces);
        scan.longest_held = held.longest_held;
        scan.scanned = held.scanned;
        scan
    }

    /// The `top` names by waiters and by longest current wait (`longest_held` left empty;
    /// `scanned` counts the names with waiters). Cheap at any table size: it reads the
    /// sessions' waits, not every record.
    pub fn waiting(
        &self,
        top: usize,
        now_ms: u64,
        namespaces: Option<&[String]>,
    ) -> ContentionScan {
        let now = now_ms.max(self.now_ms);
        let mut names: Vec<&str> = self
            .sessions
            .values()
            .flat_map(|s| s.waits.iter().map(|(name, _)| &**name))
            .collect();
        names.sort_unstable();
        names.dedup();
        let mut waiters = TopN::new(top);
        let mut waits = TopN::new(top);
        let mut scanned = 0u64;
        for name in names {
            if namespaces.is_some_and(|ns| !ns.contains(&self.namespace_for(name).name)) {
                continue;
            }
            let Some(lock) = self.locks.get(name) else {
                continue;
            };
            scanned += 1;
            let queue = lock.waiters();
            waiters.offer(queue.len() as u64, name);
            if let Some(oldest) = queue.iter().map(|w| w.enqueued_at_ms).min() {
                waits.offer(now.saturating_sub(oldest).max(1), name);
            }
        }
        ContentionScan {
            most_waiters: self.contended(waiters.names(), now),
            longest_waits: self.contended(waits.names(), now),
            longest_held: Vec::new(),
            scanned,
        }
    }

    /// One step of a pass over every record for the `top` longest current holds: up to `len`
    /// records from the `from`th on. A pass in steps lets the shell release the state between
    /// steps; a name granted or freed meanwhile may then be missed or read twice (never
    /// invented), and the steps' lists merge by name.
    pub fn held_chunk(
        &self,
        from: usize,
        len: usize,
        top: usize,
        now_ms: u64,
        namespaces: Option<&[String]>,
    ) -> HeldChunk {
        let now = now_ms.max(self.now_ms);
        let mut held = TopN::new(top);
        let mut scanned = 0u64;
        let mut read = 0usize;
        for (name, lock) in self.locks.iter_from(from).take(len) {
            read += 1;
            if namespaces.is_some_and(|ns| !ns.contains(&self.namespace_for(name).name)) {
                continue;
            }
            scanned += 1;
            if let Some(oldest) = lock.holders.iter().map(|h| h.granted_at_ms).min() {
                held.offer(now.saturating_sub(oldest).max(1), name);
            }
        }
        HeldChunk {
            longest_held: self.contended(held.names(), now),
            scanned,
            done: read < len || from.saturating_add(read) >= self.locks.len(),
        }
    }

    /// The contention view of each of `names` that has a record, at group time `now`.
    pub fn contended(&self, names: Vec<&str>, now: u64) -> Vec<Contended> {
        names
            .into_iter()
            .filter_map(|name| {
                let lock = self.locks.get(name)?;
                let oldest = |it: &mut dyn Iterator<Item = u64>| {
                    it.min().map_or(0, |t| now.saturating_sub(t))
                };
                Some(Contended {
                    name: name.to_string(),
                    namespace: self.namespace_for(name).name.clone(),
                    holders: lock.holders.len() as u32,
                    waiters: lock.waiters().len() as u32,
                    held_for_ms: oldest(&mut lock.holders.iter().map(|h| h.granted_at_ms)),
                    longest_wait_ms: oldest(&mut lock.waiters().iter().map(|w| w.enqueued_at_ms)),
                })
            })
            .collect()
    }
}

impl LockTable {
    // What the meta group records about the cluster (`cluster.rs`).

    /// The cluster's Raft timing, once a node has recorded it.
    pub fn cluster_timing(&self) -> Option<ClusterTiming> {
        self.cluster.timing
    }

    /// Whether node `id` has left the cluster for good (its id may not come back).
    pub fn is_retired(&self, id: u64) -> bool {
        self.cluster.retired.contains(&id)
    }

    /// Every retired node id, ascending.
    pub fn retired_nodes(&self) -> Vec<u64> {
        self.cluster.retired.iter().copied().collect()
    }

    /// The nodes marked draining, ascending.
    pub fn draining_nodes(&self) -> Vec<u64> {
        self.cluster.draining.iter().copied().collect()
    }

    /// Every node's recorded data dir incarnation, by node id.
    pub fn incarnations(&self) -> &BTreeMap<u64, u64> {
        &self.cluster.incarnations
    }

    /// Every node's recorded zone, by node id (a node that declared none is absent).
    pub fn zones(&self) -> &BTreeMap<u64, String> {
        &self.cluster.zones
    }
}
