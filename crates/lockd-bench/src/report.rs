//! The comparison table: one Markdown table for every system and workload of a run.
//!
//! Why Markdown: the same text goes to the terminal and, unchanged, into docs/BENCHMARKS.md.
//! The ratio column divides each row's ops/s by the baseline system's on the same workload.

use std::fmt::Write;

use crate::workload::Row;

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

/// Renders `rows` with a ratio column against `baseline` (a system label).
pub fn table(rows: &[Row], baseline: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| system | workload | ops/s | p50 ms | p99 ms | p999 ms | errors | ops/s vs {baseline} | cpu srv/bench | note |"
    );
    let _ = writeln!(out, "|---|---|---:|---:|---:|---:|---:|---:|---:|---|");
    for r in rows {
        let base = rows
            .iter()
            .find(|b| b.system == baseline && b.workload == r.workload)
            .filter(|b| b.ops_per_s > 0.0);
        let ratio = base.map_or("-".into(), |b| format!("{:.2}x", r.ops_per_s / b.ops_per_s));
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {} | {} | {} | {} | {} | {:.0}%/{:.0}% | {} |",
            r.system,
            r.workload,
            r.ops_per_s,
            ms(r.p50_us),
            ms(r.p99_us),
            ms(r.p999_us),
            r.errors,
            ratio,
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
            cpu: Default::default(),
            note: String::new(),
        }
    }

    #[test]
    fn ratio_is_against_the_baseline_on_the_same_workload() {
        let t = table(&[row("etcd", 1000.0), row("redis-mem", 30000.0)], "etcd");
        assert!(
            t.contains("| etcd | cycle C=1 | 1000 | 1.20 | 2.50 | 9.00 | 0 | 1.00x |"),
            "{t}"
        );
        assert!(
            t.contains("| redis-mem | cycle C=1 | 30000 | 1.20 | 2.50 | 9.00 | 0 | 30.00x |"),
            "{t}"
        );
    }
}
