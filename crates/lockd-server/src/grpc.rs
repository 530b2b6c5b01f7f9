//! The gRPC client API (proto/lockd/v1/lockd.proto): unary calls mirroring HTTP, and the
//! `Session` stream that carries a client process's keepalives, acquires and releases up, and
//! replies, pushed grants and notices down.
//!
//! Both transports call the same [`Service`]; this file only converts messages and errors.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use futures::stream::FuturesUnordered;
use futures::{Stream, StreamExt};
use lockd_core::{LockInfo, LockMode, SessionEndReason, SessionId, WaitEndReason};
use lockd_proto::v1 as pb;
use lockd_proto::v1::lock_server::Lock;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status, Streaming};

use crate::error::{ApiError, Code};
use crate::service::{
    AcquireOutcome, AcquireRequest, AcquireStart, Credentials, GroupLease, KeepaliveReport, Service,
};
use crate::waits::SessionEvent;

/// Streams (calls, session streams, watches) one client gRPC connection may have open at
/// once; HTTP/2 tells the client, which queues the next one until a stream ends.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 1024;

pub struct GrpcApi {
    svc: Arc<Service>,
}

impl GrpcApi {
    pub fn new(svc: Arc<Service>) -> GrpcApi {
        GrpcApi { svc }
    }

    /// Records the metric and converts the error.
    fn finish<T>(
        &self,
        op: &'static str,
        start: Instant,
        r: Result<T, ApiError>,
    ) -> Result<Response<T>, Status> {
        self.finish_as(op, "ok", start, r)
    }

    /// [`finish`](Self::finish), with `result` as the metric's label when `r` is `Ok`.
    fn finish_as<T>(
        &self,
        op: &'static str,
        result: &'static str,
        start: Instant,
        r: Result<T, ApiError>,
    ) -> Result<Response<T>, Status> {
        match r {
            Ok(v) => {
                self.svc.metrics.record("grpc", op, result, start.elapsed());
                Ok(Response::new(v))
            }
            Err(e) => {
                self.svc
                    .metrics
                    .record("grpc", op, e.code.name(), start.elapsed());
                Err(status(e))
            }
        }
    }
}

/// The longest status message sent, in bytes.
const MAX_STATUS_MESSAGE: usize = 1_024;

/// The gRPC status for an API error: the stable code as a `google.rpc.ErrorInfo` (domain
/// "lockd", reason `WAIT_TOO_LONG`) and the retry hint as a `google.rpc.RetryInfo` in the
/// standard details, so interceptors in any language read them; the same in lockd's metadata.
pub fn status(e: ApiError) -> Status {
    use tonic::Code;
    use tonic_types::{ErrorDetails, StatusExt};
    let code = match e.status {
        400 => Code::InvalidArgument,
        401 => Code::Unauthenticated,
        403 => Code::PermissionDenied,
        404 => Code::NotFound,
        409 => Code::FailedPrecondition,
        410 => Code::OutOfRange,
        413 | 429 => Code::ResourceExhausted,
        503 => Code::Unavailable,
        _ => Code::Internal,
    };
    let mut details = ErrorDetails::new();
    details.set_error_info(
        e.code.reason(),
        "lockd",
        std::collections::HashMap::<String, String>::new(),
    );
    if let Some(ms) = e.retry_after_ms {
        details.set_retry_info(Some(std::time::Duration::from_millis(ms)));
    }
    // The message rides in a header (`grpc-message`): a long one (a bucket list, say) would
    // break the response, so it is cut at a character boundary, saying so.
    let mut message = e.message;
    if message.len() > MAX_STATUS_MESSAGE {
        let mut end = MAX_STATUS_MESSAGE;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push_str(" … (cut)");
    }
    let mut s = Status::with_error_details(code, message, details);
    if let Ok(v) = e.code.name().parse() {
        s.metadata_mut().insert("lockd-error-code", v);
    }
    if let Some(ms) = e.retry_after_ms {
        if let Ok(v) = ms.to_string().parse() {
            s.metadata_mut().insert("lockd-retry-after-ms", v);
        }
    }
    s
}

fn session_id(field: &str, v: &str) -> Result<SessionId, ApiError> {
    SessionId::parse(v)
        .ok_or_else(|| ApiError::bad_request(format!("{field} '{v}' is not a session id")))
}

/// A `session_id` on a request sent down a session stream: empty, or the stream's own session.
/// Any other value is refused rather than ignored, so a client that meant another session
/// learns it at once instead of acting for the wrong one.
fn same_session(v: &str, stream: SessionId) -> Result<(), ApiError> {
    if v.is_empty() {
        return Ok(());
    }
    let s = session_id("session_id", v)?;
    if s == stream {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "session_id '{v}' is not this stream's session {stream}; leave it empty on a stream"
        )))
    }
}

/// A request's own token if it carries one, else the stream's (from its metadata).
fn token_or(token: &str, stream: &Credentials) -> Credentials {
    if token.is_empty() {
        stream.clone()
    } else {
        Credentials {
            bearer: Some(token.to_string()),
            from: stream.from,
        }
    }
}

fn creds<T>(token: &str, req: &Request<T>) -> Credentials {
    let meta = req.metadata();
    let bearer = if token.is_empty() {
        meta.get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::to_string)
    } else {
        Some(token.to_string())
    };
    Credentials {
        bearer,
        from: req.remote_addr().map(|a| a.ip()),
    }
}

fn mode_of(mode: i32, limit: u32) -> Result<LockMode, ApiError> {
    match pb::Mode::try_from(mode) {
        Ok(pb::Mode::Unspecified | pb::Mode::Exclusive) if limit == 0 => Ok(LockMode::Exclusive),
        Ok(pb::Mode::Shared) if limit == 0 => Ok(LockMode::Shared),
        Ok(pb::Mode::Semaphore) => Ok(LockMode::Semaphore { limit }),
        Ok(_) => Err(ApiError::bad_request("limit is only for MODE_SEMAPHORE")),
        Err(_) => Err(ApiError::bad_request(format!(
            "mode {mode} is not a known Mode"
        ))),
    }
}

fn pb_mode(m: LockMode) -> i32 {
    match m {
        LockMode::Exclusive => pb::Mode::Exclusive as i32,
        LockMode::Shared => pb::Mode::Shared as i32,
        LockMode::Semaphore { .. } => pb::Mode::Semaphore as i32,
    }
}

