//! Watch: the core's ownership events ([`LockEvent`]) of a name or a prefix, as they apply on
//! this node's replicas, in each group's log order, resumable by position.
//!
//! A position is `(group, log index)`: the same entry has the same index on every replica, so a
//! watcher may resume on any node that hosts the groups. Every replica's sink hands each applied
//! entry's events to the [`Hub`], which broadcasts them to the open watches and keeps the last
//! `history` events for resumes, from the process's start: so a watcher whose node stopped
//! resumes on another one (the history keeps each entry's events as the replica hands them
//! over: no copy, one ring slot and one broadcast per entry).
//!
//! A watch never slows a group: the broadcast keeps at most `lag_limit` entries for its slowest
//! receiver, and a watch that falls further behind ends with `watch_too_slow`, naming the
//! positions it reached so it can resume. A resume from before what this node kept (or across a
//! snapshot that replaced a replica here) ends with `watch_compacted`: re-read the names, then
//! watch from now. Memory is bounded by `history` (shared) plus `lag_limit` entries (shared).
//!
//! A consumer that stops reading (its connection's writes block) must not keep a watch open
//! for ever: [`pump`] drains the watch in a task of its own into at most [`QUEUED`] encoded
//! events, and a consumer that leaves that queue full for [`STALL_LIMIT`] is cut off with
//! `watch_too_slow`, naming the positions after the last event queued for it.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use lockd_core::LockEvent;
use lockd_proto::v1 as pb;
use lockd_raft::GroupId;
use serde_json::{json, Value};
use tokio::sync::broadcast;

use crate::error::{ApiError, ErrorCode};

/// Events kept per node for resumes (shared by its watches): about 10 MB, up to about 40 MB
/// with the JSON of events SSE watches have sent (kept with its batch, made once).
pub const HISTORY_EVENTS: usize = 65_536;
/// Entries a watch may fall behind before it is cut off.
pub const LAG_LIMIT: usize = 4_096;

/// Encoded events queued per watch for its consumer (one more slot is kept for the error that
/// ends the watch).
pub const QUEUED: usize = 256;

/// How long a consumer may leave its queue full before it is cut off as too slow.
pub const STALL_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The events one applied entry made.
#[derive(Debug)]
pub struct Batch {
    pub group: GroupId,
    pub index: u64,
    pub time_ms: u64,
    /// The wall clock (Unix ms) on this node when its replica applied the entry: for people
    /// to read. Group time (`time_ms`) orders events and measures spans; the two differ by
    /// clock skew, apply delay and any time the group stood still (a whole-cluster restart).
    pub unix_ms: u64,
    pub events: Vec<LockEvent>,
    /// Each event's JSON as SSE sends it, made by the first watch that sends it and shared by
    /// the rest: `[ordinal][admin]` (the admin's copy has session ids).
    json: std::sync::OnceLock<Box<[EncodedTwice]>>,
}

/// One event's JSON: `[without session ids, with them]`, each made at most once.
type EncodedTwice = [std::sync::OnceLock<Arc<str>>; 2];

#[derive(Clone, Debug)]
enum Item {
    Batch(Arc<Batch>),
    /// A snapshot replaced the group's replica here: the events it covered never came.
    Reset(GroupId),
}

/// What one watch selects.
#[derive(Clone, Debug)]
pub enum Selector {
    Name(String),
    Prefix(String),
}

impl Selector {
    pub fn matches(&self, name: &str) -> bool {
        match self {
            Selector::Name(n) => n == name,
            Selector::Prefix(p) => name.starts_with(p.as_str()),
        }
    }
}

/// One event a watch delivers, with where it sits in its group's log: the `ordinal`th event
/// (from 0) of the entry at `index`. The same entry has the same events on every replica.
#[derive(Clone, Debug)]
pub struct Delivered {
    pub group: GroupId,
    pub index: u64,
    pub ordinal: u32,
    pub time_ms: u64,
    batch: Arc<Batch>,
}

impl Delivered {
    pub fn event(&self) -> &LockEvent {
        &self.batch.events[self.ordinal as usize]
    }

    /// The event's JSON (SSE's `data`), encoded once per entry and shared by every watch.
    pub fn json(&self, admin: bool) -> Arc<str> {
        let slots = self.batch.json.get_or_init(|| {
            (0..self.batch.events.len())
                .map(|_| Default::default())
                .collect()
        });
        slots[self.ordinal as usize][usize::from(admin)]
            .get_or_init(|| watch_json(&to_pb(self, admin)).to_string().into())
            .clone()
    }
}

