//! The HTTP/JSON API (GUIDE §4), for curl and for languages without a gRPC client.
//!
//! Paths carry a verb after the last `:` (`/v1/locks/{name}:acquire`). A name may itself contain
//! `/` (percent-encoded or not) and `:`, so the router captures the rest of the path and splits off
//! the verb here. Bodies are read with a hard 64 KiB limit and parsed by hand so every error names
//! its field and limit.
//!
//! Every error, on every route, is `{"error": {"code", "message"}}`: the handlers build it, and
//! `json_errors` rewrites what the framework answers by itself (405, a path that is not UTF-8)
//! into the same shape. A body must be a JSON object sent as `Content-Type: application/json`
//! (415 otherwise: a browser page on another origin cannot send that without a preflight, which
//! lockd never grants); `null` on any field means the field is absent.

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::http::{Method, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, delete, get, post};
use axum::Router;
use lockd_core::{limits, LockMode, SessionId};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::{ApiError, Code, ErrorCode};
use crate::service::{
    AcquireOutcome, AcquireRequest, Credentials, GroupLease, KeepaliveReport, Service,
};

/// Largest request body.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// Longest request target (path and query), far above any valid one (a name is at most
/// 512 bytes, 1,536 percent-encoded).
pub const MAX_URI_BYTES: usize = 8 * 1024;

/// Every endpoint, as docs/openapi.yaml names it. A test checks this list against the spec and
/// that the router answers each one; add a route here and in the spec together.
pub const ENDPOINTS: &[(&str, &str)] = &[
    ("post", "/v1/sessions"),
    ("get", "/v1/sessions"),
    ("post", "/v1/sessions/{id}:keepalive"),
    ("get", "/v1/sessions/{id}"),
    ("delete", "/v1/sessions/{id}"),
    ("post", "/v1/locks/{name}:acquire"),
    ("post", "/v1/locks/{name}:release"),
    ("post", "/v1/locks/{name}:extend"),
    ("post", "/v1/locks/{name}:check"),
    ("get", "/v1/locks/{name}"),
    ("post", "/v1/reports/lease-expired"),
    ("post", "/v1/reports/fencing-rejected"),
    ("get", "/v1/status"),
    ("get", "/livez"),
    ("get", "/readyz"),
    ("get", "/metrics"),
    ("get", "/v1/admin/members"),
    ("get", "/v1/admin/cluster/status"),
    ("post", "/v1/admin/members"),
    ("delete", "/v1/admin/members/{id}"),
    ("post", "/v1/admin/members/{id}:drain"),
    ("post", "/v1/admin/members/{id}:undrain"),
    ("get", "/v1/admin/buckets"),
    ("post", "/v1/admin/buckets:move"),
    ("get", "/v1/admin/groups"),
    ("post", "/v1/admin/groups"),
    ("delete", "/v1/admin/groups/{id}"),
    ("get", "/v1/admin/namespaces"),
    ("post", "/v1/admin/namespaces"),
    ("post", "/v1/admin/namespaces:delete"),
    ("get", "/v1/admin/backup"),
    ("get", "/v1/watch"),
    ("get", "/v1/contention"),
    ("get", "/ui"),
];

pub fn router(svc: Arc<Service>) -> Router {
    Router::new()
        .route("/v1/sessions", post(open_session).get(list_sessions))
        .route("/v1/sessions/{*rest}", any(sessions_under))
        .route("/v1/locks/{*rest}", any(locks_under))
        .route("/v1/reports/lease-expired", post(report_lease_expired))
        .route(
            "/v1/reports/fencing-rejected",
            post(report_fencing_rejected),
        )
        .route("/v1/status", get(status))
        .route("/v1/watch", get(watch))
        .route("/v1/contention", get(contention))
        .route("/ui", get(ui))
        .route("/ui/", get(ui))
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/v1/admin/members", get(list_members).post(add_member))
        .route("/v1/admin/cluster/status", get(cluster_status))
        .route("/v1/admin/members/{*rest}", any(members_under))
        .route("/v1/admin/buckets", get(shard_view))
        .route("/v1/admin/buckets:move", post(move_buckets))
        .route("/v1/admin/groups", get(list_groups).post(create_group))
        .route("/v1/admin/groups/{id}", delete(remove_group))
        .route(
            "/v1/admin/namespaces",
            get(list_namespaces).post(put_namespace),
        )
        .route("/v1/admin/namespaces:delete", post(delete_namespace))
        .route("/v1/admin/backup", get(backup))
        .route("/metrics", get(client_metrics))
        .fallback(|| async {
            error_response(ApiError::new(
                ErrorCode::NotFound,
                "no such endpoint; see docs/API.md",
            ))
        })
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(axum::middleware::map_response(json_errors))
        .layer(axum::middleware::from_fn(uri_limit))
        .with_state(svc)
}

/// The probes port's endpoints only (`servers::probes`): liveness, readiness and metrics.
pub fn probe_router(svc: Arc<Service>) -> Router {
    Router::new()
        .route("/livez", get(livez))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(|| async {
            error_response(ApiError::new(
                ErrorCode::NotFound,
                "the probes port serves /livez, /readyz and /metrics only",
            ))
        })
        .layer(axum::middleware::map_response(json_errors))
        .with_state(svc)
}

/// The verbs of `/v1/locks/{name}:verb`.
const LOCK_VERBS: &[&str] = &["acquire", "release", "extend", "check"];

/// A path below a collection, split once, here: the whole of it percent-decoded, and the part
/// before its last *literal* `:` (decoded) with the verb after it. A `:` sent as `%3A` belongs
/// to the name, so a name may end in `:release` if its colon is encoded.
struct Under<'a> {
    whole: String,
    verb: Option<(String, &'a str)>,
}

fn under<'a>(uri: &'a Uri, prefix: &str) -> Result<Under<'a>, ApiError> {
    let decode = |raw: &str| {
        percent_encoding::percent_decode_str(raw)
            .decode_utf8()
            .map(|d| d.into_owned())
            .map_err(|_| ApiError::bad_request("the path is not UTF-8 once percent-decoded"))
    };
    let raw = uri.path().strip_prefix(prefix).unwrap_or("");
    let verb = match raw.rsplit_once(':') {
        Some((head, verb)) => Some((decode(head)?, verb)),
        None => None,
    };
    Ok(Under {
        whole: decode(raw)?,
        verb,
    })
}

