//! Each rule of the protocol, asserted as the exact reply and effects it produces.

use std::sync::Arc;

use lockd_core::*;

/// A table plus a group clock, checking the invariants after every command.
struct H {
    t: LockTable,
    now: u64,
}

const X: LockMode = LockMode::Exclusive;
const R: LockMode = LockMode::Shared;

fn sem(limit: u32) -> LockMode {
    LockMode::Semaphore { limit }
}

fn granted(waiter: WaiterId, session: SessionId, name: &str, token: Token) -> Effect {
    Effect::Granted {
        waiter,
        session,
        name: Arc::from(name),
        token,
        lease_ttl_ms: 15_000,
        group_moves: 0,
    }
}

fn wait_ended(waiter: WaiterId, session: SessionId, name: &str, reason: WaitEndReason) -> Effect {
    Effect::WaitEnded {
        waiter,
        session,
        name: Arc::from(name),
        reason,
    }
}

impl H {
    fn new() -> H {
        H {
            t: LockTable::new(),
            now: 1_000,
        }
    }

    fn run(&mut self, op: Op) -> Applied {
        let out = self.t.apply(&Command {
            now_ms: self.now,
            op,
        });
        self.t.check_invariants().unwrap();
        out
    }

    fn ok(&mut self, op: Op) -> (Reply, Vec<Effect>) {
        let out = self.run(op);
        (out.reply.expect("command should succeed"), out.effects)
    }

    /// Runs a command that must be rejected, and checks that nothing changed.
    fn rej(&mut self, op: Op) -> Rejection {
        let before = self.t.snapshot();
        let out = self.run(op);
        assert!(out.effects.is_empty());
        assert_eq!(
            before,
            self.t.snapshot(),
            "a rejected command changed the state"
        );
        out.reply.expect_err("command should be rejected")
    }

    fn open(&mut self, id: u64) -> SessionId {
        let s = SessionId(id);
        let r = self.ok(Op::OpenSession {
            session: s,
            client: format!("client-{id}"),
            ttl_ms: 0,
            namespace: String::new(),
        });
        assert_eq!(
            r,
            (
                Reply::SessionOpened {
                    session: s,
                    ttl_ms: 15_000
                },
                vec![]
            )
        );
        s
    }

    /// Opens session `id` in namespace `ns` with `ttl_ms`.
    fn open_in(&mut self, id: u64, ns: &str, ttl_ms: u64) -> SessionId {
        let s = SessionId(id);
        let (reply, _) = self.ok(Op::OpenSession {
            session: s,
            client: format!("client-{id}"),
            ttl_ms,
            namespace: ns.into(),
        });
        assert_eq!(reply, Reply::SessionOpened { session: s, ttl_ms });
        s
    }

    fn acquire_op(s: SessionId, name: &str, mode: LockMode, wait_ms: u64) -> Op {
        Op::Acquire {
            session: s,
            name: name.into(),
            owner: format!("owner-{}", s.0),
            mode,
            wait_ms,
            reentrant: false,
        }
    }

    fn acq(&mut self, s: SessionId, name: &str, mode: LockMode, wait_ms: u64) -> Reply {
        let (reply, effects) = self.ok(Self::acquire_op(s, name, mode, wait_ms));
        assert!(effects.is_empty());
        reply
    }

