//! Reaching a lock group from any node (placement).
//!
//! A node hosts only the groups placed on it, yet accepts any request. Proposals and keepalives
//! for a group it has no member replica of go straight to that group's leader
//! ([`lockd_raft::RemoteGroup`]). Two things need a node that applies the group's log, and those
//! are asked of one with [`Ask`](crate::ask::Ask) over the peer port ([`lockd_raft::PeerMethod::App`]):
//!
//! - **reads** ([`Query`]): every read of a group's state is one `Query` variant answered by
//!   [`Query::answer`], the same function whether the replica is here or there, so a read means
//!   the same on every node;
//! - **contention** ([`Ask::Contention`]): the state machine's scan plus the node's hand-off
//!   rates (`contention.rs`), from the member's replica as applied, without a read barrier;
//! - **waits** ([`Ask::AwaitWaiter`]): a wait is answered by a node's applied effects
//!   (`waits.rs`), so a node without a replica parks the wait on one that has (its early-outcome
//!   buffer covers a grant applied before the ask arrives) and relays the outcome: to the HTTP
//!   long poll, or onto the session's stream as a push. A grant whose HTTP caller is gone is
//!   released (the janitor); a grant for a stream is the session's, and is never released by
//!   a relay that finds no stream (the stream may have moved, and its new node relays the
//!   session's waits again: [`Service::relay_session_waits`]).

use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use lockd_core::{SessionId, WaiterId};
use lockd_raft::{AppHandler, GroupError, GroupId, RemoteGroup, Route};

use crate::ask::{encode, Answer, Ask, Query, RemoteOutcome};
use crate::contention::{Report, MAX_TOP};
use crate::error::{ApiError, ErrorCode};
use crate::service::Service;
use crate::waits::{Orphan, SessionEvent, WaitOutcome};

/// How much longer than the wait itself the peer call may take.
const AWAIT_SLACK: Duration = Duration::from_secs(2);

impl Service {
    /// Serves other nodes' questions about this node's replicas (remote waits, reads):
    /// install once, right after the service is built.
    pub fn serve_peer_questions(self: &Arc<Self>) {
        self.node
            .set_app_handler(Arc::new(AppServer(Arc::downgrade(self))));
    }

    /// How this node reaches group `id`.
    pub(crate) fn route_of(&self, id: GroupId) -> Result<Route, ApiError> {
        if let Some(r) = self.node.route(id) {
            return Ok(r);
        }
        // A group created since this node last looked (`topology.rs`) is known at once.
        self.know_recorded_group(id);
        self.node.route(id).ok_or_else(|| {
            ApiError::new(
                ErrorCode::Unavailable,
                format!("group {id} is not reachable from here"),
            )
            .retry_after(1_000)
        })
    }

    /// A linearizable read of `route`'s group.
    pub(crate) async fn query(&self, route: &Route, q: Query) -> Result<Answer, ApiError> {
        match route {
            Route::Local(g) => {
                let now = g.now_ms();
                Ok(g.read(move |t| q.answer(t, now)).await?)
            }
            Route::Remote(r) => {
                let payload = encode(&Ask::Query(q)).map_err(status_error)?;
                let timeout = Duration::from_secs(10);
                let reply = r.app_call(payload, timeout).await?;
                let answer: Result<Answer, GroupError> = decode(&reply)?;
                Ok(answer?)
            }
        }
    }

    /// Group `route`'s part of a contention report: from this node's replica if it has one,
    /// else from a member's.
    pub(crate) async fn contention_of(
        &self,
        route: &Route,
        top: usize,
        namespaces: Option<Vec<String>>,
    ) -> Result<Report, ApiError> {
        match route {
            Route::Local(g) => {
                Ok(Report::of_replica(g, &self.waits.handoffs, top, namespaces.as_deref()).await)
            }
            Route::Remote(r) => {
                let payload = encode(&Ask::Contention { top, namespaces }).map_err(status_error)?;
                let reply = r.app_call(payload, Duration::from_secs(10)).await?;
                Ok(decode(&reply)?)
            }
        }
    }

