//! What the contention view adds to the state machine's scan (`LockTable::contention`): how
//! often each contended name changes hands, and from that an estimate of how long a queued
//! acquire will wait.
//!
//! Fed by the ownership events of every replica on this node (leader or follower: every
//! replica applies the same events, so any member can answer). Only names that someone waited
//! on are tracked, at most [`NAMES_PER_GROUP`] per group: the least recently contended are
//! forgotten first. Nothing here is replicated or decides an outcome.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use lockd_core::LockEvent;
use lockd_raft::GroupId;

/// Names tracked per group; past it the least recently active quarter is forgotten.
pub const NAMES_PER_GROUP: usize = 4_096;

/// The hand-off rate's time constant: a rate over roughly the last ten seconds.
const TAU_MS: f64 = 10_000.0;

/// Weight of the newest sample in the moving averages of hold time and hand-off interval.
const ALPHA: f64 = 0.3;

#[derive(Default)]
struct Name {
    /// Hand-offs per millisecond, decayed to `at_ms`.
    rate: f64,
    /// Group time of the last event that touched this entry.
    at_ms: u64,
    /// Group time of the last hand-off (0: none yet).
    handoff_at_ms: u64,
    /// Moving averages (0: no sample yet).
    interval_ms: f64,
    hold_ms: f64,
}

impl Name {
    fn decayed_rate(&self, now_ms: u64) -> f64 {
        let dt = now_ms.saturating_sub(self.at_ms) as f64;
        self.rate * (-dt / TAU_MS).exp()
    }

    /// The time one place in the queue is worth: the observed interval between hand-offs
    /// (which accounts for shared and semaphore holders overlapping), else the mean hold.
    fn service_ms(&self) -> Option<f64> {
        [self.interval_ms, self.hold_ms]
            .into_iter()
            .find(|ms| *ms > 0.0)
    }
}

fn average(avg: &mut f64, sample: f64) {
    *avg = if *avg == 0.0 {
        sample
    } else {
        ALPHA * sample + (1.0 - ALPHA) * *avg
    };
}

/// The hand-off tracker of every group on this node.
#[derive(Default)]
pub struct Handoffs {
    groups: Mutex<HashMap<GroupId, HashMap<Arc<str>, Name>>>,
    /// The last longest-holds pass of each group ([`Report::of_replica`]).
    held: Mutex<HashMap<GroupId, HeldPass>>,
}

impl Handoffs {
    /// Takes in the events of one applied entry at group time `now_ms`.
    pub fn observe(&self, group: GroupId, now_ms: u64, events: &[LockEvent]) {
        let relevant = events.iter().any(|e| {
            matches!(
                e,
                LockEvent::WaitStarted { .. }
                    | LockEvent::HoldStarted {
                        waiter: Some(_),
                        ..
                    }
                    | LockEvent::HoldEnded { .. }
            )
        });
        if !relevant {
            return;
        }
        let mut groups = self.groups.lock().expect("handoffs lock");
        let names = groups.entry(group).or_default();
        for e in events {
            match e {
                LockEvent::WaitStarted { name, .. } => {
                    if !names.contains_key(name) && names.len() >= NAMES_PER_GROUP {
                        forget_oldest_quarter(names);
                    }
                    names.entry(name.clone()).or_default().at_ms = now_ms;
                }
                LockEvent::HoldStarted {
                    name,
                    waiter: Some(_),
                    ..
                } => {
                    if let Some(n) = names.get_mut(name) {
                        n.rate = n.decayed_rate(now_ms) + 1.0 / TAU_MS;
                        if n.handoff_at_ms != 0 {
                            average(
                                &mut n.interval_ms,
                                now_ms.saturating_sub(n.handoff_at_ms) as f64,
                            );
                        }
                        n.handoff_at_ms = now_ms;
                        n.at_ms = now_ms;
                    }
                }
                LockEvent::HoldEnded { name, held_ms, .. } => {
                    if let Some(n) = names.get_mut(name) {
                        average(&mut n.hold_ms, *held_ms as f64);
                    }
                }
                _ => {}
            }
        }
    }

