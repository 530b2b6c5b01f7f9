//! The history model: what a run records, so a checker can judge it now or later.
//!
//! A history is a sequence of [`Record`]s, saved as JSON lines (one record per line), so a run can be
//! written by several processes into several files and re-checked with `lockd-check check FILE...`.
//! Three sources feed it, and the checker cross-examines them:
//!
//! 1. **Clients** record operations as two lines, [`Record::Invoke`] before the call and
//!    [`Record::Complete`] after it, timed in nanoseconds of one monotonic clock from a shared origin
//!    (see [`MonotonicClock`]). An invoke without a complete (the process was killed) or a complete
//!    with [`Outcome::Unknown`] (a timeout) means the operation may or may not have taken effect,
//!    at any time after its invoke. A process that saw `Unknown` must go on under a new process id.
//!    Clients also record [`Record::LeaseLost`] when their local deadline fires (the end of their
//!    belief that they hold a lock) and [`Record::ProcessEnd`] when a process dies or abandons its
//!    session.
//! 2. **The service** (lockd, or the toy lock of the self-test) records its own view: grants with
//!    tokens and sessions, the end of every hold, and session expiries, in its apply order (`seq`).
//! 3. **The store** records every accepted and rejected write (and fenced read) in its own order.
//!
//! Faults and failover measurements of the nemesis are records too, so one file holds a whole run.

use std::collections::HashMap;
use std::io::{BufRead, BufWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

/// Who issued an operation. A process is sequential: at most one operation open at a time.
pub type ProcessId = u64;

/// Version written in [`Record::Meta`]; bump on incompatible changes of the format.
pub const FORMAT_VERSION: u32 = 1;

/// One line of a history file.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    /// What produced the file (optional, informative).
    Meta {
        version: u32,
        workload: String,
        #[serde(default)]
        notes: String,
    },
    /// A client is about to call `call`. `(process, op)` identifies the operation in the whole run.
    Invoke {
        process: ProcessId,
        op: u64,
        at_ns: u64,
        call: Call,
    },
    /// The call of `(process, op)` returned `outcome`.
    Complete {
        process: ProcessId,
        op: u64,
        at_ns: u64,
        outcome: Outcome,
    },
    /// The client's local deadline for `(name, token)` fired: from `deadline_ns` on, the client no
    /// longer believes it holds the lock (noticed at `at_ns`, maybe later, e.g. after a pause).
    /// The service may free the lock any time after `deadline_ns`, never before (C1).
    LeaseLost {
        process: ProcessId,
        name: String,
        token: u64,
        deadline_ns: u64,
        at_ns: u64,
    },
    /// The process died or abandoned its session at `at_ns`: any lock it holds may be freed by the
    /// service from then on. It issues no operation afterwards.
    ProcessEnd { process: ProcessId, at_ns: u64 },
    /// The service granted `name` to `session` with `token`. `seq` orders all service records of a
    /// group (the log index); `limit` is the number of holders the lock admits (1 = exclusive).
    SvcGrant {
        seq: u64,
        #[serde(default)]
        group: u64,
        name: String,
        token: u64,
        session: String,
        #[serde(default = "one")]
        limit: u32,
        #[serde(default)]
        time_ms: u64,
    },
    /// The hold `(name, token)` ended on the service (`cause`: "release", "expire", "close", ...).
    /// The service must record one for every hold it frees, including those freed by an expiry.
    SvcRelease {
        seq: u64,
        #[serde(default)]
        group: u64,
        name: String,
        token: u64,
        cause: String,
        #[serde(default)]
        time_ms: u64,
    },
    /// A hold arrived in group `group` with a bucket move (import), or came back to its group
    /// when a move was aborted: the same hold, token verbatim, not a new grant. Checked against
    /// the group's other holders (S1); its token need not rise (it was minted before).
    SvcMovedIn {
        seq: u64,
        group: u64,
        name: String,
        token: u64,
        session: String,
        limit: u32,
        #[serde(default)]
        time_ms: u64,
    },
    /// The service expired `session`: nothing may be granted to it afterwards (S4).
    SvcSessionExpired {
        seq: u64,
        #[serde(default)]
        group: u64,
        session: String,
        #[serde(default)]
        time_ms: u64,
    },
    /// `session` was brought into `group` again (adopted): a new lease there, so grants to it
    /// in that group are allowed again after an earlier expiry (leases are per group).
    SvcSessionAdopted {
        seq: u64,
        #[serde(default)]
        group: u64,
        session: String,
        #[serde(default)]
        time_ms: u64,
    },
    /// The store's key started with `value` and fence 0 (lets reads be checked from the start).
    StoreInit { key: String, value: String },
    /// The store's own log: one line per write or fenced read it served, in its commit order.
    StoreLog {
        seq: u64,
        key: String,
        op: StoreOp,
        token: Option<u64>,
        fenced: bool,
        accepted: bool,
        fence_before: u64,
        #[serde(default)]
        value: Option<String>,
    },
    /// The lock-set workload's final read of `key`.
    LocksetFinal {
        key: String,
        fenced: bool,
        elements: Vec<u64>,
    },
    /// The nemesis injected a fault of `kind` ("kill", "pause", "partition", "clock", ...);
    /// `verified` says its effect was observed (e.g. `/proc/PID/status` showed `T` for a pause).
    Fault {
        kind: String,
        at_ns: u64,
        #[serde(default)]
        target: String,
        #[serde(default)]
        verified: bool,
        /// How long the fault lasted, from `at_ns` to its undo, in milliseconds (what the
        /// nemesis logs as `for N ms`, plus the time injecting it took); 0: not known. The
        /// availability figures attribute client attempts to the window it spans.
        #[serde(default)]
        hold_ms: u64,
    },
    /// One renewal slot of a nemesis worker's session (its client sends a keepalive every
    /// TTL/3 on its own): from `at_ns`, was a keepalive sent at or after `at_ns` acknowledged
    /// by `end_ns` (`answered`), or did `end_ns` = `at_ns` + TTL/2 pass without one? Only
    /// the availability figures read these; see `nemesis::avail`.
    Renewal {
        process: ProcessId,
        at_ns: u64,
        end_ns: u64,
        answered: bool,
    },
    /// A measured failover: from the fault to the first grant served again, in milliseconds.
    Failover { at_ns: u64, ms: f64 },
}

