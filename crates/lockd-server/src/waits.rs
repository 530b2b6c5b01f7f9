//! Matches applied effects to the requests waiting for them: the push that wakes a waiter.
//!
//! A waiting acquire is proposed, answered `Queued { waiter }`, and then parks here. The local
//! replica calls [`EffectSink::applied`] for every committed entry it applies; a `Granted` or
//! `WaitEnded` for a parked waiter answers it at once (no polling). Because the outcome comes from
//! the committed log, a client never hears "granted" for a grant that is not on a majority, and a
//! wait ends only when the log says so (GUIDE §2: "the log decides a wait").
//!
//! Two races are handled:
//! - The local replica may apply the grant *before* the proposer has parked (the reply travels
//!   from the leader while this node applies). Outcomes for unknown waiters are kept in a bounded
//!   `early` buffer that parking consults first.
//! - The request may go away (client disconnected, gave up) while its waiter stays queued in the
//!   replicated state. Such a waiter is marked abandoned; if it is granted later, the grant is
//!   released through the janitor channel, so nobody holds a lock they do not know about.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use lockd_core::{Effect, SessionEndReason, SessionId, Token, WaitEndReason, WaiterId};
use lockd_raft::{EffectSink, GroupId};
use tokio::sync::{mpsc, oneshot};

/// How a parked wait ended.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum WaitOutcome {
    /// `group_moves`: the group's move count at the grant (`Reply::Acquired`).
    Granted {
        token: Token,
        lease_ttl_ms: u64,
        group_moves: u64,
    },
    TimedOut,
    SessionEnded,
    /// The name's bucket moved to another group: queue again there.
    Moved,
}

/// A grant nobody is waiting for any more: the janitor releases it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Orphan {
    pub group: GroupId,
    pub session: SessionId,
    pub name: String,
    pub token: Token,
}

/// Something a session's stream should be told (gRPC pushes grants and endings).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionEvent {
    Granted {
        group: GroupId,
        waiter: WaiterId,
        name: Arc<str>,
        token: Token,
        lease_ttl_ms: u64,
        group_moves: u64,
    },
    WaitEnded {
        group: GroupId,
        waiter: WaiterId,
        name: Arc<str>,
        reason: WaitEndReason,
    },
    Ended {
        group: GroupId,
        reason: SessionEndReason,
    },
    /// A group changed leader; the new leader restarted every lease at TTL + election timeout.
    /// `remaining_ms` is what the session's lease has left in that group, as its new leader
    /// answered a keepalive sent for the notice.
    LeaseExtended {
        group: GroupId,
        extended_by_ms: u64,
        remaining_ms: u64,
    },
}

type Key = (GroupId, WaiterId);

/// Outcomes remembered for waiters that have not parked yet.
const EARLY_CAPACITY: usize = 65_536;

#[derive(Default)]
struct Inner {
    parked: HashMap<Key, oneshot::Sender<WaitOutcome>>,
    early: HashMap<Key, WaitOutcome>,
    early_order: VecDeque<Key>,
    abandoned: HashSet<Key>,
    streams: HashMap<SessionId, (u64, mpsc::UnboundedSender<SessionEvent>)>,
    next_stream: u64,
}

/// Counts a leader's applied events as contention (set by the service).
pub type ContentionCounter = Box<dyn Fn(&[lockd_core::LockEvent]) + Send + Sync>;

/// The metrics' snapshot times, by phase.
pub type SnapshotTimes = prometheus_client::metrics::family::Family<
    crate::metrics::PhaseLabel,
    prometheus_client::metrics::histogram::Histogram,
>;

/// The registry of parked waits; the node's [`EffectSink`].
pub struct Waits {
    inner: Mutex<Inner>,
    /// Where the log's append-to-durable times go (the metrics' histogram).
    log_sync: Mutex<Option<prometheus_client::metrics::histogram::Histogram>>,
    /// Where snapshot times go (the metrics' family, by phase).
    snapshots: std::sync::OnceLock<SnapshotTimes>,
    janitor: mpsc::UnboundedSender<Orphan>,
    pub counters: crate::metrics::EffectCounters,
    /// `--audit-log`, if asked for.
    audit: std::sync::OnceLock<crate::audit::AuditLog>,
    /// Where the leader's events are counted as contention (`Metrics::lock_events`).
    contention: std::sync::OnceLock<ContentionCounter>,
    /// The watches (`watch.rs`): every replica's events go there.
    pub watch: crate::watches::Hub,
    /// Hand-off rates and wait estimates (`contention.rs`), from every replica's events.
    pub handoffs: crate::contention::Handoffs,
}