    /// The outcome of waiter `waiter` of a group this node hosts no member replica of, waited
    /// for on a node that does, for up to `limit`. `Ok(None)`: no outcome in time (unknown).
    /// The ask runs in a task of its own: if this caller goes away before a grant comes back,
    /// the grant is released (or pushed to the session's stream, `stream`).
    pub(crate) async fn await_remote(
        &self,
        remote: &Arc<RemoteGroup>,
        session: SessionId,
        waiter: WaiterId,
        name: &str,
        limit: Duration,
    ) -> Result<RemoteOutcome, ApiError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        tokio::spawn(remote_wait(
            remote.clone(),
            session,
            waiter,
            name.to_string(),
            limit,
            self.waits.janitor(),
            Relay::Caller(tx),
        ));
        match rx.await {
            Ok(r) => r,
            Err(_) => Ok(None),
        }
    }

    /// Watches a wait queued from a session stream on this node's replica of `group`: its
    /// outcome is pushed from the replica's applied effects, unless the replica stops being a
    /// serving member first (removed while cut off: it would never apply the outcome). Then
    /// the wait is handed to a member ([`Service::relay_remote_wait`]) with the time left.
    pub(crate) fn watch_local_stream_wait(
        self: &Arc<Self>,
        group: GroupId,
        session: SessionId,
        waiter: WaiterId,
        name: &str,
        wait_ms: u64,
    ) {
        let deadline = tokio::time::Instant::now()
            + Duration::from_millis(wait_ms)
            + crate::service::WAIT_GRACE;
        // Parked beside the stream: the outcome comes to both (the early buffer covers one
        // applied before this parks).
        let mut parked = self.waits.park(group, waiter);
        let svc = Arc::downgrade(self);
        let name = name.to_string();
        tokio::spawn(async move {
            let moved_away = async {
                loop {
                    tokio::time::sleep(crate::service::MEMBERSHIP_CHECK_EVERY).await;
                    let svc = svc.upgrade()?;
                    if let Some(Route::Remote(r)) = svc.node.route(group) {
                        return Some((svc, r));
                    }
                }
            };
            tokio::select! {
                biased;
                _ = tokio::time::timeout_at(deadline, parked.outcome()) => {}
                moved = moved_away => {
                    if let Some((svc, remote)) = moved {
                        // relay_remote_wait adds the grace again.
                        let left = deadline
                            .saturating_duration_since(tokio::time::Instant::now())
                            .saturating_sub(crate::service::WAIT_GRACE);
                        svc.relay_remote_wait(&remote, session, waiter, &name, left.as_millis() as u64);
                    }
                }
            }
            // Not abandoned: the stream's client owns the wait and its grant.
            let _ = parked.hand_over();
        });
    }

    /// Like [`Service::await_remote`] for a wait queued from a session stream: the outcome is
    /// pushed onto the session's stream on this node when it comes, as a local replica's
    /// applied effect would be.
    pub(crate) fn relay_remote_wait(
        self: &Arc<Self>,
        remote: &Arc<RemoteGroup>,
        session: SessionId,
        waiter: WaiterId,
        name: &str,
        wait_ms: u64,
    ) {
        tokio::spawn(remote_wait(
            remote.clone(),
            session,
            waiter,
            name.to_string(),
            Duration::from_millis(wait_ms) + crate::service::WAIT_GRACE,
            self.waits.janitor(),
            Relay::Stream(Arc::downgrade(self)),
        ));
    }
}

impl Service {
    /// A session's stream moved here (attach). The waits it queued through another node in a
    /// group this node hosts no replica of were relayed by that node, which may be gone with
    /// the old stream: each is relayed again from here. Two relays of one outcome are harmless
    /// (the client drops a second push of an answered wait), and a relay that finds no stream
    /// releases nothing (`remote_wait`). Waits in groups hosted here are pushed by the
    /// replica's applied effects.
    pub(crate) fn relay_session_waits(self: &Arc<Self>, session: SessionId) {
        let svc = Arc::downgrade(self);
        tokio::spawn(async move {
            let Some(groups) = svc.upgrade().and_then(|s| s.lock_groups_all().ok()) else {
                return;
            };
            for route in groups {
                let Route::Remote(remote) = &route else {
                    continue;
                };
                let Some(s) = svc.upgrade() else { return };
                let waits = match s.query(&route, Query::SessionWaits { session }).await {
                    Ok(Answer::SessionWaits(w)) => w,
                    Ok(_) => continue,
                    Err(e) => {
                        tracing::debug!(group = remote.id(), %e, "could not list a moved session's waits");
                        continue;
                    }
                };
                for (name, waiter, left_ms) in waits {
                    s.relay_remote_wait(remote, session, waiter, &name, left_ms);
                }
            }
        });
    }
}

