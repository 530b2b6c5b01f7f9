//! TLS on the client ports (HTTP/JSON and gRPC), and the throwaway certificates of `lockd dev
//! --tls`. rustls with the ring provider throughout: no OpenSSL, no large C build.
//!
//! The peer port's mutual TLS is lockd-raft's (`PeerTls`): it binds each caller's certificate
//! to the node id it claims, which only the peer service knows how to check.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::conns::{Capped, ConnCap};
use anyhow::{bail, Context};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;

/// How long a client may take over its TLS handshake before the connection is dropped (a slow
/// or idle handshake never holds a slot of the accept loop: each runs in its own task).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The client ports' TLS: this node's certificate chain and key (PEM), and optionally the CA
/// whose client certificates are required.
#[derive(Clone)]
pub struct ClientTls {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub client_ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field(
                "client_certificates_required",
                &self.client_ca_pem.is_some(),
            )
            .finish_non_exhaustive()
    }
}

/// Reads a PEM file, naming it in the error.
pub fn read_pem(path: &Path, what: &str) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading the {what} {}", path.display()))
}

/// The certificates of a PEM bundle; an error names `what` if it has none or one is damaged.
fn certs(pem: &[u8], what: &str) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("the {what} is not valid PEM: {e}"))?;
    if certs.is_empty() {
        bail!("the {what} holds no CERTIFICATE block");
    }
    Ok(certs)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl ClientTls {
    /// Loads and checks the files: a start with a bad certificate, key or CA fails at once,
    /// naming the file, rather than at the first client's handshake.
    pub fn load(cert: &Path, key: &Path, client_ca: Option<&Path>) -> anyhow::Result<ClientTls> {
        let tls = ClientTls {
            cert_pem: read_pem(cert, "TLS certificate")?,
            key_pem: read_pem(key, "TLS key")?,
            client_ca_pem: client_ca.map(|p| read_pem(p, "client CA")).transpose()?,
        };
        tls.rustls()
            .with_context(|| format!("TLS with {} and {}", cert.display(), key.display()))?;
        Ok(tls)
    }

    /// The HTTP port's rustls configuration (HTTP/2 and HTTP/1.1 by ALPN).
    pub fn rustls(&self) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        let chain = certs(&self.cert_pem, "TLS certificate")?;
        let key = PrivateKeyDer::from_pem_slice(&self.key_pem)
            .map_err(|e| anyhow::anyhow!("the TLS key holds no usable private key: {e}"))?;
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?;
        let builder = match &self.client_ca_pem {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in certs(ca, "client CA")? {
                    roots.add(c).context("the client CA")?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider(),
                )
                .build()
                .context("the client CA")?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut cfg = builder
            .with_single_cert(chain, key)
            .context("the TLS certificate and key do not form a usable pair")?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    }

    /// The gRPC port's configuration (tonic's rustls).
    pub fn grpc(&self) -> tonic::transport::ServerTlsConfig {
        let identity = tonic::transport::Identity::from_pem(&self.cert_pem, &self.key_pem);
        let cfg = tonic::transport::ServerTlsConfig::new().identity(identity);
        match &self.client_ca_pem {
            Some(ca) => cfg.client_ca_root(tonic::transport::Certificate::from_pem(ca)),
            None => cfg,
        }
    }
}

/// A TCP listener that hands axum only connections whose TLS handshake completed. Handshakes
/// run in tasks of their own, so one slow client never delays another's accept. A connection
/// takes its place under the port's cap *before* its handshake: handshakes in progress hold
/// descriptors too, and a flood of hellos that never finish must not hold more than the cap.
/// One over the cap is closed at once (a TLS client cannot read a plain-text 503).
pub struct TlsListener {
    ready: mpsc::Receiver<(Capped<TlsStream<TcpStream>>, SocketAddr)>,
    local: SocketAddr,
    accepting: tokio::task::JoinHandle<()>,
}

