//! Bucket ownership and moves: a group serves only its buckets, and a move between two groups
//! keeps every holder, its token and its lock-delay, and every later token above every earlier.

use lockd_core::*;

const X: LockMode = LockMode::Exclusive;

/// One group: a table and its own group clock, invariants checked after every command.
struct G {
    t: LockTable,
    now: u64,
}

impl G {
    /// A group at `now` that owns `buckets` (as of map version 1).
    fn new(now: u64, buckets: &BucketSet) -> G {
        let mut g = G {
            t: LockTable::new(),
            now,
        };
        g.ok(Op::AssignBuckets {
            buckets: buckets.clone(),
            map_version: 1,
        });
        g
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
        let out = self.run(op.clone());
        (
            out.reply.unwrap_or_else(|e| panic!("{op:?} refused: {e}")),
            out.effects,
        )
    }

    /// A command that must be refused, leaving the state as it was.
    fn rej(&mut self, op: Op) -> Rejection {
        let before = self.t.snapshot();
        let out = self.run(op);
        assert!(out.effects.is_empty());
        assert_eq!(before, self.t.snapshot(), "a refused command changed state");
        out.reply.expect_err("should be refused")
    }

    /// The same command again changes nothing and answers as the first time did.
    fn again(&mut self, op: Op, first: &Reply) {
        let before = self.t.snapshot();
        let (r, fx) = self.ok(op);
        assert!(fx.is_empty(), "a repeated step had effects: {fx:?}");
        assert_eq!(&r, first);
        assert_eq!(before, self.t.snapshot(), "a repeated step changed state");
    }

    fn open(&mut self, id: u64) -> SessionId {
        self.ok(Op::OpenSession {
            session: SessionId(id),
            client: format!("c{id}"),
            ttl_ms: 0,
            namespace: String::new(),
        });
        SessionId(id)
    }

    fn acquire(&mut self, s: SessionId, name: &str, wait_ms: u64) -> Result<Reply, Rejection> {
        self.run(Op::Acquire {
            session: s,
            name: name.into(),
            owner: "o".into(),
            mode: X,
            wait_ms,
            reentrant: false,
        })
        .reply
    }

    fn token(&mut self, s: SessionId, name: &str) -> Token {
        match self.acquire(s, name, 0) {
            Ok(Reply::Acquired { token, .. }) => token,
            other => panic!("acquire of {name}: {other:?}"),
        }
    }
}

/// Names whose bucket is in `set`, and names whose bucket is not.
fn names_in(set: &BucketSet, inside: bool, n: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("job/{i}"))
        .filter(|name| set.contains(bucket_of(name)) == inside)
        .take(n)
        .collect()
}

/// Group A owns the low half, group B the high half; `moving` is A's first 64 buckets.
fn halves() -> (BucketSet, BucketSet, BucketSet) {
    (
        BucketSet::range(0, 2047),
        BucketSet::range(2048, 4095),
        BucketSet::range(0, 63),
    )
}

#[test]
fn a_group_serves_only_its_buckets() {
    let (low, high, _) = halves();
    let mut a = G::new(1_000, &low);
    let s = a.open(1);
    let theirs = &names_in(&high, true, 1)[0];
    let e = a.rej(Op::Acquire {
        session: s,
        name: theirs.clone(),
        owner: "o".into(),
        mode: X,
        wait_ms: 0,
        reentrant: false,
    });
    assert_eq!(
        e,
        Rejection::WrongGroup {
            bucket: bucket_of(theirs),
            map_version: 1
        }
    );
    assert_eq!(e.code(), "wrong_group");
    for op in [
        Op::Release {
            session: s,
            name: theirs.clone(),
            token: 1,
        },
        Op::Extend {
            session: s,
            name: theirs.clone(),
            token: 1,
        },
    ] {
        assert!(matches!(a.rej(op), Rejection::WrongGroup { .. }));
    }
    let mine = &names_in(&low, true, 1)[0];
    assert_eq!(a.token(s, mine), 1);
}