fn acquire_request(r: &pb::AcquireRequest, session: SessionId) -> Result<AcquireRequest, ApiError> {
    Ok(AcquireRequest {
        session,
        name: r.name.clone(),
        owner: r.owner.clone(),
        mode: mode_of(r.mode, r.limit)?,
        wait_ms: r.wait_ms,
        reentrant: r.reentrant,
    })
}

/// One node's entry of a cluster status, as the proto says it.
fn node_status_report(e: crate::status::NodeEntry) -> pb::NodeStatusReport {
    use crate::status::Reported;
    let r = match e.report {
        Reported::Error(error) => {
            return pb::NodeStatusReport {
                node_id: e.node_id,
                peer_addr: e.peer_addr,
                error,
                ..Default::default()
            }
        }
        Reported::Report(r) => r,
    };
    pb::NodeStatusReport {
        node_id: e.node_id,
        peer_addr: e.peer_addr,
        error: String::new(),
        zone: r.zone,
        version: r.version,
        pid: r.pid,
        uptime_s: r.uptime_s,
        ready: r.ready,
        not_ready: r.not_ready,
        replicas: (r.replicas.into_iter())
            .map(|x| pb::ReplicaStatus {
                group: x.group,
                role: x.role,
                leader: x.leader.unwrap_or(0),
                term: x.term,
                committed_index: x.committed_index,
                applied_index: x.applied_index,
                revision: x.revision,
                log_bytes: x.log_bytes,
                snapshot_bytes: x.snapshot_bytes,
            })
            .collect(),
    }
}

/// A lease renewed in `group`, as a keepalive's answer says it.
fn extended(group: lockd_raft::GroupId, r: lockd_raft::Renewed) -> pb::GroupLease {
    pb::GroupLease {
        group,
        state: pb::GroupLeaseState::Extended as i32,
        ttl_ms: r.ttl_ms,
        group_moves: r.group_moves,
        ..Default::default()
    }
}

/// A keepalive's report as the proto says it.
fn keepalive_response(r: KeepaliveReport) -> pb::KeepAliveResponse {
    use pb::GroupLeaseState as State;
    let groups = r
        .groups
        .into_iter()
        .map(|(group, lease)| match lease {
            GroupLease::Extended {
                ttl_ms,
                group_moves,
            } => extended(
                group,
                lockd_raft::Renewed {
                    ttl_ms,
                    group_moves,
                },
            ),
            GroupLease::NotHere => pb::GroupLease {
                group,
                state: State::NotHere as i32,
                ..Default::default()
            },
            GroupLease::Unreachable { error } => pb::GroupLease {
                group,
                state: State::Unreachable as i32,
                error,
                ..Default::default()
            },
        })
        .collect();
    pb::KeepAliveResponse {
        ttl_ms: r.ttl_ms,
        groups,
    }
}

fn acquire_response(o: AcquireOutcome) -> pb::AcquireResponse {
    match o {
        AcquireOutcome::Acquired {
            token,
            lease_ttl_ms,
            reentry,
            group,
            group_moves,
            adopted_in,
            renewed,
        } => pb::AcquireResponse {
            acquired: true,
            fencing_token: token,
            lease_ttl_ms,
            reentry,
            group,
            group_moves,
            lease_started: adopted_in.contains(&group),
            adopted_in,
            renewed: renewed.map(|r| extended(group, r)),
            ..Default::default()
        },
        AcquireOutcome::NotAcquired {
            holder,
            queue_position,
            lock_delay_until_ms,
            wait_estimate_ms,
            adopted_in,
        } => pb::AcquireResponse {
            acquired: false,
            holder: holder.unwrap_or_default(),
            queue_position,
            lock_delay_until_ms: lock_delay_until_ms.unwrap_or(0),
            wait_estimate_ms,
            adopted_in,
            ..Default::default()
        },
    }
}

/// A session id as inspect shows it: empty where it is hidden (only the admin sees them).
fn shown(s: SessionId) -> String {
    if s.0 == 0 {
        String::new()
    } else {
        s.to_string()
    }
}

fn lock_state(svc: &Service, name: &str, info: Option<LockInfo>) -> pb::LockState {
    let Some(i) = info else {
        return pb::LockState {
            name: name.to_string(),
            namespace: svc.namespace_name(name),
            ..Default::default()
        };
    };
    pb::LockState {
        name: i.name,
        namespace: i.namespace,
        holders: i
            .holders
            .into_iter()
            .map(|h| pb::Holder {
                session_id: shown(h.session),
                owner: h.owner,
                fencing_token: h.token,
                mode: pb_mode(h.mode),
                held_for_ms: h.held_for_ms,
                reentry: h.reentry,
            })
            .collect(),
        waiters: i
            .waiters
            .into_iter()
            .map(|w| pb::Waiter {
                session_id: shown(w.session),
                owner: w.owner,
                mode: pb_mode(w.mode),
                position: w.position,
                waited_ms: w.waited_ms,
            })
            .collect(),
        lock_delay_until_ms: i.lock_delay_until_ms.unwrap_or(0),
    }
}

fn error_event(e: ApiError) -> pb::session_event::Kind {
    pb::session_event::Kind::Error(pb::Error {
        status: e.status as u32,
        code: e.code.name().to_string(),
        message: e.message,
        retry_after_ms: e.retry_after_ms.unwrap_or(0),
        error_code: e.code as i32,
    })
}