/// A parked wait. Dropping it before the outcome arrives marks the waiter abandoned (unless
/// it is a session's: [`Parked::of_session`]).
pub struct Parked {
    waits: Arc<Waits>,
    key: Key,
    rx: Option<oneshot::Receiver<WaitOutcome>>,
    early: Option<WaitOutcome>,
    abandon_on_drop: bool,
}

impl Parked {
    /// Waits for the outcome. `None` if the registry went away (shutdown).
    pub async fn outcome(&mut self) -> Option<WaitOutcome> {
        if let Some(o) = self.early.take() {
            self.rx = None;
            return Some(o);
        }
        let rx = self.rx.as_mut()?;
        let out = rx.await.ok();
        self.rx = None;
        out
    }
}

impl Parked {
    /// A wait a session stream queued: its grant is the session's, wherever the stream is now,
    /// so dropping this parking never marks the waiter abandoned (nothing here releases the
    /// grant; the client gives back one nobody waits for, or the session's end frees it).
    pub fn of_session(mut self) -> Parked {
        self.abandon_on_drop = false;
        self
    }

    /// Gives the wait up here without marking it abandoned (a member elsewhere now waits for
    /// it, and owns a late grant): returns its waiter id.
    pub fn hand_over(mut self) -> WaiterId {
        if self.rx.take().is_some() {
            let mut inner = self.waits.inner.lock().expect("waits lock");
            inner.parked.remove(&self.key);
        }
        self.key.1
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        if self.rx.is_some() {
            let mut inner = self.waits.inner.lock().expect("waits lock");
            if inner.parked.remove(&self.key).is_some() && self.abandon_on_drop {
                inner.abandoned.insert(self.key);
            }
        }
    }
}

impl Waits {
    /// A registry and the receiving end of its janitor channel (orphaned grants to release).
    pub fn new() -> (Arc<Waits>, mpsc::UnboundedReceiver<Orphan>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let w = Waits {
            inner: Mutex::default(),
            log_sync: Mutex::default(),
            snapshots: std::sync::OnceLock::new(),
            janitor: tx,
            counters: crate::metrics::EffectCounters::default(),
            audit: std::sync::OnceLock::new(),
            contention: std::sync::OnceLock::new(),
            watch: crate::watches::Hub::new(
                crate::watches::HISTORY_EVENTS,
                crate::watches::LAG_LIMIT,
            ),
            handoffs: Default::default(),
        };
        (Arc::new(w), rx)
    }

    /// Writes every applied grant and end of a hold or session to `log` from now on.
    pub fn write_audit_log(&self, log: crate::audit::AuditLog) {
        let _ = self.audit.set(log);
    }

    /// Hands every entry's events, on the replica that led the group when it applied them,
    /// to `count` from now on (the service counts contention in its metrics).
    pub fn count_contention(&self, count: ContentionCounter) {
        let _ = self.contention.set(count);
    }

    /// Sends the log's append-to-durable times to `h`.
    pub fn observe_log_sync(&self, h: prometheus_client::metrics::histogram::Histogram) {
        *self.log_sync.lock().expect("log sync lock") = Some(h);
    }

    /// Sends the time each snapshot took, by phase, to `family`.
    pub fn observe_snapshots(&self, family: SnapshotTimes) {
        let _ = self.snapshots.set(family);
    }

    /// Parks the request waiting for `waiter` of `group`.
    pub fn park(self: &Arc<Self>, group: GroupId, waiter: WaiterId) -> Parked {
        let key = (group, waiter);
        let mut inner = self.inner.lock().expect("waits lock");
        if let Some(o) = inner.early.remove(&key) {
            return Parked {
                waits: self.clone(),
                key,
                rx: None,
                early: Some(o),
                abandon_on_drop: true,
            };
        }
        let (tx, rx) = oneshot::channel();
        inner.parked.insert(key, tx);
        Parked {
            waits: self.clone(),
            key,
            rx: Some(rx),
            early: None,
            abandon_on_drop: true,
        }
    }

