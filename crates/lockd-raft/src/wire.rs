//! Carrying a core reply (`Result<Reply, Rejection>`) between nodes and through openraft's
//! responder: a serde type, encoded with postcard like every other peer payload.
//!
//! A forwarded proposal's answer may carry a tail an older node does not know: postcard reads
//! a value and ignores what follows it, so a field added at the end of the last value of a
//! message is skipped by an older reader. [`Proposed`] reads its own tail leniently, so a
//! newer reader takes an older node's shorter answer as "no renewal". Both directions work
//! without a version gate.

use std::fmt;

use lockd_core::{Rejection, Reply};
use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

/// What a group's leader answered a keepalive with (and an acquire's renewal,
/// [`Proposed::renewed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Renewed {
    /// The lease the session has left in the group, from when the leader answered.
    pub ttl_ms: u64,
    /// The group's move count then (`LockTable::move_count`): a hold granted at this count
    /// has not left the group.
    pub group_moves: u64,
}

/// The answer to one proposed op: the core's reply, and the session's lease in the group if
/// the leader renewed it while applying the op (an acquire it granted or queued).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Proposed {
    /// The core's reply (deterministic: every replica computes the same).
    pub reply: Result<Reply, Rejection>,
    /// Set only by the leader of the entry's term, for an acquire answered `Acquired` or
    /// `Queued`: the session's lease there was renewed when the entry applied, as by a
    /// keepalive. `None` when unknown (an older leader, or no renewal).
    pub renewed: Option<Renewed>,
}

impl Proposed {
    #[cfg(test)]
    pub(crate) fn plain(reply: Result<Reply, Rejection>) -> Proposed {
        Proposed {
            reply,
            renewed: None,
        }
    }
}

impl<'de> Deserialize<'de> for Proposed {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Proposed, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Proposed;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a reply and an optional renewal")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Proposed, A::Error> {
                let reply = seq
                    .next_element()?
                    .ok_or_else(|| serde::de::Error::invalid_length(0, &self))?;
                // An older leader wrote no tail: the input ends here, which reads as `None`.
                // A tail that cannot be read is treated the same (`None` is always safe: the
                // client then keeps the lease it knew).
                let renewed = seq
                    .next_element::<Option<Renewed>>()
                    .ok()
                    .flatten()
                    .flatten();
                Ok(Proposed { reply, renewed })
            }
        }
        d.deserialize_struct("Proposed", &["reply", "renewed"], V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lockd_core::SessionId;

    fn round_trip(r: Result<Reply, Rejection>) {
        let bytes = postcard::to_allocvec(&Proposed::plain(r.clone())).unwrap();
        let back: Proposed = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back.reply, r);
        assert_eq!(back.renewed, None);
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

    /// The answer as a node before `renewed` wrote it, and read it.
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct Before(Result<Reply, Rejection>);

    fn acquired() -> Result<Reply, Rejection> {
        Ok(Reply::Acquired {
            token: 7,
            lease_ttl_ms: 15_000,
            reentry: 1,
            group_moves: 3,
        })
    }

    #[test]
    fn a_renewal_reaches_a_newer_reader_and_an_older_one_skips_it() {
        let renewed = Some(Renewed {
            ttl_ms: 14_990,
            group_moves: 3,
        });
        let now: Result<Proposed, crate::GroupError> = Ok(Proposed {
            reply: acquired(),
            renewed,
        });
        let bytes = postcard::to_allocvec(&now).unwrap();
        let back: Result<Proposed, crate::GroupError> = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back.unwrap().renewed, renewed);
        let old: Result<Before, crate::GroupError> = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(old.unwrap(), Before(acquired()));
    }

    #[test]
    fn an_older_leaders_answer_reads_as_no_renewal() {
        let old: Result<Before, crate::GroupError> = Ok(Before(acquired()));
        let bytes = postcard::to_allocvec(&old).unwrap();
        let back: Result<Proposed, crate::GroupError> = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back.unwrap(), Proposed::plain(acquired()));
        // An error answer is unchanged.
        let err: Result<Before, crate::GroupError> = Err(crate::GroupError::SessionNotFound);
        let bytes = postcard::to_allocvec(&err).unwrap();
        let back: Result<Proposed, crate::GroupError> = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back, Err(crate::GroupError::SessionNotFound));
    }
}