/// A pushed event for a session stream.
fn push(ev: SessionEvent) -> pb::session_event::Kind {
    use pb::session_event::Kind;
    match ev {
        SessionEvent::Granted {
            group,
            waiter,
            name,
            token,
            lease_ttl_ms,
            group_moves,
        } => Kind::Granted(pb::Granted {
            group,
            waiter,
            name: name.to_string(),
            fencing_token: token,
            lease_ttl_ms,
            group_moves,
        }),
        SessionEvent::WaitEnded {
            group,
            waiter,
            name,
            reason,
        } => Kind::WaitEnded(pb::WaitEnded {
            group,
            waiter,
            name: name.to_string(),
            reason: match reason {
                WaitEndReason::TimedOut => "timed_out",
                WaitEndReason::SessionEnded => "session_ended",
                WaitEndReason::Moved => "moved",
            }
            .into(),
        }),
        SessionEvent::Ended { group, reason } => Kind::SessionEnded(pb::SessionEnded {
            group,
            reason: match reason {
                SessionEndReason::Expired => "expired",
                SessionEndReason::Closed => "closed",
            }
            .into(),
        }),
        SessionEvent::LeaseExtended {
            group,
            extended_by_ms,
            remaining_ms,
        } => Kind::LeaseExtended(pb::LeaseExtended {
            group,
            extended_by_ms,
            remaining_ms,
        }),
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::SessionEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Lock for GrpcApi {
    async fn open_session(
        &self,
        req: Request<pb::OpenSessionRequest>,
    ) -> Result<Response<pb::OpenSessionResponse>, Status> {
        let start = Instant::now();
        #[allow(deprecated)] // the body token still wins when set (proto header)
        let c = creds(&req.get_ref().token, &req);
        let r = req.into_inner();
        let out = self
            .svc
            .open_session(&r.client, r.ttl_ms, &r.namespace, &c)
            .await
            .map(|o| pb::OpenSessionResponse {
                session_id: o.session.to_string(),
                ttl_ms: o.ttl_ms,
                keepalive_every_ms: o.ttl_ms / 3,
                group: o.group,
            });
        self.finish("open_session", start, out)
    }

    async fn keep_alive(
        &self,
        req: Request<pb::KeepAliveRequest>,
    ) -> Result<Response<pb::KeepAliveResponse>, Status> {
        let start = Instant::now();
        let c = creds("", &req);
        let out = async {
            let r = req.get_ref();
            let s = session_id("session_id", &r.session_id)?;
            Ok(keepalive_response(
                self.svc.keepalive(s, &r.groups, &c).await?,
            ))
        }
        .await;
        self.finish("keepalive", start, out)
    }

    async fn close_session(
        &self,
        req: Request<pb::CloseSessionRequest>,
    ) -> Result<Response<pb::CloseSessionResponse>, Status> {
        let start = Instant::now();
        let c = creds("", &req);
        let out = async {
            let s = session_id("session_id", &req.get_ref().session_id)?;
            Ok(pb::CloseSessionResponse {
                released: self.svc.close_session(s, &c).await?,
            })
        }
        .await;
        self.finish("close_session", start, out)
    }

    async fn acquire(
        &self,
        req: Request<pb::AcquireRequest>,
    ) -> Result<Response<pb::AcquireResponse>, Status> {
        let start = Instant::now();
        #[allow(deprecated)] // the body token still wins when set (proto header)
        let c = creds(&req.get_ref().token, &req);
        let out = async {
            let r = req.get_ref();
            let a = acquire_request(r, session_id("session_id", &r.session_id)?)?;
            Ok(acquire_response(self.svc.acquire(a, &c).await?))
        }
        .await;
        // An acquire that did not get the lock is no `ok`.
        let result = match &out {
            Ok(a) if !a.acquired => "busy",
            _ => "ok",
        };
        self.finish_as("acquire", result, start, out)
    }

    async fn release(
        &self,
        req: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let start = Instant::now();
        #[allow(deprecated)] // the body token still wins when set (proto header)
        let c = creds(&req.get_ref().token, &req);
        let out = async {
            let r = req.get_ref();
            let s = session_id("session_id", &r.session_id)?;
            Ok(pb::ReleaseResponse {
                remaining: self.svc.release(s, &r.name, r.fencing_token, &c).await?,
            })
        }
        .await;
        self.finish("release", start, out)
    }

    async fn extend(
        &self,
        req: Request<pb::ExtendRequest>,
    ) -> Result<Response<pb::ExtendResponse>, Status> {
        let start = Instant::now();
        #[allow(deprecated)] // the body token still wins when set (proto header)
        let c = creds(&req.get_ref().token, &req);
        let out = async {
            let r = req.get_ref();
            let s = session_id("session_id", &r.session_id)?;
            Ok(pb::ExtendResponse {
                lease_ttl_ms: self.svc.extend(s, &r.name, r.fencing_token, &c).await?,
            })
        }
        .await;
        self.finish("extend", start, out)
    }

    async fn check_token(
        &self,
        req: Request<pb::CheckTokenRequest>,
    ) -> Result<Response<pb::CheckTokenResponse>, Status> {
        let start = Instant::now();
        let c = creds("", &req);
        let r = req.get_ref();
        let out = self
            .svc
            .check_token(&r.name, r.fencing_token, &c)
            .await
            .map(|c| pb::CheckTokenResponse {
                valid: c.valid,
                newest_token: c.newest,
            });
        self.finish("check", start, out)
    }

    async fn inspect(
        &self,
        req: Request<pb::InspectRequest>,
    ) -> Result<Response<pb::LockState>, Status> {
        let start = Instant::now();
        #[allow(deprecated)] // the body token still wins when set (proto header)
        let c = creds(&req.get_ref().token, &req);
        let name = req.get_ref().name.clone();
        let out = self
            .svc
            .inspect(&name, &c)
            .await
            .map(|i| lock_state(&self.svc, &name, i));
        self.finish("inspect", start, out)
    }

    async fn status(
        &self,
        _req: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let node = &self.svc.node;
        let groups = node
            .group_ids()
            .into_iter()
            .filter_map(|g| node.group(g))
            .map(|g| {
                let s = g.status();
                pb::GroupStatus {
                    id: g.id(),
                    leader: s.leader.unwrap_or(0),
                    term: s.term,
                    members: s.members,
                    applied_index: s.applied_index,
                    revision: s.revision,
                    preferred_leader: s.preferred_leader.unwrap_or(0),
                }
            })
            .collect();
        Ok(Response::new(pb::StatusResponse {
            node_id: node.node_id(),
            pid: std::process::id(),
            groups,
            serving_names: self.svc.serving(),
        }))
    }

    async fn get_session(
        &self,
        req: Request<pb::GetSessionRequest>,
    ) -> Result<Response<pb::SessionDetail>, Status> {
        let start = Instant::now();
        let c = creds("", &req);
        let out = async {
            let s = session_id("session_id", &req.get_ref().session_id)?;
            let d = self.svc.session_info(s, &c).await?;
            Ok(pb::SessionDetail {
                session_id: d.session.to_string(),
                client: d.client,
                ttl_ms: d.ttl_ms,
                held: d
                    .held
                    .into_iter()
                    .map(|(group, name, t)| pb::HeldLock {
                        name,
                        fencing_token: t,
                        group,
                    })
                    .collect(),
                waits: d
                    .waits
                    .into_iter()
                    .map(|(group, name, p)| pb::QueuedWait {
                        name,
                        queue_position: p,
                        group,
                    })
                    .collect(),
                unavailable_groups: d.unavailable,
            })
        }
        .await;
        self.finish("get_session", start, out)
    }

    async fn contention(
        &self,
        req: Request<pb::ContentionRequest>,
    ) -> Result<Response<pb::ContentionResponse>, Status> {
        let start = Instant::now();
        let c = creds("", &req);
        let out = async {
            let r = req.get_ref();
            let top = if r.top == 0 { 10 } else { r.top as usize };
            let v = self.svc.contention(top, &r.namespace, &c).await?;
            let list = |l: Vec<crate::contention::HotName>| -> Vec<pb::HotName> {
                l.into_iter()
                    .map(|h| pb::HotName {
                        name: h.name,
                        namespace: h.namespace,
                        group: h.group,
                        holders: h.holders,
                        waiters: h.waiters,
                        held_for_ms: h.held_for_ms,
                        longest_wait_ms: h.longest_wait_ms,
                        handoffs_per_s: h.handoffs_per_s,
                        wait_estimate_ms: h.wait_estimate_ms,
                    })
                    .collect()
            };
            Ok(pb::ContentionResponse {
                top: v.top as u32,
                namespaces: v.namespaces,
                scanned: v.report.scanned,
                most_waiters: list(v.report.most_waiters),
                longest_waits: list(v.report.longest_waits),
                most_handoffs: list(v.report.most_handoffs),
                longest_held: list(v.report.longest_held),
            })
        }
        .await;
        self.finish("contention", start, out)
    }

    async fn list_sessions(
        &self,
        req: Request<pb::ListSessionsRequest>,
    ) -> Result<Response<pb::ListSessionsResponse>, Status> {
        let start = Instant::now();
        let c = creds("", &req);
        let out = async {
            let r = req.get_ref();
            let after = if r.after.is_empty() {
                None
            } else {
                Some(session_id("after", &r.after)?)
            };
            let page = self.svc.list_sessions(after, r.limit as usize, &c).await?;
            Ok(pb::ListSessionsResponse {
                sessions: page
                    .into_iter()
                    .map(|s| pb::SessionSummary {
                        session_id: s.session.to_string(),
                        client: s.client,
                        ttl_ms: s.ttl_ms,
                        held: s.held,
                        waits: s.waits,
                    })
                    .collect(),
            })
        }
        .await;
        self.finish("list_sessions", start, out)
    }

    async fn report_lease_expired(
        &self,
        req: Request<pb::ReportLeaseExpiredRequest>,
    ) -> Result<Response<pb::ReportLeaseExpiredResponse>, Status> {
        let name = &req.get_ref().name;
        lockd_core::limits::check_new_name(name).map_err(|e| status(e.into()))?;
        self.svc.report_lease_expired(name);
        Ok(Response::new(pb::ReportLeaseExpiredResponse {}))
    }

    async fn report_fencing_rejected(
        &self,
        req: Request<pb::ReportFencingRejectedRequest>,
    ) -> Result<Response<pb::ReportFencingRejectedResponse>, Status> {
        let name = &req.get_ref().name;
        lockd_core::limits::check_new_name(name).map_err(|e| status(e.into()))?;
        self.svc.report_fencing_rejected(name);
        Ok(Response::new(pb::ReportFencingRejectedResponse {}))
    }

    type WatchStream = Pin<Box<dyn Stream<Item = Result<pb::WatchEvent, Status>> + Send>>;

    async fn watch(
        &self,
        req: Request<pb::WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let start = Instant::now();
        let c = creds("", &req);
        let r = req.into_inner();
        let mut after = crate::watches::Positions::new();
        for p in &r.after {
            let pos = crate::watches::pos_of(p.index, p.events);
            if after.insert(p.group, pos).is_some() {
                let e = ApiError::bad_request(format!("after: group {} is given twice", p.group));
                return self.finish("watch", start, Err(e));
            }
        }
        let opened = self.svc.watch(&r.name, &r.prefix, &after, &c);
        let (w, admin) = match opened {
            Ok(x) => {
                self.svc
                    .metrics
                    .record("grpc", "watch", "ok", start.elapsed());
                x
            }
            Err(e) => return self.finish("watch", start, Err(e)),
        };
        let rx = crate::watches::pump(
            w,
            move |d, positions| {
                let mut e = crate::watches::to_pb(d, admin);
                e.resume = positions
                    .iter()
                    .map(|(g, p)| pb::WatchPosition {
                        group: *g,
                        index: p.index,
                        events: crate::watches::events_done(*p),
                    })
                    .collect();
                Ok(e)
            },
            |e| Err(status(e)),
        );
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    type SessionStream = EventStream;

    async fn session(
        &self,
        req: Request<Streaming<pb::SessionRequest>>,
    ) -> Result<Response<EventStream>, Status> {
        let meta_creds = creds("", &req);
        let inbound = req.into_inner();
        // One slot more than the buffer: the last one carries the status that cuts off a
        // client that does not read.
        let (out_tx, out_rx) = mpsc::channel::<Result<pb::SessionEvent, Status>>(STREAM_BUFFER + 1);
        let out = Outbox {
            tx: out_tx,
            cut_off: false,
        };
        tokio::spawn(run_stream(self.svc.clone(), inbound, meta_creds, out));
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(out_rx),
        )))
    }
}