/// 405 with `Allow` naming exactly the methods this path takes.
fn not_allowed(allow: &[Method], message: impl Into<String>) -> Response {
    let mut resp = error_response(ApiError::new(ErrorCode::MethodNotAllowed, message));
    let list: Vec<&str> = allow.iter().map(Method::as_str).collect();
    if let Ok(v) = list.join(", ").parse() {
        resp.headers_mut().insert(header::ALLOW, v);
    }
    resp
}

/// `/v1/locks/{name}` (GET) and `/v1/locks/{name}:acquire|release|extend` (POST).
async fn locks_under(
    State(svc): State<Arc<Service>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    b: Body,
) -> Response {
    let u = match under(&uri, "/v1/locks/") {
        Ok(u) => u,
        Err(e) => return error_response(e),
    };
    match (u.verb.filter(|(_, v)| LOCK_VERBS.contains(v)), method) {
        (Some((name, verb)), Method::POST) => lock_verb(svc, name, verb, headers, b).await,
        (Some((_, v)), m) => not_allowed(&[Method::POST], format!(":{v} takes POST, not {m}")),
        (None, Method::GET | Method::HEAD) => inspect(State(svc), Path(u.whole), headers).await,
        (None, m) => not_allowed(
            &[Method::GET, Method::HEAD],
            format!(
                "a lock takes GET (inspect), not {m}; its verbs are :acquire, :release, \
                 :extend and :check (send a colon of the name itself as %3A)"
            ),
        ),
    }
}

/// `/v1/sessions/{id}` (GET, DELETE) and `/v1/sessions/{id}:keepalive` (POST).
async fn sessions_under(
    State(svc): State<Arc<Service>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    b: Body,
) -> Response {
    let u = match under(&uri, "/v1/sessions/") {
        Ok(u) => u,
        Err(e) => return error_response(e),
    };
    match (u.verb, method) {
        (Some((id, "keepalive")), Method::POST) => keepalive(svc, headers, id, b).await,
        (Some((_, "keepalive")), m) => {
            not_allowed(&[Method::POST], format!(":keepalive takes POST, not {m}"))
        }
        (Some((_, other)), _) => error_response(ApiError::new(
            ErrorCode::NotFound,
            format!("unknown session verb ':{other}' (use :keepalive)"),
        )),
        (None, Method::GET | Method::HEAD) => get_session(State(svc), headers, Path(u.whole)).await,
        (None, Method::DELETE) => close_session(State(svc), headers, Path(u.whole)).await,
        (None, m) => not_allowed(
            &[Method::GET, Method::HEAD, Method::DELETE],
            format!("a session takes GET or DELETE, not {m}; POST goes to ID:keepalive"),
        ),
    }
}

/// `/v1/admin/members/{id}` (DELETE) and `/v1/admin/members/{id}:drain|undrain` (POST).
async fn members_under(
    State(svc): State<Arc<Service>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    q: Result<axum::extract::Query<GroupsQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let u = match under(&uri, "/v1/admin/members/") {
        Ok(u) => u,
        Err(e) => return error_response(e),
    };
    match (u.verb, method) {
        (Some((id, v @ ("drain" | "undrain"))), Method::POST) => {
            set_draining(svc, headers, id, v == "drain").await
        }
        (Some((_, v @ ("drain" | "undrain"))), m) => {
            not_allowed(&[Method::POST], format!(":{v} takes POST, not {m}"))
        }
        (Some((_, other)), _) => error_response(ApiError::new(
            ErrorCode::NotFound,
            format!("no member verb ':{other}'; the verbs are :drain and :undrain"),
        )),
        (None, Method::DELETE) => remove_member(State(svc), headers, Path(u.whole), q).await,
        (None, m) => not_allowed(
            &[Method::DELETE],
            format!("a member takes DELETE, not {m}; POST goes to ID:drain or ID:undrain"),
        ),
    }
}

/// Refuses an over-long request target before routing (414, in the JSON shape).
async fn uri_limit(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let len = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if len > MAX_URI_BYTES {
        return error_response(ApiError::new(
            ErrorCode::UriTooLong,
            format!("the request target is {len} bytes; the limit is {MAX_URI_BYTES}"),
        ));
    }
    next.run(req).await
}