#[test]
fn the_first_assignment_must_cover_what_is_held_and_is_not_changed_later() {
    let (low, high, _) = halves();
    let mut g = G {
        t: LockTable::new(),
        now: 1_000,
    };
    let s = g.open(1);
    let name = names_in(&high, true, 1).remove(0);
    g.token(s, &name);
    let e = g.rej(Op::AssignBuckets {
        buckets: low.clone(),
        map_version: 1,
    });
    assert!(e.to_string().contains(&name), "{e}");
    let r = g
        .ok(Op::AssignBuckets {
            buckets: high.clone(),
            map_version: 1,
        })
        .0;
    g.again(
        Op::AssignBuckets {
            buckets: high.clone(),
            map_version: 1,
        },
        &r,
    );
    let e = g.rej(Op::AssignBuckets {
        buckets: BucketSet::full(),
        map_version: 2,
    });
    assert_eq!(e.code(), "move_conflict");
}

/// The whole move, each step repeated once: holders keep their tokens, waiters are told to
/// re-queue, the lock-delay comes along, and every later token is above every earlier one.
#[test]
fn a_move_keeps_holders_tokens_and_delays_and_tokens_keep_rising() {
    let (low, high, moving) = halves();
    let mut a = G::new(50_000, &low);
    let mut b = G::new(2_000, &high);
    let (sa, sw) = (a.open(1), a.open(2));
    let sb = b.open(1); // the same session, already open in B
    let names = names_in(&moving, true, 3);
    let (held, delayed, queued) = (&names[0], &names[1], &names[2]);
    // A's revision runs ahead of B's, so B must raise its own.
    for n in names_in(&low, true, 40).iter().skip(20) {
        a.token(sa, n);
    }
    let t_held = a.token(sa, held);
    let t_queued = a.token(sa, queued);
    let Ok(Reply::Queued { waiter, .. }) = a.acquire(sw, queued, 10_000) else {
        panic!("should queue")
    };
    // `delayed`: held by a session that then expires, in a namespace with a lock-delay.
    let mut ns = Namespace::default_namespace();
    ns.lock_delay_ms = 5_000;
    a.ok(Op::PutNamespace { namespace: ns });
    let dead = a.open(3);
    a.token(dead, delayed);
    a.ok(Op::ExpireSessions {
        sessions: vec![dead],
    });
    let rev_a = a.t.revision();
    for n in names_in(&high, true, 3) {
        b.token(sb, &n);
    }
    assert!(b.t.revision() < rev_a);

    // 1. Freeze in A.
    let freeze = Op::FreezeBuckets {
        move_id: 7,
        to_group: 2,
        buckets: moving.clone(),
    };
    let (r, fx) = a.ok(freeze.clone());
    assert_eq!(
        r,
        Reply::BucketsFrozen {
            locks: 3,
            holders: 2,
            waits_ended: 1
        }
    );
    assert_eq!(
        fx,
        vec![Effect::WaitEnded {
            waiter,
            session: sw,
            name: queued.as_str().into(),
            reason: WaitEndReason::Moved,
        }]
    );
    a.again(
        freeze,
        &Reply::BucketsFrozen {
            locks: 3,
            holders: 2,
            waits_ended: 0,
        },
    );
    let e = a.rej(Op::Release {
        session: sa,
        name: held.clone(),
        token: t_held,
    });
    assert_eq!(
        e,
        Rejection::BucketMoving {
            bucket: bucket_of(held)
        }
    );
    assert!(matches!(
        a.acquire(sw, held, 0),
        Err(Rejection::BucketMoving { .. })
    ));
    let Some(MoveRecord::Outgoing { export, .. }) = a.t.move_record(7).cloned() else {
        panic!("no outgoing record")
    };
    assert_eq!(export.revision, rev_a);
    assert_eq!(
        export.sessions.len(),
        1,
        "the expired session is not exported"
    );

    // 2. Import into B.
    let import = Op::ImportBuckets {
        move_id: 7,
        from_group: 1,
        buckets: moving.clone(),
        map_version: 2,
        export: export.clone(),
    };
    let (r, fx) = b.ok(import.clone());
    assert_eq!(
        r,
        Reply::BucketsImported {
            locks: 3,
            sessions_adopted: 0,
            revision: rev_a
        }
    );
    // B had the session already: its lease there restarts, as an adopted one's starts (C2).
    let holder = export.sessions[0].id;
    assert_eq!(
        fx,
        vec![Effect::SessionAdopted {
            session: holder,
            ttl_ms: export.sessions[0].ttl_ms
        }]
    );
    b.again(import, &r);
    // The holder holds in B with its token; the delayed name is still delayed there.
    let info = b.t.lock_info(held, 0).expect("moved");
    assert_eq!(info.holders[0].token, t_held);
    assert!(matches!(
        b.acquire(sb, delayed, 0),
        Ok(Reply::Busy {
            reason: BusyReason::LockDelay { .. },
            ..
        })
    ));
    // The waiter told to re-queue queues again in B (its session is open there too), first.
    let sw_b = b.open(2);
    assert_eq!(sw_b, sw);
    assert!(matches!(
        b.acquire(sw, queued, 10_000),
        Ok(Reply::Queued { position: 1, .. })
    ));

    // 3./4. The map flips (meta group, not modelled here); A drops.
    let (r, _) = a.ok(Op::DropBuckets {
        move_id: 7,
        map_version: 2,
    });
    a.again(
        Op::DropBuckets {
            move_id: 7,
            map_version: 2,
        },
        &r,
    );
    assert_eq!(
        a.acquire(sw, held, 0),
        Err(Rejection::WrongGroup {
            bucket: bucket_of(held),
            map_version: 2
        })
    );
    // Tokens rise per name across the move: B's next grants of moved names are above A's.
    b.ok(Op::Release {
        session: sb,
        name: held.clone(),
        token: t_held,
    });
    let after = b.token(sb, held);
    assert!(after > rev_a && after > t_held, "{after} after {rev_a}");
    b.now += 6_000;
    b.ok(Op::Tick);
    assert!(b.token(sb, delayed) > rev_a);
    let _ = t_queued;
    // Both groups snapshot and restore to the same state.
    for g in [&a, &b] {
        let r = LockTable::restore(&g.t.snapshot()).unwrap();
        assert_eq!(r.snapshot(), g.t.snapshot());
    }
}

