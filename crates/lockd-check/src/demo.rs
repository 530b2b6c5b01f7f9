//! CHECKER SELF-TEST, NOT LOCKD: the Jepsen lock-set workload run against the PostgreSQL store
//! under a deliberately naive in-memory lease lock ([`ToyLeaseLock`]) whose holders take long
//! pauses. It shows that the harness sees what it must: an unfenced run loses acknowledged updates
//! (the paused holder writes back a stale set after its lease went to someone else) and a fenced
//! run loses none, and the checker reports both. The nemesis reuses [`run_lockset`] with real lockd
//! clients in place of the toy lock.
//!
//! The workload: each worker, under the lock, reads the set from the store, sleeps, and writes it
//! back with one more element (its own, unique). Fenced runs use a fenced read (raising the key's
//! fence to the worker's token) and a fenced write; unfenced runs use neither.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;

use crate::history::{Call, MonotonicClock, Outcome, Record, Recorder};
use crate::store::{decode_set, encode_set, Fencing, Store};

/// A lease lock with no keepalive: a grant lasts `ttl` from the moment it is made; an expired
/// holder is reaped lazily by the next acquire or release. It records the service's view
/// (grants, ends of holds, session expiries) in the history like lockd's recorder will.
pub struct ToyLeaseLock {
    name: String,
    ttl_ns: u64,
    rec: Recorder,
    state: Mutex<ToyState>,
}

struct ToyState {
    holder: Option<ToyHold>,
    next_token: u64,
    seq: u64,
    expired_sessions: HashSet<String>,
}

struct ToyHold {
    token: u64,
    session: String,
    expires_ns: u64,
}