fn status_error(st: tonic::Status) -> ApiError {
    ApiError::new(ErrorCode::Unavailable, st.message().to_string())
}

fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    postcard::from_bytes(bytes).map_err(|e| {
        ApiError::new(
            ErrorCode::Unavailable,
            format!("bad answer from a peer: {e}"),
        )
    })
}

/// Where a remote wait's outcome goes.
enum Relay {
    Caller(tokio::sync::oneshot::Sender<Result<RemoteOutcome, ApiError>>),
    Stream(Weak<Service>),
}

async fn remote_wait(
    remote: Arc<RemoteGroup>,
    session: SessionId,
    waiter: WaiterId,
    name: String,
    limit: Duration,
    janitor: tokio::sync::mpsc::UnboundedSender<Orphan>,
    relay: Relay,
) {
    let for_stream = matches!(relay, Relay::Stream(_));
    let result = ask_member(&remote, waiter, &name, limit, for_stream).await;
    let group = remote.id();
    match relay {
        Relay::Caller(tx) => {
            if let Err(Ok(Some((WaitOutcome::Granted { token, .. }, _)))) = tx.send(result) {
                let _ = janitor.send(Orphan {
                    group,
                    session,
                    name,
                    token,
                });
            }
        }
        Relay::Stream(svc) => {
            // No outcome: the client's own wait deadline ends it on its side.
            let Ok(Some((outcome, _))) = &result else {
                return;
            };
            let event = relayed_event(group, waiter, &name, outcome);
            // A grant the stream here cannot take is not released: the wait belongs to the
            // session, whose stream may have moved to a node that delivers the same grant
            // (a replica's effects, or its own relay). Releasing it here would free a lock a
            // guard holds. A client that gets a grant nobody waits for gives it back; a
            // client that is gone lets its session expire, which frees it.
            let delivered = svc
                .upgrade()
                .is_some_and(|s| s.waits.deliver(session, event));
            tracing::debug!(
                group,
                waiter,
                delivered,
                "relayed a wait's outcome to its stream"
            );
        }
    }
}

