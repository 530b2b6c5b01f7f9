//! The whole checker on hand-written histories: each violation kind is found and counted, and a
//! clean history passes. Histories go through JSON lines first, as a saved run would.

use lockd_check::checker::{self, Budget, Linearizable, Signature};
use lockd_check::history::{Call, History, Outcome, Record, StoreOp};

fn op(process: u64, id: u64, a: u64, b: Option<u64>, call: Call, outcome: Outcome) -> Vec<Record> {
    let mut v = vec![Record::Invoke {
        process,
        op: id,
        at_ns: a,
        call,
    }];
    if let Some(b) = b {
        v.push(Record::Complete {
            process,
            op: id,
            at_ns: b,
            outcome,
        });
    }
    v
}

fn acquire(p: u64, id: u64, a: u64, b: u64, token: u64) -> Vec<Record> {
    op(
        p,
        id,
        a,
        Some(b),
        Call::Acquire { name: "n".into() },
        Outcome::Granted { token },
    )
}

fn release(p: u64, id: u64, a: u64, b: u64, token: u64, ok: bool) -> Vec<Record> {
    op(
        p,
        id,
        a,
        Some(b),
        Call::Release {
            name: "n".into(),
            token,
        },
        if ok { Outcome::Ok } else { Outcome::Refused },
    )
}

fn grant(seq: u64, token: u64, session: &str) -> Record {
    Record::SvcGrant {
        seq,
        group: 1,
        name: "n".into(),
        token,
        session: session.into(),
        limit: 1,
        time_ms: seq,
    }
}

fn end(seq: u64, token: u64) -> Record {
    Record::SvcRelease {
        seq,
        group: 1,
        name: "n".into(),
        token,
        cause: "release".into(),
        time_ms: seq,
    }
}

fn store_log(seq: u64, token: u64, fenced: bool, accepted: bool) -> Record {
    Record::StoreLog {
        seq,
        key: "k".into(),
        op: StoreOp::Write,
        token: Some(token),
        fenced,
        accepted,
        fence_before: 0,
        value: None,
    }
}

fn check(records: Vec<Record>) -> checker::Report {
    let h = History { records };
    let mut buf = Vec::new();
    h.write_jsonl(&mut buf).unwrap();
    let h = History::from_jsonl(&buf[..]).unwrap();
    checker::check(&h, Budget::default()).unwrap()
}

#[test]
fn clean_history_passes() {
    let mut r = Vec::new();
    r.extend(acquire(1, 1, 0, 10, 5));
    r.extend(release(1, 2, 20, 30, 5, true));
    r.extend(acquire(2, 1, 25, 40, 9));
    // The lease of token 9 is lost at 50; process 3 is granted after that.
    r.push(Record::LeaseLost {
        process: 2,
        name: "n".into(),
        token: 9,
        deadline_ns: 50,
        at_ns: 200,
    });
    r.extend(acquire(3, 1, 60, 70, 12));
    r.extend([
        grant(1, 5, "a"),
        end(2, 5),
        grant(3, 9, "b"),
        end(4, 9),
        grant(5, 12, "c"),
    ]);
    r.extend([
        store_log(1, 5, true, true),
        store_log(2, 9, true, true),
        store_log(3, 5, true, false),
    ]);
    let rep = check(r);
    assert_eq!(rep.linearizable, Linearizable::True, "{:?}", rep.details);
    assert!(!rep.has_violations(), "{:?}", rep.details);
    assert_eq!(rep.direct.writes_rejected_stale, 1);
    let line = rep.result_line();
    for k in [
        "ops=4",
        "linearizable=true",
        "double_grants=0",
        "token_regressions=0",
        "stale_writes_accepted=0",
        "lost_updates_fenced=na",
        "lost_updates_unfenced=na",
        "faults_kill=0",
        "pauses_verified=0",
        "failover_ms_p50=na",
        "failover_ms_p99=na",
    ] {
        assert!(line.contains(k), "{k} missing from {line}");
    }
}