/// Gives an error the framework produced by itself (no JSON body: a 405, a path that does
/// not decode) the JSON error shape, keeping its status and headers (`Allow` on a 405).
async fn json_errors(resp: Response) -> Response {
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let (mut parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, 4096).await.unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let (code, message) = match status.as_u16() {
        405 => (
            ErrorCode::MethodNotAllowed,
            format!(
                "this path does not take that method; it takes {}",
                parts
                    .headers
                    .get(header::ALLOW)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("none")
            ),
        ),
        400 => (
            ErrorCode::InvalidArgument,
            format!("invalid request: {}", text.trim()),
        ),
        404 => (
            ErrorCode::NotFound,
            "no such endpoint; see docs/API.md".to_string(),
        ),
        413 => (
            ErrorCode::BodyTooLarge,
            format!("the request body exceeds the limit of {MAX_BODY_BYTES} bytes"),
        ),
        s => (ErrorCode::Internal, format!("HTTP {s}: {}", text.trim())),
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    let mut e = ApiError::new(code, message);
    e.status = status.as_u16();
    let mut out = error_response(e);
    for (k, v) in parts.headers.iter() {
        if k != header::CONTENT_TYPE {
            out.headers_mut().insert(k.clone(), v.clone());
        }
    }
    out
}

fn error_response(e: ApiError) -> Response {
    let status = StatusCode::from_u16(e.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (
        status,
        axum::Json(json!({"error": {"code": e.code.name(), "message": e.message}})),
    )
        .into_response();
    if let Some(ms) = e.retry_after_ms {
        let secs = ms.div_ceil(1000).max(1);
        resp.headers_mut().insert(header::RETRY_AFTER, secs.into());
    }
    resp
}

/// Turns a handler's result into a response and records the metric.
fn finish(svc: &Service, op: &'static str, start: Instant, r: Result<Value, ApiError>) -> Response {
    match r {
        Ok(v) => {
            // An acquire that did not get the lock (taken, or a wait that ended) is no `ok`.
            let result = if v.get("acquired") == Some(&Value::Bool(false)) {
                "busy"
            } else {
                "ok"
            };
            svc.metrics.record("http", op, result, start.elapsed());
            axum::Json(v).into_response()
        }
        Err(e) => {
            svc.metrics
                .record("http", op, e.code.name(), start.elapsed());
            error_response(e)
        }
    }
}

fn credentials(headers: &HeaderMap) -> Credentials {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| t.trim().to_string());
    let from = headers
        .get(crate::conns::CLIENT_ADDR_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    Credentials { bearer, from }
}

/// Reads at most 64 KiB and parses it as `T`: a JSON object sent as `application/json`, or no
/// body at all (parsed as `{}`). Errors name the field (`limit: invalid type ...`).
async fn body<T: for<'de> Deserialize<'de>>(
    headers: &HeaderMap,
    body: Body,
) -> Result<T, ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .map(|v| v.to_str().unwrap_or("(not text)"));
    let json = content_type.is_some_and(|t| {
        let essence = t.split(';').next().unwrap_or("").trim();
        essence.eq_ignore_ascii_case("application/json")
    });
    let read = axum::body::to_bytes(body, MAX_BODY_BYTES);
    let bytes: Bytes = tokio::time::timeout(crate::conns::BODY_READ_TIMEOUT, read)
        .await
        .map_err(|_| {
            ApiError::new(
                ErrorCode::RequestTimeout,
                format!(
                    "the request body did not arrive within {} s",
                    crate::conns::BODY_READ_TIMEOUT.as_secs()
                ),
            )
        })?
        .map_err(|_| {
            ApiError::new(
                ErrorCode::BodyTooLarge,
                format!("the request body exceeds the limit of {MAX_BODY_BYTES} bytes"),
            )
        })?;
    let empty = bytes.iter().all(u8::is_ascii_whitespace);
    if let (Some(t), false) = (content_type, json) {
        return Err(ApiError::new(
            ErrorCode::UnsupportedMediaType,
            format!("Content-Type '{t}' is not application/json"),
        ));
    }
    if empty {
        return parse_object(b"{}");
    }
    if !json {
        return Err(ApiError::new(
            ErrorCode::UnsupportedMediaType,
            "a request body needs Content-Type: application/json",
        ));
    }
    parse_object(&bytes)
}

/// Parses a JSON object (not an array or a scalar) as `T`, naming the field on an error.
fn parse_object<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, ApiError> {
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace());
    if first != Some(&b'{') {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object ({...})",
        ));
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path.is_empty() || path == "." {
            ApiError::bad_request(format!("invalid JSON body: {inner}"))
        } else {
            ApiError::bad_request(format!("{path}: {inner}"))
        }
    })
}

/// `null` is the field left out: every optional field reads it as its default.
fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

fn parse_session(field: &str, v: &str) -> Result<SessionId, ApiError> {
    SessionId::parse(v).ok_or_else(|| {
        ApiError::bad_request(format!(
            "{field} '{v}' is not a session id (expected s_ and up to 16 hex digits)"
        ))
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OpenSessionBody {
    #[serde(default, deserialize_with = "null_default")]
    client: String,
    ttl_s: Option<u64>,
    #[serde(default, deserialize_with = "null_default")]
    namespace: String,
}

async fn open_session(State(svc): State<Arc<Service>>, headers: HeaderMap, b: Body) -> Response {
    let start = Instant::now();
    let r = async {
        let b: OpenSessionBody = body(&headers, b).await?;
        // Range-checked by the namespace (ttl_out_of_range, as on gRPC); 0 = its default.
        let ttl_ms = b.ttl_s.unwrap_or(0).saturating_mul(1000);
        let opened = svc
            .open_session(&b.client, ttl_ms, &b.namespace, &credentials(&headers))
            .await?;
        let ttl_s = opened.ttl_ms / 1000;
        Ok(json!({
            "session_id": opened.session.to_string(),
            "ttl_s": ttl_s,
            "ttl_ms": opened.ttl_ms,
            "keepalive_every_s": (ttl_s / 3).max(1),
            "group": opened.group,
        }))
    }
    .await;
    finish(&svc, "open_session", start, r)
}

/// The body of `POST /v1/sessions/{id}:keepalive` (empty: every group).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KeepaliveBody {
    /// The lock groups to renew the lease in (empty or absent: every lock group).
    #[serde(default, deserialize_with = "null_default")]
    groups: Vec<u32>,
}

/// `POST /v1/sessions/{id}:keepalive`.
async fn keepalive(svc: Arc<Service>, headers: HeaderMap, id: String, b: Body) -> Response {
    let start = Instant::now();
    let r = async {
        let session = parse_session("session id", &id)?;
        let b: KeepaliveBody = body(&headers, b).await?;
        let report = svc
            .keepalive(session, &b.groups, &credentials(&headers))
            .await?;
        Ok(keepalive_json(&report))
    }
    .await;
    finish(&svc, "keepalive", start, r)
}

/// A keepalive's report: the lease to count on, and what each group said (docs/API.md).
fn keepalive_json(r: &KeepaliveReport) -> serde_json::Value {
    let groups: Vec<_> = r
        .groups
        .iter()
        .map(|(group, lease)| match lease {
            GroupLease::Extended {
                ttl_ms,
                group_moves,
            } => json!({
                "group": group,
                "state": "extended",
                "ttl_ms": ttl_ms,
                "group_moves": group_moves,
            }),
            GroupLease::NotHere => json!({"group": group, "state": "not_here"}),
            GroupLease::Unreachable { error } => {
                json!({"group": group, "state": "unreachable", "error": error})
            }
        })
        .collect();
    json!({"ttl_s": r.ttl_ms / 1000, "ttl_ms": r.ttl_ms, "groups": groups})
}

async fn close_session(
    State(svc): State<Arc<Service>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let start = Instant::now();
    let r = async {
        let session = parse_session("session id", &id)?;
        let released = svc.close_session(session, &credentials(&headers)).await?;
        Ok(json!({"closed": true, "released": released}))
    }
    .await;
    finish(&svc, "close_session", start, r)
}

async fn get_session(
    State(svc): State<Arc<Service>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let start = Instant::now();
    let r = async {
        let session = parse_session("session id", &id)?;
        let d = svc.session_info(session, &credentials(&headers)).await?;
        Ok(json!({
            "session_id": d.session.to_string(),
            "client": d.client,
            "ttl_ms": d.ttl_ms,
            "held": d.held.iter().map(|(g, n, t)| json!({"name": n, "token": t, "group": g})).collect::<Vec<_>>(),
            "waits": d.waits.iter().map(|(g, n, p)| json!({"name": n, "queue_position": p, "group": g})).collect::<Vec<_>>(),
            "unavailable_groups": d.unavailable,
        }))
    }
    .await;
    finish(&svc, "get_session", start, r)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    after: Option<String>,
    limit: Option<u64>,
}

async fn list_sessions(
    State(svc): State<Arc<Service>>,
    headers: HeaderMap,
    q: Result<axum::extract::Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let start = Instant::now();
    let r = async {
        let q = q
            .map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))?
            .0;
        let after = q
            .after
            .as_deref()
            .map(|a| parse_session("after", a))
            .transpose()?;
        let limit = usize::try_from(q.limit.unwrap_or(0)).unwrap_or(usize::MAX);
        let page = svc
            .list_sessions(after, limit, &credentials(&headers))
            .await?;
        Ok(json!({"sessions": page.iter().map(|s| json!({
            "session_id": s.session.to_string(), "client": s.client, "ttl_ms": s.ttl_ms,
            "held": s.held, "waits": s.waits,
        })).collect::<Vec<_>>()}))
    }
    .await;
    finish(&svc, "list_sessions", start, r)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ContentionQuery {
    top: Option<u64>,
    #[serde(default)]
    namespace: String,
}

/// The web dashboard: one self-contained page (no CDN, works offline) that reads only the
/// public API with the credential typed into it. Its policy lets it talk to this origin only.
const UI_PAGE: &str = include_str!("../ui/index.html");

/// `GET /ui`: the dashboard page.
async fn ui() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; \
                 connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; \
                 base-uri 'none'; form-action 'none'",
            ),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        UI_PAGE,
    )
        .into_response()
}

