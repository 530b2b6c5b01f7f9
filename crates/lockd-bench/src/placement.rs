//! `lockd-bench placement`: one lock group on 3 nodes against two groups placed on disjoint
//! halves of 6 nodes (`--replicas 3`), alternating in one run so that both see the same noise.
//!
//! Why this shape: placement is what turns a second group into more machines. On one machine
//! every node shares the same cores, so the two-group figure cannot show the gain a second set
//! of machines gives; what it shows is the cost of the extra hop and of six processes. The CPU
//! each node spends per request is the figure to extrapolate from: with a machine per node, the
//! busiest node's CPU per request bounds a group's rate, and two groups on disjoint machines
//! have two such budgets. Clients route to the leader of each name's group (as lockd-client's
//! stream does through its node) and, in a second run, through every node (a node with no
//! replica of the name's group sends the proposal to that group's leader).
//!
//! Every loop is bounded by a count and a deadline; each cluster is stopped by pid on return.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;

use crate::lockd::{Cluster, GrpcTarget, Routing, ServerOpts};
use crate::procs::cpu_secs;
use crate::workload::{self, Ctx, Plan, Row};

pub struct PlacementArgs {
    pub rounds: u32,
    pub secs: u64,
    pub clients: usize,
}

/// (label, nodes, lock groups, replicas per group).
const SHAPES: [(&str, usize, u32, usize); 2] = [
    ("1 group on 3 nodes", 3, 1, 0),
    ("2 groups on 6 nodes (3+3)", 6, 2, 3),
];

fn cpu_of(pids: &[u32]) -> Vec<f64> {
    pids.iter().map(|p| cpu_secs(Some(*p))).collect()
}

/// Runs `f` and appends to its row each node's CPU per request (µs).
async fn with_cpu(
    cluster: &Cluster,
    secs: u64,
    f: impl std::future::Future<Output = Result<Row>>,
) -> Result<Row> {
    let pids = cluster.pids();
    let before = cpu_of(&pids);
    let mut row = f.await?;
    let after = cpu_of(&pids);
    let ops = (row.ops_per_s * secs as f64).max(1.0);
    let per_node: Vec<String> = before
        .iter()
        .zip(&after)
        .map(|(b, a)| format!("{:.0}", (a - b) * 1e6 / ops))
        .collect();
    let note = format!("CPU µs/request per node: {}", per_node.join(" "));
    row.note = if row.note.is_empty() {
        note
    } else {
        format!("{note}; {}", row.note)
    };
    Ok(row)
}

pub async fn run(bin: &Path, root: &Path, opts: ServerOpts, a: &PlacementArgs) -> Result<()> {
    println!(
        "lockd-bench placement --rounds {} --secs {} --clients {}: {} cores, fsync on, \
         {} scheduler thread(s) per node; load average {}",
        a.rounds,
        a.secs,
        a.clients,
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        opts.threads.map_or("default".into(), |t| t.to_string()),
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    let plan = Plan {
        cycle_duration: Duration::from_secs(a.secs),
        mix_duration: Duration::from_secs(a.secs),
        max_rate_clients: a.clients,
        ..Plan::new(true)
    };
    let mut rows = Vec::new();
    for round in 1..=a.rounds {
        for (label, nodes, groups, replicas) in SHAPES {
            let opts = ServerOpts { replicas, ..opts };
            eprintln!("[placement] round {round}: {label}");
            let cluster = Cluster::start(bin, root, nodes, groups, opts).await?;
            let system = format!("{label}, round {round}");
            let cx = Ctx {
                system: &system,
                plan: &plan,
                server_pids: cluster.pids(),
            };
            for routing in [Routing::Leader, Routing::Spread] {
                let t = Arc::new(GrpcTarget::new(&cluster, routing).await?);
                let mut row = with_cpu(&cluster, a.secs, workload::mix_max(&cx, &t)).await?;
                row.workload = format!("{} ({routing:?})", row.workload);
                rows.push(row);
            }
            let t = Arc::new(GrpcTarget::new(&cluster, Routing::Leader).await?);
            rows.push(with_cpu(&cluster, a.secs, workload::cycles(&cx, &t, 1)).await?);
            drop(cluster);
        }
    }
    let baselines: Vec<String> = (1..=a.rounds)
        .map(|r| format!("{}, round {r}", SHAPES[0].0))
        .collect();
    let refs: Vec<&str> = baselines.iter().map(String::as_str).collect();
    println!("{}", crate::report::table(&rows, &refs));
    Ok(())
}