/// How far a watch got in one group: through event `ordinal` of the entry at `index`
/// ([`WHOLE`]: the whole entry).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Pos {
    pub index: u64,
    pub ordinal: u32,
}

/// [`Pos::ordinal`] of a position past every event of its entry.
pub const WHOLE: u32 = u32::MAX;

/// Per group, how far a watch got: what a resume passes as `after`.
pub type Positions = BTreeMap<GroupId, Pos>;

/// `"1:45,2:99.2"`, the form HTTP uses (`after=`, and each event's SSE id): past the whole
/// entry 45 of group 1, and past the first 2 events of entry 99 of group 2 (as gRPC's
/// `WatchPosition.events`).
pub fn format_positions(p: &Positions) -> String {
    p.iter()
        .map(|(g, pos)| match pos.ordinal {
            WHOLE => format!("{g}:{}", pos.index),
            o => format!("{g}:{}.{}", pos.index, o + 1),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `pos` as gRPC's `WatchPosition.events`: how many of the entry's events are past (0: all).
pub fn events_done(pos: Pos) -> u32 {
    match pos.ordinal {
        WHOLE => 0,
        o => o + 1,
    }
}

/// The inverse of [`events_done`].
pub fn pos_of(index: u64, events: u32) -> Pos {
    let ordinal = match events {
        0 => WHOLE,
        k => k - 1,
    };
    Pos { index, ordinal }
}

pub fn parse_positions(s: &str) -> Result<Positions, ApiError> {
    let mut out = Positions::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || {
            ApiError::bad_request(format!(
                "after: '{part}' is not GROUP:INDEX[.EVENTS] (say '1:45,2:99.2': resume past \
                 entry 45 of group 1, and past the first 2 events of entry 99 of group 2)"
            ))
        };
        let (g, rest) = part.split_once(':').ok_or_else(bad)?;
        let g: GroupId = g.parse().map_err(|_| bad())?;
        let (i, o) = match rest.split_once('.') {
            Some((i, k)) => match k.parse::<u32>() {
                Ok(k) if k >= 1 => (i, k - 1),
                _ => return Err(bad()),
            },
            None => (rest, WHOLE),
        };
        let index: u64 = i.parse().map_err(|_| bad())?;
        if out.insert(g, Pos { index, ordinal: o }).is_some() {
            return Err(ApiError::bad_request(format!(
                "after: group {g} is given twice"
            )));
        }
    }
    Ok(out)
}

struct Ring {
    batches: VecDeque<Arc<Batch>>,
    events: usize,
    /// Per group: events at or below this index may be missing here (evicted, before the first
    /// watch, or under a snapshot). `u64::MAX`: unknown until the group's next entry.
    floor: HashMap<GroupId, u64>,
}

/// Where applied events meet the watches.
pub struct Hub {
    tx: broadcast::Sender<Item>,
    ring: Mutex<Ring>,
    history: usize,
    lag_limit: usize,
    /// Watches cut off for falling too far behind, since start (`lockd_watches_too_slow_total`).
    too_slow: Arc<std::sync::atomic::AtomicU64>,
}

impl Hub {
    /// `history`: events kept for resumes; `lag_limit`: entries a watch may fall behind.
    pub fn new(history: usize, lag_limit: usize) -> Hub {
        let (tx, _) = broadcast::channel(lag_limit.max(1));
        Hub {
            tx,
            ring: Mutex::new(Ring {
                batches: VecDeque::new(),
                events: 0,
                floor: HashMap::new(),
            }),
            history,
            lag_limit,
            too_slow: Arc::default(),
        }
    }

    /// One applied entry's events (every replica, log order), kept as they are handed over.
    pub fn publish(&self, group: GroupId, index: u64, time_ms: u64, events: Vec<LockEvent>) {
        let batch = Arc::new(Batch {
            group,
            index,
            time_ms,
            unix_ms: crate::backup::unix_ms_now(),
            events,
            json: std::sync::OnceLock::new(),
        });
        {
            let mut r = self.ring.lock().expect("watch ring");
            let floor = r.floor.entry(group).or_insert(u64::MAX);
            if *floor == u64::MAX {
                *floor = index.saturating_sub(1);
            }
            r.events += batch.events.len();
            r.batches.push_back(batch.clone());
            while r.events > self.history {
                let Some(old) = r.batches.pop_front() else {
                    break;
                };
                r.events -= old.events.len();
                let f = r.floor.entry(old.group).or_insert(0);
                *f = (*f).max(old.index);
            }
        }
        let _ = self.tx.send(Item::Batch(batch));
    }

    /// A snapshot replaced `group`'s replica here: watches of it end, resumes into it fail.
    pub fn reset(&self, group: GroupId) {
        {
            let mut r = self.ring.lock().expect("watch ring");
            r.batches.retain(|b| b.group != group);
            r.events = r.batches.iter().map(|b| b.events.len()).sum();
            r.floor.insert(group, u64::MAX);
        }
        let _ = self.tx.send(Item::Reset(group));
    }

    /// Opens a watch of `groups` (each with the index applied here now), resuming after
    /// `after` where given (live from now for the other groups).
    pub fn open(
        &self,
        selector: Selector,
        groups: &[(GroupId, u64)],
        after: &Positions,
    ) -> Result<Watch, ApiError> {
        // Subscribe first, then read the history: an entry published in between is in both,
        // and the watch drops the repeat by its index.
        let rx = self.tx.subscribe();
        let mut backlog = VecDeque::new();
        {
            let mut r = self.ring.lock().expect("watch ring");
            for (g, applied) in groups {
                // No entry of this group came since the start: what was applied is missing.
                r.floor.entry(*g).or_insert(*applied);
            }
            for (g, pos) in after {
                // A partly delivered entry must still be here; a whole one only before it.
                let need = if pos.ordinal == WHOLE {
                    pos.index
                } else {
                    pos.index.saturating_sub(1)
                };
                let from = &need;
                if !groups.iter().any(|(x, _)| x == g) {
                    return Err(ApiError::bad_request(format!(
                        "after: group {g} holds none of the watched names here"
                    )));
                }
                let floor = r.floor.get(g).copied().unwrap_or(u64::MAX);
                if *from < floor {
                    return Err(compacted(format!(
                        "after: group {g} position {from} is older than this node keeps (from \
                         {}): re-read the names, then watch from now",
                        if floor == u64::MAX {
                            "its next entry".to_string()
                        } else {
                            format!("after {floor}")
                        }
                    )));
                }
            }
            for b in &r.batches {
                if after
                    .get(&b.group)
                    .is_some_and(|from| b.index >= from.index)
                {
                    backlog.push_back(b.clone());
                }
            }
        }
        Ok(Watch {
            rx,
            backlog,
            pending: VecDeque::new(),
            selector,
            groups: groups.iter().map(|(g, _)| *g).collect(),
            seen: after.clone(),
            delivered: after.clone(),
            lag_limit: self.lag_limit,
            too_slow: self.too_slow.clone(),
            recheck: None,
        })
    }

    /// Watches open on this node now.
    pub fn open_watches(&self) -> usize {
        self.tx.receiver_count()
    }

    /// Watches cut off as too slow since start.
    pub fn cut_off_too_slow(&self) -> u64 {
        self.too_slow.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Drains `w` in a task of its own into a queue of [`QUEUED`] items for its consumer (an SSE or
/// gRPC stream): `event` encodes an event with the positions after it, `end` the error that ends
/// the watch. A consumer that leaves the queue full for [`STALL_LIMIT`] is cut off with
/// `watch_too_slow`. The task ends with the watch or when the consumer goes away.
pub fn pump<T: Send + 'static>(
    w: Watch,
    event: impl Fn(&Delivered, &Positions) -> T + Send + 'static,
    end: impl Fn(ApiError) -> T + Send + 'static,
) -> tokio::sync::mpsc::Receiver<T> {
    pump_with(w, STALL_LIMIT, event, end)
}

fn pump_with<T: Send + 'static>(
    mut w: Watch,
    stall_limit: std::time::Duration,
    event: impl Fn(&Delivered, &Positions) -> T + Send + 'static,
    end: impl Fn(ApiError) -> T + Send + 'static,
) -> tokio::sync::mpsc::Receiver<T> {
    let (tx, rx) = tokio::sync::mpsc::channel::<T>(QUEUED + 1);
    tokio::spawn(async move {
        // The positions after the last event queued: where the consumer resumes if cut off.
        let mut queued = w.positions().clone();
        loop {
            let next = tokio::select! {
                n = w.next() => n,
                () = tx.closed() => return,
            };
            let item = match next {
                None => return,
                Some(Ok(d)) => event(&d, w.positions()),
                Some(Err(e)) => {
                    let _ = tx.try_send(end(e));
                    return;
                }
            };
            // Two free slots: one for this event, one kept for the error that may end the watch.
            match tokio::time::timeout(stall_limit, tx.reserve_many(2)).await {
                Ok(Ok(mut permits)) => {
                    if let Some(p) = permits.next() {
                        p.send(item);
                    }
                    queued.clone_from(w.positions());
                }
                Ok(Err(_)) => return, // the consumer went away
                Err(_) => {
                    w.too_slow
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let e = ApiError::new(
                        ErrorCode::WatchTooSlow,
                        format!(
                            "this watch's consumer left {QUEUED} events unread for {:?} and was \
                             cut off; resume with after={}",
                            stall_limit,
                            format_positions(&queued)
                        ),
                    );
                    let _ = tx.try_send(end(e));
                    return;
                }
            }
        }
    });
    rx
}

fn compacted(msg: String) -> ApiError {
    ApiError::new(ErrorCode::WatchCompacted, msg)
}

/// One open watch: [`Watch::next`] yields its events in order.
pub struct Watch {
    rx: broadcast::Receiver<Item>,
    backlog: VecDeque<Arc<Batch>>,
    pending: VecDeque<Delivered>,
    selector: Selector,
    groups: Vec<GroupId>,
    /// Per group, the entries taken from the broadcast (repeats are dropped by this).
    seen: Positions,
    /// Per group, what the caller has been handed.
    delivered: Positions,
    lag_limit: usize,
    too_slow: Arc<std::sync::atomic::AtomicU64>,
    /// Checks the watcher's credential again: before an event goes out, at most every
    /// [`RECHECK_EVERY`]. An error ends the watch with it.
    recheck: Option<(Recheck, std::time::Instant)>,
}

/// A watch's authorization, checked again while it runs ([`Watch::recheck`]).
pub type Recheck = Box<dyn Fn() -> Result<(), ApiError> + Send + Sync>;

/// How often a running watch checks its credential again (a rotated token ends it within this).
pub const RECHECK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

impl Watch {
    /// Has `check` run again before events go out, at most every [`RECHECK_EVERY`].
    pub fn recheck(&mut self, check: Recheck) {
        self.recheck = Some((check, std::time::Instant::now()));
    }

    /// Runs the recheck if it is due.
    fn authorized(&mut self) -> Result<(), ApiError> {
        match &mut self.recheck {
            Some((check, at)) if at.elapsed() >= RECHECK_EVERY => {
                *at = std::time::Instant::now();
                check()
            }
            _ => Ok(()),
        }
    }

    /// The positions delivered so far (what a resume passes as `after`).
    pub fn positions(&self) -> &Positions {
        &self.delivered
    }

    /// The next event, or the error that ends the watch. `None`: the node is stopping.
    pub async fn next(&mut self) -> Option<Result<Delivered, ApiError>> {
        loop {
            if !self.pending.is_empty() {
                if let Err(e) = self.authorized() {
                    return Some(Err(e));
                }
            }
            if let Some(d) = self.pending.pop_front() {
                // The last event of its entry that the watch wants: past it is the whole entry.
                let last = self.pending.front().is_none_or(|n| n.index != d.index);
                let ordinal = if last { WHOLE } else { d.ordinal };
                self.delivered.insert(
                    d.group,
                    Pos {
                        index: d.index,
                        ordinal,
                    },
                );
                return Some(Ok(d));
            }
            let batch = match self.backlog.pop_front() {
                Some(b) => b,
                None => match self.receive().await? {
                    Ok(b) => b,
                    Err(e) => return Some(Err(e)),
                },
            };
            self.take(&batch);
        }
    }

    /// The next entry from the hub, or the error that ends the watch. `None`: the node is
    /// stopping.
    async fn receive(&mut self) -> Option<Result<Arc<Batch>, ApiError>> {
        loop {
            match self.rx.recv().await {
                Ok(Item::Batch(b)) => return Some(Ok(b)),
                Ok(Item::Reset(g)) if self.groups.contains(&g) => {
                    return Some(Err(compacted(format!(
                        "group {g}'s replica on this node was replaced by a snapshot, so some \
                         of its events never came here; re-read the names, then watch again \
                         (resume after {} may work on another node)",
                        format_positions(&self.delivered)
                    ))))
                }
                Ok(Item::Reset(_)) => continue,
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    self.too_slow
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    return Some(Err(ApiError::new(
                        ErrorCode::WatchTooSlow,
                        format!(
                            "this watch fell more than {} entries behind ({n} skipped) and was \
                             cut off so it cannot slow the groups; resume with after={}",
                            self.lag_limit,
                            format_positions(&self.delivered)
                        ),
                    )));
                }
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }

    /// Queues the events of `batch` that this watch selects and has not taken yet.
    fn take(&mut self, batch: &Arc<Batch>) {
        // From the first event past what was taken of this group: a whole later entry, or
        // the rest of a partly delivered one.
        let from = match self.seen.get(&batch.group) {
            _ if !self.groups.contains(&batch.group) => return,
            Some(p) if batch.index < p.index => return,
            Some(p) if batch.index == p.index => match p.ordinal {
                WHOLE => return,
                o => o + 1,
            },
            _ => 0,
        };
        let whole = Pos {
            index: batch.index,
            ordinal: WHOLE,
        };
        self.seen.insert(batch.group, whole);
        for (ordinal, e) in batch.events.iter().enumerate().skip(from as usize) {
            if event_name(e).is_some_and(|n| self.selector.matches(n)) {
                self.pending.push_back(Delivered {
                    group: batch.group,
                    index: batch.index,
                    ordinal: ordinal as u32,
                    time_ms: batch.time_ms,
                    batch: batch.clone(),
                });
            }
        }
        if self.pending.is_empty() {
            // Nothing here for this watch: it is past the whole entry all the same.
            self.delivered.insert(batch.group, whole);
        }
    }
}

/// `d` as the API sends it; session ids only to the admin (as inspect shows them).
pub fn to_pb(d: &Delivered, admin: bool) -> lockd_proto::v1::WatchEvent {
    let mut out = pb::WatchEvent {
        group: d.group,
        index: d.index,
        time_ms: d.time_ms,
        unix_ms: d.batch.unix_ms,
        ..Default::default()
    };
    let sid = |s: lockd_core::SessionId| if admin { s.to_string() } else { String::new() };
    match d.event() {
        e @ (LockEvent::WaitStarted { .. } | LockEvent::WaitEnded { .. }) => {
            wait_to_pb(e, &sid, &mut out)
        }
        LockEvent::SessionEnded { .. } | LockEvent::SessionAdopted { .. } => {}
        e @ (LockEvent::HoldStarted { .. }
        | LockEvent::HoldEnded { .. }
        | LockEvent::HoldMovedOut { .. }
        | LockEvent::HoldMovedIn { .. }) => hold_to_pb(e, &sid, &mut out),
    }
    out
}

/// A lock mode as `WatchEvent.mode` and `limit` say it.
fn set_mode(m: lockd_core::LockMode, out: &mut pb::WatchEvent) {
    use lockd_core::LockMode;
    let (mode, limit) = match m {
        LockMode::Exclusive => (pb::Mode::Exclusive, 0),
        LockMode::Shared => (pb::Mode::Shared, 0),
        LockMode::Semaphore { limit } => (pb::Mode::Semaphore, limit),
    };
    out.mode = mode as i32;
    out.limit = limit;
}

/// The fields of a hold's event (started, ended, moved out or in); `sid` shows a session id
/// (empty unless the watcher is the admin).
fn hold_to_pb(
    e: &LockEvent,
    sid: &dyn Fn(lockd_core::SessionId) -> String,
    out: &mut pb::WatchEvent,
) {
    match e {
        LockEvent::HoldStarted {
            name,
            session,
            owner,
            token,
            mode: m,
            waiter,
            waited_ms,
            lease_ttl_ms,
        } => {
            out.kind = "hold_started".into();
            out.name = name.to_string();
            out.session_id = sid(*session);
            out.owner = owner.to_string();
            out.fencing_token = *token;
            set_mode(*m, out);
            out.waiter = waiter.unwrap_or(0);
            out.waited_ms = *waited_ms;
            out.lease_ttl_ms = *lease_ttl_ms;
        }
        LockEvent::HoldEnded {
            name,
            session,
            token,
            cause,
            held_ms,
            lock_delay_until_ms,
        } => {
            out.kind = "hold_ended".into();
            out.name = name.to_string();
            out.session_id = sid(*session);
            out.fencing_token = *token;
            out.cause = cause.as_str().into();
            out.held_ms = *held_ms;
            out.lock_delay_until_ms = *lock_delay_until_ms;
        }
        LockEvent::HoldMovedOut {
            name,
            session,
            token,
        } => {
            out.kind = "hold_moved_out".into();
            out.name = name.to_string();
            out.session_id = sid(*session);
            out.fencing_token = *token;
        }
        LockEvent::HoldMovedIn {
            name,
            session,
            owner,
            token,
            mode: m,
        } => {
            out.kind = "hold_moved_in".into();
            out.name = name.to_string();
            out.session_id = sid(*session);
            out.owner = owner.to_string();
            out.fencing_token = *token;
            set_mode(*m, out);
        }
        _ => {} // `to_pb` (exhaustive) sends only a hold's events here
    }
}

/// The fields of a wait's event (started or ended); `sid` as for [`hold_to_pb`].
fn wait_to_pb(
    e: &LockEvent,
    sid: &dyn Fn(lockd_core::SessionId) -> String,
    out: &mut pb::WatchEvent,
) {
    use lockd_core::WaitEndReason;
    match e {
        LockEvent::WaitStarted {
            name,
            waiter,
            session,
            owner,
            mode: m,
            position,
            deadline_ms,
        } => {
            out.kind = "wait_started".into();
            out.name = name.to_string();
            out.waiter = *waiter;
            out.session_id = sid(*session);
            out.owner = owner.to_string();
            set_mode(*m, out);
            out.position = *position;
            out.deadline_ms = *deadline_ms;
        }
        LockEvent::WaitEnded {
            name,
            waiter,
            session,
            reason,
            waited_ms,
        } => {
            out.kind = "wait_ended".into();
            out.name = name.to_string();
            out.waiter = *waiter;
            out.session_id = sid(*session);
            out.cause = match reason {
                WaitEndReason::TimedOut => "timed_out",
                WaitEndReason::SessionEnded => "session_ended",
                WaitEndReason::Moved => "moved",
            }
            .into();
            out.waited_ms = *waited_ms;
        }
        _ => {} // `to_pb` (exhaustive) sends only a wait's events here
    }
}

/// A watch event as JSON: the fields of gRPC's `WatchEvent` that apply to its kind.
pub fn watch_json(e: &pb::WatchEvent) -> Value {
    let mode = match pb::Mode::try_from(e.mode) {
        Ok(pb::Mode::Shared) => "shared",
        Ok(pb::Mode::Semaphore) => "semaphore",
        _ => "exclusive",
    };
    let mut v = json!({
        "group": e.group, "index": e.index, "time_ms": e.time_ms, "unix_ms": e.unix_ms,
        "kind": e.kind, "name": e.name,
    });
    let o = v.as_object_mut().expect("an object");
    let mut put = |k: &str, x: Value| {
        o.insert(k.into(), x);
    };
    if !e.session_id.is_empty() {
        put("session_id", json!(e.session_id));
    }
    match e.kind.as_str() {
        "hold_started" | "hold_moved_in" => {
            put("owner", json!(e.owner));
            put("fencing_token", json!(e.fencing_token));
            put("mode", json!(mode));
            if e.limit != 0 {
                put("limit", json!(e.limit));
            }
            if e.kind == "hold_started" {
                put("lease_ttl_ms", json!(e.lease_ttl_ms));
                if e.waiter != 0 {
                    put("waiter", json!(e.waiter));
                    put("waited_ms", json!(e.waited_ms));
                }
            }
        }
        "hold_ended" => {
            put("fencing_token", json!(e.fencing_token));
            put("cause", json!(e.cause));
            put("held_ms", json!(e.held_ms));
            put("lock_delay_until_ms", json!(e.lock_delay_until_ms));
        }
        "hold_moved_out" => put("fencing_token", json!(e.fencing_token)),
        "wait_started" => {
            put("waiter", json!(e.waiter));
            put("owner", json!(e.owner));
            put("mode", json!(mode));
            if e.limit != 0 {
                put("limit", json!(e.limit));
            }
            put("position", json!(e.position));
            put("deadline_ms", json!(e.deadline_ms));
        }
        "wait_ended" => {
            put("waiter", json!(e.waiter));
            put("cause", json!(e.cause));
            put("waited_ms", json!(e.waited_ms));
        }
        _ => {}
    }
    v
}

/// The kind of an event as the API names it (SSE's `event:`).
pub fn kind(e: &LockEvent) -> &'static str {
    match e {
        LockEvent::HoldStarted { .. } => "hold_started",
        LockEvent::HoldEnded { .. } => "hold_ended",
        LockEvent::HoldMovedOut { .. } => "hold_moved_out",
        LockEvent::HoldMovedIn { .. } => "hold_moved_in",
        LockEvent::WaitStarted { .. } => "wait_started",
        LockEvent::WaitEnded { .. } => "wait_ended",
        LockEvent::SessionEnded { .. } => "session_ended",
        LockEvent::SessionAdopted { .. } => "session_adopted",
    }
}

/// The name an event is about (session events are about none).
pub fn event_name(e: &LockEvent) -> Option<&str> {
    match e {
        LockEvent::HoldStarted { name, .. }
        | LockEvent::HoldEnded { name, .. }
        | LockEvent::HoldMovedOut { name, .. }
        | LockEvent::HoldMovedIn { name, .. }
        | LockEvent::WaitStarted { name, .. }
        | LockEvent::WaitEnded { name, .. } => Some(name),
        LockEvent::SessionEnded { .. } | LockEvent::SessionAdopted { .. } => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockd_core::{HoldEndCause, LockMode, SessionId};

    fn started(name: &str, token: u64) -> LockEvent {
        LockEvent::HoldStarted {
            name: name.into(),
            session: SessionId(1),
            owner: "o".into(),
            token,
            mode: LockMode::Exclusive,
            waiter: None,
            waited_ms: 0,
            lease_ttl_ms: 1000,
        }
    }

    fn ended(name: &str, token: u64) -> LockEvent {
        LockEvent::HoldEnded {
            name: name.into(),
            session: SessionId(1),
            token,
            cause: HoldEndCause::Released,
            held_ms: 1,
            lock_delay_until_ms: 0,
        }
    }

    fn at(p: &[(u32, u64)]) -> Positions {
        p.iter()
            .map(|(g, i)| {
                let pos = Pos {
                    index: *i,
                    ordinal: WHOLE,
                };
                (*g, pos)
            })
            .collect()
    }

    async fn take(w: &mut Watch, n: usize) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        for _ in 0..n {
            let d = w.next().await.unwrap().unwrap();
            out.push((d.group, d.index));
        }
        out
    }

    #[tokio::test]
    async fn resumes_after_a_position_without_a_gap_or_a_repeat() {
        let hub = Hub::new(100, 100);
        let sel = Selector::Prefix("a/".into());
        let mut w = hub
            .open(sel.clone(), &[(1, 10)], &Positions::new())
            .unwrap();
        hub.publish(1, 11, 0, vec![started("a/x", 1), started("b/y", 2)]);
        hub.publish(1, 12, 0, vec![ended("a/x", 1)]);
        assert_eq!(take(&mut w, 2).await, vec![(1, 11), (1, 12)]);
        // A second watch resumes after 11: it gets 12 from history, then live 13, once each.
        let mut r = hub.open(sel, &[(1, 12)], &at(&[(1, 11)])).unwrap();
        hub.publish(1, 13, 0, vec![started("a/z", 3)]);
        assert_eq!(take(&mut r, 2).await, vec![(1, 12), (1, 13)]);
        assert_eq!(r.positions(), &at(&[(1, 13)]));
    }

    #[tokio::test]
    async fn a_resume_from_before_what_was_kept_is_refused() {
        let hub = Hub::new(2, 100);
        let sel = Selector::Name("a".into());
        // Nothing came since the start, when index 10 was applied.
        let e = hub
            .open(sel.clone(), &[(1, 10)], &at(&[(1, 9)]))
            .err()
            .unwrap();
        assert_eq!(e.code, ErrorCode::WatchCompacted);
        let _w = hub.open(sel.clone(), &[(1, 10)], &at(&[(1, 10)])).unwrap();
        for i in 11..=14 {
            hub.publish(1, i, 0, vec![started("a", i)]);
        }
        // History holds 2 events: 13 and 14; a resume after 12 is whole, after 11 is not.
        assert!(hub.open(sel.clone(), &[(1, 14)], &at(&[(1, 12)])).is_ok());
        let e = hub
            .open(sel.clone(), &[(1, 14)], &at(&[(1, 11)]))
            .err()
            .unwrap();
        assert_eq!(e.code, ErrorCode::WatchCompacted);
        // A snapshot ends the watches of its group and refuses resumes into it.
        let mut w = hub
            .open(sel.clone(), &[(1, 14)], &Positions::new())
            .unwrap();
        hub.reset(1);
        assert_eq!(
            w.next().await.unwrap().err().unwrap().code,
            ErrorCode::WatchCompacted
        );
        let e = hub.open(sel, &[(1, 14)], &at(&[(1, 14)])).err().unwrap();
        assert_eq!(e.code, ErrorCode::WatchCompacted);
    }

    #[tokio::test]
    async fn a_consumer_that_stops_reading_is_cut_off_and_told_where_to_resume() {
        let hub = Hub::new(10_000, 10_000);
        let w = hub
            .open(
                Selector::Prefix(String::new()),
                &[(1, 0)],
                &Positions::new(),
            )
            .unwrap();
        let mut rx = pump_with(
            w,
            std::time::Duration::from_millis(200),
            |d, _| Ok(d.index),
            Err,
        );
        for i in 1..=(QUEUED as u64 + 50) {
            hub.publish(1, i, 0, vec![started("a", i)]);
        }
        // Nobody reads: the queue fills, and after the stall limit the watch is cut off.
        tokio::time::sleep(std::time::Duration::from_millis(600)).await;
        let mut got = Vec::new();
        let err = loop {
            match rx.recv().await.expect("the watch ends with an error") {
                Ok(i) => got.push(i),
                Err(e) => break e,
            }
        };
        assert_eq!(got, (1..=QUEUED as u64).collect::<Vec<_>>());
        assert_eq!(err.code, ErrorCode::WatchTooSlow);
        let after = format!("after=1:{QUEUED}");
        assert!(err.message.contains(&after), "{}", err.message);
        assert!(rx.recv().await.is_none(), "nothing after the error");
        assert_eq!(hub.cut_off_too_slow(), 1);
        assert_eq!(hub.open_watches(), 0, "the pump let the watch go");
    }

    #[tokio::test]
    async fn a_watch_that_falls_behind_is_cut_off_with_its_position() {
        let hub = Hub::new(1000, 4);
        let mut w = hub
            .open(
                Selector::Prefix(String::new()),
                &[(1, 0)],
                &Positions::new(),
            )
            .unwrap();
        assert_eq!((hub.open_watches(), hub.cut_off_too_slow()), (1, 0));
        hub.publish(1, 1, 0, vec![started("a", 1)]);
        assert_eq!(take(&mut w, 1).await, vec![(1, 1)]);
        for i in 2..=10 {
            hub.publish(1, i, 0, vec![started("a", i)]);
        }
        let e = w.next().await.unwrap().err().unwrap();
        assert_eq!(e.code, ErrorCode::WatchTooSlow);
        assert!(e.message.contains("after=1:1"), "{}", e.message);
        assert_eq!(
            hub.cut_off_too_slow(),
            1,
            "counted for lockd_watches_too_slow_total"
        );
        drop(w);
        assert_eq!(hub.open_watches(), 0);
    }

    #[tokio::test]
    async fn a_resume_inside_an_entry_gets_the_rest_of_it_once() {
        let hub = Hub::new(100, 100);
        let sel = Selector::Prefix("a".into());
        let mut w = hub.open(sel.clone(), &[(1, 0)], &Positions::new()).unwrap();
        hub.publish(
            1,
            1,
            0,
            vec![started("a1", 1), started("b", 2), started("a2", 3)],
        );
        let first = w.next().await.unwrap().unwrap();
        assert_eq!((first.index, first.ordinal), (1, 0));
        // Cut off after the first of the entry's two wanted events: the rest comes once.
        assert_eq!(format_positions(w.positions()), "1:1.1");
        let after = parse_positions("1:1.1").unwrap();
        let mut r = hub.open(sel, &[(1, 1)], &after).unwrap();
        let d = r.next().await.unwrap().unwrap();
        assert_eq!((d.index, d.ordinal), (1, 2));
        assert_eq!(format_positions(r.positions()), "1:1");
        hub.publish(1, 2, 0, vec![started("a3", 4)]);
        assert_eq!(take(&mut r, 1).await, vec![(1, 2)]);
    }

    #[test]
    fn positions_parse_and_print_the_same() {
        for s in ["", "1:45", "1:45,2:99.2", "3:0.1"] {
            assert_eq!(format_positions(&parse_positions(s).unwrap()), s);
        }
        for bad in ["1", "x:1", "1:x", "1:2.x", "1:2.0", "1:2,1:3"] {
            assert!(parse_positions(bad).is_err(), "{bad}");
        }
    }
}
