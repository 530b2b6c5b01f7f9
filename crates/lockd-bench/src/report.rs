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
}
