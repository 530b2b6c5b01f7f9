//! Moving buckets between lock groups on a running 3-node cluster while their locks are held
//! and waited for: holders keep their tokens, a waiter re-queues at the new owner and is
//! granted there, and every later token of a moved name is above every earlier one.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use lockd_core::{bucket_of, ShardMap};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_move_between_groups_with_their_holders_and_waiters() {
    let mut c = cluster(3, 2).await;
    let h = Http::new(c.url(1, ""));
    let admin = h.admin();
    let map = ShardMap::initial(2);
    // Ten names of group 1, held by one session; the first also waited for by another.
    let names: Vec<String> = (0..)
        .map(|i| format!("payouts/merchant-{i}"))
        .filter(|n| map.group_of(n) == 1)
        .take(10)
        .collect();
    let (s1, s2) = (h.session("holder", 30).await, h.session("waiter", 30).await);
    let mut tokens = Vec::new();
    for n in &names {
        let r = h
            .acquire(n, json!({"session_id": s1, "owner": "holder"}))
            .await;
        assert_eq!(
            (r.status, &r.body["acquired"]),
            (200, &json!(true)),
            "{}",
            r.body
        );
        tokens.push(r.body["token"].as_u64().unwrap());
    }
    let contended = names[0].clone();
    let waiter = {
        let (h, n, s2) = (h.clone(), contended.clone(), s2.clone());
        tokio::spawn(async move {
            h.acquire(
                &n,
                json!({"session_id": s2, "owner": "waiter", "wait_ms": 30_000}),
            )
            .await
        })
    };
    // Let the waiter queue in group 1.
    wait_until_queued(&admin, &contended).await;

    let before = admin.get("/v1/admin/buckets").await;
    assert_eq!(before.status, 200, "{}", before.body);
    assert_eq!(before.body["map_version"], 1);
    assert_eq!(before.body["groups"][0]["bucket_count"], 2048);

    // Refused calls change nothing.
    let move_path = "/v1/admin/buckets:move";
    let buckets: BTreeSet<u16> = names.iter().map(|n| bucket_of(n)).collect();
    let list = buckets
        .iter()
        .map(|b| b.to_string())
        .collect::<Vec<_>>()
        .join(",");
    for (who, body, status) in [
        (&h, json!({"buckets": list, "to_group": 2}), 401),
        (&admin, json!({"buckets": list, "to_group": 9}), 404),
        (&admin, json!({"buckets": "4096", "to_group": 2}), 400),
        (&admin, json!({"buckets": "", "to_group": 2}), 400),
    ] {
        let r = who.post(move_path, body.clone()).await;
        assert_eq!(r.status, status, "{body}: {}", r.body);
        assert!(r.body["error"]["message"].is_string(), "{}", r.body);
    }
    assert_eq!(admin.get("/v1/admin/buckets").await.body, before.body);

    // The move.
    let r = admin
        .post(move_path, json!({"buckets": list, "to_group": 2}))
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["buckets_moved"], buckets.len());
    assert_eq!(r.body["holders"], 10, "{}", r.body);
    assert_eq!(r.body["waits_requeued"], 1, "{}", r.body);
    assert_eq!(r.body["map_version"], 2, "{}", r.body);
    let after = admin.get("/v1/admin/buckets").await.body;
    assert_eq!(after["groups"][1]["bucket_count"], 2048 + buckets.len());
    assert_eq!(after["groups"][0]["frozen"], "(none)");

    // Every holder kept its token; the names are served by group 2 now.
    for (n, t) in names.iter().zip(&tokens) {
        let info = admin.inspect(n).await;
        assert_eq!(info["token"], *t, "{n}: {info}");
    }
    let node = &c.node(0).service.node;
    let on_2 = node
        .group(2)
        .unwrap()
        .read({
            let n = contended.clone();
            move |t| t.lock_info(&n, 0).map(|i| i.holders.len())
        })
        .await
        .unwrap();
    assert_eq!(on_2, Some(1));
    let rev_1 = node.group(1).unwrap().read(|t| t.revision()).await.unwrap();

    // The waiter re-queued in group 2 and gets the lock when it is released, with a token
    // above every token group 1 ever gave.
    let r = h.release(&contended, &s1, tokens[0]).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let w = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the waiter was answered")
        .unwrap();
    assert_eq!(
        (w.status, &w.body["acquired"]),
        (200, &json!(true)),
        "{}",
        w.body
    );
    let t_after = w.body["token"].as_u64().unwrap();
    assert!(
        t_after > rev_1 && tokens.iter().all(|t| t_after > *t),
        "token {t_after} after group 1's revision {rev_1}"
    );
    // Releases of moved holds go to their new group.
    for (n, t) in names.iter().zip(&tokens).skip(1) {
        let r = h.release(n, &s1, *t).await;
        assert_eq!(r.status, 200, "{n}: {}", r.body);
    }

    // The same call again moves nothing; and a large move, back, in 32 chunks.
    let again = admin
        .post(move_path, json!({"buckets": list, "to_group": 2}))
        .await;
    assert_eq!(
        (again.status, &again.body["buckets_moved"]),
        (200, &json!(0))
    );
    let big = admin
        .post(move_path, json!({"buckets": "0-1023", "to_group": 2}))
        .await;
    assert_eq!(big.status, 200, "{}", big.body);
    let moved = big.body["buckets_moved"].as_u64().unwrap();
    assert_eq!(
        moved as usize,
        512 - buckets.iter().filter(|b| **b < 1024).count()
    );
    println!(
        "moved {moved} buckets in {} chunks in {} ms",
        big.body["chunks"], big.body["elapsed_ms"]
    );
    // Names in the moved buckets are served, by group 2, with rising tokens.
    let n = (0..)
        .map(|i| format!("search/shard-{i}"))
        .find(|n| bucket_of(n) < 1024 && map.group_of(n) == 1)
        .unwrap();
    let r = h.acquire(&n, json!({"session_id": s1})).await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body["token"].as_u64().unwrap() > t_after);
    c.stop_all().await;
}

