//! Linearizability search in the style of Wing & Gong, with Lowe's memoization, as porcupine does.
//!
//! The history of one object becomes a list of call and return events sorted by time (a call
//! before a return at the same instant, so touching operations count as concurrent). The search
//! walks the list: at a call it tries to linearize that operation now (the model accepts it from the
//! current state), lifting its call and return out of the list; at a return whose operation has not
//! been linearized it backtracks. A set of (linearized-set bitset, state) pairs already explored
//! prunes repeated work. Operations whose outcome is unknown return at "infinity": they may be
//! linearized anywhere after their call, or never, so reaching an infinite return means every
//! operation that had to take effect did.
//!
//! Every loop is bounded by a [`Budget`]: past it the answer is [`Verdict::Unknown`], never a hang.

use std::collections::HashSet;
use std::fmt::Debug;
use std::hash::Hash;
use std::time::{Duration, Instant};

/// A sequential specification.
pub trait Model {
    type State: Clone + Eq + Hash + Debug;
    type Op: Debug;
    fn init(&self) -> Self::State;
    /// The state after `op` (with its recorded outcome) from `state`, or `None` if the
    /// specification does not allow that outcome there. For an operation with an unknown outcome,
    /// return the state after it took effect; "it had no effect" is covered by never linearizing it.
    fn step(&self, state: &Self::State, op: &Self::Op) -> Option<Self::State>;
}

/// One operation of one object's history.
#[derive(Clone, Debug)]
pub struct Entry<Op> {
    pub op: Op,
    pub call_ns: u64,
    /// `None`: the outcome is unknown; it may take effect any time after `call_ns`, or never.
    pub return_ns: Option<u64>,
}

/// Limits of one search.
#[derive(Clone, Copy, Debug)]
pub struct Budget {
    pub max_steps: u64,
    pub max_time: Duration,
}

impl Default for Budget {
    fn default() -> Self {
        Self {
            max_steps: 50_000_000,
            max_time: Duration::from_secs(60),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Linearizable,
    /// No order works. `stuck_at`: index of an operation that could never be linearized before its
    /// return in the deepest attempt (a hint for the report, not a proof of blame).
    NotLinearizable {
        stuck_at: usize,
    },
    /// The budget ran out first.
    Unknown,
}

const NIL: usize = usize::MAX;

struct Ev {
    op: usize,
    is_call: bool,
    /// The node of the other end of the same operation.
    other: usize,
}

/// Checks `entries` against `model`; also returns the number of search steps taken.
pub fn check<M: Model>(model: &M, entries: &[Entry<M::Op>], budget: Budget) -> (Verdict, u64) {
    let n = entries.len();
    if n == 0 {
        return (Verdict::Linearizable, 0);
    }
    // Node 0 is the head sentinel; events are nodes 1..=2n.
    let mut order: Vec<(u64, bool, usize)> = Vec::with_capacity(2 * n);
    for (i, e) in entries.iter().enumerate() {
        order.push((e.call_ns, false, i));
        order.push((e.return_ns.unwrap_or(u64::MAX), true, i));
    }
    // (time, is_return): calls sort before returns at equal times.
    order.sort();
    let mut evs: Vec<Ev> = Vec::with_capacity(2 * n + 1);
    evs.push(Ev {
        op: NIL,
        is_call: false,
        other: NIL,
    });
    let mut call_node = vec![NIL; n];
    let mut ret_node = vec![NIL; n];
    for (k, &(_, is_ret, op)) in order.iter().enumerate() {
        let node = k + 1;
        if is_ret {
            ret_node[op] = node;
        } else {
            call_node[op] = node;
        }
        evs.push(Ev {
            op,
            is_call: !is_ret,
            other: NIL,
        });
    }
    for op in 0..n {
        evs[call_node[op]].other = ret_node[op];
        evs[ret_node[op]].other = call_node[op];
    }
    let total = evs.len();
    let mut next: Vec<usize> = (0..total).map(|i| i + 1).collect();
    next[total - 1] = NIL;
    let mut prev: Vec<usize> = (0..total).map(|i| i.wrapping_sub(1)).collect();
    prev[0] = NIL;
    let is_inf_return = |node: usize| -> bool {
        let e = &evs[node];
        !e.is_call && entries[e.op].return_ns.is_none()
    };

    let words = n.div_ceil(64);
    let mut linearized = vec![0u64; words];
    let mut cache: HashSet<(Vec<u64>, M::State)> = HashSet::new();
    let mut calls: Vec<(usize, M::State)> = Vec::new();
    let mut state = model.init();
    let mut entry = next[0];
    let mut steps: u64 = 0;
    let started = Instant::now();
    let mut deepest = 0usize;
    let mut stuck_at = 0usize;

    // Removes node x from the list (dancing links: x keeps its own pointers for `unlink`).
    fn unlink(next: &mut [usize], prev: &mut [usize], x: usize) {
        let (p, nx) = (prev[x], next[x]);
        next[p] = nx;
        if nx != NIL {
            prev[nx] = p;
        }
    }
    fn relink(next: &mut [usize], prev: &mut [usize], x: usize) {
        let (p, nx) = (prev[x], next[x]);
        next[p] = x;
        if nx != NIL {
            prev[nx] = x;
        }
    }

    while next[0] != NIL {
        steps += 1;
        if steps > budget.max_steps
            || (steps.is_multiple_of(4096) && started.elapsed() > budget.max_time)
        {
            return (Verdict::Unknown, steps);
        }
        if entry == NIL {
            // Cannot happen: the last node of a non-empty list is a return. Treated as a dead end.
            return (Verdict::Unknown, steps);
        }
        if is_inf_return(entry) {
            // Every operation left to linearize has an unknown outcome: leave them out.
            return (Verdict::Linearizable, steps);
        }
        let ev = &evs[entry];
        if ev.is_call {
            let op = ev.op;
            let mut advanced = false;
            if let Some(new_state) = model.step(&state, &entries[op].op) {
                linearized[op / 64] |= 1 << (op % 64);
                if cache.insert((linearized.clone(), new_state.clone())) {
                    calls.push((entry, state));
                    state = new_state;
                    let ret = ev.other;
                    unlink(&mut next, &mut prev, entry);
                    unlink(&mut next, &mut prev, ret);
                    entry = next[0];
                    advanced = true;
                    if calls.len() > deepest {
                        deepest = calls.len();
                    }
                } else {
                    linearized[op / 64] &= !(1 << (op % 64));
                }
            }
            if !advanced {
                entry = next[entry];
            }
        } else {
            // A return of an operation not yet linearized: backtrack.
            if calls.len() >= deepest {
                stuck_at = ev.op;
            }
            let Some((call, old_state)) = calls.pop() else {
                return (Verdict::NotLinearizable { stuck_at }, steps);
            };
            let op = evs[call].op;
            linearized[op / 64] &= !(1 << (op % 64));
            state = old_state;
            relink(&mut next, &mut prev, evs[call].other);
            relink(&mut next, &mut prev, call);
            entry = next[call];
        }
    }
    (Verdict::Linearizable, steps)
}