/// `GET /v1/contention?top=N&namespace=NS`: the hottest names (`Service::contention`).
async fn contention(
    State(svc): State<Arc<Service>>,
    headers: HeaderMap,
    q: Result<axum::extract::Query<ContentionQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let start = Instant::now();
    let r = async {
        let q = q
            .map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))?
            .0;
        let top = usize::try_from(q.top.unwrap_or(10)).unwrap_or(usize::MAX);
        let view = svc
            .contention(top, &q.namespace, &credentials(&headers))
            .await?;
        serde_json::to_value(view).map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))
    }
    .await;
    finish(&svc, "contention", start, r)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AcquireBody {
    session_id: String,
    #[serde(default, deserialize_with = "null_default")]
    owner: String,
    #[serde(default, deserialize_with = "null_default")]
    mode: Option<String>,
    limit: Option<u64>,
    wait_ms: Option<u64>,
    #[serde(default, deserialize_with = "null_default")]
    reentrant: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HoldBody {
    session_id: String,
    token: u64,
}

/// `:check`'s body: the fencing token to check.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CheckBody {
    token: u64,
}

/// The mode and limit as gRPC's `mode_of` reads them: a semaphore's limit (absent = 0) is
/// range-checked by `limits::check_acquire_args`, so both transports refuse it with
/// `invalid_semaphore_limit`.
fn parse_mode(mode: Option<&str>, limit: Option<u64>) -> Result<LockMode, ApiError> {
    match (mode.unwrap_or("exclusive"), limit) {
        ("exclusive", None | Some(0)) => Ok(LockMode::Exclusive),
        ("shared", None | Some(0)) => Ok(LockMode::Shared),
        ("semaphore", n) => {
            let n = n.unwrap_or(0);
            let mode = LockMode::Semaphore {
                limit: u32::try_from(n).unwrap_or(u32::MAX),
            };
            limits::check_acquire_args(mode, 0).map_err(|e| {
                let mut e = ApiError::from(e);
                e.message = format!(
                    "semaphore limit {n} must be within 1..={}",
                    limits::MAX_SEMAPHORE_LIMIT
                );
                e
            })?;
            Ok(mode)
        }
        ("exclusive" | "shared", Some(_)) => {
            Err(ApiError::bad_request("limit is only for mode semaphore"))
        }
        (other, _) => Err(ApiError::bad_request(format!(
            "mode '{other}' is not exclusive, shared or semaphore"
        ))),
    }
}

/// `POST /v1/locks/{name}:acquire|release|extend` (the verb is one of [`LOCK_VERBS`]).
async fn lock_verb(
    svc: Arc<Service>,
    name: String,
    verb: &str,
    headers: HeaderMap,
    b: Body,
) -> Response {
    let start = Instant::now();
    let creds = credentials(&headers);
    let name = name.as_str();
    let (op, r) = match verb {
        "acquire" => ("acquire", acquire(&svc, name, &headers, b, &creds).await),
        "release" => {
            let r = async {
                let b: HoldBody = body(&headers, b).await?;
                let session = parse_session("session_id", &b.session_id)?;
                let remaining = svc.release(session, name, b.token, &creds).await?;
                Ok(json!({"released": true, "remaining": remaining}))
            };
            ("release", r.await)
        }
        "extend" => {
            let r = async {
                let b: HoldBody = body(&headers, b).await?;
                let session = parse_session("session_id", &b.session_id)?;
                let lease_ttl_ms = svc.extend(session, name, b.token, &creds).await?;
                Ok(json!({"lease_ttl_ms": lease_ttl_ms}))
            };
            ("extend", r.await)
        }
        "check" => {
            let r = async {
                let b: CheckBody = body(&headers, b).await?;
                let c = svc.check_token(name, b.token, &creds).await?;
                Ok(json!({"valid": c.valid, "newest_token": c.newest}))
            };
            ("check", r.await)
        }
        other => (
            "unknown",
            Err(ApiError::new(
                ErrorCode::NotFound,
                format!("unknown lock verb ':{other}' (use :acquire, :release, :extend or :check)"),
            )),
        ),
    };
    finish(&svc, op, start, r)
}

