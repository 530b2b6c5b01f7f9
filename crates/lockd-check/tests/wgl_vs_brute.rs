//! Cross-checks the WGL search against brute force on thousands of small histories:
//! random ones (both must agree), ones built by running the specification at chosen linearization
//! points (both must accept), and those with a violation spliced in (both must reject).

use lockd_check::checker::brute;
use lockd_check::checker::models::{ExpireTarget, MutexModel, MutexOp, RegisterModel, RegisterOp};
use lockd_check::checker::wgl::{self, Budget, Entry, Model, Verdict};
use lockd_check::history::Outcome;
use proptest::prelude::*;

const CASES: u32 = 3000;

fn wgl_ok<M: Model>(m: &M, es: &[Entry<M::Op>]) -> bool {
    match wgl::check(m, es, Budget::default()).0 {
        Verdict::Linearizable => true,
        Verdict::NotLinearizable { .. } => false,
        Verdict::Unknown => panic!("tiny history ran out of budget"),
    }
}

fn interval(rng: &mut fastrand::Rng, unknown: bool) -> (u64, Option<u64>) {
    let call = rng.u64(0..20);
    let ret = if unknown {
        None
    } else {
        Some(call + rng.u64(0..8))
    };
    (call, ret)
}

/// Any mutex history at all: outcomes drawn at random.
fn random_mutex(seed: u64, n: usize) -> Vec<Entry<MutexOp>> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut es = Vec::new();
    for i in 0..n {
        let process = rng.u64(1..4);
        let unknown = rng.u8(0..5) == 0;
        let op = match rng.u8(0..4) {
            0 | 1 => MutexOp::Acquire {
                process,
                index: i as u32,
                outcome: if unknown {
                    Outcome::Unknown
                } else if rng.bool() {
                    Outcome::Granted {
                        token: rng.u64(1..6),
                    }
                } else {
                    Outcome::NotGranted
                },
            },
            2 => MutexOp::Release {
                process,
                token: rng.u64(1..6),
                outcome: if unknown {
                    Outcome::Unknown
                } else if rng.bool() {
                    Outcome::Ok
                } else {
                    Outcome::Refused
                },
            },
            _ => MutexOp::Expire {
                process,
                target: match rng.u8(0..3) {
                    0 => ExpireTarget::Token(rng.u64(1..6)),
                    1 => ExpireTarget::AnyOfProcess,
                    _ => ExpireTarget::UnknownAcquire(rng.u32(0..n as u32)),
                },
            },
        };
        let unknown = unknown || matches!(op, MutexOp::Expire { .. });
        let (call_ns, return_ns) = interval(&mut rng, unknown);
        es.push(Entry {
            op,
            call_ns,
            return_ns,
        });
    }
    es
}

