//! Availability under the nemesis, measured from the records a run already keeps.
//!
//! **An attempt is available when the service gave a definite answer within its deadline.**
//!
//! * **Acquire**: every `Acquire` a worker invokes (its `Invoke`/`Complete` pair in the
//!   worker's history). Available: completed `Granted` or `NotGranted` (the lock was busy for
//!   the whole wait; the worker also records a 4xx refusal such as 429 as `NotGranted`) within
//!   the wait the workers use (2 TTLs) plus [`ACQUIRE_SLACK`]. Unavailable: `Unknown` (a
//!   timeout, a 503, a broken stream, no node reachable), no `Complete` at all, or an answer
//!   after the deadline. A failed attempt ends at its `Complete` or its deadline, the earlier.
//! * **Renewal**: the client sends a keepalive every TTL/3 on its own, so the worker watches
//!   it: while it has a session, every TTL/3 it opens a renewal slot and records a
//!   [`Record::Renewal`]: available if a keepalive sent at or after the slot's start was
//!   acknowledged within TTL/2 (the lease is then at most half spent since the last renewal
//!   the slot knew of, and the client has already missed one whole keepalive interval when a
//!   slot fails). Slots still open when the worker's process id ends are not counted.
//!
//! **Attribution.** Each attempt counts for the kind of the service fault whose window it
//! overlaps (`Fault` records with `verified` and a window `at_ns .. at_ns + hold_ms`; when it
//! overlaps several, the latest-started one), or [`NO_FAULT`]. Overlap, not start: an attempt
//! in flight when a node is killed fails because of the kill, though it started before it.
//!
//! **A worker's pause is the worker's fault, not the service's**: the window of a pause whose
//! target is a worker (its own `--self-pause` or a scheduled `pause-client`) attributes no
//! attempt, and the attempts of that worker that overlap the window or start within one TTL
//! after it (its session's own recovery from the pause) are excluded altogether (`excluded`).
//!
//! **Unavailable time** (`unavailable_s`): the time, in [`STEP_NS`] steps, during which some
//! lock name had a failed acquire attempt in flight and no successful one (on that name) in
//! flight, counted once however many names were affected; each step counts for the kind
//! active at its start.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use crate::history::{Call, History, Outcome, Record};

/// The kind attempts are attributed to when no service fault is active.
pub const NO_FAULT: &str = "none";

/// How much longer than its wait (2 TTLs) an acquire may take to be answered.
pub const ACQUIRE_SLACK: Duration = Duration::from_secs(2);

/// The step of [`KindStats::unavailable_ns`].
pub const STEP_NS: u64 = 10_000_000;

/// The window of one fault.
#[derive(Clone, Debug, PartialEq)]
pub struct Window {
    pub kind: String,
    pub start_ns: u64,
    pub end_ns: u64,
    /// The worker paused, when the fault is a worker's pause.
    pub worker: Option<u64>,
}

impl Window {
    fn covers(&self, t: u64) -> bool {
        self.start_ns <= t && t < self.end_ns
    }
}

/// One acquire or renewal attempt of a worker.
#[derive(Clone, Debug, PartialEq)]
pub struct Attempt {
    pub renewal: bool,
    pub worker: u64,
    /// The lock name (acquires only).
    pub name: Option<String>,
    pub start_ns: u64,
    pub end_ns: u64,
    pub ok: bool,
}

/// What one fault kind (or [`NO_FAULT`], or the whole run) saw.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KindStats {
    pub acquire: u64,
    pub acquire_ok: u64,
    pub renew: u64,
    pub renew_ok: u64,
    pub unavailable_ns: u64,
    /// Names with an acquire attempt here, and those with a failed one.
    pub names: BTreeSet<String>,
    pub names_failed: BTreeSet<String>,
}

impl KindStats {
    fn add(&mut self, a: &Attempt) {
        if a.renewal {
            self.renew += 1;
            self.renew_ok += u64::from(a.ok);
            return;
        }
        self.acquire += 1;
        self.acquire_ok += u64::from(a.ok);
        if let Some(n) = &a.name {
            self.names.insert(n.clone());
            if !a.ok {
                self.names_failed.insert(n.clone());
            }
        }
    }

