//! The gRPC API against a real node: unary flows, errors with codes, and the session stream's
//! pushed wake-up.

mod common;

use std::time::Duration;

use common::*;
use lockd_proto::v1 as pb;
use lockd_proto::v1::lock_client::LockClient;
use pb::session_event::Kind as Ev;
use pb::session_request::Kind as Req;
use serde_json::json;
use tokio::sync::mpsc;
use tonic::transport::Channel;
use tonic::Code;

async fn client(c: &Cluster, i: usize) -> LockClient<Channel> {
    LockClient::new(c.grpc_channel(i).await)
}

async fn open(cl: &mut LockClient<Channel>, client: &str) -> String {
    let r = cl
        .open_session(pb::OpenSessionRequest {
            client: client.into(),
            ttl_ms: 15_000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((r.ttl_ms, r.keepalive_every_ms), (15_000, 5_000));
    r.session_id
}

fn acq(session: &str, name: &str, wait_ms: u64) -> pb::AcquireRequest {
    pb::AcquireRequest {
        session_id: session.into(),
        name: name.into(),
        owner: session.into(),
        wait_ms,
        ..Default::default()
    }
}

/// `msg` with `token` as its `authorization: Bearer` metadata, the documented way to send it.
fn bearer<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

fn code_of(s: &tonic::Status) -> (Code, String) {
    let code = s
        .metadata()
        .get("lockd-error-code")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (s.code(), code)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_flows_and_errors() {
    let mut c = cluster(1, 2).await;
    let mut cl = client(&c, 0).await;
    let st = cl.status(pb::StatusRequest {}).await.unwrap().into_inner();
    assert_eq!((st.node_id, st.groups.len()), (1, 3));

    let (a, b) = (open(&mut cl, "a").await, open(&mut cl, "b").await);
    let r = cl
        .acquire(acq(&a, "payouts/m-1", 0))
        .await
        .unwrap()
        .into_inner();
    assert!(r.acquired);
    assert_eq!(r.lease_ttl_ms, 15_000);
    let t = r.fencing_token;
    let busy = cl
        .acquire(acq(&b, "payouts/m-1", 0))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (busy.acquired, busy.holder.as_str(), busy.queue_position),
        (false, a.as_str(), 1)
    );

    // Another holder's session id is the admin's to see.
    let inspect = || pb::InspectRequest {
        name: "payouts/m-1".into(),
        ..Default::default()
    };
    let state = cl.inspect(inspect()).await.unwrap().into_inner();
    assert_eq!(state.holders[0].session_id, "");
    let state = cl
        .inspect(bearer(inspect(), ADMIN_TOKEN))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(state.holders.len(), 1);
    assert_eq!(
        (
            state.holders[0].session_id.as_str(),
            state.holders[0].fencing_token
        ),
        (a.as_str(), t)
    );

    // Shared + semaphore + re-entrancy.
    let shared = |s: &str| pb::AcquireRequest {
        mode: pb::Mode::Shared as i32,
        ..acq(s, "idx", 0)
    };
    assert!(cl.acquire(shared(&a)).await.unwrap().into_inner().acquired);
    assert!(cl.acquire(shared(&b)).await.unwrap().into_inner().acquired);
    let sem = |s: &str| pb::AcquireRequest {
        mode: pb::Mode::Semaphore as i32,
        limit: 1,
        ..acq(s, "one", 0)
    };
    assert!(cl.acquire(sem(&a)).await.unwrap().into_inner().acquired);
    assert!(!cl.acquire(sem(&b)).await.unwrap().into_inner().acquired);
    let re = pb::AcquireRequest {
        reentrant: true,
        ..acq(&a, "cfg", 0)
    };
    let r1 = cl.acquire(re.clone()).await.unwrap().into_inner();
    let r2 = cl.acquire(re).await.unwrap().into_inner();
    assert_eq!((r1.fencing_token, r2.reentry), (r2.fencing_token, 2));

    // Errors carry the gRPC code and the stable lockd code.
    let stale = cl
        .release(pb::ReleaseRequest {
            session_id: a.clone(),
            name: "payouts/m-1".into(),
            fencing_token: t - 1,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(
        code_of(&stale),
        (Code::FailedPrecondition, "stale_token".into())
    );
    let bad = cl.acquire(acq(&a, "", 0)).await.unwrap_err();
    assert_eq!(
        code_of(&bad),
        (Code::InvalidArgument, "invalid_argument".into())
    );
    let gone = cl
        .keep_alive(pb::KeepAliveRequest {
            session_id: "s_00000000000000aa".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(code_of(&gone), (Code::NotFound, "session_not_found".into()));
    let auth = cl.acquire(acq(&a, "secure/x", 0)).await.unwrap_err();
    assert_eq!(
        code_of(&auth),
        (Code::Unauthenticated, "unauthenticated".into())
    );
    let wrong = cl
        .acquire(bearer(acq(&a, "secure/x", 0), SECURE_TOKEN))
        .await
        .unwrap_err();
    assert_eq!(
        code_of(&wrong),
        (Code::PermissionDenied, "wrong_namespace".into())
    );
    let sec = cl
        .open_session(bearer(
            pb::OpenSessionRequest {
                client: "sec".into(),
                namespace: "secure".into(),
                ..Default::default()
            },
            SECURE_TOKEN,
        ))
        .await
        .unwrap()
        .into_inner()
        .session_id;
    let ok = cl
        .acquire(bearer(acq(&sec, "secure/x", 0), SECURE_TOKEN))
        .await
        .unwrap();
    assert!(ok.into_inner().acquired);
    // Its session is the secure namespace's: keepalive needs the token (gRPC metadata).
    let keep = || pb::KeepAliveRequest {
        session_id: sec.clone(),
        ..Default::default()
    };
    let refused = cl.keep_alive(keep()).await.unwrap_err();
    assert_eq!(
        code_of(&refused),
        (Code::Unauthenticated, "unauthenticated".into())
    );
    assert!(cl.keep_alive(bearer(keep(), SECURE_TOKEN)).await.is_ok());

    // A unary waiting acquire returns when the holder releases.
    let mut cl2 = cl.clone();
    let bb = b.clone();
    let wait = tokio::spawn(async move {
        cl2.acquire(acq(&bb, "payouts/m-1", 20_000))
            .await
            .unwrap()
            .into_inner()
    });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let s = cl
            .inspect(pb::InspectRequest {
                name: "payouts/m-1".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        if s.waiters.len() == 1 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let rel = pb::ReleaseRequest {
        session_id: a.clone(),
        name: "payouts/m-1".into(),
        fencing_token: t,
        ..Default::default()
    };
    assert_eq!(cl.release(rel).await.unwrap().into_inner().remaining, 0);
    let granted = wait.await.unwrap();
    assert!(granted.acquired && granted.fencing_token > t);

    let detail = cl
        .get_session(pb::GetSessionRequest {
            session_id: a.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(detail.held.len(), 3);
    let refused = cl
        .list_sessions(pb::ListSessionsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(
        code_of(&refused),
        (Code::Unauthenticated, "unauthenticated".into())
    );
    let mut list = tonic::Request::new(pb::ListSessionsRequest::default());
    list.metadata_mut().insert(
        "authorization",
        format!("Bearer {ADMIN_TOKEN}").parse().unwrap(),
    );
    let page = cl.list_sessions(list).await.unwrap().into_inner();
    assert_eq!(page.sessions.len(), 3);
    assert!(page
        .sessions
        .iter()
        .any(|s| s.session_id == a && s.held == 3));
    let closed = cl
        .close_session(pb::CloseSessionRequest {
            session_id: a.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        closed.released, 3,
        "m-1 was released; idx, one, cfg (one hold, re-entered) remain"
    );
    c.stop_all().await;
}

/// Sends requests up a session stream and reads events down it.
struct Stream {
    up: mpsc::UnboundedSender<pb::SessionRequest>,
    down: tonic::Streaming<pb::SessionEvent>,
    next: u64,
}

impl Stream {
    async fn start(cl: &mut LockClient<Channel>) -> Stream {
        let (up, rx) = mpsc::unbounded_channel();
        let down = cl
            .session(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        Stream { up, down, next: 1 }
    }

    fn send(&mut self, kind: Req) -> u64 {
        let id = self.next;
        self.next += 1;
        self.up
            .send(pb::SessionRequest {
                request_id: id,
                kind: Some(kind),
            })
            .unwrap();
        id
    }

    async fn event(&mut self) -> pb::SessionEvent {
        tokio::time::timeout(Duration::from_secs(20), self.down.message())
            .await
            .expect("an event in 20 s")
            .unwrap()
            .unwrap()
    }

    /// The stream's end: no event for 20 s is a failure.
    async fn end(&mut self) {
        let next = tokio::time::timeout(Duration::from_secs(20), self.down.message())
            .await
            .expect("the end in 20 s")
            .unwrap();
        assert!(next.is_none(), "the stream went on with {next:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_stream_pushes_wake_ups() {
    let mut c = cluster(1, 2).await;
    let mut cl = client(&c, 0).await;
    let holder = open(&mut cl, "holder").await;
    let t = cl
        .acquire(acq(&holder, "search/shard-17", 0))
        .await
        .unwrap()
        .into_inner()
        .fencing_token;

    let mut s = Stream::start(&mut cl).await;
    let id = s.send(Req::Open(pb::OpenSessionRequest {
        client: "streamer".into(),
        ..Default::default()
    }));
    let ev = s.event().await;
    assert_eq!(ev.request_id, id);
    let Some(Ev::Opened(opened)) = ev.kind else {
        panic!("{ev:?}")
    };
    let me = opened.session_id.clone();

    let id = s.send(Req::Keepalive(pb::KeepAliveRequest::default()));
    let ev = s.event().await;
    assert_eq!(ev.request_id, id);
    let Some(Ev::Keepalive(k)) = ev.kind else {
        panic!("{ev:?}")
    };
    // Every lock group answers for itself: the session lives only in its home so far.
    assert_eq!(k.ttl_ms, 15_000);
    assert!(k.groups.len() >= 2, "{k:?}");
    for g in &k.groups {
        if g.group == opened.group {
            assert_eq!(g.state(), pb::GroupLeaseState::Extended, "{g:?}");
            assert_eq!(g.ttl_ms, 15_000, "{g:?}");
        } else {
            assert_eq!(g.state(), pb::GroupLeaseState::NotHere, "{g:?}");
        }
    }

    // A waiting acquire queues, and the grant is pushed when the holder releases.
    let id = s.send(Req::Acquire(pb::AcquireRequest {
        name: "search/shard-17".into(),
        owner: "me".into(),
        wait_ms: 30_000,
        ..Default::default()
    }));
    let ev = s.event().await;
    assert_eq!(ev.request_id, id);
    let Some(Ev::Queued(q)) = ev.kind else {
        panic!("{ev:?}")
    };
    assert_eq!((q.name.as_str(), q.position), ("search/shard-17", 1));
    let rel = pb::ReleaseRequest {
        session_id: holder.clone(),
        name: "search/shard-17".into(),
        fencing_token: t,
        ..Default::default()
    };
    cl.release(rel).await.unwrap();
    let ev = s.event().await;
    let Some(Ev::Granted(g)) = ev.kind else {
        panic!("{ev:?}")
    };
    assert_eq!(
        (ev.request_id, g.group, g.waiter, g.name.as_str()),
        (0, q.group, q.waiter, "search/shard-17")
    );
    assert!(g.fencing_token > t);
    // Reads ride the stream too, and a bad name is refused without ending it. The deprecated
    // body token still works (and wins over the stream's metadata) for older clients.
    #[allow(deprecated)]
    let id = s.send(Req::Inspect(pb::InspectRequest {
        name: "search/shard-17".into(),
        token: ADMIN_TOKEN.into(),
    }));
    let ev = s.event().await;
    assert_eq!(ev.request_id, id);
    let Some(Ev::State(state)) = ev.kind else {
        panic!("{ev:?}")
    };
    assert_eq!(state.holders[0].session_id, me);
    assert_eq!(state.holders[0].fencing_token, g.fencing_token);
    let id = s.send(Req::Inspect(pb::InspectRequest::default()));
    let ev = s.event().await;
    let Some(Ev::Error(e)) = ev.kind else {
        panic!("{ev:?}")
    };
    assert_eq!((ev.request_id, e.status), (id, 400));
    assert!(e.message.contains("name"), "{e:?}");

    // Releases and errors ride the stream too.
    let id = s.send(Req::Release(pb::ReleaseRequest {
        name: "search/shard-17".into(),
        fencing_token: g.fencing_token + 100,
        ..Default::default()
    }));
    let ev = s.event().await;
    let Some(Ev::Error(e)) = ev.kind else {
        panic!("{ev:?}")
    };
    assert_eq!(
        (ev.request_id, e.status, e.code.as_str()),
        (id, 409, "stale_token")
    );
    let id = s.send(Req::Release(pb::ReleaseRequest {
        name: "search/shard-17".into(),
        fencing_token: g.fencing_token,
        ..Default::default()
    }));
    let ev = s.event().await;
    assert_eq!(
        (ev.request_id, ev.kind),
        (id, Some(Ev::Released(pb::ReleaseResponse { remaining: 0 })))
    );

    // A wait that times out ends with a pushed wait_ended.
    cl.acquire(acq(&holder, "busy", 0)).await.unwrap();
    s.send(Req::Acquire(pb::AcquireRequest {
        name: "busy".into(),
        wait_ms: 300,
        ..Default::default()
    }));
    let ev = s.event().await;
    assert!(matches!(ev.kind, Some(Ev::Queued(_))), "{ev:?}");
    let ev = s.event().await;
    let Some(Ev::WaitEnded(w)) = ev.kind else {
        panic!("{ev:?}")
    };
    assert_eq!((w.name.as_str(), w.reason.as_str()), ("busy", "timed_out"));

    // A session_id on a stream request is the stream's own or refused, never silently ignored.
    let other = open(&mut cl, "other").await;
    for bad in [other.as_str(), "not-a-session"] {
        let id = s.send(Req::Acquire(pb::AcquireRequest {
            session_id: bad.into(),
            name: "mine".into(),
            ..Default::default()
        }));
        let ev = s.event().await;
        let Some(Ev::Error(e)) = ev.kind else {
            panic!("{ev:?}")
        };
        assert_eq!(
            (ev.request_id, e.status, e.code.as_str()),
            (id, 400, "invalid_argument")
        );
        assert!(e.message.contains("session_id"), "{e:?}");
    }
    let id = s.send(Req::Keepalive(pb::KeepAliveRequest {
        session_id: other.clone(),
        ..Default::default()
    }));
    let ev = s.event().await;
    assert!(matches!(ev.kind, Some(Ev::Error(_))), "{ev:?}");
    assert_eq!(ev.request_id, id);
    let inspect = || {
        bearer(
            pb::InspectRequest {
                name: "mine".into(),
                ..Default::default()
            },
            ADMIN_TOKEN,
        )
    };
    assert!(
        cl.inspect(inspect())
            .await
            .unwrap()
            .into_inner()
            .holders
            .is_empty(),
        "a refused acquire took nothing"
    );
    let id = s.send(Req::Acquire(pb::AcquireRequest {
        session_id: me.clone(),
        name: "mine".into(),
        ..Default::default()
    }));
    let ev = s.event().await;
    assert_eq!(ev.request_id, id);
    assert!(
        matches!(&ev.kind, Some(Ev::Acquired(a)) if a.acquired),
        "{ev:?}"
    );
    // A close naming another session closes nothing and keeps the stream.
    let id = s.send(Req::Close(pb::CloseSessionRequest {
        session_id: other.clone(),
    }));
    let ev = s.event().await;
    assert!(matches!(ev.kind, Some(Ev::Error(_))), "{ev:?}");
    assert_eq!(ev.request_id, id);

    // Closing over the stream releases everything, then one session_ended, then the end.
    let id = s.send(Req::Close(pb::CloseSessionRequest::default()));
    let ev = s.event().await;
    assert_eq!(ev.request_id, id);
    assert_eq!(
        ev.kind,
        Some(Ev::Closed(pb::CloseSessionResponse { released: 1 }))
    );
    let ev = s.event().await;
    assert_eq!(
        (ev.request_id, ev.kind),
        (
            0,
            Some(Ev::SessionEnded(pb::SessionEnded {
                group: 0,
                reason: "closed".into()
            }))
        )
    );
    s.end().await;
    assert!(cl
        .inspect(inspect())
        .await
        .unwrap()
        .into_inner()
        .holders
        .is_empty());
    c.stop_all().await;
}

/// A unary close of the session a stream carries ends that stream with one `session_ended`,
/// however many groups the session lived in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unary_close_ends_the_stream_with_one_notice() {
    let mut c = cluster(1, 4).await;
    let mut cl = client(&c, 0).await;
    let mut s = Stream::start(&mut cl).await;
    s.send(Req::Open(pb::OpenSessionRequest {
        client: "closed-elsewhere".into(),
        ..Default::default()
    }));
    let ev = s.event().await;
    let Some(Ev::Opened(opened)) = ev.kind else {
        panic!("{ev:?}")
    };
    let closed = cl
        .close_session(pb::CloseSessionRequest {
            session_id: opened.session_id,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(closed.released, 0);
    let ev = s.event().await;
    assert_eq!(
        (ev.request_id, ev.kind),
        (
            0,
            Some(Ev::SessionEnded(pb::SessionEnded {
                group: 0,
                reason: "closed".into()
            }))
        )
    );
    s.end().await;
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_closed_stream_still_answers_what_it_carried() {
    let mut c = cluster(1, 2).await;
    let mut cl = client(&c, 0).await;
    let mut s = Stream::start(&mut cl).await;
    s.send(Req::Open(pb::OpenSessionRequest {
        client: "half-closer".into(),
        ..Default::default()
    }));
    assert!(matches!(s.event().await.kind, Some(Ev::Opened(_))));
    // Three acquires, then the client stops sending; each still gets its answer.
    let ids: Vec<u64> = (0..3)
        .map(|i| {
            s.send(Req::Acquire(pb::AcquireRequest {
                name: format!("half/{i}"),
                ..Default::default()
            }))
        })
        .collect();
    let Stream { up, mut down, .. } = s;
    drop(up);
    let mut answered = Vec::new();
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(20), down.message())
        .await
        .expect("an event or the end in 20 s")
        .unwrap()
    {
        let Some(Ev::Acquired(a)) = ev.kind else {
            panic!("{ev:?}")
        };
        assert!(a.acquired && a.fencing_token > 0, "{a:?}");
        answered.push(ev.request_id);
    }
    answered.sort();
    assert_eq!(
        answered, ids,
        "every request answered before the stream ended"
    );
    c.stop_all().await;
}

/// grpcurl and load balancers work without the .proto: server reflection lists the services,
/// and the standard health service says SERVING (NOT_SERVING once the node is leaving).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_and_health_answer() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    use tonic_health::pb::HealthCheckRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;

    let mut c = cluster(1, 1).await;
    let channel = c.grpc_channel(0).await;
    let mut r = ServerReflectionClient::new(channel.clone());
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = r
        .server_reflection_info(tokio_stream::iter([req]))
        .await
        .unwrap()
        .into_inner();
    let Some(MessageResponse::ListServicesResponse(list)) =
        answers.message().await.unwrap().unwrap().message_response
    else {
        panic!("not a service list")
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for want in ["lockd.v1.Lock", "lockd.v1.Admin", "grpc.health.v1.Health"] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
    // The descriptor of a message, as grpcurl's `describe` asks for it.
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::FileContainingSymbol(
            "lockd.v1.AcquireRequest".into(),
        )),
    };
    let mut answers = r
        .server_reflection_info(tokio_stream::iter([req]))
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(
        answers.message().await.unwrap().unwrap().message_response,
        Some(MessageResponse::FileDescriptorResponse(f)) if !f.file_descriptor_proto.is_empty()
    ));

    // Health follows readiness, checked every 250 ms: SERVING soon after the node is ready.
    let mut h = HealthClient::new(channel);
    for service in ["", "lockd.v1.Lock", "lockd.v1.Admin"] {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let st = h
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await
                .unwrap()
                .into_inner()
                .status;
            if st == ServingStatus::Serving as i32 {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{service:?}: {st}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    c.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_token_says_whether_a_token_is_a_current_holders_on_both_transports() {
    let mut c = cluster(1, 1).await;
    let mut cl = client(&c, 0).await;
    let http = Http::new(c.url(0, ""));
    let check_http = |name: &'static str, token: u64| {
        let http = http.clone();
        async move {
            let r = http
                .post(&format!("/v1/locks/{name}:check"), json!({"token": token}))
                .await;
            assert_eq!(r.status, 200, "{}", r.body);
            (
                r.body["valid"].as_bool().unwrap(),
                r.body["newest_token"].as_u64().unwrap(),
            )
        }
    };
    let grpc = cl.clone();
    let check_grpc = |name: &'static str, token: u64| {
        let mut cl = grpc.clone();
        async move {
            let r = cl
                .check_token(pb::CheckTokenRequest {
                    name: name.into(),
                    fencing_token: token,
                })
                .await
                .unwrap()
                .into_inner();
            (r.valid, r.newest_token)
        }
    };
    // Free: no token is valid.
    assert_eq!(check_http("payouts/c-1", 1).await, (false, 0));
    let s = open(&mut cl, "checker").await;
    let t = cl
        .acquire(acq(&s, "payouts/c-1", 0))
        .await
        .unwrap()
        .into_inner()
        .fencing_token;
    assert_eq!(check_http("payouts/c-1", t).await, (true, t));
    assert_eq!(check_grpc("payouts/c-1", t).await, (true, t));
    // An older token (a previous holder's) is not.
    if t > 1 {
        assert_eq!(check_grpc("payouts/c-1", t - 1).await, (false, t));
    }
    cl.release(pb::ReleaseRequest {
        session_id: s.clone(),
        name: "payouts/c-1".into(),
        fencing_token: t,
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(check_grpc("payouts/c-1", t).await, (false, 0));
    assert_eq!(check_http("payouts/c-1", t).await, (false, 0));
    // A name in a namespace with a token needs it, as an inspect does.
    let anon = cl
        .check_token(pb::CheckTokenRequest {
            name: "secure/x".into(),
            fencing_token: 1,
        })
        .await
        .unwrap_err();
    assert_eq!(anon.code(), Code::Unauthenticated, "{anon:?}");
    let ok = cl
        .check_token(bearer(
            pb::CheckTokenRequest {
                name: "secure/x".into(),
                fencing_token: 1,
            },
            SECURE_TOKEN,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(!ok.valid);
    c.stop_all().await;
}

/// A node that is stopping (SIGTERM) ends its session streams with `unavailable` saying to
/// attach elsewhere, and the session, its lock and its lease live on through another node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_node_sends_its_session_streams_elsewhere() {
    let mut c = cluster(3, 1).await;
    let mut cl = client(&c, 0).await;
    let mut s = Stream::start(&mut cl).await;
    let id = s.send(Req::Open(pb::OpenSessionRequest {
        client: "mover".into(),
        ttl_ms: 15_000,
        ..Default::default()
    }));
    let ev = s.event().await;
    assert_eq!(ev.request_id, id);
    let Some(Ev::Opened(opened)) = ev.kind else {
        panic!("{ev:?}")
    };
    let session = opened.session_id;
    let mut other = client(&c, 1).await;
    let token = other
        .acquire(acq(&session, "search/shard-9", 0))
        .await
        .unwrap()
        .into_inner()
        .fencing_token;

    c.stop(0).await;
    let end = tokio::time::timeout(Duration::from_secs(20), s.down.message())
        .await
        .expect("the stream's end in 20 s");
    let status = end.expect_err("the stream ends with a status");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status
            .message()
            .contains("attach the session on another node"),
        "{status:?}"
    );

    // Attached on node 2: the same session, its lock held with the same token.
    let mut s2 = Stream::start(&mut other).await;
    let id = s2.send(Req::Attach(session.clone()));
    let ev = s2.event().await;
    assert_eq!(ev.request_id, id);
    assert!(matches!(ev.kind, Some(Ev::Keepalive(_))), "{ev:?}");
    let held = other
        .inspect(pb::InspectRequest {
            name: "search/shard-9".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(held.holders[0].fencing_token, token, "{held:?}");
    c.stop_all().await;
}

/// Attaching a protected session on a stream is acting on it: without the namespace's token
/// the attach is refused on the stream, and the session is not kept alive by it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attaching_a_protected_session_needs_its_namespace_token() {
    let mut c = cluster(1, 2).await;
    let secure = Http::new(c.url(0, "")).with_token(SECURE_TOKEN);
    let session = secure.session_in("payout-worker", 15, "secure").await;
    let mut cl = client(&c, 0).await;
    let mut s = Stream::start(&mut cl).await;
    let id = s.send(Req::Attach(session.clone()));
    let ev = s.event().await;
    let Some(Ev::Error(e)) = ev.kind else {
        panic!("an anonymous attach of a protected session was taken: {ev:?}")
    };
    assert_eq!(
        (ev.request_id, e.status, e.code.as_str()),
        (id, 401, "unauthenticated")
    );
    // Nor does the stream carry it afterwards: a keepalive naming it is refused.
    let id = s.send(Req::Keepalive(pb::KeepAliveRequest {
        session_id: session.clone(),
        ..Default::default()
    }));
    let ev = s.event().await;
    let Some(Ev::Error(e)) = ev.kind else {
        panic!("{ev:?}")
    };
    assert_eq!(ev.request_id, id);
    assert!(e.status == 400 || e.status == 401, "{e:?}");
    c.stop_all().await;
}

/// A token rotation takes effect on what is already open: a session stream's next keepalive
/// with the old token is refused, and a watch opened with it ends within a second of the next
/// event (issue 42 item 6).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_token_stops_open_streams_and_watches() {
    let c = cluster(1, 2).await;
    let mut cl = client(&c, 0).await;
    // A stream and a watch of the `secure` namespace, both with its token.
    let (up, rx) = mpsc::unbounded_channel();
    let down = cl
        .session(bearer(
            tokio_stream::wrappers::UnboundedReceiverStream::new(rx),
            SECURE_TOKEN,
        ))
        .await
        .unwrap()
        .into_inner();
    let mut s = Stream { up, down, next: 1 };
    s.send(Req::Open(pb::OpenSessionRequest {
        client: "rot".into(),
        namespace: "secure".into(),
        ..Default::default()
    }));
    let Some(Ev::Opened(opened)) = s.event().await.kind else {
        panic!("not opened")
    };
    let keepalive = || {
        Req::Keepalive(pb::KeepAliveRequest {
            session_id: opened.session_id.clone(),
            ..Default::default()
        })
    };
    s.send(keepalive());
    assert!(matches!(s.event().await.kind, Some(Ev::Keepalive(_))));
    let watch = pb::WatchRequest {
        prefix: "secure/".into(),
        ..Default::default()
    };
    let mut events = cl
        .watch(bearer(watch, SECURE_TOKEN))
        .await
        .unwrap()
        .into_inner();

    // The admin rotates the token.
    let admin = Http::new(c.url(0, "")).admin();
    let v = admin.get("/v1/admin/namespaces").await.body["version"]
        .as_u64()
        .unwrap();
    let r = admin
        .post(
            "/v1/admin/namespaces",
            json!({"expected_version": v, "namespace": {"name": "secure", "prefix": "secure/"},
                   "bearer_token": "secure-token-2"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.body);

    // The stream's keepalive with the old token: refused, and the stream stays open.
    s.send(keepalive());
    let Some(Ev::Error(e)) = s.event().await.kind else {
        panic!("a keepalive with the retired token was served")
    };
    assert_eq!(
        (e.status, e.code.as_str()),
        (401, "unauthenticated"),
        "{e:?}"
    );

    // The watch: events made with the new token, until the watch ends; it must end, and
    // within about a second of events.
    let maker = tokio::spawn({
        let mut cl = cl.clone();
        async move {
            let sec = cl
                .open_session(bearer(
                    pb::OpenSessionRequest {
                        client: "maker".into(),
                        namespace: "secure".into(),
                        ..Default::default()
                    },
                    "secure-token-2",
                ))
                .await
                .unwrap()
                .into_inner()
                .session_id;
            for i in 0..200 {
                let _ = cl
                    .acquire(bearer(
                        acq(&sec, &format!("secure/w-{i}"), 0),
                        "secure-token-2",
                    ))
                    .await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    });
    let rotated_at = tokio::time::Instant::now();
    let ended = loop {
        match tokio::time::timeout(Duration::from_secs(10), events.message()).await {
            Ok(Ok(Some(_))) => continue,
            Ok(Err(status)) => break status,
            other => panic!("the watch went on or stopped without a refusal: {other:?}"),
        }
    };
    maker.abort();
    assert_eq!(ended.code(), Code::Unauthenticated, "{ended:?}");
    assert!(
        rotated_at.elapsed() < Duration::from_secs(5),
        "ended {:?} after the rotation",
        rotated_at.elapsed()
    );
}
