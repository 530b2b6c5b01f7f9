//! One nemesis worker: a separate OS process (so the nemesis can SIGSTOP it like a GC pause)
//! using lockd-client against the real cluster, recording every call to its own history file.
//!
//! Two workloads:
//! * **mutex**: take one of a few names, hold it for 0.2–3 TTLs, and while the guard is not
//!   lost write to the fenced store under the token every 150 ms; then release;
//! * **lockset** (Jepsen's): under the lock, read a set from the store, think, write it back
//!   with one more element. Each round alternates between the fenced key (fenced read and write)
//!   and the unfenced key (plain read and write), so one run measures both.
//!
//! The end of a worker's belief that it holds a lock is recorded as it happens: a `LeaseLost`
//! with the guard's deadline when the client's deadline fired, or the release's invoke. An
//! outcome the worker cannot know (a timeout) ends its process id; it goes on under a new one
//! with a new session, as the history format requires.
//!
//! Besides, a watcher records the session's renewals for the availability figures
//! (`watch_renewals`).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lockd_client::{Client, ClientOptions, Error as ClientError, LockGuard};

use crate::history::{Call, MonotonicClock, Outcome, Record, Recorder};
use crate::store::{decode_set, encode_set, Fencing, Store};

/// What one worker does.
#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// 1-based worker number; process ids are `id * 1_000_000 + epoch`.
    pub id: u64,
    pub endpoints: Vec<String>,
    pub namespace: String,
    pub ttl: Duration,
    pub lockset: bool,
    pub pg: String,
    pub store_ns: String,
    pub history: PathBuf,
    pub origin_ns: u64,
    pub run_for: Duration,
    pub seed: u64,
    /// NEGATIVE CONTROL: ignore the client's deadline (believe the lock is held until released).
    pub sabotage_client_deadline: bool,
    /// NEGATIVE CONTROL: the store accepts "fenced" writes without checking the fence.
    pub sabotage_store_fence: bool,
    /// Chance per lock-set round (a tenth of it per mutex write) that the worker SIGSTOPs
    /// itself in the worst place: holding the lock, between its read (or lease check) and its
    /// write. The nemesis sees the stopped process and resumes it 2-5 TTLs later. A lock-set
    /// worker's pauses take turns between the fenced and the unfenced key, so that both the
    /// fence and the unfenced control are tested in every run that pauses at least twice.
    pub self_pause: f64,
}

/// The lock names and store keys the workloads use (the nemesis initialises the keys).
pub const MUTEX_NAMES: [&str; 2] = ["nemesis/m0", "nemesis/m1"];
pub const SET_FENCED: &str = "set-fenced";
pub const SET_UNFENCED: &str = "set-unfenced";

/// The store key a mutex name's holders write.
pub fn mutex_key(name: &str) -> String {
    format!("reg-{}", name.rsplit('/').next().unwrap_or(name))
}

/// The lock name guarding a lock-set key.
pub fn set_lock(key: &str) -> String {
    format!("nemesis/{key}")
}

struct Worker {
    cfg: WorkerConfig,
    rec: Recorder,
    store: Store,
    rng: fastrand::Rng,
    client: Client,
    /// The client and process id in use, for the renewal watcher.
    current: Arc<Mutex<(Client, u64)>>,
    epoch: u64,
    next_element: u64,
    /// A self-pause was drawn and waits for a round on `pause_fenced_next`'s key.
    pause_pending: bool,
    /// Which key the next lock-set self-pause falls on (the first is on the fenced one).
    pause_fenced_next: bool,
}

fn client_options(cfg: &WorkerConfig, epoch: u64) -> ClientOptions {
    ClientOptions {
        client_name: format!("nemesis-w{}-{epoch}", cfg.id),
        ttl: cfg.ttl,
        namespace: cfg.namespace.clone(),
        request_timeout: Duration::from_secs(1),
        ..ClientOptions::default()
    }
}

/// Stops this process (like a GC pause) until someone sends SIGCONT.
fn stop_self() {
    let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::STOP);
}