    /// `acquire F (ok/n) renew F (ok/n) unavailable_s S names_affected k/n`.
    pub fn summary(&self) -> String {
        format!(
            "acquire {} ({}/{}) renew {} ({}/{}) unavailable_s {:.1} names_affected {}/{}",
            fraction(self.acquire_ok, self.acquire),
            self.acquire_ok,
            self.acquire,
            fraction(self.renew_ok, self.renew),
            self.renew_ok,
            self.renew,
            self.unavailable_ns as f64 / 1e9,
            self.names_failed.len(),
            self.names.len()
        )
    }
}

/// The availability of a run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Availability {
    pub by_kind: BTreeMap<String, KindStats>,
    pub total: KindStats,
    /// Attempts left out: their worker was paused (see the module doc).
    pub excluded: u64,
}

impl Availability {
    /// From a run's history; `ttl` is the workers' session TTL.
    pub fn of(h: &History, ttl: Duration) -> Availability {
        compute(&attempts(h, ttl), &windows(h), ttl)
    }

    /// One `availability: KIND ...` line per kind, then one for the whole run.
    pub fn lines(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .by_kind
            .iter()
            .map(|(k, s)| format!("availability: {k} {}", s.summary()))
            .collect();
        v.push(format!(
            "availability: all {} excluded_paused {}",
            self.total.summary(),
            self.excluded
        ));
        v
    }

    /// The RESULT line's fields.
    pub fn result_fields(&self) -> String {
        let t = &self.total;
        format!(
            "availability_acquire={} availability_renew={}",
            fraction(t.acquire_ok, t.acquire),
            fraction(t.renew_ok, t.renew)
        )
    }
}

/// `ok / total` with four decimals, truncated (never `1.0000` while an attempt failed); `na`
/// when nothing was attempted.
pub fn fraction(ok: u64, total: u64) -> String {
    if total == 0 {
        return "na".into();
    }
    let tenth_thousandths = u128::from(ok.min(total)) * 10_000 / u128::from(total);
    format!(
        "{}.{:04}",
        tenth_thousandths / 10_000,
        tenth_thousandths % 10_000
    )
}

/// The worker of a fault target such as `worker3` or `worker3 (self, in its write window)`.
pub fn target_worker(target: &str) -> Option<u64> {
    let rest = target.strip_prefix("worker")?;
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// The windows of the verified faults with a known duration.
pub fn windows(h: &History) -> Vec<Window> {
    h.records
        .iter()
        .filter_map(|r| match r {
            Record::Fault {
                kind,
                at_ns,
                target,
                verified: true,
                hold_ms,
            } if *hold_ms > 0 => Some(Window {
                kind: kind.clone(),
                start_ns: *at_ns,
                end_ns: at_ns.saturating_add(hold_ms.saturating_mul(1_000_000)),
                worker: target_worker(target),
            }),
            _ => None,
        })
        .collect()
}

/// The workers' acquire attempts (from their invokes and completes) and renewal slots.
pub fn attempts(h: &History, ttl: Duration) -> Vec<Attempt> {
    let deadline = u64::try_from((2 * ttl + ACQUIRE_SLACK).as_nanos()).unwrap_or(u64::MAX);
    let mut open: HashMap<(u64, u64), usize> = HashMap::new();
    let mut out: Vec<Attempt> = Vec::new();
    for r in &h.records {
        match r {
            Record::Invoke {
                process,
                op,
                at_ns,
                call: Call::Acquire { name },
            } => {
                open.insert((*process, *op), out.len());
                out.push(Attempt {
                    renewal: false,
                    worker: process / 1_000_000,
                    name: Some(name.clone()),
                    start_ns: *at_ns,
                    end_ns: at_ns.saturating_add(deadline),
                    ok: false,
                });
            }
            Record::Complete {
                process,
                op,
                at_ns,
                outcome,
            } => {
                if let Some(i) = open.remove(&(*process, *op)) {
                    let a = &mut out[i];
                    let answered = matches!(outcome, Outcome::Granted { .. } | Outcome::NotGranted);
                    a.ok = answered && *at_ns <= a.end_ns;
                    a.end_ns = a.end_ns.min(*at_ns);
                }
            }
            Record::Renewal {
                process,
                at_ns,
                end_ns,
                answered,
            } => out.push(Attempt {
                renewal: true,
                worker: process / 1_000_000,
                name: None,
                start_ns: *at_ns,
                end_ns: *end_ns,
                ok: *answered,
            }),
            _ => {}
        }
    }
    out
}

/// The kind of the service fault active at `t`: the latest-started window covering `t` that is
/// not a worker's pause; [`NO_FAULT`] if none.
pub fn kind_at(windows: &[Window], t: u64) -> &str {
    windows
        .iter()
        .filter(|w| w.worker.is_none() && w.covers(t))
        .max_by_key(|w| w.start_ns)
        .map_or(NO_FAULT, |w| w.kind.as_str())
}

/// The kind of the latest-started service fault whose window `a` overlaps; [`NO_FAULT`] if
/// none. An attempt with no duration counts as the instant it started.
pub fn kind_over<'w>(windows: &'w [Window], a: &Attempt) -> &'w str {
    let end = a.end_ns.max(a.start_ns + 1);
    windows
        .iter()
        .filter(|w| w.worker.is_none() && w.start_ns < end && a.start_ns < w.end_ns)
        .max_by_key(|w| w.start_ns)
        .map_or(NO_FAULT, |w| w.kind.as_str())
}

