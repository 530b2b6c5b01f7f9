//! `lockd-check nemesis`: real `lockd serve` processes, real worker processes using lockd-client,
//! a fenced PostgreSQL store, and a seeded schedule of faults:
//!
//! * `kill`: SIGKILL a node (the leader of a lock group, more often than not), restart it after
//!   3–6 s; the time to the next grant in the groups it led is a failover measurement;
//! * `pause-node` / `pause-client`: SIGSTOP a node or a worker for 2–5 TTLs, counted only once
//!   `/proc/PID/status` shows `T`, then SIGCONT;
//! * `partition`: cut every link between one node (often a leader) and the others, through the
//!   fault-injecting proxies, for 2–5 TTLs;
//! * `clock`: jump a node's wall clock forwards by an hour to a month (libfaketime, monotonic
//!   clock untouched) for 2–4 TTLs, then back;
//! * `move`, `restart`, `replace`: a worker name's bucket moves to another lock group, a node
//!   stops gracefully and starts again, a node dies with its disk and a new id takes its place
//!   (see [`FaultKind`]);
//! * `drain`: a toggle that outlives the faults after it: mark a live node draining through
//!   the admin API (the call waits until it leads no group), and at the next draw clear the
//!   mark. Meanwhile the other faults hit any node, the draining one too; a replaced draining
//!   node's mark ends with its retirement. A check some seconds after each mark counts whether
//!   the node still leads a group (`drain_still_leading=`); whatever is marked at the end is
//!   cleared before the checks.
//!
//! Afterwards it heals everything, lets the workers finish, reads the store's own log, the
//! final sets and every node's audit log, and runs the checker over the whole history. From the
//! same history it measures the service's availability to the workers by fault kind ([`avail`]).

pub mod audit;
pub mod avail;
pub mod cluster;
pub mod proxy;
pub mod worker;
pub mod zones;

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use lockd_client::{Client, ClientOptions};
use lockd_core::ShardMap;

use crate::checker::{self, Budget, Report};
use crate::history::{History, MonotonicClock, Record, Recorder};
use crate::store::Store;
use cluster::{Cluster, ClusterConfig};
use worker::{mutex_key, MUTEX_NAMES, SET_FENCED, SET_UNFENCED};

/// The namespace every nemesis lock lives in (short TTLs allowed), and its prefix.
pub const NAMESPACE: &str = "nemesis";
pub const PREFIX: &str = "nemesis/";

/// A fault the schedule may inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum FaultKind {
    Kill,
    PauseNode,
    PauseClient,
    Partition,
    Clock,
    /// A topology change: the bucket of a worker's name moves to another lock group while in
    /// use (through the admin API of a random node, concurrent with the next faults).
    Move,
    /// A graceful leave and return: SIGTERM (the node hands its groups off and stops), then
    /// start it again on the same data dir.
    Restart,
    /// A node dies with its disk: SIGKILL, then a new node id takes its place in every group
    /// it was in (joined as a learner, promoted) and the dead id is removed for good.
    Replace,
    /// A node loses its disk and is started again under its old id (a supervisor after a disk
    /// swap): it must be refused within 15 s, naming the fix; then a new node id takes its
    /// place as in [`FaultKind::Replace`].
    Wipe,
    /// A toggle kept across draws: mark a random live node draining (the admin call waits
    /// until it leads no group), or, if one is marked, clear the mark. The faults drawn in
    /// between hit the draining node like any other.
    Drain,
}

impl FaultKind {
    /// Its `--faults` spelling.
    pub fn name(self) -> String {
        use clap::ValueEnum;
        self.to_possible_value()
            .map_or_else(|| format!("{self:?}"), |v| v.get_name().to_string())
    }

    pub fn label(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            // One kind in the RESULT line; the target says node or worker.
            FaultKind::PauseNode | FaultKind::PauseClient => "pause",
            FaultKind::Partition => "partition",
            FaultKind::Clock => "clock",
            FaultKind::Move => "move",
            FaultKind::Restart => "restart",
            FaultKind::Replace => "replace",
            FaultKind::Wipe => "wipe",
            FaultKind::Drain => "drain",
        }
    }
}

/// A scripted topology run in place of the random fault schedule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// Start with 3 nodes and one lock group; join nodes 4-6, create group 2 on them, move half
    /// the buckets to it, SIGKILL node 5 and replace it by a new node 7, restart every node in
    /// turn (SIGTERM, start again, wait until caught up), then move the buckets back and remove
    /// group 2, all under the workers' load.
    Grow,
    /// Five nodes in three zones (z1: nodes 1 and 4, z2: 2 and 5, z3: 3), every lock group on
    /// all five (2+2+1: no zone holds a majority); lose a whole zone (SIGKILL its nodes, start
    /// them again on their data), then another, then cut a zone off from the others through
    /// the proxies, and again until the duration is used up (see [`zones`]).
    Zones,
}

/// A negative control: a deliberately broken safety mechanism the run must catch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Sabotage {
    /// The store accepts "fenced" writes without checking the fence.
    StoreFence,
    /// Workers ignore the client's deadline.
    ClientDeadline,
    /// Leaders acknowledge keepalives without their leader lease (the grant-time lease check).
    LeaderLease,
}

impl Sabotage {
    /// The violation this sabotage must cause. In the clients' records a grant while the
    /// earlier (honest) holder still believed is a belief overlap, so leader-lease and
    /// client-deadline share it here (the simulator tells them apart).
    pub fn signature(self) -> checker::Signature {
        match self {
            Sabotage::StoreFence => checker::Signature::StaleWrite,
            Sabotage::ClientDeadline | Sabotage::LeaderLease => checker::Signature::BeliefOverlap,
        }
    }
}

/// After healing, a node's applied index may trail the group's highest by at most this much.
pub const MAX_APPLY_LAG: u64 = 1000;

/// One nemesis run.
#[derive(Clone, Debug)]
pub struct NemesisConfig {
    pub lockd_bin: PathBuf,
    /// This executable (workers are `lockd-check nemesis-worker` processes).
    pub self_exe: PathBuf,
    pub dir: PathBuf,
    pub duration: Duration,
    pub seed: u64,
    pub pg: String,
    pub ttl: Duration,
    pub mutex_workers: u64,
    pub lockset_workers: u64,
    pub lock_groups: u32,
    /// `lockd serve --snapshot-every` for the nodes the nemesis starts.
    pub snapshot_every: u64,
    pub faults: Vec<FaultKind>,
    /// A scripted topology run instead of `faults` (see [`Scenario`]).
    pub scenario: Option<Scenario>,
    pub sabotage: Option<Sabotage>,
    pub faketime: bool,
    /// See `WorkerConfig::self_pause`.
    pub self_pause: f64,
    pub budget: Budget,
    /// Run against a cluster someone else started: (gRPC endpoints, readable audit logs).
    /// Only client pauses are injected then; the operator may add node faults by hand.
    pub external: Option<(Vec<String>, Vec<PathBuf>)>,
}

/// What a run found.
pub struct Outcome {
    pub report: Report,
    pub replica_divergence: usize,
    pub audit_entries: usize,
    /// Snapshots the nodes wrote and snapshots they installed from a leader (from their logs;
    /// unknown for an external cluster).
    pub snapshots: Option<(usize, usize)>,
    pub history_file: PathBuf,
    /// The progress measurements (`None` fields: an external cluster).
    pub progress: Progress,
    /// Progress checks that failed, each naming the check and its numbers.
    pub progress_failures: Vec<String>,
    /// The service's availability to the workers, by fault kind (see [`avail`]).
    pub availability: avail::Availability,
}