/// A linearizable mutex history: each operation takes effect at a chosen point inside its
/// interval (unknown ones possibly never), and outcomes come from running a real mutex in that
/// order.
fn valid_mutex(seed: u64, n: usize) -> (Vec<Entry<MutexOp>>, u64) {
    let mut rng = fastrand::Rng::with_seed(seed);
    // (point, call, return, kind, process, unknown)
    struct Plan {
        point: Option<u64>,
        call: u64,
        ret: Option<u64>,
        kind: u8,
        process: u64,
    }
    let mut plans: Vec<Plan> = (0..n)
        .map(|_| {
            let kind = rng.u8(0..3);
            let unknown = kind == 2 || rng.u8(0..5) == 0;
            let (call, ret) = interval(&mut rng, unknown);
            let point = match ret {
                Some(r) => Some(rng.u64(call..=r)),
                None if rng.u8(0..3) == 0 => None,
                None => Some(call + rng.u64(0..10)),
            };
            Plan {
                point,
                call,
                ret,
                kind,
                process: rng.u64(1..4),
            }
        })
        .collect();
    plans.sort_by_key(|p| p.point.unwrap_or(u64::MAX));
    let mut holder: Option<(u64, Option<u64>, u32)> = None; // (process, token, acquire index)
    let mut next_token = 1u64;
    let mut es: Vec<Entry<MutexOp>> = Vec::new();
    for p in &plans {
        let idx = es.len() as u32;
        let happened = p.point.is_some();
        let unknown = p.ret.is_none();
        let op = match p.kind {
            0 => {
                // acquire
                if !happened {
                    MutexOp::Acquire {
                        process: p.process,
                        index: idx,
                        outcome: Outcome::Unknown,
                    }
                } else if holder.is_none() {
                    let token = next_token;
                    next_token += rng.u64(1..3);
                    holder = Some((p.process, (!unknown).then_some(token), idx));
                    MutexOp::Acquire {
                        process: p.process,
                        index: idx,
                        outcome: if unknown {
                            Outcome::Unknown
                        } else {
                            Outcome::Granted { token }
                        },
                    }
                } else if unknown {
                    // An unknown acquire that found the lock held had no effect.
                    MutexOp::Acquire {
                        process: p.process,
                        index: idx,
                        outcome: Outcome::NotGranted,
                    }
                } else {
                    MutexOp::Acquire {
                        process: p.process,
                        index: idx,
                        outcome: Outcome::NotGranted,
                    }
                }
            }
            1 => {
                // release: of the held token if this process holds a known one, else a guess
                let (token, mine) = match holder {
                    Some((hp, Some(t), _)) if hp == p.process => (t, true),
                    _ => (rng.u64(1..6), false),
                };
                let mine = mine && happened;
                if mine {
                    holder = None;
                }
                MutexOp::Release {
                    process: p.process,
                    token,
                    outcome: if unknown {
                        Outcome::Unknown
                    } else if mine {
                        Outcome::Ok
                    } else {
                        Outcome::Refused
                    },
                }
            }
            _ => {
                // expire the current holder (if any and if it happens)
                match holder {
                    Some((hp, t, ai)) if happened => {
                        holder = None;
                        MutexOp::Expire {
                            process: hp,
                            target: match t {
                                Some(t) if rng.bool() => ExpireTarget::Token(t),
                                None if rng.bool() => ExpireTarget::UnknownAcquire(ai),
                                _ => ExpireTarget::AnyOfProcess,
                            },
                        }
                    }
                    _ => MutexOp::Expire {
                        process: p.process,
                        target: ExpireTarget::AnyOfProcess,
                    },
                }
            }
        };
        // A release guessed while not holding, that "happened" as unknown, is still fine: it has
        // no effect, which is covered by leaving it out.
        es.push(Entry {
            op,
            call_ns: p.call,
            return_ns: p.ret,
        });
    }
    // The UnknownAcquire targets name entry indices: keep entries in this order (no shuffle).
    (es, next_token)
}

/// Appends a violation that no order can explain.
fn splice_violation(es: &mut Vec<Entry<MutexOp>>, next_token: u64, kind: u8) {
    let end = es
        .iter()
        .map(|e| e.return_ns.unwrap_or(e.call_ns))
        .max()
        .unwrap_or(0)
        + 100;
    let t = next_token + 10;
    let acq = |process: u64, index: u32, token: u64, a: u64, b: u64| Entry {
        op: MutexOp::Acquire {
            process,
            index,
            outcome: Outcome::Granted { token },
        },
        call_ns: a,
        return_ns: Some(b),
    };
    let n = es.len() as u32;
    match kind {
        // Two grants in sequence with nothing to free the first.
        0 => {
            es.push(acq(98, n, t, end, end + 1));
            es.push(acq(99, n + 1, t + 5, end + 2, end + 3));
        }
        // A token regression after a clean release.
        1 => {
            es.push(acq(98, n, t, end, end + 1));
            es.push(Entry {
                op: MutexOp::Release {
                    process: 98,
                    token: t,
                    outcome: Outcome::Ok,
                },
                call_ns: end + 2,
                return_ns: Some(end + 3),
            });
            es.push(acq(99, n + 2, t, end + 4, end + 5));
        }
        // A grant to someone else before the holder's deadline (C1).
        2 => {
            es.push(acq(98, n, t, end, end + 1));
            es.push(Entry {
                op: MutexOp::Expire {
                    process: 98,
                    target: ExpireTarget::Token(t),
                },
                call_ns: end + 10,
                return_ns: None,
            });
            es.push(acq(99, n + 2, t + 1, end + 3, end + 5));
        }
        // The holder's release refused.
        _ => {
            es.push(acq(98, n, t, end, end + 1));
            es.push(Entry {
                op: MutexOp::Release {
                    process: 98,
                    token: t,
                    outcome: Outcome::Refused,
                },
                call_ns: end + 2,
                return_ns: Some(end + 3),
            });
        }
    }
}

