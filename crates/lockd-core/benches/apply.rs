//! Apply throughput and memory per held lock. Prints numbers; asserts nothing about time.
//!
//! `cargo bench -p lockd-core --bench apply` (set `LOCKD_BENCH_LOCKS` to change the 1M held).

use std::time::Instant;

use lockd_core::*;

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn open(t: &mut LockTable, sessions: u64) {
    for s in 0..sessions {
        let op = Op::OpenSession {
            session: SessionId(s),
            client: format!("payout-worker-{s}"),
            ttl_ms: 0,
            namespace: String::new(),
        };
        t.apply(&Command { now_ms: 1, op }).reply.unwrap();
    }
}

fn acquire(session: u64, name: String) -> Op {
    Op::Acquire {
        session: SessionId(session),
        name,
        owner: "payout-worker-17/batch-2210".into(),
        mode: LockMode::Exclusive,
        wait_ms: 0,
        reentrant: false,
    }
}

/// Acquire then release on distinct names; commands are built before the clock starts.
fn throughput(pairs: u64) {
    let mut t = LockTable::new();
    open(&mut t, 1_000);
    let cmds: Vec<Command> = (0..pairs)
        .flat_map(|i| {
            let name = format!("payouts/merchant-{i}");
            let s = i % 1_000;
            [
                Command {
                    now_ms: 2 + i,
                    op: acquire(s, name.clone()),
                },
                // Tokens are minted 1, 2, 3, ... in this run: acquire i gets token i + 1.
                Command {
                    now_ms: 2 + i,
                    op: Op::Release {
                        session: SessionId(s),
                        name,
                        token: i + 1,
                    },
                },
            ]
        })
        .collect();
    let start = Instant::now();
    for c in &cmds {
        let out = t.apply(c);
        debug_assert!(out.reply.is_ok());
    }
    let secs = start.elapsed().as_secs_f64();
    assert_eq!(t.stats().holds, 0);
    println!(
        "apply: {} commands (acquire+release, distinct names) in {:.3} s = {:.0} applies/s, {:.0} ns/apply",
        cmds.len(),
        secs,
        cmds.len() as f64 / secs,
        secs * 1e9 / cmds.len() as f64
    );
}

/// Holds `n` locks at once across 20,000 sessions (50 each, as in the seed) and reports RSS growth.
fn memory(n: u64) {
    let sessions = 20_000;
    let base = rss_bytes();
    let mut t = LockTable::new();
    open(&mut t, sessions);
    let after_sessions = rss_bytes();
    let start = Instant::now();
    for i in 0..n {
        let out = t.apply(&Command {
            now_ms: 2,
            op: acquire(i % sessions, format!("payouts/merchant-{i}")),
        });
        debug_assert!(out.reply.is_ok());
    }
    let fill = start.elapsed().as_secs_f64();
    let held = rss_bytes();
    let per_lock = (held - after_sessions) as f64 / n as f64;
    println!(
        "memory: {n} held locks over {sessions} sessions: {:.0} bytes/held lock (RSS {} MiB; sessions {} MiB); filled at {:.0} acquires/s",
        per_lock,
        held / (1 << 20),
        (after_sessions - base) / (1 << 20),
        n as f64 / fill
    );
    // The contention view (GET /v1/contention): the waiting part, then the longest-holds pass
    // in the server's steps of 8,192 records (the state is released between steps), over every
    // namespace and narrowed to one (a namespace lookup per record).
    let start = Instant::now();
    let w = t.waiting(10, 3, None);
    println!(
        "contention: waiting part with {n} held and none queued: {:.2} ms",
        start.elapsed().as_secs_f64() * 1e3
    );
    assert_eq!(w.scanned, 0);
    for (what, filter) in [
        ("every namespace", None),
        ("one namespace", Some(vec!["default".to_string()])),
    ] {
        let (mut from, mut steps, mut longest, mut scanned) = (0, 0u32, 0f64, 0);
        let start = Instant::now();
        loop {
            let s = Instant::now();
            let c = t.held_chunk(from, 8_192, 10, 3, filter.as_deref());
            longest = longest.max(s.elapsed().as_secs_f64());
            scanned += c.scanned;
            steps += 1;
            from += 8_192;
            if c.done {
                break;
            }
        }
        assert_eq!(scanned, n);
        println!(
            "contention: longest-holds pass over {n} held, {what}: {:.1} ms in {steps} steps, longest step {:.2} ms",
            start.elapsed().as_secs_f64() * 1e3,
            longest * 1e3
        );
    }
    let start = Instant::now();
    let bytes = t.snapshot();
    let snap = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let restored = LockTable::restore(&bytes).unwrap();
    let restore = start.elapsed().as_secs_f64();
    assert_eq!(restored.stats(), t.stats());
    println!(
        "snapshot: {} MiB ({:.0} bytes/lock), written in {:.2} s, restored (with invariant check) in {:.2} s",
        bytes.len() / (1 << 20),
        bytes.len() as f64 / n as f64,
        snap,
        restore
    );
}

fn main() {
    // `cargo test --benches` runs this too: keep that quick.
    let quick = std::env::args().any(|a| a == "--test");
    let locks = std::env::var("LOCKD_BENCH_LOCKS")
        .ok()
        .and_then(|v| v.parse().ok());
    if quick {
        throughput(10_000);
        memory(locks.unwrap_or(20_000));
    } else {
        throughput(1_000_000);
        memory(locks.unwrap_or(1_000_000));
    }
}