/// Asks a member of `remote`'s group for waiter `waiter`'s outcome, for up to `limit`. A
/// member that dies while holding the ask is replaced by another: the outcome is in the
/// replicated log, and a node that applied it before the ask came keeps it for the asker.
async fn ask_member(
    remote: &RemoteGroup,
    waiter: WaiterId,
    name: &str,
    limit: Duration,
    for_stream: bool,
) -> Result<RemoteOutcome, ApiError> {
    let started = tokio::time::Instant::now();
    loop {
        let left = limit.saturating_sub(started.elapsed());
        let (name, limit_ms) = (name.to_string(), left.as_millis() as u64);
        let ask = if for_stream {
            Ask::AwaitStreamWaiter {
                waiter,
                name,
                limit_ms,
            }
        } else {
            Ask::AwaitWaiter {
                waiter,
                name,
                limit_ms,
            }
        };
        let payload = encode(&ask).map_err(status_error)?;
        let got = remote.app_call(payload, left + AWAIT_SLACK).await;
        tracing::debug!(
            group = remote.id(),
            waiter,
            ok = got.is_ok(),
            "asked a member for a wait's outcome"
        );
        match got {
            Ok(bytes) => return decode::<RemoteOutcome>(&bytes),
            Err(_) if started.elapsed() + Duration::from_millis(100) < limit => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Serves [`Ask`]s from other nodes (set on the node at start).
pub(crate) struct AppServer(pub(crate) Weak<Service>);

impl AppHandler for AppServer {
    fn serve(
        &self,
        group: GroupId,
        payload: Vec<u8>,
    ) -> BoxFuture<'static, Result<Vec<u8>, tonic::Status>> {
        let svc = self.0.clone();
        Box::pin(async move {
            let svc = svc
                .upgrade()
                .ok_or_else(|| tonic::Status::unavailable("node is shutting down"))?;
            if group == lockd_raft::NODE_CALL {
                return match postcard::from_bytes(&payload) {
                    Ok(Ask::NodeStatus) => encode(&crate::status::NodeReport::of(&svc)),
                    _ => Err(tonic::Status::invalid_argument(
                        "a call addressed to a node asks for its status only",
                    )),
                };
            }
            let Some(Route::Local(g)) = svc.node.route(group) else {
                return Err(tonic::Status::not_found(format!(
                    "group {group} has no replica here"
                )));
            };
            let ask: Ask = postcard::from_bytes(&payload)
                .map_err(|e| tonic::Status::invalid_argument(e.to_string()))?;
            let of_session = matches!(ask, Ask::AwaitStreamWaiter { .. });
            match ask {
                Ask::Query(q) => {
                    let now = g.now_ms();
                    encode(&g.read(move |t| q.answer(t, now)).await)
                }
                Ask::Contention { top, namespaces } => encode(
                    &Report::of_replica(
                        &g,
                        &svc.waits.handoffs,
                        top.min(MAX_TOP),
                        namespaces.as_deref(),
                    )
                    .await,
                ),
                Ask::AwaitWaiter {
                    waiter,
                    name,
                    limit_ms,
                }
                | Ask::AwaitStreamWaiter {
                    waiter,
                    name,
                    limit_ms,
                } => {
                    let mut parked = svc.waits.park(group, waiter);
                    if of_session {
                        parked = parked.of_session();
                    }
                    let out = await_for_peer(&g, parked, &name, limit_ms).await;
                    tracing::debug!(
                        node = svc.node.node_id(),
                        group,
                        waiter,
                        ?out,
                        "answered a peer's wait"
                    );
                    encode(&out)
                }
                Ask::NodeStatus => Err(tonic::Status::invalid_argument(
                    "a status is asked of a node, not of a group",
                )),
            }
        })
    }
}

/// Waits up to `limit_ms` for `parked`'s outcome on replica `g`, with the holder on a
/// timeout. On a timeout, or when the asker goes away, `parked` is dropped: an HTTP caller's
/// waiter is abandoned here and a later grant released by this node; a session stream's is
/// not (`Parked::of_session`).
async fn await_for_peer(
    g: &lockd_raft::Group,
    mut parked: crate::waits::Parked,
    name: &str,
    limit_ms: u64,
) -> RemoteOutcome {
    let limit = Duration::from_millis(limit_ms);
    match tokio::time::timeout(limit, parked.outcome()).await {
        Ok(Some(WaitOutcome::TimedOut)) => {
            let holder = g
                .read_local(|t| t.lock_info(name, 0))
                .and_then(|i| i.holders.first().map(|h| h.owner.clone()));
            Some((WaitOutcome::TimedOut, holder))
        }
        Ok(Some(o)) => Some((o, None)),
        Ok(None) | Err(_) => None,
    }
}

/// The push that tells a session stream how its wait in `group` ended.
fn relayed_event(group: GroupId, waiter: WaiterId, name: &str, o: &WaitOutcome) -> SessionEvent {
    match o {
        WaitOutcome::Granted {
            token,
            lease_ttl_ms,
            group_moves,
        } => SessionEvent::Granted {
            group,
            waiter,
            name: name.into(),
            token: *token,
            lease_ttl_ms: *lease_ttl_ms,
            group_moves: *group_moves,
        },
        outcome => SessionEvent::WaitEnded {
            group,
            waiter,
            name: name.into(),
            reason: match outcome {
                WaitOutcome::SessionEnded => lockd_core::WaitEndReason::SessionEnded,
                WaitOutcome::Moved => lockd_core::WaitEndReason::Moved,
                _ => lockd_core::WaitEndReason::TimedOut,
            },
        },
    }
}