fn random_register(seed: u64, n: usize) -> (Vec<Entry<RegisterOp>>, Option<u32>) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut es = Vec::new();
    for _ in 0..n {
        let unknown = rng.u8(0..5) == 0;
        let (call_ns, return_ns) = interval(&mut rng, unknown);
        let token = Some(rng.u64(0..5));
        let op = if rng.bool() {
            RegisterOp::Write {
                token,
                fenced: rng.u8(0..4) != 0,
                value: rng.u32(0..3),
                outcome: if unknown {
                    Outcome::Unknown
                } else if rng.bool() {
                    Outcome::Accepted
                } else {
                    Outcome::RejectedStale
                },
            }
        } else {
            let fenced_read = rng.bool();
            let ok = rng.bool();
            RegisterOp::Read {
                token: if fenced_read { token } else { None },
                value: ok.then(|| rng.u32(0..3)),
                outcome: if unknown {
                    Outcome::Unknown
                } else if ok {
                    Outcome::ReadOk {
                        value: String::new(),
                    }
                } else {
                    Outcome::RejectedStale
                },
            }
        };
        es.push(Entry {
            op,
            call_ns,
            return_ns,
        });
    }
    (es, rng.bool().then_some(0))
}

/// A linearizable register history: a real fenced register run at chosen points.
fn valid_register(seed: u64, n: usize) -> Vec<Entry<RegisterOp>> {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut plans: Vec<(Option<u64>, u64, Option<u64>)> = (0..n)
        .map(|_| {
            let unknown = rng.u8(0..5) == 0;
            let (c, r) = interval(&mut rng, unknown);
            let point = match r {
                Some(r) => Some(rng.u64(c..=r)),
                None if rng.bool() => None,
                None => Some(c + rng.u64(0..10)),
            };
            (point, c, r)
        })
        .collect();
    plans.sort_by_key(|p| p.0.unwrap_or(u64::MAX));
    let (mut fence, mut value) = (0u64, 0u32);
    let mut es = Vec::new();
    for (point, call_ns, return_ns) in plans {
        let token = rng.u64(0..6);
        let unknown = return_ns.is_none();
        let happened = point.is_some();
        let op = if rng.bool() {
            let fenced = rng.u8(0..4) != 0;
            let v = rng.u32(0..4);
            let ok = !fenced || token >= fence;
            if happened && ok {
                fence = token;
                value = v;
            }
            RegisterOp::Write {
                token: Some(token),
                fenced,
                value: v,
                outcome: if unknown {
                    Outcome::Unknown
                } else if ok {
                    Outcome::Accepted
                } else {
                    Outcome::RejectedStale
                },
            }
        } else if rng.bool() || unknown {
            // fenced read
            let ok = token >= fence;
            if happened && ok {
                fence = token;
            }
            RegisterOp::Read {
                token: Some(token),
                value: ok.then_some(value),
                outcome: if unknown {
                    Outcome::Unknown
                } else if ok {
                    Outcome::ReadOk {
                        value: String::new(),
                    }
                } else {
                    Outcome::RejectedStale
                },
            }
        } else {
            RegisterOp::Read {
                token: None,
                value: Some(value),
                outcome: Outcome::ReadOk {
                    value: String::new(),
                },
            }
        };
        es.push(Entry {
            op,
            call_ns,
            return_ns,
        });
    }
    es
}

