//! Read-only views of the state, for `GET /v1/locks/{name}`, sessions and debugging.

use crate::machine::LockTable;
use crate::types::{LockMode, SessionId, Token, WaiterId};

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
        let mut ids: Vec<SessionId> = self
            .sessions
            .keys()
            .copied()
            .filter(|id| after.is_none_or(|a| *id > a))
            .collect();
        ids.sort_unstable();
        ids.truncate(limit);
        ids.into_iter()
            .map(|id| {
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
}
