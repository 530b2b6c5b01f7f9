//! `lockd-check latency`: the design's latency across zones, measured.
//!
//! Real `lockd serve` nodes over zones (round-robin: 5 nodes over 3 zones lay 2+2+1), every
//! peer link between two zones running through a proxy that delays each byte by `delay` each
//! way (`nemesis/proxy.rs`; this kernel has no `tc netem`). A client reaches a node of its own
//! zone directly, as a client in a zone would. Two clients are timed one after the other: one
//! on the group's leader (the leader's zone) and one on a node of another zone, whose calls the
//! node forwards to the leader across a zone. Each times `ops` uncontended acquires (try-lock of
//! a fresh name, then a release that is not timed) 10 ms after the last release, `ops` more
//! back to back, and `ops` unary keepalives, 10 ms apart
//! (a session sends one every TTL/3; back to back, each would wait out the peer layer's 5 ms
//! keepalive pace). Group 1 must keep one leader from 8 s before the first call to the last.
//!
//! Prints a table and a `RESULT` line with p50/p99 in milliseconds per client and call.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use lockd_client::proto as pb;
use lockd_client::{Client, ClientOptions};

use crate::nemesis::cluster::{Cluster, ClusterConfig};

/// The namespace the measurement's names and sessions are in.
const NAMESPACE: &str = "lat";

/// What `lockd-check latency` runs.
#[derive(Clone, Debug)]
pub struct LatencyConfig {
    pub lockd_bin: PathBuf,
    pub dir: PathBuf,
    pub nodes: u64,
    pub zones: u64,
    pub groups: u32,
    /// Each way on every link between zones.
    pub delay: Duration,
    /// Timed calls per client and kind (after `ops / 10` untimed warm-up calls).
    pub ops: usize,
}

/// p50 and p99 of one client's calls of one kind.
#[derive(Clone, Debug)]
pub struct Quantiles {
    pub p50: Duration,
    pub p99: Duration,
}

fn quantiles(mut v: Vec<Duration>) -> Quantiles {
    v.sort();
    let at = |q: f64| v[((v.len() as f64 * q).ceil() as usize).clamp(1, v.len()) - 1];
    Quantiles {
        p50: at(0.50),
        p99: at(0.99),
    }
}

fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1e3)
}

/// Runs the measurement; prints the table and the RESULT line.
pub async fn run(cfg: LatencyConfig) -> anyhow::Result<()> {
    anyhow::ensure!(
        cfg.zones >= 2,
        "--zones must be 2 or more (a link between zones)"
    );
    anyhow::ensure!(cfg.nodes >= cfg.zones, "--nodes must be at least --zones");
    anyhow::ensure!(cfg.ops >= 10, "--ops must be 10 or more");
    let zones: Vec<String> = (0..cfg.nodes)
        .map(|i| format!("z{}", i % cfg.zones + 1))
        .collect();
    let cluster = Cluster::start(ClusterConfig {
        lockd_bin: cfg.lockd_bin.clone(),
        dir: cfg.dir.clone(),
        nodes: cfg.nodes,
        lock_groups: cfg.groups,
        config_toml: format!(
            "[[namespace]]\nname = \"{NAMESPACE}\"\nprefix = \"{NAMESPACE}/\"\n\
             default_ttl_ms = 10000\n"
        ),
        snapshot_every: 20_000,
        negative_control: None,
        faketime: false,
        zones: zones.clone(),
        replicas: 0,
        zone_delay: cfg.delay,
        audit: false,
    })
    .await?;
    let r = measure(&cfg, &cluster, &zones).await;
    cluster.shutdown().await;
    r
}

