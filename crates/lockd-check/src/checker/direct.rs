//! Direct checks: each looks for one kind of violation in one source of records, counts it, and
//! describes the first few. They do not depend on the linearizability search, so a bug in one
//! cannot hide a violation from the other.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use crate::history::{Call, History, Operation, Outcome, Record, StoreOp};

/// Counts and descriptions gathered by the direct checks.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DirectFindings {
    pub double_grants: u64,
    pub token_regressions: u64,
    pub grants_to_expired_sessions: u64,
    /// Accepted fenced writes with a token below one the store had already accepted for the key.
    pub stale_writes_accepted: u64,
    /// The same, for unfenced writes (expected in a control run; not a violation).
    pub stale_writes_unfenced: u64,
    pub writes_rejected_stale: u64,
    /// `None`: no lock-set key of that kind in the history.
    pub lost_updates_fenced: Option<u64>,
    pub lost_updates_unfenced: Option<u64>,
    pub acked_adds_fenced: u64,
    pub acked_adds_unfenced: u64,
    /// Grants a client saw complete while another process still believed it held the same name
    /// (from the clients' own records: grant completions and the ends of their beliefs).
    pub belief_overlaps: u64,
    /// Grants the clients saw acknowledged, as (name, token).
    pub acked_grants: Vec<(String, u64)>,
    pub details: Vec<String>,
}

/// At most this many descriptions are kept.
pub const MAX_DETAILS: usize = 20;

impl DirectFindings {
    fn note(&mut self, s: String) {
        if self.details.len() < MAX_DETAILS {
            self.details.push(s);
        }
    }
}

/// A service record, normalized for sorting.
enum Svc<'a> {
    Grant {
        name: &'a str,
        token: u64,
        session: &'a str,
        limit: u32,
    },
    Release {
        name: &'a str,
        token: u64,
    },
    Adopted {
        session: &'a str,
    },
    Expired {
        session: &'a str,
    },
    MovedIn {
        name: &'a str,
        token: u64,
        limit: u32,
    },
}

pub fn run(h: &History, ops: &[Operation]) -> DirectFindings {
    let mut f = DirectFindings::default();
    service_checks(h, &mut f);
    client_token_order(ops, &mut f);
    store_checks(h, &mut f);
    lost_updates(h, ops, &mut f);
    belief_overlaps(h, ops, &mut f);
    f
}

/// A client's belief that it holds `name` with `token`, from its grant's completion to the
/// first of its `LeaseLost` deadline, its release's invoke and its `ProcessEnd`.
struct Belief<'a> {
    process: u64,
    name: &'a str,
    token: u64,
    from: u64,
    /// `None`: no recorded end (a killed worker); such a belief cannot be overlapped.
    to: Option<u64>,
}

/// Every acknowledged grant's belief.
fn beliefs<'a>(h: &'a History, ops: &'a [Operation]) -> Vec<Belief<'a>> {
    let mut ends: HashMap<(u64, &str, u64), u64> = HashMap::new();
    let mut process_end: HashMap<u64, u64> = HashMap::new();
    let mut end_at = |k, t: u64| {
        let e = ends.entry(k).or_insert(t);
        *e = (*e).min(t);
    };
    for r in &h.records {
        match r {
            Record::LeaseLost {
                process,
                name,
                token,
                deadline_ns,
                ..
            } => end_at((*process, name.as_str(), *token), *deadline_ns),
            Record::ProcessEnd { process, at_ns } => {
                process_end.insert(*process, *at_ns);
            }
            _ => {}
        }
    }
    for o in ops {
        if let Call::Release { name, token } = &o.call {
            end_at((o.process, name.as_str(), *token), o.invoke_ns);
        }
    }
    // A grant whose answer came after the client's own deadline (a lagging node delivering a
    // wait's old grant) is known lost on arrival: an empty belief, which overlaps nothing.
    ops.iter()
        .filter_map(|o| match (&o.call, &o.outcome, o.complete_ns) {
            (Call::Acquire { name }, Outcome::Granted { token }, Some(from)) => {
                let own = ends.get(&(o.process, name.as_str(), *token)).copied();
                let to = own
                    .into_iter()
                    .chain(process_end.get(&o.process).copied())
                    .min();
                let empty = to.is_some_and(|t| t <= from);
                (!empty).then_some(Belief {
                    process: o.process,
                    name,
                    token: *token,
                    from,
                    to,
                })
            }
            _ => None,
        })
        .collect()
}