#[test]
fn an_import_adopts_sessions_the_receiving_group_lacks() {
    let (low, high, moving) = halves();
    let mut a = G::new(1_000, &low);
    let mut b = G::new(1_000, &high);
    let s = a.open(9);
    let name = names_in(&moving, true, 1).remove(0);
    let token = a.token(s, &name);
    a.ok(Op::FreezeBuckets {
        move_id: 1,
        to_group: 2,
        buckets: moving.clone(),
    });
    let Some(MoveRecord::Outgoing { export, .. }) = a.t.move_record(1).cloned() else {
        panic!()
    };
    let (r, fx) = b.ok(Op::ImportBuckets {
        move_id: 1,
        from_group: 1,
        buckets: moving,
        map_version: 2,
        export,
    });
    assert!(matches!(
        r,
        Reply::BucketsImported {
            sessions_adopted: 1,
            ..
        }
    ));
    assert_eq!(
        fx,
        vec![Effect::SessionAdopted {
            session: s,
            ttl_ms: 15_000
        }]
    );
    assert!(b.t.has_session(s));
    b.ok(Op::Release {
        session: s,
        name: name.clone(),
        token,
    });
    // The adopted session ends like any other: nothing of it is left.
    b.ok(Op::CloseSession { session: s });
    assert!(!b.t.has_session(s));
}