/// A session stream's task: reads the client's requests (at most [`STREAM_IN_FLIGHT`] running at
/// once; past that the stream is not read, so HTTP/2 flow control holds the client back),
/// sends their answers and the session's pushes, and ends on a close, the client's end, a
/// client that does not read, or the node leaving.
async fn run_stream(
    svc: Arc<Service>,
    mut inbound: Streaming<pb::SessionRequest>,
    meta_creds: Credentials,
    mut out: Outbox,
) {
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel::<SessionEvent>();
    // The session, its attachment, and its namespace with the credential the stream
    // opened or attached with: every keepalive is checked against them again.
    let mut attached: Option<Attached> = None;
    // The notice of the session's end, sent last, after every answer.
    let mut ended = None;
    // The node is leaving: the stream ends with a status that sends the client elsewhere.
    let mut leaving = None;
    let left = svc.left();
    tokio::pin!(left);
    let mut running = FuturesUnordered::new();
    loop {
        if out.cut_off {
            break;
        }
        tokio::select! {
            // At most STREAM_IN_FLIGHT requests run at once; past that the stream is
            // not read, so HTTP/2 flow control holds the client back.
            msg = inbound.message(), if running.len() < STREAM_IN_FLIGHT => {
                let Ok(Some(msg)) = msg else { break };
                let step = on_request(&svc, msg, &mut attached, &ev_tx, &meta_creds, &mut out);
                match step.await {
                    Step::Answered => {}
                    Step::Run(req) => running.push(req),
                    Step::Closed => {
                        ended = Some(session_closed());
                        break;
                    }
                }
            }
            Some(ev) = running.next(), if !running.is_empty() => {
                out.send(ev);
            }
            () = &mut left => {
                leaving = Some(Status::unavailable(
                    "this node is stopping: attach the session on another node (the \
                     session, its locks and its lease are not affected)",
                ));
                break;
            }
            ev = ev_rx.recv() => {
                let Some(ev) = ev else { break };
                match ev {
                    // Closed (by a unary close) in every group at once: one notice, not
                    // one per group, and the stream ends.
                    SessionEvent::Ended { reason: SessionEndReason::Closed, .. } => {
                        ended = Some(session_closed());
                        break;
                    }
                    // Expired in one group, named in the notice: the session goes on in
                    // its other groups (leases are per group), and so does the stream.
                    ev => out.event(0, push(ev)),
                }
            }
        }
    }
    finish_stream(&svc, out, running, ended, leaving, attached).await;
}