fn one() -> u32 {
    1
}

/// What a store log line did.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum StoreOp {
    Write,
    Read,
}

/// A client operation.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
#[serde(tag = "f", rename_all = "snake_case")]
pub enum Call {
    /// Acquire the exclusive lock `name`.
    Acquire { name: String },
    /// Release `name` held with `token`.
    Release { name: String, token: u64 },
    /// Write `value` to the store's `key`; `fenced` writes carry `token` and are refused when the
    /// store has seen a newer one. `add` is the element this write adds (lock-set workload).
    Write {
        key: String,
        token: Option<u64>,
        fenced: bool,
        value: String,
        #[serde(default)]
        add: Option<u64>,
    },
    /// Read the store's `key`. With a `token`, a fenced read: it raises the key's fence to the token
    /// (refused if a newer token was seen), so an older holder can no longer write.
    Read { key: String, token: Option<u64> },
}

/// How a call returned.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Hash)]
#[serde(tag = "r", rename_all = "snake_case")]
pub enum Outcome {
    Granted {
        token: u64,
    },
    NotGranted,
    /// Release succeeded.
    Ok,
    /// Release refused: not the holder (or a stale token).
    Refused,
    /// The store accepted the write.
    Accepted,
    /// The store refused a write or fenced read: it has seen a newer token.
    RejectedStale,
    ReadOk {
        value: String,
    },
    /// The call may or may not have taken effect (timeout, connection lost).
    Unknown,
}

/// A client operation with both ends paired up. `complete_ns == None` means it may take effect at
/// any time after `invoke_ns`, or never.
#[derive(Clone, Debug, PartialEq)]
pub struct Operation {
    pub process: ProcessId,
    pub op: u64,
    pub invoke_ns: u64,
    pub complete_ns: Option<u64>,
    pub call: Call,
    pub outcome: Outcome,
}

/// A whole run.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct History {
    pub records: Vec<Record>,
}

impl History {
    /// Parses JSON lines; blank lines are skipped, any bad line is an error naming its number.
    pub fn from_jsonl(reader: impl BufRead) -> anyhow::Result<Self> {
        let mut records = Vec::new();
        for (i, line) in reader.lines().enumerate() {
            let line = line?;
            if line.trim().is_empty() {
                continue;
            }
            let rec: Record =
                serde_json::from_str(&line).with_context(|| format!("line {}", i + 1))?;
            records.push(rec);
        }
        Ok(Self { records })
    }