/// What shows the run exercised anything: a run that passes must have made progress.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    pub workers_failed: u64,
    /// Nodes dead at the end and panics in the nodes' logs; `None` for an external cluster.
    pub nodes: Option<(usize, usize)>,
    /// `None`: external cluster, or a node did not answer its status call.
    pub max_apply_lag: Option<u64>,
    pub faults_injected: u64,
    /// Bucket moves that completed, and that stopped half-way (finished by a later one).
    pub moves_ok: u64,
    pub moves_failed: u64,
    pub missing_in_audit: u64,
    /// Requested fault kinds of which none was injected (verified): a run too short for a
    /// full round of draws proves nothing about them.
    pub kinds_never_injected: Vec<String>,
    /// Checks, some seconds after a drain mark, that the node leads no group (while another
    /// node runs), and how many found it still leading one. Logged, not failed: see
    /// [`DRAIN_CHECK_AFTER_MS`].
    pub drain_checks: u64,
    pub drain_still_leading: u64,
    /// A draining node seen leading one group in one term for [`DRAIN_STUCK`] or longer,
    /// under the other faults (logged, not failed).
    pub drain_stuck: u64,
    /// Why a draining mark could not be cleared at the end of the run, if so.
    pub drain_left: Option<String>,
    /// What the [`Scenario::Zones`] script did (`None`: another run).
    pub zones: Option<zones::ZoneCounts>,
}

impl Outcome {
    pub fn has_violations(&self) -> bool {
        self.report.has_violations() || self.replica_divergence > 0
    }

    /// The checker's RESULT line plus what only the nemesis knows.
    pub fn result_line(&self, cfg: &NemesisConfig) -> String {
        let mut line = self.report.result_line();
        // `violations=` stays last.
        if let Some(i) = line.rfind(" violations=") {
            line.truncate(i);
        }
        let snapshots = self.snapshots.map_or(String::new(), |(w, i)| {
            format!(" snapshots_written={w} snapshots_installed={i}")
        });
        let p = &self.progress;
        let d = &self.report.direct;
        let nodes = match p.nodes {
            Some((dead, panics)) => format!(
                "nodes_dead={dead} node_panics={panics} max_apply_lag={}",
                p.max_apply_lag.map_or("na".into(), |l| l.to_string())
            ),
            None => "nodes=external".into(),
        };
        let zones = p.zones.map_or(String::new(), |z| {
            format!(
                " zone_losses={} zone_partitions={} zone_slow_recoveries={}",
                z.losses, z.partitions, z.slow_recoveries
            )
        });
        format!(
            "{line} replica_divergence={} audit_entries={}{snapshots} workers_failed={} {nodes} \
             acked_grants={} fenced_adds={} unfenced_lost={} missing_in_audit={} \
             drain_checks={} drain_still_leading={} drain_stuck={}{zones} \
             moves_ok={} moves_failed={} progress_failures={} {} duration_s={} seed={} \
             sabotage={} violations={}",
            self.replica_divergence,
            self.audit_entries,
            p.workers_failed,
            d.acked_grants.len(),
            d.acked_adds_fenced,
            d.lost_updates_unfenced.unwrap_or(0),
            p.missing_in_audit,
            p.drain_checks,
            p.drain_still_leading,
            p.drain_stuck,
            p.moves_ok,
            p.moves_failed,
            self.progress_failures.len(),
            self.availability.result_fields(),
            cfg.duration.as_secs(),
            cfg.seed,
            cfg.sabotage
                .map_or("none".to_string(), |s| format!("{s:?}").to_lowercase()),
            self.has_violations()
        )
    }
}

fn namespaces_toml(ttl: Duration) -> String {
    format!(
        "[[namespace]]\nname = \"{NAMESPACE}\"\nprefix = \"{PREFIX}\"\nmin_ttl_ms = 1000\n\
         max_ttl_ms = 60000\ndefault_ttl_ms = {}\n",
        ttl.as_millis()
    )
}

/// A paused or isolated target to undo, with when.
enum Undo {
    Cont(u32),
    Heal(u64),
    Restart(u64),
    Clock(u64),
    /// Not an undo: the node marked draining must lead no group by now.
    DrainCheck(u64),
    Nothing,
}

/// How long after a drain call answered the nemesis looks whether the node still leads a group
/// (the call itself waits up to 20 s for that on the server). No other scheduled fault runs
/// meanwhile, but one just undone may have left a voter catching up, which a hand-over waits
/// for: a node found still leading is logged and counted, not failed.
pub const DRAIN_CHECK_AFTER_MS: std::ops::RangeInclusive<u64> = 3000..=5000;

/// A draining node leading one group in one term this long (while every other node runs) is
/// logged as stuck: leader balancing hands a group over 2 s after a node wins it, and retries
/// a hand-off that did not take after 10 s, then 20 s.
pub const DRAIN_STUCK: Duration = Duration::from_secs(30);

/// The node the [`FaultKind::Drain`] toggle marked draining, as far as the nemesis knows.
struct Drained {
    node: u64,
    /// Replaced since: its id is retired, which ends the mark (`retire_node` in lockd-core's
    /// cluster.rs); the clear that follows must still be accepted (a no-op).
    retired: bool,
}