    /// Forgets `group` (its replica restarted from a snapshot, or left this node).
    pub fn reset(&self, group: GroupId) {
        self.groups.lock().expect("handoffs lock").remove(&group);
        self.held.lock().expect("held lock").remove(&group);
    }

    /// A pass of `group` younger than [`HELD_REUSE`] that answers `top` over `namespaces`.
    fn reuse_held(
        &self,
        group: GroupId,
        top: usize,
        namespaces: Option<&[String]>,
    ) -> Option<(Vec<String>, u64)> {
        let held = self.held.lock().expect("held lock");
        let p = held.get(&group)?;
        (p.at.elapsed() < HELD_REUSE && p.top >= top && p.namespaces.as_deref() == namespaces)
            .then(|| (p.names.iter().take(top).cloned().collect(), p.scanned))
    }

    fn keep_held(
        &self,
        group: GroupId,
        top: usize,
        namespaces: Option<&[String]>,
        names: Vec<String>,
        scanned: u64,
    ) {
        self.held.lock().expect("held lock").insert(
            group,
            HeldPass {
                at: std::time::Instant::now(),
                top,
                namespaces: namespaces.map(<[String]>::to_vec),
                names,
                scanned,
            },
        );
    }

    /// Hand-offs per second of `name` around group time `now_ms` (0 if not tracked).
    pub fn per_second(&self, group: GroupId, name: &str, now_ms: u64) -> f64 {
        let groups = self.groups.lock().expect("handoffs lock");
        groups
            .get(&group)
            .and_then(|g| g.get(name))
            .map_or(0.0, |n| n.decayed_rate(now_ms) * 1000.0)
    }

    /// An estimate of how long the acquire at queue `position` (1 = next) of `name` waits:
    /// `position` times the name's observed hand-off interval or mean hold. `None` while the
    /// name has no history here.
    pub fn estimate_ms(&self, group: GroupId, name: &str, position: u32) -> Option<u64> {
        let groups = self.groups.lock().expect("handoffs lock");
        let service = groups.get(&group)?.get(name)?.service_ms()?;
        Some((service * f64::from(position.max(1))).round() as u64)
    }

    /// The `top` names of `group` by hand-off rate at `now_ms` among those `keep` accepts,
    /// fastest first, ties by name.
    pub fn top(
        &self,
        group: GroupId,
        top: usize,
        now_ms: u64,
        keep: impl Fn(&str) -> bool,
    ) -> Vec<(String, f64)> {
        let groups = self.groups.lock().expect("handoffs lock");
        let Some(names) = groups.get(&group) else {
            return Vec::new();
        };
        let mut v: Vec<(String, f64)> = names
            .iter()
            .map(|(name, n)| (name, n.decayed_rate(now_ms) * 1000.0))
            // Below one hand-off a minute the name is no longer hot.
            .filter(|(name, r)| *r >= 1.0 / 60.0 && keep(name))
            .map(|(name, r)| (name.to_string(), r))
            .collect();
        v.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v.truncate(top);
        v
    }
}

/// Most names a contention report lists per measure (`top`).
pub const MAX_TOP: usize = 100;

/// Records one step of the longest-holds pass reads while it holds a replica's state: at most
/// ~3 ms (2.7 ms measured at 1M held; each record is a cache miss away).
pub const HELD_STEP: usize = 8_192;

/// How long a finished longest-holds pass is reused.
pub const HELD_REUSE: std::time::Duration = std::time::Duration::from_secs(2);

/// A finished longest-holds pass of one group.
struct HeldPass {
    at: std::time::Instant,
    top: usize,
    namespaces: Option<Vec<String>>,
    names: Vec<String>,
    scanned: u64,
}

/// One name in a contention report.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HotName {
    pub name: String,
    pub namespace: String,
    pub group: GroupId,
    pub holders: u32,
    pub waiters: u32,
    pub held_for_ms: u64,
    pub longest_wait_ms: u64,
    pub handoffs_per_s: f64,
    /// What a new acquire of the name would wait, from its hand-off history (`None`: none).
    pub wait_estimate_ms: Option<u64>,
}

/// The top names by four measures, each list largest first.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Report {
    pub most_waiters: Vec<HotName>,
    pub longest_waits: Vec<HotName>,
    pub most_handoffs: Vec<HotName>,
    pub longest_held: Vec<HotName>,
    /// Records read by the scans (names held, waited on or delayed, in the namespaces shown).
    pub scanned: u64,
}

