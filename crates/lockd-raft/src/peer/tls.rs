//! The peer port's TLS: the PEM files of a node's identity, and the names in peer certificates: the DNS name a node's certificate carries, and whether a
//! certificate names it, which is how a node binds a peer's claimed id to the certificate it
//! presented (the TLS layer has already checked the chain to the cluster's CA).

use rustls_pki_types::{CertificateDer, ServerName};

use crate::NodeId;

/// The DNS name a node's peer certificate must carry: `node-<id>.lockd`. A caller checks it of
/// the node it dials; a node checks it of every caller against the id the caller claims, so a
/// certificate speaks for one node id only. One CA per cluster: the name does not say which.
pub fn peer_dns_name(id: NodeId) -> String {
    format!("node-{id}.lockd")
}

/// `true` if `cert` (DER) is valid for the DNS name `dns` (its subject alternative names).
pub(crate) fn names(cert: &CertificateDer<'_>, dns: &str) -> bool {
    let Ok(cert) = webpki::EndEntityCert::try_from(cert) else {
        return false;
    };
    let Ok(name) = ServerName::try_from(dns) else {
        return false;
    };
    cert.verify_is_valid_for_subject_name(&name).is_ok()
}

/// The PEM files of a node's peer TLS: the cluster's CA, and this node's certificate (chain)
/// and private key. The certificate must name [`peer_dns_name`] of this node among its DNS
/// names and allow both server and client authentication: it is presented on both sides.
#[derive(Clone)]
pub struct PeerTls {
    pub ca_pem: Vec<u8>,
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

impl std::fmt::Debug for PeerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("PeerTls").finish_non_exhaustive()
    }
}

impl PeerTls {
    /// The peer port's TLS: this node's identity, and a client certificate of the cluster's CA
    /// required of every caller (which node it is, [`crate::PeerService`] checks per call).
    pub fn server_config(&self) -> tonic::transport::ServerTlsConfig {
        tonic::transport::ServerTlsConfig::new()
            .identity(tonic::transport::Identity::from_pem(
                &self.cert_pem,
                &self.key_pem,
            ))
            .client_ca_root(tonic::transport::Certificate::from_pem(&self.ca_pem))
    }
}
