//! One error model: the same bad input gets the same code on HTTP and on gRPC, and changes
//! nothing. Each row of the table is sent both ways to one node; the HTTP status must also be
//! the one the gRPC code maps to.

mod common;

use common::*;
use lockd_proto::v1 as pb;
use lockd_proto::v1::lock_client::LockClient;
use serde_json::{json, Value};
use tonic::transport::Channel;
use tonic::Code;
use tonic_types::StatusExt;

/// How one bad input is sent on each transport.
enum Call {
    Open {
        ttl_s: u64,
        namespace: &'static str,
    },
    Acquire {
        name: String,
        http: Value,
        grpc: pb::AcquireRequest,
    },
    Release {
        session: String,
        name: &'static str,
        token: u64,
    },
    List {
        limit: u32,
    },
    Check {
        name: &'static str,
        token: u64,
    },
}

/// The gRPC code an HTTP status stands for (`grpc::status`).
fn grpc_code(status: u16) -> Code {
    match status {
        400 => Code::InvalidArgument,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        409 => Code::FailedPrecondition,
        413 | 429 => Code::ResourceExhausted,
        503 => Code::Unavailable,
        _ => Code::Internal,
    }
}

async fn over_http(h: &Http, call: &Call) -> (u16, String, String) {
    let r = match call {
        Call::Open { ttl_s, namespace } => {
            h.post(
                "/v1/sessions",
                json!({"ttl_s": ttl_s, "namespace": namespace}),
            )
            .await
        }
        Call::Acquire { name, http, .. } => {
            h.post(&format!("/v1/locks/{}:acquire", enc(name)), http.clone())
                .await
        }
        Call::Release {
            session,
            name,
            token,
        } => h.release(name, session, *token).await,
        Call::List { limit } => h.admin().get(&format!("/v1/sessions?limit={limit}")).await,
        Call::Check { name, token } => {
            h.post(&format!("/v1/locks/{name}:check"), json!({"token": token}))
                .await
        }
    };
    let e = &r.body["error"];
    (
        r.status,
        e["code"].as_str().unwrap_or("(no code)").to_string(),
        e["message"].as_str().unwrap_or("").to_string(),
    )
}