impl Report {
    /// One group's part, from this node's replica of it as applied so far (not a
    /// linearizable read: a follower's view may trail the leader by its replication lag).
    ///
    /// Waiters and waits come from the names with waiters (cheap); the longest holds need a
    /// pass over every record, made in steps of [`HELD_STEP`] records with the replica's state
    /// released between them, and reused for [`HELD_REUSE`] (several dashboards polling cost
    /// one pass).
    pub async fn of_replica(
        group: &lockd_raft::Group,
        tracker: &Handoffs,
        top: usize,
        namespaces: Option<&[String]>,
    ) -> Report {
        let id = group.id();
        let now = group.now_ms();
        let (waiting, hot) = group.read_local(|t| {
            let hot: Vec<String> = tracker
                .top(id, top, now, |name| {
                    namespaces.is_none_or(|ns| ns.contains(&t.namespace_for(name).name))
                })
                .into_iter()
                .map(|(name, _)| name)
                .collect();
            let hot = t.contended(hot.iter().map(String::as_str).collect(), now);
            (t.waiting(top, now, namespaces), hot)
        });
        let (held, scanned) = match tracker.reuse_held(id, top, namespaces) {
            Some(pass) => pass,
            None => {
                let (names, scanned) = longest_held_pass(group, top, now, namespaces).await;
                tracker.keep_held(id, top, namespaces, names.clone(), scanned);
                (names, scanned)
            }
        };
        // The pass's names, as they are now (a reused pass's times move on; a freed name drops).
        // Group time first: it reads the replica's state, which is not reentrant.
        let later = group.now_ms();
        let mut longest_held =
            group.read_local(|t| t.contended(held.iter().map(String::as_str).collect(), later));
        longest_held.retain(|c| c.holders > 0);
        longest_held.sort_by(|a, b| {
            b.held_for_ms
                .cmp(&a.held_for_ms)
                .then_with(|| a.name.cmp(&b.name))
        });
        let hot_name = |c: lockd_core::Contended| HotName {
            handoffs_per_s: tracker.per_second(id, &c.name, now),
            wait_estimate_ms: tracker.estimate_ms(id, &c.name, c.waiters + 1),
            name: c.name,
            namespace: c.namespace,
            group: id,
            holders: c.holders,
            waiters: c.waiters,
            held_for_ms: c.held_for_ms,
            longest_wait_ms: c.longest_wait_ms,
        };
        let list = |v: Vec<lockd_core::Contended>| v.into_iter().map(hot_name).collect();
        Report {
            most_waiters: list(waiting.most_waiters),
            longest_waits: list(waiting.longest_waits),
            most_handoffs: list(hot),
            longest_held: list(longest_held),
            scanned: scanned.max(waiting.scanned),
        }
    }

    /// Folds another group's part in, keeping the `top` of each measure.
    pub fn merge(&mut self, other: Report, top: usize) {
        fn keep(v: &mut Vec<HotName>, more: Vec<HotName>, top: usize, key: fn(&HotName) -> f64) {
            v.extend(more);
            v.sort_by(|a, b| key(b).total_cmp(&key(a)).then_with(|| a.name.cmp(&b.name)));
            v.truncate(top);
        }
        keep(&mut self.most_waiters, other.most_waiters, top, |h| {
            h.waiters as f64
        });
        keep(&mut self.longest_waits, other.longest_waits, top, |h| {
            h.longest_wait_ms as f64
        });
        keep(&mut self.most_handoffs, other.most_handoffs, top, |h| {
            h.handoffs_per_s
        });
        keep(&mut self.longest_held, other.longest_held, top, |h| {
            h.held_for_ms as f64
        });
        self.scanned += other.scanned;
    }
}

fn forget_oldest_quarter(names: &mut HashMap<Arc<str>, Name>) {
    let mut ages: Vec<u64> = names.values().map(|n| n.at_ms).collect();
    let cut = ages.len() / 4;
    let (_, nth, _) = ages.select_nth_unstable(cut);
    let cut_at = *nth;
    names.retain(|_, n| n.at_ms > cut_at);
}