/// Runs one worker until `run_for` has passed; its history goes to `cfg.history`.
pub async fn run(cfg: WorkerConfig) -> anyhow::Result<()> {
    let rec = Recorder::with_file(MonotonicClock::with_origin(cfg.origin_ns), &cfg.history)?;
    let store = Store::connect(&cfg.pg, &cfg.store_ns).await?;
    let client = Client::lazy(cfg.endpoints.clone(), client_options(&cfg, 0))?;
    let current = Arc::new(Mutex::new((client.clone(), cfg.id * 1_000_000)));
    let renewals = tokio::spawn(watch_renewals(rec.clone(), current.clone(), cfg.ttl));
    let mut w = Worker {
        rng: fastrand::Rng::with_seed(cfg.seed ^ cfg.id.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        cfg,
        rec,
        store,
        client,
        current,
        epoch: 0,
        next_element: 0,
        pause_pending: false,
        pause_fenced_next: true,
    };
    let end = Instant::now() + w.cfg.run_for;
    let mut round = 0u64;
    while Instant::now() < end {
        round += 1;
        let r = if w.cfg.lockset {
            let key = if round.is_multiple_of(2) {
                SET_FENCED
            } else {
                SET_UNFENCED
            };
            w.lockset_round(key).await
        } else {
            let name = MUTEX_NAMES[w.rng.usize(..MUTEX_NAMES.len())];
            w.mutex_round(name, end).await
        };
        if let Err(e) = r {
            // A store error (PostgreSQL restarted, say) ends this process id like a crash.
            eprintln!("nemesis worker {}: {e:#}", w.cfg.id);
            w.new_process().await;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    renewals.abort();
    let process = w.process();
    w.rec.push(Record::ProcessEnd {
        process,
        at_ns: w.rec.now_ns(),
    });
    let _ = tokio::time::timeout(Duration::from_secs(2), w.client.close()).await;
    Ok(())
}

/// How often the renewal watcher looks at the client's last acknowledged keepalive.
const RENEWAL_POLL: Duration = Duration::from_millis(50);

/// While the current client has a session, opens a renewal slot every TTL/3 (the client's own
/// keepalive interval) and records whether a keepalive sent at or after the slot's start was
/// acknowledged within TTL/2 ([`Record::Renewal`]; seen up to one poll late). A slot still open
/// when its process id ends is dropped unrecorded (the worker abandoned that session). After a
/// pause of this process the slots fail: the availability figures exclude them.
async fn watch_renewals(rec: Recorder, current: Arc<Mutex<(Client, u64)>>, ttl: Duration) {
    use tokio::time::Instant;
    let (every, deadline) = (ttl / 3, ttl / 2);
    let deadline_ns = u64::try_from(deadline.as_nanos()).unwrap_or(u64::MAX);
    let mut slots: Vec<(Instant, u64)> = Vec::new();
    let mut tracked = None;
    let mut next = Instant::now() + every;
    loop {
        tokio::time::sleep(RENEWAL_POLL).await;
        let (client, process) = current.lock().expect("current client").clone();
        if tracked != Some(process) {
            slots.clear();
            tracked = Some(process);
        }
        let acked = client.lease_report().map(|r| r.at);
        let now = Instant::now();
        slots.retain(|&(t, at_ns)| {
            let answered = acked.is_some_and(|a| a >= t) && now <= t + deadline + RENEWAL_POLL;
            if !answered && now < t + deadline {
                return true;
            }
            let end_ns = if answered {
                rec.now_ns().min(at_ns + deadline_ns)
            } else {
                at_ns + deadline_ns
            };
            rec.push(Record::Renewal {
                process,
                at_ns,
                end_ns,
                answered,
            });
            false
        });
        if now >= next {
            next = now + every;
            if client.session_id().is_some_and(|id| !id.is_empty()) {
                slots.push((now, rec.now_ns()));
            }
        }
    }
}

impl Worker {
    /// How "fenced" writes are made (sabotaged: no check at all).
    fn fenced(&self) -> Fencing {
        if self.cfg.sabotage_store_fence {
            Fencing::SabotagedNoCheck
        } else {
            Fencing::Fenced
        }
    }

    fn process(&self) -> u64 {
        self.cfg.id * 1_000_000 + self.epoch
    }

    /// Ends this process id (its session may hold a lock it does not know about) and starts a
    /// new one with a new session.
    async fn new_process(&mut self) {
        let process = self.process();
        self.rec.push(Record::ProcessEnd {
            process,
            at_ns: self.rec.now_ns(),
        });
        let _ = tokio::time::timeout(Duration::from_secs(2), self.client.close()).await;
        self.epoch += 1;
        match Client::lazy(
            self.cfg.endpoints.clone(),
            client_options(&self.cfg, self.epoch),
        ) {
            Ok(c) => {
                *self.current.lock().expect("current client") = (c.clone(), self.process());
                self.client = c;
            }
            Err(e) => eprintln!("nemesis worker {}: new client: {e}", self.cfg.id),
        }
    }

    /// Acquire `name`, waiting up to two TTLs. `None` if not granted (or unknown: then the
    /// process id has already moved on).
    async fn acquire(&mut self, name: &str) -> Option<LockGuard> {
        let process = self.process();
        let h = self.rec.invoke(
            process,
            Call::Acquire {
                name: name.to_owned(),
            },
        );
        let res = self.client.acquire(name).wait(2 * self.cfg.ttl).await;
        match res {
            Ok(g) => {
                self.rec.complete(h, Outcome::Granted { token: g.token() });
                Some(g)
            }
            Err(ClientError::NotAcquired { .. }) => {
                self.rec.complete(h, Outcome::NotGranted);
                None
            }
            // Refused before anything changed: bad input, no session, shed load.
            Err(
                e @ ClientError::Api {
                    status: 400 | 401 | 403 | 404 | 429,
                    ..
                },
            ) => {
                self.rec.complete(h, Outcome::NotGranted);
                eprintln!("nemesis worker {}: acquire {name}: {e}", self.cfg.id);
                tokio::time::sleep(Duration::from_millis(self.rng.u64(100..=300))).await;
                None
            }
            Err(e) => {
                // Maybe granted (a timeout after sending, a lost session): unknown.
                self.rec.complete(h, Outcome::Unknown);
                eprintln!("nemesis worker {}: acquire {name}: {e}", self.cfg.id);
                self.new_process().await;
                tokio::time::sleep(Duration::from_millis(self.rng.u64(100..=300))).await;
                None
            }
        }
    }

    /// Whether the worker still believes it holds `g`; records the end of that belief once.
    fn still_held(&self, g: &LockGuard) -> bool {
        if self.cfg.sabotage_client_deadline || !g.is_lost() {
            return true;
        }
        let now = Instant::now();
        let now_ns = self.rec.now_ns();
        let deadline_ns = now_ns.saturating_sub(
            now.saturating_duration_since(g.deadline().into_std())
                .as_nanos()
                .try_into()
                .unwrap_or(u64::MAX),
        );
        self.rec.push(Record::LeaseLost {
            process: self.process(),
            name: g.name().to_owned(),
            token: g.token(),
            deadline_ns,
            at_ns: now_ns,
        });
        false
    }

    async fn release(&mut self, g: LockGuard) {
        let process = self.process();
        let (name, token, deadline) = (g.name().to_owned(), g.token(), g.deadline().into_std());
        let h = self.rec.invoke(
            process,
            Call::Release {
                name: name.clone(),
                token,
            },
        );
        let res = g.release().await;
        let refused = matches!(
            res,
            Err(ClientError::Api {
                status: 404 | 409,
                ..
            })
        );
        match &res {
            Ok(()) => self.rec.complete(h, Outcome::Ok),
            Err(_) if refused => self.rec.complete(h, Outcome::Refused),
            Err(_) => self.rec.complete(h, Outcome::Unknown),
        }
        // The client's deadline may pass while the release is in flight; the client then ends
        // its session itself, which frees the hold before the release arrives (and is refused).
        // The belief ended at the deadline: say so, as the guard would have.
        let now = Instant::now();
        if res.is_err() && now >= deadline && !self.cfg.sabotage_client_deadline {
            let now_ns = self.rec.now_ns();
            let late: u64 = (now - deadline).as_nanos().try_into().unwrap_or(u64::MAX);
            self.rec.push(Record::LeaseLost {
                process,
                name,
                token,
                deadline_ns: now_ns.saturating_sub(late),
                at_ns: now_ns,
            });
        }
        if res.is_err() && !refused {
            self.new_process().await;
        }
    }

    async fn mutex_round(&mut self, name: &str, end: Instant) -> anyhow::Result<()> {
        let Some(g) = self.acquire(name).await else {
            return Ok(());
        };
        let ttl_ms = self.cfg.ttl.as_millis() as u64;
        let hold = Duration::from_millis(self.rng.u64(ttl_ms / 5..=3 * ttl_ms));
        let until = (Instant::now() + hold).min(end + self.cfg.ttl);
        let key = mutex_key(name);
        let mut n = 0u64;
        loop {
            if !self.still_held(&g) {
                return Ok(()); // dropping the guard releases in the background, unrecorded
            }
            if Instant::now() >= until {
                break;
            }
            n += 1;
            if self.rng.f64() < self.cfg.self_pause / 10.0 {
                stop_self();
            }
            let value = format!("{}:{n}", g.token());
            let h = self.rec.invoke(
                self.process(),
                Call::Write {
                    key: key.clone(),
                    token: Some(g.token()),
                    fenced: true,
                    value: value.clone(),
                    add: None,
                },
            );
            let out = self
                .store
                .write(&key, g.token(), &value, self.fenced())
                .await?;
            self.rec.complete(h, out.into());
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        self.release(g).await;
        Ok(())
    }

    async fn lockset_round(&mut self, key: &str) -> anyhow::Result<()> {
        let fenced = key == SET_FENCED;
        let name = set_lock(key);
        let Some(g) = self.acquire(&name).await else {
            return Ok(());
        };
        let token = g.token();
        let h = self.rec.invoke(
            self.process(),
            Call::Read {
                key: key.to_owned(),
                token: fenced.then_some(token),
            },
        );
        let read = if fenced {
            self.store.read_fenced(key, token).await?
        } else {
            Some(self.store.read(key).await?)
        };
        match &read {
            Some(v) => self.rec.complete(h, Outcome::ReadOk { value: v.clone() }),
            None => self.rec.complete(h, Outcome::RejectedStale),
        }
        // Think. No lease check before the write: "check, then write" never closes the window
        // (a pause can fall between the two); the fence is what must protect the data.
        tokio::time::sleep(Duration::from_millis(self.rng.u64(50..=300))).await;
        if self.rng.f64() < self.cfg.self_pause {
            self.pause_pending = true;
        }
        if self.pause_pending && self.pause_fenced_next == fenced {
            self.pause_pending = false;
            self.pause_fenced_next = !fenced;
            stop_self();
        }
        if let Some(v) = read {
            let mut set = decode_set(&v)?;
            self.next_element += 1;
            let element = self.cfg.id * 1_000_000 + self.next_element;
            set.insert(element);
            let value = encode_set(&set);
            let h = self.rec.invoke(
                self.process(),
                Call::Write {
                    key: key.to_owned(),
                    token: Some(token),
                    fenced,
                    value: value.clone(),
                    add: Some(element),
                },
            );
            let fencing = if fenced {
                self.fenced()
            } else {
                Fencing::Unfenced
            };
            let out = self.store.write(key, token, &value, fencing).await?;
            self.rec.complete(h, out.into());
        }
        if self.still_held(&g) {
            self.release(g).await;
        }
        Ok(())
    }
}
