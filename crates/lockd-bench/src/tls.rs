//! TLS for lockd clusters the bench starts with it (`lockd-tls`): which endpoints speak TLS,
//! and how to reach them.
//!
//! The endpoints a TLS cluster listens on are registered here with its CA while the cluster
//! runs, so every connector (`grpc_connect`, `HttpConn`) picks TLS by address and the many
//! scenarios that dial a node need no second code path. Ports are unique while a cluster
//! lives; the cluster unregisters them when dropped.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::{Context, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;

/// A registered endpoint's client-side TLS: the CA that signed the nodes' certificates.
#[derive(Clone)]
pub struct EndpointTls {
    pub ca_pem: Arc<Vec<u8>>,
    pub rustls: Arc<rustls::ClientConfig>,
}

fn registry() -> &'static Mutex<HashMap<SocketAddr, EndpointTls>> {
    static R: OnceLock<Mutex<HashMap<SocketAddr, EndpointTls>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// Marks `addrs` as TLS endpoints whose certificates `ca_pem` signed.
pub fn register(addrs: &[SocketAddr], ca_pem: Vec<u8>) -> Result<()> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(&ca_pem) {
        roots.add(c.context("the CA")?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tls = EndpointTls {
        ca_pem: Arc::new(ca_pem),
        rustls: Arc::new(cfg),
    };
    let mut r = registry().lock().expect("tls registry");
    for a in addrs {
        r.insert(*a, tls.clone());
    }
    Ok(())
}

pub fn unregister(addrs: &[SocketAddr]) {
    let mut r = registry().lock().expect("tls registry");
    for a in addrs {
        r.remove(a);
    }
}

/// The TLS to speak to `addr`, if it is a registered TLS endpoint.
pub fn of(addr: SocketAddr) -> Option<EndpointTls> {
    registry().lock().expect("tls registry").get(&addr).cloned()
}
