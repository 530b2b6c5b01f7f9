//! Whether a certificate names a DNS name: how a node binds a peer's claimed id to the
//! certificate it presented (the TLS layer has already checked the chain to the cluster's CA).

use rustls_pki_types::{CertificateDer, ServerName};

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
