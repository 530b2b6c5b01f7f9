//! The applied state of one group on this node.
//!
//! Shared by the Raft state machine adapter (the only writer: it applies committed entries in
//! log order) and by everything that reads or stamps: local and linearizable reads, the group
//! clock, the leader's session tracker, `wait_applied`. It knows nothing of openraft.
//!
//! Lock order: `state` before `leader`, everywhere.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use crate::watch;
use lockd_core::{Command, Effect, LockTable, Op, Reply};

use crate::raft::leadership::Leadership;
use crate::wire::Proposed;
use crate::wire::Renewed;
use crate::{EffectSink, GroupId, NodeClock};

/// What has been applied, and when (on this node's monotonic clock).
pub(crate) struct AppliedState {
    pub(crate) table: LockTable,
    /// Index of the last applied log entry (0 before any).
    pub(crate) index: u64,
    /// Term of the leader that wrote the last applied entry.
    pub(crate) term: u64,
    /// When the last command was applied here: a follower's group-time estimate runs from it.
    pub(crate) at: Instant,
}

pub(crate) struct Replica {
    group: GroupId,
    state: Mutex<AppliedState>,
    leader: Mutex<Leadership>,
    applied_tx: watch::Sender<u64>,
    sink: Arc<dyn EffectSink>,
    /// The node's clock: every time read of the group's lockd logic goes through it.
    clock: NodeClock,
    /// Snapshots received from a leader (not counting the one restored at start).
    installs: AtomicU64,
    /// The applied table's move count (`LockTable::move_count`), for keepalives to report
    /// without waiting for the state lock.
    moves: AtomicU64,
    /// NEGATIVE CONTROL ONLY: every table here skips the ownership check.
    skip_ownership_check: bool,
    /// The meta group's replica keeps the node's peer book in step with what it records about
    /// the nodes (incarnations, retired ids) as it applies them (`peer/book.rs`).
    book: Option<Arc<crate::PeerBook>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves the replica in an unknown state; poisoning then
    // propagates the panic rather than serving that state.
    m.lock().expect("replica lock poisoned")
}

impl Replica {
    /// Where this group's effects and log timings go.
    pub(crate) fn sink(&self) -> Arc<dyn EffectSink> {
        self.sink.clone()
    }

    pub(crate) fn new(
        group: GroupId,
        sink: Arc<dyn EffectSink>,
        clock: NodeClock,
        skip_ownership_check: bool,
        book: Option<Arc<crate::PeerBook>>,
    ) -> Replica {
        let mut table = LockTable::new();
        if skip_ownership_check {
            table.sabotage_skip_ownership_check();
        }
        Replica {
            group,
            skip_ownership_check,
            state: Mutex::new(AppliedState {
                table,
                index: 0,
                term: 0,
                at: clock.now(),
            }),
            leader: Mutex::new(Leadership::default()),
            applied_tx: watch::Sender::new(0),
            sink,
            clock,
            installs: AtomicU64::new(0),
            moves: AtomicU64::new(0),
            book,
        }
    }

    /// Copies what the table records about the nodes into the peer book, if this replica
    /// keeps one.
    fn update_book(&self, table: &LockTable) {
        if let Some(book) = &self.book {
            book.set(
                table.incarnations().clone(),
                table.retired_nodes().into_iter().collect(),
            );
        }
    }

    /// The node's clock.
    pub(crate) fn clock(&self) -> &NodeClock {
        &self.clock
    }

    pub(crate) fn group(&self) -> GroupId {
        self.group
    }