/// A session stream's session, its attachment, and its namespace with the credential the
/// stream opened or attached with.
type Attached = (SessionId, u64, Arc<(String, Credentials)>);

/// What a session stream does after one client request.
enum Step {
    /// Answered (or refused) at once.
    Answered,
    /// Runs beside the stream's other requests; its answer goes out when it finishes.
    Run(futures::future::BoxFuture<'static, pb::SessionEvent>),
    /// The session was closed: the stream ends.
    Closed,
}

/// Serves one client request of a session stream: an open or attach first, then requests on
/// the session, which run concurrently (replies carry their `request_id`), except a close,
/// answered before anything else is read.
async fn on_request(
    svc: &Arc<Service>,
    msg: pb::SessionRequest,
    attached: &mut Option<Attached>,
    ev_tx: &mpsc::UnboundedSender<SessionEvent>,
    meta_creds: &Credentials,
    out: &mut Outbox,
) -> Step {
    use pb::session_event::Kind as Ev;
    use pb::session_request::Kind;
    let id = msg.request_id;
    let kind = match msg.kind {
        Some(k @ (Kind::Open(_) | Kind::Attach(_))) if attached.is_none() => {
            match begin_session(svc, k, meta_creds).await {
                Ok((s, auth, ev)) => {
                    *attached = Some((s, attach_here(svc, s, ev_tx.clone(), &ev), auth));
                    out.event(id, ev);
                }
                Err(e) => out.event(id, error_event(e)),
            }
            return Step::Answered;
        }
        Some(Kind::Open(_)) | Some(Kind::Attach(_)) => {
            out.event(id, error_event(second_session()));
            return Step::Answered;
        }
        None => {
            out.event(id, error_event(ApiError::bad_request("empty request")));
            return Step::Answered;
        }
        Some(kind) => kind,
    };
    let Some((session, _, auth)) = attached.as_ref() else {
        out.event(
            id,
            error_event(ApiError::bad_request("send open or attach first")),
        );
        return Step::Answered;
    };
    let (svc, session, auth) = (svc.clone(), *session, auth.clone());
    if !matches!(kind, Kind::Close(_)) {
        return Step::Run(Box::pin(async move {
            serve_stream_request(&svc, session, auth, id, kind).await
        }));
    }
    let answer = serve_stream_request(&svc, session, auth, id, kind).await;
    let closed = matches!(answer.kind, Some(Ev::Closed(_)));
    out.send(answer);
    if closed {
        Step::Closed
    } else {
        Step::Answered
    }
}

/// The end of a session stream: answers what is still running (the client may have closed
/// only its sending side; one cut off for not reading gets nothing more), then the notice of
/// the session's end, then the status that sends the client elsewhere if the node is
/// leaving; the session is detached from the stream.
async fn finish_stream(
    svc: &Arc<Service>,
    mut out: Outbox,
    mut running: FuturesUnordered<futures::future::BoxFuture<'static, pb::SessionEvent>>,
    ended: Option<pb::session_event::Kind>,
    leaving: Option<Status>,
    attached: Option<Attached>,
) {
    while !out.cut_off {
        let Some(ev) = running.next().await else {
            break;
        };
        out.send(ev);
    }
    if let Some(ended) = ended {
        out.event(0, ended);
    }
    if let Some(status) = leaving {
        let _ = out.tx.try_send(Err(status));
    }
    if let Some((session, attachment, _)) = attached {
        svc.waits.detach_stream(session, attachment);
    }
}

/// Events waiting for one session stream's client. A client that stops reading while answers
/// and pushes pile up is cut off past this many (RESOURCE_EXHAUSTED); the session lives on.
pub const STREAM_BUFFER: usize = 1024;
/// Requests of one session stream running at once; past it the stream is not read, and HTTP/2
/// flow control holds the client back.
pub const STREAM_IN_FLIGHT: usize = 1024;

/// The events queued for one session stream's client, bounded by [`STREAM_BUFFER`].
struct Outbox {
    tx: mpsc::Sender<Result<pb::SessionEvent, Status>>,
    /// Set once the client was cut off: nothing more is queued.
    cut_off: bool,
}

impl Outbox {
    fn event(&mut self, request_id: u64, kind: pb::session_event::Kind) {
        self.send(pb::SessionEvent {
            request_id,
            kind: Some(kind),
        });
    }