/// Group 1's leader once it has kept the same one for [`SETTLED`] (leader balancing hands
/// groups to their preferred leaders a few seconds after start).
async fn settled_leader(cluster: &Cluster) -> anyhow::Result<u64> {
    let give_up = Instant::now() + Duration::from_secs(60);
    let (mut leader, mut since) = (0, Instant::now());
    loop {
        let now = cluster.leaders().await.get(&1).copied().unwrap_or(0);
        if now != leader {
            (leader, since) = (now, Instant::now());
        } else if leader != 0 && since.elapsed() >= SETTLED {
            return Ok(leader);
        }
        anyhow::ensure!(
            Instant::now() < give_up,
            "group 1's leader did not settle in 60 s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Time between a release and the next timed acquire: an acquire on a quiet group, as a
/// client that takes a lock now and then makes it. Back to back (`b2b`, no gap), an acquire
/// finds the replication stream to each follower still busy with the previous release's
/// commit notice, one round trip more across zones.
const QUIET_GAP: Duration = Duration::from_millis(10);

/// How long group 1 must keep its leader before the clients are timed.
const SETTLED: Duration = Duration::from_secs(8);

/// Time between two timed keepalives: more than the peer layer's keepalive pace (5 ms between
/// two batches to one node, `lockd-raft/src/peer/batch.rs`), so each is timed as a session's
/// keepalive is, one every TTL/3, and not queued behind the previous one.
const KEEPALIVE_GAP: Duration = Duration::from_millis(10);

async fn measure(cfg: &LatencyConfig, cluster: &Cluster, zones: &[String]) -> anyhow::Result<()> {
    let leader = settled_leader(cluster).await?;
    let zone_of = |id: u64| &zones[id as usize - 1];
    let far = (1..=cfg.nodes)
        .find(|&id| zone_of(id) != zone_of(leader))
        .context("no node outside the leader's zone")?;
    eprintln!(
        "latency: {} nodes over {} zones, {} group(s) of {} replicas; {} us each way between \
         zones; group 1's leader is node {leader} ({}), the far client's node is {far} ({})",
        cfg.nodes,
        cfg.zones,
        cfg.groups,
        cfg.nodes,
        cfg.delay.as_micros(),
        zone_of(leader),
        zone_of(far),
    );
    let mut rows = Vec::new();
    for (label, node) in [("leader_zone", leader), ("other_zone", far)] {
        let endpoint = cluster.grpc_addr(node).to_string();
        let now = cluster.leaders().await.get(&1).copied().unwrap_or(0);
        anyhow::ensure!(
            now == leader,
            "group 1's leader moved from node {leader} to {now}: run again"
        );
        let acquire = acquires(&endpoint, label, cfg.ops, QUIET_GAP).await?;
        let back_to_back = acquires(&endpoint, label, cfg.ops, Duration::ZERO).await?;
        let keepalive = keepalives(&endpoint, cfg.ops).await?;
        rows.push((
            label,
            node,
            [
                ("acquire", acquire),
                ("b2b_acquire", back_to_back),
                ("keepalive", keepalive),
            ],
        ));
    }
    let after = cluster.leaders().await.get(&1).copied().unwrap_or(0);
    anyhow::ensure!(
        after == leader,
        "group 1's leader moved from node {leader} to {after} during the run: run again"
    );
    println!(
        "{:<12} {:>5} {:>12} {:>12} {:>12} {:>12} {:>14} {:>14}",
        "client",
        "node",
        "acquire p50",
        "acquire p99",
        "b2b p50",
        "b2b p99",
        "keepalive p50",
        "keepalive p99"
    );
    let mut result = format!(
        "RESULT delay_us={} nodes={} zones={} groups={} ops={}",
        cfg.delay.as_micros(),
        cfg.nodes,
        cfg.zones,
        cfg.groups,
        cfg.ops,
    );
    for (label, node, kinds) in &rows {
        let mut line = format!("{label:<12} {node:>5}");
        for (kind, q) in kinds {
            let width = if *kind == "keepalive" { 14 } else { 12 };
            line.push_str(&format!(" {:>width$} {:>width$}", ms(q.p50), ms(q.p99)));
            result.push_str(&format!(
                " {label}_{kind}_p50_ms={} {label}_{kind}_p99_ms={}",
                ms(q.p50),
                ms(q.p99)
            ));
        }
        println!("{line}");
    }
    println!("{result}");
    Ok(())
}

/// Times `ops` uncontended acquires through `endpoint` (the release after each is not timed),
/// each `gap` after the release before it.
async fn acquires(
    endpoint: &str,
    label: &str,
    ops: usize,
    gap: Duration,
) -> anyhow::Result<Quantiles> {
    let opts = ClientOptions {
        client_name: format!("latency-{label}"),
        namespace: NAMESPACE.into(),
        ttl: Duration::from_secs(10),
        ..Default::default()
    };
    let client = Client::connect_with([endpoint], opts).await?;
    let mut took = Vec::with_capacity(ops);
    for i in 0..ops + ops / 10 {
        let name = format!("{NAMESPACE}/{label}-{}-{i}", gap.as_millis());
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
        let start = Instant::now();
        let guard = client.acquire(&name).try_once().await?;
        let t = start.elapsed();
        guard.release().await?;
        if i >= ops / 10 {
            took.push(t);
        }
    }
    client.close().await?;
    Ok(quantiles(took))
}

/// Times `ops` unary keepalives of one session through `endpoint`.
async fn keepalives(endpoint: &str, ops: usize) -> anyhow::Result<Quantiles> {
    let mut rpc = pb::lock_client::LockClient::connect(format!("http://{endpoint}")).await?;
    let opened = rpc
        .open_session(pb::OpenSessionRequest {
            client: "latency-keepalive".into(),
            ttl_ms: 10_000,
            namespace: NAMESPACE.into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    let mut took = Vec::with_capacity(ops);
    for i in 0..ops + ops / 10 {
        tokio::time::sleep(KEEPALIVE_GAP).await;
        let start = Instant::now();
        // As lockd-client names it for a session that holds nothing: its home group.
        rpc.keep_alive(pb::KeepAliveRequest {
            session_id: opened.session_id.clone(),
            groups: (opened.group != 0)
                .then_some(opened.group)
                .into_iter()
                .collect(),
        })
        .await?;
        if i >= ops / 10 {
            took.push(start.elapsed());
        }
    }
    rpc.close_session(pb::CloseSessionRequest {
        session_id: opened.session_id,
    })
    .await?;
    Ok(quantiles(took))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        let q = quantiles(v);
        assert_eq!(q.p50, Duration::from_millis(50));
        assert_eq!(q.p99, Duration::from_millis(99));
        let q = quantiles(vec![Duration::from_millis(7)]);
        assert_eq!(
            (q.p50, q.p99),
            (Duration::from_millis(7), Duration::from_millis(7))
        );
    }
}