    /// Loads and concatenates several files (e.g. one per process).
    pub fn load(paths: &[impl AsRef<Path>]) -> anyhow::Result<Self> {
        let mut all = History::default();
        for p in paths {
            let p = p.as_ref();
            let f = std::fs::File::open(p).with_context(|| format!("open {}", p.display()))?;
            let h = Self::from_jsonl(std::io::BufReader::new(f))
                .with_context(|| format!("parse {}", p.display()))?;
            all.records.extend(h.records);
        }
        Ok(all)
    }

    pub fn write_jsonl(&self, w: impl Write) -> anyhow::Result<()> {
        let mut w = BufWriter::new(w);
        for r in &self.records {
            serde_json::to_writer(&mut w, r)?;
            w.write_all(b"\n")?;
        }
        w.flush()?;
        Ok(())
    }

    pub fn save(&self, path: impl AsRef<Path>) -> anyhow::Result<()> {
        let f = std::fs::File::create(path.as_ref())?;
        self.write_jsonl(f)
    }

    /// Pairs invokes with completes. An invoke without a complete, or completed `Unknown`, becomes
    /// an operation with `complete_ns: None`. A complete without an invoke, or a duplicate, is an
    /// error: the history is malformed and judging it would be guesswork.
    pub fn operations(&self) -> anyhow::Result<Vec<Operation>> {
        let mut open: HashMap<(ProcessId, u64), usize> = HashMap::new();
        let mut ops: Vec<Operation> = Vec::new();
        let mut done: Vec<bool> = Vec::new();
        for r in &self.records {
            match r {
                Record::Invoke {
                    process,
                    op,
                    at_ns,
                    call,
                } => {
                    if open.insert((*process, *op), ops.len()).is_some() {
                        bail!("operation ({process}, {op}) invoked twice");
                    }
                    ops.push(Operation {
                        process: *process,
                        op: *op,
                        invoke_ns: *at_ns,
                        complete_ns: None,
                        call: call.clone(),
                        outcome: Outcome::Unknown,
                    });
                    done.push(false);
                }
                Record::Complete {
                    process,
                    op,
                    at_ns,
                    outcome,
                } => {
                    let Some(&i) = open.get(&(*process, *op)) else {
                        bail!("operation ({process}, {op}) completed but never invoked");
                    };
                    if done[i] {
                        bail!("operation ({process}, {op}) completed twice");
                    }
                    done[i] = true;
                    if *at_ns < ops[i].invoke_ns {
                        bail!("operation ({process}, {op}) completed before it was invoked");
                    }
                    ops[i].outcome = outcome.clone();
                    if *outcome != Outcome::Unknown {
                        ops[i].complete_ns = Some(*at_ns);
                    }
                }
                _ => {}
            }
        }
        Ok(ops)
    }
}

/// Nanoseconds of `CLOCK_MONOTONIC` since an origin. Every process of a run on one machine reads
/// the same clock, so giving them the same origin (e.g. through `LOCKD_CHECK_ORIGIN_NS`) puts all
/// their records on one time line. The clock does not follow wall-clock jumps (faketime leaves it
/// alone with `FAKETIME_DONT_FAKE_MONOTONIC=1`).
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    origin_ns: u64,
}

impl MonotonicClock {
    /// The raw clock reading, in nanoseconds.
    pub fn raw_ns() -> u64 {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
        (t.tv_sec as u64) * 1_000_000_000 + t.tv_nsec as u64
    }

    /// A clock whose origin is now.
    pub fn start() -> Self {
        Self {
            origin_ns: Self::raw_ns(),
        }
    }

    /// A clock with a given origin (a raw reading taken by the process that started the run).
    pub fn with_origin(origin_ns: u64) -> Self {
        Self { origin_ns }
    }

    pub fn origin_ns(&self) -> u64 {
        self.origin_ns
    }

    /// Nanoseconds since the origin.
    pub fn now_ns(&self) -> u64 {
        Self::raw_ns().saturating_sub(self.origin_ns)
    }
}

/// Collects records from many tasks: in memory, and optionally appended to a file line by line
/// (each line reaches the kernel when written, so a SIGKILLed worker loses no finished line).
#[derive(Clone)]
pub struct Recorder {
    clock: MonotonicClock,
    inner: Arc<Mutex<RecorderInner>>,
}

