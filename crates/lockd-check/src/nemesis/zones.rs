//! The [`Scenario::Zones`](super::Scenario::Zones) script: five nodes in three zones, every
//! lock group on all five (2+2+1 over the zones, so no zone holds a majority), and whole zones
//! lost and cut off in turn under the workers' load.
//!
//! The cycle, repeated until the run's duration is used up, with the zone moving on at each
//! step so every zone meets both faults: a zone loss (SIGKILL every node of the zone at once,
//! 3-5 TTLs later start them again on their data), another zone's loss, then a zone partition
//! (every link between the zone's nodes and the other zones' nodes cut through the proxies,
//! 3-5 TTLs, healed). After each step the nemesis waits until every node is caught up before
//! the next one: a second zone lost while the first is still catching up would leave a group
//! without a quorum, which is the harness's doing, not the service's.
//!
//! Each step is one `Fault` record of kind [`LOSS`] or [`PARTITION`]; its window runs from the
//! injection to the moment every node is caught up again (the undo plus the recovery), so the
//! availability lines of [`super::avail`] charge the whole cost of a zone's loss to its kind.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::history::{Record, Recorder};

use super::cluster::Cluster;
use super::{admin, again};

/// The founders' zones, node 1's first: z1 holds nodes 1 and 4, z2 nodes 2 and 5, z3 node 3.
pub const ZONES: [&str; 5] = ["z1", "z2", "z3", "z1", "z2"];
/// The founders, one per entry of [`ZONES`].
pub const NODES: u64 = ZONES.len() as u64;
/// Replicas per lock group: every node hosts every group.
pub const REPLICAS: usize = ZONES.len();

/// The fault kinds of the scenario (the availability lines' names).
pub const LOSS: &str = "zone_loss";
pub const PARTITION: &str = "zone_partition";

/// A node's apply lag (entries) under which it counts as caught up after a step.
pub const CAUGHT_UP: u64 = 100;
/// How long the nemesis waits for that after a step.
pub const CATCH_UP_WITHIN: Duration = Duration::from_secs(60);

/// The nodes of zone `z`.
pub fn members(z: &str) -> Vec<u64> {
    ZONES
        .iter()
        .enumerate()
        .filter(|(_, x)| **x == z)
        .map(|(i, _)| i as u64 + 1)
        .collect()
}

/// Step `j` of the script: (kind, zone). Loss, loss, partition, the zone moving on by one at
/// each step and by one more at each cycle, so nine steps give every zone both kinds.
pub fn step(j: usize) -> (&'static str, &'static str) {
    let kind = if j % 3 == 2 { PARTITION } else { LOSS };
    (kind, ["z1", "z2", "z3"][(j + j / 3) % 3])
}

/// What the script did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ZoneCounts {
    pub losses: u64,
    pub partitions: u64,
    /// Steps after which the nodes were not caught up within [`CATCH_UP_WITHIN`].
    pub slow_recoveries: u64,
}

/// Runs the script until `end`.
pub async fn run(
    cluster: &mut Cluster,
    rec: &Recorder,
    ttl: Duration,
    seed: u64,
    end: Instant,
) -> anyhow::Result<ZoneCounts> {
    check_placement(cluster).await?;
    let mut rng = fastrand::Rng::with_seed(seed ^ 0x20_43e5);
    let ttl_ms = ttl.as_millis() as u64;
    let mut counts = ZoneCounts::default();
    tokio::time::sleep(2 * ttl).await;
    for j in 0.. {
        let hold = Duration::from_millis(rng.u64(3 * ttl_ms..=5 * ttl_ms));
        // A step that cannot end before the workers stop would measure nothing.
        if Instant::now() + hold + Duration::from_secs(2) >= end {
            break;
        }
        let (kind, zone) = step(j);
        if !one_step(cluster, rec, kind, zone, hold).await? {
            counts.slow_recoveries += 1;
        }
        if kind == LOSS {
            counts.losses += 1;
        } else {
            counts.partitions += 1;
        }
        tokio::time::sleep(Duration::from_millis(rng.u64(1000..=3000))).await;
    }
    while Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(counts)
}