async fn over_grpc(cl: &mut LockClient<Channel>, call: &Call) -> (Code, String, String) {
    let r = match call {
        Call::Open { ttl_s, namespace } => cl
            .open_session(pb::OpenSessionRequest {
                ttl_ms: ttl_s * 1000,
                namespace: namespace.to_string(),
                ..Default::default()
            })
            .await
            .map(drop),
        Call::Acquire { grpc, .. } => cl.acquire(grpc.clone()).await.map(drop),
        Call::Release {
            session,
            name,
            token,
        } => cl
            .release(pb::ReleaseRequest {
                session_id: session.clone(),
                name: name.to_string(),
                fencing_token: *token,
                ..Default::default()
            })
            .await
            .map(drop),
        Call::List { limit } => {
            let mut req = tonic::Request::new(pb::ListSessionsRequest {
                limit: *limit,
                ..Default::default()
            });
            req.metadata_mut().insert(
                "authorization",
                format!("Bearer {ADMIN_TOKEN}").parse().unwrap(),
            );
            cl.list_sessions(req).await.map(drop)
        }
        Call::Check { name, token } => cl
            .check_token(pb::CheckTokenRequest {
                name: name.to_string(),
                fencing_token: *token,
            })
            .await
            .map(drop),
    };
    let s = r.expect_err("a bad input must be refused");
    let code = s
        .metadata()
        .get("lockd-error-code")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_else(|| "(no code)".into());
    // The standard rich details say the same, for interceptors in other languages.
    let details = s.get_error_details();
    let info = details.error_info().expect("a google.rpc.ErrorInfo");
    assert_eq!(
        (info.reason.as_str(), info.domain.as_str()),
        (code.to_ascii_uppercase().as_str(), "lockd")
    );
    let retry_ms = s
        .metadata()
        .get("lockd-retry-after-ms")
        .map(|v| v.to_str().unwrap().parse::<u128>().unwrap());
    assert_eq!(
        details
            .retry_info()
            .and_then(|r| r.retry_delay)
            .map(|d| d.as_millis()),
        retry_ms
    );
    (s.code(), code, s.message().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_and_grpc_refuse_the_same_input_with_the_same_code() {
    let mut c = cluster(1, 2).await;
    let h = Http::new(c.url(0, ""));
    let mut cl = LockClient::new(c.grpc_channel(0).await);
    let s = h.session("s", 15).await;
    let other = h.session("o", 15).await;
    let tight = h.session_in("t", 15, "tight").await;
    let t = h.acquire("held", json!({"session_id": s})).await.body["token"]
        .as_u64()
        .unwrap();
    let acquire = |name: &str, http: Value, grpc: pb::AcquireRequest| Call::Acquire {
        name: name.to_string(),
        http,
        grpc: pb::AcquireRequest {
            name: name.to_string(),
            ..grpc
        },
    };
    let base = pb::AcquireRequest {
        session_id: s.clone(),
        ..Default::default()
    };
    let semaphore = |limit: u32| pb::AcquireRequest {
        mode: pb::Mode::Semaphore as i32,
        limit,
        ..base.clone()
    };
    let long = "n".repeat(513);
    let cases: Vec<(&str, Call, u16, &str)> = vec![
        (
            "wait_ms 300001",
            acquire(
                "n",
                json!({"session_id": s, "wait_ms": 300_001}),
                pb::AcquireRequest {
                    wait_ms: 300_001,
                    ..base.clone()
                },
            ),
            400,
            "wait_too_long",
        ),
        (
            "semaphore limit 0",
            acquire(
                "n",
                json!({"session_id": s, "mode": "semaphore", "limit": 0}),
                semaphore(0),
            ),
            400,
            "invalid_semaphore_limit",
        ),
        (
            "semaphore without a limit",
            acquire(
                "n",
                json!({"session_id": s, "mode": "semaphore"}),
                semaphore(0),
            ),
            400,
            "invalid_semaphore_limit",
        ),
        (
            "semaphore limit 10001",
            acquire(
                "n",
                json!({"session_id": s, "mode": "semaphore", "limit": 10_001}),
                semaphore(10_001),
            ),
            400,
            "invalid_semaphore_limit",
        ),
        (
            "a limit on an exclusive lock",
            acquire(
                "n",
                json!({"session_id": s, "mode": "exclusive", "limit": 3}),
                pb::AcquireRequest {
                    mode: pb::Mode::Exclusive as i32,
                    limit: 3,
                    ..base.clone()
                },
            ),
            400,
            "invalid_argument",
        ),
        (
            "name over 512 bytes",
            acquire(&long, json!({"session_id": s}), base.clone()),
            400,
            "invalid_argument",
        ),
        (
            "a right-to-left override in a name",
            acquire("pay\u{202E}exe.sh", json!({"session_id": s}), base.clone()),
            400,
            "invalid_argument",
        ),
        (
            "a zero-width space in a name",
            acquire("shard\u{200B}17", json!({"session_id": s}), base.clone()),
            400,
            "invalid_argument",
        ),
        (
            "malformed session id",
            acquire(
                "n",
                json!({"session_id": "nope"}),
                pb::AcquireRequest {
                    session_id: "nope".into(),
                    ..base.clone()
                },
            ),
            400,
            "invalid_argument",
        ),
        (
            "unknown session",
            acquire(
                "n",
                json!({"session_id": "s_00000000000000aa"}),
                pb::AcquireRequest {
                    session_id: "s_00000000000000aa".into(),
                    ..base.clone()
                },
            ),
            404,
            "session_not_found",
        ),
        (
            "a name outside the session's namespace",
            Call::Acquire {
                name: "plain".into(),
                http: json!({"session_id": tight}),
                grpc: pb::AcquireRequest {
                    session_id: tight.clone(),
                    name: "plain".into(),
                    ..Default::default()
                },
            },
            403,
            "wrong_namespace",
        ),
        (
            "a guarded namespace without its token",
            acquire("secure/a", json!({"session_id": s}), base.clone()),
            401,
            "unauthenticated",
        ),
        (
            "TTL below the namespace's bound",
            Call::Open {
                ttl_s: 4,
                namespace: "",
            },
            400,
            "ttl_out_of_range",
        ),
        (
            "TTL above the namespace's bound",
            Call::Open {
                ttl_s: 61,
                namespace: "",
            },
            400,
            "ttl_out_of_range",
        ),
        (
            "TTL above every namespace's bound",
            Call::Open {
                ttl_s: 4_000,
                namespace: "",
            },
            400,
            "ttl_out_of_range",
        ),
        (
            "an unknown namespace",
            Call::Open {
                ttl_s: 15,
                namespace: "nowhere",
            },
            404,
            "namespace_not_found",
        ),
        (
            "release by a non-holder",
            Call::Release {
                session: other.clone(),
                name: "held",
                token: t,
            },
            409,
            "not_holder",
        ),
        (
            "check of token 0",
            Call::Check {
                name: "held",
                token: 0,
            },
            400,
            "invalid_argument",
        ),
        (
            "check of a token beyond int64",
            Call::Check {
                name: "held",
                token: u64::MAX,
            },
            400,
            "invalid_argument",
        ),
        (
            "release with a stale token",
            Call::Release {
                session: s.clone(),
                name: "held",
                token: t - 1,
            },
            409,
            "stale_token",
        ),
        (
            "list limit 5000",
            Call::List { limit: 5000 },
            400,
            "invalid_argument",
        ),
    ];
    for (what, call, status, code) in &cases {
        let before = c.hashes(0);
        let (hs, hc, hm) = over_http(&h, call).await;
        let (gs, gc, gm) = over_grpc(&mut cl, call).await;
        assert_eq!(
            (hs, hc.as_str()),
            (*status, *code),
            "{what}: HTTP said {hm}"
        );
        assert_eq!(
            (gs, gc.as_str()),
            (grpc_code(*status), *code),
            "{what}: gRPC said {gm}"
        );
        assert!(!hm.is_empty() && !gm.is_empty(), "{what}: a message");
        assert_eq!(before, c.hashes(0), "{what} changed the state");
    }
    c.stop_all().await;
}
