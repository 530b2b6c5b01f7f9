//! The obviously-correct reference for [`super::wgl`]: try every order of the operations that
//! respects real time (a before b when a returned before b was called), leaving out any subset of
//! the operations whose outcome is unknown, and run the model along it. Exponential; for histories
//! of a handful of operations only, to cross-check the real search.

use super::wgl::{Entry, Model};

/// Longest history accepted (orders grow as n!).
pub const MAX_OPS: usize = 10;

/// True if some real-time-respecting order of `entries` (unknown ones optional) is accepted by
/// `model`. Panics on more than [`MAX_OPS`] operations.
pub fn linearizable<M: Model>(model: &M, entries: &[Entry<M::Op>]) -> bool {
    assert!(
        entries.len() <= MAX_OPS,
        "brute force is for tiny histories"
    );
    // must_precede[j]: ops that returned before j was called.
    let n = entries.len();
    let mut must_precede = vec![0u32; n];
    for (j, ej) in entries.iter().enumerate() {
        for (i, ei) in entries.iter().enumerate() {
            if let Some(r) = ei.return_ns {
                if i != j && r < ej.call_ns {
                    must_precede[j] |= 1 << i;
                }
            }
        }
    }
    let required: u32 = entries
        .iter()
        .enumerate()
        .filter(|(_, e)| e.return_ns.is_some())
        .fold(0, |m, (i, _)| m | 1 << i);
    search(model, entries, &must_precede, required, 0, model.init())
}

fn search<M: Model>(
    model: &M,
    entries: &[Entry<M::Op>],
    must_precede: &[u32],
    required: u32,
    done: u32,
    state: M::State,
) -> bool {
    if done & required == required {
        return true;
    }
    for j in 0..entries.len() {
        if done & (1 << j) != 0 || must_precede[j] & !done != 0 {
            continue;
        }
        if let Some(s) = model.step(&state, &entries[j].op) {
            if search(model, entries, must_precede, required, done | 1 << j, s) {
                return true;
            }
        }
    }
    false
}