/// Scans every hold of `group`'s replica, a chunk at a time (yielding between chunks), for the
/// `top` names held longest at group time `now`; with the number of holds scanned.
async fn longest_held_pass(
    group: &lockd_raft::Group,
    top: usize,
    now: u64,
    namespaces: Option<&[String]>,
) -> (Vec<String>, u64) {
    let mut seen: HashMap<String, u64> = HashMap::new();
    let (mut from, mut scanned) = (0usize, 0u64);
    loop {
        let step = group.read_local(|t| t.held_chunk(from, HELD_STEP, top, now, namespaces));
        scanned += step.scanned;
        for c in step.longest_held {
            let e = seen.entry(c.name).or_default();
            *e = (*e).max(c.held_for_ms);
        }
        if step.done {
            break;
        }
        from += HELD_STEP;
        tokio::task::yield_now().await;
    }
    let mut v: Vec<(String, u64)> = seen.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v.truncate(top);
    (v.into_iter().map(|(n, _)| n).collect(), scanned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockd_core::{LockMode, SessionId};

    fn wait(name: &str) -> LockEvent {
        LockEvent::WaitStarted {
            name: name.into(),
            waiter: 1,
            session: SessionId(1),
            owner: "o".into(),
            mode: LockMode::Exclusive,
            position: 1,
            deadline_ms: u64::MAX,
        }
    }

    fn handoff(name: &str) -> LockEvent {
        LockEvent::HoldStarted {
            name: name.into(),
            session: SessionId(2),
            owner: "o".into(),
            token: 1,
            mode: LockMode::Exclusive,
            waiter: Some(1),
            waited_ms: 5,
            lease_ttl_ms: 15_000,
        }
    }

    fn ended(name: &str, held_ms: u64) -> LockEvent {
        LockEvent::HoldEnded {
            name: name.into(),
            session: SessionId(1),
            token: 1,
            cause: lockd_core::HoldEndCause::Released,
            held_ms,
            lock_delay_until_ms: 0,
        }
    }

    #[test]
    fn a_name_handed_off_every_100ms_estimates_100ms_a_place_and_ranks_first() {
        let h = Handoffs::default();
        h.observe(1, 1_000, &[wait("hot"), wait("warm")]);
        assert_eq!(h.estimate_ms(1, "hot", 3), None, "no history yet");
        h.observe(1, 1_040, &[ended("hot", 40)]);
        assert_eq!(
            h.estimate_ms(1, "hot", 3),
            Some(120),
            "mean hold until a 2nd hand-off"
        );
        for i in 0..50u64 {
            h.observe(1, 1_000 + i * 100, &[handoff("hot"), wait("hot")]);
        }
        h.observe(1, 3_000, &[handoff("warm")]);
        h.observe(1, 4_000, &[handoff("warm")]);
        assert_eq!(h.estimate_ms(1, "hot", 3), Some(300));
        let now = 1_000 + 49 * 100;
        let top = h.top(1, 10, now, |_| true);
        assert_eq!(top[0].0, "hot");
        assert!(
            (3.0..10.0).contains(&top[0].1),
            "about 10/s decayed: {top:?}"
        );
        assert_eq!(top[1].0, "warm");
        assert!(h.top(1, 10, now, |n| n != "hot")[0].0 == "warm");
        // The rate decays once hand-offs stop, below one a minute the name drops out.
        assert!(h.per_second(1, "hot", now + 10_000) < top[0].1 / 2.0);
        assert!(h.top(1, 10, now + 120_000, |_| true).is_empty());
        assert_eq!(
            h.estimate_ms(2, "hot", 1),
            None,
            "other groups are separate"
        );
    }

    #[test]
    fn the_table_is_bounded_and_forgets_the_least_recent() {
        let h = Handoffs::default();
        for i in 0..(NAMES_PER_GROUP as u64 + 10) {
            h.observe(1, i, &[wait(&format!("n{i}"))]);
        }
        let groups = h.groups.lock().unwrap();
        let names = &groups[&1];
        assert!(names.len() <= NAMES_PER_GROUP);
        assert!(!names.contains_key("n0") && names.contains_key("n4105"));
    }
}