/// `POST /v1/locks/{name}:acquire`.
async fn acquire(
    svc: &Service,
    name: &str,
    headers: &HeaderMap,
    b: Body,
    creds: &Credentials,
) -> Result<serde_json::Value, ApiError> {
    let b: AcquireBody = body(headers, b).await?;
    let req = AcquireRequest {
        session: parse_session("session_id", &b.session_id)?,
        name: name.to_string(),
        owner: b.owner,
        mode: parse_mode(b.mode.as_deref(), b.limit)?,
        wait_ms: b.wait_ms.unwrap_or(0),
        reentrant: b.reentrant,
    };
    Ok(match svc.acquire(req, creds).await? {
        AcquireOutcome::Acquired {
            token,
            lease_ttl_ms,
            reentry,
            group,
            group_moves,
            adopted_in,
            renewed,
        } => {
            let mut r = json!({
                "acquired": true,
                "token": token,
                "lease_ttl_ms": lease_ttl_ms,
                "reentry": reentry,
                "group": group,
                "group_moves": group_moves,
                "lease_started": adopted_in.contains(&group),
            });
            adopted_in_json(&mut r, adopted_in);
            if let Some(renewed) = renewed {
                r["renewed"] = json!({
                    "ttl_ms": renewed.ttl_ms,
                    "group_moves": renewed.group_moves,
                });
            }
            r
        }
        AcquireOutcome::NotAcquired {
            holder,
            queue_position,
            lock_delay_until_ms,
            wait_estimate_ms,
            adopted_in,
        } => {
            let mut r = json!({
                "acquired": false,
                "holder": holder,
                "queue_position": queue_position,
                "lock_delay_until_ms": lock_delay_until_ms,
                "wait_estimate_ms": wait_estimate_ms,
            });
            adopted_in_json(&mut r, adopted_in);
            r
        }
    })
}

/// The groups an acquire brought its session into, when there are any (docs/API.md).
fn adopted_in_json(r: &mut serde_json::Value, adopted_in: Vec<u32>) {
    if !adopted_in.is_empty() {
        r["adopted_in"] = json!(adopted_in);
    }
}

async fn inspect(
    State(svc): State<Arc<Service>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    let start = Instant::now();
    let r = async {
        let info = svc.inspect(&name, &credentials(&headers)).await?;
        Ok(lock_json(&svc, &name, info))
    }
    .await;
    finish(&svc, "inspect", start, r)
}

/// A session id as inspect shows it: `null` where it is hidden (only the admin sees them).
fn shown(s: SessionId) -> Option<String> {
    (s.0 != 0).then(|| s.to_string())
}

/// The lock record as GUIDE §4 shows it; a free name has no holder and no waiters.
fn lock_json(svc: &Service, name: &str, info: Option<lockd_core::LockInfo>) -> Value {
    let Some(i) = info else {
        return json!({"name": name, "namespace": svc.namespace_name(name), "mode": null, "holder": null, "holders": [], "token": null,
                      "held_for_ms": null, "reentry": 0, "waiters": [], "queue": [], "lock_delay_until_ms": null});
    };
    let first = i.holders.first();
    json!({
        "name": i.name,
        "namespace": i.namespace,
        "mode": first.map(|h| h.mode.as_str()),
        "limit": first.and_then(|h| match h.mode { LockMode::Semaphore { limit } => Some(limit), _ => None }),
        "holder": first.map(|h| json!({"session": shown(h.session), "owner": h.owner})),
        "holders": i.holders.iter().map(|h| json!({
            "session": shown(h.session), "owner": h.owner, "token": h.token,
            "mode": h.mode.as_str(), "held_for_ms": h.held_for_ms, "reentry": h.reentry,
        })).collect::<Vec<_>>(),
        "token": first.map(|h| h.token),
        "held_for_ms": first.map(|h| h.held_for_ms),
        "reentry": first.map_or(0, |h| h.reentry),
        "waiters": i.waiters.iter().map(|w| shown(w.session)).collect::<Vec<_>>(),
        "queue": i.waiters.iter().map(|w| json!({
            "session": shown(w.session), "owner": w.owner, "mode": w.mode.as_str(),
            "position": w.position, "waited_ms": w.waited_ms,
        })).collect::<Vec<_>>(),
        "lock_delay_until_ms": i.lock_delay_until_ms,
    })
}

fn members_json(groups: Vec<crate::admin::GroupMembers>) -> Value {
    let groups: Vec<Value> = groups
        .into_iter()
        .map(|g| {
            let m = &g.membership;
            let members: Vec<Value> = m
                .members()
                .into_iter()
                .map(|id| {
                    json!({
                        "node_id": id,
                        "peer_addr": m.addrs.get(&id),
                        "role": crate::admin::role(m, id),
                        "leader": m.leader == Some(id),
                        "lag": m.lag.get(&id).copied().flatten(),
                        "draining": g.draining.contains(&id),
                        "zone": g.zones.get(&id),
                        "last_contact_ms": m.last_contact_ms(id),
                        "reachable": m.reachable(id),
                    })
                })
                .collect();
            json!({"group": g.group, "leader": m.leader, "joint": m.joint, "members": members})
        })
        .collect();
    json!({ "groups": groups })
}

async fn list_members(State(svc): State<Arc<Service>>, headers: HeaderMap) -> Response {
    let start = Instant::now();
    let r = async {
        Ok(members_json(
            svc.list_members(&credentials(&headers)).await?,
        ))
    }
    .await;
    finish(&svc, "list_members", start, r)
}