impl ToyLeaseLock {
    pub fn new(name: &str, ttl: Duration, rec: Recorder) -> Self {
        Self {
            name: name.to_owned(),
            ttl_ns: ttl.as_nanos() as u64,
            rec,
            state: Mutex::new(ToyState {
                holder: None,
                next_token: 1,
                seq: 0,
                expired_sessions: HashSet::new(),
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ToyState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn reap(&self, s: &mut ToyState, now_ns: u64) {
        if let Some(h) = s.holder.as_ref().filter(|h| now_ns >= h.expires_ns) {
            let (token, session) = (h.token, h.session.clone());
            s.holder = None;
            s.seq += 1;
            self.rec.push(Record::SvcRelease {
                seq: s.seq,
                group: 0,
                name: self.name.clone(),
                token,
                cause: "expire".into(),
                time_ms: now_ns / 1_000_000,
            });
            s.seq += 1;
            self.rec.push(Record::SvcSessionExpired {
                seq: s.seq,
                group: 0,
                session: session.clone(),
                time_ms: now_ns / 1_000_000,
            });
            s.expired_sessions.insert(session);
        }
    }

    /// One try: `Ok(Some(token))` granted, `Ok(None)` held by someone else, `Err` the session
    /// expired (open a new one).
    pub fn try_acquire(&self, session: &str) -> Result<Option<u64>, SessionExpired> {
        let now = self.rec.now_ns();
        let mut s = self.lock();
        self.reap(&mut s, now);
        if s.expired_sessions.contains(session) {
            return Err(SessionExpired);
        }
        if s.holder.is_some() {
            return Ok(None);
        }
        let token = s.next_token;
        s.next_token += 1;
        s.holder = Some(ToyHold {
            token,
            session: session.to_owned(),
            expires_ns: now + self.ttl_ns,
        });
        s.seq += 1;
        self.rec.push(Record::SvcGrant {
            seq: s.seq,
            group: 0,
            name: self.name.clone(),
            token,
            session: session.to_owned(),
            limit: 1,
            time_ms: now / 1_000_000,
        });
        Ok(Some(token))
    }

    /// True if `token` was the live holder and is now released.
    pub fn release(&self, token: u64) -> bool {
        let now = self.rec.now_ns();
        let mut s = self.lock();
        self.reap(&mut s, now);
        if s.holder.as_ref().is_some_and(|h| h.token == token) {
            s.holder = None;
            s.seq += 1;
            self.rec.push(Record::SvcRelease {
                seq: s.seq,
                group: 0,
                name: self.name.clone(),
                token,
                cause: "release".into(),
                time_ms: now / 1_000_000,
            });
            true
        } else {
            false
        }
    }
}

/// The toy lock's answer to an acquire from a session it has expired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionExpired;

/// Parameters of one lock-set run.
#[derive(Clone, Debug)]
pub struct LocksetConfig {
    pub pg: String,
    pub fencing: Fencing,
    pub workers: u64,
    pub adds_per_worker: u64,
    pub ttl: Duration,
    /// The client gives up its belief this long before the lease ends.
    pub margin: Duration,
    /// Chance that a worker pauses (between its read and its write) for `pause`.
    pub pause_probability: f64,
    pub pause: Duration,
    /// Normal think time under the lock, uniformly up to this.
    pub work: Duration,
    pub seed: u64,
    /// NEGATIVE CONTROL: the client claims a deadline 3 TTLs after its acquire, past its lease.
    /// A run with it must fail the checker (not linearizable).
    pub sabotage_client_deadline: bool,
    /// Drop the store schema afterwards.
    pub drop_tables: bool,
}

impl LocksetConfig {
    pub fn new(pg: String, fencing: Fencing) -> Self {
        Self {
            pg,
            fencing,
            workers: 5,
            adds_per_worker: 12,
            ttl: Duration::from_millis(150),
            margin: Duration::from_millis(30),
            pause_probability: 0.2,
            pause: Duration::from_millis(450),
            work: Duration::from_millis(10),
            seed: 1,
            sabotage_client_deadline: false,
            drop_tables: true,
        }
    }
}

/// Runs the lock-set workload under the toy lock and returns the recorder holding the whole
/// history (clients, toy service, store log, final set).
pub async fn run_lockset(cfg: &LocksetConfig) -> anyhow::Result<Recorder> {
    let fenced = cfg.fencing != Fencing::Unfenced;
    let label = if fenced { "fenced" } else { "unfenced" };
    let ns = format!(
        "lockd_check_demo_{}_{}_{}",
        label,
        std::process::id(),
        MonotonicClock::raw_ns() % 1_000_000_000
    );
    let key = format!("lockset-{label}");
    let lock_name = format!("toy/{key}");
    let rec = Recorder::new(MonotonicClock::start());
    rec.push(Record::Meta {
        version: crate::history::FORMAT_VERSION,
        workload: format!("lockset-{label}"),
        notes: "checker self-test: toy in-memory lease lock with deliberate pauses, not lockd"
            .into(),
    });
    let admin = Store::connect(&cfg.pg, &ns).await?;
    admin.setup().await?;
    admin.init_key(&key, "[]").await?;
    rec.push(Record::StoreInit {
        key: key.clone(),
        value: "[]".into(),
    });
    let lock = Arc::new(ToyLeaseLock::new(&lock_name, cfg.ttl, rec.clone()));
    let mut tasks = Vec::new();
    for w in 0..cfg.workers {
        let (cfg, rec, lock, key, lock_name, ns) = (
            cfg.clone(),
            rec.clone(),
            lock.clone(),
            key.clone(),
            lock_name.clone(),
            ns.clone(),
        );
        tasks.push(tokio::spawn(async move {
            worker(w, &cfg, &rec, &lock, &lock_name, &key, &ns).await
        }));
    }
    for t in tasks {
        t.await.context("worker panicked")??;
    }
    let final_set = decode_set(&admin.read(&key).await?)?;
    rec.push(Record::LocksetFinal {
        key: key.clone(),
        fenced,
        elements: final_set.into_iter().collect(),
    });
    for r in admin.log_records().await? {
        rec.push(r);
    }
    if cfg.drop_tables {
        admin.drop_namespace().await?;
    }
    Ok(rec)
}

async fn worker(
    w: u64,
    cfg: &LocksetConfig,
    rec: &Recorder,
    lock: &ToyLeaseLock,
    lock_name: &str,
    key: &str,
    ns: &str,
) -> anyhow::Result<()> {
    let fenced = cfg.fencing != Fencing::Unfenced;
    let mut store = Store::connect(&cfg.pg, ns).await?;
    let mut rng = fastrand::Rng::with_seed(cfg.seed.wrapping_mul(1_000_003).wrapping_add(w));
    let process = w + 1;
    let mut epoch = 0u64;
    let ttl_ns = cfg.ttl.as_nanos() as u64;
    let margin_ns = cfg.margin.as_nanos() as u64;
    for i in 0..cfg.adds_per_worker {
        let element = (w + 1) * 1_000 + i;
        // Acquire, waiting up to 20 TTLs (a bounded loop of 2 ms tries).
        let h = rec.invoke(
            process,
            Call::Acquire {
                name: lock_name.to_owned(),
            },
        );
        let mut sent_ns = 0;
        let mut token = None;
        let tries = (20 * cfg.ttl.as_millis() as u64 / 2).max(1);
        for _ in 0..tries {
            sent_ns = rec.now_ns();
            match lock.try_acquire(&format!("w{w}-s{epoch}")) {
                Ok(Some(t)) => {
                    token = Some(t);
                    break;
                }
                Ok(None) => tokio::time::sleep(Duration::from_millis(2)).await,
                Err(SessionExpired) => epoch += 1,
            }
        }
        let Some(token) = token else {
            rec.complete(h, Outcome::NotGranted);
            continue;
        };
        rec.complete(h, Outcome::Granted { token });
        // The client's deadline: send time of the acknowledged try + TTL - margin.
        let deadline_ns = if cfg.sabotage_client_deadline {
            sent_ns + 3 * ttl_ns
        } else {
            sent_ns + ttl_ns - margin_ns
        };

        // Read (fenced: raise the fence to our token).
        let read_token = fenced.then_some(token);
        let h = rec.invoke(
            process,
            Call::Read {
                key: key.to_owned(),
                token: read_token,
            },
        );
        let read = if cfg.fencing == Fencing::Fenced {
            store.read_fenced(key, token).await?
        } else {
            Some(store.read(key).await?)
        };
        match &read {
            Some(v) => rec.complete(h, Outcome::ReadOk { value: v.clone() }),
            None => rec.complete(h, Outcome::RejectedStale),
        }

        // Think, or pause like a GC pause far past the TTL.
        if rng.f64() < cfg.pause_probability {
            tokio::time::sleep(cfg.pause).await;
        } else {
            let work_ms = cfg.work.as_millis().max(1) as u64;
            tokio::time::sleep(Duration::from_millis(rng.u64(0..=work_ms))).await;
        }

        if let Some(v) = read {
            let mut set = decode_set(&v)?;
            set.insert(element);
            let value = encode_set(&set);
            let h = rec.invoke(
                process,
                Call::Write {
                    key: key.to_owned(),
                    token: Some(token),
                    fenced,
                    value: value.clone(),
                    add: Some(element),
                },
            );
            let out = store.write(key, token, &value, cfg.fencing).await?;
            rec.complete(h, out.into());
        }

        // The deadline is checked only now: a paused process cannot check it mid-pause, which is
        // the whole point of fencing.
        let now = rec.now_ns();
        if now >= deadline_ns {
            rec.push(Record::LeaseLost {
                process,
                name: lock_name.to_owned(),
                token,
                deadline_ns,
                at_ns: now,
            });
            epoch += 1;
            continue;
        }
        let h = rec.invoke(
            process,
            Call::Release {
                name: lock_name.to_owned(),
                token,
            },
        );
        let ok = lock.release(token);
        rec.complete(h, if ok { Outcome::Ok } else { Outcome::Refused });
    }
    Ok(())
}