impl TlsListener {
    pub fn new(
        tcp: TcpListener,
        cfg: Arc<rustls::ServerConfig>,
        cap: ConnCap,
    ) -> std::io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
        let (tx, ready) = mpsc::channel(64);
        let accepting = tokio::spawn(async move {
            loop {
                let (stream, peer) = match tcp.accept().await {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of file descriptors and the like: back off, as axum's own does.
                        tracing::warn!(error = %e, "HTTPS accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let Some(permit) = cap.admit(peer.ip()) else {
                    continue;
                };
                if let Err(e) = stream.set_nodelay(true) {
                    tracing::warn!(error = %e, "could not set TCP_NODELAY");
                }
                let (acceptor, tx) = (acceptor.clone(), tx.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((Capped::new(tls, permit), peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(TlsListener {
            ready,
            local,
            accepting,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = Capped<TlsStream<TcpStream>>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The accept loop never ends while the listener lives; wait for the shutdown.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

/// The files of one node made by [`dev_certificates`].
#[derive(Clone, Debug)]
pub struct DevCert {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// `lockd dev --tls`: a throwaway CA in `dir/ca.pem` and, for each node id, a certificate that
/// serves its client ports (for `localhost` and `ips`) and its peer port (`node-<id>.lockd`),
/// usable as server and client. Files that are all there already are kept (a restart keeps its
/// CA); otherwise the whole set is made anew. Keys are written 0600. Returns the CA's path.
pub fn dev_certificates(
    dir: &Path,
    nodes: &[u64],
    ips: &[IpAddr],
) -> anyhow::Result<(PathBuf, Vec<DevCert>)> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer,
        KeyPair, KeyUsagePurpose, SanType,
    };
    let ca_path = dir.join("ca.pem");
    let files: Vec<DevCert> = nodes
        .iter()
        .map(|id| DevCert {
            cert: dir.join(format!("node-{id}.pem")),
            key: dir.join(format!("node-{id}-key.pem")),
        })
        .collect();
    if ca_path.exists() && files.iter().all(|f| f.cert.exists() && f.key.exists()) {
        return Ok((ca_path, files));
    }
    private_dir(dir)?;
    let err = |e: rcgen::Error| anyhow::anyhow!("making a certificate: {e}");
    let ca_key = KeyPair::generate().map_err(err)?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "lockd dev CA (throwaway)");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).map_err(err)?;
    let issuer = Issuer::new(ca, ca_key);
    for (id, f) in nodes.iter().zip(&files) {
        let names = vec!["localhost".to_string(), lockd_raft::peer_dns_name(*id)];
        let mut leaf = CertificateParams::new(names).map_err(err)?;
        leaf.subject_alt_names
            .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        leaf.distinguished_name
            .push(DnType::CommonName, format!("lockd node {id}"));
        leaf.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().map_err(err)?;
        let cert = leaf.signed_by(&key, &issuer).map_err(err)?;
        write_private(&f.key, key.serialize_pem().as_bytes())?;
        write_private(&f.cert, cert.pem().as_bytes())?;
    }
    write_private(&ca_path, ca_cert.pem().as_bytes())?;
    Ok((ca_path, files))
}

fn private_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating {}", dir.display()))
}

/// Writes `path` 0600 (a key above all), replacing what was there.
fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(())
}

/// The earliest `notAfter` (Unix seconds) among the certificates in `pem`; `None` if it holds
/// none that parses (the TLS setup itself reports a bad file).
pub fn earliest_not_after(pem: &[u8]) -> Option<i64> {
    x509_parser::pem::Pem::iter_from_buffer(pem)
        .filter_map(Result::ok)
        .filter(|p| p.label == "CERTIFICATE")
        .filter_map(|p| Some(p.parse_x509().ok()?.validity().not_after.timestamp()))
        .min()
}

#[cfg(test)]
mod tests {
    use rcgen::{CertificateParams, KeyPair};

    fn cert_until(y: i32, m: u8, d: u8) -> String {
        let mut p = CertificateParams::new(vec!["lockd.test".to_string()]).unwrap();
        p.not_after = rcgen::date_time_ymd(y, m, d);
        p.self_signed(&KeyPair::generate().unwrap()).unwrap().pem()
    }

    #[test]
    fn a_files_expiry_is_its_first_certificate_to_expire() {
        let later = cert_until(2031, 5, 4);
        let sooner = cert_until(2030, 1, 2);
        // 2030-01-02T00:00:00Z
        let at = 1_893_542_400;
        assert_eq!(super::earliest_not_after(sooner.as_bytes()), Some(at));
        let chain = format!("{later}{sooner}");
        assert_eq!(super::earliest_not_after(chain.as_bytes()), Some(at));
        // A key beside it is no certificate; a file with none has no expiry.
        let key = KeyPair::generate().unwrap().serialize_pem();
        let bundle = format!("{key}{later}");
        assert_eq!(
            super::earliest_not_after(bundle.as_bytes()),
            Some(1_935_619_200)
        );
        assert_eq!(super::earliest_not_after(key.as_bytes()), None);
        assert_eq!(super::earliest_not_after(b"not pem"), None);
    }
}
