//! Watch: the changes of a name or a prefix, in log order, over SSE and gRPC; resumable with no
//! event missed or repeated; authorised like reads of the namespace.

mod common;

use std::time::Duration;

use common::*;
use lockd_proto::v1 as pb;
use lockd_proto::v1::lock_client::LockClient;
use serde_json::{json, Value};

/// One Server-Sent Event: (event, id, data).
type Sse = (String, String, Value);

/// An open SSE response, read event by event.
struct SseReader {
    resp: reqwest::Response,
    buf: String,
}

impl SseReader {
    async fn open(
        url: &str,
        token: Option<&str>,
        last_id: Option<&str>,
    ) -> Result<Self, (u16, Value)> {
        let mut req = http_client().build().unwrap().get(url);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(id) = last_id {
            req = req.header("last-event-id", id);
        }
        let resp = req.send().await.unwrap();
        if resp.status() != 200 {
            let status = resp.status().as_u16();
            return Err((status, resp.json().await.unwrap()));
        }
        assert_eq!(
            resp.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        Ok(SseReader {
            resp,
            buf: String::new(),
        })
    }

    /// The next event (keep-alive comments skipped); panics after 10 s.
    async fn next(&mut self) -> Sse {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let (mut event, mut id, mut data) = (String::new(), String::new(), String::new());
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event:") {
                        event = v.trim().to_string();
                    } else if let Some(v) = line.strip_prefix("id:") {
                        id = v.trim().to_string();
                    } else if let Some(v) = line.strip_prefix("data:") {
                        data.push_str(v.trim());
                    }
                }
                if event.is_empty() && data.is_empty() {
                    continue;
                }
                return (event, id, serde_json::from_str(&data).unwrap());
            }
            let chunk = tokio::time::timeout_at(deadline, self.resp.chunk())
                .await
                .expect("no event within 10 s")
                .unwrap()
                .expect("the stream ended");
            self.buf.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_watch_sees_every_change_in_order_and_resumes_without_a_gap_or_a_repeat() {
    let mut c = cluster(1, 2).await;
    let h = Http::new(c.url(0, ""));
    let url = c.url(0, "/v1/watch?prefix=w/");
    let mut sse = SseReader::open(&url, None, None).await.unwrap();

    let a = h.session("a", 30).await;
    let b = h.session("b", 30).await;
    let r = h
        .acquire("w/x", json!({"session_id": a, "owner": "alice"}))
        .await;
    let ta = r.body["token"].as_u64().unwrap();
    // Outside the prefix: never seen.
    h.acquire("v/x", json!({"session_id": a})).await;
    let (hh, bb) = (h.clone(), b.clone());
    let waiting = tokio::spawn(async move {
        hh.acquire(
            "w/x",
            json!({"session_id": bb, "owner": "bob", "wait_ms": 20_000}),
        )
        .await
    });
    let e1 = sse.next().await;
    assert_eq!(e1.0, "hold_started");
    assert_eq!(e1.2["name"], "w/x");
    assert_eq!(e1.2["owner"], "alice");
    assert_eq!(e1.2["fencing_token"], ta);
    assert!(
        e1.2["unix_ms"].as_u64().unwrap() > 1_700_000_000_000,
        "a wall-clock time beside group time: {}",
        e1.2
    );
    assert!(
        e1.2.get("session_id").is_none(),
        "session ids are the admin's: {}",
        e1.2
    );
    let e2 = sse.next().await;
    assert_eq!(
        (e2.0.as_str(), &e2.2["position"]),
        ("wait_started", &json!(1))
    );
    assert_eq!(h.release("w/x", &a, ta).await.status, 200);
    let tb = waiting.await.unwrap().body["token"].as_u64().unwrap();
    let e3 = sse.next().await;
    assert_eq!(
        (e3.0.as_str(), &e3.2["cause"]),
        ("hold_ended", &json!("release"))
    );
    let e4 = sse.next().await;
    assert_eq!(e4.0, "hold_started");
    assert_eq!(
        (&e4.2["fencing_token"], &e4.2["waiter"]),
        (&json!(tb), &e2.2["waiter"])
    );
    assert!(e1.2["index"].as_u64() < e2.2["index"].as_u64());

    // Resume past e2 (as an EventSource would, with its id): e3 and e4 again, once each, then
    // what comes next.
    let mut again = SseReader::open(&url, None, Some(&e2.1)).await.unwrap();
    assert_eq!(again.next().await.2, e3.2);
    assert_eq!(again.next().await.2, e4.2);
    assert_eq!(h.release("w/x", &b, tb).await.status, 200);
    let next = again.next().await;
    assert_eq!(
        (next.0.as_str(), &next.2["fencing_token"]),
        ("hold_ended", &json!(tb))
    );
    assert_eq!(sse.next().await.2, next.2);

    // From before what the node keeps (it keeps what it applied since it started): told plainly.
    let r = http_client()
        .build()
        .unwrap()
        .get(c.url(0, "/v1/watch?prefix=w/&after=1:0,2:0"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 410);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "watch_compacted", "{body}");
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_are_authorised_like_reads_and_bad_requests_name_the_field() {
    let mut c = cluster(1, 2).await;
    let base = c.url(0, "/v1/watch");
    let open = |q: &str, token: Option<&'static str>| {
        let url = format!("{base}?{q}");
        async move {
            SseReader::open(&url, token, None)
                .await
                .err()
                .map(|(s, b)| (s, b["error"]["code"].clone()))
        }
    };
    assert_eq!(
        open("prefix=secure/", None).await,
        Some((401, json!("unauthenticated")))
    );
    assert_eq!(
        open("name=secure/x", Some("wrong")).await,
        Some((401, json!("unauthenticated")))
    );
    assert_eq!(
        open("name=secure/x", Some(OTHER_TOKEN)).await,
        Some((403, json!("permission_denied")))
    );
    assert_eq!(open("prefix=secure/", Some(SECURE_TOKEN)).await, None);
    // "" and "s" span namespaces (secure/ among them): the admin's only.
    assert_eq!(
        open("prefix=", Some(SECURE_TOKEN)).await,
        Some((403, json!("permission_denied")))
    );
    assert_eq!(
        open("prefix=s", None).await,
        Some((401, json!("unauthenticated")))
    );
    assert_eq!(open("prefix=", Some(ADMIN_TOKEN)).await, None);
    for (q, field) in [
        ("name=a&prefix=b", "name, prefix"),
        ("prefix=a&after=1", "after"),
        ("prefix=a&after=1:2,1:3", "after"),
        ("prefix=a&after=9:1", "after"),
        ("prefix=a&bogus=1", "bogus"),
    ] {
        let url = format!("{base}?{q}");
        let (status, body) = SseReader::open(&url, None, None).await.err().unwrap();
        let msg = body["error"]["message"].as_str().unwrap();
        assert_eq!(status, 400, "{q}: {body}");
        assert!(msg.contains(field), "{q}: {msg}");
    }
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_watch_shows_the_admin_session_ids_and_resumes_by_its_positions() {
    let mut c = cluster(1, 2).await;
    let h = Http::new(c.url(0, ""));
    let mut client = LockClient::new(c.grpc_channel(0).await);
    let watch = |after: Vec<pb::WatchPosition>| {
        let mut req = tonic::Request::new(pb::WatchRequest {
            name: "g/one".into(),
            prefix: String::new(),
            after,
        });
        req.metadata_mut().insert(
            "authorization",
            format!("Bearer {ADMIN_TOKEN}").parse().unwrap(),
        );
        req
    };
    let mut stream = client.watch(watch(vec![])).await.unwrap().into_inner();
    let s = h.session("g", 30).await;
    let unix_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    };
    let before = unix_ms();
    let t = h.acquire("g/one", json!({"session_id": s})).await.body["token"]
        .as_u64()
        .unwrap();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(
        (first.kind.as_str(), first.fencing_token),
        ("hold_started", t)
    );
    // The wall clock beside group time: when the node applied the grant.
    assert!(
        (before..=unix_ms()).contains(&first.unix_ms),
        "unix_ms {} outside the acquire's [{before}, now]",
        first.unix_ms
    );
    assert_eq!(first.session_id, s, "the admin sees the holder's session");
    assert_eq!(h.release("g/one", &s, t).await.status, 200);
    let second = stream.message().await.unwrap().unwrap();
    assert_eq!(
        (second.kind.as_str(), second.cause.as_str()),
        ("hold_ended", "release")
    );
    // Resume past the first: the second again, and only it.
    let mut again = client
        .watch(watch(first.resume.clone()))
        .await
        .unwrap()
        .into_inner();
    let replay = again.message().await.unwrap().unwrap();
    assert_eq!(replay, second);
    let t2 = h.acquire("g/one", json!({"session_id": s})).await.body["token"]
        .as_u64()
        .unwrap();
    assert_eq!(again.message().await.unwrap().unwrap().fencing_token, t2);
    // Both name and prefix: a 400's gRPC code.
    let mut bad = watch(vec![]);
    bad.get_mut().prefix = "g/".into();
    let e = client.watch(bad).await.err().unwrap();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    c.stop_all().await;
}