/// Whether `a` overlaps a pause of its own worker or starts within `grace_ns` after one.
pub fn excluded(windows: &[Window], a: &Attempt, grace_ns: u64) -> bool {
    windows.iter().any(|w| {
        w.worker == Some(a.worker)
            && a.start_ns < w.end_ns.saturating_add(grace_ns)
            && a.end_ns >= w.start_ns
    })
}

/// Counts `attempts` by the kind whose window they overlap and sums the unavailable time.
pub fn compute(attempts: &[Attempt], windows: &[Window], ttl: Duration) -> Availability {
    let grace_ns = u64::try_from(ttl.as_nanos()).unwrap_or(u64::MAX);
    let mut av = Availability::default();
    let mut counted: Vec<&Attempt> = Vec::new();
    for a in attempts {
        if excluded(windows, a, grace_ns) {
            av.excluded += 1;
            continue;
        }
        counted.push(a);
        let kind = kind_over(windows, a).to_string();
        av.by_kind.entry(kind).or_default().add(a);
        av.total.add(a);
    }
    for t in unavailable_steps(&counted) {
        let kind = kind_at(windows, t).to_string();
        av.by_kind.entry(kind).or_default().unavailable_ns += STEP_NS;
        av.total.unavailable_ns += STEP_NS;
    }
    av
}