/// Grants that completed while another process still believed it held the name.
fn belief_overlaps(h: &History, ops: &[Operation], f: &mut DirectFindings) {
    f.acked_grants = ops
        .iter()
        .filter_map(|o| match (&o.call, &o.outcome) {
            (Call::Acquire { name }, Outcome::Granted { token }) => Some((name.clone(), *token)),
            _ => None,
        })
        .collect();
    let bs = beliefs(h, ops);
    for a in &bs {
        for b in &bs {
            let Some(a_to) = a.to else { continue };
            if a.name == b.name && a.process != b.process && a.from < b.from && b.from < a_to {
                f.belief_overlaps += 1;
                f.note(format!(
                    "belief overlap: {:?} granted to process {} (token {}) at {:.3}s while \
                     process {} (token {}) believed it held it ({:.3}s..{:.3}s)",
                    a.name,
                    b.process,
                    b.token,
                    b.from as f64 / 1e9,
                    a.process,
                    a.token,
                    a.from as f64 / 1e9,
                    a_to as f64 / 1e9
                ));
            }
        }
    }
}

/// Double grants, token regressions and grants to expired sessions, in the service's own order.
fn service_checks(h: &History, f: &mut DirectFindings) {
    let mut recs: Vec<(u64, u64, usize, Svc<'_>)> = Vec::new();
    for (i, r) in h.records.iter().enumerate() {
        match r {
            Record::SvcGrant {
                seq,
                group,
                name,
                token,
                session,
                limit,
                ..
            } => recs.push((
                *group,
                *seq,
                i,
                Svc::Grant {
                    name,
                    token: *token,
                    session,
                    limit: *limit,
                },
            )),
            Record::SvcRelease {
                seq,
                group,
                name,
                token,
                ..
            } => recs.push((
                *group,
                *seq,
                i,
                Svc::Release {
                    name,
                    token: *token,
                },
            )),
            Record::SvcSessionExpired {
                seq,
                group,
                session,
                ..
            } => recs.push((*group, *seq, i, Svc::Expired { session })),
            Record::SvcSessionAdopted {
                seq,
                group,
                session,
                ..
            } => recs.push((*group, *seq, i, Svc::Adopted { session })),
            Record::SvcMovedIn {
                seq,
                group,
                name,
                token,
                limit,
                ..
            } => recs.push((
                *group,
                *seq,
                i,
                Svc::MovedIn {
                    name,
                    token: *token,
                    limit: *limit,
                },
            )),
            _ => {}
        }
    }
    recs.sort_by_key(|(g, s, i, _)| (*g, *s, *i));
    let mut held: HashMap<(u64, &str), BTreeSet<u64>> = HashMap::new();
    let mut max_token: HashMap<(u64, &str), u64> = HashMap::new();
    let mut expired: HashSet<(u64, &str)> = HashSet::new();
    for (group, seq, _, r) in &recs {
        match r {
            Svc::Grant {
                name,
                token,
                session,
                limit,
            } => {
                let holds = held.entry((*group, name)).or_default();
                if holds.len() >= (*limit).max(1) as usize {
                    f.double_grants += 1;
                    f.note(format!(
                        "double grant: group {group} seq {seq} granted {name:?} token {token} \
                         while held by token(s) {holds:?}"
                    ));
                }
                holds.insert(*token);
                if let Some(&m) = max_token.get(&(*group, *name)) {
                    if *token <= m {
                        f.token_regressions += 1;
                        f.note(format!(
                            "token regression (service): group {group} seq {seq} granted {name:?} \
                             token {token} after token {m}"
                        ));
                    }
                }
                let m = max_token.entry((*group, name)).or_insert(*token);
                *m = (*m).max(*token);
                if expired.contains(&(*group, *session)) {
                    f.grants_to_expired_sessions += 1;
                    f.note(format!(
                        "grant to expired session: group {group} seq {seq} granted {name:?} token \
                         {token} to {session:?}, expired earlier"
                    ));
                }
            }
            Svc::MovedIn { name, token, limit } => {
                // The same hold in a new group: it must fit beside the holders there (S1), but
                // its token was minted before, so it is not a new grant for S2 or S4.
                let holds = held.entry((*group, name)).or_default();
                if !holds.contains(token) && holds.len() >= (*limit).max(1) as usize {
                    f.double_grants += 1;
                    f.note(format!(
                        "double grant: group {group} seq {seq} took in {name:?} token {token} \
                         with a bucket move while held by token(s) {holds:?}"
                    ));
                }
                holds.insert(*token);
                let m = max_token.entry((*group, name)).or_insert(*token);
                *m = (*m).max(*token);
            }
            Svc::Release { name, token } => {
                if let Some(holds) = held.get_mut(&(*group, *name)) {
                    holds.remove(token);
                }
            }
            Svc::Expired { session } => {
                expired.insert((*group, session));
            }
            // Brought into the group again: a new lease there (leases are per group).
            Svc::Adopted { session } => {
                expired.remove(&(*group, *session));
            }
        }
    }
}

/// Token regressions seen by clients: a grant whose token is not above that of a grant of the same
/// name that completed before it was invoked.
fn client_token_order(ops: &[Operation], f: &mut DirectFindings) {
    // name -> [(invoke, complete, token)]
    let mut grants: BTreeMap<&str, Vec<(u64, u64, u64)>> = BTreeMap::new();
    for o in ops {
        if let (Call::Acquire { name }, Outcome::Granted { token }, Some(c)) =
            (&o.call, &o.outcome, o.complete_ns)
        {
            grants
                .entry(name)
                .or_default()
                .push((o.invoke_ns, c, *token));
        }
    }
    for (name, gs) in grants {
        let mut by_complete: Vec<(u64, u64)> = gs.iter().map(|g| (g.1, g.2)).collect();
        by_complete.sort();
        let mut by_invoke = gs.clone();
        by_invoke.sort();
        let (mut k, mut max_before) = (0usize, None::<u64>);
        for (inv, _, token) in by_invoke {
            while k < by_complete.len() && by_complete[k].0 < inv {
                max_before = Some(max_before.map_or(by_complete[k].1, |m| m.max(by_complete[k].1)));
                k += 1;
            }
            if let Some(m) = max_before {
                if token <= m {
                    f.token_regressions += 1;
                    f.note(format!(
                        "token regression (clients): {name:?} granted token {token} at {inv} ns, \
                         after a grant of token {m} had completed"
                    ));
                }
            }
        }
    }
}

/// Stale writes the store accepted, from its own log.
fn store_checks(h: &History, f: &mut DirectFindings) {
    let mut logs: Vec<(&str, u64, &Record)> = Vec::new();
    for r in &h.records {
        if let Record::StoreLog { key, seq, .. } = r {
            logs.push((key, *seq, r));
        }
    }
    logs.sort_by_key(|(k, s, _)| (*k, *s));
    let mut max_accepted: HashMap<&str, u64> = HashMap::new();
    for (key, seq, r) in logs {
        let Record::StoreLog {
            op,
            token,
            fenced,
            accepted,
            ..
        } = r
        else {
            continue;
        };
        if !accepted {
            if *op == StoreOp::Write {
                f.writes_rejected_stale += 1;
            }
            continue;
        }
        let Some(t) = token else { continue };
        let m = max_accepted.get(key).copied();
        if *op == StoreOp::Write {
            if let Some(m) = m.filter(|m| t < m) {
                if *fenced {
                    f.stale_writes_accepted += 1;
                    f.note(format!(
                        "stale write accepted: key {key:?} seq {seq} token {t} after token {m}"
                    ));
                } else {
                    f.stale_writes_unfenced += 1;
                }
            }
        }
        max_accepted.insert(key, m.map_or(*t, |m| m.max(*t)));
    }
}

/// The lock-set workload: acknowledged additions missing from the final set.
fn lost_updates(h: &History, ops: &[Operation], f: &mut DirectFindings) {
    for r in &h.records {
        let Record::LocksetFinal {
            key,
            fenced,
            elements,
        } = r
        else {
            continue;
        };
        let present: HashSet<u64> = elements.iter().copied().collect();
        let mut acked = 0u64;
        let mut lost = Vec::new();
        for o in ops {
            if let (
                Call::Write {
                    key: k,
                    add: Some(e),
                    ..
                },
                Outcome::Accepted,
            ) = (&o.call, &o.outcome)
            {
                if k == key {
                    acked += 1;
                    if !present.contains(e) {
                        lost.push(*e);
                    }
                }
            }
        }
        let n = lost.len() as u64;
        if *fenced {
            f.acked_adds_fenced += acked;
            *f.lost_updates_fenced.get_or_insert(0) += n;
        } else {
            f.acked_adds_unfenced += acked;
            *f.lost_updates_unfenced.get_or_insert(0) += n;
        }
        if n > 0 {
            lost.truncate(10);
            f.note(format!(
                "lost updates ({}): key {key:?} lost {n} of {acked} acknowledged additions, e.g. {lost:?}",
                if *fenced { "fenced" } else { "unfenced" }
            ));
        }
    }
}
