//! A group is a failure domain: with group 1's quorum gone, group 2's names, new sessions and
//! keepalives go on through group 2's nodes, and group 1's names fail fast with a retryable
//! 503 that names the group (issue 41 item 2; leases are per group).

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

/// The group that serves `name`, by what a grant says (the name is taken and released).
async fn group_of(http: &Http, session: &str, name: &str) -> u64 {
    let r = http
        .acquire(name, json!({"session_id": session, "owner": "o"}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    let token = r.body["token"].as_u64().unwrap();
    assert_eq!(http.release(name, session, token).await.status, 200);
    r.body["group"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_groups_outage_leaves_the_other_groups_names_and_sessions_alone() {
    // 6 nodes, 2 groups of 3: group 1 on nodes 1-3, group 2 on nodes 4-6; the meta group on
    // five of them keeps its quorum when two nodes stop.
    let mut c = placed_cluster(6, 2, 3).await;
    let h = Http::new(c.url(3, ""));
    // Its keepalive comes once per node below, and each node's turn waits out group 1's retry
    // budget (two election timeouts) three times: a TTL of 5 s would expire it in group 2.
    let before = h.session("before", 15).await;
    // A name of each group, by what a grant says.
    let mut names = [None, None];
    for i in 0..200 {
        let name = format!("fd/{i}");
        let group = group_of(&h, &before, &name).await as usize;
        names[group - 1].get_or_insert(name);
        if names.iter().all(Option::is_some) {
            break;
        }
    }
    let [Some(in1), Some(in2)] = names else {
        panic!("no name of each group in 200")
    };

    // Two of group 1's three replicas stop.
    c.stop(0).await;
    c.stop(1).await;
    let started = Instant::now();
    let mut rounds = 0;
    // How long each kind of call took (for the note; not asserted beyond the 5 s below).
    let (mut opens, mut keepalives, mut grants, mut refusals) = (vec![], vec![], vec![], vec![]);
    while started.elapsed() < Duration::from_secs(30) {
        rounds += 1;
        for i in 3..6 {
            let h = Http::new(c.url(i, ""));
            // A new session opens (in group 2 only). Its TTL outlasts the group 1 retry
            // budgets it waits out before its acquire below (its only lease is group 2's).
            let t = Instant::now();
            let s = h.session("during", 15).await;
            opens.push(t.elapsed());
            // The older session's keepalive extends group 2 and says group 1 did not answer.
            let t = Instant::now();
            let k = h
                .post(&format!("/v1/sessions/{before}:keepalive"), json!({}))
                .await;
            keepalives.push(t.elapsed());
            assert_eq!(
                k.status,
                200,
                "keepalive through node {}: {}",
                i + 1,
                k.body
            );
            let groups = k.body["groups"].as_array().unwrap();
            assert_eq!(groups[0]["state"], "unreachable", "{}", k.body);
            assert_eq!(groups[1]["state"], "extended", "{}", k.body);
            // Group 2's names: granted and released, for both sessions.
            for session in [&s, &before] {
                let t = Instant::now();
                let r = h
                    .acquire(&in2, json!({"session_id": session, "owner": "o"}))
                    .await;
                grants.push(t.elapsed());
                assert_eq!(r.status, 200, "{}", r.body);
                assert_eq!(r.body["acquired"], true, "{}", r.body);
                let token = r.body["token"].as_u64().unwrap();
                assert_eq!(h.release(&in2, session, token).await.status, 200);
            }
            // Group 1's names: a retryable 503 that names the group, soon.
            let asked = Instant::now();
            let r = h
                .acquire(&in1, json!({"session_id": before, "owner": "o"}))
                .await;
            assert_eq!(r.status, 503, "{}", r.body);
            refusals.push(asked.elapsed());
            let message = r.body["error"]["message"].as_str().unwrap();
            assert!(message.contains("group 1"), "{message}");
            assert!(
                asked.elapsed() < Duration::from_secs(5),
                "group 1's name took {:?} to fail",
                asked.elapsed()
            );
        }
    }
    assert!(rounds >= 2, "only {rounds} rounds in 30 s");
    // The session's details: what it holds in group 2, and group 1 named as not answering
    // (not a 503 for the whole session).
    let held = h
        .acquire(&in2, json!({"session_id": before, "owner": "o"}))
        .await;
    assert_eq!(held.body["acquired"], true, "{}", held.body);
    let detail = h.get(&format!("/v1/sessions/{before}")).await;
    assert_eq!(detail.status, 200, "{}", detail.body);
    assert_eq!(
        detail.body["held"][0]["name"],
        in2.as_str(),
        "{}",
        detail.body
    );
    assert_eq!(
        detail.body["unavailable_groups"],
        json!([1]),
        "{}",
        detail.body
    );
    for (what, mut d) in [
        ("open", opens),
        ("keepalive", keepalives),
        ("group 2 acquire", grants),
        ("group 1 refusal", refusals),
    ] {
        d.sort();
        eprintln!(
            "failure domains: {what}: {} calls, all answered as above; p50 {:?}, max {:?}",
            d.len(),
            d[d.len() / 2],
            d[d.len() - 1]
        );
    }
}

/// The meta group's outage stops only what needs it (issue 41 item 3): with its quorum gone,
/// nodes that had caught up keep serving names from the shard map, namespaces and credentials
/// they last applied. Existing sessions keep their locks and take new names in a group that
/// still has its quorum; a namespace's token is still required; admin calls fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_meta_groups_outage_leaves_names_of_groups_with_a_quorum_alone() {
    // The meta group on all six nodes (quorum 4), group 1 on nodes 1-3, group 2 on 4-6.
    let mut c = placed_cluster(6, 2, 3).await;
    let h = Http::new(c.url(3, ""));
    let s = h.session("before", 15).await;
    let secure = h.with_token(SECURE_TOKEN);
    let t = secure.session_in("secure", 15, "secure").await;
    // Two names of group 2 per namespace: one held across the outage, one taken during it.
    let in2 = |prefix: &'static str, session: String, http: Http| async move {
        let mut found = vec![];
        for i in 0..400 {
            let name = format!("{prefix}{i}");
            if group_of(&http, &session, &name).await == 2 {
                found.push(name);
            }
            if found.len() == 2 {
                return (found[0].clone(), found[1].clone());
            }
        }
        panic!("no two names of group 2 in 400")
    };
    let (held, fresh) = in2("mo/", s.clone(), h.clone()).await;
    let (held_t, fresh_t) = in2("secure/mo/", t.clone(), secure.clone()).await;
    let r = h
        .acquire(&held, json!({"session_id": s, "owner": "o"}))
        .await;
    assert_eq!(r.body["acquired"], true, "{}", r.body);
    let token = r.body["token"].as_u64().unwrap();
    let r = secure
        .acquire(&held_t, json!({"session_id": t, "owner": "o"}))
        .await;
    assert_eq!(r.body["acquired"], true, "{}", r.body);

    let version = h.admin().get("/v1/admin/namespaces").await.body["version"]
        .as_u64()
        .unwrap();

    // Nodes 1-3 stop: the meta group keeps 3 of 6 voters (no quorum), group 2 all of its own.
    for i in 0..3 {
        c.stop(i).await;
    }
    // Names are served throughout: rounds of calls through nodes 4-6 for 10 s, and on until a
    // node has seen its meta replica cut off (every node whose replica lost the leader; a
    // leader among them that lost its quorum; its followers still hear it and serve as
    // members).
    let started = Instant::now();
    let mut seen_cut_off = false;
    while started.elapsed() < Duration::from_secs(10) || !seen_cut_off {
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "no node saw its meta replica cut off in 40 s"
        );
        for i in 3..6 {
            let h = Http::new(c.url(i, ""));
            let st = h.get("/v1/status").await;
            assert_eq!(
                st.body["serving_names"],
                true,
                "node {}: {}",
                i + 1,
                st.body
            );
            seen_cut_off |= st.body["meta_cut_off"] == true;
            let secure = h.with_token(SECURE_TOKEN);
            // The sessions live on in group 2 and keep their locks.
            for (http, session) in [(&h, &s), (&secure, &t)] {
                let k = http
                    .post(&format!("/v1/sessions/{session}:keepalive"), json!({}))
                    .await;
                assert_eq!(
                    k.status,
                    200,
                    "keepalive through node {}: {}",
                    i + 1,
                    k.body
                );
            }
            let info = h.admin().inspect(&held).await;
            assert_eq!(info["holders"][0]["session"], s.as_str(), "{info}");
            assert_eq!(info["holders"][0]["token"], token, "{info}");
            // New names of group 2, in the open namespace and the protected one.
            for (http, session, name) in [(&h, &s, &fresh), (&secure, &t, &fresh_t)] {
                let r = http
                    .acquire(name, json!({"session_id": session, "owner": "o"}))
                    .await;
                assert_eq!(r.body["acquired"], true, "node {}: {}", i + 1, r.body);
                let tk = r.body["token"].as_u64().unwrap();
                assert_eq!(http.release(name, session, tk).await.status, 200);
            }
            // The namespace's credential still guards it: no token, no name.
            let r = h.acquire(&fresh_t, json!({"session_id": t})).await;
            assert_eq!(r.status, 401, "{}", r.body);
            // What needs the meta group's leader fails, with a retryable 503.
            let r = h
                .admin()
                .post(
                    "/v1/admin/namespaces",
                    json!({"expected_version": version,
                           "namespace": {"name": "late", "prefix": "late/"}}),
                )
                .await;
            assert_eq!(r.status, 503, "{}", r.body);
        }
    }
    c.stop_all().await;
}
