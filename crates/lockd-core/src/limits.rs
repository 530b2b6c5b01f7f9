//! Every limit of the protocol, in one place, with the checks that enforce the string limits.
//!
//! A limit exists so that no client can make a replica do unbounded work or hold unbounded memory.

use crate::types::{LockMode, Namespace, Rejection, SafetyClass};

/// Longest lock name, in bytes.
pub const MAX_NAME_BYTES: usize = 512;
/// Longest owner string, in bytes.
pub const MAX_OWNER_BYTES: usize = 256;
/// Longest client description of a session, in bytes.
pub const MAX_CLIENT_BYTES: usize = 256;
/// Longest zone name (`--zone`), in bytes.
pub const MAX_ZONE_LEN: usize = 64;
/// Longest a queued acquire may wait.
pub const MAX_WAIT_MS: u64 = 300_000;
/// Largest semaphore.
pub const MAX_SEMAPHORE_LIMIT: u32 = 10_000;
/// Deepest re-entry.
pub const MAX_REENTRY: u32 = 1_000_000;
/// Live sessions one group holds: those opened there (its namespaces' home) and those an
/// acquire brought there. The design's 20,000 clients are a twelfth of it; a session costs a
/// replica about 150 bytes, so a full table is ~40 MB per group.
pub const MAX_SESSIONS: usize = 250_000;
/// Live sessions the namespaces without a token hold together, in one group. The other
/// 100,000 places of [`MAX_SESSIONS`] are kept for namespaces with a token: anyone who reaches a
/// client port can open sessions in an open namespace (`default`), and a flood of them must not
/// lock every team with a credential out.
pub const MAX_OPEN_NAMESPACE_SESSIONS: usize = 150_000;
/// The highest revision, so the highest fencing token, a group ever reaches.
///
/// Grants alone never get near it (2^63 grants at a million a second take 290,000 years); only
/// a `RaiseRevision` floor can, and a floor above it is refused. Once a group's revision is
/// here it grants no new token (an acquire is refused with `CounterLimit`) rather than wrap to
/// 0 and break S2. `i64::MAX` rather than `u64::MAX`: every token then also fits a signed 64-bit
/// integer (SQL `BIGINT`, Java `long`), which is where fenced resources often keep it.
pub const MAX_REVISION: u64 = i64::MAX as u64;

/// TTL bounds of the default namespace (seed: 15 s default, 5–60 s allowed).
pub const DEFAULT_TTL_MS: u64 = 15_000;
pub const DEFAULT_MIN_TTL_MS: u64 = 5_000;
pub const DEFAULT_MAX_TTL_MS: u64 = 60_000;
/// Hard bounds any namespace's TTLs must fall within.
pub const HARD_MIN_TTL_MS: u64 = 1_000;
pub const HARD_MAX_TTL_MS: u64 = 3_600_000;
/// Seed: "caps the queue (say 500)".
pub const DEFAULT_MAX_WAITERS_PER_NAME: u32 = 500;
pub const HARD_MAX_WAITERS_PER_NAME: u32 = 100_000;
/// The seed expects ~50 held per process; leave room for a hundredfold.
pub const DEFAULT_MAX_LOCKS_PER_SESSION: u32 = 10_000;
pub const HARD_MAX_LOCKS_PER_SESSION: u32 = 1_000_000;
/// Chubby bounds lock-delay at one minute.
pub const MAX_LOCK_DELAY_MS: u64 = 60_000;
/// Retry hint given with `QueueFull`.
pub const QUEUE_FULL_RETRY_AFTER_MS: u64 = 1_000;
/// Longest namespace name, in bytes.
pub const MAX_NAMESPACE_NAME_BYTES: usize = 64;

/// Checks that `value` is 1..=`max_bytes` bytes of printable UTF-8 (no control characters).
pub fn check_printable(
    field: &'static str,
    value: &str,
    max_bytes: usize,
) -> Result<(), Rejection> {
    let reason = if value.is_empty() {
        "is empty"
    } else if value.len() > max_bytes {
        "is too long"
    } else if value.chars().any(char::is_control) {
        "contains a control character"
    } else {
        return Ok(());
    };
    Err(Rejection::InvalidString {
        field: field.into(),
        reason: reason.into(),
        max_bytes,
    })
}

/// Like [`check_printable`] but an empty value is allowed (optional strings such as owner).
pub fn check_optional(field: &'static str, value: &str, max_bytes: usize) -> Result<(), Rejection> {
    if value.is_empty() {
        Ok(())
    } else {
        check_printable(field, value, max_bytes)
    }
}

/// A lock name: 1..=512 bytes of printable UTF-8.
pub fn check_name(name: &str) -> Result<(), Rejection> {
    check_printable("name", name, MAX_NAME_BYTES)
}