#[test]
fn an_abort_before_the_import_puts_every_holder_back_and_blocks_the_import() {
    let (low, high, moving) = halves();
    let mut a = G::new(1_000, &low);
    let mut b = G::new(1_000, &high);
    let (s, gone) = (a.open(1), a.open(2));
    let names = names_in(&moving, true, 2);
    let t0 = a.token(s, &names[0]);
    a.token(gone, &names[1]);
    let before = a.t.lock_info(&names[0], 0);
    a.ok(Op::FreezeBuckets {
        move_id: 5,
        to_group: 2,
        buckets: moving.clone(),
    });
    let Some(MoveRecord::Outgoing { export, .. }) = a.t.move_record(5).cloned() else {
        panic!()
    };
    // A session ends while its lock is frozen: its hold is not put back.
    a.ok(Op::CloseSession { session: gone });
    // The abort: B first, so a late import can never land; then A.
    let (r, _) = b.ok(Op::CancelImport { move_id: 5 });
    b.again(Op::CancelImport { move_id: 5 }, &r);
    let (r, _) = a.ok(Op::ThawBuckets { move_id: 5 });
    assert_eq!(
        r,
        Reply::BucketsThawed {
            restored: 1,
            dropped: 1
        }
    );
    a.again(
        Op::ThawBuckets { move_id: 5 },
        &Reply::BucketsThawed {
            restored: 0,
            dropped: 0,
        },
    );
    assert_eq!(
        a.t.lock_info(&names[0], 0).unwrap().holders,
        before.unwrap().holders
    );
    assert!(a.t.lock_info(&names[1], 0).is_none());
    a.ok(Op::Release {
        session: s,
        name: names[0].clone(),
        token: t0,
    });
    let e = b.rej(Op::ImportBuckets {
        move_id: 5,
        from_group: 1,
        buckets: moving.clone(),
        map_version: 2,
        export: export.clone(),
    });
    assert_eq!(e.code(), "move_conflict");
    assert!(e.to_string().contains("cancelled"), "{e}");
    // A thawed move cannot be dropped, and an imported one cannot be cancelled.
    assert_eq!(
        a.rej(Op::DropBuckets {
            move_id: 5,
            map_version: 2
        })
        .code(),
        "move_conflict"
    );
    a.ok(Op::FreezeBuckets {
        move_id: 6,
        to_group: 2,
        buckets: moving.clone(),
    });
    let Some(MoveRecord::Outgoing { export, .. }) = a.t.move_record(6).cloned() else {
        panic!()
    };
    b.ok(Op::ImportBuckets {
        move_id: 6,
        from_group: 1,
        buckets: moving,
        map_version: 2,
        export,
    });
    assert_eq!(
        b.rej(Op::CancelImport { move_id: 6 }).code(),
        "move_conflict"
    );
    assert_eq!(
        a.rej(Op::ThawBuckets { move_id: 99 }),
        Rejection::UnknownMove { move_id: 99 }
    );
}

#[test]
fn a_move_step_that_does_not_fit_is_refused_and_changes_nothing() {
    let (low, high, moving) = halves();
    let mut a = G::new(1_000, &low);
    let mut b = G::new(1_000, &high);
    let s = a.open(1);
    let name = names_in(&moving, true, 1).remove(0);
    a.token(s, &name);
    // Buckets A does not own, none at all, or to the meta group.
    for (buckets, to_group) in [
        (BucketSet::range(2000, 2100), 2),
        (BucketSet::empty(), 2),
        (moving.clone(), 0),
    ] {
        let e = a.rej(Op::FreezeBuckets {
            move_id: 1,
            to_group,
            buckets,
        });
        assert_eq!(e.code(), "move_conflict", "{e}");
    }
    a.ok(Op::FreezeBuckets {
        move_id: 1,
        to_group: 2,
        buckets: moving.clone(),
    });
    // The same id for another move, or buckets frozen already.
    assert_eq!(
        a.rej(Op::FreezeBuckets {
            move_id: 1,
            to_group: 3,
            buckets: moving.clone()
        })
        .code(),
        "move_conflict"
    );
    assert_eq!(
        a.rej(Op::FreezeBuckets {
            move_id: 2,
            to_group: 2,
            buckets: BucketSet::range(0, 10)
        })
        .code(),
        "move_conflict"
    );
    let Some(MoveRecord::Outgoing { export, .. }) = a.t.move_record(1).cloned() else {
        panic!()
    };
    let import = |buckets: &BucketSet, export: Export| Op::ImportBuckets {
        move_id: 1,
        from_group: 1,
        buckets: buckets.clone(),
        map_version: 2,
        export,
    };
    // Buckets B owns already; an export naming a name outside the buckets; a token above the
    // export's revision; a holder of a session the export does not list.
    assert_eq!(b.rej(import(&high, export.clone())).code(), "move_conflict");
    let mut bad = export.clone();
    bad.locks[0].name = names_in(&high, true, 1).remove(0);
    assert_eq!(b.rej(import(&moving, bad)).code(), "move_conflict");
    let mut bad = export.clone();
    bad.locks[0].holders[0].token = export.revision + 1;
    assert_eq!(b.rej(import(&moving, bad)).code(), "move_conflict");
    let mut bad = export.clone();
    bad.sessions.clear();
    assert_eq!(b.rej(import(&moving, bad)).code(), "move_conflict");
    // A group never assigned owns everything, so it cannot import.
    let mut fresh = G {
        t: LockTable::new(),
        now: 1_000,
    };
    assert_eq!(fresh.rej(import(&moving, export)).code(), "move_conflict");
}