    fn token(&mut self, s: SessionId, name: &str, mode: LockMode) -> Token {
        match self.acq(s, name, mode, 0) {
            Reply::Acquired {
                token,
                reentry: 1,
                lease_ttl_ms: 15_000,
                ..
            } => token,
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    fn release(&mut self, s: SessionId, name: &str, token: Token) -> (Reply, Vec<Effect>) {
        self.ok(Op::Release {
            session: s,
            name: name.into(),
            token,
        })
    }

    fn put_ns(&mut self, prefix: &str, f: impl FnOnce(&mut Namespace)) {
        let mut ns = Namespace::default_namespace();
        ns.name = prefix.trim_end_matches('/').to_string();
        ns.prefix = prefix.to_string();
        f(&mut ns);
        assert_eq!(
            self.ok(Op::PutNamespace { namespace: ns }).0,
            Reply::NamespacePut
        );
    }
}

#[test]
fn sessions_open_with_default_ttl_and_bounds() {
    let mut h = H::new();
    h.open(1);
    let open = |ttl_ms| Op::OpenSession {
        session: SessionId(2),
        client: "c".into(),
        ttl_ms,
        namespace: String::new(),
    };
    for bad in [4_999, 60_001] {
        assert_eq!(
            h.rej(open(bad)),
            Rejection::TtlOutOfRange {
                ttl_ms: bad,
                min_ms: 5_000,
                max_ms: 60_000,
                namespace: "default".into()
            }
        );
    }
    assert_eq!(
        h.ok(open(5_000)).0,
        Reply::SessionOpened {
            session: SessionId(2),
            ttl_ms: 5_000
        }
    );
    assert_eq!(
        h.rej(open(5_000)),
        Rejection::SessionExists {
            session: SessionId(2)
        }
    );
    let long_client = Op::OpenSession {
        session: SessionId(3),
        client: "c".repeat(257),
        ttl_ms: 0,
        namespace: String::new(),
    };
    assert_eq!(h.rej(long_client).code(), "invalid_argument");
    let unknown_ns = Op::OpenSession {
        session: SessionId(3),
        client: "c".into(),
        ttl_ms: 0,
        namespace: "nope".into(),
    };
    assert_eq!(
        h.rej(unknown_ns),
        Rejection::UnknownNamespace {
            name: "nope".into()
        }
    );
}

#[test]
fn try_lock_on_a_held_name_reports_the_holder() {
    let mut h = H::new();
    let (a, b) = (h.open(1), h.open(2));
    assert_eq!(h.token(a, "job", X), 1);
    assert_eq!(
        h.acq(b, "job", X, 0),
        Reply::Busy {
            holder: Some(HolderView {
                session: a,
                owner: "owner-1".into(),
                token: 1
            }),
            queue_len: 0,
            reason: BusyReason::Held
        }
    );
    // A try-lock does not queue.
    assert!(h.t.lock_info("job", h.now).unwrap().waiters.is_empty());
}

#[test]
fn waiters_are_granted_in_fifo_order_with_rising_tokens() {
    let mut h = H::new();
    let (a, b, c, d) = (h.open(1), h.open(2), h.open(3), h.open(4));
    let t1 = h.token(a, "n", X);
    assert_eq!(
        h.acq(b, "n", X, 10_000),
        Reply::Queued {
            waiter: 1,
            position: 1,
            deadline_ms: 11_000
        }
    );
    assert_eq!(
        h.acq(c, "n", X, 10_000),
        Reply::Queued {
            waiter: 2,
            position: 2,
            deadline_ms: 11_000
        }
    );
    assert_eq!(
        h.acq(d, "n", X, 10_000),
        Reply::Queued {
            waiter: 3,
            position: 3,
            deadline_ms: 11_000
        }
    );
    h.now += 10;
    assert_eq!(
        h.release(a, "n", t1),
        (
            Reply::Released { remaining: 0 },
            vec![granted(1, b, "n", 2)]
        )
    );
    assert_eq!(
        h.release(b, "n", 2),
        (
            Reply::Released { remaining: 0 },
            vec![granted(2, c, "n", 3)]
        )
    );
    assert_eq!(
        h.release(c, "n", 3),
        (
            Reply::Released { remaining: 0 },
            vec![granted(3, d, "n", 4)]
        )
    );
    assert_eq!(
        h.release(d, "n", 4),
        (Reply::Released { remaining: 0 }, vec![])
    );
    assert_eq!(
        h.t.lock_info("n", h.now),
        None,
        "a free name leaves no record"
    );
}

#[test]
fn a_new_acquire_queues_behind_waiters_even_if_compatible() {
    let mut h = H::new();
    let (a, b, c) = (h.open(1), h.open(2), h.open(3));
    let ta = h.token(a, "n", R);
    // Shared holders; an exclusive waiter; a later reader must wait behind the writer (S7).
    assert!(matches!(
        h.acq(b, "n", X, 5_000),
        Reply::Queued { position: 1, .. }
    ));
    assert!(matches!(
        h.acq(c, "n", R, 5_000),
        Reply::Queued { position: 2, .. }
    ));
    assert_eq!(h.release(a, "n", ta).1, vec![granted(1, b, "n", 2)]);
    assert_eq!(h.release(b, "n", 2).1, vec![granted(2, c, "n", 3)]);
}

#[test]
fn consecutive_readers_at_the_head_are_granted_together() {
    let mut h = H::new();
    let (a, r1, r2, w, r3) = (h.open(1), h.open(2), h.open(3), h.open(4), h.open(5));
    let ta = h.token(a, "n", X);
    h.acq(r1, "n", R, 5_000);
    h.acq(r2, "n", R, 5_000);
    h.acq(w, "n", X, 5_000);
    h.acq(r3, "n", R, 5_000);
    let (_, effects) = h.release(a, "n", ta);
    assert_eq!(
        effects,
        vec![granted(1, r1, "n", 2), granted(2, r2, "n", 3)]
    );
    let info = h.t.lock_info("n", h.now).unwrap();
    assert_eq!(info.holders.len(), 2);
    assert_eq!(
        info.waiters
            .iter()
            .map(|w| (w.session, w.position))
            .collect::<Vec<_>>(),
        vec![(w, 1), (r3, 2)]
    );
    assert_eq!(h.release(r1, "n", 2).1, vec![]);
    assert_eq!(h.release(r2, "n", 3).1, vec![granted(3, w, "n", 4)]);
    assert_eq!(h.release(w, "n", 4).1, vec![granted(4, r3, "n", 5)]);
}

#[test]
fn shared_holders_share_and_exclusive_excludes() {
    let mut h = H::new();
    let (a, b, c) = (h.open(1), h.open(2), h.open(3));
    assert_eq!(h.token(a, "n", R), 1);
    assert_eq!(h.token(b, "n", R), 2);
    assert!(matches!(
        h.acq(c, "n", X, 0),
        Reply::Busy {
            reason: BusyReason::Held,
            ..
        }
    ));
    let (d, e) = (h.open(4), h.open(5));
    assert_eq!(h.token(d, "m", X), 3);
    assert!(matches!(h.acq(e, "m", R, 0), Reply::Busy { .. }));
}

#[test]
fn semaphore_admits_n_holders_each_with_its_own_token() {
    let mut h = H::new();
    let (a, b, c) = (h.open(1), h.open(2), h.open(3));
    let ta = h.token(a, "exports", sem(2));
    let tb = h.token(b, "exports", sem(2));
    assert_ne!(ta, tb);
    assert!(matches!(h.acq(c, "exports", sem(2), 0), Reply::Busy { .. }));
    assert!(matches!(
        h.acq(c, "exports", sem(2), 1_000),
        Reply::Queued { position: 1, .. }
    ));
    assert_eq!(
        h.release(a, "exports", ta).1,
        vec![granted(1, c, "exports", 3)]
    );
    // Every user of the name must agree on the mode and the limit.
    let d = h.open(4);
    assert_eq!(
        h.rej(H::acquire_op(d, "exports", sem(3), 0)),
        Rejection::ModeConflict {
            held: sem(2),
            requested: sem(3)
        }
    );
    assert_eq!(
        h.rej(H::acquire_op(d, "exports", X, 0)),
        Rejection::ModeConflict {
            held: sem(2),
            requested: X
        }
    );
    assert_eq!(
        h.rej(H::acquire_op(d, "other", sem(0), 0)),
        Rejection::InvalidSemaphoreLimit {
            limit: 0,
            max: limits::MAX_SEMAPHORE_LIMIT
        }
    );
    h.token(d, "plain", X);
    assert_eq!(
        h.rej(H::acquire_op(a, "plain", sem(2), 0)),
        Rejection::ModeConflict {
            held: X,
            requested: sem(2)
        }
    );
}

#[test]
fn reentrancy_is_opt_in_and_counts() {
    let mut h = H::new();
    let (a, b) = (h.open(1), h.open(2));
    let reentrant = |s: SessionId| Op::Acquire {
        session: s,
        name: "n".into(),
        owner: "task".into(),
        mode: X,
        wait_ms: 0,
        reentrant: true,
    };
    assert_eq!(
        h.ok(reentrant(a)).0,
        Reply::Acquired {
            token: 1,
            lease_ttl_ms: 15_000,
            reentry: 1,
            group_moves: 0,
        }
    );
    assert_eq!(
        h.ok(reentrant(a)).0,
        Reply::Acquired {
            token: 1,
            lease_ttl_ms: 15_000,
            reentry: 2,
            group_moves: 0,
        }
    );
    assert_eq!(h.t.lock_info("n", h.now).unwrap().holders[0].reentry, 2);
    h.ok(Op::Acquire {
        session: b,
        name: "n".into(),
        owner: "x".into(),
        mode: X,
        wait_ms: 1_000,
        reentrant: false,
    });
    assert_eq!(
        h.release(a, "n", 1),
        (Reply::Released { remaining: 1 }, vec![])
    );
    assert_eq!(
        h.release(a, "n", 1),
        (
            Reply::Released { remaining: 0 },
            vec![granted(1, b, "n", 2)]
        )
    );
    // Without the flag, a second acquire by the same session and owner is refused.
    let once = Op::Acquire {
        session: b,
        name: "n".into(),
        owner: "x".into(),
        mode: X,
        wait_ms: 0,
        reentrant: false,
    };
    assert_eq!(h.rej(once), Rejection::AlreadyHeld { token: 2 });
    // Asking for re-entry on a hold that did not opt in is refused too.
    let again = Op::Acquire {
        session: b,
        name: "n".into(),
        owner: "x".into(),
        mode: X,
        wait_ms: 0,
        reentrant: true,
    };
    assert_eq!(h.rej(again), Rejection::AlreadyHeld { token: 2 });
}

#[test]
fn lock_delay_applies_after_expiry_not_after_clean_release() {
    let mut h = H::new();
    h.put_ns("payouts/", |ns| ns.lock_delay_ms = 5_000);
    let [a, b, c] = [1, 2, 3].map(|i| h.open_in(i, "payouts", 15_000));
    let name = "payouts/m-1";
    h.token(a, name, X);
    h.acq(b, name, X, 60_000);
    let (reply, effects) = h.ok(Op::ExpireSessions {
        sessions: vec![a, SessionId(99)],
    });
    assert_eq!(reply, Reply::SessionsExpired { expired: vec![a] });
    assert_eq!(
        effects,
        vec![Effect::SessionEnded {
            session: a,
            reason: SessionEndReason::Expired,
            released: 1
        }]
    );
    let until = h.now + 5_000;
    assert_eq!(h.t.next_timer_ms(), Some(until));
    assert_eq!(
        h.acq(c, name, X, 0),
        Reply::Busy {
            holder: None,
            queue_len: 1,
            reason: BusyReason::LockDelay { until_ms: until }
        }
    );
    h.now = until - 1;
    assert_eq!(
        h.ok(Op::Tick),
        (
            Reply::Ticked {
                timed_out: 0,
                delays_ended: 0
            },
            vec![]
        )
    );
    h.now = until;
    assert_eq!(
        h.ok(Op::Tick),
        (
            Reply::Ticked {
                timed_out: 0,
                delays_ended: 1
            },
            vec![granted(1, b, name, 2)]
        )
    );
    // A clean release hands over at once.
    h.acq(c, name, X, 60_000);
    assert_eq!(h.release(b, name, 2).1, vec![granted(2, c, name, 3)]);
    // So does a clean close.
    let d = h.open_in(4, "payouts", 15_000);
    h.acq(d, name, X, 60_000);
    let (reply, effects) = h.ok(Op::CloseSession { session: c });
    assert_eq!(
        reply,
        Reply::SessionClosed {
            released: 1,
            cancelled_waits: 0
        }
    );
    assert_eq!(
        effects,
        vec![
            granted(3, d, name, 4),
            Effect::SessionEnded {
                session: c,
                reason: SessionEndReason::Closed,
                released: 1
            }
        ]
    );
}

#[test]
fn only_the_holder_with_its_current_token_releases_or_extends() {
    let mut h = H::new();
    let (a, b) = (h.open(1), h.open(2));
    let t1 = h.token(a, "n", X);
    h.release(a, "n", t1);
    let t2 = h.token(a, "n", X);
    assert_eq!(
        h.rej(Op::Release {
            session: a,
            name: "n".into(),
            token: t1
        }),
        Rejection::StaleToken {
            token: t1,
            current: t2
        }
    );
    assert_eq!(
        h.rej(Op::Extend {
            session: a,
            name: "n".into(),
            token: t1
        }),
        Rejection::StaleToken {
            token: t1,
            current: t2
        }
    );
    let not_holder = Rejection::NotHolder {
        session: b,
        name: "n".into(),
    };
    assert_eq!(
        h.rej(Op::Release {
            session: b,
            name: "n".into(),
            token: t2
        }),
        not_holder
    );
    assert_eq!(
        h.rej(Op::Extend {
            session: b,
            name: "n".into(),
            token: t2
        }),
        not_holder
    );
    assert_eq!(
        h.rej(Op::Release {
            session: a,
            name: "free".into(),
            token: t2
        }),
        Rejection::NotHolder {
            session: a,
            name: "free".into()
        }
    );
    assert_eq!(
        h.ok(Op::Extend {
            session: a,
            name: "n".into(),
            token: t2
        })
        .0,
        Reply::Extended {
            lease_ttl_ms: 15_000
        }
    );
    assert_eq!(
        h.rej(Op::Release {
            session: SessionId(9),
            name: "n".into(),
            token: t2
        }),
        // A session with no lease in this group holds nothing here.
        Rejection::NotHolder {
            session: SessionId(9),
            name: "n".into()
        }
    );
}

#[test]
fn the_queue_is_bounded_per_name() {
    let mut h = H::new();
    h.put_ns("hot/", |ns| ns.max_waiters_per_name = 2);
    let s: Vec<_> = (1..=4).map(|i| h.open_in(i, "hot", 15_000)).collect();
    h.token(s[0], "hot/berths", X);
    h.acq(s[1], "hot/berths", X, 1_000);
    h.acq(s[2], "hot/berths", X, 1_000);
    assert_eq!(
        h.rej(H::acquire_op(s[3], "hot/berths", X, 1_000)),
        Rejection::QueueFull {
            limit: 2,
            retry_after_ms: limits::QUEUE_FULL_RETRY_AFTER_MS
        }
    );
    // A try-lock on a full queue still just reports busy.
    assert!(matches!(
        h.acq(s[3], "hot/berths", X, 0),
        Reply::Busy { queue_len: 2, .. }
    ));
}

#[test]
fn waits_time_out_on_a_tick_and_are_never_granted_late() {
    let mut h = H::new();
    let (a, b, c) = (h.open(1), h.open(2), h.open(3));
    let ta = h.token(a, "n", X);
    h.acq(b, "n", X, 1_000); // deadline 2_000
    h.acq(c, "n", X, 5_000); // deadline 6_000
    assert_eq!(h.t.next_timer_ms(), Some(2_000));
    h.now = 1_999;
    assert_eq!(h.ok(Op::Tick).1, vec![]);
    h.now = 2_000;
    assert_eq!(
        h.ok(Op::Tick),
        (
            Reply::Ticked {
                timed_out: 1,
                delays_ended: 0
            },
            vec![wait_ended(1, b, "n", WaitEndReason::TimedOut)]
        )
    );
    // Release after c's deadline but before a tick: c is skipped, not granted.
    h.now = 6_000;
    assert_eq!(
        h.release(a, "n", ta).1,
        vec![wait_ended(2, c, "n", WaitEndReason::TimedOut)]
    );
    assert_eq!(h.t.lock_info("n", h.now), None);
}

#[test]
fn a_timed_out_writer_at_the_head_lets_readers_behind_it_in() {
    let mut h = H::new();
    let (a, w, r) = (h.open(1), h.open(2), h.open(3));
    h.token(a, "n", R);
    h.acq(w, "n", X, 1_000);
    h.acq(r, "n", R, 9_000);
    h.now += 1_000;
    assert_eq!(
        h.ok(Op::Tick).1,
        vec![
            wait_ended(1, w, "n", WaitEndReason::TimedOut),
            granted(2, r, "n", 2)
        ]
    );
}

#[test]
fn closing_a_session_frees_everything_at_once() {
    let mut h = H::new();
    let (a, b, c) = (h.open(1), h.open(2), h.open(3));
    h.token(a, "x", X);
    h.token(a, "y", X);
    h.token(a, "z", R);
    h.token(b, "w", X);
    h.acq(a, "w", X, 9_000); // a waits for w
    h.acq(b, "x", X, 9_000);
    h.acq(c, "y", X, 9_000);
    let (reply, effects) = h.ok(Op::CloseSession { session: a });
    assert_eq!(
        reply,
        Reply::SessionClosed {
            released: 3,
            cancelled_waits: 1
        }
    );
    assert_eq!(
        effects,
        vec![
            wait_ended(1, a, "w", WaitEndReason::SessionEnded),
            granted(2, b, "x", 5),
            granted(3, c, "y", 6),
            Effect::SessionEnded {
                session: a,
                reason: SessionEndReason::Closed,
                released: 3
            },
        ]
    );
    assert!(h.t.session_info(a).is_none());
    assert_eq!(
        h.rej(Op::CloseSession { session: a }),
        Rejection::UnknownSession { session: a }
    );
}

#[test]
fn waiters_of_dead_sessions_are_skipped() {
    let mut h = H::new();
    let (a, b, c) = (h.open(1), h.open(2), h.open(3));
    let ta = h.token(a, "n", X);
    h.acq(b, "n", X, 9_000);
    h.acq(c, "n", X, 9_000);
    let (_, effects) = h.ok(Op::ExpireSessions { sessions: vec![b] });
    assert_eq!(
        effects,
        vec![
            wait_ended(1, b, "n", WaitEndReason::SessionEnded),
            Effect::SessionEnded {
                session: b,
                reason: SessionEndReason::Expired,
                released: 0
            }
        ]
    );
    assert_eq!(h.release(a, "n", ta).1, vec![granted(2, c, "n", 2)]);
}

/// Found by `lockd-check sim --seed 9492`: expiring [holder, first waiter] in one command freed
/// the hold, granted it to the waiter's session (also expiring), then freed it again. The
/// waiting client was told it held the lock, and the audit log showed a grant never released.
#[test]
fn a_hold_freed_by_an_expiry_skips_waiters_expiring_in_the_same_command() {
    let mut h = H::new();
    let (a, b, c) = (h.open(1), h.open(2), h.open(3));
    h.token(a, "n", X);
    h.acq(b, "n", X, 9_000);
    h.acq(c, "n", X, 9_000);
    let (reply, effects) = h.ok(Op::ExpireSessions {
        sessions: vec![a, b],
    });
    assert_eq!(
        reply,
        Reply::SessionsExpired {
            expired: vec![a, b]
        }
    );
    assert_eq!(
        effects,
        vec![
            wait_ended(1, b, "n", WaitEndReason::SessionEnded),
            granted(2, c, "n", 2),
            Effect::SessionEnded {
                session: a,
                reason: SessionEndReason::Expired,
                released: 1
            },
            Effect::SessionEnded {
                session: b,
                reason: SessionEndReason::Expired,
                released: 0
            },
        ]
    );
    h.t.check_invariants().unwrap();
}

#[test]
fn bad_input_is_rejected_without_changing_state() {
    let mut h = H::new();
    let a = h.open(1);
    h.token(a, "held", X);
    let cases: Vec<(Op, &str)> = vec![
        (H::acquire_op(a, "", X, 0), "invalid_argument"),
        (H::acquire_op(a, &"n".repeat(513), X, 0), "invalid_argument"),
        (H::acquire_op(a, "bad\nname", X, 0), "invalid_argument"),
        (
            Op::Acquire {
                session: a,
                name: "n".into(),
                owner: "o".repeat(257),
                mode: X,
                wait_ms: 0,
                reentrant: false,
            },
            "invalid_argument",
        ),
        (
            H::acquire_op(a, "n", X, limits::MAX_WAIT_MS + 1),
            "wait_too_long",
        ),
        (H::acquire_op(SessionId(42), "n", X, 0), "session_not_here"),
        (H::acquire_op(a, "held", X, 0), "already_held"),
        (
            Op::Release {
                session: a,
                name: "".into(),
                token: 1,
            },
            "invalid_argument",
        ),
    ];
    for (op, code) in cases {
        let r = h.rej(op.clone());
        assert_eq!(r.code(), code, "{op:?} gave {r}");
    }
    // The limits themselves are accepted.
    h.token(a, &"n".repeat(512), X);
    let edge = Op::Acquire {
        session: a,
        name: "é".repeat(100),
        owner: "o".repeat(256),
        mode: X,
        wait_ms: limits::MAX_WAIT_MS,
        reentrant: false,
    };
    assert!(matches!(h.ok(edge).0, Reply::Acquired { .. }));
}

#[test]
fn the_revision_can_be_raised_but_never_lowered() {
    let mut h = H::new();
    let a = h.open(1);
    assert_eq!(h.token(a, "n", X), 1);
    assert_eq!(
        h.ok(Op::RaiseRevision { floor: 1_000 }).0,
        Reply::RevisionRaised { revision: 1_000 }
    );
    assert_eq!(h.token(a, "m", X), 1_001);
    assert_eq!(
        h.ok(Op::RaiseRevision { floor: 5 }).0,
        Reply::RevisionRaised { revision: 1_001 }
    );
    assert_eq!(h.token(a, "k", X), 1_002);
}

/// S2 with the revision at its ceiling: a floor above it is refused, and once no token is left
/// every acquire that needs one is refused (typed, nothing changed) instead of wrapping to 0.
#[test]
fn the_revision_stops_at_its_ceiling_and_never_wraps() {
    const MAX: u64 = limits::MAX_REVISION;
    let mut h = H::new();
    let (a, b, c) = (h.open(1), h.open(2), h.open(3));
    let ta = h.token(a, "n", X);
    assert!(matches!(
        h.acq(b, "n", X, 2_000),
        Reply::Queued { waiter: 1, .. }
    ));
    let reentrant = |name: &str| Op::Acquire {
        session: c,
        name: name.into(),
        owner: "r".into(),
        mode: X,
        wait_ms: 0,
        reentrant: true,
    };
    h.ok(reentrant("r"));

    for floor in [MAX + 1, u64::MAX - 1, u64::MAX] {
        let r = h.rej(Op::RaiseRevision { floor });
        assert_eq!(
            r,
            Rejection::CounterLimit {
                field: "floor".into(),
                value: floor,
                max: MAX
            }
        );
    }
    assert_eq!(h.t.revision(), 2);
    // One token left, and it is granted.
    assert_eq!(
        h.ok(Op::RaiseRevision { floor: MAX - 1 }).0,
        Reply::RevisionRaised { revision: MAX - 1 }
    );
    assert_eq!(h.token(c, "m", X), MAX);

    // None left: a grant now, a try-lock and a wait are all refused, changing nothing.
    let none_left = Rejection::CounterLimit {
        field: "revision".into(),
        value: MAX + 1,
        max: MAX,
    };
    for (name, wait_ms) in [("k", 0), ("k", 1_000), ("n", 0), ("n", 1_000)] {
        assert_eq!(h.rej(H::acquire_op(c, name, X, wait_ms)), none_left);
    }
    assert_eq!(none_left.code(), "counter_limit");
    assert_eq!(
        none_left.to_string(),
        "revision 9223372036854775808 exceeds its limit of 9223372036854775807; nothing changed"
    );
    // What mints no token still works: a re-entry, and a floor at the ceiling.
    assert!(matches!(
        h.ok(reentrant("r")).0,
        Reply::Acquired { reentry: 2, .. }
    ));
    assert_eq!(
        h.ok(Op::RaiseRevision { floor: MAX }).0,
        Reply::RevisionRaised { revision: MAX }
    );

    // Releasing "n" would hand it to b's waiter, but there is no token for it: nothing is
    // granted, b stays queued (the harness checks the invariants), and its wait ends at its
    // deadline like any wait not granted in time.
    assert_eq!(
        h.release(a, "n", ta),
        (Reply::Released { remaining: 0 }, vec![])
    );
    let info = h.t.lock_info("n", h.now).unwrap();
    assert!(info.holders.is_empty());
    assert_eq!(info.waiters.len(), 1);
    let restored = LockTable::restore(&h.t.snapshot()).unwrap();
    assert_eq!(restored.snapshot(), h.t.snapshot());
    h.now = 3_000;
    assert_eq!(
        h.ok(Op::Tick),
        (
            Reply::Ticked {
                timed_out: 1,
                delays_ended: 0
            },
            vec![wait_ended(1, b, "n", WaitEndReason::TimedOut)]
        )
    );
    assert_eq!(h.t.lock_info("n", h.now), None);
    assert_eq!(h.t.revision(), MAX);
}

/// The same with the waiters freed by an expiry and a close, and a semaphore with room.
#[test]
fn holds_freed_at_the_ceiling_grant_nothing() {
    let mut h = H::new();
    let (a, b, c, d) = (h.open(1), h.open(2), h.open(3), h.open(4));
    h.token(a, "n", X);
    h.token(c, "s", sem(1));
    h.acq(b, "n", X, 5_000);
    h.acq(d, "s", sem(1), 5_000);
    h.ok(Op::RaiseRevision {
        floor: limits::MAX_REVISION,
    });
    let (reply, effects) = h.ok(Op::ExpireSessions { sessions: vec![a] });
    assert_eq!(reply, Reply::SessionsExpired { expired: vec![a] });
    assert_eq!(
        effects,
        vec![Effect::SessionEnded {
            session: a,
            reason: SessionEndReason::Expired,
            released: 1
        }]
    );
    let (_, effects) = h.ok(Op::CloseSession { session: c });
    assert_eq!(effects.len(), 1, "only the close itself: {effects:?}");
    for name in ["n", "s"] {
        let info = h.t.lock_info(name, h.now).unwrap();
        assert!(
            info.holders.is_empty() && info.waiters.len() == 1,
            "{info:?}"
        );
    }
    // Closing the waiting sessions ends their waits; the records go.
    h.ok(Op::CloseSession { session: b });
    h.ok(Op::CloseSession { session: d });
    assert_eq!(h.t.stats().locks, 0);
}

/// Group time is the proposer's stamp; at the very end of u64 a deadline or lock-delay
/// saturates instead of overflowing (a panic in debug builds, a wrap into the past in release).
#[test]
fn deadlines_at_the_end_of_time_saturate() {
    let mut h = H::new();
    h.put_ns("d/", |ns| ns.lock_delay_ms = 1_000);
    let (a, b) = (h.open_in(1, "d", 15_000), h.open_in(2, "d", 15_000));
    h.now = u64::MAX - 10;
    h.token(a, "d/n", X);
    assert_eq!(
        h.acq(b, "d/n", X, 2_000),
        Reply::Queued {
            waiter: 1,
            position: 1,
            deadline_ms: u64::MAX
        }
    );
    h.ok(Op::ExpireSessions { sessions: vec![a] });
    assert_eq!(
        h.t.lock_info("d/n", h.now).unwrap().lock_delay_until_ms,
        Some(u64::MAX)
    );
    h.now = u64::MAX;
    assert_eq!(
        h.ok(Op::Tick),
        (
            Reply::Ticked {
                timed_out: 1,
                delays_ended: 1
            },
            vec![wait_ended(1, b, "d/n", WaitEndReason::TimedOut)]
        )
    );
    assert_eq!(h.t.stats().locks, 0);
}

#[test]
fn sessions_hold_at_most_their_namespace_limit() {
    let mut h = H::new();
    h.put_ns("tight/", |ns| ns.max_locks_per_session = 2);
    let [a, b] = [1, 2].map(|i| h.open_in(i, "tight", 15_000));
    h.token(a, "tight/1", X);
    h.token(b, "tight/3", X);
    h.acq(a, "tight/3", X, 1_000); // a wait counts too
    assert_eq!(
        h.rej(H::acquire_op(a, "tight/2", X, 0)),
        Rejection::TooManyLocks { limit: 2 }
    );
}

#[test]
fn a_group_holds_at_most_max_sessions_live_sessions_and_keeps_places_for_namespaces_with_a_token() {
    let mut h = H::new();
    h.put_ns("team/", |ns| ns.token_sha256 = Some("ab".repeat(32)));
    h.put_ns("anon/", |_| {});
    let open_in = |s: u64, namespace: &str| Op::OpenSession {
        session: SessionId(s),
        client: String::new(),
        ttl_ms: 0,
        namespace: namespace.into(),
    };
    // Straight to the table: checking every invariant after each of 250k opens is quadratic.
    let apply = |h: &mut H, op: Op| h.t.apply(&Command { now_ms: h.now, op }).reply;
    // The namespaces without a token, together, take their share and no more.
    let share = limits::MAX_OPEN_NAMESPACE_SESSIONS as u64;
    for id in 1..=share {
        let ns = if id % 2 == 0 { "" } else { "anon" };
        let out = apply(&mut h, open_in(id, ns));
        assert!(out.is_ok(), "session {id}: {out:?}");
    }
    for ns in ["", "anon"] {
        assert_eq!(
            h.rej(open_in(share + 1, ns)),
            Rejection::OpenSessionsFull {
                limit: limits::MAX_OPEN_NAMESPACE_SESSIONS
            }
        );
    }
    // The rest are kept for namespaces with a token, up to the group's cap.
    for id in share + 1..=limits::MAX_SESSIONS as u64 {
        let out = apply(&mut h, open_in(id, "team"));
        assert!(out.is_ok(), "session {id}: {out:?}");
    }
    h.t.check_invariants().unwrap();
    let next = SessionId(limits::MAX_SESSIONS as u64 + 1);
    assert_eq!(
        h.rej(open_in(next.0, "team")),
        Rejection::TooManySessions {
            limit: limits::MAX_SESSIONS
        }
    );
    // One closed (an open namespace's) makes room for one, which its share may take.
    h.ok(Op::CloseSession {
        session: SessionId(7),
    });
    h.ok(open_in(next.0, "anon"));
    for ns in ["team", "", "anon"] {
        let after = limits::MAX_SESSIONS as u64 + 2;
        assert_eq!(
            h.rej(open_in(after, ns)).code(),
            "too_many_sessions",
            "{ns}"
        );
    }
}

#[test]
fn namespaces_match_the_longest_prefix_and_bound_ttls() {
    let mut h = H::new();
    h.put_ns("search/", |ns| {
        ns.min_ttl_ms = 10_000;
        ns.default_ttl_ms = 20_000;
        ns.max_ttl_ms = 30_000;
    });
    h.put_ns("search/hot/", |ns| ns.name = "search-hot".into());
    assert_eq!(h.t.namespace_for("search/shard-17").name, "search");
    assert_eq!(h.t.namespace_for("search/hot/x").name, "search-hot");
    assert_eq!(h.t.namespace_for("searchy").name, "default");
    let a = h.open_in(1, "search", 15_000);
    h.token(a, "search/shard-17", X);
    // A session takes only its own namespace's names: not the default's, not a longer prefix's.
    let d = h.open(2);
    let wrong = |session: &str, name: &str| Rejection::WrongNamespace {
        session_namespace: session.into(),
        name_namespace: name.into(),
    };
    assert_eq!(
        h.rej(H::acquire_op(d, "search/shard-18", X, 0)),
        wrong("default", "search")
    );
    assert_eq!(
        h.rej(H::acquire_op(a, "searchy", X, 0)),
        wrong("search", "default")
    );
    assert_eq!(
        h.rej(H::acquire_op(a, "search/hot/x", X, 1_000)),
        wrong("search", "search-hot")
    );
    // A TTL outside the bounds is refused at open, and at acquire once the bounds have moved.
    assert_eq!(
        h.rej(Op::OpenSession {
            session: SessionId(5),
            client: String::new(),
            ttl_ms: 5_000,
            namespace: "search".into(),
        }),
        Rejection::TtlOutOfRange {
            ttl_ms: 5_000,
            min_ms: 10_000,
            max_ms: 30_000,
            namespace: "search".into()
        }
    );
    h.put_ns("search/", |ns| {
        ns.min_ttl_ms = 16_000;
        ns.default_ttl_ms = 20_000;
        ns.max_ttl_ms = 30_000;
    });
    assert_eq!(
        h.rej(H::acquire_op(a, "search/shard-18", X, 0)),
        Rejection::TtlOutOfRange {
            ttl_ms: 15_000,
            min_ms: 16_000,
            max_ms: 30_000,
            namespace: "search".into()
        }
    );
    let opened = h.ok(Op::OpenSession {
        session: SessionId(3),
        client: String::new(),
        ttl_ms: 0,
        namespace: "search".into(),
    });
    assert_eq!(
        opened.0,
        Reply::SessionOpened {
            session: SessionId(3),
            ttl_ms: 20_000
        }
    );
    let mut bad = Namespace::default_namespace();
    bad.name = "x".into();
    bad.prefix = "x".into();
    assert_eq!(
        h.rej(Op::PutNamespace { namespace: bad }).code(),
        "invalid_namespace"
    );
    let mut unfenced = Namespace::default_namespace();
    unfenced.name = "pay".into();
    unfenced.prefix = "pay/".into();
    unfenced.safety = SafetyClass::Correctness {
        fenced_resource: " ".into(),
    };
    assert_eq!(
        h.rej(Op::PutNamespace {
            namespace: unfenced
        })
        .code(),
        "invalid_namespace"
    );
    assert_eq!(
        h.rej(Op::DeleteNamespace {
            prefix: String::new()
        })
        .code(),
        "invalid_namespace"
    );
    assert_eq!(
        h.ok(Op::DeleteNamespace {
            prefix: "search/hot/".into()
        })
        .0,
        Reply::NamespaceDeleted
    );
}

#[test]
fn group_time_never_goes_backwards() {
    let mut h = H::new();
    let a = h.open(1);
    h.now = 500; // older than the last applied command
    assert_eq!(
        h.acq(a, "n", X, 1_000),
        Reply::Acquired {
            token: 1,
            lease_ttl_ms: 15_000,
            reentry: 1,
            group_moves: 0,
        }
    );
    assert_eq!(h.t.now_ms(), 1_000);
    let b = h.open(2);
    assert_eq!(
        h.acq(b, "n", X, 1_000),
        Reply::Queued {
            waiter: 1,
            position: 1,
            deadline_ms: 2_000
        }
    );
}

#[test]
fn queries_report_holders_waiters_and_sessions() {
    let mut h = H::new();
    let (a, b) = (h.open(1), h.open(2));
    h.token(a, "n", X);
    h.acq(b, "n", X, 9_000);
    h.now += 250;
    let info = h.t.lock_info("n", h.now).unwrap();
    assert_eq!(info.namespace, "default");
    assert_eq!(
        info.holders,
        vec![HolderInfo {
            session: a,
            owner: "owner-1".into(),
            token: 1,
            mode: X,
            held_for_ms: 250,
            reentry: 1
        }]
    );
    assert_eq!(
        info.waiters,
        vec![WaiterInfo {
            waiter: 1,
            session: b,
            owner: "owner-2".into(),
            mode: X,
            position: 1,
            waited_ms: 250,
            deadline_ms: 10_000
        }]
    );
    let page = h.t.session_page(None, 10);
    assert_eq!(
        page.iter()
            .map(|s| (s.session, s.held, s.waits))
            .collect::<Vec<_>>(),
        vec![(a, 1, 0), (b, 0, 1)]
    );
    assert_eq!(page[0].client, "client-1");
    assert_eq!(h.t.session_page(Some(a), 10).len(), 1);
    assert_eq!(h.t.session_page(None, 1).len(), 1);
    let sb = h.t.session_info(b).unwrap();
    assert_eq!(sb.waits, vec![("n".to_string(), 1, 1)]);
    assert_eq!(
        h.t.session_info(a).unwrap().held,
        vec![("n".to_string(), 1)]
    );
}

#[test]
fn snapshot_restores_to_the_same_bytes_and_hash() {
    let mut h = H::new();
    h.put_ns("p/", |ns| ns.lock_delay_ms = 1_000);
    let [a, b] = [1, 2].map(|i| h.open_in(i, "p", 15_000));
    let c = h.open(3);
    h.token(a, "p/x", X);
    h.acq(b, "p/x", X, 9_000);
    h.token(c, "s", sem(3));
    h.ok(Op::ExpireSessions { sessions: vec![a] });
    let bytes = h.t.snapshot();
    let restored = LockTable::restore(&bytes).unwrap();
    assert_eq!(restored.snapshot(), bytes);
    assert_eq!(restored.state_hash(), h.t.state_hash());
    assert_eq!(restored.next_timer_ms(), h.t.next_timer_ms());
    assert!(LockTable::restore(&bytes[..bytes.len() / 2]).is_err());
}

#[test]
fn session_ids_print_and_parse() {
    let s = SessionId(0x9f3c);
    assert_eq!(s.to_string(), "s_0000000000009f3c");
    assert_eq!(SessionId::parse(&s.to_string()), Some(s));
    assert_eq!(SessionId::parse("s_9f3c"), Some(s));
    assert_eq!(SessionId::parse("9f3c"), None);
    assert_eq!(SessionId::parse("s_"), None);
    assert_eq!(SessionId::parse("s_zz"), None);
}

#[test]
fn the_shard_map_is_versioned_and_complete() {
    let mut h = H::new();
    let map = ShardMap::initial(8);
    assert_eq!(map.groups.len(), 4096);
    assert!(map.groups.iter().all(|g| (1..=8).contains(g)));
    assert_eq!(map.group_of("search/shard-17"), 1 + 515 % 8);
    assert_eq!(
        h.ok(Op::PutShardMap { map: map.clone() }).0,
        Reply::ShardMapPut { version: 1 }
    );
    // Same version again, a gap, a short map, group 0: all refused.
    assert_eq!(
        h.rej(Op::PutShardMap { map: map.clone() }).code(),
        "invalid_shard_map"
    );
    let gap = ShardMap {
        version: 3,
        ..map.clone()
    };
    assert_eq!(
        h.rej(Op::PutShardMap { map: gap }).code(),
        "invalid_shard_map"
    );
    let short = ShardMap {
        version: 2,
        groups: vec![1; 10],
    };
    assert_eq!(
        h.rej(Op::PutShardMap { map: short }).code(),
        "invalid_shard_map"
    );
    let mut meta = ShardMap { version: 2, ..map };
    meta.groups[7] = 0;
    assert_eq!(
        h.rej(Op::PutShardMap { map: meta.clone() }).code(),
        "invalid_shard_map"
    );
    meta.groups[7] = 2;
    assert_eq!(
        h.ok(Op::PutShardMap { map: meta.clone() }).0,
        Reply::ShardMapPut { version: 2 }
    );
    let restored = LockTable::restore(&h.t.snapshot()).unwrap();
    assert_eq!(restored.shard_map(), Some(&meta));
}

#[test]
fn the_contention_scan_ranks_names_by_waiters_waits_and_holds_within_its_bound() {
    let mut h = H::new();
    h.put_ns("team/", |_| {});
    let s: Vec<SessionId> = (1..=6).map(|i| h.open(i)).collect();
    let (ta, tb) = (h.open_in(10, "team", 15_000), h.open_in(11, "team", 15_000));
    // "old" is held from t=1000; "busy" from t=1100 with three waiters; "team/q" from t=1200
    // with one waiter that has waited longest (it queued first).
    h.token(s[0], "old", X);
    h.now += 100;
    h.token(s[0], "busy", X);
    h.now += 100;
    h.token(ta, "team/q", X);
    assert!(matches!(
        h.acq(tb, "team/q", X, 60_000),
        Reply::Queued { .. }
    ));
    h.now += 50;
    for w in &s[2..5] {
        assert!(matches!(h.acq(*w, "busy", X, 60_000), Reply::Queued { .. }));
    }
    h.now += 50;
    let scan = h.t.contention(2, h.now, None);
    assert_eq!(scan.scanned, 3);
    let names = |v: &[Contended]| v.iter().map(|c| c.name.clone()).collect::<Vec<_>>();
    assert_eq!(names(&scan.most_waiters), ["busy", "team/q"]);
    assert_eq!(names(&scan.longest_waits), ["team/q", "busy"]);
    assert_eq!(
        names(&scan.longest_held),
        ["old", "busy"],
        "bounded to top=2"
    );
    let busy = &scan.most_waiters[0];
    assert_eq!(
        (
            busy.holders,
            busy.waiters,
            busy.held_for_ms,
            busy.longest_wait_ms
        ),
        (1, 3, 200, 50)
    );
    assert_eq!(scan.longest_waits[0].namespace, "team");
    assert_eq!(scan.longest_waits[0].longest_wait_ms, 100);
    // A namespace narrows the scan; a free name is never listed.
    let team = h.t.contention(10, h.now, Some(&["team".to_string()]));
    assert_eq!(team.scanned, 1);
    assert_eq!(names(&team.longest_held), ["team/q"]);
    assert!(h.t.contention(0, h.now, None).longest_held.is_empty());
    // The cheap part reads only the names with waiters.
    assert_eq!(h.t.waiting(10, h.now, None).scanned, 2);
    // A pass in steps of one record meets every record once and ends.
    let (mut from, mut seen, mut steps) = (0, Vec::new(), 0);
    loop {
        let c = h.t.held_chunk(from, 1, 10, h.now, None);
        seen.extend(names(&c.longest_held));
        from += 1;
        steps += 1;
        if c.done {
            break;
        }
    }
    seen.sort();
    assert_eq!(
        (seen, steps),
        (vec!["busy".to_string(), "old".into(), "team/q".into()], 3)
    );
}

#[test]
fn a_namespace_holds_at_most_max_sessions_and_adopted_sessions_are_not_refused() {
    let mut h = H::new();
    // A group born at epoch 1: sessions of epoch 0 are adopted here, not opened.
    h.ok(Op::FoundGroup {
        born_epoch: 1,
        map_version: 1,
    });
    let capped = Namespace {
        name: "team".into(),
        prefix: "team/".into(),
        max_sessions: 2,
        ..Namespace::default_namespace()
    };
    h.ok(Op::PutNamespace {
        namespace: capped.clone(),
    });
    let open = |id: u64, ns: &str| Op::OpenSession {
        session: SessionId((1 << 48) | (id << 4) | 1),
        client: String::new(),
        ttl_ms: 0,
        namespace: ns.into(),
    };
    h.ok(open(1, "team"));
    h.ok(open(2, "team"));
    let full = Rejection::NamespaceSessionsFull {
        namespace: "team".into(),
        limit: 2,
    };
    assert_eq!(h.rej(open(3, "team")), full);
    assert_eq!(full.code(), "too_many_sessions");
    assert!(full.to_string().contains("max_sessions"), "{full}");
    assert!(full.to_string().contains("holds 2 live sessions"), "{full}");
    let one = Rejection::NamespaceSessionsFull {
        namespace: "solo".into(),
        limit: 1,
    };
    assert!(one.to_string().contains("holds 1 live session,"), "{one}");
    // Other namespaces are not counted against it.
    h.ok(open(4, ""));
    h.ok(open(5, ""));
    // An older session the cluster admitted before is adopted even at the cap.
    let older = SessionId(9);
    h.ok(Op::AdoptSession {
        session: older,
        client: String::new(),
        ttl_ms: 0,
        namespace: "team".into(),
    });
    assert_eq!(h.rej(open(6, "team")), full);
    // Closing or expiring one makes room for one.
    h.ok(Op::CloseSession { session: older });
    h.ok(Op::ExpireSessions {
        sessions: vec![SessionId((1 << 48) | (1 << 4) | 1)],
    });
    h.ok(open(7, "team"));
    assert_eq!(h.rej(open(8, "team")), full);
    // Lowering the cap ends no session; 0 lifts it.
    h.ok(Op::PutNamespace {
        namespace: Namespace {
            max_sessions: 1,
            ..capped.clone()
        },
    });
    assert_eq!(h.t.stats().sessions, 4);
    h.ok(Op::PutNamespace {
        namespace: Namespace {
            max_sessions: 0,
            ..capped.clone()
        },
    });
    h.ok(open(8, "team"));
    // The counts survive a snapshot: the cap holds on a restored replica.
    h.ok(Op::PutNamespace {
        namespace: capped.clone(),
    });
    let mut r = LockTable::restore(&h.t.snapshot()).unwrap();
    let out = r.apply(&Command {
        now_ms: h.now,
        op: open(9, "team"),
    });
    assert_eq!(out.reply.unwrap_err().code(), "too_many_sessions");
    // Above the cluster's own cap is not a namespace a put may make.
    let too_many = Namespace {
        max_sessions: limits::MAX_SESSIONS as u32 + 1,
        ..capped
    };
    assert_eq!(
        h.rej(Op::PutNamespace {
            namespace: too_many
        })
        .code(),
        "invalid_namespace"
    );
}

/// Logs written before `max_sessions` carry namespaces in the old layout under the old
/// variant indexes; they still decode and apply, with no session cap.
#[test]
fn namespace_commands_logged_before_max_sessions_still_apply() {
    let old = NamespaceV8 {
        name: "team".into(),
        prefix: "team/".into(),
        min_ttl_ms: 5_000,
        max_ttl_ms: 60_000,
        default_ttl_ms: 15_000,
        max_waiters_per_name: 10,
        max_locks_per_session: 10,
        lock_delay_ms: 0,
        safety: SafetyClass::Efficiency,
        ops_per_s: 0,
        token_sha256: None,
    };
    let body = postcard::to_allocvec(&old).unwrap();
    // What the previous version wrote: the variant's index, then its fields.
    let with_index = |index: u8, fields: &[u8]| [&[index][..], fields].concat();
    let put = postcard::from_bytes::<Op>(&with_index(8, &body)).unwrap();
    assert_eq!(
        put,
        Op::PutNamespaceV8 {
            namespace: old.clone()
        }
    );
    let seed = [&[1u8][..], &body].concat(); // a one-namespace list
    let seed = postcard::from_bytes::<Op>(&with_index(26, &seed)).unwrap();
    assert!(matches!(seed, Op::SeedNamespacesV8 { .. }), "{seed:?}");
    // ChangeNamespace (27): expected_version 0, then NamespaceChange::Put (index 0 then).
    let change =
        postcard::from_bytes::<Op>(&with_index(27, &with_index(0, &with_index(0, &body)))).unwrap();
    assert!(
        matches!(
            change,
            Op::ChangeNamespace {
                change: NamespaceChange::PutV8(_),
                ..
            }
        ),
        "{change:?}"
    );
    for op in [put, seed, change] {
        let mut h = H::new();
        h.ok(op);
        let ns = h.t.namespace_for("team/x");
        assert_eq!((ns.name.as_str(), ns.max_sessions), ("team", 0));
    }
}

/// A namespace that sets no `max_sessions` is written in the older layout, so replicas of the
/// previous version still read the command during a rolling upgrade; one that sets it is not.
#[test]
fn namespace_commands_use_the_older_layout_when_it_says_the_same() {
    let plain = Namespace {
        name: "team".into(),
        prefix: "team/".into(),
        ..Namespace::default_namespace()
    };
    let capped = Namespace {
        max_sessions: 5,
        ..plain.clone()
    };
    assert!(matches!(
        Op::put_namespace(plain.clone()),
        Op::PutNamespaceV8 { .. }
    ));
    assert!(matches!(
        Op::put_namespace(capped.clone()),
        Op::PutNamespace { .. }
    ));
    assert!(matches!(
        Op::seed_namespaces(vec![plain.clone()]),
        Op::SeedNamespacesV8 { .. }
    ));
    assert!(matches!(
        Op::seed_namespaces(vec![plain.clone(), capped.clone()]),
        Op::SeedNamespaces { .. }
    ));
    assert!(matches!(
        NamespaceChange::put(plain.clone()),
        NamespaceChange::PutV8(_)
    ));
    assert!(matches!(
        NamespaceChange::put(capped.clone()),
        NamespaceChange::Put(_)
    ));
    // Either way the group ends up with the same namespace.
    for ns in [plain, capped] {
        let mut h = H::new();
        h.ok(Op::put_namespace(ns.clone()));
        assert_eq!(h.t.namespace_for("team/x"), &ns);
    }
}

#[test]
fn a_session_listing_pages_through_every_session_in_id_order() {
    let mut h = H::new();
    let ids = [90u64, 7, 55, 3, 120, 41];
    for id in ids {
        h.open(id);
    }
    h.ok(Op::CloseSession {
        session: SessionId(55),
    });
    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let page = h.t.session_page(after, 2);
        assert!(page.len() <= 2);
        let Some(last) = page.last() else { break };
        after = Some(last.session);
        seen.extend(page.iter().map(|s| s.session.0));
    }
    assert_eq!(seen, vec![3, 7, 41, 90, 120]);
    // A restored replica lists the same.
    let r = LockTable::restore(&h.t.snapshot()).unwrap();
    assert_eq!(r.session_page(None, 10), h.t.session_page(None, 10));
    assert_eq!(h.t.session_page(Some(SessionId(90)), 10).len(), 1);
}