    /// Applies one committed entry (log order): its `ops`, in order, as commands at group time
    /// `now_ms`; returns the core's reply to each.
    ///
    /// On the leader of the entry's term, an acquire answered `Acquired` or `Queued` also
    /// renews its session's lease here, as a keepalive received now would (S6): the reply
    /// says so (`Proposed::renewed`), and the client counts that lease from when it sent the
    /// acquire. So a grant is never lost at once for want of a keepalive the client had not
    /// yet sent. Only the leader's tracker changes: the table, and so every replica's state,
    /// is the same either way.
    pub(crate) fn apply(&self, index: u64, term: u64, now_ms: u64, ops: Vec<Op>) -> Vec<Proposed> {
        let mut replies = Vec::with_capacity(ops.len());
        let mut effects = Vec::new();
        let mut events = Vec::new();
        let leading;
        let nodes_changed = self.book.is_some()
            && ops
                .iter()
                .any(|op| matches!(op, Op::RegisterIncarnation { .. } | Op::RetireNode { .. }));
        {
            let mut st = lock(&self.state);
            let at = self.clock.now();
            let mut leader = lock(&self.leader);
            leading = leader.term().is_some();
            // The term whose entries this leader proposed: only their acquires were sent
            // after its election, and only it answers them.
            let renewing = leader.term() == Some(term);
            for (slot, op) in ops.into_iter().enumerate() {
                let cmd = Command { now_ms, op };
                let mut applied = st.table.apply(&cmd);
                self.sink
                    .applied_entry(self.group, index, slot, &cmd, &applied, &st.table);
                if let (Op::OpenSession { .. }, Ok(Reply::SessionOpened { session, ttl_ms })) =
                    (&cmd.op, &applied.reply)
                {
                    leader.session_opened(*session, *ttl_ms, at);
                }
                for e in &applied.effects {
                    match e {
                        Effect::SessionEnded { session, .. } => leader.session_ended(*session),
                        // A session an import or an adopt brought, or one whose lease an
                        // import restarted: its lease runs from now, here (never shorter).
                        Effect::SessionAdopted { session, ttl_ms } => {
                            leader.session_opened(*session, *ttl_ms, at)
                        }
                        _ => {}
                    }
                }
                let renewed = renewing
                    .then(|| renewal(&mut leader, term, &cmd.op, &applied.reply, at, &st.table))
                    .flatten();
                effects.extend(applied.effects);
                events.append(&mut applied.events);
                replies.push(Proposed {
                    reply: applied.reply,
                    renewed,
                });
            }
            st.index = index;
            st.term = term;
            st.at = at;
            self.moves.store(st.table.move_count(), Ordering::Release);
            if nodes_changed {
                self.update_book(&st.table);
            }
        }
        if !effects.is_empty() {
            self.sink.applied(self.group, &effects);
        }
        if !events.is_empty() {
            self.sink.events(self.group, index, now_ms, leading, events);
        }
        self.applied_tx.send_replace(index);
        replies
    }

    /// Records an applied entry that carries no command (blank or membership).
    pub(crate) fn mark_applied(&self, index: u64, term: u64) {
        {
            let mut st = lock(&self.state);
            st.index = index;
            st.term = term;
        }
        self.applied_tx.send_replace(index);
    }

    /// Replaces the state with a snapshot's (recovery, or a lagging follower's catch-up).
    pub(crate) fn install(&self, mut table: LockTable, index: u64, term: u64) {
        if self.skip_ownership_check {
            table.sabotage_skip_ownership_check();
        }
        {
            let mut st = lock(&self.state);
            st.table = table;
            st.index = index;
            st.term = term;
            st.at = self.clock.now();
            self.moves.store(st.table.move_count(), Ordering::Release);
            self.update_book(&st.table);
            // A snapshot only reaches a follower; if a stale leader view survived, drop it so
            // the leader duties start over from the new state.
            lock(&self.leader).deactivate();
        }
        self.sink.reset(self.group);
        self.applied_tx.send_replace(index);
    }