    fn send(&mut self, ev: pb::SessionEvent) {
        if self.cut_off {
            return;
        }
        // The channel holds STREAM_BUFFER + 1: the last slot is the cut-off's.
        if self.tx.capacity() <= 1 {
            self.cut_off = true;
            let _ = self.tx.try_send(Err(Status::resource_exhausted(format!(
                "the client did not read its session stream ({STREAM_BUFFER} events were \
                 waiting); the stream is cut off. The session lives on: attach it again"
            ))));
            return;
        }
        let _ = self.tx.try_send(Ok(ev));
    }
}

/// The notice that ends a stream whose session was closed, by this stream or by a unary close.
/// A close ends the session in every group at once, so it names none (group 0).
fn session_closed() -> pb::session_event::Kind {
    pb::session_event::Kind::SessionEnded(pb::SessionEnded {
        group: 0,
        reason: "closed".into(),
    })
}

/// An `open` or `attach` on a stream that already carries a session.
fn second_session() -> ApiError {
    ApiError::bad_request("the stream already carries a session")
}

/// The stream's first request: `open` a session or `attach` one. Returns the session, its
/// namespace with the credential that opened or attached it, and the answer.
async fn begin_session(
    svc: &Arc<Service>,
    kind: pb::session_request::Kind,
    meta_creds: &Credentials,
) -> Result<
    (
        SessionId,
        Arc<(String, Credentials)>,
        pb::session_event::Kind,
    ),
    ApiError,
> {
    use pb::session_event::Kind as Ev;
    use pb::session_request::Kind;
    match kind {
        Kind::Open(o) => {
            #[allow(deprecated)] // the body token still wins when set (proto header)
            let c = token_or(&o.token, meta_creds);
            let s = svc
                .open_session(&o.client, o.ttl_ms, &o.namespace, &c)
                .await?;
            let opened = Ev::Opened(pb::OpenSessionResponse {
                session_id: s.session.to_string(),
                ttl_ms: s.ttl_ms,
                keepalive_every_ms: s.ttl_ms / 3,
                group: s.group,
            });
            Ok((s.session, Arc::new((o.namespace, c)), opened))
        }
        Kind::Attach(s) => {
            let s = session_id("attach", &s)?;
            let ns = svc.authorize_session(s, meta_creds).await?;
            // Every group: the client learns where the session has a lease after a move.
            let report = svc.keepalive_authorized(s, &[]).await?;
            let auth = Arc::new((ns, meta_creds.clone()));
            Ok((s, auth, Ev::Keepalive(keepalive_response(report))))
        }
        _ => Err(ApiError::bad_request("send open or attach first")),
    }
}

/// Routes `session`'s events to this stream (`tx`); returns the attachment's id. A session
/// that moved here (its first answer is an attach's keepalive) has the waits it queued in
/// groups without a replica here relayed again: their relays went with the old stream's node.
fn attach_here(
    svc: &Arc<Service>,
    session: SessionId,
    tx: mpsc::UnboundedSender<SessionEvent>,
    first: &pb::session_event::Kind,
) -> u64 {
    let id = svc.waits.attach_stream(session, tx);
    if matches!(first, pb::session_event::Kind::Keepalive(_)) {
        svc.relay_session_waits(session);
    }
    id
}

/// An acquire on a session stream: answered at once, or queued, with the outcome pushed
/// onto the stream later.
async fn stream_acquire(
    svc: &Arc<Service>,
    session: SessionId,
    a: &pb::AcquireRequest,
    c: &Credentials,
) -> Result<pb::session_event::Kind, ApiError> {
    use pb::session_event::Kind as Ev;
    same_session(&a.session_id, session)?;
    let req = acquire_request(a, session)?;
    let wait_ms = req.wait_ms;
    Ok(match svc.acquire_start(req, c).await? {
        AcquireStart::Done(o) => Ev::Acquired(acquire_response(o)),
        AcquireStart::Queued {
            group,
            waiter,
            position,
            lease_started,
            renewed,
        } => {
            // A group with no replica here pushes nothing to this node: the outcome is
            // fetched from one that has, and pushed onto this stream.
            match &group {
                lockd_raft::Route::Remote(r) => {
                    svc.relay_remote_wait(r, session, waiter, &a.name, wait_ms)
                }
                // Pushed from the local replica's effects; watched in case the replica stops
                // being a member first.
                lockd_raft::Route::Local(g) => {
                    svc.watch_local_stream_wait(g.id(), session, waiter, &a.name, wait_ms)
                }
            }
            Ev::Queued(pb::Queued {
                group: group.id(),
                waiter,
                wait_estimate_ms: svc.wait_estimate(group.id(), &a.name, position),
                name: a.name.clone(),
                position,
                lease_started,
                renewed: renewed.map(|r| extended(group.id(), r)),
            })
        }
    })
}

/// Serves one request that came on a session stream attached to `session` (`auth`: its
/// namespace, and the credential the stream opened or attached with).
async fn serve_stream_request(
    svc: &Arc<Service>,
    session: SessionId,
    auth: Arc<(String, Credentials)>,
    id: u64,
    kind: pb::session_request::Kind,
) -> pb::SessionEvent {
    use pb::session_event::Kind as Ev;
    let start = Instant::now();
    let (op, r) = stream_call(svc, session, &auth, kind).await;
    let ev = match r {
        Ok(ev) => {
            let result = match &ev {
                Ev::Acquired(a) if !a.acquired => "busy",
                _ => "ok",
            };
            svc.metrics.record("stream", op, result, start.elapsed());
            ev
        }
        Err(e) => {
            svc.metrics
                .record("stream", op, e.code.name(), start.elapsed());
            error_event(e)
        }
    };
    pb::SessionEvent {
        request_id: id,
        kind: Some(ev),
    }
}

/// Runs one request of a session stream; answers the operation's name (for the metrics) and
/// its answer.
async fn stream_call(
    svc: &Arc<Service>,
    session: SessionId,
    auth: &(String, Credentials),
    kind: pb::session_request::Kind,
) -> (&'static str, Result<pb::session_event::Kind, ApiError>) {
    use pb::session_event::Kind as Ev;
    use pb::session_request::Kind;
    let meta_creds = &auth.1;
    match kind {
        Kind::Keepalive(k) => {
            let r = match same_session(&k.session_id, session) {
                Ok(()) => {
                    svc.keepalive_in(session, &k.groups, &auth.0, meta_creds)
                        .await
                }
                Err(e) => Err(e),
            };
            ("keepalive", r.map(|r| Ev::Keepalive(keepalive_response(r))))
        }
        Kind::Acquire(a) => {
            #[allow(deprecated)] // the body token still wins when set (proto header)
            let c = token_or(&a.token, meta_creds);
            let r = stream_acquire(svc, session, &a, &c).await;
            ("acquire", r)
        }
        Kind::Release(r) => {
            #[allow(deprecated)] // the body token still wins when set (proto header)
            let c = token_or(&r.token, meta_creds);
            let r = async {
                same_session(&r.session_id, session)?;
                svc.release(session, &r.name, r.fencing_token, &c).await
            }
            .await;
            (
                "release",
                r.map(|remaining| Ev::Released(pb::ReleaseResponse { remaining })),
            )
        }
        Kind::Inspect(i) => {
            #[allow(deprecated)] // the body token still wins when set (proto header)
            let c = token_or(&i.token, meta_creds);
            (
                "inspect",
                svc.inspect(&i.name, &c)
                    .await
                    .map(|s| Ev::State(lock_state(svc, &i.name, s))),
            )
        }
        Kind::Close(c) => {
            let r = async {
                same_session(&c.session_id, session)?;
                svc.end_session(session).await
            }
            .await;
            (
                "close_session",
                r.map(|released| Ev::Closed(pb::CloseSessionResponse { released })),
            )
        }
        // The stream loop answers these itself; never a second session on one stream.
        Kind::Open(_) | Kind::Attach(_) => ("session", Err(second_session())),
    }
}

/// The `Admin` service: cluster operations behind the admin credential.
pub struct AdminApi {
    api: GrpcApi,
}

impl AdminApi {
    pub fn new(svc: Arc<Service>) -> AdminApi {
        AdminApi {
            api: GrpcApi::new(svc),
        }
    }
}

fn members_response(groups: Vec<crate::admin::GroupMembers>) -> pb::ListMembersResponse {
    pb::ListMembersResponse {
        groups: groups
            .into_iter()
            .map(|g| {
                let m = &g.membership;
                pb::GroupMembers {
                    group: g.group,
                    leader: m.leader.unwrap_or(0),
                    joint: m.joint,
                    members: m
                        .members()
                        .into_iter()
                        .map(|id| pb::Member {
                            node_id: id,
                            peer_addr: m.addrs.get(&id).cloned().unwrap_or_default(),
                            role: crate::admin::role(m, id).into(),
                            leader: m.leader == Some(id),
                            lag: m.lag.get(&id).copied().flatten(),
                            draining: g.draining.contains(&id),
                            zone: g.zones.get(&id).cloned().unwrap_or_default(),
                            last_contact_ms: m.last_contact_ms(id),
                            reachable: m.reachable(id),
                        })
                        .collect(),
                }
            })
            .collect(),
    }
}

#[tonic::async_trait]
impl lockd_proto::v1::admin_server::Admin for AdminApi {
    async fn list_members(
        &self,
        req: Request<pb::ListMembersRequest>,
    ) -> Result<Response<pb::ListMembersResponse>, Status> {
        let start = Instant::now();
        let c = creds("", &req);
        let out = self.api.svc.list_members(&c).await.map(members_response);
        self.api.finish("list_members", start, out)
    }

