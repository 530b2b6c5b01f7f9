//! Who may speak on the peer port: the cluster secret, and what the meta group records about
//! every node (its data dir incarnation, and the ids retired for good).
//!
//! The peer port carries Raft itself: a caller it takes for a node can vote, append entries and
//! propose commands. So every call proves three things before it is served (`PeerService::admit`
//! and `dispatch` in `mod.rs`):
//!
//! - **the cluster's secret** (`--peer-secret-file`), when the port is plain text; with mutual
//!   TLS the certificate does this, and names the node id the caller claims;
//! - **its incarnation**: the caller's data dir is the one the meta group recorded for its id. A
//!   node whose disk was wiped comes back with a new one and is refused, and a call that names
//!   an incarnation for this node that is not its own tells this node that it is the wiped one:
//!   it stops (`Node::refuse_to_serve`) instead of voting with a forgotten log;
//! - **its membership**: a current member of the group it names (`mod.rs`), never a retired id.
//!
//! The records are the meta group's, copied here by this node's meta replica as it applies
//! them (`raft/replica.rs`), so a check costs a read lock, not a Raft read, and is as current as the
//! node's own copy of the meta group.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::RwLock;

use crate::NodeId;

/// Metadata key: the caller's data dir incarnation (hex), on every call of a node that has one.
pub(crate) const INCARNATION_HEADER: &str = "lockd-incarnation";
/// Metadata key: the incarnation the caller knows the called node by (hex), when it knows one.
pub(crate) const TO_INCARNATION_HEADER: &str = "lockd-to-incarnation";
/// Metadata key: the cluster's peer secret, on a plain-text peer port that has one.
pub(crate) const SECRET_HEADER: &str = "lockd-peer-secret";
/// Metadata key on a refusal: why, as a word a caller can act on without reading the message.
pub(crate) const REFUSED_HEADER: &str = "lockd-refused";
/// [`REFUSED_HEADER`]'s value when the caller's incarnation is not the recorded one.
pub(crate) const REFUSED_INCARNATION: &str = "incarnation";
/// [`REFUSED_HEADER`]'s value when the caller's id is retired.
pub(crate) const REFUSED_RETIRED: &str = "retired";

/// What the meta group says about the cluster's nodes, as last pushed.
#[derive(Default)]
struct Records {
    incarnations: BTreeMap<NodeId, u64>,
    retired: BTreeSet<NodeId>,
}

/// This node's view of who may call it, and what it tells others about itself.
pub struct PeerBook {
    /// This node's incarnation (0: storage in memory, nothing to lose, not tracked).
    incarnation: u64,
    secret: Option<String>,
    records: RwLock<Records>,
}

impl PeerBook {
    /// A book for a node of data dir `incarnation` (0: none) on a port with `secret` (if any);
    /// it knows no records until the meta replica applies some.
    pub fn new(incarnation: u64, secret: Option<String>) -> PeerBook {
        PeerBook {
            incarnation,
            secret,
            records: RwLock::new(Records::default()),
        }
    }

    /// This node's data dir incarnation (0: not tracked).
    pub(crate) fn incarnation(&self) -> u64 {
        self.incarnation
    }

    /// The secret every call must carry on a plain-text port (`None`: no secret).
    pub(crate) fn secret(&self) -> Option<&str> {
        self.secret.as_deref()
    }

    /// Replaces the records with the meta group's.
    pub(crate) fn set(&self, incarnations: BTreeMap<NodeId, u64>, retired: BTreeSet<NodeId>) {
        let mut r = self.records.write().expect("peer records poisoned");
        r.incarnations = incarnations;
        r.retired = retired;
    }

    /// The incarnation the meta group recorded for node `id`, if any.
    pub(crate) fn incarnation_of(&self, id: NodeId) -> Option<u64> {
        let r = self.records.read().expect("peer records poisoned");
        r.incarnations.get(&id).copied()
    }

    /// Whether no incarnation is recorded yet (a new node's, or a wiped one's, empty meta
    /// replica).
    pub(crate) fn knows_none(&self) -> bool {
        let r = self.records.read().expect("peer records poisoned");
        r.incarnations.is_empty()
    }