proptest! {
    #![proptest_config(ProptestConfig { cases: CASES, ..ProptestConfig::default() })]

    #[test]
    fn mutex_random_histories_agree(seed in any::<u64>(), n in 1usize..8) {
        let es = random_mutex(seed, n);
        prop_assert_eq!(wgl_ok(&MutexModel, &es), brute::linearizable(&MutexModel, &es), "{:#?}", es);
    }

    #[test]
    fn mutex_constructed_linearizable_accepted(seed in any::<u64>(), n in 1usize..9) {
        let (es, _) = valid_mutex(seed, n);
        prop_assert!(brute::linearizable(&MutexModel, &es), "brute rejected {:#?}", es);
        prop_assert!(wgl_ok(&MutexModel, &es), "wgl rejected {:#?}", es);
    }

    #[test]
    fn mutex_constructed_violations_rejected(seed in any::<u64>(), n in 0usize..7, kind in 0u8..4) {
        let (mut es, next) = valid_mutex(seed, n);
        splice_violation(&mut es, next, kind);
        prop_assert!(!brute::linearizable(&MutexModel, &es), "brute accepted {:#?}", es);
        prop_assert!(!wgl_ok(&MutexModel, &es), "wgl accepted {:#?}", es);
    }

    #[test]
    fn register_random_histories_agree(seed in any::<u64>(), n in 1usize..8) {
        let (es, init) = random_register(seed, n);
        let m = RegisterModel { init };
        prop_assert_eq!(wgl_ok(&m, &es), brute::linearizable(&m, &es), "{:#?}", es);
    }

    #[test]
    fn register_constructed_linearizable_accepted(seed in any::<u64>(), n in 1usize..9) {
        let es = valid_register(seed, n);
        let m = RegisterModel { init: Some(0) };
        prop_assert!(brute::linearizable(&m, &es), "brute rejected {:#?}", es);
        prop_assert!(wgl_ok(&m, &es), "wgl rejected {:#?}", es);
    }
}

/// How often random histories are linearizable: the agreement test is only meaningful if both
/// verdicts occur often.
#[test]
fn random_histories_cover_both_verdicts() {
    let (mut yes, mut no) = (0, 0);
    for seed in 0..2000u64 {
        let es = random_mutex(seed, 1 + (seed % 6) as usize);
        if brute::linearizable(&MutexModel, &es) {
            yes += 1;
        } else {
            no += 1;
        }
    }
    assert!(yes > 200 && no > 200, "yes={yes} no={no}");
}

/// A long linearizable history (a mutex passed around by 5 processes, with leases lost and unknown
/// outcomes) is checked well within budget; a tiny budget gives "unknown", not a hang.
#[test]
fn long_history_within_budget_and_budget_exhaustion_is_unknown() {
    let mut rng = fastrand::Rng::with_seed(7);
    let mut es: Vec<Entry<MutexOp>> = Vec::new();
    let mut t = 0u64;
    let mut token = 0u64;
    for round in 0..2000u64 {
        let p = round % 5 + 1;
        token += rng.u64(1..4);
        // Other processes try concurrently and are refused (dropped by the splitter in real
        // histories; kept here to load the search).
        for q in 1..=5u64 {
            if q != p {
                es.push(Entry {
                    op: MutexOp::Acquire {
                        process: q,
                        index: es.len() as u32,
                        outcome: Outcome::NotGranted,
                    },
                    call_ns: t,
                    return_ns: Some(t + 3),
                });
            }
        }
        es.push(Entry {
            op: MutexOp::Acquire {
                process: p,
                index: es.len() as u32,
                outcome: Outcome::Granted { token },
            },
            call_ns: t,
            return_ns: Some(t + 2),
        });
        if rng.u8(0..4) == 0 {
            es.push(Entry {
                op: MutexOp::Expire {
                    process: p,
                    target: ExpireTarget::Token(token),
                },
                call_ns: t + 4,
                return_ns: None,
            });
            es.push(Entry {
                op: MutexOp::Release {
                    process: p,
                    token,
                    outcome: Outcome::Unknown,
                },
                call_ns: t + 5,
                return_ns: None,
            });
        } else {
            es.push(Entry {
                op: MutexOp::Release {
                    process: p,
                    token,
                    outcome: Outcome::Ok,
                },
                call_ns: t + 4,
                return_ns: Some(t + 6),
            });
        }
        t += 10;
    }
    let started = std::time::Instant::now();
    let (v, steps) = wgl::check(&MutexModel, &es, Budget::default());
    assert_eq!(v, Verdict::Linearizable);
    assert!(
        started.elapsed().as_secs() < 20,
        "took {:?}",
        started.elapsed()
    );
    eprintln!(
        "{} ops checked in {:?} ({steps} steps)",
        es.len(),
        started.elapsed()
    );
    let tiny = Budget {
        max_steps: 50,
        ..Budget::default()
    };
    assert_eq!(wgl::check(&MutexModel, &es, tiny).0, Verdict::Unknown);
}