/// The rules a name must meet to come in through an API, on top of [`check_name`]: no
/// invisible or bidirectional-control character ([`is_invisible`]). Names are compared as
/// bytes and never normalised (docs/API.md says why). Only the front doors call this, never
/// the apply path: a replica replaying a log written before the rule existed must reach the
/// same state as the one that wrote it.
pub fn check_new_name(name: &str) -> Result<(), Rejection> {
    check_name(name)?;
    let reason = if let Some(c) = name.chars().find(|&c| is_invisible(c)) {
        format!(
            "contains U+{:04X}, an invisible or bidirectional-control character",
            c as u32
        )
    } else {
        return Ok(());
    };
    Err(Rejection::InvalidString {
        field: "name".into(),
        reason,
        max_bytes: MAX_NAME_BYTES,
    })
}

/// A character that shows nothing, or reorders what is around it: Unicode's format characters
/// (category Cf: bidi embeddings, overrides and isolates, zero-width space and joiners, the
/// byte-order mark, soft hyphen, tags), the line and paragraph separators, and the blank
/// fillers, selectors and joiner that render as nothing. docs/openapi.yaml's `Name` pattern
/// excludes the same set (a test compares them code point by code point).
pub fn is_invisible(c: char) -> bool {
    matches!(
        c as u32,
        0x00AD
            | 0x034F
            | 0x0600..=0x0605
            | 0x061C
            | 0x06DD
            | 0x070F
            | 0x0890..=0x0891
            | 0x08E2
            | 0x115F..=0x1160
            | 0x17B4..=0x17B5
            | 0x180B..=0x180F
            | 0x200B..=0x200F
            | 0x2028..=0x202E
            | 0x2060..=0x206F
            | 0x3164
            | 0xFE00..=0xFE0F
            | 0xFEFF
            | 0xFFA0
            | 0xFFF9..=0xFFFB
            | 0x110BD
            | 0x110CD
            | 0x13430..=0x1343F
            | 0x1BCA0..=0x1BCA3
            | 0x1D173..=0x1D17A
            | 0xE0000..=0xE0FFF
    )
}

/// An acquire's mode and wait: a semaphore's limit within 1..=[`MAX_SEMAPHORE_LIMIT`], a wait
/// of at most [`MAX_WAIT_MS`]. The state machine and both API front doors call this, so a bad
/// value gets the same code however it arrives.
pub fn check_acquire_args(mode: LockMode, wait_ms: u64) -> Result<(), Rejection> {
    if let LockMode::Semaphore { limit } = mode {
        if limit == 0 || limit > MAX_SEMAPHORE_LIMIT {
            return Err(Rejection::InvalidSemaphoreLimit {
                limit,
                max: MAX_SEMAPHORE_LIMIT,
            });
        }
    }
    if wait_ms > MAX_WAIT_MS {
        return Err(Rejection::WaitTooLong {
            wait_ms,
            max_ms: MAX_WAIT_MS,
        });
    }
    Ok(())
}

impl Namespace {
    /// The namespace every name falls into when no other prefix matches.
    pub fn default_namespace() -> Namespace {
        Namespace {
            name: "default".into(),
            prefix: String::new(),
            min_ttl_ms: DEFAULT_MIN_TTL_MS,
            max_ttl_ms: DEFAULT_MAX_TTL_MS,
            default_ttl_ms: DEFAULT_TTL_MS,
            max_waiters_per_name: DEFAULT_MAX_WAITERS_PER_NAME,
            max_locks_per_session: DEFAULT_MAX_LOCKS_PER_SESSION,
            lock_delay_ms: 0,
            safety: SafetyClass::Efficiency,
            ops_per_s: 0,
            token_sha256: None,
            max_sessions: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_readers_can_trust() {
        for ok in [
            "payouts/merchant-48213",
            "search/shard-17",
            "caf\u{E9}",
            "cafe\u{301}",
            "\u{65E5}\u{672C}/\u{30B7}\u{30E3}\u{30FC}\u{30C9}-17",
            "lock \u{1F512} with an emoji",
            "job:release",
        ] {
            assert_eq!(check_new_name(ok), Ok(()), "{ok:?}");
        }
        for (bad, says) in [
            ("pay\u{202E}hs.exe", "U+202E"),
            ("a\u{2067}b\u{2069}", "U+2067"),
            ("shard\u{200B}17", "U+200B"),
            ("\u{FEFF}bom", "U+FEFF"),
            ("soft\u{AD}hyphen", "U+00AD"),
            ("tag\u{E0041}", "U+E0041"),
            ("line\u{2028}sep", "U+2028"),
            ("bell\u{7}", "control"),
        ] {
            let Err(Rejection::InvalidString { field, reason, .. }) = check_new_name(bad) else {
                panic!("{bad:?} accepted")
            };
            assert_eq!(field, "name");
            assert!(reason.contains(says), "{bad:?}: {reason}");
            // The apply path keeps its older rule, so replaying an old log stays deterministic.
            if says != "control" {
                assert_eq!(check_name(bad), Ok(()), "{bad:?}");
            }
        }
    }
}