#[test]
fn bucket_sets_travel_as_ranges() {
    let s: BucketSet = [0u16, 1, 2, 7, 4095].into_iter().collect();
    assert_eq!(s.ranges(), vec![(0, 2), (7, 7), (4095, 4095)]);
    assert_eq!(s.to_string(), "0-2,7,4095");
    assert_eq!(BucketSet::from_ranges(&s.ranges()).unwrap(), s);
    assert_eq!(s.len(), 5);
    for bad in [
        vec![(3u16, 2u16)],
        vec![(0, 4096)],
        vec![(0, 5), (5, 9)],
        vec![(0, 5), (6, 9)],
        vec![(8, 9), (0, 1)],
    ] {
        assert!(BucketSet::from_ranges(&bad).is_err(), "{bad:?}");
    }
    assert_eq!(BucketSet::full().len(), 4096);
    // As operators type them.
    assert_eq!("4095, 0-2,7".parse::<BucketSet>().unwrap(), s);
    assert_eq!("0-4095".parse::<BucketSet>().unwrap(), BucketSet::full());
    assert_eq!("4095-0".parse::<BucketSet>().unwrap(), BucketSet::full());
    assert_eq!(" 2 - 0 ,7, 4095 ".parse::<BucketSet>().unwrap(), s);
    for bad in [
        "", "4096", "a-3", "1,,2", "-1", "+1", "01", "1-2-3", "1\t", "\u{a0}1",
    ] {
        let e = bad.parse::<BucketSet>().unwrap_err();
        assert!(e.contains("bucket") || e.contains("range"), "{bad}: {e}");
    }
}