/// One step: inject, hold, undo, wait until caught up; records the fault. `Ok(false)` if the
/// nodes were not caught up within [`CATCH_UP_WITHIN`].
async fn one_step(
    cluster: &mut Cluster,
    rec: &Recorder,
    kind: &str,
    zone: &str,
    hold: Duration,
) -> anyhow::Result<bool> {
    let ids = members(zone);
    let at_ns = rec.now_ns();
    if kind == LOSS {
        cluster.kill_all(&ids).await?;
    } else {
        cluster.isolate_set(&ids, true);
    }
    let nodes: Vec<String> = ids.iter().map(|i| format!("node{i}")).collect();
    let target = format!("{zone} ({})", nodes.join(","));
    eprintln!(
        "nemesis: t={:>5.1}s {kind} {target} for {} ms",
        at_ns as f64 / 1e9,
        hold.as_millis()
    );
    tokio::time::sleep(hold).await;
    if kind == LOSS {
        for &id in &ids {
            cluster.restart(id)?;
        }
    } else {
        cluster.isolate_set(&ids, false);
    }
    let undone = Instant::now();
    let ok = caught_up(cluster, CATCH_UP_WITHIN).await;
    let now_ns = rec.now_ns();
    rec.push(Record::Fault {
        kind: kind.into(),
        at_ns,
        target: target.clone(),
        verified: true,
        hold_ms: now_ns.saturating_sub(at_ns) / 1_000_000,
    });
    eprintln!(
        "nemesis: t={:>5.1}s {kind} {target} undone; {} in {:.1} s (window {:.1} s)",
        now_ns as f64 / 1e9,
        if ok { "caught up" } else { "NOT caught up" },
        undone.elapsed().as_secs_f64(),
        now_ns.saturating_sub(at_ns) as f64 / 1e9
    );
    Ok(ok)
}

/// Waits (up to `within`) until every group has a leader and every node answers its status
/// call with an apply lag of at most [`CAUGHT_UP`].
async fn caught_up(cluster: &Cluster, within: Duration) -> bool {
    let until = Instant::now() + within;
    while Instant::now() < until {
        if cluster.wait_ready(Duration::from_millis(500)).await.is_ok()
            && cluster
                .max_apply_lag()
                .await
                .is_some_and(|l| l <= CAUGHT_UP)
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    false
}

/// Voters by zone, for each group of `m`.
fn voters_by_zone(m: &lockd_client::admin::Members) -> BTreeMap<u32, BTreeMap<String, usize>> {
    m.groups
        .iter()
        .map(|g| {
            let mut per: BTreeMap<String, usize> = BTreeMap::new();
            for v in g.members.iter().filter(|v| v.role == "voter") {
                *per.entry(v.zone.clone()).or_default() += 1;
            }
            (g.group, per)
        })
        .collect()
}

/// Why `per` (one group's voters by zone) is not what the scenario needs: [`REPLICAS`] voters,
/// every one with a zone, and no zone holding a majority.
fn placement_problem(group: u32, per: &BTreeMap<String, usize>) -> Option<String> {
    let voters: usize = per.values().sum();
    let worst = per.values().copied().max().unwrap_or(0);
    if voters != REPLICAS {
        Some(format!(
            "group {group} has {voters} voters, not {REPLICAS}: {per:?}"
        ))
    } else if per.contains_key("") {
        Some(format!("group {group} has voters without a zone: {per:?}"))
    } else if 2 * worst > voters {
        Some(format!("group {group} has a zone majority: {per:?}"))
    } else {
        None
    }
}

/// Checks, through the admin API, that the cluster is placed as the scenario assumes: every
/// group (the meta group too) on [`REPLICAS`] voters, no zone with a majority of any.
async fn check_placement(cluster: &Cluster) -> anyhow::Result<()> {
    let c = admin(cluster)?;
    let m = again("list members", || c.list_members()).await?;
    let by_group = voters_by_zone(&m);
    let lock_groups = by_group.keys().filter(|g| **g != 0).count();
    anyhow::ensure!(
        lock_groups >= 2,
        "the zones scenario needs 2 lock groups or more, the cluster has {lock_groups}"
    );
    for (g, per) in &by_group {
        if let Some(why) = placement_problem(*g, per) {
            anyhow::bail!("zones scenario: {why}");
        }
        eprintln!("nemesis: group {g} voters by zone {per:?}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_zone_meets_both_kinds_and_no_zone_holds_a_majority() {
        assert_eq!(members("z1"), vec![1, 4]);
        assert_eq!(members("z2"), vec![2, 5]);
        assert_eq!(members("z3"), vec![3]);
        let cycle: Vec<_> = (0..9).map(step).collect();
        for z in ["z1", "z2", "z3"] {
            assert!(cycle.contains(&(LOSS, z)), "{z} lost in {cycle:?}");
            assert!(cycle.contains(&(PARTITION, z)), "{z} cut off in {cycle:?}");
        }
        assert_eq!(
            &cycle[..3],
            &[(LOSS, "z1"), (LOSS, "z2"), (PARTITION, "z3")]
        );
        let per = |v: &[(&str, usize)]| -> BTreeMap<String, usize> {
            v.iter().map(|(z, n)| (z.to_string(), *n)).collect()
        };
        assert_eq!(
            placement_problem(1, &per(&[("z1", 2), ("z2", 2), ("z3", 1)])),
            None
        );
        assert!(placement_problem(1, &per(&[("z1", 3), ("z2", 2)]))
            .unwrap()
            .contains("zone majority"));
        assert!(placement_problem(1, &per(&[("z1", 2), ("z2", 1)]))
            .unwrap()
            .contains("3 voters"));
        assert!(placement_problem(1, &per(&[("", 5)]))
            .unwrap()
            .contains("without a zone"));
    }
}