    async fn cluster_status(
        &self,
        req: Request<pb::ClusterStatusRequest>,
    ) -> Result<Response<pb::ClusterStatusResponse>, Status> {
        let start = Instant::now();
        let c = creds("", &req);
        let out = (self.api.svc.cluster_status(&c).await).map(|nodes| pb::ClusterStatusResponse {
            nodes: nodes.into_iter().map(node_status_report).collect(),
        });
        self.api.finish("cluster_status", start, out)
    }

    async fn add_member(
        &self,
        req: Request<pb::AddMemberRequest>,
    ) -> Result<Response<pb::ListMembersResponse>, Status> {
        let start = Instant::now();
        let c = creds("", &req);
        let r = req.into_inner();
        let out = self
            .api
            .svc
            .add_member(
                &c,
                r.node_id,
                &r.peer_addr,
                &r.groups,
                r.allow_zone_majority,
            )
            .await
            .map(members_response);
        self.api.finish("add_member", start, out)
    }

    async fn remove_member(
        &self,
        req: Request<pb::RemoveMemberRequest>,
    ) -> Result<Response<pb::ListMembersResponse>, Status> {
        let start = Instant::now();
        let c = creds("", &req);
        let r = req.into_inner();
        let out = self
            .api
            .svc
            .remove_member(&c, r.node_id, &r.groups, r.allow_zone_majority)
            .await
            .map(members_response);
        self.api.finish("remove_member", start, out)
    }

    async fn set_draining(
        &self,
        req: Request<pb::SetDrainingRequest>,
    ) -> Result<Response<pb::ListMembersResponse>, Status> {
        let start = Instant::now();
        let c = creds("", &req);
        let r = req.into_inner();
        let out = self
            .api
            .svc
            .set_draining(&c, r.node_id, r.draining)
            .await
            .map(members_response);
        self.api.finish("set_draining", start, out)
    }

    async fn list_namespaces(
        &self,
        req: Request<pb::ListNamespacesRequest>,
    ) -> Result<Response<pb::ListNamespacesResponse>, Status> {
        let start = Instant::now();
        let c = creds("", &req);
        let out = self
            .api
            .svc
            .namespace_config(&c)
            .await
            .map(|(version, all)| pb::ListNamespacesResponse {
                version,
                namespaces: all.iter().map(crate::namespaces::spec_of).collect(),
            });
        self.api.finish("list_namespaces", start, out)
    }

    async fn put_namespace(
        &self,
        req: Request<pb::PutNamespaceRequest>,
    ) -> Result<Response<pb::PutNamespaceResponse>, Status> {
        let start = Instant::now();
        let c = creds("", &req);
        let r = req.into_inner();
        let out = async {
            self.api.svc.require_admin(&c, "changing namespaces")?;
            let token = crate::namespaces::TokenChange::from_fields(r.bearer_token, r.clear_token)?;
            let spec = r
                .namespace
                .ok_or_else(|| ApiError::bad_request("namespace: required"))?;
            let version = self
                .api
                .svc
                .put_namespace(&c, r.expected_version, spec, token)
                .await?;
            Ok(pb::PutNamespaceResponse { version })
        }
        .await;
        self.api.finish("put_namespace", start, out)
    }