/// Marks node `id` draining (or clears the mark) through the admin API at `endpoints` (the
/// first preferred); the answer is every group's membership. A mark waits on the server (up to
/// 20 s) until the node leads no group another voter could take.
async fn set_draining(
    endpoints: Vec<String>,
    id: u64,
    draining: bool,
) -> Result<lockd_client::admin::Members, String> {
    let c = Client::lazy(
        endpoints,
        ClientOptions {
            auth_token: Some(cluster::ADMIN_TOKEN.to_string()),
            request_timeout: Duration::from_secs(30),
            ..ClientOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    match tokio::time::timeout(Duration::from_secs(35), c.set_draining(id, draining)).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(_) => Err("no answer in 35 s".into()),
    }
}

/// Whether `m` shows node `id` draining; `None` when it is a member of no group.
fn shown_draining(m: &lockd_client::admin::Members, id: u64) -> Option<bool> {
    m.groups
        .iter()
        .flat_map(|g| &g.members)
        .find(|x| x.node_id == id)
        .map(|x| x.draining)
}

/// The groups of `m` node `id` leads although another voter could take them.
fn led_with_others(m: &lockd_client::admin::Members, id: u64) -> Vec<u32> {
    m.groups
        .iter()
        .filter(|g| {
            g.leader == id
                && g.members
                    .iter()
                    .any(|x| x.node_id != id && x.role == "voter")
        })
        .map(|g| g.group)
        .collect()
}

/// Clears the draining mark of `marked` (if any) and of every member shown draining, once
/// the faults are over; `Some(why)` if a mark is left.
async fn clear_drains(cluster: &Cluster, marked: Option<u64>) -> Option<String> {
    let c = match admin(cluster) {
        Ok(c) => c,
        Err(e) => return Some(format!("no admin client: {e}")),
    };
    if let Some(id) = marked {
        match again("undrain", || c.set_draining(id, false)).await {
            Ok(_) => eprintln!("nemesis: final undrain of node{id}: ok"),
            Err(e) => return Some(format!("undraining node{id}: {e}")),
        }
    }
    // The answer shows the serving node's view of the marks, read from the meta group at most
    // a second ago (or just now, by the undrain above): look twice before calling one left.
    let mut left = Vec::new();
    for round in 0..3 {
        let m = match again("list members", || c.list_members()).await {
            Ok(m) => m,
            Err(e) => return Some(e.to_string()),
        };
        left = m
            .groups
            .iter()
            .flat_map(|g| &g.members)
            .filter(|x| x.draining)
            .map(|x| x.node_id)
            .collect::<BTreeSet<u64>>()
            .into_iter()
            .collect();
        if left.is_empty() {
            return None;
        }
        eprintln!(
            "nemesis: after the faults, members still shown draining: {left:?} (round {round})"
        );
        for &id in &left {
            if let Err(e) = again("undrain", || c.set_draining(id, false)).await {
                return Some(format!("undraining node{id}: {e}"));
            }
        }
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    Some(format!(
        "members still shown draining after clearing: {left:?}"
    ))
}

/// The names the workers lock: a move fault moves one of their buckets.
fn worker_names() -> Vec<String> {
    let mut v: Vec<String> = MUTEX_NAMES.iter().map(|n| n.to_string()).collect();
    v.push(worker::set_lock(SET_FENCED));
    v.push(worker::set_lock(SET_UNFENCED));
    v
}

/// Moves the bucket of `name` to the next lock group (of `groups`) through the admin API at
/// `endpoint`; `Ok(summary)` or why not. A move that fails half-way is finished by the next
/// one (every move call first resumes interrupted moves).
async fn move_bucket(endpoint: String, name: String, groups: u32) -> Result<String, String> {
    use lockd_client::proto::admin_client::AdminClient;
    use lockd_client::proto::{MoveBucketsRequest, ShardMapRequest};
    let call = async {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{endpoint}"))
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_secs(2))
            .connect()
            .await
            .map_err(|e| e.to_string())?;
        let token: tonic::metadata::MetadataValue<_> = format!("Bearer {}", cluster::ADMIN_TOKEN)
            .parse()
            .map_err(|_| "bad token".to_string())?;
        let mut admin = AdminClient::with_interceptor(channel, move |mut r: tonic::Request<()>| {
            r.metadata_mut().insert("authorization", token.clone());
            Ok(r)
        });
        let map = admin
            .shard_map(ShardMapRequest {})
            .await
            .map_err(|s| s.message().to_string())?
            .into_inner();
        let bucket = lockd_core::bucket_of(&name);
        let from = lockd_core::ShardMap::initial(groups).group_of(&name);
        let from = map
            .groups
            .iter()
            .find(|g| {
                g.buckets
                    .parse::<lockd_core::BucketSet>()
                    .is_ok_and(|b| b.contains(bucket))
            })
            .map_or(from, |g| g.group);
        let to = from % groups + 1;
        let r = admin
            .move_buckets(MoveBucketsRequest {
                buckets: bucket.to_string(),
                to_group: to,
            })
            .await
            .map_err(|s| format!("{name} {from}->{to}: {}", s.message()))?
            .into_inner();
        Ok::<_, String>(format!(
            "{name} {from}->{to}: {} bucket(s), {} holder(s), {} resumed",
            r.buckets_moved, r.holders, r.resumed
        ))
    };
    match tokio::time::timeout(Duration::from_secs(30), call).await {
        Ok(r) => r,
        Err(_) => Err(format!("{name}: no answer in 30 s")),
    }
}

/// Runs the whole thing.
pub async fn run(cfg: &NemesisConfig) -> anyhow::Result<Outcome> {
    std::fs::create_dir_all(&cfg.dir)?;
    let clock = MonotonicClock::start();
    let history_file = cfg.dir.join("nemesis.jsonl");
    let _ = std::fs::remove_file(&history_file);
    let rec = Recorder::with_file(clock, &history_file)?;
    rec.push(Record::Meta {
        version: crate::history::FORMAT_VERSION,
        workload: "nemesis".into(),
        notes: format!(
            "seed {} duration {:?} ttl {:?} faults {:?} sabotage {:?}",
            cfg.seed, cfg.duration, cfg.ttl, cfg.faults, cfg.sabotage
        ),
    });

    // The store.
    let store_ns = format!(
        "nemesis_{}_{}",
        std::process::id(),
        MonotonicClock::raw_ns() % 1_000_000_000
    );
    let admin = Store::connect(&cfg.pg, &store_ns).await?;
    admin.setup().await?;
    for name in MUTEX_NAMES {
        let key = mutex_key(name);
        admin.init_key(&key, "").await?;
        rec.push(Record::StoreInit {
            key,
            value: String::new(),
        });
    }
    for key in [SET_FENCED, SET_UNFENCED] {
        admin.init_key(key, "[]").await?;
        rec.push(Record::StoreInit {
            key: key.into(),
            value: "[]".into(),
        });
    }

    // The cluster.
    let negative_control = (cfg.sabotage == Some(Sabotage::LeaderLease))
        .then(|| "skip-leader-lease-check".to_string());
    let zoned = cfg.scenario == Some(Scenario::Zones);
    anyhow::ensure!(
        !zoned || (cfg.lock_groups >= 2 && cfg.external.is_none()),
        "--scenario zones needs --groups 2 or more, and a cluster of its own (no --endpoints)"
    );
    let mut cluster = match &cfg.external {
        Some((endpoints, audit_logs)) => Cluster::external(endpoints.clone(), audit_logs.clone()),
        None => {
            Cluster::start(ClusterConfig {
                lockd_bin: cfg.lockd_bin.clone(),
                dir: cfg.dir.join("cluster"),
                nodes: if zoned { zones::NODES } else { 3 },
                lock_groups: cfg.lock_groups,
                config_toml: namespaces_toml(cfg.ttl),
                snapshot_every: cfg.snapshot_every,
                negative_control,
                faketime: cfg.faketime,
                zones: if zoned {
                    zones::ZONES.iter().map(|z| z.to_string()).collect()
                } else {
                    Vec::new()
                },
                replicas: if zoned { zones::REPLICAS } else { 0 },
                zone_delay: Duration::ZERO,
                audit: true,
            })
            .await?
        }
    };
    wait_for_namespace(&cluster.endpoints_from(0), cfg.ttl).await?;
    eprintln!(
        "nemesis: cluster up (pids {:?}), store schema {store_ns}, history {}",
        cluster
            .ids()
            .iter()
            .map(|&i| cluster.pid(i))
            .collect::<Vec<_>>(),
        history_file.display()
    );

    // The workers.
    let mut workers = Vec::new();
    let total = cfg.mutex_workers + cfg.lockset_workers;
    for id in 1..=total {
        let lockset = id > cfg.mutex_workers;
        let file = cfg.dir.join(format!("worker-{id}.jsonl"));
        let _ = std::fs::remove_file(&file);
        let log = std::fs::File::create(cfg.dir.join(format!("worker-{id}.log")))?;
        let mut cmd = tokio::process::Command::new(&cfg.self_exe);
        cmd.arg("nemesis-worker")
            .args(["--id", &id.to_string()])
            .args([
                "--endpoints",
                &cluster.endpoints_from(id as usize - 1).join(","),
            ])
            .args(["--ttl-ms", &cfg.ttl.as_millis().to_string()])
            .args(["--pg", &cfg.pg])
            .args(["--store-ns", &store_ns])
            .args(["--history", &file.display().to_string()])
            .args(["--origin-ns", &clock.origin_ns().to_string()])
            .args(["--run-for-s", &cfg.duration.as_secs().to_string()])
            .args(["--seed", &cfg.seed.to_string()])
            .args(["--self-pause", &cfg.self_pause.to_string()])
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true);
        if lockset {
            cmd.arg("--lockset");
        }
        match cfg.sabotage {
            Some(Sabotage::ClientDeadline) => {
                cmd.arg("--sabotage-client-deadline");
            }
            Some(Sabotage::StoreFence) => {
                cmd.arg("--sabotage-store-fence");
            }
            _ => {}
        }
        let child = cmd.spawn().context("starting a nemesis worker")?;
        let pid = child.id().context("worker has no pid")?;
        workers.push((id, pid, child, file));
    }

    // Workers that stopped themselves in their write window: count the pause once /proc shows
    // it, resume them 2-5 TTLs later. Pids the schedule paused are left to the schedule.
    let paused_by_us: Arc<Mutex<HashSet<u32>>> = Arc::default();
    let watcher = tokio::spawn(watch_self_pauses(
        workers.iter().map(|(id, pid, _, _)| (*id, *pid)).collect(),
        paused_by_us.clone(),
        rec.clone(),
        cfg.ttl,
        cfg.seed,
    ));

    // The fault schedule.
    let mut rng = fastrand::Rng::with_seed(cfg.seed);
    let end = Instant::now() + cfg.duration;
    let ttl_ms = cfg.ttl.as_millis() as u64;
    let mut probes = tokio::task::JoinSet::new();
    let mut faults_done = 0u64;
    let groups = cfg.lock_groups;
    let mut moves = tokio::task::JoinSet::new();
    let moves_log: Arc<Mutex<Vec<Result<String, String>>>> = Arc::default();
    let faults: Vec<FaultKind> = if cluster.is_external() {
        let only = [FaultKind::PauseClient];
        cfg.faults
            .iter()
            .copied()
            .filter(|f| only.contains(f))
            .collect()
    } else {
        cfg.faults.clone()
    };
    if cfg.scenario == Some(Scenario::Grow) {
        faults_done += grow(&mut cluster, &rec, cfg.ttl).await?;
        while Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let zone_counts = if zoned {
        let z = zones::run(&mut cluster, &rec, cfg.ttl, cfg.seed, end).await?;
        faults_done += z.losses + z.partitions;
        Some(z)
    } else {
        None
    };
    let faults = if cfg.scenario.is_some() {
        Vec::new()
    } else {
        faults
    };
    let mut bag: Vec<FaultKind> = Vec::new();
    let mut injected: BTreeSet<FaultKind> = BTreeSet::new();
    let mut first_round = true;
    // The drain toggle, its checks, and when each (node, group, term) was first seen led by the
    // draining node (reported once as stuck after DRAIN_STUCK).
    let mut drained: Option<Drained> = None;
    let (mut drain_checks, mut drain_still_leading, mut drain_stuck) = (0u64, 0u64, 0u64);
    let mut drain_led_since: BTreeMap<(u64, u32, u64), (Instant, bool)> = BTreeMap::new();
    while Instant::now() < end && !faults.is_empty() {
        tokio::time::sleep(Duration::from_millis(rng.u64(1000..=3000))).await;
        if Instant::now() >= end {
            break;
        }
        // Every kind once per round of draws, in a seeded order: a run of a minute still
        // injects each kind (a run where one never came up would prove nothing about it).
        if bag.is_empty() {
            bag = faults.clone();
            rng.shuffle(&mut bag);
            if first_round {
                // A move first: a short run may end before the round's last draw, and a run
                // that never moved a bucket checked no name across groups (a progress
                // failure). Later rounds keep the seeded order, so moves meet other faults.
                if let Some(i) = bag.iter().position(|k| *k == FaultKind::Move) {
                    let m = bag.remove(i);
                    bag.push(m);
                }
                first_round = false;
            }
        }
        let kind = bag.pop().expect("refilled");
        let terms = if cluster.is_external() {
            BTreeMap::new()
        } else {
            cluster.leader_terms().await
        };
        let leaders: BTreeMap<u32, u64> = terms.iter().map(|(g, (l, _))| (*g, *l)).collect();
        // A draining node that leads a group, here after the last fault was undone: the
        // balancer hands the group over within seconds, unless no other voter can take it.
        match &drained {
            Some(d) if !d.retired => {
                let others_up = cluster
                    .ids()
                    .iter()
                    .all(|&i| i == d.node || cluster.is_running(i));
                for (&g, &(l, term)) in &terms {
                    if l != d.node || !others_up {
                        continue;
                    }
                    let (since, told) = drain_led_since
                        .entry((l, g, term))
                        .or_insert((Instant::now(), false));
                    if !*told && since.elapsed() >= DRAIN_STUCK {
                        *told = true;
                        drain_stuck += 1;
                        eprintln!(
                            "nemesis: draining node{l} has led group {g} in term {term} for {:.0} \
                             s with every other node up (logged, not failed)",
                            since.elapsed().as_secs_f64()
                        );
                    }
                }
            }
            _ => drain_led_since.clear(),
        }
        let lock_leaders: Vec<u64> = leaders
            .iter()
            .filter(|(g, _)| **g != 0)
            .map(|(_, n)| *n)
            .collect();
        // Leaders more often than not: that is where the interesting failures are. While a
        // node is marked draining, it is the target a quarter of the time (it leads nothing).
        let draining_target = drained
            .as_ref()
            .filter(|d| !d.retired && cluster.ids().contains(&d.node))
            .map(|d| d.node);
        let node = if let Some(d) = draining_target.filter(|_| rng.f64() < 0.25) {
            d
        } else if !lock_leaders.is_empty() && rng.f64() < 0.7 {
            lock_leaders[rng.usize(..lock_leaders.len())]
        } else if cluster.is_external() {
            0
        } else {
            cluster.ids()[rng.usize(..cluster.ids().len())]
        };
        let at_ns = rec.now_ns();
        let (target, verified, undo, hold) = match kind {
            FaultKind::Kill => {
                cluster.kill(node).await?;
                let led: Vec<u32> = leaders
                    .iter()
                    .filter(|(g, n)| **g != 0 && **n == node)
                    .map(|(g, _)| *g)
                    .collect();
                if !led.is_empty() {
                    let endpoints = cluster.endpoints_except(node);
                    probes.spawn(probe_failover(
                        endpoints,
                        led,
                        cfg.lock_groups,
                        cfg.ttl,
                        Instant::now(),
                        at_ns,
                    ));
                }
                (
                    format!("node{node}"),
                    true,
                    Undo::Restart(node),
                    rng.u64(3000..=6000),
                )
            }
            FaultKind::PauseNode => {
                let ok = cluster::pause(cluster.pid(node)).await?;
                (
                    format!("node{node}"),
                    ok,
                    Undo::Cont(cluster.pid(node)),
                    rng.u64(2 * ttl_ms..=5 * ttl_ms),
                )
            }
            FaultKind::PauseClient => {
                // Half the time a lock-set worker: a pause between its read and its write is
                // what makes the unfenced key lose updates.
                let lockset: Vec<usize> = (cfg.mutex_workers as usize..workers.len()).collect();
                let w = if !lockset.is_empty() && rng.bool() {
                    lockset[rng.usize(..lockset.len())]
                } else {
                    rng.usize(..workers.len())
                };
                let (id, pid, _, _) = &workers[w];
                if !paused_by_us.lock().expect("pause set").insert(*pid) {
                    continue; // already stopped by itself
                }
                let ok = cluster::pause(*pid).await?;
                (
                    format!("worker{id}"),
                    ok,
                    Undo::Cont(*pid),
                    rng.u64(2 * ttl_ms..=5 * ttl_ms),
                )
            }
            FaultKind::Partition => {
                cluster.isolate(node, true);
                (
                    format!("node{node}"),
                    true,
                    Undo::Heal(node),
                    rng.u64(2 * ttl_ms..=5 * ttl_ms),
                )
            }
            FaultKind::Move => {
                if cfg.lock_groups < 2 {
                    continue;
                }
                let names = worker_names();
                let name = names[rng.usize(..names.len())].clone();
                let ids = cluster.ids();
                let endpoint = cluster.endpoints_from(rng.usize(..ids.len().max(1)))[0].clone();
                let log = moves_log.clone();
                moves.spawn(async move {
                    let r = move_bucket(endpoint, name, groups).await;
                    eprintln!("nemesis: move {r:?}");
                    log.lock().expect("moves log").push(r);
                });
                (
                    "bucket".to_string(),
                    true,
                    Undo::Nothing,
                    rng.u64(500..=2000),
                )
            }
            FaultKind::Restart => {
                cluster.terminate(node).await?;
                (
                    format!("node{node}"),
                    true,
                    Undo::Restart(node),
                    rng.u64(500..=2000),
                )
            }
            FaultKind::Replace | FaultKind::Wipe => {
                if kind == FaultKind::Wipe {
                    let refusal = cluster.wipe_and_restart(node).await?;
                    eprintln!("nemesis: node{node} on a wiped disk was refused: {refusal}");
                }
                let new = replace(&mut cluster, node).await?;
                if let Some(d) = drained.as_mut().filter(|d| d.node == node) {
                    // Its id is retired now, which ends the mark; the next drain draw clears
                    // it all the same (a no-op the server must accept).
                    d.retired = true;
                    eprintln!("nemesis: node{node} was draining; retiring its id ends the mark");
                }
                (
                    format!("node{node}->node{new}"),
                    true,
                    Undo::Nothing,
                    rng.u64(500..=2000),
                )
            }
            FaultKind::Drain => {
                let ids = cluster.ids();
                let via = cluster.endpoints_from(rng.usize(..ids.len().max(1)));
                match drained.take() {
                    None => {
                        let live: Vec<u64> =
                            ids.into_iter().filter(|&i| cluster.is_running(i)).collect();
                        if live.is_empty() {
                            continue;
                        }
                        let id = live[rng.usize(..live.len())];
                        let r = set_draining(via, id, true).await;
                        // A call that failed may have set the mark all the same: it is
                        // remembered either way, so the next draw (or the end) clears it.
                        drained = Some(Drained {
                            node: id,
                            retired: false,
                        });
                        let verified = match &r {
                            Ok(m) => {
                                let led = led_with_others(m, id);
                                if !led.is_empty() {
                                    eprintln!(
                                        "nemesis: drain node{id}: the call answered with the \
                                         node still leading groups {led:?} (the server's wait \
                                         ran out)"
                                    );
                                }
                                shown_draining(m, id) == Some(true)
                            }
                            Err(e) => {
                                eprintln!("nemesis: drain node{id}: {e}");
                                false
                            }
                        };
                        (
                            format!("node{id} marked"),
                            verified,
                            Undo::DrainCheck(id),
                            rng.u64(DRAIN_CHECK_AFTER_MS),
                        )
                    }
                    Some(d) => {
                        let r = set_draining(via, d.node, false).await;
                        // A retired id is a member of nothing: not shown at all.
                        let verified = match &r {
                            Ok(m) => shown_draining(m, d.node) != Some(true),
                            Err(e) => {
                                eprintln!("nemesis: undrain node{}: {e}", d.node);
                                false
                            }
                        };
                        let target = format!(
                            "node{} cleared{}",
                            d.node,
                            if d.retired { " (retired)" } else { "" }
                        );
                        if !verified {
                            drained = Some(d);
                        }
                        (target, verified, Undo::Nothing, rng.u64(500..=2000))
                    }
                }
            }
            FaultKind::Clock => {
                let offset = rng.i64(3600..=30 * 86_400);
                cluster.set_clock_offset(node, offset)?;
                let mut seen = false;
                if cfg.faketime {
                    for _ in 0..10 {
                        tokio::time::sleep(Duration::from_millis(300)).await;
                        if cluster
                            .observed_clock_offset(node)
                            .await
                            .is_some_and(|o| (o - offset).abs() <= 5)
                        {
                            seen = true;
                            break;
                        }
                    }
                }
                (
                    format!("node{node}+{offset}s"),
                    seen,
                    Undo::Clock(node),
                    rng.u64(2 * ttl_ms..=4 * ttl_ms),
                )
            }
        };
        rec.push(Record::Fault {
            kind: kind.label().into(),
            at_ns,
            target: target.clone(),
            verified,
            // From the draw (injecting may take long: a replace) to the undo.
            hold_ms: rec.now_ns().saturating_sub(at_ns) / 1_000_000 + hold,
        });
        faults_done += u64::from(verified);
        if verified {
            injected.insert(kind);
        }
        eprintln!(
            "nemesis: t={:>5.1}s {} {target} verified={verified} for {hold} ms",
            at_ns as f64 / 1e9,
            kind.label()
        );
        tokio::time::sleep(Duration::from_millis(hold)).await;
        match undo {
            Undo::Cont(pid) => {
                cluster::resume(pid)?;
                paused_by_us.lock().expect("pause set").remove(&pid);
            }
            Undo::Heal(id) => cluster.isolate(id, false),
            Undo::Restart(id) => cluster.restart(id)?,
            Undo::Clock(id) => cluster.set_clock_offset(id, 0)?,
            Undo::DrainCheck(id) => {
                let others_up = cluster
                    .ids()
                    .iter()
                    .any(|&i| i != id && cluster.is_running(i));
                let terms = cluster.leader_terms().await;
                if others_up && !terms.is_empty() {
                    drain_checks += 1;
                    let led: Vec<u32> = terms
                        .iter()
                        .filter(|(_, (l, _))| *l == id)
                        .map(|(g, _)| *g)
                        .collect();
                    if !led.is_empty() {
                        drain_still_leading += 1;
                        eprintln!(
                            "nemesis: draining node{id} still leads groups {led:?} {hold} ms \
                             after its drain call answered (logged, not failed)"
                        );
                    }
                }
            }
            Undo::Nothing => {}
        }
    }
    cluster.restore()?;
    for (_, pid, _, _) in &workers {
        let _ = cluster::resume(*pid);
    }
    while moves.join_next().await.is_some() {}
    if faults.contains(&FaultKind::Move) && groups >= 2 {
        // A move cut short by a fault leaves frozen buckets: the next move call finishes it,
        // so make one more on the healed cluster (not counted: it runs after the faults).
        let endpoint = cluster.endpoints_from(0)[0].clone();
        let done = move_bucket(endpoint, MUTEX_NAMES[0].to_string(), groups).await;
        eprintln!("nemesis: final move (finishes interrupted ones) {done:?}");
    }
    // Whatever is marked draining is cleared before the checks.
    let drain_left = if faults.contains(&FaultKind::Drain) {
        clear_drains(&cluster, drained.map(|d| d.node)).await
    } else {
        None
    };
    let (moves_ok, moves_failed) = {
        let l = moves_log.lock().expect("moves log");
        let ok = l.iter().filter(|r| r.is_ok()).count() as u64;
        (ok, l.len() as u64 - ok)
    };
    eprintln!("nemesis: {faults_done} faults injected; healing, waiting for workers");

    // Workers stop on their own after `duration`, finishing their round (bounded by the TTL).
    let grace = Duration::from_secs(30) + 6 * cfg.ttl;
    let mut worker_files = Vec::new();
    let mut progress = Progress {
        faults_injected: faults_done,
        moves_ok,
        moves_failed,
        kinds_never_injected: never_injected(&faults, &injected, groups),
        drain_checks,
        drain_still_leading,
        drain_stuck,
        drain_left,
        zones: zone_counts,
        ..Progress::default()
    };
    for (id, pid, mut child, file) in workers {
        match tokio::time::timeout(grace, child.wait()).await {
            Ok(Ok(st)) if st.success() => {}
            Ok(Ok(st)) => {
                eprintln!("nemesis: worker {id} exited with {st}");
                progress.workers_failed += 1;
            }
            Ok(Err(e)) => {
                eprintln!("nemesis: worker {id}: {e}");
                progress.workers_failed += 1;
            }
            Err(_) => {
                eprintln!("nemesis: worker {id} (pid {pid}) did not stop; killing it");
                let _ = child.kill().await;
                progress.workers_failed += 1;
            }
        }
        worker_files.push(file);
    }
    // Only now: a worker finishing its last round may still stop itself in its write window,
    // and only the watcher resumes it (it used to stay stopped until killed).
    watcher.abort();
    while let Some(r) = probes.join_next().await {
        match r {
            Ok(Some((at_ns, ms))) => rec.push(Record::Failover { at_ns, ms }),
            Ok(None) => eprintln!("nemesis: a failover probe gave up"),
            Err(e) => eprintln!("nemesis: a failover probe panicked: {e}"),
        }
    }

    // The store's view, then the service's.
    for (key, fenced) in [(SET_FENCED, true), (SET_UNFENCED, false)] {
        let v = admin.read(key).await?;
        let set: Vec<u64> = serde_json::from_str(&v).context("final set")?;
        rec.push(Record::LocksetFinal {
            key: key.into(),
            fenced,
            elements: set,
        });
    }
    for r in admin.log_records().await? {
        rec.push(r);
    }
    // Let the restarted nodes catch up so their audit logs are complete, then stop them.
    let _ = cluster.wait_ready(Duration::from_secs(20)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    if !cluster.is_external() {
        progress.max_apply_lag = settled_apply_lag(&cluster).await;
        progress.nodes = Some((cluster.dead_nodes().len(), cluster.panics()));
    }
    let audit_files = cluster.audit_logs();
    let snapshots = cluster.snapshot_counts();
    let cluster_external = cluster.is_external();
    cluster.shutdown().await;
    let merged = audit::merge(&audit_files)?;
    for d in &merged.divergent {
        eprintln!("nemesis: REPLICA DIVERGENCE {d}");
    }
    for r in merged.records {
        rec.push(r);
    }
    let _ = admin.drop_namespace().await;

    let mut history = rec.history();
    history
        .records
        .extend(History::load(&worker_files)?.records);
    let report = checker::check(&history, cfg.budget)?;
    let availability = avail::Availability::of(&history, cfg.ttl);
    let audited: HashSet<(&str, u64)> = history
        .records
        .iter()
        .filter_map(|r| match r {
            Record::SvcGrant { name, token, .. } => Some((name.as_str(), *token)),
            _ => None,
        })
        .collect();
    let has_audit = !cluster_external || !audit_files.is_empty();
    if has_audit {
        progress.missing_in_audit = report
            .direct
            .acked_grants
            .iter()
            .filter(|(n, t)| !audited.contains(&(n.as_str(), *t)))
            .count() as u64;
    }
    let mut out = Outcome {
        report,
        replica_divergence: merged.divergent.len(),
        audit_entries: merged.entries,
        snapshots,
        history_file,
        progress,
        progress_failures: Vec::new(),
        availability,
    };
    out.progress_failures = progress_failures(cfg, &out, has_audit);
    Ok(out)
}

/// An admin client over every node of `cluster` (membership calls wait for catch-up).
fn admin(cluster: &Cluster) -> Result<Client, lockd_client::Error> {
    admin_via(cluster.endpoints_from(0))
}

/// [`admin`] through `endpoints` only.
fn admin_via(endpoints: Vec<String>) -> Result<Client, lockd_client::Error> {
    Client::lazy(
        endpoints,
        ClientOptions {
            auth_token: Some(cluster::ADMIN_TOKEN.to_string()),
            request_timeout: Duration::from_secs(120),
            ..ClientOptions::default()
        },
    )
}

/// Repeats an admin call (every one is idempotent) for up to a minute: calls that wait for a
/// leader can meet an election a fault caused.
async fn again<T, F, Fut>(what: &str, mut call: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, lockd_client::Error>>,
{
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        match call().await {
            Ok(v) => return Ok(v),
            Err(e) if Instant::now() < until => {
                eprintln!("nemesis: {what}: {e}; repeating");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(anyhow::anyhow!("{what}: {e}")),
        }
    }
}

/// The [`FaultKind::Replace`] fault: SIGKILL `dead`, start the next node id on its client
/// ports, add it to every group `dead` was a member of, remove `dead` from all of them and
/// retire it. Returns the new id.
async fn replace(cluster: &mut Cluster, dead: u64) -> anyhow::Result<u64> {
    let c = admin(cluster)?;
    let st = again("status", || c.status()).await?;
    let groups: Vec<u32> = st
        .groups
        .iter()
        .filter(|g| g.members.contains(&dead))
        .map(|g| g.id)
        .collect();
    cluster.kill(dead).await?;
    let id = cluster.next_id();
    let dial = cluster.add_joiner(id, Some(dead)).await?.to_string();
    // Through the members, as an operator does: the new node answers on the dead one's client
    // ports, and until it is added the peer port of every member refuses its forwarded calls.
    let members: Vec<String> = cluster
        .endpoints_except(id)
        .into_iter()
        .filter(|e| *e != cluster.grpc_addr(dead).to_string())
        .collect();
    let c = admin_via(members)?;
    again("add the replacement", || {
        c.add_member(id, &dial, &groups, false)
    })
    .await?;
    again("remove the dead node", || c.remove_member(dead, &[], false)).await?;
    cluster.retire(dead);
    Ok(id)
}

/// The [`Scenario::Grow`] script; returns the number of steps done. Each step is recorded as a
/// fault (`join`, `create-group`, `move`, `replace`, `restart`, `remove-group`), so the RESULT
/// line counts them.
async fn grow(cluster: &mut Cluster, rec: &Recorder, ttl: Duration) -> anyhow::Result<u64> {
    let mut steps = 0u64;
    let mut step = |kind: &str, target: String| {
        rec.push(Record::Fault {
            kind: kind.into(),
            at_ns: rec.now_ns(),
            target: target.clone(),
            verified: true,
            hold_ms: 0,
        });
        eprintln!(
            "nemesis: t={:>5.1}s {kind} {target}",
            rec.now_ns() as f64 / 1e9
        );
        steps += 1;
    };
    let settle = || tokio::time::sleep(3 * ttl);
    settle().await;

    // Three nodes join the meta group.
    for id in 4..=6u64 {
        let peer = cluster.add_joiner(id, None).await?.to_string();
        let c = admin(cluster)?;
        again("add member", || c.add_member(id, &peer, &[0], false)).await?;
        step("join", format!("node{id}"));
    }
    // A second lock group on them, and half the buckets.
    let c = admin(cluster)?;
    again("create group", || c.create_group(2, &[4, 5, 6], false)).await?;
    step("create-group", "group2 on nodes 4,5,6".into());
    settle().await;
    let m = again("move buckets", || c.move_buckets("0-2047", 2)).await?;
    step(
        "move",
        format!(
            "buckets 0-2047 to group2 ({} holders kept their tokens)",
            m.holders
        ),
    );
    settle().await;

    // Node 5 dies with its disk: a new node 7 takes its place in every group it was in.
    cluster.kill(5).await?;
    let peer = cluster.add_joiner(7, None).await?.to_string();
    let c = admin(cluster)?;
    again("add node 7", || c.add_member(7, &peer, &[0, 2], false)).await?;
    again("remove node 5", || c.remove_member(5, &[], false)).await?;
    cluster.retire(5);
    step("replace", "node5 by node7 (SIGKILL, new id)".into());
    settle().await;

    // A rolling restart: each node in turn stops gracefully, starts again, and catches up.
    for id in cluster.ids() {
        cluster.terminate(id).await?;
        cluster.restart(id)?;
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if cluster
                .max_apply_lag()
                .await
                .is_some_and(|l| l <= MAX_APPLY_LAG)
            {
                break;
            }
            anyhow::ensure!(
                Instant::now() < until,
                "node {id} did not catch up within 60 s"
            );
        }
        step("restart", format!("node{id} (SIGTERM, start, caught up)"));
    }

    // And back: group 2 gives its buckets to group 1 under load and is removed; its nodes
    // stop hosting it and its id is never used again.
    let c = admin(cluster)?;
    let m = again("move buckets back", || c.move_buckets("0-2047", 1)).await?;
    step(
        "move",
        format!(
            "buckets 0-2047 back to group1 ({} holders kept their tokens)",
            m.holders
        ),
    );
    again("remove group", || c.remove_group(2)).await?;
    let groups = again("list groups", || c.list_groups()).await?;
    anyhow::ensure!(
        groups.iter().all(|g| g.group != 2),
        "group 2 is still recorded after its removal: {groups:?}"
    );
    step(
        "remove-group",
        "group2 (closed, removed, no longer hosted)".into(),
    );
    settle().await;
    Ok(steps)
}

/// The requested kinds of which none was injected and verified (a move needs two groups; a
/// drain whose admin call failed, or whose answer did not show the mark, does not count).
fn never_injected(
    faults: &[FaultKind],
    injected: &BTreeSet<FaultKind>,
    groups: u32,
) -> Vec<String> {
    faults
        .iter()
        .filter(|k| !injected.contains(k) && (**k != FaultKind::Move || groups >= 2))
        .map(|k| k.name())
        .collect()
}

/// Waits a few seconds for the healed nodes to catch up, then measures their apply lag.
async fn settled_apply_lag(cluster: &Cluster) -> Option<u64> {
    let mut lag = None;
    for _ in 0..10 {
        lag = cluster.max_apply_lag().await;
        if lag.is_some_and(|l| l <= MAX_APPLY_LAG) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    lag
}

/// The progress checks: a run that passes must have worked, faulted and lost where it must.
fn progress_failures(cfg: &NemesisConfig, out: &Outcome, has_audit: bool) -> Vec<String> {
    let p = &out.progress;
    let d = &out.report.direct;
    let mut f = Vec::new();
    if p.workers_failed > 0 {
        f.push(format!(
            "workers_failed={} (see {}/worker-*.log)",
            p.workers_failed,
            cfg.dir.display()
        ));
    }
    if let Some((dead, panics)) = p.nodes {
        if dead > 0 {
            f.push(format!("nodes_dead={dead}: a node is not alive at the end"));
        }
        if panics > 0 {
            f.push(format!("node_panics={panics}: 'panicked at' in a node log"));
        }
        match p.max_apply_lag {
            Some(l) if l <= MAX_APPLY_LAG => {}
            Some(l) => f.push(format!("max_apply_lag={l} > {MAX_APPLY_LAG} after healing")),
            None => f.push("max_apply_lag=na: a node did not answer its status call".into()),
        }
    }
    // The service's own record is what the double-grant and missing-grant checks read: a run
    // that read none checked them on nothing, which is not a pass.
    if out.audit_entries == 0 {
        f.push(if cfg.external.is_some() {
            "audit_entries=0: no audit entry was read, so the service-side checks ran on \
             nothing; start your nodes with --audit-log FILE and pass the files with --audit-logs"
                .into()
        } else {
            "audit_entries=0: the nodes wrote no audit log".into()
        });
    }
    if has_audit && p.missing_in_audit > 0 {
        f.push(format!(
            "missing_in_audit={}: acknowledged grants absent from the audit logs",
            p.missing_in_audit
        ));
    }
    if d.acked_grants.is_empty() {
        f.push("acked_grants=0: no worker was ever granted a lock".into());
    }
    if cfg.lockset_workers > 0 && d.acked_adds_fenced == 0 {
        f.push("fenced_adds=0: no fenced lock-set addition was acknowledged".into());
    }
    if (!cfg.faults.is_empty() || cfg.scenario.is_some()) && p.faults_injected == 0 {
        f.push("faults=0: no fault was injected".into());
    }
    if !p.kinds_never_injected.is_empty() {
        f.push(format!(
            "never_injected={}: requested fault kinds that never ran (a longer --duration \
             gives every kind a turn)",
            p.kinds_never_injected.join(",")
        ));
    }
    if let Some(z) = p.zones {
        if z.losses == 0 || z.partitions == 0 {
            f.push(format!(
                "zone_losses={} zone_partitions={}: the zones scenario needs a zone lost and a \
                 zone cut off (a longer --duration)",
                z.losses, z.partitions
            ));
        }
        if z.slow_recoveries > 0 {
            f.push(format!(
                "zone_slow_recoveries={}: nodes not caught up within {} s of a zone's return",
                z.slow_recoveries,
                zones::CATCH_UP_WITHIN.as_secs()
            ));
        }
    }
    if let Some(why) = &p.drain_left {
        f.push(format!(
            "drain_left: a draining mark was not cleared after the faults: {why}"
        ));
    }
    // A scripted scenario draws no faults, whatever `--faults` says: no move to expect.
    // Your own cluster (`--endpoints`) is not moved: only worker pauses are injected there.
    if cfg.scenario.is_none()
        && cfg.external.is_none()
        && cfg.faults.contains(&FaultKind::Move)
        && cfg.lock_groups >= 2
        && p.moves_ok == 0
    {
        f.push(format!(
            "moves_ok=0 (of {}): no bucket move completed, so no name was checked across groups",
            p.moves_failed
        ));
    }
    if cfg.lockset_workers > 0 && d.lost_updates_unfenced.unwrap_or(0) == 0 {
        f.push(format!(
            "unfenced_lost=0 (of {} acknowledged): the unfenced control lost nothing, so the run \
             proved nothing",
            d.acked_adds_unfenced
        ));
    }
    f
}

/// Polls the workers' `/proc` state; a worker stopped without the schedule's doing stopped
/// itself: record the pause and resume it 2-5 TTLs later.
async fn watch_self_pauses(
    workers: Vec<(u64, u32)>,
    scheduled: Arc<Mutex<HashSet<u32>>>,
    rec: Recorder,
    ttl: Duration,
    seed: u64,
) {
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x5e1f);
    let ttl_ms = ttl.as_millis() as u64;
    let mut ours: HashSet<u32> = HashSet::new();
    let mut resumes = tokio::task::JoinSet::new();
    loop {
        while let Some(Ok(pid)) = resumes.try_join_next() {
            ours.remove(&pid);
        }
        for (id, pid) in &workers {
            if ours.contains(pid) || scheduled.lock().expect("pause set").contains(pid) {
                continue;
            }
            if cluster::proc_state(*pid) == Some('T') {
                ours.insert(*pid);
                let hold = rng.u64(2 * ttl_ms..=5 * ttl_ms);
                rec.push(Record::Fault {
                    kind: "pause".into(),
                    at_ns: rec.now_ns(),
                    target: format!("worker{id} (self, in its write window)"),
                    verified: true,
                    hold_ms: hold,
                });
                eprintln!(
                    "nemesis: t={:>5.1}s pause worker{id} (self) verified=true for {hold} ms",
                    rec.now_ns() as f64 / 1e9
                );
                let pid = *pid;
                resumes.spawn(async move {
                    tokio::time::sleep(Duration::from_millis(hold)).await;
                    let _ = cluster::resume(pid);
                    pid
                });
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The namespace config is proposed by the nodes after they start: wait until a lock in it can
/// be taken, so workers do not begin with refusals.
async fn wait_for_namespace(endpoints: &[String], ttl: Duration) -> anyhow::Result<()> {
    let client = Client::lazy(
        endpoints.to_vec(),
        ClientOptions {
            client_name: "nemesis-ready".into(),
            ttl,
            namespace: NAMESPACE.into(),
            ..ClientOptions::default()
        },
    )?;
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        match client.acquire(format!("{PREFIX}ready")).try_once().await {
            Ok(g) => {
                let _ = g.release().await;
                let _ = tokio::time::timeout(Duration::from_secs(2), client.close()).await;
                return Ok(());
            }
            Err(e) if Instant::now() >= until => anyhow::bail!("namespace never appeared: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// After a leader was killed: time until a fresh client, talking only to the survivors, is
/// granted a lock in every group that node led. `None` if that takes over 30 s.
async fn probe_failover(
    endpoints: Vec<String>,
    groups: Vec<u32>,
    lock_groups: u32,
    ttl: Duration,
    started: Instant,
    at_ns: u64,
) -> Option<(u64, f64)> {
    let map = ShardMap::initial(lock_groups);
    let names: Vec<String> = groups
        .iter()
        .map(|g| {
            (0..)
                .map(|i| format!("{PREFIX}probe-{i}"))
                .find(|n| map.group_of(n) == *g)
                .expect("some name lands in every group")
        })
        .collect();
    let client = Client::lazy(
        endpoints,
        ClientOptions {
            client_name: "nemesis-probe".into(),
            ttl,
            namespace: NAMESPACE.into(),
            request_timeout: Duration::from_millis(500),
            ..ClientOptions::default()
        },
    )
    .ok()?;
    let mut pending: Vec<&String> = names.iter().collect();
    while started.elapsed() < Duration::from_secs(30) {
        let mut left = Vec::new();
        for name in pending {
            match client.acquire(name.as_str()).try_once().await {
                Ok(g) => {
                    let _ = g.release().await;
                }
                Err(_) => left.push(name),
            }
        }
        pending = left;
        if pending.is_empty() {
            let ms = started.elapsed().as_secs_f64() * 1e3;
            let _ = tokio::time::timeout(Duration::from_secs(2), client.close()).await;
            return Some((at_ns, ms));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> NemesisConfig {
        NemesisConfig {
            lockd_bin: PathBuf::new(),
            self_exe: PathBuf::new(),
            dir: PathBuf::from("d"),
            duration: Duration::from_secs(1),
            seed: 1,
            pg: String::new(),
            ttl: Duration::from_secs(2),
            mutex_workers: 1,
            lockset_workers: 1,
            lock_groups: 1,
            snapshot_every: 50,
            faults: vec![FaultKind::Kill],
            scenario: None,
            sabotage: None,
            faketime: false,
            self_pause: 0.0,
            budget: Budget::default(),
            external: None,
        }
    }

    #[test]
    fn drain_is_spelled_and_counted_as_drain() {
        use clap::ValueEnum;
        assert_eq!(FaultKind::Drain.name(), "drain");
        assert_eq!(FaultKind::Drain.label(), "drain");
        assert_eq!(
            FaultKind::from_str("drain", false),
            Ok(FaultKind::Drain),
            "the --faults spelling"
        );
        // Only a verified drain counts as injected.
        let asked = [FaultKind::Kill, FaultKind::Move, FaultKind::Drain];
        let verified = BTreeSet::from([FaultKind::Kill]);
        assert_eq!(never_injected(&asked, &verified, 1), vec!["drain"]);
        assert_eq!(never_injected(&asked, &verified, 2), vec!["move", "drain"]);
        let verified = BTreeSet::from([FaultKind::Kill, FaultKind::Drain]);
        assert!(never_injected(&asked, &verified, 1).is_empty());
    }

    #[test]
    fn a_run_that_did_nothing_fails_every_progress_check() {
        let report = checker::check(&History::default(), Budget::default()).unwrap();
        let mut out = Outcome {
            report,
            replica_divergence: 0,
            audit_entries: 0,
            snapshots: None,
            history_file: PathBuf::new(),
            progress: Progress {
                workers_failed: 2,
                nodes: Some((1, 3)),
                max_apply_lag: Some(MAX_APPLY_LAG + 1),
                faults_injected: 0,
                moves_ok: 0,
                moves_failed: 3,
                missing_in_audit: 4,
                kinds_never_injected: vec!["restart".into()],
                drain_checks: 2,
                drain_still_leading: 1,
                drain_stuck: 0,
                drain_left: Some("node 3 still shown draining".into()),
                zones: None,
            },
            progress_failures: Vec::new(),
            availability: avail::Availability::default(),
        };
        let cfg = || NemesisConfig {
            lock_groups: 2,
            faults: vec![FaultKind::Kill, FaultKind::Move],
            ..cfg()
        };
        let f = progress_failures(&cfg(), &out, true);
        for key in [
            "workers_failed=2",
            "nodes_dead=1",
            "node_panics=3",
            "max_apply_lag=1001",
            "audit_entries=0",
            "missing_in_audit=4",
            "acked_grants=0",
            "fenced_adds=0",
            "faults=0",
            "never_injected=restart",
            "drain_left: a draining mark was not cleared",
            "moves_ok=0 (of 3)",
            "unfenced_lost=0",
        ] {
            assert!(f.iter().any(|l| l.starts_with(key)), "{key} not in {f:?}");
        }
        assert_eq!(f.len(), 13, "{f:?}");
        out.progress_failures = f;
        let line = out.result_line(&cfg());
        assert!(line.contains(" workers_failed=2 nodes_dead=1 node_panics=3 max_apply_lag=1001 "));
        assert!(line.contains(" drain_checks=2 drain_still_leading=1 drain_stuck=0 "));
        assert!(
            line.ends_with(
                " moves_ok=0 moves_failed=3 progress_failures=13 availability_acquire=na \
                 availability_renew=na duration_s=1 seed=1 sabotage=none violations=false"
            ),
            "{line}"
        );
        // The zones scenario: its counts beside the drain checks, a step short fails.
        out.progress.zones = Some(zones::ZoneCounts {
            losses: 2,
            partitions: 0,
            slow_recoveries: 1,
        });
        assert!(out.result_line(&cfg()).contains(
            " drain_stuck=0 zone_losses=2 zone_partitions=0 zone_slow_recoveries=1 moves_ok=0 "
        ));
        let f = progress_failures(&cfg(), &out, true);
        assert!(f
            .iter()
            .any(|l| l.starts_with("zone_losses=2 zone_partitions=0:")));
        assert!(f.iter().any(|l| l.starts_with("zone_slow_recoveries=1:")));
        // A scenario draws no faults: the default --faults' move is not expected of it.
        let zones_cfg = NemesisConfig {
            scenario: Some(Scenario::Zones),
            ..cfg()
        };
        let f = progress_failures(&zones_cfg, &out, true);
        assert!(!f.iter().any(|l| l.starts_with("moves_ok=")), "{f:?}");
        out.progress.zones = None;
        // An external cluster (`--endpoints`): no node checks, no bucket move expected (only
        // worker pauses are injected there), and a run without audit files fails naming the fix.
        out.progress.nodes = None;
        let ext = NemesisConfig {
            external: Some((vec!["127.0.0.1:7170".into()], Vec::new())),
            ..cfg()
        };
        assert!(out.result_line(&ext).contains(" nodes=external "));
        let f = progress_failures(&ext, &out, false);
        assert!(!f.iter().any(|l| l.starts_with("moves_ok=")), "{f:?}");
        assert!(
            f.iter().any(
                |l| l.starts_with("audit_entries=0: no audit entry was read")
                    && l.contains("--audit-logs")
            ),
            "{f:?}"
        );
        assert_eq!(f.len(), 8, "{f:?}");
    }
}