struct RecorderInner {
    records: Vec<Record>,
    file: Option<std::fs::File>,
    next_op: HashMap<ProcessId, u64>,
}

/// An invoked operation, to be completed with [`Recorder::complete`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "an invoked operation must be completed (or left open if the process dies)"]
pub struct OpHandle {
    pub process: ProcessId,
    pub op: u64,
}

impl Recorder {
    pub fn new(clock: MonotonicClock) -> Self {
        Self {
            clock,
            inner: Arc::new(Mutex::new(RecorderInner {
                records: Vec::new(),
                file: None,
                next_op: HashMap::new(),
            })),
        }
    }

    /// Also append every record to `path` as it is recorded.
    pub fn with_file(clock: MonotonicClock, path: impl AsRef<Path>) -> anyhow::Result<Self> {
        let r = Self::new(clock);
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path.as_ref())?;
        r.lock().file = Some(f);
        Ok(r)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RecorderInner> {
        // A panicking recorder user must not hide the rest of the history.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn clock(&self) -> MonotonicClock {
        self.clock
    }

    pub fn now_ns(&self) -> u64 {
        self.clock.now_ns()
    }

    pub fn push(&self, rec: Record) {
        let mut g = self.lock();
        if let Some(f) = g.file.as_mut() {
            let mut line = serde_json::to_vec(&rec).expect("records serialize");
            line.push(b'\n');
            // Best effort: a full disk must not stop the run; the in-memory copy stays complete.
            let _ = f.write_all(&line);
        }
        g.records.push(rec);
    }

    /// Records the invoke of `call` by `process`, stamped now.
    pub fn invoke(&self, process: ProcessId, call: Call) -> OpHandle {
        let at_ns = self.now_ns();
        let op = {
            let mut g = self.lock();
            let n = g.next_op.entry(process).or_insert(0);
            *n += 1;
            *n
        };
        self.push(Record::Invoke {
            process,
            op,
            at_ns,
            call,
        });
        OpHandle { process, op }
    }

    /// Records the completion of `h`, stamped now.
    pub fn complete(&self, h: OpHandle, outcome: Outcome) {
        let at_ns = self.now_ns();
        self.push(Record::Complete {
            process: h.process,
            op: h.op,
            at_ns,
            outcome,
        });
    }

    pub fn history(&self) -> History {
        History {
            records: self.lock().records.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jsonl_round_trip_and_pairing() {
        let rec = Recorder::new(MonotonicClock::start());
        let a = rec.invoke(
            1,
            Call::Acquire {
                name: "payouts/1".into(),
            },
        );
        rec.complete(a, Outcome::Granted { token: 7 });
        let w = rec.invoke(
            1,
            Call::Write {
                key: "k".into(),
                token: Some(7),
                fenced: true,
                value: "[1]".into(),
                add: Some(1),
            },
        );
        rec.complete(w, Outcome::Unknown);
        let _open = rec.invoke(
            2,
            Call::Acquire {
                name: "payouts/1".into(),
            },
        );
        rec.push(Record::SvcGrant {
            seq: 3,
            group: 1,
            name: "payouts/1".into(),
            token: 7,
            session: "s1".into(),
            limit: 1,
            time_ms: 10,
        });
        let h = rec.history();
        let mut buf = Vec::new();
        h.write_jsonl(&mut buf).unwrap();
        let back = History::from_jsonl(&buf[..]).unwrap();
        assert_eq!(back, h);
        let ops = back.operations().unwrap();
        assert_eq!(ops.len(), 3);
        assert_eq!(ops[0].outcome, Outcome::Granted { token: 7 });
        assert!(ops[0].complete_ns.is_some());
        assert_eq!(ops[1].complete_ns, None, "unknown outcome stays open");
        assert_eq!(ops[2].complete_ns, None, "never completed stays open");
    }

    #[test]
    fn malformed_histories_are_errors() {
        let h = History {
            records: vec![Record::Complete {
                process: 1,
                op: 1,
                at_ns: 5,
                outcome: Outcome::Ok,
            }],
        };
        assert!(h.operations().is_err());
        assert!(History::from_jsonl(&b"{\"type\":\"nope\"}\n"[..]).is_err());
    }
}
