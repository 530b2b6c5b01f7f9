//! Sequential specifications of the two kinds of object a run touches, and how a [`History`] is cut
//! into one history per object (linearizability is local: a history is linearizable if and only if
//! each object's sub-history is).
//!
//! * A **lock name** is a mutex whose grants carry strictly increasing tokens and whose release
//!   succeeds only for the current holder. Leases add one implicit operation, `Expire`: the service
//!   frees a hold on its own. It is optional (it may never happen) and may happen only after the
//!   client stopped believing it holds the lock: after its `LeaseLost` deadline, its `ProcessEnd`,
//!   or (for an acquire whose outcome is unknown) any time after that acquire's invoke.
//!   A refused acquire (`NotGranted`) is always allowed: the spec checks safety, not liveness, and
//!   lockd may refuse a free lock (lock-delay, S8), so refusals carry no information here.
//! * A **store key** is a register with a fence: a fenced write (or fenced read) with token `t`
//!   succeeds iff `t >= fence` and sets the fence to `t`; an unfenced write always succeeds.

use std::collections::{BTreeMap, HashMap};

use super::wgl::{Entry, Model};
use crate::history::{Call, History, Outcome, ProcessId, Record};

// ---------------------------------------------------------------------------------------------
// Mutex with fencing tokens

/// Who the mutex spec thinks holds the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Holder {
    pub process: ProcessId,
    pub token: HolderToken,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HolderToken {
    Known(u64),
    /// Granted by an acquire whose outcome (and so token) is unknown; the number is that acquire's
    /// index in the object's entries.
    Unknown(u32),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MutexState {
    pub holder: Option<Holder>,
    /// The smallest token the next grant may carry (tokens strictly increase; an unknown grant
    /// used at least one token, and assuming the smallest is never worse).
    pub min_next: u64,
}

/// What an `Expire` frees.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExpireTarget {
    /// The hold of this process with this token (the client's deadline fired).
    Token(u64),
    /// Any hold of this process (it died or abandoned its session).
    AnyOfProcess,
    /// The hold created by the unknown-outcome acquire at this entry index.
    UnknownAcquire(u32),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MutexOp {
    Acquire {
        process: ProcessId,
        /// This entry's index (names an unknown hold).
        index: u32,
        outcome: Outcome,
    },
    Release {
        process: ProcessId,
        token: u64,
        outcome: Outcome,
    },
    Expire {
        process: ProcessId,
        target: ExpireTarget,
    },
}

pub struct MutexModel;

impl Model for MutexModel {
    type State = MutexState;
    type Op = MutexOp;

    fn init(&self) -> MutexState {
        MutexState {
            holder: None,
            min_next: 0,
        }
    }

    fn step(&self, s: &MutexState, op: &MutexOp) -> Option<MutexState> {
        match op {
            MutexOp::Acquire {
                process,
                index,
                outcome,
            } => match outcome {
                Outcome::Granted { token } => {
                    (s.holder.is_none() && *token >= s.min_next).then(|| MutexState {
                        holder: Some(Holder {
                            process: *process,
                            token: HolderToken::Known(*token),
                        }),
                        min_next: token.saturating_add(1),
                    })
                }
                Outcome::NotGranted => Some(*s),
                Outcome::Unknown => s.holder.is_none().then(|| MutexState {
                    holder: Some(Holder {
                        process: *process,
                        token: HolderToken::Unknown(*index),
                    }),
                    min_next: s.min_next.saturating_add(1),
                }),
                _ => None,
            },
            MutexOp::Release {
                process,
                token,
                outcome,
            } => {
                let is_holder = s.holder
                    == Some(Holder {
                        process: *process,
                        token: HolderToken::Known(*token),
                    });
                match outcome {
                    Outcome::Ok | Outcome::Unknown => is_holder.then_some(MutexState {
                        holder: None,
                        min_next: s.min_next,
                    }),
                    Outcome::Refused => (!is_holder).then_some(*s),
                    _ => None,
                }
            }
            MutexOp::Expire { process, target } => {
                let h = s.holder?;
                let hit = match target {
                    ExpireTarget::Token(t) => {
                        h.process == *process && h.token == HolderToken::Known(*t)
                    }
                    ExpireTarget::AnyOfProcess => h.process == *process,
                    ExpireTarget::UnknownAcquire(i) => h.token == HolderToken::Unknown(*i),
                };
                hit.then_some(MutexState {
                    holder: None,
                    min_next: s.min_next,
                })
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Fenced register

/// Values are interned per key so states stay small and cheap to hash.
pub type ValueId = u32;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RegisterState {
    pub fence: u64,
    /// `None`: not yet observed and no `StoreInit` given (the first read fixes it).
    pub value: Option<ValueId>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RegisterOp {
    Write {
        token: Option<u64>,
        fenced: bool,
        value: ValueId,
        outcome: Outcome,
    },
    /// `token`: a fenced read (raises the fence). `value`: what a successful read returned.
    Read {
        token: Option<u64>,
        value: Option<ValueId>,
        outcome: Outcome,
    },
}

pub struct RegisterModel {
    pub init: Option<ValueId>,
}

impl Model for RegisterModel {
    type State = RegisterState;
    type Op = RegisterOp;

    fn init(&self) -> RegisterState {
        RegisterState {
            fence: 0,
            value: self.init,
        }
    }

    fn step(&self, s: &RegisterState, op: &RegisterOp) -> Option<RegisterState> {
        match op {
            RegisterOp::Write {
                token,
                fenced,
                value,
                outcome,
            } => {
                let t = token.unwrap_or(0);
                let applied = RegisterState {
                    fence: if *fenced || token.is_some() {
                        t
                    } else {
                        s.fence
                    },
                    value: Some(*value),
                };
                match (fenced, outcome) {
                    (true, Outcome::Accepted | Outcome::Unknown) => {
                        (t >= s.fence).then_some(applied)
                    }
                    (true, Outcome::RejectedStale) => (t < s.fence).then_some(*s),
                    (false, Outcome::Accepted | Outcome::Unknown) => Some(applied),
                    _ => None,
                }
            }
            RegisterOp::Read {
                token,
                value,
                outcome,
            } => {
                let matches = |v: &Option<ValueId>| s.value.is_none() || s.value == *v;
                match (token, outcome) {
                    (None, Outcome::ReadOk { .. }) => matches(value).then_some(RegisterState {
                        fence: s.fence,
                        value: *value,
                    }),
                    (Some(t), Outcome::ReadOk { .. }) => (*t >= s.fence && matches(value))
                        .then_some(RegisterState {
                            fence: *t,
                            value: *value,
                        }),
                    (Some(t), Outcome::RejectedStale) => (*t < s.fence).then_some(*s),
                    (Some(t), Outcome::Unknown) => (*t >= s.fence).then_some(RegisterState {
                        fence: *t,
                        value: s.value,
                    }),
                    _ => None,
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Cutting a history into objects

/// One object's sub-history, ready for the search.
pub enum ObjectHistory {
    Lock {
        name: String,
        entries: Vec<Entry<MutexOp>>,
    },
    Store {
        key: String,
        init: Option<ValueId>,
        entries: Vec<Entry<RegisterOp>>,
    },
}

impl ObjectHistory {
    pub fn label(&self) -> String {
        match self {
            ObjectHistory::Lock { name, .. } => format!("lock {name:?}"),
            ObjectHistory::Store { key, .. } => format!("store key {key:?}"),
        }
    }
    pub fn len(&self) -> usize {
        match self {
            ObjectHistory::Lock { entries, .. } => entries.len(),
            ObjectHistory::Store { entries, .. } => entries.len(),
        }
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn entry<O>(op: O, call_ns: u64, return_ns: Option<u64>) -> Entry<O> {
    Entry {
        op,
        call_ns,
        return_ns,
    }
}

/// Per store key while splitting: interned values and entries.
type StoreAcc = (HashMap<String, ValueId>, Vec<Entry<RegisterOp>>);

/// Splits `h` into per-object histories (sorted by name for a stable report).
pub fn split(h: &History) -> anyhow::Result<Vec<ObjectHistory>> {
    let ops = h.operations()?;
    let mut locks: BTreeMap<String, Vec<Entry<MutexOp>>> = BTreeMap::new();
    let mut stores: BTreeMap<String, StoreAcc> = BTreeMap::new();
    let mut inits: HashMap<String, String> = HashMap::new();
    // Lock names each process touched (for ProcessEnd).
    let mut names_of: HashMap<ProcessId, Vec<String>> = HashMap::new();

    fn intern(values: &mut HashMap<String, ValueId>, v: &str) -> ValueId {
        let n = values.len() as ValueId;
        *values.entry(v.to_owned()).or_insert(n)
    }

    for o in &ops {
        match &o.call {
            Call::Acquire { name } => {
                let es = locks.entry(name.clone()).or_default();
                let names = names_of.entry(o.process).or_default();
                if !names.contains(name) {
                    names.push(name.clone());
                }
                if o.outcome == Outcome::NotGranted {
                    // Always allowed and without effect: nothing to check.
                    continue;
                }
                let index = es.len() as u32;
                es.push(entry(
                    MutexOp::Acquire {
                        process: o.process,
                        index,
                        outcome: o.outcome.clone(),
                    },
                    o.invoke_ns,
                    o.complete_ns,
                ));
                if o.complete_ns.is_none() {
                    es.push(entry(
                        MutexOp::Expire {
                            process: o.process,
                            target: ExpireTarget::UnknownAcquire(index),
                        },
                        o.invoke_ns,
                        None,
                    ));
                }
            }
            Call::Release { name, token } => {
                locks.entry(name.clone()).or_default().push(entry(
                    MutexOp::Release {
                        process: o.process,
                        token: *token,
                        outcome: o.outcome.clone(),
                    },
                    o.invoke_ns,
                    o.complete_ns,
                ));
            }
            Call::Write {
                key,
                token,
                fenced,
                value,
                ..
            } => {
                let (values, es) = stores.entry(key.clone()).or_default();
                let value = intern(values, value);
                es.push(entry(
                    RegisterOp::Write {
                        token: *token,
                        fenced: *fenced,
                        value,
                        outcome: o.outcome.clone(),
                    },
                    o.invoke_ns,
                    o.complete_ns,
                ));
            }
            Call::Read { key, token } => {
                let (values, es) = stores.entry(key.clone()).or_default();
                if token.is_none() && o.outcome == Outcome::Unknown {
                    // A plain read with no answer changes nothing.
                    continue;
                }
                let value = match &o.outcome {
                    Outcome::ReadOk { value } => Some(intern(values, value)),
                    _ => None,
                };
                es.push(entry(
                    RegisterOp::Read {
                        token: *token,
                        value,
                        outcome: o.outcome.clone(),
                    },
                    o.invoke_ns,
                    o.complete_ns,
                ));
            }
        }
    }
    for r in &h.records {
        match r {
            Record::LeaseLost {
                process,
                name,
                token,
                deadline_ns,
                ..
            } => locks.entry(name.clone()).or_default().push(entry(
                MutexOp::Expire {
                    process: *process,
                    target: ExpireTarget::Token(*token),
                },
                *deadline_ns,
                None,
            )),
            Record::ProcessEnd { process, at_ns } => {
                for name in names_of.get(process).into_iter().flatten() {
                    locks.entry(name.clone()).or_default().push(entry(
                        MutexOp::Expire {
                            process: *process,
                            target: ExpireTarget::AnyOfProcess,
                        },
                        *at_ns,
                        None,
                    ));
                }
            }
            Record::StoreInit { key, value } => {
                inits.insert(key.clone(), value.clone());
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for (name, entries) in locks {
        out.push(ObjectHistory::Lock { name, entries });
    }
    for (key, (mut values, entries)) in stores {
        let init = inits.get(&key).map(|v| intern(&mut values, v));
        out.push(ObjectHistory::Store { key, init, entries });
    }
    Ok(out)
}