    /// Routes every event of `session` to `tx` (a gRPC session stream) until another stream
    /// attaches the session or this one detaches. Returns the attachment's id.
    pub fn attach_stream(
        &self,
        session: SessionId,
        tx: mpsc::UnboundedSender<SessionEvent>,
    ) -> u64 {
        let mut inner = self.inner.lock().expect("waits lock");
        inner.next_stream += 1;
        let id = inner.next_stream;
        inner.streams.insert(session, (id, tx));
        id
    }

    /// Detaches attachment `id` (a newer attachment of the same session stays).
    pub fn detach_stream(&self, session: SessionId, id: u64) {
        let mut inner = self.inner.lock().expect("waits lock");
        if inner.streams.get(&session).is_some_and(|(i, _)| *i == id) {
            inner.streams.remove(&session);
        }
    }

    /// A sender for orphaned grants (a remote wait whose requester went away, `route.rs`).
    pub(crate) fn janitor(&self) -> mpsc::UnboundedSender<Orphan> {
        self.janitor.clone()
    }

    /// Hands `event` to the stream attached to `session` on this node; false if none is (or
    /// it went away). For outcomes learnt from another node (`route.rs`).
    pub(crate) fn deliver(&self, session: SessionId, event: SessionEvent) -> bool {
        let inner = self.inner.lock().expect("waits lock");
        inner
            .streams
            .get(&session)
            .is_some_and(|(_, tx)| tx.send(event).is_ok())
    }

    /// The sessions with a stream attached on this node.
    pub fn stream_sessions(&self) -> Vec<SessionId> {
        let inner = self.inner.lock().expect("waits lock");
        inner.streams.keys().copied().collect()
    }

    fn finish(&self, inner: &mut Inner, key: Key, outcome: WaitOutcome, orphan: Option<Orphan>) {
        if let Some(tx) = inner.parked.remove(&key) {
            if let Err(WaitOutcome::Granted { .. }) = tx.send(outcome) {
                // The request went away between parking and now: give the grant back.
                if let Some(o) = orphan {
                    let _ = self.janitor.send(o);
                }
            }
            return;
        }
        if inner.abandoned.remove(&key) {
            if let (WaitOutcome::Granted { .. }, Some(o)) = (&outcome, orphan) {
                let _ = self.janitor.send(o);
            }
            return;
        }
        if inner.early.insert(key, outcome).is_none() {
            inner.early_order.push_back(key);
            while inner.early_order.len() > EARLY_CAPACITY {
                if let Some(old) = inner.early_order.pop_front() {
                    inner.early.remove(&old);
                }
            }
        }
    }
}

impl EffectSink for Waits {
    fn events(
        &self,
        group: GroupId,
        index: u64,
        now_ms: u64,
        leading: bool,
        events: Vec<lockd_core::LockEvent>,
    ) {
        if let Some(log) = self.audit.get() {
            log.write(group, index, now_ms, &events);
        }
        if leading {
            self.counters.count(&events);
            if let Some(count) = self.contention.get() {
                count(&events);
            }
        }
        self.handoffs.observe(group, now_ms, &events);
        self.watch.publish(group, index, now_ms, events);
    }

    fn reset(&self, group: GroupId) {
        self.handoffs.reset(group);
        self.watch.reset(group);
    }

    fn log_synced(&self, _group: GroupId, took: std::time::Duration) {
        if let Some(h) = &*self.log_sync.lock().expect("log sync lock") {
            h.observe(took.as_secs_f64());
        }
    }

    fn snapshot_made(
        &self,
        _group: GroupId,
        captured: std::time::Duration,
        written: std::time::Duration,
        _bytes: usize,
    ) {
        use crate::metrics::PhaseLabel;
        if let Some(f) = self.snapshots.get() {
            for (phase, took) in [("capture", captured), ("write", written)] {
                f.get_or_create(&PhaseLabel { phase })
                    .observe(took.as_secs_f64());
            }
        }
    }