/// Random traffic on two groups, sent to either group as a stale router would, while buckets
/// move back and forth (each step sometimes repeated, some moves aborted): no name ever has two
/// exclusive holders across the groups (S1), and every grant of a name, in whichever group, has
/// a larger token than every earlier grant of it (S2).
#[test]
fn random_traffic_across_random_moves_keeps_s1_and_s2() {
    for seed in 1..=300u64 {
        run_seed(seed);
    }
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A move in flight: which step comes next.
struct InFlight {
    id: MoveId,
    from: usize,
    buckets: BucketSet,
    step: u8,
    abort: bool,
}

fn run_seed(seed: u64) {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let (low, high, _) = halves();
    let mut g = [G::new(10_000, &low), G::new(3_000, &high)];
    let names: Vec<String> = (0..10).map(|i| format!("n{i}")).collect();
    let sessions: Vec<SessionId> = (1..=4).map(SessionId).collect();
    for s in &sessions {
        for x in g.iter_mut() {
            x.open(s.0);
        }
    }
    let mut last_token: std::collections::HashMap<String, Token> = Default::default();
    let mut map_version = 1;
    let mut next_move = 1;
    let mut flight: Option<InFlight> = None;
    let mut grants = |name: &str, token: Token, at: &str| {
        let prev = last_token.insert(name.to_string(), token).unwrap_or(0);
        assert!(
            token > prev,
            "seed {seed}: S2: '{name}' granted token {token} after {prev} ({at})"
        );
    };
    for _ in 0..400 {
        let gi = rng.below(2) as usize;
        let s = sessions[rng.below(4) as usize];
        let name = names[rng.below(names.len() as u64) as usize].clone();
        let out = match rng.below(10) {
            0..=3 => Some(g[gi].run(Op::Acquire {
                session: s,
                name: name.clone(),
                owner: "o".into(),
                mode: X,
                wait_ms: rng.below(2) * 2_000,
                reentrant: false,
            })),
            4..=5 => {
                let holder = g[gi]
                    .t
                    .lock_info(&name, 0)
                    .and_then(|l| l.holders.iter().find(|h| h.session == s).map(|h| h.token));
                holder.map(|token| {
                    g[gi].run(Op::Release {
                        session: s,
                        name: name.clone(),
                        token,
                    })
                })
            }
            6 => {
                g[gi].now += rng.below(3_000);
                Some(g[gi].run(Op::Tick))
            }
            7 => {
                // A session fails in one group and is re-opened there (a new lease). An import
                // that restarted its lease there makes the first expiry after it a no-op.
                let mut o = g[gi].run(Op::ExpireSessions { sessions: vec![s] });
                if g[gi].t.session_presence(s) == Presence::Live {
                    assert_eq!(
                        o.reply,
                        Ok(Reply::SessionsExpired { expired: vec![] }),
                        "seed {seed}"
                    );
                    o = g[gi].run(Op::ExpireSessions { sessions: vec![s] });
                }
                g[gi].open(s.0);
                Some(o)
            }
            _ => {
                step_move(
                    &mut g,
                    &mut rng,
                    &mut flight,
                    &mut next_move,
                    &mut map_version,
                );
                None
            }
        };
        if let Some(out) = out {
            if let Ok(Reply::Acquired {
                token, reentry: 1, ..
            }) = out.reply
            {
                grants(&name, token, "reply");
            }
            for e in &out.effects {
                if let Effect::Granted { name, token, .. } = e {
                    grants(name, *token, "wait");
                }
            }
        }
        // S1 across both groups.
        for n in &names {
            let holders: usize = g
                .iter()
                .map(|x| x.t.lock_info(n, 0).map_or(0, |l| l.holders.len()))
                .sum();
            assert!(holders <= 1, "seed {seed}: S1: '{n}' has {holders} holders");
        }
    }
}

/// Advances (or starts) one move by one step; sometimes repeats the step just done.
fn step_move(
    g: &mut [G; 2],
    rng: &mut Rng,
    flight: &mut Option<InFlight>,
    next_move: &mut MoveId,
    map_version: &mut u64,
) {
    let Some(f) = flight.as_mut() else {
        // Start: a random range of buckets some group owns.
        let from = rng.below(2) as usize;
        let owned = g[from].t.ownership().owned;
        let Some(first) = owned
            .iter()
            .nth(rng.below(owned.len().max(1) as u64) as usize)
        else {
            return;
        };
        let buckets: BucketSet = owned.iter().filter(|b| b / 256 == first / 256).collect();
        *flight = Some(InFlight {
            id: *next_move,
            from,
            buckets,
            step: 0,
            abort: rng.below(4) == 0,
        });
        *next_move += 1;
        return;
    };
    let to = 1 - f.from;
    let repeat = rng.below(3) == 0;
    let exec = |x: &mut G, op: Op| {
        let r = x.run(op.clone());
        assert!(r.reply.is_ok(), "{op:?}: {:?}", r.reply);
        if repeat {
            assert!(x.run(op).reply.is_ok());
        }
    };
    match (f.step, f.abort) {
        (0, _) => exec(
            &mut g[f.from],
            Op::FreezeBuckets {
                move_id: f.id,
                to_group: to as u32 + 1,
                buckets: f.buckets.clone(),
            },
        ),
        (1, false) => {
            let Some(MoveRecord::Outgoing { export, .. }) = g[f.from].t.move_record(f.id).cloned()
            else {
                panic!("no export")
            };
            exec(
                &mut g[to],
                Op::ImportBuckets {
                    move_id: f.id,
                    from_group: f.from as u32 + 1,
                    buckets: f.buckets.clone(),
                    map_version: *map_version + 1,
                    export,
                },
            )
        }
        (2, false) => {
            *map_version += 1;
            exec(
                &mut g[f.from],
                Op::DropBuckets {
                    move_id: f.id,
                    map_version: *map_version,
                },
            )
        }
        (1, true) => exec(&mut g[to], Op::CancelImport { move_id: f.id }),
        (2, true) => exec(&mut g[f.from], Op::ThawBuckets { move_id: f.id }),
        _ => unreachable!(),
    }
    f.step += 1;
    if f.step == 3 {
        *flight = None;
    }
}

/// A group is closed (for removal) only once it owns nothing and sends nothing, and a closed
/// group takes no bucket: its refusal reads as a cancelled import, so the sender thaws.
#[test]
fn a_group_closes_only_when_empty_and_then_takes_no_bucket() {
    let (low, high, moving) = halves();
    let mut a = G::new(1_000, &low);
    let mut b = G::new(1_000, &high);
    let s = a.open(1);
    let name = names_in(&moving, true, 1).remove(0);
    let t = a.token(s, &name);

    // A group never assigned owns every bucket; one with buckets owns some.
    let mut fresh = G {
        t: LockTable::new(),
        now: 1_000,
    };
    assert_eq!(fresh.rej(Op::CloseGroup).code(), "group_not_empty");
    let e = b.rej(Op::CloseGroup);
    assert_eq!(e.code(), "group_not_empty");
    assert!(e.to_string().contains("2048 buckets"), "{e}");

    // B gives everything to A; while that move is under way B still refuses.
    let freeze = Op::FreezeBuckets {
        move_id: 9,
        to_group: 1,
        buckets: high.clone(),
    };
    b.ok(freeze);
    assert_eq!(b.rej(Op::CloseGroup).code(), "group_not_empty");
    let Some(MoveRecord::Outgoing { export, .. }) = b.t.move_record(9).cloned() else {
        panic!("no export")
    };
    a.ok(Op::ImportBuckets {
        move_id: 9,
        from_group: 2,
        buckets: high.clone(),
        map_version: 2,
        export,
    });
    b.ok(Op::DropBuckets {
        move_id: 9,
        map_version: 2,
    });
    let (r, _) = b.ok(Op::CloseGroup);
    assert_eq!(r, Reply::GroupClosed);
    b.again(Op::CloseGroup, &r);
    assert!(b.t.is_closed());

    // A move of A's buckets to the closed B: refused as cancelled, and A thaws them.
    a.ok(Op::FreezeBuckets {
        move_id: 10,
        to_group: 2,
        buckets: moving.clone(),
    });
    let Some(MoveRecord::Outgoing { export, .. }) = a.t.move_record(10).cloned() else {
        panic!("no export")
    };
    let e = b.rej(Op::ImportBuckets {
        move_id: 10,
        from_group: 1,
        buckets: moving.clone(),
        map_version: 3,
        export,
    });
    assert_eq!(e.code(), "move_conflict");
    assert!(e.to_string().contains("cancelled"), "{e}");
    a.ok(Op::ThawBuckets { move_id: 10 });
    let Some(Reply::Released { .. }) = a
        .run(Op::Release {
            session: s,
            name: name.clone(),
            token: t,
        })
        .reply
        .ok()
    else {
        panic!("the holder is back in A after the thaw")
    };

    // The closed state survives a snapshot.
    let restored = LockTable::restore(&b.t.snapshot()).unwrap();
    assert!(restored.is_closed());
}

/// The move count a grant carries is what lets a client tie a hold to its group's lease: it
/// changes in both groups before a hold can leave one, and never otherwise.
#[test]
fn a_grant_carries_the_move_count_that_a_move_raises_in_both_groups() {
    let (low, high, moving) = halves();
    let mut a = G::new(1_000, &low);
    let mut b = G::new(1_000, &high);
    let s = a.open(9);
    let name = names_in(&moving, true, 1).remove(0);
    let Ok(Reply::Acquired { group_moves, .. }) = a.acquire(s, &name, 0) else {
        panic!("not granted")
    };
    assert_eq!((group_moves, a.t.move_count()), (0, 0));
    // Ordinary commands leave it alone.
    let other = names_in(&low, true, 100).pop().unwrap();
    a.token(s, &other);
    assert_eq!(a.t.move_count(), 0);
    // The freeze raises it in the source before the hold can leave...
    a.ok(Op::FreezeBuckets {
        move_id: 1,
        to_group: 2,
        buckets: moving.clone(),
    });
    assert_eq!(a.t.move_count(), 1);
    let Some(MoveRecord::Outgoing { export, .. }) = a.t.move_record(1).cloned() else {
        panic!()
    };
    // ...and the import in the destination, so a hold granted there before differs too.
    let s2 = b.open(10);
    let theirs = names_in(&high, true, 1).remove(0);
    let Ok(Reply::Acquired { group_moves, .. }) = b.acquire(s2, &theirs, 0) else {
        panic!("not granted")
    };
    assert_eq!(group_moves, 0);
    b.ok(Op::ImportBuckets {
        move_id: 1,
        from_group: 1,
        buckets: moving,
        map_version: 2,
        export,
    });
    assert_eq!(b.t.move_count(), 1);
    // A grant that waited in a queue carries the count of when it was granted.
    let s3 = b.open(11);
    assert!(matches!(
        b.acquire(s3, &theirs, 5_000),
        Ok(Reply::Queued { .. })
    ));
    let token = match b.acquire(s2, &theirs, 0) {
        Err(Rejection::AlreadyHeld { token }) => token,
        other => panic!("{other:?}"),
    };
    let (_, fx) = b.ok(Op::Release {
        session: s2,
        name: theirs,
        token,
    });
    assert!(
        fx.iter()
            .any(|e| matches!(e, Effect::Granted { group_moves: 1, .. })),
        "{fx:?}"
    );
}

/// A hold moved into a group that already had its session follows that session's lease there,
/// which may be older than the one its holder followed in the sending group (the client learns
/// of the move only from its next keepalive). So the import restarts that lease (the leader's
/// timer, through `SessionAdopted`), and an expiry the leader may have decided before the
/// import is skipped once; the next one ends the session (C2).
#[test]
fn an_import_restarts_the_lease_of_a_session_the_group_had() {
    let (low, high, _) = halves();
    let mut a = G::new(10_000, &low);
    let mut b = G::new(3_000, &high);
    let s = SessionId(7);
    a.open(s.0);
    b.open(s.0);
    let name = (0..)
        .map(|i| format!("r{i}"))
        .find(|n| low.contains(bucket_of(n)))
        .unwrap();
    let token = match a.acquire(s, &name, 0) {
        Ok(Reply::Acquired { token, .. }) => token,
        other => panic!("{other:?}"),
    };
    let moving: BucketSet = [bucket_of(&name)].into_iter().collect();
    a.ok(Op::FreezeBuckets {
        move_id: 9,
        to_group: 2,
        buckets: moving.clone(),
    });
    let Some(MoveRecord::Outgoing { export, .. }) = a.t.move_record(9).cloned() else {
        panic!("no outgoing record")
    };
    let (_, fx) = b.ok(Op::ImportBuckets {
        move_id: 9,
        from_group: 1,
        buckets: moving,
        map_version: 2,
        export,
    });
    let ttl_ms =
        b.t.session_ttls()
            .into_iter()
            .find(|(x, _)| *x == s)
            .unwrap()
            .1;
    assert!(fx.contains(&Effect::SessionAdopted { session: s, ttl_ms }));
    // An expiry decided before the import: skipped, the hold stays.
    let (r, fx) = b.ok(Op::ExpireSessions { sessions: vec![s] });
    assert_eq!(r, Reply::SessionsExpired { expired: vec![] });
    assert!(fx.is_empty());
    assert_eq!(b.t.lock_info(&name, 0).unwrap().holders[0].token, token);
    // The next one (the restarted timer ran out) ends it.
    let (r, _) = b.ok(Op::ExpireSessions { sessions: vec![s] });
    assert_eq!(r, Reply::SessionsExpired { expired: vec![s] });
    assert!(b.t.lock_info(&name, 0).is_none_or(|l| l.holders.is_empty()));
    // The record survives a snapshot, the same on every replica.
    let restored = LockTable::restore(&b.t.snapshot()).unwrap();
    assert_eq!(restored.snapshot(), b.t.snapshot());
}
