//! The checker: judges a [`History`] and produces a [`Report`].
//!
//! Two independent lines of evidence:
//! * [`wgl`]: per-object linearizability of the client history against the specifications in
//!   [`models`] (a mutex with increasing tokens and leases; a fenced register), cross-checked
//!   against [`brute`] force on small histories by the crate's property tests.
//! * [`direct`]: counts of specific violations in the service's and the store's own records.

pub mod brute;
pub mod direct;
pub mod models;
pub mod wgl;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use crate::history::{History, Record};
use models::{MutexModel, ObjectHistory, RegisterModel};
pub use wgl::{Budget, Verdict};

/// Overall linearizability: false if any object is not, else unknown if any search ran out of
/// budget, else true.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Linearizable {
    True,
    False,
    Unknown,
}

impl std::fmt::Display for Linearizable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Linearizable::True => "true",
            Linearizable::False => "false",
            Linearizable::Unknown => "unknown",
        })
    }
}

/// Exit code of a run with no violation but at least one unknown verdict (0 = pass,
/// 1 = violation or harness failure).
pub const EXIT_UNKNOWN: u8 = 3;

/// The exit code of a run: 1 on a violation, else 3 if a verdict is unknown (0 with
/// `allow_unknown`), else 0.
pub fn exit_code(violation: bool, unknown: bool, allow_unknown: bool) -> std::process::ExitCode {
    if violation {
        std::process::ExitCode::from(1)
    } else if unknown && !allow_unknown {
        std::process::ExitCode::from(EXIT_UNKNOWN)
    } else {
        std::process::ExitCode::SUCCESS
    }
}

/// The violation a negative control must cause: its signature. A sabotaged run counts as
/// caught only if this kind of violation was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Signature {
    /// The fenced store accepted a write with a token below its fence (or the fenced set lost
    /// an acknowledged update).
    StaleWrite,
    /// Two processes believed they held the same exclusive lock at once.
    BeliefOverlap,
    /// The service freed a hold (and may grant it anew) while its holder still believed it held
    /// it within the deadline the service itself had extended.
    GrantWhileBelieved,
    /// A linearizable read missed a grant acknowledged before it began.
    StaleRead,
    /// A name's token did not rise (S2), also across groups.
    TokenRegression,
    /// Two holders of one exclusive name at once in the service's own records (S1), also in
    /// two groups.
    DoubleGrant,
}

impl std::fmt::Display for Signature {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Signature::StaleWrite => "stale-write",
            Signature::BeliefOverlap => "belief-overlap",
            Signature::GrantWhileBelieved => "grant-while-believed",
            Signature::StaleRead => "stale-read",
            Signature::TokenRegression => "token-regression",
            Signature::DoubleGrant => "double-grant",
        })
    }
}

/// Fault kinds always printed in the RESULT line (0 when absent), in this order.
pub const FAULT_KINDS: [&str; 4] = ["kill", "pause", "partition", "clock"];

#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// Client operations in the history (invokes).
    pub ops: usize,
    pub linearizable: Linearizable,
    pub objects_checked: usize,
    pub objects_not_linearizable: usize,
    pub objects_unknown: usize,
    pub search_steps: u64,
    pub direct: direct::DirectFindings,
    pub faults: BTreeMap<String, u64>,
    pub pauses_verified: u64,
    pub failover_ms: Vec<f64>,
    /// Descriptions of violations (linearizability first, then direct checks), capped.
    pub details: Vec<String>,
    pub check_ms: u64,
}

/// Checks a whole history. `budget` applies to each object's search.
pub fn check(h: &History, budget: Budget) -> anyhow::Result<Report> {
    let started = Instant::now();
    let ops = h.operations()?;
    let objects = models::split(h)?;
    let (mut not_lin, mut unknown, mut steps) = (0, 0, 0);
    let mut details = Vec::new();
    for obj in &objects {
        let (verdict, s) = match obj {
            ObjectHistory::Lock { entries, .. } => wgl::check(&MutexModel, entries, budget),
            ObjectHistory::Store { init, entries, .. } => {
                wgl::check(&RegisterModel { init: *init }, entries, budget)
            }
        };
        steps += s;
        match verdict {
            Verdict::Linearizable => {}
            Verdict::Unknown => {
                unknown += 1;
                details.push(format!(
                    "{}: linearizability unknown (budget of {} steps / {:?} spent on {} ops)",
                    obj.label(),
                    budget.max_steps,
                    budget.max_time,
                    obj.len()
                ));
            }
            Verdict::NotLinearizable { stuck_at } => {
                not_lin += 1;
                let op = match obj {
                    ObjectHistory::Lock { entries, .. } => format!("{:?}", entries[stuck_at]),
                    ObjectHistory::Store { entries, .. } => format!("{:?}", entries[stuck_at]),
                };
                details.push(format!(
                    "{}: NOT linearizable ({} ops); no order linearizes up to {op}",
                    obj.label(),
                    obj.len()
                ));
            }
        }
    }
    let linearizable = if not_lin > 0 {
        Linearizable::False
    } else if unknown > 0 {
        Linearizable::Unknown
    } else {
        Linearizable::True
    };
    let direct = direct::run(h, &ops);
    details.extend(direct.details.iter().cloned());
    let mut faults: BTreeMap<String, u64> =
        FAULT_KINDS.iter().map(|k| (k.to_string(), 0)).collect();
    let mut pauses_verified = 0;
    let mut failover_ms = Vec::new();
    for r in &h.records {
        match r {
            // Only faults seen to take effect count.
            Record::Fault { kind, verified, .. } if *verified => {
                *faults.entry(kind.clone()).or_default() += 1;
                if kind == "pause" {
                    pauses_verified += 1;
                }
            }
            Record::Failover { ms, .. } => failover_ms.push(*ms),
            _ => {}
        }
    }
    Ok(Report {
        ops: ops.len(),
        linearizable,
        objects_checked: objects.len(),
        objects_not_linearizable: not_lin,
        objects_unknown: unknown,
        search_steps: steps,
        direct,
        faults,
        pauses_verified,
        failover_ms,
        details,
        check_ms: started.elapsed().as_millis() as u64,
    })
}

