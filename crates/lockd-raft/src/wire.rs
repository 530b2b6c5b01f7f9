//! Carrying a core reply (`Result<Reply, Rejection>`) between nodes and through openraft's
//! responder: a serde newtype, encoded with postcard like every other peer payload.

use lockd_core::{Rejection, Reply};
use serde::{Deserialize, Serialize};

/// A core reply as it crosses the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct WireReply(pub(crate) Result<Reply, Rejection>);

#[cfg(test)]
mod tests {
    use super::*;
    use lockd_core::SessionId;

    fn round_trip(r: Result<Reply, Rejection>) {
        let bytes = postcard::to_allocvec(&WireReply(r.clone())).unwrap();
        let back: WireReply = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back.0, r);
    }

    #[test]
    fn replies_and_rejections_round_trip() {
        round_trip(Ok(Reply::Acquired {
            token: 7,
            lease_ttl_ms: 15_000,
            reentry: 1,
            group_moves: 3,
        }));
        round_trip(Err(Rejection::UnknownSession {
            session: SessionId(9),
        }));
        round_trip(Err(Rejection::InvalidString {
            field: "name".into(),
            reason: "is empty".into(),
            max_bytes: 512,
        }));
        round_trip(Err(Rejection::NotHolder {
            session: SessionId(1),
            name: "a/b".into(),
        }));
    }
}