#[test]
fn grant_before_the_holders_deadline_is_not_linearizable() {
    let mut r = Vec::new();
    r.extend(acquire(1, 1, 0, 10, 5));
    r.push(Record::LeaseLost {
        process: 1,
        name: "n".into(),
        token: 5,
        deadline_ns: 100,
        at_ns: 100,
    });
    r.extend(acquire(2, 1, 20, 30, 6));
    let rep = check(r);
    assert_eq!(rep.linearizable, Linearizable::False);
    assert!(rep.has_violations());
    assert!(rep.result_line().contains("linearizable=false"));
    // Process 2 was granted at 30 while process 1 believed until 100: a belief overlap.
    assert_eq!(rep.direct.belief_overlaps, 1, "{:?}", rep.details);
    assert_eq!(rep.signatures(), vec![Signature::BeliefOverlap]);
    assert!(rep.result_line().contains("belief_overlaps=1"));
}

#[test]
fn a_grant_that_arrives_after_its_clients_deadline_overlaps_nothing() {
    // Process 2's wait was granted token 5 long ago; a lagging node told it only at 60, after
    // its own deadline (40), when process 1 already held token 6. Process 2 knew on arrival.
    let mut r = Vec::new();
    r.extend(acquire(1, 1, 20, 30, 6));
    r.push(Record::ProcessEnd {
        process: 1,
        at_ns: 100,
    });
    r.extend(acquire(2, 1, 0, 60, 5));
    r.push(Record::LeaseLost {
        process: 2,
        name: "n".into(),
        token: 5,
        deadline_ns: 40,
        at_ns: 70,
    });
    let rep = check(r.clone());
    assert_eq!(rep.direct.belief_overlaps, 0, "{:?}", rep.details);
    // The same answer before its deadline is an overlap.
    let last = r.len() - 1;
    r[last] = Record::LeaseLost {
        process: 2,
        name: "n".into(),
        token: 5,
        deadline_ns: 80,
        at_ns: 80,
    };
    let rep = check(r);
    assert_eq!(rep.direct.belief_overlaps, 1, "{:?}", rep.details);
}

#[test]
fn an_unknown_verdict_is_counted_and_has_its_own_exit_code() {
    let mut r = Vec::new();
    r.extend(acquire(1, 1, 0, 10, 5));
    r.extend(release(1, 2, 20, 30, 5, true));
    let h = History { records: r };
    let none = Budget {
        max_steps: 0,
        max_time: std::time::Duration::ZERO,
    };
    let rep = checker::check(&h, none).unwrap();
    assert_eq!(rep.linearizable, Linearizable::Unknown, "{:?}", rep.details);
    assert!(rep.is_unknown() && !rep.has_violations());
    let line = rep.result_line();
    assert!(line.contains(" unknown=1 violations=false"), "{line}");
    let code = |v, u, a| format!("{:?}", checker::exit_code(v, u, a));
    assert_eq!(
        code(false, true, false),
        format!("{:?}", std::process::ExitCode::from(3))
    );
    assert_eq!(code(false, true, true), code(false, false, false));
    assert_eq!(
        code(true, true, true),
        format!("{:?}", std::process::ExitCode::from(1))
    );
    assert_ne!(code(false, false, false), code(true, false, false));
}

#[test]
fn unknown_outcomes_are_tolerated() {
    let mut r = Vec::new();
    // Process 1's acquire times out; it may hold the lock until it ends its session at 50.
    r.extend(op(
        1,
        1,
        0,
        Some(10),
        Call::Acquire { name: "n".into() },
        Outcome::Unknown,
    ));
    r.push(Record::ProcessEnd {
        process: 1,
        at_ns: 50,
    });
    // Process 2 is granted after that; tokens must still rise past the unknown grant.
    r.extend(acquire(2, 1, 60, 70, 3));
    // Process 2's release never completes (killed).
    r.extend(op(
        2,
        2,
        80,
        None,
        Call::Release {
            name: "n".into(),
            token: 3,
        },
        Outcome::Ok,
    ));
    r.extend(acquire(3, 1, 90, 95, 4));
    let rep = check(r);
    assert_eq!(rep.linearizable, Linearizable::True, "{:?}", rep.details);
}