/// Every member node's own report (`status.rs`).
async fn cluster_status(State(svc): State<Arc<Service>>, headers: HeaderMap) -> Response {
    let start = Instant::now();
    let r = async {
        let nodes = svc.cluster_status(&credentials(&headers)).await?;
        Ok(json!({ "nodes": nodes }))
    }
    .await;
    finish(&svc, "cluster_status", start, r)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddMemberBody {
    node_id: u64,
    peer_addr: String,
    #[serde(default, deserialize_with = "null_default")]
    groups: Vec<u32>,
    #[serde(default, deserialize_with = "null_default")]
    allow_zone_majority: bool,
}

async fn add_member(State(svc): State<Arc<Service>>, headers: HeaderMap, b: Body) -> Response {
    let start = Instant::now();
    let r = async {
        let creds = credentials(&headers);
        // Refuse an unauthenticated caller before telling it anything about the body.
        svc.require_admin(&creds, "adding a member")?;
        let b: AddMemberBody = body(&headers, b).await?;
        let groups = svc
            .add_member(
                &creds,
                b.node_id,
                &b.peer_addr,
                &b.groups,
                b.allow_zone_majority,
            )
            .await?;
        Ok(members_json(groups))
    }
    .await;
    finish(&svc, "add_member", start, r)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GroupsQuery {
    /// Comma-separated group ids; absent = every group.
    groups: Option<String>,
    /// `true`: remove even if a zone would then hold a majority of a group's voters.
    #[serde(default)]
    allow_zone_majority: bool,
}

async fn remove_member(
    State(svc): State<Arc<Service>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    q: Result<axum::extract::Query<GroupsQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let start = Instant::now();
    let r = async {
        let creds = credentials(&headers);
        svc.require_admin(&creds, "removing a member")?;
        let id: u64 = id
            .parse()
            .map_err(|_| ApiError::bad_request(format!("node id '{id}' is not a number")))?;
        let q = q
            .map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))?
            .0;
        let groups = match q.groups.as_deref() {
            None | Some("") => Vec::new(),
            Some(list) => list
                .split(',')
                .map(|g| {
                    // Decimal without sign, spaces or leading zero (the spec's pattern).
                    let canonical =
                        g.bytes().all(|b| b.is_ascii_digit()) && (g == "0" || !g.starts_with('0'));
                    g.parse::<u32>().ok().filter(|_| canonical).ok_or_else(|| {
                        ApiError::bad_request(format!(
                            "groups: '{g}' is not a group id (0-4294967295)"
                        ))
                    })
                })
                .collect::<Result<_, _>>()?,
        };
        let allow = q.allow_zone_majority;
        Ok(members_json(
            svc.remove_member(&creds, id, &groups, allow).await?,
        ))
    }
    .await;
    finish(&svc, "remove_member", start, r)
}

/// `POST /v1/admin/members/{id}:drain` and `:undrain` (no body).
async fn set_draining(
    svc: Arc<Service>,
    headers: HeaderMap,
    id: String,
    draining: bool,
) -> Response {
    let start = Instant::now();
    let r = async {
        let creds = credentials(&headers);
        svc.require_admin(&creds, "changing a member")?;
        let id: u64 = id
            .parse()
            .map_err(|_| ApiError::bad_request(format!("node id '{id}' is not a number")))?;
        Ok(members_json(svc.set_draining(&creds, id, draining).await?))
    }
    .await;
    finish(&svc, "set_draining", start, r)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReportBody {
    name: String,
}

/// A client's report about `name` (`POST /v1/reports/...`), counted by `record`.
async fn report(
    svc: &Service,
    headers: &HeaderMap,
    b: Body,
    record: fn(&Service, &str),
) -> Response {
    let start = Instant::now();
    let r = async {
        let b: ReportBody = body(headers, b).await?;
        limits::check_new_name(&b.name).map_err(ApiError::from)?;
        record(svc, &b.name);
        Ok(json!({"recorded": true}))
    }
    .await;
    finish(svc, "report", start, r)
}

async fn report_lease_expired(
    State(svc): State<Arc<Service>>,
    headers: HeaderMap,
    b: Body,
) -> Response {
    report(&svc, &headers, b, Service::report_lease_expired).await
}

async fn report_fencing_rejected(
    State(svc): State<Arc<Service>>,
    headers: HeaderMap,
    b: Body,
) -> Response {
    report(&svc, &headers, b, Service::report_fencing_rejected).await
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct WatchQuery {
    name: Option<String>,
    prefix: Option<String>,
    after: Option<String>,
}

/// `GET /v1/watch?name=N | prefix=P [&after=POSITIONS]`: Server-Sent Events, one per change
/// (`event:` its kind, `data:` JSON, `id:` the positions to resume after). An EventSource that
/// reconnects sends the last id as `Last-Event-ID`, which wins over `after`. A watch that must
/// end says why in an `error` event first.
async fn watch(
    State(svc): State<Arc<Service>>,
    headers: HeaderMap,
    q: Result<axum::extract::Query<WatchQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    use crate::watches::{format_positions, parse_positions};
    use axum::response::sse::{Event, KeepAlive, Sse};
    let start = Instant::now();
    let opened = (|| {
        let q = q
            .map_err(|e| ApiError::bad_request(format!("invalid query: {e}")))?
            .0;
        let after = match headers.get("last-event-id") {
            Some(v) => parse_positions(v.to_str().map_err(|_| {
                ApiError::bad_request("Last-Event-ID: not ASCII; send back the id an event had")
            })?)?,
            None => parse_positions(q.after.as_deref().unwrap_or(""))?,
        };
        svc.watch(
            q.name.as_deref().unwrap_or(""),
            q.prefix.as_deref().unwrap_or(""),
            &after,
            &credentials(&headers),
        )
    })();
    let (w, admin) = match opened {
        Ok(x) => x,
        Err(e) => return finish(&svc, "watch", start, Err(e)),
    };
    svc.metrics.record("http", "watch", "ok", start.elapsed());
    let rx = crate::watches::pump(
        w,
        move |d, positions| {
            Event::default()
                .event(crate::watches::kind(d.event()))
                .id(format_positions(positions))
                .data(&*d.json(admin))
        },
        |e| {
            Event::default()
                .event("error")
                .data(json!({"error": {"code": e.code.name(), "message": e.message}}).to_string())
        },
    );
    let events = futures::StreamExt::map(
        tokio_stream::wrappers::ReceiverStream::new(rx),
        Ok::<_, std::convert::Infallible>,
    );
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(std::time::Duration::from_secs(15)))
        .into_response()
}

async fn status(State(svc): State<Arc<Service>>) -> Response {
    axum::Json(svc.status_json()).into_response()
}

/// `GET /livez`: the process answers HTTP (a liveness probe; restart it only if this fails).
async fn livez() -> Response {
    axum::Json(json!({"live": true})).into_response()
}

/// `GET /readyz`: 200 once this node serves names and every group it votes in has a reachable
/// leader and has caught up since the start (applied the commit its leader first reported);
/// else 503 naming each reason (a readiness probe: send clients elsewhere meanwhile).
async fn readyz(State(svc): State<Arc<Service>>) -> Response {
    let why = svc.not_ready();
    if why.is_empty() {
        // A sabotaged node (lockd-check's negative controls) says so wherever it is looked at.
        let controls = svc.node.negative_controls();
        if !controls.is_empty() {
            let body = json!({"ready": true, "unsafe_negative_controls": controls});
            return axum::Json(body).into_response();
        }
        return axum::Json(json!({"ready": true})).into_response();
    }
    error_response(
        ApiError::new(
            ErrorCode::Unavailable,
            format!("not ready: {}", why.join("; ")),
        )
        .retry_after(1000),
    )
}

/// `GET /metrics` on the client port: the series name every namespace, so once one has a token
/// they are the admin's to read (the probes port, `--probes`, serves them to whoever reaches it).
async fn client_metrics(State(svc): State<Arc<Service>>, headers: HeaderMap) -> Response {
    match svc.authorize_metrics(&credentials(&headers)) {
        Ok(()) => metrics(State(svc)).await,
        Err(e) => error_response(e),
    }
}

async fn metrics(State(svc): State<Arc<Service>>) -> Response {
    svc.metrics.set_ready(svc.not_ready().is_empty());
    let text = svc
        .metrics
        .render(&svc.node, &svc.waits.counters, &svc.waits.watch);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbs_split_at_the_last_literal_colon() {
        let split = |path: &str| {
            let uri: Uri = path.parse().unwrap();
            let u = under(&uri, "/v1/locks/").unwrap();
            (u.whole, u.verb.map(|(h, v)| (h, v.to_string())))
        };
        assert_eq!(
            split("/v1/locks/payouts%2Fm-1:acquire"),
            (
                "payouts/m-1:acquire".into(),
                Some(("payouts/m-1".into(), "acquire".into()))
            )
        );
        assert_eq!(
            split("/v1/locks/a:b:release").1,
            Some(("a:b".into(), "release".into()))
        );
        // An encoded colon is the name's own.
        assert_eq!(
            split("/v1/locks/job%3Arelease"),
            ("job:release".into(), None)
        );
        assert_eq!(split("/v1/locks/plain"), ("plain".into(), None));
        let bad: Uri = "/v1/locks/%FF:acquire".parse().unwrap();
        assert_eq!(under(&bad, "/v1/locks/").err().unwrap().status, 400);
    }

    #[test]
    fn modes_parse_with_their_limits() {
        assert_eq!(parse_mode(None, None).unwrap(), LockMode::Exclusive);
        assert_eq!(parse_mode(Some("shared"), None).unwrap(), LockMode::Shared);
        assert_eq!(
            parse_mode(Some("semaphore"), Some(3)).unwrap(),
            LockMode::Semaphore { limit: 3 }
        );
        // No limit is limit 0, as on gRPC; both are the core's invalid_semaphore_limit.
        for limit in [None, Some(0), Some(10_001), Some(1 << 40)] {
            let e = parse_mode(Some("semaphore"), limit).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidSemaphoreLimit, "{limit:?}");
            let n = limit.unwrap_or(0);
            assert!(
                e.message
                    .contains(&format!("limit {n} must be within 1..=10000")),
                "{e}"
            );
        }
        assert!(parse_mode(Some("shared"), Some(2)).is_err());
        assert!(parse_mode(Some("rw"), None)
            .unwrap_err()
            .message
            .contains("'rw'"));
    }
}

