//! The node's ports: the peer port (Raft and forwarded calls, node to node), the client gRPC
//! API and HTTP/JSON, and the optional probes port (`--probes`). Each function checks its port's TLS first (a bad certificate stops
//! the start with its reason) and returns the server, to run until `stop` resolves.

use std::future::Future;
use std::sync::Arc;

use anyhow::Context as _;
use lockd_raft::Node;
use tokio::net::TcpListener;

use crate::service::Service;
use crate::{conns, grpc, http, tls, ADMIN_SERVICE, LOCK_SERVICE};

/// The peer port, under a connection cap of its own (`conns.rs`; it sets TCP_NODELAY, which
/// serving from a pre-bound listener skips: without it every small reply, Raft acks above all,
/// waits out Nagle against the peer's delayed ACK, ~40 ms).
pub fn peer(
    node: &Arc<Node>,
    listener: TcpListener,
    tls: Option<tonic::transport::ServerTlsConfig>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<impl Future<Output = ()> + Send + 'static> {
    let peer = node.peer_service();
    let cap = conns::ConnCap::with_per_addr(
        "peer",
        conns::PEER_CONNECTIONS,
        conns::PEER_CONNECTIONS_PER_ADDR,
    );
    let registry = conns::Registry::default();
    let incoming = conns::capped_grpc(listener, cap, registry.clone());
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(conns::H2_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(conns::H2_KEEPALIVE_TIMEOUT));
    if let Some(t) = tls {
        builder = builder.tls_config(t).context("the peer port's TLS")?;
    }
    Ok(async move {
        let served = builder
            .layer(conns::TrackRequests::grpc(registry))
            .add_service(peer)
            .serve_with_incoming_shutdown(incoming, stop)
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "peer gRPC server failed");
        }
    })
}

/// The client gRPC API, with grpc.health.v1 and server reflection (v1 and v1alpha), so
/// grpcurl, Postman and load balancers work without the .proto file. Every health status
/// starts NOT_SERVING; `duties::health_follows_readiness` keeps them in step with `/readyz`
/// through the reporter returned.
pub async fn grpc(
    svc: &Arc<Service>,
    listener: TcpListener,
    cap: conns::ConnCap,
    tls: Option<tonic::transport::ServerTlsConfig>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<(
    impl Future<Output = ()> + Send + 'static,
    tonic_health::server::HealthReporter,
)> {
    // A request message is at most what an HTTP body may be (64 KiB): no valid request comes
    // near it, and tonic's default (4 MiB) would let one call make the node buffer that much.
    let api = lockd_proto::v1::lock_server::LockServer::new(grpc::GrpcApi::new(svc.clone()))
        .max_decoding_message_size(http::MAX_BODY_BYTES);
    let admin = lockd_proto::v1::admin_server::AdminServer::new(grpc::AdminApi::new(svc.clone()))
        .max_decoding_message_size(http::MAX_BODY_BYTES);
    svc.metrics.watch_connections(&cap);
    let registry = conns::Registry::default();
    let incoming = conns::capped_grpc(listener, cap, registry.clone());
    let (health, health_service) = tonic_health::server::health_reporter();
    for name in ["", LOCK_SERVICE, ADMIN_SERVICE] {
        health
            .set_service_status(name, tonic_health::ServingStatus::NotServing)
            .await;
    }
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(lockd_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(lockd_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    // Streams at once on one client connection: what one connection can make the node hold
    // (each session, watch or call a task and its buffers). A client opening more waits for
    // one to end (HTTP/2's SETTINGS_MAX_CONCURRENT_STREAMS); a lockd client needs one.
    let mut builder = tonic::transport::Server::builder()
        .max_concurrent_streams(Some(grpc::MAX_STREAMS_PER_CONNECTION))
        .http2_keepalive_interval(Some(conns::H2_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(conns::H2_KEEPALIVE_TIMEOUT));
    if let Some(t) = tls {
        builder = builder.tls_config(t).context("the gRPC port's TLS")?;
    }
    let server = async move {
        let served = builder
            .layer(conns::TrackRequests::grpc(registry))
            .add_service(api)
            .add_service(admin)
            .add_service(health_service)
            .add_service(reflection)
            .add_service(reflection_alpha)
            .serve_with_incoming_shutdown(incoming, stop)
            .await;
        if let Err(e) = served {
            tracing::error!(error = %e, "gRPC server failed");
        }
    };
    Ok((server, health))
}

/// HTTP/JSON, in plain text (with TCP_NODELAY) or over TLS.
pub fn http(
    svc: &Arc<Service>,
    listener: TcpListener,
    cap: conns::ConnCap,
    tls: Option<Arc<rustls::ServerConfig>>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<futures::future::BoxFuture<'static, ()>> {
    use futures::FutureExt as _;
    let app = http::router(svc.clone());
    svc.metrics.watch_connections(&cap);
    Ok(match tls {
        Some(t) => {
            let listener = tls::TlsListener::new(listener, t, cap)?;
            conns::serve_http(listener, app, stop).boxed()
        }
        None => {
            use axum::serve::ListenerExt;
            let listener = listener.tap_io(|tcp| {
                if let Err(e) = tcp.set_nodelay(true) {
                    tracing::warn!(error = %e, "could not set TCP_NODELAY");
                }
            });
            conns::serve_http(conns::CappedListener::new(listener, cap), app, stop).boxed()
        }
    })
}

/// At most this many connections at once on the probes port: probes and scrapes are few, and
/// the port must not become a way around the client cap's descriptor budget.
const PROBE_CONNECTIONS: u32 = 64;

/// The probes port, if there is one: `GET /livez`, `/readyz` and `/metrics` in plain HTTP,
/// with a cap of its own, so a full client cap or client mTLS never fails a kubelet probe or
/// a scrape. Spawned on `tasks`; returns its address.
pub fn probes(
    svc: &Arc<Service>,
    listener: Option<TcpListener>,
    tasks: &mut tokio::task::JoinSet<()>,
    stop: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<Option<std::net::SocketAddr>> {
    let Some(listener) = listener else {
        return Ok(None);
    };
    let addr = listener.local_addr()?;
    let app = http::probe_router(svc.clone());
    let cap = conns::ConnCap::new("probes", PROBE_CONNECTIONS);
    tasks.spawn(conns::serve_http(
        conns::CappedListener::new(listener, cap),
        app,
        stop,
    ));
    Ok(Some(addr))
}