/// Nearest-rank percentile of `xs` (`p` in 0..=100); `None` when empty.
pub fn percentile(xs: &[f64], p: f64) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let rank = ((p / 100.0) * v.len() as f64).ceil().max(1.0) as usize;
    Some(v[rank.min(v.len()) - 1])
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "na".to_owned(), |n| n.to_string())
}

impl Report {
    /// True if the run shows a violation of lockd's promises (or of the fenced store's).
    /// Unfenced losses are not violations: the control run is supposed to show them.
    pub fn has_violations(&self) -> bool {
        let d = &self.direct;
        self.linearizable == Linearizable::False
            || d.double_grants > 0
            || d.token_regressions > 0
            || d.grants_to_expired_sessions > 0
            || d.stale_writes_accepted > 0
            || d.lost_updates_fenced.unwrap_or(0) > 0
            || d.belief_overlaps > 0
    }

    /// True if no object was found not linearizable but some search ran out of budget.
    pub fn is_unknown(&self) -> bool {
        self.linearizable == Linearizable::Unknown
    }

    /// The signatures of the violations this report shows (the kinds it can see in a history).
    pub fn signatures(&self) -> Vec<Signature> {
        let d = &self.direct;
        let mut v = Vec::new();
        if d.stale_writes_accepted > 0 || d.lost_updates_fenced.unwrap_or(0) > 0 {
            v.push(Signature::StaleWrite);
        }
        if d.belief_overlaps > 0 {
            v.push(Signature::BeliefOverlap);
        }
        if d.token_regressions > 0 {
            v.push(Signature::TokenRegression);
        }
        if d.double_grants > 0 {
            v.push(Signature::DoubleGrant);
        }
        v
    }

    /// The `RESULT key=value ...` line. Keys are stable; `na` marks what the run did not measure.
    pub fn result_line(&self) -> String {
        let d = &self.direct;
        let mut s = String::from("RESULT");
        let _ = write!(s, " ops={}", self.ops);
        let _ = write!(s, " linearizable={}", self.linearizable);
        let _ = write!(s, " objects={}", self.objects_checked);
        let _ = write!(s, " double_grants={}", d.double_grants);
        let _ = write!(s, " token_regressions={}", d.token_regressions);
        let _ = write!(
            s,
            " grants_to_expired_sessions={}",
            d.grants_to_expired_sessions
        );
        let _ = write!(s, " stale_writes_accepted={}", d.stale_writes_accepted);
        let _ = write!(s, " stale_writes_unfenced={}", d.stale_writes_unfenced);
        let _ = write!(s, " writes_rejected_stale={}", d.writes_rejected_stale);
        let _ = write!(s, " lost_updates_fenced={}", opt(d.lost_updates_fenced));
        let _ = write!(s, " lost_updates_unfenced={}", opt(d.lost_updates_unfenced));
        let _ = write!(s, " acked_adds_fenced={}", d.acked_adds_fenced);
        let _ = write!(s, " acked_adds_unfenced={}", d.acked_adds_unfenced);
        let _ = write!(s, " belief_overlaps={}", d.belief_overlaps);
        let total: u64 = self.faults.values().sum();
        let _ = write!(s, " faults={total}");
        for (k, n) in &self.faults {
            let _ = write!(s, " faults_{k}={n}");
        }
        let _ = write!(s, " pauses_verified={}", self.pauses_verified);
        let p =
            |q: f64| percentile(&self.failover_ms, q).map_or("na".into(), |v| format!("{v:.0}"));
        let _ = write!(s, " failover_ms_p50={}", p(50.0));
        let _ = write!(s, " failover_ms_p99={}", p(99.0));
        let _ = write!(s, " unknown={}", self.objects_unknown);
        let _ = write!(s, " violations={}", self.has_violations());
        s
    }
}

/// The default budget, with `max_time` overridden.
pub fn budget_with_time(max_time: Duration) -> Budget {
    Budget {
        max_time,
        ..Budget::default()
    }
}
