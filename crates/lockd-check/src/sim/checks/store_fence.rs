//! The fenced store: it accepts a write only with a token at least the highest it has seen for
//! the key, so a holder that paused past its lease cannot overwrite its successor's work. A
//! stale write accepted is a violation (what `--sabotage store-fence` must cause).

use super::*;

/// The fenced store: per key, the highest token seen.
#[derive(Default)]
pub(crate) struct Store {
    pub(crate) keys: BTreeMap<String, u64>,
    pub(crate) seq: u64,
}

impl World {
    /// A write to the fenced store.
    pub(crate) fn store_write(
        &self,
        process: ProcessId,
        key: &str,
        token: u64,
        value: String,
    ) -> bool {
        let op = self.invoke(
            process,
            Call::Write {
                key: key.into(),
                token: Some(token),
                fenced: true,
                value: value.clone(),
                add: None,
            },
        );
        let (accepted, fence_before, seq) = {
            let mut st = lock(&self.store);
            st.seq += 1;
            let seq = st.seq;
            let fence = st.keys.entry(key.to_string()).or_insert(0);
            let before = *fence;
            let ok = token >= before || self.cfg.sabotage == Some(Sabotage::StoreFence);
            if ok {
                *fence = before.max(token);
            }
            (ok, before, seq)
        };
        if accepted && token < fence_before {
            self.violation_of(
                Signature::StaleWrite,
                format!(
                    "store accepted a stale write to {key}: token {token} < fence {fence_before}"
                ),
            );
        }
        self.push(Record::StoreLog {
            seq,
            key: key.into(),
            op: StoreOp::Write,
            token: Some(token),
            fenced: true,
            accepted,
            fence_before,
            value: Some(value),
        });
        self.complete(
            process,
            op,
            if accepted {
                Outcome::Accepted
            } else {
                Outcome::RejectedStale
            },
        );
        accepted
    }
}