    /// Counts a snapshot installed from the leader.
    pub(crate) fn count_install(&self) {
        self.installs.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn installs(&self) -> u64 {
        self.installs.load(Ordering::Relaxed)
    }

    /// The state as snapshot bytes, with the index and term it covers; `capacity` is where
    /// the buffer starts (a little over the previous snapshot's size).
    pub(crate) fn snapshot(&self, capacity: usize) -> (Vec<u8>, u64, u64) {
        let st = lock(&self.state);
        (st.table.snapshot_with_capacity(capacity), st.index, st.term)
    }

    /// The applied table's move count (see `LockTable::move_count`).
    pub(crate) fn move_count(&self) -> u64 {
        self.moves.load(Ordering::Acquire)
    }

    pub(crate) fn read<R>(&self, f: impl FnOnce(&LockTable) -> R) -> R {
        f(&lock(&self.state).table)
    }

    /// (index, term) of the last applied entry.
    pub(crate) fn applied(&self) -> (u64, u64) {
        let st = lock(&self.state);
        (st.index, st.term)
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.applied_tx.subscribe()
    }

    pub(crate) async fn wait_applied(&self, index: u64) {
        let mut rx = self.subscribe();
        // The sender lives as long as `self`, so this only returns once `index` is applied.
        let _ = rx.wait_for(|applied| *applied >= index).await;
    }

    /// Group time: the leader's stamping clock if this replica leads, else the last applied
    /// `now_ms` advanced by the time since it was applied.
    pub(crate) fn now_ms(&self) -> u64 {
        let st = lock(&self.state);
        let leader = lock(&self.leader);
        let now = self.clock.now();
        leader.stamp(st.table.now_ms(), now).unwrap_or_else(|| {
            st.table
                .now_ms()
                .saturating_add(now.saturating_duration_since(st.at).as_millis() as u64)
        })
    }

    /// The `now_ms` to stamp on a new command, if this replica's leader duties are active for
    /// `term`.
    pub(crate) fn stamp(&self, term: u64) -> Option<u64> {
        let st = lock(&self.state);
        let leader = lock(&self.leader);
        if leader.term() != Some(term) {
            return None;
        }
        leader.stamp(st.table.now_ms(), self.clock.now())
    }

    /// Starts leader duties for `term` from the applied state: session timers restarted at
    /// full TTL + `slack`, and the group clock going on from this replica's own reckoning of
    /// it (the last applied `now_ms` advanced by the time since this replica applied it, as a
    /// follower tells group time), so that a leader change does not stop the clock for the
    /// time since the last command. That reckoning is never ahead of the old leader's clock
    /// (this replica applied the command after it was stamped), only as fast as this node's
    /// monotonic clock, and never behind the applied time.
    pub(crate) fn activate(&self, term: u64, slack: Duration) -> usize {
        let st = lock(&self.state);
        let mut leader = lock(&self.leader);
        let now = self.clock.now();
        let since_apply = now.saturating_duration_since(st.at).as_millis() as u64;
        let base_ms = st.table.now_ms().saturating_add(since_apply);
        leader.activate(term, &st.table, base_ms, now, slack)
    }

    pub(crate) fn deactivate(&self) {
        lock(&self.leader).deactivate();
    }

    /// The term whose leader duties are active here, if any.
    pub(crate) fn active_term(&self) -> Option<u64> {
        lock(&self.leader).term()
    }

    pub(crate) fn with_leadership<R>(&self, f: impl FnOnce(&mut Leadership) -> R) -> R {
        f(&mut lock(&self.leader))
    }
}

/// On the leader of the entry's term: the renewal of an acquire's session that `reply` granted
/// or queued (S6), as a keepalive at `at` would renew it; `None` for any other op or reply, or
/// a session already expiring.
fn renewal(
    leader: &mut Leadership,
    term: u64,
    op: &Op,
    reply: &Result<Reply, lockd_core::Rejection>,
    at: Instant,
    table: &LockTable,
) -> Option<Renewed> {
    match (op, reply) {
        (
            Op::Acquire { session, .. } | Op::AdoptAndAcquire { session, .. },
            Ok(Reply::Acquired { .. } | Reply::Queued { .. }),
        ) => leader.renew(term, *session, at).map(|ttl_ms| Renewed {
            ttl_ms,
            group_moves: table.move_count(),
        }),
        _ => None,
    }
}