async fn shard_view(State(svc): State<Arc<Service>>, headers: HeaderMap) -> Response {
    let start = Instant::now();
    let r = async {
        let v = svc.shard_view(&credentials(&headers)).await?;
        let groups: Vec<Value> = v
            .groups
            .iter()
            .map(|g| {
                json!({
                    "group": g.group,
                    "buckets": g.in_map.to_string(),
                    "bucket_count": g.in_map.len(),
                    "owned": g.owned.to_string(),
                    "frozen": g.frozen.to_string(),
                })
            })
            .collect();
        Ok(json!({ "map_version": v.map_version, "groups": groups }))
    }
    .await;
    finish(&svc, "shard_view", start, r)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MoveBucketsBody {
    /// `"0-63,100"`: buckets and inclusive ranges.
    buckets: String,
    to_group: u32,
}

async fn move_buckets(State(svc): State<Arc<Service>>, headers: HeaderMap, b: Body) -> Response {
    let start = Instant::now();
    let r = async {
        let creds = credentials(&headers);
        svc.require_admin(&creds, "moving buckets")?;
        let b: MoveBucketsBody = body(&headers, b).await?;
        let buckets: lockd_core::BucketSet = b
            .buckets
            .parse()
            .map_err(|e| ApiError::bad_request(format!("buckets: {e}")))?;
        let m = svc.move_buckets(&creds, &buckets, b.to_group).await?;
        Ok(json!({
            "chunks": m.chunks,
            "buckets_moved": m.buckets,
            "locks": m.locks,
            "holders": m.holders,
            "waits_requeued": m.waits_requeued,
            "resumed": m.resumed,
            "map_version": m.map_version,
            "elapsed_ms": m.elapsed_ms,
        }))
    }
    .await;
    finish(&svc, "move_buckets", start, r)
}

fn group_json(group: u32, r: &lockd_core::GroupRecord) -> Value {
    json!({
        "group": group,
        "nodes": r.replicas,
        "born_epoch": r.born_epoch,
        "ready": r.ready,
        "placed_at": {"term": r.placed_at.term, "index": r.placed_at.index},
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateGroupBody {
    group: u32,
    nodes: Vec<u64>,
    #[serde(default, deserialize_with = "null_default")]
    allow_zone_majority: bool,
}

async fn create_group(State(svc): State<Arc<Service>>, headers: HeaderMap, b: Body) -> Response {
    let start = Instant::now();
    let r = async {
        let creds = credentials(&headers);
        svc.require_admin(&creds, "creating a group")?;
        let b: CreateGroupBody = body(&headers, b).await?;
        let record = svc
            .create_group(&creds, b.group, &b.nodes, b.allow_zone_majority)
            .await?;
        Ok(group_json(b.group, &record))
    }
    .await;
    finish(&svc, "create_group", start, r)
}

/// `GET /v1/admin/backup`: the backup document (`backup.rs`) that `lockd restore` reads.
async fn backup(State(svc): State<Arc<Service>>, headers: HeaderMap) -> Response {
    let start = Instant::now();
    let r = async {
        let b = svc.backup(&credentials(&headers)).await?;
        serde_json::to_value(b).map_err(|e| ApiError::new(ErrorCode::Internal, e.to_string()))
    }
    .await;
    finish(&svc, "backup", start, r)
}

/// `DELETE /v1/admin/groups/{id}`: removes a lock group that owns no bucket.
async fn remove_group(
    State(svc): State<Arc<Service>>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let start = Instant::now();
    let r = async {
        let creds = credentials(&headers);
        svc.require_admin(&creds, "removing a group")?;
        let group: u32 = id.parse().map_err(|_| {
            ApiError::bad_request(format!(
                "group: '{id}' is not a group id (a lock group is 1-4294967295)"
            ))
        })?;
        svc.remove_group(&creds, group).await?;
        Ok(json!({ "group": group, "removed": true }))
    }
    .await;
    finish(&svc, "remove_group", start, r)
}

async fn list_groups(State(svc): State<Arc<Service>>, headers: HeaderMap) -> Response {
    let start = Instant::now();
    let r = async {
        let creds = credentials(&headers);
        let groups = svc.list_groups(&creds).await?;
        let groups: Vec<Value> = groups.iter().map(|(g, r)| group_json(*g, r)).collect();
        Ok(json!({ "groups": groups }))
    }
    .await;
    finish(&svc, "list_groups", start, r)
}

/// A namespace in a put's body: the fields of the proto's `NamespaceSpec`, each optional (a
/// missing limit takes the built-in default, as 0 does).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct NamespaceBody {
    name: String,
    #[serde(default, deserialize_with = "null_default")]
    prefix: String,
    #[serde(default, deserialize_with = "null_default")]
    min_ttl_ms: u64,
    #[serde(default, deserialize_with = "null_default")]
    max_ttl_ms: u64,
    #[serde(default, deserialize_with = "null_default")]
    default_ttl_ms: u64,
    #[serde(default, deserialize_with = "null_default")]
    max_waiters_per_name: u32,
    #[serde(default, deserialize_with = "null_default")]
    max_locks_per_session: u32,
    #[serde(default, deserialize_with = "null_default")]
    lock_delay_ms: u64,
    #[serde(default, deserialize_with = "null_default")]
    ops_per_s: u32,
    #[serde(default, deserialize_with = "null_default")]
    max_sessions: u32,
    #[serde(default, deserialize_with = "null_default")]
    safety: String,
    #[serde(default, deserialize_with = "null_default")]
    fenced_resource: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PutNamespaceBody {
    expected_version: u64,
    namespace: NamespaceBody,
    #[serde(default)]
    bearer_token: Option<String>,
    #[serde(default, deserialize_with = "null_default")]
    clear_token: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DeleteNamespaceBody {
    expected_version: u64,
    name: String,
}

fn namespace_json(spec: &lockd_proto::v1::NamespaceSpec) -> Value {
    json!({
        "name": spec.name,
        "prefix": spec.prefix,
        "min_ttl_ms": spec.min_ttl_ms,
        "max_ttl_ms": spec.max_ttl_ms,
        "default_ttl_ms": spec.default_ttl_ms,
        "max_waiters_per_name": spec.max_waiters_per_name,
        "max_locks_per_session": spec.max_locks_per_session,
        "lock_delay_ms": spec.lock_delay_ms,
        "ops_per_s": spec.ops_per_s,
        "max_sessions": spec.max_sessions,
        "safety": spec.safety,
        "fenced_resource": (!spec.fenced_resource.is_empty()).then_some(&spec.fenced_resource),
        "token_required": spec.token_required,
    })
}

async fn list_namespaces(State(svc): State<Arc<Service>>, headers: HeaderMap) -> Response {
    let start = Instant::now();
    let r = async {
        let (version, all) = svc.namespace_config(&credentials(&headers)).await?;
        let all: Vec<Value> = all
            .iter()
            .map(|n| namespace_json(&crate::namespaces::spec_of(n)))
            .collect();
        Ok(json!({ "version": version, "namespaces": all }))
    }
    .await;
    finish(&svc, "list_namespaces", start, r)
}

async fn put_namespace(State(svc): State<Arc<Service>>, headers: HeaderMap, b: Body) -> Response {
    let start = Instant::now();
    let r = async {
        let creds = credentials(&headers);
        svc.require_admin(&creds, "changing namespaces")?;
        let b: PutNamespaceBody = body(&headers, b).await?;
        let token = crate::namespaces::TokenChange::from_fields(b.bearer_token, b.clear_token)?;
        let n = b.namespace;
        let spec = lockd_proto::v1::NamespaceSpec {
            name: n.name,
            prefix: n.prefix,
            min_ttl_ms: n.min_ttl_ms,
            max_ttl_ms: n.max_ttl_ms,
            default_ttl_ms: n.default_ttl_ms,
            max_waiters_per_name: n.max_waiters_per_name,
            max_locks_per_session: n.max_locks_per_session,
            lock_delay_ms: n.lock_delay_ms,
            ops_per_s: n.ops_per_s,
            max_sessions: n.max_sessions,
            safety: n.safety,
            fenced_resource: n.fenced_resource,
            token_required: false,
        };
        let version = svc
            .put_namespace(&creds, b.expected_version, spec, token)
            .await?;
        Ok(json!({ "version": version }))
    }
    .await;
    finish(&svc, "put_namespace", start, r)
}

async fn delete_namespace(
    State(svc): State<Arc<Service>>,
    headers: HeaderMap,
    b: Body,
) -> Response {
    let start = Instant::now();
    let r = async {
        let creds = credentials(&headers);
        svc.require_admin(&creds, "changing namespaces")?;
        let b: DeleteNamespaceBody = body(&headers, b).await?;
        let version = svc
            .delete_namespace(&creds, b.expected_version, &b.name)
            .await?;
        Ok(json!({ "version": version }))
    }
    .await;
    finish(&svc, "delete_namespace", start, r)
}