    fn applied(&self, group: GroupId, effects: &[Effect]) {
        let mut inner = self.inner.lock().expect("waits lock");
        for e in effects {
            match e {
                Effect::Granted {
                    waiter,
                    session,
                    name,
                    token,
                    lease_ttl_ms,
                    group_moves,
                } => {
                    let event = SessionEvent::Granted {
                        group,
                        waiter: *waiter,
                        name: name.clone(),
                        token: *token,
                        lease_ttl_ms: *lease_ttl_ms,
                        group_moves: *group_moves,
                    };
                    // A stream-owned wait is answered on the stream; the stream's client owns the
                    // grant, so it is never an orphan.
                    let orphan = (!push(&inner, *session, event)).then(|| Orphan {
                        group,
                        session: *session,
                        name: name.to_string(),
                        token: *token,
                    });
                    let outcome = WaitOutcome::Granted {
                        token: *token,
                        lease_ttl_ms: *lease_ttl_ms,
                        group_moves: *group_moves,
                    };
                    self.finish(&mut inner, (group, *waiter), outcome, orphan);
                }
                Effect::WaitEnded {
                    waiter,
                    session,
                    name,
                    reason,
                } => {
                    let event = SessionEvent::WaitEnded {
                        group,
                        waiter: *waiter,
                        name: name.clone(),
                        reason: *reason,
                    };
                    push(&inner, *session, event);
                    let outcome = match reason {
                        WaitEndReason::TimedOut => WaitOutcome::TimedOut,
                        WaitEndReason::SessionEnded => WaitOutcome::SessionEnded,
                        WaitEndReason::Moved => WaitOutcome::Moved,
                    };
                    self.finish(&mut inner, (group, *waiter), outcome, None);
                }
                Effect::SessionAdopted { .. } => {}
                Effect::SessionEnded {
                    session, reason, ..
                } => {
                    let event = SessionEvent::Ended {
                        group,
                        reason: *reason,
                    };
                    push(&inner, *session, event);
                }
            }
        }
    }
}

/// Sends `event` to `session`'s stream, if it has one open here; whether it was sent.
fn push(inner: &Inner, session: SessionId, event: SessionEvent) -> bool {
    inner
        .streams
        .get(&session)
        .is_some_and(|(_, tx)| tx.send(event).is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn granted(waiter: WaiterId, token: Token) -> Effect {
        Effect::Granted {
            waiter,
            session: SessionId(1),
            name: Arc::from("n"),
            token,
            lease_ttl_ms: 15_000,
            group_moves: 0,
        }
    }

    #[tokio::test]
    async fn parked_waits_get_their_outcome_even_if_it_came_first() {
        let (w, _janitor) = Waits::new();
        let mut late = w.park(1, 7);
        w.applied(1, &[granted(7, 42)]);
        assert_eq!(
            late.outcome().await,
            Some(WaitOutcome::Granted {
                token: 42,
                lease_ttl_ms: 15_000,
                group_moves: 0,
            })
        );
        // The grant is applied before the proposer parks.
        w.applied(1, &[granted(8, 43)]);
        let mut early = w.park(1, 8);
        assert_eq!(
            early.outcome().await,
            Some(WaitOutcome::Granted {
                token: 43,
                lease_ttl_ms: 15_000,
                group_moves: 0,
            })
        );
        // Same waiter id in another group is another wait.
        let mut other = w.park(2, 8);
        w.applied(
            2,
            &[Effect::WaitEnded {
                waiter: 8,
                session: SessionId(1),
                name: Arc::from("n"),
                reason: WaitEndReason::TimedOut,
            }],
        );
        assert_eq!(other.outcome().await, Some(WaitOutcome::TimedOut));
    }

    #[tokio::test]
    async fn an_abandoned_wait_that_is_granted_is_released() {
        let (w, mut janitor) = Waits::new();
        drop(w.park(3, 9));
        w.applied(3, &[granted(9, 50)]);
        assert_eq!(
            janitor.try_recv(),
            Ok(Orphan {
                group: 3,
                session: SessionId(1),
                name: "n".into(),
                token: 50
            })
        );
        // A timed-out abandoned wait needs nothing.
        drop(w.park(3, 10));
        w.applied(
            3,
            &[Effect::WaitEnded {
                waiter: 10,
                session: SessionId(1),
                name: Arc::from("n"),
                reason: WaitEndReason::TimedOut,
            }],
        );
        assert!(janitor.try_recv().is_err());
    }

    #[tokio::test]
    async fn a_session_streams_wait_is_never_released_when_its_asker_goes() {
        let (w, mut janitor) = Waits::new();
        // A relay for a stream asked, then went away (its node died): the grant stays the
        // session's, for the node its stream moved to.
        drop(w.park(3, 9).of_session());
        w.applied(3, &[granted(9, 50)]);
        assert!(janitor.try_recv().is_err());
        // The next relay's ask gets it from the early buffer.
        assert_eq!(
            w.park(3, 9).outcome().await,
            Some(WaitOutcome::Granted {
                token: 50,
                lease_ttl_ms: 15_000,
                group_moves: 0
            })
        );
    }
}