/// The starts of the steps in which some name had a failed acquire in flight and no
/// successful one.
fn unavailable_steps(attempts: &[&Attempt]) -> Vec<u64> {
    let acquires: Vec<&&Attempt> = attempts.iter().filter(|a| !a.renewal).collect();
    let (Some(lo), Some(hi)) = (
        acquires.iter().map(|a| a.start_ns).min(),
        acquires.iter().map(|a| a.end_ns).max(),
    ) else {
        return Vec::new();
    };
    let lo = lo - lo % STEP_NS;
    let n = usize::try_from((hi - lo) / STEP_NS + 1).unwrap_or(0);
    // Per name: (failing, succeeding) in flight, step by step.
    let mut per_name: HashMap<&str, (Vec<bool>, Vec<bool>)> = HashMap::new();
    for a in acquires {
        let (failing, working) = per_name
            .entry(a.name.as_deref().unwrap_or(""))
            .or_insert_with(|| (vec![false; n], vec![false; n]));
        let i = ((a.start_ns - lo) / STEP_NS) as usize;
        // The step holding the last instant before the end (an empty attempt: its start's).
        let j = ((a.end_ns.max(a.start_ns + 1) - 1 - lo) / STEP_NS) as usize;
        let v = if a.ok { working } else { failing };
        v[i..=j].fill(true);
    }
    (0..n)
        .filter(|&k| per_name.values().any(|(f, w)| f[k] && !w[k]))
        .map(|k| lo + k as u64 * STEP_NS)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::{Call, Outcome, Record};

    const MS: u64 = 1_000_000;
    const TTL: Duration = Duration::from_secs(2);

    fn window(kind: &str, start_ms: u64, end_ms: u64, worker: Option<u64>) -> Window {
        Window {
            kind: kind.into(),
            start_ns: start_ms * MS,
            end_ns: end_ms * MS,
            worker,
        }
    }

    fn acquire(worker: u64, name: &str, start_ms: u64, end_ms: u64, ok: bool) -> Attempt {
        Attempt {
            renewal: false,
            worker,
            name: Some(name.into()),
            start_ns: start_ms * MS,
            end_ns: end_ms * MS,
            ok,
        }
    }

    #[test]
    fn fractions_have_four_decimals_and_never_round_up_to_one() {
        assert_eq!(fraction(0, 0), "na");
        assert_eq!(fraction(1, 1), "1.0000");
        assert_eq!(fraction(0, 3), "0.0000");
        assert_eq!(fraction(1, 3), "0.3333");
        assert_eq!(fraction(2, 3), "0.6666");
        assert_eq!(fraction(9_999, 10_000), "0.9999");
        assert_eq!(fraction(99_999, 100_000), "0.9999");
        assert_eq!(fraction(1234, 1271), "0.9708");
    }

    #[test]
    fn worker_targets_are_parsed() {
        assert_eq!(target_worker("worker4"), Some(4));
        assert_eq!(
            target_worker("worker12 (self, in its write window)"),
            Some(12)
        );
        assert_eq!(target_worker("node2"), None);
        assert_eq!(target_worker("worker"), None);
    }

    #[test]
    fn attempts_count_for_the_latest_service_fault_active_at_their_start() {
        let w = vec![
            window("kill", 1000, 4000, None),
            window("move", 3000, 5000, None),
            window("pause", 0, 10_000, Some(9)), // a worker's pause: never a kind
        ];
        assert_eq!(kind_at(&w, 500 * MS), NO_FAULT);
        assert_eq!(kind_at(&w, 1000 * MS), "kill");
        assert_eq!(kind_at(&w, 3500 * MS), "move");
        assert_eq!(kind_at(&w, 4500 * MS), "move");
        assert_eq!(kind_at(&w, 5000 * MS), NO_FAULT); // the end is not in the window
    }

    #[test]
    fn an_attempt_in_flight_when_a_fault_begins_counts_for_that_fault() {
        let w = vec![
            window("kill", 1000, 4000, None),
            window("move", 3000, 5000, None),
            window("pause", 0, 10_000, Some(9)),
        ];
        // Started before the kill, failed during it: the kill's.
        assert_eq!(kind_over(&w, &acquire(1, "a", 500, 1500, false)), "kill");
        // Over both: the latest-started.
        assert_eq!(kind_over(&w, &acquire(1, "a", 2000, 3500, false)), "move");
        // Ended before the kill, or started at a window's end: none.
        assert_eq!(kind_over(&w, &acquire(1, "a", 100, 1000, true)), NO_FAULT);
        assert_eq!(kind_over(&w, &acquire(1, "a", 5000, 5100, true)), NO_FAULT);
        // An instant attempt: its start.
        assert_eq!(kind_over(&w, &acquire(1, "a", 1000, 1000, true)), "kill");
    }

    #[test]
    fn a_paused_workers_attempts_are_excluded_and_others_are_not() {
        let w = vec![window("pause", 1000, 2000, Some(1))];
        let grace = 500 * MS;
        // Overlapping the pause, starting within the grace after it: excluded.
        assert!(excluded(&w, &acquire(1, "a", 900, 1100, false), grace));
        assert!(excluded(&w, &acquire(1, "a", 2400, 2600, false), grace));
        // Before it, after the grace, or another worker: counted.
        assert!(!excluded(&w, &acquire(1, "a", 500, 900, false), grace));
        assert!(!excluded(&w, &acquire(1, "a", 2500, 2600, false), grace));
        assert!(!excluded(&w, &acquire(2, "a", 1500, 1600, false), grace));
    }

    #[test]
    fn attempts_are_read_from_invokes_completes_and_renewals() {
        let inv = |process: u64, op: u64, at_ms: u64, name: &str| Record::Invoke {
            process,
            op,
            at_ns: at_ms * MS,
            call: Call::Acquire { name: name.into() },
        };
        let done = |process: u64, op: u64, at_ms: u64, outcome: Outcome| Record::Complete {
            process,
            op,
            at_ns: at_ms * MS,
            outcome,
        };
        let h = History {
            records: vec![
                inv(1_000_000, 1, 0, "a"),
                done(1_000_000, 1, 10, Outcome::Granted { token: 1 }),
                inv(2_000_003, 1, 0, "a"),
                done(2_000_003, 1, 4000, Outcome::NotGranted),
                inv(3_000_000, 1, 0, "b"),
                done(3_000_000, 1, 1000, Outcome::Unknown),
                inv(4_000_000, 1, 0, "b"),
                done(4_000_000, 1, 7000, Outcome::Granted { token: 2 }),
                inv(5_000_000, 1, 0, "b"), // never completed
                Record::Renewal {
                    process: 1_000_000,
                    at_ns: 100 * MS,
                    end_ns: 150 * MS,
                    answered: true,
                },
            ],
        };
        let a = attempts(&h, TTL);
        let got: Vec<(u64, bool, u64, bool)> = a
            .iter()
            .map(|a| (a.worker, a.renewal, a.end_ns / MS, a.ok))
            .collect();
        assert_eq!(
            got,
            vec![
                (1, false, 10, true),
                (2, false, 4000, true),  // busy all the wait: an answer
                (3, false, 1000, false), // unknown
                (4, false, 6000, false), // granted after the 6 s deadline
                (5, false, 6000, false), // no answer at all
                (1, true, 150, true),
            ]
        );
    }

    #[test]
    fn unavailable_time_counts_names_failing_with_none_succeeding_once() {
        let w = vec![window("kill", 1000, 1500, None)];
        let a = vec![
            // Name a fails 1000..2000; a success on a in flight 1500..1700 masks that part.
            acquire(1, "a", 1000, 2000, false),
            acquire(2, "a", 1500, 1700, true),
            // Name b fails over 1200..1300 too: no second count.
            acquire(3, "b", 1200, 1300, false),
            // A renewal that failed adds no unavailable time.
            Attempt {
                renewal: true,
                worker: 4,
                name: None,
                start_ns: 3000 * MS,
                end_ns: 4000 * MS,
                ok: false,
            },
        ];
        let av = compute(&a, &w, TTL);
        // 1000..1500 is kill's, 1700..2000 none's.
        assert_eq!(av.by_kind["kill"].unavailable_ns, 500 * MS);
        assert_eq!(av.by_kind[NO_FAULT].unavailable_ns, 300 * MS);
        assert_eq!(av.total.unavailable_ns, 800 * MS);
        let kill = &av.by_kind["kill"];
        assert_eq!((kill.acquire_ok, kill.acquire), (0, 2));
        assert_eq!((kill.names_failed.len(), kill.names.len()), (2, 2));
        let none = &av.by_kind[NO_FAULT];
        assert_eq!((none.acquire_ok, none.acquire), (1, 1));
        assert_eq!((none.renew_ok, none.renew), (0, 1));
        assert_eq!(
            av.result_fields(),
            "availability_acquire=0.3333 availability_renew=0.0000"
        );
        assert_eq!(
            av.lines()[0],
            "availability: kill acquire 0.0000 (0/2) renew na (0/0) unavailable_s 0.5 \
             names_affected 2/2"
        );
    }

    #[test]
    fn excluded_attempts_count_nowhere() {
        let w = vec![window("pause", 1000, 2000, Some(1))];
        let a = vec![
            acquire(1, "a", 1500, 3000, false),
            acquire(2, "a", 1500, 1600, true),
        ];
        let av = compute(&a, &w, TTL);
        assert_eq!(av.excluded, 1);
        assert_eq!((av.total.acquire_ok, av.total.acquire), (1, 1));
        assert_eq!(av.total.unavailable_ns, 0);
        // The worker's pause is no kind: the other worker's attempt counts for none.
        assert_eq!(av.by_kind.keys().collect::<Vec<_>>(), vec![NO_FAULT]);
    }
}
