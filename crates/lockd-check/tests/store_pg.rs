//! The fenced store against a real PostgreSQL, and the lock-set self-test end to end.
//!
//! These need `LOCKD_CHECK_PG` (a connection string; `scripts/ci-postgres.sh` starts a server and
//! prints one). Without it each test fails, naming what is missing.

use lockd_check::checker::{self, Budget, Linearizable};
use lockd_check::demo::{run_lockset, LocksetConfig};
use lockd_check::history::{Record, StoreOp};
use lockd_check::store::{Fencing, Store, WriteOutcome, PG_ENV};

/// The connection string. Without one the test fails: a store test that returns early would
/// count as passed. `scripts/verify` leaves this binary out, and lists it as skipped, when it
/// cannot start PostgreSQL outside CI.
fn pg() -> String {
    match std::env::var(PG_ENV) {
        Ok(s) if !s.is_empty() => s,
        _ => panic!(
            "{PG_ENV} is not set, so this PostgreSQL test cannot run; start one with \
             export {PG_ENV}=\"$(scripts/ci-postgres.sh)\" (or leave this test binary out: \
             cargo nextest run -E 'not binary(store_pg)')"
        ),
    }
}

fn ns(tag: &str) -> String {
    format!(
        "lockd_check_t_{tag}_{}_{}",
        std::process::id(),
        lockd_check::history::MonotonicClock::raw_ns() % 1_000_000
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_write_accepts_newer_and_rejects_older_tokens() {
    let pg = pg();
    let mut s = Store::connect(&pg, &ns("fence")).await.unwrap();
    s.setup().await.unwrap();
    s.init_key("k", "v0").await.unwrap();
    use WriteOutcome::*;
    assert_eq!(
        s.write("k", 5, "v5", Fencing::Fenced).await.unwrap(),
        Accepted
    );
    assert_eq!(
        s.write("k", 5, "v5b", Fencing::Fenced).await.unwrap(),
        Accepted
    );
    assert_eq!(
        s.write("k", 4, "v4", Fencing::Fenced).await.unwrap(),
        RejectedStale
    );
    assert_eq!(s.read("k").await.unwrap(), "v5b");
    // A fenced read by a newer holder shuts out the older one.
    assert_eq!(s.read_fenced("k", 8).await.unwrap().as_deref(), Some("v5b"));
    assert_eq!(
        s.write("k", 6, "v6", Fencing::Fenced).await.unwrap(),
        RejectedStale
    );
    assert_eq!(s.read_fenced("k", 7).await.unwrap(), None);
    // The unfenced control overwrites regardless.
    assert_eq!(
        s.write("k", 1, "v1", Fencing::Unfenced).await.unwrap(),
        Accepted
    );
    assert_eq!(s.read("k").await.unwrap(), "v1");

    let log = s.log_records().await.unwrap();
    let summary: Vec<(StoreOp, Option<u64>, bool, bool, u64)> = log
        .iter()
        .map(|r| match r {
            Record::StoreLog {
                op,
                token,
                fenced,
                accepted,
                fence_before,
                ..
            } => (*op, *token, *fenced, *accepted, *fence_before),
            other => panic!("{other:?}"),
        })
        .collect();
    use StoreOp::*;
    assert_eq!(
        summary,
        vec![
            (Write, Some(5), true, true, 0),
            (Write, Some(5), true, true, 5),
            (Write, Some(4), true, false, 5),
            (Read, Some(8), true, true, 5),
            (Write, Some(6), true, false, 8),
            (Read, Some(7), true, false, 8),
            (Write, Some(1), false, true, 8),
        ]
    );
    s.drop_namespace().await.unwrap();
}

/// Many connections race fenced writes with random tokens: the store's log never shows an
/// accepted write below an earlier accepted token, and the final fence is the highest accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_fenced_writes_never_accept_stale_tokens() {
    let pg = pg();
    let ns = ns("race");
    let admin = Store::connect(&pg, &ns).await.unwrap();
    admin.setup().await.unwrap();
    admin.init_key("k", "x").await.unwrap();
    let mut tasks = Vec::new();
    for w in 0..6u64 {
        let (pg, ns) = (pg.clone(), ns.clone());
        tasks.push(tokio::spawn(async move {
            let mut s = Store::connect(&pg, &ns).await.unwrap();
            let mut rng = fastrand::Rng::with_seed(w);
            for _ in 0..40 {
                let t = rng.u64(1..200);
                s.write("k", t, &format!("w{w}t{t}"), Fencing::Fenced)
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let h = lockd_check::history::History {
        records: admin.log_records().await.unwrap(),
    };
    assert_eq!(h.records.len(), 240);
    let rep = checker::check(&h, Budget::default()).unwrap();
    assert_eq!(rep.direct.stale_writes_accepted, 0, "{:?}", rep.details);
    assert!(rep.direct.writes_rejected_stale > 0);
    admin.drop_namespace().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lockset_self_test_unfenced_loses_updates_fenced_loses_none() {
    let pg = pg();
    for fencing in [Fencing::Unfenced, Fencing::Fenced] {
        let mut cfg = LocksetConfig::new(pg.clone(), fencing);
        cfg.workers = 4;
        cfg.adds_per_worker = 10;
        cfg.pause_probability = 0.3;
        let rec = run_lockset(&cfg).await.unwrap();
        let rep = checker::check(&rec.history(), Budget::default()).unwrap();
        eprintln!("{fencing:?}: {}", rep.result_line());
        assert_eq!(rep.linearizable, Linearizable::True, "{:?}", rep.details);
        assert!(!rep.has_violations(), "{:?}", rep.details);
        let d = &rep.direct;
        match fencing {
            Fencing::Unfenced => {
                assert!(d.lost_updates_unfenced.unwrap() > 0, "{:?}", rep.details);
                assert_eq!(d.lost_updates_fenced, None);
            }
            Fencing::Fenced => {
                assert_eq!(d.lost_updates_fenced, Some(0), "{:?}", rep.details);
                assert!(
                    d.writes_rejected_stale > 0,
                    "the pauses must have been fenced off"
                );
                assert!(d.acked_adds_fenced > 0);
            }
            Fencing::SabotagedNoCheck => unreachable!(),
        }
    }
}

/// The checker catches a stale write slipped into a fenced run's store log (so a store without
/// its fence check fails the run), and a save/load round trip keeps the verdict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampered_fenced_history_is_rejected() {
    let pg = pg();
    let mut cfg = LocksetConfig::new(pg, Fencing::Fenced);
    cfg.workers = 3;
    cfg.adds_per_worker = 5;
    cfg.pause_probability = 0.0;
    let mut h = run_lockset(&cfg).await.unwrap().history();
    let dir = std::env::temp_dir().join(format!("lockd-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("fenced.jsonl");
    h.save(&path).unwrap();
    let back = lockd_check::history::History::load(&[&path]).unwrap();
    assert_eq!(back, h);
    let rep = checker::check(&back, Budget::default()).unwrap();
    assert!(!rep.has_violations(), "{:?}", rep.details);
    h.records.push(Record::StoreLog {
        seq: u64::MAX,
        key: "lockset-fenced".into(),
        op: StoreOp::Write,
        token: Some(1),
        fenced: true,
        accepted: true,
        fence_before: 1,
        value: None,
    });
    let rep = checker::check(&h, Budget::default()).unwrap();
    assert_eq!(rep.direct.stale_writes_accepted, 1);
    assert!(rep.has_violations());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Negative controls: a store that claims fencing but checks nothing, and clients that believe
/// they hold the lock past their lease, must each fail the run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sabotaged_runs_fail_the_checker() {
    let pg = pg();
    for (fencing, client_deadline) in [(Fencing::SabotagedNoCheck, false), (Fencing::Fenced, true)]
    {
        let mut cfg = LocksetConfig::new(pg.clone(), fencing);
        cfg.workers = 4;
        cfg.adds_per_worker = 10;
        cfg.pause_probability = 0.3;
        cfg.sabotage_client_deadline = client_deadline;
        let rec = run_lockset(&cfg).await.unwrap();
        let rep = checker::check(&rec.history(), Budget::default()).unwrap();
        eprintln!(
            "{fencing:?} client_deadline={client_deadline}: {}",
            rep.result_line()
        );
        assert!(
            rep.has_violations(),
            "sabotage not caught: {}",
            rep.result_line()
        );
        if client_deadline {
            assert_eq!(rep.linearizable, Linearizable::False);
        } else {
            assert!(rep.direct.stale_writes_accepted > 0);
            assert!(rep.direct.lost_updates_fenced.unwrap() > 0);
        }
    }
}