#[test]
fn service_records_double_grant_regression_and_expired_session() {
    let rep = check(vec![
        grant(1, 5, "a"),
        grant(2, 6, "b"), // double grant: 5 still held
        end(3, 5),
        end(4, 6),
        grant(5, 6, "c"), // token regression: 6 again
        end(6, 6),
        Record::SvcSessionExpired {
            seq: 7,
            group: 1,
            session: "d".into(),
            time_ms: 7,
        },
        grant(8, 9, "d"), // grant to an expired session
    ]);
    assert_eq!(rep.direct.double_grants, 1, "{:?}", rep.details);
    assert_eq!(rep.direct.token_regressions, 1, "{:?}", rep.details);
    assert_eq!(
        rep.direct.grants_to_expired_sessions, 1,
        "{:?}",
        rep.details
    );
    assert!(rep.has_violations());
}

#[test]
fn client_seen_token_regression_is_counted() {
    let mut r = Vec::new();
    r.extend(acquire(1, 1, 0, 10, 8));
    r.extend(release(1, 2, 20, 30, 8, true));
    r.extend(acquire(2, 1, 40, 50, 7));
    let rep = check(r);
    assert_eq!(rep.direct.token_regressions, 1);
    assert_eq!(rep.linearizable, Linearizable::False);
}

#[test]
fn stale_writes_accepted_and_lost_updates_are_counted() {
    let w = |p: u64, id: u64, a: u64, token: u64, fenced: bool, value: &str, add: u64| {
        op(
            p,
            id,
            a,
            Some(a + 5),
            Call::Write {
                key: if fenced { "f".into() } else { "u".into() },
                token: Some(token),
                fenced,
                value: value.into(),
                add: Some(add),
            },
            Outcome::Accepted,
        )
    };
    let mut r = vec![store_log(1, 9, true, true), store_log(2, 4, true, true)];
    r.push(store_log(3, 3, false, true));
    r.extend(w(1, 1, 0, 1, false, "[1]", 1));
    r.extend(w(2, 1, 10, 2, false, "[2]", 2)); // overwrote 1: lost
    r.extend(w(3, 1, 20, 1, true, "[1]", 1));
    r.extend(w(4, 1, 30, 2, true, "[1,2]", 2));
    r.push(Record::LocksetFinal {
        key: "u".into(),
        fenced: false,
        elements: vec![2],
    });
    r.push(Record::LocksetFinal {
        key: "f".into(),
        fenced: true,
        elements: vec![1, 2],
    });
    r.push(Record::Fault {
        kind: "pause".into(),
        at_ns: 1,
        target: "client-1".into(),
        verified: true,
        hold_ms: 0,
    });
    r.push(Record::Failover {
        at_ns: 2,
        ms: 900.0,
    });
    let rep = check(r);
    assert_eq!(rep.direct.stale_writes_accepted, 1, "{:?}", rep.details);
    assert_eq!(rep.direct.stale_writes_unfenced, 1);
    assert_eq!(rep.direct.lost_updates_unfenced, Some(1));
    assert_eq!(rep.direct.lost_updates_fenced, Some(0));
    let line = rep.result_line();
    assert!(line.contains("lost_updates_unfenced=1"), "{line}");
    assert!(line.contains("faults_pause=1 pauses_verified=1"), "{line}");
    assert!(line.contains("failover_ms_p50=900"), "{line}");
    assert!(
        rep.has_violations(),
        "a fenced stale write accepted is a violation"
    );
}
