//! What the service says about a lock, in this crate's own types (not the generated protobuf
//! ones, so that a change of the wire format is not a change of this API).

use lockd_proto::v1 as pb;

/// A lock as the service has it now ([`Client::inspect`](crate::Client::inspect)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockInfo {
    /// The lock's name.
    pub name: String,
    /// The namespace the name falls in (its longest matching prefix).
    pub namespace: String,
    /// Who holds it; for a shared lock or a semaphore, each holder.
    pub holders: Vec<HolderInfo>,
    /// Its FIFO queue, head first.
    pub waiters: Vec<WaiterInfo>,
    /// Group time a pending lock-delay ends (0 = none): after a holder's session expired, the
    /// name is granted to nobody until then.
    pub lock_delay_until_ms: u64,
}

/// One holder of a lock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderInfo {
    /// Its session: empty unless the caller presented the admin token (a session id is its
    /// session's capability).
    pub session_id: String,
    /// Who within its process holds it (the acquire's owner string).
    pub owner: String,
    /// The grant's fencing token.
    pub fencing_token: u64,
    /// How it holds the lock.
    pub mode: HoldMode,
    /// How long it has held it.
    pub held_for_ms: u64,
    /// Holds of a re-entrant owner (1 when it took the lock once).
    pub reentry: u32,
}

/// One queued acquire.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaiterInfo {
    /// Its session: empty unless the caller presented the admin token.
    pub session_id: String,
    /// Who within its process waits (the acquire's owner string).
    pub owner: String,
    /// How it asks to hold the lock.
    pub mode: HoldMode,
    /// 1 = the head of the queue.
    pub position: u32,
    /// How long it has waited.
    pub waited_ms: u64,
}

/// How a hold or a wait shares its lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldMode {
    /// One holder.
    Exclusive,
    /// Any number of shared holders.
    Shared,
    /// Up to the semaphore's count of holders.
    Semaphore,
}

impl HoldMode {
    /// `exclusive`, `shared` or `semaphore`.
    pub fn as_str(self) -> &'static str {
        match self {
            HoldMode::Exclusive => "exclusive",
            HoldMode::Shared => "shared",
            HoldMode::Semaphore => "semaphore",
        }
    }

    fn of(mode: i32) -> HoldMode {
        match pb::Mode::try_from(mode) {
            Ok(pb::Mode::Shared) => HoldMode::Shared,
            Ok(pb::Mode::Semaphore) => HoldMode::Semaphore,
            _ => HoldMode::Exclusive,
        }
    }
}

impl From<pb::LockState> for LockInfo {
    fn from(s: pb::LockState) -> LockInfo {
        LockInfo {
            name: s.name,
            namespace: s.namespace,
            holders: s
                .holders
                .into_iter()
                .map(|h| HolderInfo {
                    session_id: h.session_id,
                    owner: h.owner,
                    fencing_token: h.fencing_token,
                    mode: HoldMode::of(h.mode),
                    held_for_ms: h.held_for_ms,
                    reentry: h.reentry,
                })
                .collect(),
            waiters: s
                .waiters
                .into_iter()
                .map(|w| WaiterInfo {
                    session_id: w.session_id,
                    owner: w.owner,
                    mode: HoldMode::of(w.mode),
                    position: w.position,
                    waited_ms: w.waited_ms,
                })
                .collect(),
            lock_delay_until_ms: s.lock_delay_until_ms,
        }
    }
}