    async fn delete_namespace(
        &self,
        req: Request<pb::DeleteNamespaceRequest>,
    ) -> Result<Response<pb::DeleteNamespaceResponse>, Status> {
        let start = Instant::now();
        let c = creds("", &req);
        let r = req.into_inner();
        let out = self
            .api
            .svc
            .delete_namespace(&c, r.expected_version, &r.name)
            .await
            .map(|version| pb::DeleteNamespaceResponse { version });
        self.api.finish("delete_namespace", start, out)
    }

    async fn backup(
        &self,
        req: Request<pb::BackupRequest>,
    ) -> Result<Response<pb::BackupResponse>, Status> {
        let start = Instant::now();
        let c = creds("", &req);
        let out = async {
            let b = self.api.svc.backup(&c).await?;
            let document = serde_json::to_vec(&b)
                .map_err(|e| ApiError::new(crate::error::ErrorCode::Internal, e.to_string()))?;
            Ok(pb::BackupResponse { document })
        }
        .await;
        self.api.finish("backup", start, out)
    }

    async fn shard_map(
        &self,
        req: Request<pb::ShardMapRequest>,
    ) -> Result<Response<pb::ShardMapResponse>, Status> {
        let start = Instant::now();
        let c = creds("", &req);
        let out = self
            .api
            .svc
            .shard_view(&c)
            .await
            .map(|v| pb::ShardMapResponse {
                map_version: v.map_version,
                groups: v
                    .groups
                    .iter()
                    .map(|g| pb::GroupBuckets {
                        group: g.group,
                        buckets: g.in_map.to_string(),
                        bucket_count: g.in_map.len() as u32,
                        owned: g.owned.to_string(),
                        frozen: g.frozen.to_string(),
                    })
                    .collect(),
            });
        self.api.finish("shard_view", start, out)
    }

    async fn move_buckets(
        &self,
        req: Request<pb::MoveBucketsRequest>,
    ) -> Result<Response<pb::MoveBucketsResponse>, Status> {
        let start = Instant::now();
        let c = creds("", &req);
        let r = req.into_inner();
        let out = async {
            self.api.svc.require_admin(&c, "moving buckets")?;
            let buckets: lockd_core::BucketSet = r
                .buckets
                .parse()
                .map_err(|e| ApiError::bad_request(format!("buckets: {e}")))?;
            let m = self.api.svc.move_buckets(&c, &buckets, r.to_group).await?;
            Ok(pb::MoveBucketsResponse {
                chunks: m.chunks,
                buckets_moved: m.buckets,
                locks: m.locks,
                holders: m.holders,
                waits_requeued: m.waits_requeued,
                resumed: m.resumed,
                map_version: m.map_version,
                elapsed_ms: m.elapsed_ms,
            })
        }
        .await;
        self.api.finish("move_buckets", start, out)
    }

    async fn create_group(
        &self,
        req: Request<pb::CreateGroupRequest>,
    ) -> Result<Response<pb::LockGroup>, Status> {
        let start = Instant::now();
        let c = creds("", &req);
        let r = req.into_inner();
        let out = async {
            let record = self
                .api
                .svc
                .create_group(&c, r.group, &r.nodes, r.allow_zone_majority)
                .await?;
            Ok(lock_group(r.group, record))
        }
        .await;
        self.api.finish("create_group", start, out)
    }

    async fn list_groups(
        &self,
        req: Request<pb::ListGroupsRequest>,
    ) -> Result<Response<pb::ListGroupsResponse>, Status> {
        let start = Instant::now();
        let c = creds("", &req);
        let out = async {
            let groups = self.api.svc.list_groups(&c).await?;
            Ok(pb::ListGroupsResponse {
                groups: groups.into_iter().map(|(g, r)| lock_group(g, r)).collect(),
            })
        }
        .await;
        self.api.finish("list_groups", start, out)
    }

    async fn remove_group(
        &self,
        req: Request<pb::RemoveGroupRequest>,
    ) -> Result<Response<pb::RemoveGroupResponse>, Status> {
        let start = Instant::now();
        let c = creds("", &req);
        let group = req.get_ref().group;
        let out = async {
            self.api.svc.remove_group(&c, group).await?;
            Ok(pb::RemoveGroupResponse { group })
        }
        .await;
        self.api.finish("remove_group", start, out)
    }
}

fn lock_group(group: u32, r: lockd_core::GroupRecord) -> pb::LockGroup {
    pb::LockGroup {
        group,
        nodes: r.replicas,
        born_epoch: r.born_epoch,
        ready: r.ready,
        placed_at_term: r.placed_at.term,
        placed_at_index: r.placed_at.index,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;
    use tonic_types::StatusExt;

    /// A long message is cut (it rides in a header, and a 10 KB one broke the response), at a
    /// character boundary.
    #[test]
    fn a_long_status_message_is_cut() {
        let long = "é".repeat(5_000);
        let s = status(ApiError::new(ErrorCode::GroupNotEmpty, long));
        assert!(s.message().len() <= MAX_STATUS_MESSAGE + " … (cut)".len());
        assert!(s.message().ends_with(" … (cut)"), "{}", s.message());
        let short = status(ApiError::new(ErrorCode::GroupNotEmpty, "group: 2 buckets"));
        assert_eq!(short.message(), "group: 2 buckets");
    }

    #[test]
    fn a_status_carries_error_info_and_retry_info() {
        let s = status(ApiError::new(ErrorCode::QueueFull, "full").retry_after(1_500));
        assert_eq!(s.code(), tonic::Code::ResourceExhausted);
        let d = s.get_error_details();
        let info = d.error_info().expect("ErrorInfo");
        assert_eq!(
            (info.reason.as_str(), info.domain.as_str()),
            ("QUEUE_FULL", "lockd")
        );
        assert_eq!(
            d.retry_info().and_then(|r| r.retry_delay),
            Some(std::time::Duration::from_millis(1_500))
        );
        assert_eq!(s.metadata().get("lockd-error-code").unwrap(), "queue_full");
        assert_eq!(s.metadata().get("lockd-retry-after-ms").unwrap(), "1500");
        // No retry hint, no RetryInfo.
        let s = status(ApiError::bad_request("x"));
        assert!(s.get_error_details().retry_info().is_none());
    }
}