    /// Checks the secret a call carries, in time that does not depend on where it differs.
    pub(crate) fn check_secret(&self, given: Option<&str>) -> Result<(), tonic::Status> {
        let Some(want) = &self.secret else {
            return Ok(());
        };
        let given = given.unwrap_or("").as_bytes();
        let same = given.len() == want.len()
            && given
                .iter()
                .zip(want.as_bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if same {
            Ok(())
        } else {
            Err(tonic::Status::unauthenticated(format!(
                "the peer port needs this cluster's peer secret in '{SECRET_HEADER}' (the \
                 contents of --peer-secret-file)"
            )))
        }
    }

    /// Checks that node `from`, calling with data dir incarnation `given` (0: none sent), is
    /// neither retired nor another incarnation than the one recorded for it.
    pub(crate) fn check_caller(&self, from: NodeId, given: u64) -> Result<(), tonic::Status> {
        let r = self.records.read().expect("peer records poisoned");
        if r.retired.contains(&from) {
            return Err(refusal(
                tonic::Status::permission_denied(format!(
                    "node {from} left this cluster for good (retired), and a node id is never \
                     reused"
                )),
                REFUSED_RETIRED,
            ));
        }
        match r.incarnations.get(&from) {
            Some(&known) if known != given => Err(refusal(
                tonic::Status::permission_denied(lockd_core::wiped_disk_message(
                    from, known, given,
                )),
                REFUSED_INCARNATION,
            )),
            _ => Ok(()),
        }
    }
}

/// `status` with [`REFUSED_HEADER`] set to `why`.
fn refusal(mut status: tonic::Status, why: &'static str) -> tonic::Status {
    status.metadata_mut().insert(
        REFUSED_HEADER,
        tonic::metadata::AsciiMetadataValue::from_static(why),
    );
    status
}

/// Why a peer refused this node, if it said so (`None`: some other failure).
pub(crate) fn refused_why(status: &tonic::Status) -> Option<&str> {
    status
        .metadata()
        .get(REFUSED_HEADER)
        .and_then(|v| v.to_str().ok())
}

/// An incarnation as the headers carry it.
pub(crate) fn parse_incarnation(v: &str) -> Option<u64> {
    u64::from_str_radix(v, 16).ok().filter(|i| *i != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_must_match_exactly() {
        let open = PeerBook::new(7, None);
        assert!(open.check_secret(None).is_ok(), "no secret set: no check");
        let b = PeerBook::new(7, Some("s3cret".into()));
        assert!(b.check_secret(Some("s3cret")).is_ok());
        for bad in [
            None,
            Some(""),
            Some("s3cre"),
            Some("s3cret!"),
            Some("S3cret"),
        ] {
            let st = b.check_secret(bad).unwrap_err();
            assert_eq!(st.code(), tonic::Code::Unauthenticated, "{bad:?}");
        }
    }

    #[test]
    fn a_recorded_incarnation_admits_only_itself_and_a_retired_id_nothing() {
        let b = PeerBook::new(1, None);
        assert!(b.check_caller(2, 0xbb).is_ok(), "nothing recorded yet");
        b.set(BTreeMap::from([(2, 0xbb)]), BTreeSet::from([3]));
        assert!(b.check_caller(2, 0xbb).is_ok());
        for given in [0, 0xcc] {
            let st = b.check_caller(2, given).unwrap_err();
            assert_eq!(st.code(), tonic::Code::PermissionDenied);
            assert_eq!(refused_why(&st), Some(REFUSED_INCARNATION));
            assert!(st.message().contains("members replace 2 "), "{st:?}");
        }
        let st = b.check_caller(3, 0).unwrap_err();
        assert_eq!(refused_why(&st), Some(REFUSED_RETIRED));
        assert_eq!(b.incarnation_of(2), Some(0xbb));
        assert_eq!(parse_incarnation("00000000000000bb"), Some(0xbb));
        assert_eq!(parse_incarnation("0"), None);
        assert_eq!(parse_incarnation("zz"), None);
    }
}
