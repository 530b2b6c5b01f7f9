//! The comparison table: one Markdown table for every system and workload of a run.
//!
//! Why Markdown: the same text goes to the terminal and, unchanged, into docs/BENCHMARKS.md.
//! Each ratio column divides a row's ops/s by one baseline system's on the same workload.

use std::fmt::Write;

use crate::workload::Row;

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

/// Renders `rows` with one ratio column per baseline (a system label): the row's ops/s over
/// the baseline's on the same workload.
pub fn table(rows: &[Row], baselines: &[&str]) -> String {
    let mut out = String::new();
    let ratio_heads: String = baselines.iter().map(|b| format!(" vs {b} |")).collect();
    let _ = writeln!(
        out,
        "| system | workload | ops/s | p50 ms | p99 ms | p999 ms | errors |{ratio_heads} cpu srv/bench | note |"
    );
    let _ = writeln!(
        out,
        "|---|---|---:|---:|---:|---:|---:|{}---:|---|",
        "---:|".repeat(baselines.len())
    );
    for r in rows {
        let ratios: String = baselines
            .iter()
            .map(|&b| {
                let base = rows
                    .iter()
                    .find(|x| x.system == b && x.workload == r.workload)
                    .filter(|x| x.ops_per_s > 0.0);
                base.map_or(" - |".into(), |x| {
                    format!(" {:.2}x |", r.ops_per_s / x.ops_per_s)
                })
            })
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {} | {} | {} | {} |{ratios} {:.0}%/{:.0}% | {} |",
            r.system,
            r.workload,
            r.ops_per_s,
            ms(r.p50_us),
            ms(r.p99_us),
            ms(r.p999_us),
            r.errors,
            r.cpu.servers_pct,
            r.cpu.bench_pct,
            r.note
        );
    }
    out
}

/// The headline: `head` (lockd's default configuration, never the best of several) against each
/// baseline, workload by workload, with the ratio of ops/s taken within each round, so that two
/// systems are only ever divided when they ran minutes apart on the same machine. Each cell
/// lists its rounds in order, separated by " · ".
pub fn headline(rounds: &[Vec<Row>], head: &str, baselines: &[&str]) -> String {
    let mut out = String::new();
    let systems: Vec<&str> = std::iter::once(head)
        .chain(baselines.iter().copied())
        .collect();
    let mut heads = String::new();
    let mut rule = String::new();
    for s in &systems {
        let _ = write!(heads, " {s} ops/s | {s} p50 / p99 ms |");
        rule.push_str("---:|---:|");
    }
    for b in baselines {
        let _ = write!(heads, " {head} ÷ {b} |");
        rule.push_str("---:|");
    }
    let _ = writeln!(out, "| workload |{heads}");
    let _ = writeln!(out, "|---|{rule}");
    let find = |round: &[Row], system: &str, workload: &str| -> Option<Row> {
        round
            .iter()
            .find(|x| x.system == system && x.workload == workload)
            .cloned()
    };
    let mut workloads: Vec<&str> = Vec::new();
    for r in rounds.iter().flatten().filter(|r| r.system == head) {
        if !workloads.contains(&r.workload.as_str()) {
            workloads.push(&r.workload);
        }
    }
    let join = |cells: Vec<String>| cells.join(" · ");
    for w in workloads {
        let mut line = format!("| {w} |");
        for s in &systems {
            let rows: Vec<Option<Row>> = rounds.iter().map(|r| find(r, s, w)).collect();
            let ops = join(
                rows.iter()
                    .map(|r| {
                        r.as_ref()
                            .map_or("-".into(), |r| format!("{:.0}", r.ops_per_s))
                    })
                    .collect(),
            );
            let lat = join(
                rows.iter()
                    .map(|r| {
                        r.as_ref().map_or("-".into(), |r| {
                            format!("{} / {}", ms(r.p50_us), ms(r.p99_us))
                        })
                    })
                    .collect(),
            );
            let _ = write!(line, " {ops} | {lat} |");
        }
        for b in baselines {
            let ratios = join(
                rounds
                    .iter()
                    .map(|r| match (find(r, head, w), find(r, b, w)) {
                        (Some(h), Some(x)) if x.ops_per_s > 0.0 => {
                            format!("{:.2}x", h.ops_per_s / x.ops_per_s)
                        }
                        _ => "-".into(),
                    })
                    .collect(),
            );
            let _ = write!(line, " {ratios} |");
        }
        let _ = writeln!(out, "{line}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(system: &str, ops: f64) -> Row {
        Row {
            system: system.into(),
            workload: "cycle C=1".into(),
            ops_per_s: ops,
            p50_us: 1200,
            p99_us: 2500,
            p999_us: 9000,
            errors: 0,
            not_acquired: 0,
            refused: 0,
            cpu: Default::default(),
            note: String::new(),
        }
    }

    #[test]
    fn ratio_is_against_the_baseline_on_the_same_workload() {
        let rows = [
            row("etcd", 1000.0),
            row("redis-aof", 20000.0),
            row("lockd", 30000.0),
        ];
        let t = table(&rows, &["etcd", "redis-aof"]);
        assert!(
            t.contains("| etcd | cycle C=1 | 1000 | 1.20 | 2.50 | 9.00 | 0 | 1.00x | 0.05x |"),
            "{t}"
        );
        assert!(
            t.contains("| lockd | cycle C=1 | 30000 | 1.20 | 2.50 | 9.00 | 0 | 30.00x | 1.50x |"),
            "{t}"
        );
        let t = table(&rows[2..], &["etcd"]);
        assert!(t.contains("| 0 | - |"), "{t}");
    }

    #[test]
    fn the_headline_divides_within_a_round_and_only_the_default_configuration() {
        let mut best = row("lockd-leader", 90000.0);
        best.p50_us = 100;
        let round1 = vec![
            row("lockd", 30000.0),
            best,
            row("etcd", 1000.0),
            row("redis-aof", 20000.0),
        ];
        let round2 = vec![row("lockd", 20000.0), row("etcd", 4000.0)];
        let t = headline(&[round1, round2], "lockd", &["etcd", "redis-aof"]);
        assert!(t.starts_with("| workload | lockd ops/s | lockd p50 / p99 ms | etcd ops/s |"));
        assert!(
            t.contains(
                "| cycle C=1 | 30000 · 20000 | 1.20 / 2.50 · 1.20 / 2.50 | 1000 · 4000 | \
                 1.20 / 2.50 · 1.20 / 2.50 | 20000 · - | 1.20 / 2.50 · - | 30.00x · 5.00x | \
                 1.50x · - |"
            ),
            "{t}"
        );
        assert!(
            !t.contains("90000"),
            "another configuration leaked into the headline: {t}"
        );
    }
}
