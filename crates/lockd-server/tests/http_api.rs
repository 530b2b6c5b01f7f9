//! The HTTP/JSON contract against a real node on port 0.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

async fn single() -> (Cluster, Http) {
    let c = cluster(1, 2).await;
    let h = Http::new(c.url(0, ""));
    (c, h)
}

/// Waits until `name` has `n` waiters.
async fn until_waiters(h: &Http, name: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while h.inspect(name).await["waiters"].as_array().unwrap().len() != n {
        assert!(Instant::now() < deadline, "{name} never had {n} waiters");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_try_lock_inspect_keepalive_extend_and_status() {
    let (mut c, h) = single().await;
    let st = h.get("/v1/status").await;
    assert_eq!(st.status, 200);
    assert_eq!(st.body["node_id"], 1);
    assert_eq!(
        st.body["groups"].as_array().unwrap().len(),
        3,
        "meta + 2 lock groups"
    );
    // A normal node runs no negative control (lockd-check's `negative_controls.rs` shows a
    // sabotaged one naming its own), and has no series of them.
    assert_eq!(
        st.body["unsafe_negative_controls"],
        json!([]),
        "{}",
        st.body
    );
    assert_eq!(h.get("/readyz").await.body, json!({"ready": true}));
    // The test namespaces have tokens, so the series (which name them) are the admin's.
    let refused = h.get("/metrics").await;
    assert_eq!(refused.status, 401, "{}", refused.body);
    let why = refused.body["error"]["message"].as_str().unwrap();
    assert!(why.contains("--probes") && why.contains("admin"), "{why}");
    let wrong = h.with_token(SECURE_TOKEN).get("/metrics").await;
    assert_eq!(
        wrong.status, 403,
        "a namespace's token is not enough: {}",
        wrong.body
    );
    let metrics = h.admin().get("/metrics").await;
    assert!(!metrics
        .body
        .as_str()
        .unwrap()
        .contains("lockd_unsafe_negative_control{"));

    let r = h
        .post(
            "/v1/sessions",
            json!({"client": "payout-worker-17", "ttl_s": 15}),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["ttl_s"], 15);
    assert_eq!(r.body["keepalive_every_s"], 5);
    // Opened in one lock group, its home (the default namespace's home group).
    let home = r.body["group"].as_u64().unwrap();
    assert!((1..=2).contains(&home), "{}", r.body);
    let s1 = r.body["session_id"].as_str().unwrap().to_string();
    let s2 = h.session("payout-worker-02", 15).await;

    let name = "payouts/merchant-48213";
    let r = h
        .acquire(
            name,
            json!({"session_id": s1, "owner": "payout-worker-17/batch-2210", "wait_ms": 0}),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["acquired"], true);
    assert_eq!(r.body["lease_ttl_ms"], 15_000);
    let t1 = r.body["token"].as_u64().unwrap();
    // The grant names its group and the group's move count (none moved yet).
    let granted_in = r.body["group"].as_u64().unwrap();
    assert!((1..=2).contains(&granted_in), "{}", r.body);
    assert_eq!(r.body["group_moves"], 0);
    // A group other than the home adopts the session for its first acquire there.
    assert_eq!(r.body["lease_started"], granted_in != home, "{}", r.body);
    // The leader renewed the session's lease in that group as it granted.
    let renewed = &r.body["renewed"];
    assert_eq!(renewed["group_moves"], 0, "{}", r.body);
    let left = renewed["ttl_ms"].as_u64().unwrap();
    assert!(left > 14_000 && left <= 15_000, "{}", r.body);

    let r = h
        .acquire(
            name,
            json!({"session_id": s2, "owner": "payout-worker-02/batch-2207"}),
        )
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        r.body,
        json!({"acquired": false, "holder": "payout-worker-17/batch-2210", "queue_position": 1, "lock_delay_until_ms": null, "wait_estimate_ms": null})
    );

    let info = h.admin().inspect(name).await;
    assert_eq!(
        info["holder"],
        json!({"session": s1, "owner": "payout-worker-17/batch-2210"})
    );
    assert_eq!(info["token"], t1);
    assert_eq!(info["mode"], "exclusive");
    assert_eq!(info["reentry"], 1);
    assert_eq!(info["waiters"], json!([]));

    let r = h
        .post(&format!("/v1/sessions/{s1}:keepalive"), json!({}))
        .await;
    assert_eq!((r.status, r.body["ttl_s"].clone()), (200, json!(15)));
    // Each lock group answers for itself: the session lives in its home and in the groups it
    // took a lock in.
    let answer = |g: u64| {
        if g == home || g == granted_in {
            json!({"group": g, "state": "extended", "ttl_ms": 15_000, "group_moves": 0})
        } else {
            json!({"group": g, "state": "not_here"})
        }
    };
    assert_eq!(r.body["groups"], json!([answer(1), answer(2)]));
    // A keepalive that names its groups asks only those; an id that is no group is not here.
    let r = h
        .post(
            &format!("/v1/sessions/{s1}:keepalive"),
            json!({"groups": [9, home, home]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.body["groups"],
        json!([answer(home), {"group": 9, "state": "not_here"}])
    );
    // Only groups that do not have the session: each says so, and nothing is extended (the
    // session lives elsewhere; a 404 says it lives nowhere).
    let r = h
        .post(
            &format!("/v1/sessions/{s1}:keepalive"),
            json!({"groups": [7]}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["ttl_ms"], 0, "{}", r.body);
    assert_eq!(r.body["groups"], json!([{"group": 7, "state": "not_here"}]));
    let r = h
        .post(
            &format!("/v1/locks/{}:extend", enc(name)),
            json!({"session_id": s1, "token": t1}),
        )
        .await;
    assert_eq!(
        (r.status, r.body["lease_ttl_ms"].clone()),
        (200, json!(15_000))
    );

    let r = h.get(&format!("/v1/sessions/{s1}")).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["held"][0]["name"], name);
    assert_eq!(r.body["held"][0]["token"], t1);

    let r = h.admin().get("/v1/sessions?limit=10").await;
    assert_eq!(r.status, 200);
    let listed: Vec<_> = r.body["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap().to_string())
        .collect();
    let mut want = vec![s1.clone(), s2.clone()];
    want.sort();
    assert_eq!(listed, want);
    let first = &r.body["sessions"][0];
    assert_eq!(first["held"], if want[0] == s1 { 1 } else { 0 });
    let r = h
        .admin()
        .get(&format!("/v1/sessions?after={}", want[0]))
        .await;
    assert_eq!(r.body["sessions"].as_array().unwrap().len(), 1);
    // 0 is the default page, as on gRPC; above 1000 is refused.
    assert_eq!(h.admin().get("/v1/sessions?limit=0").await.status, 200);
    assert_eq!(h.admin().get("/v1/sessions?limit=1001").await.status, 400);
    assert_eq!(h.admin().get("/v1/sessions?after=zz").await.status, 400);
    let r = h.release(name, &s1, t1).await;
    assert_eq!(
        (r.status, r.body.clone()),
        (200, json!({"released": true, "remaining": 0}))
    );
    assert_eq!(h.inspect(name).await["holder"], json!(null));

    let m = h.admin().get("/metrics").await;
    assert_eq!(m.status, 200);
    let text = m.body.as_str().unwrap();
    // The grant is `ok`; the try-lock that found the name taken is `busy`, not `ok`.
    for line in [
        "lockd_ops_total{op=\"acquire\",result=\"ok\",api=\"http\"} 1",
        "lockd_ops_total{op=\"acquire\",result=\"busy\",api=\"http\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "no '{line}' in:\n{text}");
    }
    assert!(text.contains("lockd_keepalives_total"));
    assert!(text.contains("lockd_held_locks{group="));
    let synced = text
        .lines()
        .find_map(|l| l.strip_prefix("lockd_log_sync_seconds_count "))
        .unwrap();
    assert!(
        synced.trim().parse::<u64>().unwrap() > 0,
        "appends were fsync'd and timed"
    );
    c.stop_all().await;
}

/// A session reaches a group other than its home by its first acquire there. A try-lock that
/// finds the name held leaves no trace there; a wait that queued there keeps the session's
/// lease there even when it ends without a grant, and its answer says so (a client counts
/// that lease from the request's send).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_in_another_group_adopts_the_session_only_when_it_queues_or_gets_the_lock() {
    let (mut c, h) = single().await;
    let holder = h.session("holder", 15).await;
    let opened = h
        .post("/v1/sessions", json!({"client": "w", "ttl_s": 15}))
        .await;
    let home = opened.body["group"].as_u64().unwrap();
    let waiter = opened.body["session_id"].as_str().unwrap().to_string();
    // A name of the other group, held by `holder`.
    let mut held = None;
    for i in 0..200 {
        let name = format!("elsewhere/{i}");
        let r = h.acquire(&name, json!({"session_id": holder})).await;
        let token = r.body["token"].as_u64().unwrap();
        if r.body["group"].as_u64() != Some(home) {
            held = Some((name, r.body["group"].as_u64().unwrap()));
            break;
        }
        assert_eq!(h.release(&name, &holder, token).await.status, 200);
    }
    let (name, other) = held.expect("a name of the other group in 200");
    // Whether the session has a lease in the other group: a keepalive naming it extends it.
    let in_other = |h: Http, s: String| async move {
        let k = h
            .post(
                &format!("/v1/sessions/{s}:keepalive"),
                json!({"groups": [other]}),
            )
            .await;
        assert_eq!(k.status, 200, "{}", k.body);
        k.body["groups"][0]["state"] == "extended"
    };
    // Busy: no adoption.
    let r = h.acquire(&name, json!({"session_id": waiter})).await;
    assert_eq!(r.body["acquired"], false, "{}", r.body);
    assert!(r.body.get("adopted_in").is_none(), "{}", r.body);
    assert!(!in_other(h.clone(), waiter.clone()).await);
    // A wait that times out: adopted, and said so.
    let r = h
        .acquire(&name, json!({"session_id": waiter, "wait_ms": 200}))
        .await;
    assert_eq!(r.body["acquired"], false, "{}", r.body);
    assert_eq!(r.body["adopted_in"], json!([other]), "{}", r.body);
    assert!(in_other(h.clone(), waiter.clone()).await);

    // Through a node that hosts both groups, a session's first acquire in the other group is
    // one log entry there (the adopting acquire), not a refused acquire and then another.
    let opened = h
        .post("/v1/sessions", json!({"client": "one-entry", "ttl_s": 15}))
        .await;
    assert_eq!(opened.body["group"], home, "{}", opened.body);
    let fresh = opened.body["session_id"].as_str().unwrap().to_string();
    let applied = |h: Http| async move {
        let st = h.get("/v1/status").await.body;
        st["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["id"] == other)
            .unwrap()["applied_index"]
            .as_u64()
            .unwrap()
    };
    let free = (0..200)
        .map(|i| format!("{name}/free-{i}"))
        .find(|n| c.node(0).service.route(n).unwrap().id() as u64 == other)
        .expect("a name of the other group in 200");
    let before = applied(h.clone()).await;
    let r = h.acquire(&free, json!({"session_id": fresh})).await;
    assert_eq!(r.body["acquired"], true, "{}", r.body);
    assert_eq!(r.body["lease_started"], true, "{}", r.body);
    assert_eq!(
        applied(h.clone()).await,
        before + 1,
        "one entry in group {other}"
    );
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_granted_in_fifo_order_on_release() {
    let (mut c, h) = single().await;
    let name = "search/shard-17";
    let holder = h.session("holder", 15).await;
    let t0 = h.acquire(name, json!({"session_id": holder})).await.body["token"]
        .as_u64()
        .unwrap();
    let mut waits = Vec::new();
    let mut sessions = Vec::new();
    for i in 0..3 {
        let s = h.session(&format!("w{i}"), 15).await;
        let hh = h.clone();
        let ss = s.clone();
        waits.push(tokio::spawn(async move {
            let r = hh
                .acquire(
                    name,
                    json!({"session_id": ss, "owner": format!("w{i}"), "wait_ms": 20_000}),
                )
                .await;
            (r.status, r.body)
        }));
        until_waiters(&h, name, i + 1).await;
        sessions.push(s);
    }
    assert_eq!(h.admin().inspect(name).await["waiters"], json!(sessions));
    // Each release hands the lock to the next waiter, whose long poll returns at once.
    let mut prev = (holder, t0);
    for (i, w) in waits.into_iter().enumerate() {
        assert_eq!(h.release(name, &prev.0, prev.1).await.status, 200);
        let (status, body) = w.await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(body["acquired"], true, "waiter {i}: {body}");
        let t = body["token"].as_u64().unwrap();
        assert!(t > prev.1, "tokens rise: {t} after {}", prev.1);
        assert_eq!(h.inspect(name).await["holder"]["owner"], format!("w{i}"));
        prev = (sessions[i].clone(), t);
    }
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_exclusive_semaphore_and_reentrancy() {
    let (mut c, h) = single().await;
    let (a, b, d) = (
        h.session("a", 15).await,
        h.session("b", 15).await,
        h.session("d", 15).await,
    );
    // Shared + shared, then exclusive is refused.
    assert_eq!(
        h.acquire("idx", json!({"session_id": a, "mode": "shared"}))
            .await
            .body["acquired"],
        true
    );
    assert_eq!(
        h.acquire("idx", json!({"session_id": b, "mode": "shared"}))
            .await
            .body["acquired"],
        true
    );
    assert_eq!(
        h.acquire("idx", json!({"session_id": d, "mode": "exclusive"}))
            .await
            .body["acquired"],
        false
    );
    assert_eq!(
        h.inspect("idx").await["holders"].as_array().unwrap().len(),
        2
    );
    // Semaphore of 2.
    let sem = |s: &str| json!({"session_id": s, "mode": "semaphore", "limit": 2});
    let ta = h.acquire("exports", sem(&a)).await.body["token"]
        .as_u64()
        .unwrap();
    let tb = h.acquire("exports", sem(&b)).await.body["token"]
        .as_u64()
        .unwrap();
    assert_ne!(ta, tb);
    let r = h.acquire("exports", sem(&d)).await;
    assert_eq!(r.body["acquired"], false);
    assert_eq!(h.inspect("exports").await["limit"], 2);
    // Re-entrancy: twice in, twice out, same token.
    let re = json!({"session_id": a, "owner": "task-1", "reentrant": true});
    let r1 = h.acquire("cfg", re.clone()).await.body;
    let r2 = h.acquire("cfg", re).await.body;
    assert_eq!(r1["token"], r2["token"]);
    assert_eq!(
        (r1["reentry"].clone(), r2["reentry"].clone()),
        (json!(1), json!(2))
    );
    let t = r1["token"].as_u64().unwrap();
    assert_eq!(h.release("cfg", &a, t).await.body["remaining"], 1);
    assert_eq!(h.inspect("cfg").await["reentry"], 1);
    assert_eq!(h.release("cfg", &a, t).await.body["remaining"], 0);
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_session_frees_all_and_wakes_waiters() {
    let (mut c, h) = single().await;
    let (a, b) = (h.session("a", 15).await, h.session("b", 15).await);
    for n in ["x/1", "x/2", "x/3"] {
        assert_eq!(
            h.acquire(n, json!({"session_id": a})).await.body["acquired"],
            true
        );
    }
    let hh = h.clone();
    let bb = b.clone();
    let wait = tokio::spawn(async move {
        hh.acquire("x/2", json!({"session_id": bb, "wait_ms": 20_000}))
            .await
            .body
    });
    until_waiters(&h, "x/2", 1).await;
    let r = h.delete(&format!("/v1/sessions/{a}")).await;
    assert_eq!(
        (r.status, r.body.clone()),
        (200, json!({"closed": true, "released": 3}))
    );
    assert_eq!(wait.await.unwrap()["acquired"], true);
    assert_eq!(h.inspect("x/1").await["holder"], json!(null));
    assert_eq!(h.admin().inspect("x/2").await["holder"]["session"], b);
    assert_eq!(
        h.post(&format!("/v1/sessions/{a}:keepalive"), json!({}))
            .await
            .status,
        404
    );
    assert_eq!(h.delete(&format!("/v1/sessions/{a}")).await.status, 404);
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_delay_holds_a_name_after_its_holder_expires() {
    let (mut c, h) = single().await;
    // Namespace fast/: TTL 1-3 s, lock-delay 1.5 s.
    let dead = h.session_in("dead", 1, "fast").await;
    let live = h.session_in("live", 3, "fast").await;
    assert_eq!(
        h.acquire("fast/job", json!({"session_id": dead}))
            .await
            .body["acquired"],
        true
    );
    let hh = h.clone();
    let l = live.clone();
    let wait = tokio::spawn(async move {
        hh.acquire("fast/job", json!({"session_id": l, "wait_ms": 30_000}))
            .await
            .body
    });
    until_waiters(&h, "fast/job", 1).await;
    // Keep `live` alive; let `dead` lapse.
    let hh = h.clone();
    let l = live.clone();
    let keep = tokio::spawn(async move {
        loop {
            hh.post(&format!("/v1/sessions/{l}:keepalive"), json!({}))
                .await;
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    });
    // After expiry the name is free of holders but delayed, and the waiter still waits.
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut saw_delay = false;
    while !wait.is_finished() {
        let info = h.admin().inspect("fast/job").await;
        if info["holder"].is_null() && !info["lock_delay_until_ms"].is_null() {
            assert_eq!(
                info["waiters"],
                json!([live]),
                "the waiter waits out the delay"
            );
            saw_delay = true;
        }
        assert!(Instant::now() < deadline, "waiter never granted");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(saw_delay, "never observed the lock-delay");
    assert_eq!(wait.await.unwrap()["acquired"], true);
    assert_eq!(
        h.post(&format!("/v1/sessions/{dead}:keepalive"), json!({}))
            .await
            .status,
        404
    );
    keep.abort();
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_input_gets_its_error_and_changes_nothing() {
    let (mut c, h) = single().await;
    let s = h.session("s", 15).await;
    let other = h.session("o", 15).await;
    let t = h.acquire("held", json!({"session_id": s})).await.body["token"]
        .as_u64()
        .unwrap();
    // Fill tight/q's queue (1 waiter) so the next waiter is refused.
    let [st, w, ot] = [
        h.session_in("st", 15, "tight").await,
        h.session_in("w", 15, "tight").await,
        h.session_in("ot", 15, "tight").await,
    ];
    assert_eq!(
        h.acquire("tight/q", json!({"session_id": st})).await.body["acquired"],
        true
    );
    let hh = h.clone();
    let ww = w.clone();
    let waiting = tokio::spawn(async move {
        hh.acquire("tight/q", json!({"session_id": ww, "wait_ms": 60_000}))
            .await
    });
    until_waiters(&h, "tight/q", 1).await;

    let acq = |name: &str| format!("/v1/locks/{}:acquire", enc(name));
    let long_name = "n".repeat(513);
    let cases: Vec<(&str, String, serde_json::Value, u16, &str)> = vec![
        (
            "empty name",
            "/v1/locks/:acquire".into(),
            json!({"session_id": s}),
            400,
            "invalid_argument",
        ),
        (
            "name over 512 bytes",
            acq(&long_name),
            json!({"session_id": s}),
            400,
            "invalid_argument",
        ),
        (
            "name with a control character",
            acq("bad\u{1}name"),
            json!({"session_id": s}),
            400,
            "invalid_argument",
        ),
        (
            "owner over 256 bytes",
            acq("n"),
            json!({"session_id": s, "owner": "o".repeat(257)}),
            400,
            "invalid_argument",
        ),
        (
            "wait_ms over 300000",
            acq("n"),
            json!({"session_id": s, "wait_ms": 300_001}),
            400,
            "wait_too_long",
        ),
        (
            "negative wait_ms",
            acq("n"),
            json!({"session_id": s, "wait_ms": -1}),
            400,
            "invalid_argument",
        ),
        (
            "semaphore without limit",
            acq("n"),
            json!({"session_id": s, "mode": "semaphore"}),
            400,
            "invalid_semaphore_limit",
        ),
        (
            "unknown mode",
            acq("n"),
            json!({"session_id": s, "mode": "rw"}),
            400,
            "invalid_argument",
        ),
        (
            "malformed session id",
            acq("n"),
            json!({"session_id": "nope"}),
            400,
            "invalid_argument",
        ),
        (
            "unknown field",
            acq("n"),
            json!({"session_id": s, "ttl": 5}),
            400,
            "invalid_argument",
        ),
        (
            "unknown session",
            acq("n"),
            json!({"session_id": "s_00000000000000aa"}),
            404,
            "session_not_found",
        ),
        (
            "TTL below the namespace bound",
            "/v1/sessions".into(),
            json!({"ttl_s": 4}),
            400,
            "ttl_out_of_range",
        ),
        (
            "TTL above the namespace bound",
            "/v1/sessions".into(),
            json!({"ttl_s": 61}),
            400,
            "ttl_out_of_range",
        ),
        (
            "release by a non-holder",
            "/v1/locks/held:release".to_string(),
            json!({"session_id": other, "token": t}),
            409,
            "not_holder",
        ),
        (
            "release with a stale token",
            "/v1/locks/held:release".to_string(),
            json!({"session_id": s, "token": t - 1}),
            409,
            "stale_token",
        ),
        (
            "queue full",
            acq("tight/q"),
            json!({"session_id": ot, "wait_ms": 1_000}),
            429,
            "queue_full",
        ),
        (
            "a name outside the session's namespace",
            acq("tight/other"),
            json!({"session_id": s}),
            403,
            "wrong_namespace",
        ),
        (
            "unknown verb: a name with a colon, which takes GET only",
            "/v1/locks/held:steal".into(),
            json!({}),
            405,
            "method_not_allowed",
        ),
    ];
    for (what, path, body, status, code) in cases {
        let before: Vec<u64> = c.hashes(0);
        let r = h.post(&path, body).await;
        assert_eq!(
            (r.status, r.body["error"]["code"].as_str().unwrap_or("")),
            (status, code),
            "{what}: {}",
            r.body
        );
        assert!(
            !r.body["error"]["message"].as_str().unwrap().is_empty(),
            "{what}: a message"
        );
        if status == 429 {
            assert!(r.retry_after.is_some(), "{what}: Retry-After");
        }
        assert_eq!(before, c.hashes(0), "{what} changed the state");
    }
    // A body over 64 KiB.
    let before = c.hashes(0);
    let big = format!(
        "{{\"session_id\":\"{s}\",\"owner\":\"{}\"}}",
        "x".repeat(70_000)
    );
    let r = h.post_raw(&acq("n"), big.into_bytes()).await;
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str().unwrap()),
        (413, "body_too_large")
    );
    assert_eq!(before, c.hashes(0));
    // The messages name the field and the limit.
    let r = h
        .post(&acq("n"), json!({"session_id": s, "wait_ms": 300_001}))
        .await;
    assert!(r.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("wait_ms 300001 exceeds the limit of 300000"));
    let r = h
        .post(&acq("n"), json!({"session_id": s, "wait_ms": -1}))
        .await;
    assert!(
        r.body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("wait_ms: invalid value: integer `-1`"),
        "{}",
        r.body
    );
    let r = h
        .post(
            &acq("n"),
            json!({"session_id": s, "owner": "o".repeat(257)}),
        )
        .await;
    assert!(r.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("owner is too long"));
    waiting.abort();
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_guard_namespaces_and_budgets_throttle() {
    let (mut c, h) = single().await;
    let s = h.session("s", 15).await;
    let r = h.acquire("secure/a", json!({"session_id": s})).await;
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str().unwrap()),
        (401, "unauthenticated")
    );
    let r = h
        .with_token(OTHER_TOKEN)
        .acquire("secure/a", json!({"session_id": s}))
        .await;
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str().unwrap()),
        (403, "permission_denied")
    );
    let r = h
        .with_token("not-a-token-at-all")
        .acquire("secure/a", json!({"session_id": s}))
        .await;
    assert_eq!(r.status, 401);
    assert_eq!(h.inspect_status("secure/a").await, 401);
    // The right token, but a session of the default namespace: it cannot take secure's names.
    let secure = h.with_token(SECURE_TOKEN);
    let r = secure.acquire("secure/a", json!({"session_id": s})).await;
    assert_eq!(
        (r.status, r.body["error"]["code"].as_str().unwrap()),
        (403, "wrong_namespace")
    );
    let sec = secure.session_in("sec", 15, "secure").await;
    let r = secure.acquire("secure/a", json!({"session_id": sec})).await;
    assert_eq!((r.status, r.body["acquired"].clone()), (200, json!(true)));
    // limited/: 3 ops/s with a burst of 3.
    let s = h.session_in("lim", 15, "limited").await;
    let mut statuses = Vec::new();
    let mut retry = None;
    for i in 0..6 {
        let r = h
            .acquire(&format!("limited/{i}"), json!({"session_id": s}))
            .await;
        statuses.push(r.status);
        if r.status == 429 {
            assert_eq!(r.body["error"]["code"], "rate_limited");
            retry = r.retry_after;
        }
    }
    assert!(
        statuses.iter().filter(|s| **s == 200).count() >= 3,
        "{statuses:?}"
    );
    assert!(statuses.contains(&429), "{statuses:?}");
    assert!(retry.is_some(), "429 carries Retry-After");
    c.stop_all().await;
}

/// A session is a capability of its namespace: without that namespace's token (or the admin's)
/// nobody can keep it alive, close it, read it or list it, and a refusal changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_capabilities_of_their_namespace() {
    let (mut c, h) = single().await;
    let secure = h.with_token(SECURE_TOKEN);
    let other = h.with_token(OTHER_TOKEN);
    let sec = secure.session_in("payout-worker", 15, "secure").await;
    let t = secure
        .acquire("secure/a", json!({"session_id": sec}))
        .await
        .body["token"]
        .as_u64()
        .unwrap();
    let open = h.session("open-worker", 15).await;
    let code = |r: &Resp| {
        (
            r.status,
            r.body["error"]["code"].as_str().unwrap_or("").to_string(),
        )
    };
    let keepalive = |s: &str| format!("/v1/sessions/{s}:keepalive");
    let session = |s: &str| format!("/v1/sessions/{s}");

    let before = c.hashes(0);
    for (who, client, status, err) in [
        ("no token", &h, 401, "unauthenticated"),
        (
            "another namespace's token",
            &other,
            403,
            "permission_denied",
        ),
    ] {
        let r = client.post(&keepalive(&sec), json!({})).await;
        assert_eq!(code(&r), (status, err.into()), "keepalive with {who}");
        let r = client.delete(&session(&sec)).await;
        assert_eq!(code(&r), (status, err.into()), "close with {who}");
        let r = client.get(&session(&sec)).await;
        assert_eq!(code(&r), (status, err.into()), "get with {who}");
    }
    // Listing sessions is the admin's, whatever namespace token is shown.
    assert_eq!(
        code(&h.get("/v1/sessions").await),
        (401, "unauthenticated".into())
    );
    assert_eq!(
        code(&secure.get("/v1/sessions").await),
        (403, "permission_denied".into())
    );
    assert_eq!(before, c.hashes(0), "a refused call changed the state");
    assert_eq!(
        h.admin().inspect("secure/a").await["holder"]["session"],
        sec.as_str(),
        "the lock is still held"
    );

    // With the namespace's token: keepalive and get; inspect shows no session id but the admin's.
    assert_eq!(secure.post(&keepalive(&sec), json!({})).await.status, 200);
    assert_eq!(secure.get(&session(&sec)).await.body["held"][0]["token"], t);
    let seen = secure.inspect("secure/a").await;
    assert_eq!(
        (seen["holder"]["session"].clone(), seen["token"].clone()),
        (json!(null), json!(t))
    );
    let r = h.admin().get("/v1/sessions").await;
    let listed: Vec<&str> = r.body["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["session_id"].as_str().unwrap())
        .collect();
    assert!(
        listed.contains(&sec.as_str()) && listed.contains(&open.as_str()),
        "{listed:?}"
    );
    // A session of the open default namespace: its id is the capability, no token needed.
    assert_eq!(h.post(&keepalive(&open), json!({})).await.status, 200);
    // A stuck lock (its holder alive but hung): the admin reads the holder and releases that
    // one hold, and can end the holder's session, freeing all it holds at once.
    let admin = h.admin();
    let stuck = admin.inspect("secure/a").await;
    let holder = stuck["holder"]["session"].as_str().unwrap().to_string();
    let r = admin
        .release("secure/a", &holder, stuck["token"].as_u64().unwrap())
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(admin.inspect("secure/a").await["holder"], json!(null));
    secure.acquire("secure/a", json!({"session_id": sec})).await;
    let r = admin.delete(&session(&sec)).await;
    assert_eq!((r.status, r.body["released"].clone()), (200, json!(1)));
    assert_eq!(admin.inspect("secure/a").await["holder"], json!(null));
    // The namespace's token closes its own sessions too, and frees their locks.
    let sec2 = secure.session_in("payout-worker-2", 15, "secure").await;
    secure
        .acquire("secure/b", json!({"session_id": sec2}))
        .await;
    let r = secure.delete(&session(&sec2)).await;
    assert_eq!((r.status, r.body["released"].clone()), (200, json!(1)));
    assert_eq!(secure.inspect("secure/b").await["holder"], json!(null));
    c.stop_all().await;
}

/// The admin members API: admin token only, every bad input a 400 naming its field, removing an
/// absent node a no-op.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_members_need_the_admin_and_check_their_input() {
    let (mut c, h) = single().await;
    let code = |r: &Resp| {
        (
            r.status,
            r.body["error"]["code"].as_str().unwrap_or("").to_string(),
        )
    };
    assert_eq!(
        code(&h.get("/v1/admin/members").await),
        (401, "unauthenticated".into())
    );
    let secure = h.with_token(SECURE_TOKEN);
    assert_eq!(
        code(&secure.get("/v1/admin/members").await),
        (403, "permission_denied".into())
    );
    let r = h
        .post(
            "/v1/admin/members",
            json!({"node_id": 2, "peer_addr": "127.0.0.1:1"}),
        )
        .await;
    assert_eq!(code(&r), (401, "unauthenticated".into()));
    assert_eq!(
        code(&h.delete("/v1/admin/members/1").await),
        (401, "unauthenticated".into())
    );

    let admin = h.admin();
    let r = admin.get("/v1/admin/members").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let groups = r.body["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 3, "the meta group and two lock groups");
    for g in groups {
        assert_eq!(g["leader"], 1);
        assert_eq!(g["members"][0]["node_id"], 1);
        assert_eq!(g["members"][0]["role"], "voter");
        assert_eq!(g["members"][0]["leader"], true);
    }
    let before = c.hashes(0);
    for (what, body, needle) in [
        (
            "node id 0",
            json!({"node_id": 0, "peer_addr": "127.0.0.1:1"}),
            "node_id",
        ),
        (
            "no port",
            json!({"node_id": 2, "peer_addr": "127.0.0.1"}),
            "peer_addr",
        ),
        (
            "unknown field",
            json!({"node_id": 2, "peer_addr": "127.0.0.1:1", "x": 1}),
            "x",
        ),
    ] {
        let r = admin.post("/v1/admin/members", body).await;
        assert_eq!(
            code(&r),
            (400, "invalid_argument".into()),
            "{what}: {}",
            r.body
        );
        assert!(
            r.body["error"]["message"]
                .as_str()
                .unwrap()
                .contains(needle),
            "{what}: {}",
            r.body
        );
    }
    // A group the cluster does not have depends on the cluster, not on the input's shape.
    let r = admin
        .post(
            "/v1/admin/members",
            json!({"node_id": 2, "peer_addr": "127.0.0.1:1", "groups": [9]}),
        )
        .await;
    assert_eq!(code(&r), (404, "group_not_found".into()), "{}", r.body);
    assert!(r.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("groups"));
    assert_eq!(code(&admin.delete("/v1/admin/members/x").await).0, 400);
    assert_eq!(
        code(&admin.delete("/v1/admin/members/1?groups=7").await).0,
        404
    );
    assert_eq!(
        code(&admin.delete("/v1/admin/members/1?groups=01").await).0,
        400
    );
    // The only voter cannot go; an absent node is already gone.
    let r = admin.delete("/v1/admin/members/1").await;
    assert_eq!(
        code(&r),
        (409, "member_change_refused".into()),
        "{}",
        r.body
    );
    let r = admin.delete("/v1/admin/members/9").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        before,
        c.hashes(0),
        "no refused call changed the lock state"
    );
    c.stop_all().await;
}

/// Every error is the JSON shape, the framework's own (405, a bad path) included; a body must
/// be a JSON object sent as application/json; `null` is a field left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_is_json_and_bodies_are_json_objects() {
    let (mut c, h) = single().await;
    let s = h.session("s", 15).await;
    let client = http_client().build().unwrap();
    let url = |p: &str| c.url(0, p);
    let shape = |what: &str, status: u16, want: u16, code: &str, body: &str| {
        let v: serde_json::Value =
            serde_json::from_str(body).unwrap_or_else(|_| panic!("{what}: not JSON: {body}"));
        assert_eq!(
            (status, v["error"]["code"].as_str().unwrap_or("")),
            (want, code),
            "{what}: {body}"
        );
        assert!(
            !v["error"]["message"].as_str().unwrap_or("").is_empty(),
            "{what}: a message"
        );
    };

    // 405 keeps its Allow header.
    let r = client.put(url("/v1/sessions")).send().await.unwrap();
    let (st, allow) = (r.status().as_u16(), r.headers().get("allow").cloned());
    let ct = r.headers().get("content-type").cloned();
    shape(
        "405",
        st,
        405,
        "method_not_allowed",
        &r.text().await.unwrap(),
    );
    assert!(allow.is_some(), "405 without Allow");
    assert!(ct
        .unwrap()
        .to_str()
        .unwrap()
        .starts_with("application/json"));
    // Allow names exactly what each shape of path takes; a literal `:` starts a verb, `%3A`
    // is part of the name.
    for (method, path, allow) in [
        (reqwest::Method::GET, "/v1/locks/x:acquire", "POST"),
        (reqwest::Method::POST, "/v1/locks/x", "GET, HEAD"),
        (reqwest::Method::DELETE, "/v1/locks/x:release", "POST"),
        (
            reqwest::Method::POST,
            "/v1/sessions/s_1",
            "GET, HEAD, DELETE",
        ),
        (reqwest::Method::GET, "/v1/sessions/s_1:keepalive", "POST"),
        (reqwest::Method::GET, "/v1/admin/members/4", "DELETE"),
        (reqwest::Method::DELETE, "/v1/admin/members/4:drain", "POST"),
    ] {
        let r = client
            .request(method.clone(), url(path))
            .send()
            .await
            .unwrap();
        let got = r
            .headers()
            .get("allow")
            .map(|v| v.to_str().unwrap().to_string());
        assert_eq!(got.as_deref(), Some(allow), "{method} {path}");
        shape(
            path,
            r.status().as_u16(),
            405,
            "method_not_allowed",
            &r.text().await.unwrap(),
        );
    }
    let held = h.acquire("job:release", json!({"session_id": s})).await;
    assert_eq!(held.status, 200, "{}", held.body);
    let r = h.get("/v1/locks/job%3Arelease").await;
    assert_eq!(
        (r.status, r.body["name"].as_str()),
        (200, Some("job:release"))
    );
    // A path that does not decode to UTF-8.
    let r = client.get(url("/v1/locks/%FF%FE")).send().await.unwrap();
    shape(
        "bad path",
        r.status().as_u16(),
        400,
        "invalid_argument",
        &r.text().await.unwrap(),
    );
    // An over-long request target.
    let r = client
        .get(url(&format!("/v1/locks/{}", "a".repeat(9000))))
        .send()
        .await
        .unwrap();
    shape(
        "414",
        r.status().as_u16(),
        414,
        "uri_too_long",
        &r.text().await.unwrap(),
    );
    // An unknown path.
    let r = client.get(url("/v2/nothing")).send().await.unwrap();
    shape(
        "404",
        r.status().as_u16(),
        404,
        "not_found",
        &r.text().await.unwrap(),
    );

    let before = c.hashes(0);
    let acquire = url("/v1/locks/j:acquire");
    let body = format!("{{\"session_id\":\"{s}\"}}");
    for (what, ct) in [
        ("text/plain", Some("text/plain")),
        ("a form", Some("application/x-www-form-urlencoded")),
        ("no Content-Type", None),
    ] {
        let mut rb = client.post(&acquire).body(body.clone());
        if let Some(ct) = ct {
            rb = rb.header("content-type", ct);
        }
        let r = rb.send().await.unwrap();
        shape(
            what,
            r.status().as_u16(),
            415,
            "unsupported_media_type",
            &r.text().await.unwrap(),
        );
    }
    // An array in place of the object, and a scalar.
    for raw in [format!("[\"{s}\"]"), "42".to_string()] {
        let r = client
            .post(&acquire)
            .header("content-type", "application/json")
            .body(raw.clone())
            .send()
            .await
            .unwrap();
        shape(
            &raw,
            r.status().as_u16(),
            400,
            "invalid_argument",
            &r.text().await.unwrap(),
        );
    }
    assert_eq!(before, c.hashes(0), "a refused body changed the state");
    // A wrong type names its field.
    let r = h
        .post(
            "/v1/locks/j:acquire",
            json!({"session_id": s, "wait_ms": "soon"}),
        )
        .await;
    assert!(
        r.body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("wait_ms: invalid type"),
        "{}",
        r.body
    );
    // `null` is absent, on every optional field.
    let r = h
        .post(
            "/v1/locks/j:acquire",
            json!({"session_id": s, "owner": null, "mode": null, "limit": null,
                   "wait_ms": null, "reentrant": null}),
        )
        .await;
    assert_eq!(
        (r.status, r.body["acquired"].as_bool()),
        (200, Some(true)),
        "{}",
        r.body
    );
    // The charset parameter is fine; no body at all needs no Content-Type.
    let r = client
        .post(url("/v1/sessions"))
        .header("content-type", "application/json; charset=utf-8")
        .body("{\"ttl_s\": 15}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r = client.post(url("/v1/sessions")).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 200);
    c.stop_all().await;
}

/// The backup: admin only, and it reports every lock group with the revision that minted the
/// tokens granted so far, and the namespaces with token digests, never tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_needs_the_admin_and_covers_every_token_granted() {
    let (mut c, h) = single().await;
    let code = |r: &Resp| {
        (
            r.status,
            r.body["error"]["code"].as_str().unwrap_or("").to_string(),
        )
    };
    assert_eq!(
        code(&h.get("/v1/admin/backup").await),
        (401, "unauthenticated".into())
    );
    assert_eq!(
        code(&h.with_token(SECURE_TOKEN).get("/v1/admin/backup").await),
        (403, "permission_denied".into())
    );

    let s = h.session("backup-test", 15).await;
    let mut tokens = Vec::new();
    for i in 0..6 {
        let r = h
            .acquire(
                &format!("payouts/b-{i}"),
                json!({"session_id": s, "owner": "o", "wait_ms": 0}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        tokens.push(r.body["token"].as_u64().unwrap());
    }
    let r = h.admin().get("/v1/admin/backup").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let b = &r.body;
    assert_eq!(b["format"], 1);
    let groups = b["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2, "{b}");
    let max = groups
        .iter()
        .map(|g| g["revision"].as_u64().unwrap())
        .max()
        .unwrap();
    assert_eq!(b["max_revision"], max);
    assert!(max >= *tokens.iter().max().unwrap(), "{b}");
    let holds: u64 = groups.iter().map(|g| g["holds"].as_u64().unwrap()).sum();
    assert_eq!(holds, 6);
    let text = b.to_string();
    assert!(!text.contains(SECURE_TOKEN), "a bearer token in the backup");
    assert!(
        b["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["token_sha256"].is_string()),
        "{b}"
    );
    c.stop_all().await;
}

/// Failed authentications are budgeted per client address: after 20 in a row the address gets
/// 429 before its token is even checked (so the right guess looks like a wrong one), on both
/// doors; another address is not affected, and an open namespace stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_authentications_are_budgeted_per_client_address() {
    use lockd_proto::v1::admin_client::AdminClient;
    let (mut c, h) = single().await;
    // A good client on this address, before a bad one spends the address's budget.
    assert_eq!(h.admin().get("/v1/admin/members").await.status, 200);
    let wrong = h.with_token("not-the-admin-token");
    for i in 0..20 {
        let r = wrong.get("/v1/admin/members").await;
        assert_eq!(r.status, 403, "failure {i}: {}", r.body);
    }
    let r = wrong.get("/v1/admin/members").await;
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.body["error"]["code"], "rate_limited");
    assert!(r.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("too many failed authentications from 127.0.0.1"));
    assert!(r.retry_after.is_some(), "429 says when to retry");
    // A token not yet seen to work from this address is not even looked at, right or wrong...
    let r = h
        .with_token(SECURE_TOKEN)
        .post(
            "/v1/sessions",
            json!({"client": "c", "ttl_s": 15, "namespace": "secure"}),
        )
        .await;
    assert_eq!(r.status, 429, "{}", r.body);
    // ... while the one that worked from here before goes on (a NAT, a host of two services).
    assert_eq!(h.admin().get("/v1/admin/members").await.status, 200);
    // What needs no credential goes on.
    h.session("open-namespace", 15).await;
    // gRPC reads the same address, so an unproven token is refused there too.
    let mut admin = AdminClient::new(c.grpc_channel(0).await);
    let mut req = tonic::Request::new(lockd_proto::v1::ListMembersRequest {});
    req.metadata_mut().insert(
        "authorization",
        format!("Bearer {OTHER_TOKEN}").parse().unwrap(),
    );
    let e = admin.list_members(req).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e:?}");

    // Another address (127.0.0.2 is loopback too) has its own budget.
    let other = http_client()
        .local_address(Some("127.0.0.2".parse().unwrap()))
        .build()
        .unwrap();
    let r = other
        .get(c.url(0, "/v1/admin/members"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    // A client cannot choose the address it is counted under.
    let r = other
        .get(c.url(0, "/v1/admin/members"))
        .header("x-lockd-client-addr", "127.0.0.1")
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let metrics = h.admin().get("/metrics").await.body;
    assert!(
        metrics
            .as_str()
            .unwrap()
            .contains("lockd_auth_failures_total 20"),
        "{metrics}"
    );
    c.stop_all().await;
}

/// In an open namespace a session id is the only credential: ids no group knows are failed
/// guesses, budgeted per address like wrong tokens (issue 42 item 7). A session this address
/// opened goes on after the budget is spent, and another address has its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_session_ids_are_guesses_budgeted_per_address() {
    let (mut c, h) = single().await;
    let mine = h.session("mine", 15).await;
    let guess = |n: u64| format!("/v1/sessions/s_{:016x}:keepalive", (n << 8) | 1);
    for i in 0..20 {
        let r = h.post(&guess(i), json!({})).await;
        assert_eq!(r.status, 404, "guess {i}: {}", r.body);
    }
    let r = h.post(&guess(99), json!({})).await;
    assert_eq!(r.status, 429, "{}", r.body);
    assert_eq!(r.body["error"]["code"], "rate_limited");
    // The address's own sessions go on: the one it had, and one it opens now.
    let r = h
        .post(&format!("/v1/sessions/{mine}:keepalive"), json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let fresh = h.session("fresh", 15).await;
    let r = h
        .post(&format!("/v1/sessions/{fresh}:keepalive"), json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    // Another address (127.0.0.2 is loopback too) has its own budget.
    let other = http_client()
        .local_address(Some("127.0.0.2".parse().unwrap()))
        .build()
        .unwrap();
    let r = other
        .post(c.url(0, &guess(98)))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    c.stop_all().await;
}

/// Clients report a lease that ran out under working code, and a write a fence refused; both
/// are counted per namespace (never per name), and a bad name is refused like everywhere.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reports_of_expired_leases_and_fencing_rejections_are_counted_per_namespace() {
    let (mut c, h) = single().await;
    for (path, times) in [
        ("/v1/reports/lease-expired", 2),
        ("/v1/reports/fencing-rejected", 3),
    ] {
        for _ in 0..times {
            let r = h.post(path, json!({"name": "fast/merchant-1"})).await;
            assert_eq!((r.status, r.body.clone()), (200, json!({"recorded": true})));
        }
        let r = h.post(path, json!({"name": ""})).await;
        assert_eq!(r.status, 400, "{}", r.body);
        let r = h.post(path, json!({"name": "a", "extra": 1})).await;
        assert_eq!(r.status, 400, "{}", r.body);
    }
    let text = h
        .admin()
        .get("/metrics")
        .await
        .body
        .as_str()
        .unwrap()
        .to_string();
    for line in [
        "lockd_lease_expired_while_holding_total{namespace=\"fast\"} 2",
        "lockd_fencing_rejections_total{namespace=\"fast\"} 3",
    ] {
        assert!(text.lines().any(|l| l == line), "no '{line}' in:\n{text}");
    }
    c.stop_all().await;
}

/// Inspect shows session ids to the admin only, so a token presented to inspect an open name is
/// checked inside the budget too: wrong ones are failures, and an address out of budget cannot
/// go on testing admin-token guesses there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_cannot_test_admin_token_guesses_past_the_budget() {
    let (mut c, h) = single().await;
    for i in 0..20 {
        let r = h
            .with_token(&format!("guess-{i:04}"))
            .get("/v1/locks/open-x")
            .await;
        assert_eq!(r.status, 200, "guess {i}: {}", r.body);
    }
    let r = h.with_token("guess-last").get("/v1/locks/open-x").await;
    assert_eq!(r.status, 429, "{}", r.body);
    // The right admin token, never proven from this address, is refused unread as well.
    let r = h.admin().get("/v1/locks/open-x").await;
    assert_eq!(r.status, 429, "{}", r.body);
    // Without a token the open name still reads.
    assert_eq!(h.get("/v1/locks/open-x").await.status, 200);
    c.stop_all().await;
}

/// Contention is counted per namespace from the core's events, on the group's leader only:
/// a busy try-lock, a wait granted and one timed out, holds ended by release, close and expiry,
/// and the lock-delay the expiry set. Never a label per lock name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_is_counted_per_namespace_from_the_core_events() {
    let (mut c, h) = single().await;
    let name = "contended-1";
    let a = h.session("a", 30).await;
    let b = h.session("b", 30).await;
    let w = h.session("w", 30).await;
    let ta = h.acquire(name, json!({"session_id": a})).await.body["token"]
        .as_u64()
        .unwrap();
    let r = h.acquire(name, json!({"session_id": b})).await;
    assert_eq!(r.body["acquired"], false, "{}", r.body);
    let (hh, bb) = (h.clone(), b.clone());
    let waiting = tokio::spawn(async move {
        hh.acquire(name, json!({"session_id": bb, "wait_ms": 20_000}))
            .await
    });
    until_waiters(&h, name, 1).await;
    assert_eq!(h.release(name, &a, ta).await.status, 200);
    let r = waiting.await.unwrap();
    assert_eq!(r.body["acquired"], true, "{}", r.body);
    let r = h
        .acquire(name, json!({"session_id": w, "wait_ms": 200}))
        .await;
    assert_eq!(r.body["acquired"], false, "{}", r.body);
    assert_eq!(h.delete(&format!("/v1/sessions/{b}")).await.status, 200);
    // A session of `fast` (1 s lease, 1.5 s lock-delay) that nobody keeps alive.
    let f = h.session_in("f", 1, "fast").await;
    let r = h.acquire("fast/c-2", json!({"session_id": f})).await;
    assert_eq!(r.body["acquired"], true, "{}", r.body);

    let want = [
        "lockd_acquire_busy_total{namespace=\"default\"} 1",
        "lockd_lock_holds_ended_total{namespace=\"default\",cause=\"release\"} 1",
        "lockd_lock_holds_ended_total{namespace=\"default\",cause=\"close\"} 1",
        "lockd_lock_wait_seconds_count{namespace=\"default\",outcome=\"granted\"} 1",
        "lockd_lock_wait_seconds_count{namespace=\"default\",outcome=\"timed_out\"} 1",
        "lockd_lock_hold_seconds_count{namespace=\"default\"} 2",
        "lockd_lock_holds_ended_total{namespace=\"fast\",cause=\"expire\"} 1",
        "lockd_lock_delays_applied_total{namespace=\"fast\"} 1",
        "lockd_lock_hold_seconds_count{namespace=\"fast\"} 1",
    ];
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let text = h
            .admin()
            .get("/metrics")
            .await
            .body
            .as_str()
            .unwrap()
            .to_string();
        let missing: Vec<_> = want
            .iter()
            .filter(|l| !text.lines().any(|x| x == **l))
            .collect();
        if missing.is_empty() {
            assert!(
                !text.contains("contended-1") && !text.contains("c-2"),
                "a lock name in a label:\n{text}"
            );
            break;
        }
        assert!(Instant::now() < deadline, "missing {missing:?} in:\n{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    c.stop_all().await;
}

/// `GET /v1/contention`: a held name with two waiters tops the waiter and wait lists; after
/// hand-offs it tops the hand-off list, and a busy try-lock carries a wait estimate. A caller
/// sees only the namespaces it could read, and bad `top`s are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contention_lists_the_hottest_names_to_those_who_may_read_them() {
    let (mut c, h) = single().await;
    let name = "hot-1";
    let sessions = [
        h.session("a", 30).await,
        h.session("b", 30).await,
        h.session("c", 30).await,
        h.session("d", 30).await,
    ];
    let mut token = h
        .acquire(name, json!({"session_id": sessions[0]}))
        .await
        .body["token"]
        .as_u64()
        .unwrap();
    h.acquire("cool-1", json!({"session_id": sessions[3]}))
        .await;
    let secure = h.with_token(SECURE_TOKEN);
    let s = secure.session_in("s", 30, "secure").await;
    let r = secure
        .acquire("secure/hidden", json!({"session_id": s}))
        .await;
    assert_eq!(r.body["acquired"], true, "{}", r.body);
    let mut waiting = Vec::new();
    for (i, s) in sessions[1..3].iter().enumerate() {
        let (hh, s) = (h.clone(), s.clone());
        waiting.push(tokio::spawn(async move {
            hh.acquire(name, json!({"session_id": s, "wait_ms": 20_000}))
                .await
        }));
        until_waiters(&h, name, i + 1).await;
    }
    let r = h.get("/v1/contention?top=5").await;
    assert_eq!(r.status, 200, "{}", r.body);
    let first = |list: &str| r.body[list][0].clone();
    assert_eq!(first("most_waiters")["name"], name, "{}", r.body);
    assert_eq!(first("most_waiters")["waiters"], 2);
    assert_eq!(first("most_waiters")["holders"], 1);
    assert_eq!(first("longest_waits")["name"], name);
    let held: Vec<_> = r.body["longest_held"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    assert!(
        held.contains(&"cool-1".to_string()) && !held.iter().any(|n| n.starts_with("secure/")),
        "{held:?}"
    );
    assert!(!r.body["namespaces"]
        .as_array()
        .unwrap()
        .contains(&json!("secure")));
    assert!(r.body["scanned"].as_u64().unwrap() >= 2);

    // Two hand-offs: holder a → b → c.
    for (i, w) in waiting.into_iter().enumerate() {
        assert_eq!(h.release(name, &sessions[i], token).await.status, 200);
        let got = w.await.unwrap();
        assert_eq!(got.body["acquired"], true, "{}", got.body);
        token = got.body["token"].as_u64().unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = h.get("/v1/contention").await;
    assert_eq!(r.body["top"], 10);
    let hot = &r.body["most_handoffs"][0];
    assert_eq!(hot["name"], name, "{}", r.body);
    assert!(hot["handoffs_per_s"].as_f64().unwrap() > 0.0);
    assert!(hot["wait_estimate_ms"].as_u64().is_some(), "{hot}");
    // A busy try-lock now says how long a wait would take.
    let busy = h.acquire(name, json!({"session_id": sessions[0]})).await;
    assert_eq!(busy.body["acquired"], false);
    assert!(
        busy.body["wait_estimate_ms"].as_u64().is_some(),
        "{}",
        busy.body
    );

    // The admin sees every namespace; a namespace's token opens its own namespace.
    let all = h.admin().get("/v1/contention").await;
    assert!(
        all.body["longest_held"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "secure/hidden"),
        "{}",
        all.body
    );
    let own = secure.get("/v1/contention?namespace=secure").await;
    assert_eq!(own.status, 200, "{}", own.body);
    assert_eq!(own.body["namespaces"], json!(["secure"]));
    assert_eq!(own.body["longest_held"][0]["name"], "secure/hidden");
    assert_eq!(own.body["scanned"], 1);
    assert_eq!(h.get("/v1/contention?namespace=secure").await.status, 401);
    assert_eq!(h.get("/v1/contention?namespace=nope").await.status, 404);
    for bad in ["top=0", "top=101", "top=x", "bogus=1"] {
        let r = h.get(&format!("/v1/contention?{bad}")).await;
        assert_eq!(r.status, 400, "{bad}: {}", r.body);
    }
    let r = h.get("/v1/contention?top=101").await;
    assert!(r.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("top: must be 1 to 100"));
    c.stop_all().await;
}

/// `/metrics` shows each hosted replica's bytes on disk (log and snapshot) and how long its
/// snapshots take, by phase (issue 44 item 4).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_show_each_replicas_disk_bytes_and_its_snapshot_times() {
    let dir = tempfile::tempdir().unwrap();
    let peer = low_tokio_listener();
    let peers = std::collections::BTreeMap::from([(1, peer.local_addr().unwrap().to_string())]);
    let mut cfg = lockd_raft::NodeConfig::new(1, dir.path(), peers);
    cfg.lock_groups = 1;
    cfg.snapshot_every = 20;
    let bind = || tokio::net::TcpListener::bind("127.0.0.1:0");
    let node = start_node(cfg, bind().await.unwrap(), bind().await.unwrap(), peer).await;
    wait_serving(&node).await;
    let h = Http::new(format!("http://{}", node.http_addr));
    let s = h.session("snapshots", 15).await;
    for i in 0..30 {
        let name = format!("snap/{i}");
        let r = h.acquire(&name, json!({"session_id": s})).await;
        assert_eq!(r.status, 200, "{}", r.body);
        let token = r.body["token"].as_u64().unwrap();
        assert_eq!(h.release(&name, &s, token).await.status, 200);
    }
    let value = |text: &str, series: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .map(|v| v.trim().parse::<f64>().unwrap())
    };
    // Snapshots are made beside the request path: wait for one.
    let deadline = Instant::now() + Duration::from_secs(20);
    let text = loop {
        let m = h.admin().get("/metrics").await;
        assert_eq!(m.status, 200);
        let text = m.body.as_str().unwrap().to_string();
        let made = value(&text, "lockd_snapshot_seconds_count{phase=\"write\"}");
        if made.is_some_and(|n| n >= 1.0) {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "no snapshot timed in 20 s:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let captured = value(&text, "lockd_snapshot_seconds_count{phase=\"capture\"}");
    assert!(captured.is_some_and(|n| n >= 1.0), "{text}");
    let bytes = |group: u32, kind: &str| {
        value(
            &text,
            &format!("lockd_storage_bytes{{group=\"{group}\",kind=\"{kind}\"}}"),
        )
        .unwrap_or_else(|| panic!("no {kind} bytes of group {group}:\n{text}"))
    };
    // The lock group took 60 entries: its snapshot and log are on disk. (A later snapshot
    // may have replaced the file since the scrape: the sizes are not compared.)
    assert!(dir.path().join("group-1/snapshot.bin").exists());
    assert!(bytes(1, "snapshot") > 0.0, "{text}");
    assert!(bytes(1, "log") > 0.0, "{text}");
    // The meta group is hosted here too.
    assert!(bytes(0, "log") > 0.0, "{text}");
    node.stop().await;
}