/// A mover that stopped half-way leaves buckets frozen; the next move call, on another node,
/// finishes that move first (or thaws it, if its import had been cancelled), keeping holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_move_is_finished_or_rolled_back_by_the_next_call() {
    let mut c = cluster(3, 2).await;
    let h = Http::new(c.url(0, ""));
    let admin = Http::new(c.url(2, "")).admin();
    let map = ShardMap::initial(2);
    let names: Vec<String> = (0..)
        .map(|i| format!("search/shard-{i}"))
        .filter(|n| map.group_of(n) == 1)
        .take(2)
        .collect();
    let s = h.session("holder", 30).await;
    let mut tokens = Vec::new();
    for n in &names {
        let r = h.acquire(n, json!({"session_id": s})).await;
        assert_eq!(r.status, 200, "{}", r.body);
        tokens.push(r.body["token"].as_u64().unwrap());
    }
    let node = &c.node(0).service.node;
    let freeze = |id: u64, name: &str| lockd_core::Op::FreezeBuckets {
        move_id: id,
        to_group: 2,
        buckets: std::iter::once(bucket_of(name)).collect(),
    };
    // Move 11 stopped after its freeze; move 12 after its freeze and a cancelled import.
    let g1 = node.group(1).unwrap();
    assert!(g1.propose(freeze(11, &names[0])).await.unwrap().is_ok());
    assert!(g1.propose(freeze(12, &names[1])).await.unwrap().is_ok());
    let cancel = lockd_core::Op::CancelImport { move_id: 12 };
    assert!(node
        .group(2)
        .unwrap()
        .propose(cancel)
        .await
        .unwrap()
        .is_ok());
    let frozen = admin.get("/v1/admin/buckets").await.body;
    assert_ne!(frozen["groups"][0]["frozen"], "(none)", "{frozen}");

    // Any move call (here of an unrelated bucket) first settles both.
    let other = (0..4096u16)
        .find(|b| {
            map.groups[*b as usize] == 1 && *b != bucket_of(&names[0]) && *b != bucket_of(&names[1])
        })
        .unwrap();
    let r = admin
        .post(
            "/v1/admin/buckets:move",
            json!({"buckets": other.to_string(), "to_group": 2}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body["resumed"], 2, "{}", r.body);
    let after = admin.get("/v1/admin/buckets").await.body;
    assert_eq!(after["groups"][0]["frozen"], "(none)", "{after}");
    let owner = |b: u16| {
        let g1: lockd_core::BucketSet = after["groups"][0]["owned"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        if g1.contains(b) {
            1
        } else {
            2
        }
    };
    assert_eq!(owner(bucket_of(&names[0])), 2, "move 11 was finished");
    assert_eq!(owner(bucket_of(&names[1])), 1, "move 12 was rolled back");
    // Both holders still hold, with their tokens, and release where their names now live.
    for (n, t) in names.iter().zip(&tokens) {
        assert_eq!(h.admin().inspect(n).await["token"], *t);
        let r = h.release(n, &s, *t).await;
        assert_eq!(r.status, 200, "{n}: {}", r.body);
    }
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_left_half_done_is_finished_without_another_call() {
    // Nobody calls move again: the meta leader's janitor finishes the move on its second look
    // (every 2 s), so the name does not stay frozen.
    let mut c = cluster(3, 2).await;
    let h = Http::new(c.url(0, ""));
    let admin = h.admin();
    let map = ShardMap::initial(2);
    let name = (0..)
        .map(|i| format!("search/shard-{i}"))
        .find(|n| map.group_of(n) == 1)
        .unwrap();
    let s = h.session("holder", 30).await;
    let r = h.acquire(&name, json!({"session_id": s})).await;
    let token = r.body["token"].as_u64().unwrap();
    let freeze = lockd_core::Op::FreezeBuckets {
        move_id: 21,
        to_group: 2,
        buckets: std::iter::once(bucket_of(&name)).collect(),
    };
    let g1 = c.node(0).service.node.group(1).unwrap();
    assert!(g1.propose(freeze).await.unwrap().is_ok());
    // A release meanwhile waits inside the node (it retries `bucket_moving` for 5 s) and
    // succeeds once the janitor has finished the move; without it, it would answer 503.
    let r = h.release(&name, &s, token).await;
    assert_eq!(r.status, 200, "{}", r.body);
    let view = admin.get("/v1/admin/buckets").await.body;
    assert_eq!(view["groups"][0]["frozen"], "(none)", "{view}");
    let owned2: lockd_core::BucketSet = view["groups"][1]["owned"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        owned2.contains(bucket_of(&name)),
        "the move was finished: {view}"
    );
    c.stop_all().await;
}
