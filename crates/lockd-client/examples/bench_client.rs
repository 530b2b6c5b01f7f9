//! The Rust twin of `clients/python/bench.py`: acquire/release latency at concurrency 1 and
//! throughput at concurrency C against a running lockd, through lockd-client (one `Client`, one
//! session, one `Session` stream, shared by every task, as the Python bench shares its client).
//!
//! `cargo run --release -p lockd-client --example bench_client -- ENDPOINTS [--ops N]
//! [--seconds S] [--concurrency C] [--phase both|c1|cn] [--json]`
//!
//! The same work as bench.py: 50 warm-up operations at C=1, then per phase at most `--ops`
//! operations (C=1) or `4 × --ops` (C), and at most `--seconds` seconds, whichever comes first.
//! One operation is a try-once acquire of a name of its own (`bench/rs/PID/PHASE/TASK/I`, owner
//! the client name) plus its release: two round trips, each committed through Raft. Latency
//! percentiles are nearest-rank as in bench.py. `--json` prints one line per phase: `client`,
//! `phase`, `concurrency`, `ops`, `errors`, `seconds`, `ops_per_s`, `p50_ms`, `p99_ms`,
//! `mean_ms` and `cpu_ms_per_op` (this process's user + system CPU over the phase, from
//! /proc/self/stat, per operation). Asserts nothing about time. `scripts/bench-clients` runs it
//! beside bench.py.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockd_client::{Client, ClientOptions};

const USAGE: &str = "usage: bench_client ENDPOINTS [--ops N] [--seconds S] [--concurrency C] \
                     [--phase both|c1|cn] [--json]";

struct Phase {
    lat: Vec<f64>,
    errors: u64,
    elapsed: f64,
    cpu: Option<f64>,
}

/// This process's user + system CPU seconds (all threads), or `None` off Linux.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    // USER_HZ is 100 on every Linux ABI Rust targets.
    Some(ticks as f64 / 100.0)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = (p / 100.0 * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn phase(client: &Client, tasks: usize, ops: usize, seconds: f64, prefix: &str) -> Phase {
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let next = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let mut handles = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let (client, next, errors) = (client.clone(), next.clone(), errors.clone());
        let prefix = prefix.to_string();
        handles.push(tokio::spawn(async move {
            let mut mine = Vec::new();
            while Instant::now() < end {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= ops {
                    break;
                }
                let s = Instant::now();
                let r = match client.acquire(format!("{prefix}/{t}/{i}")).try_once().await {
                    Ok(g) => g.release().await,
                    Err(e) => Err(e),
                };
                match r {
                    Ok(()) => mine.push(s.elapsed().as_secs_f64()),
                    Err(e) => {
                        if errors.fetch_add(1, Ordering::Relaxed) < 3 {
                            eprintln!("bench_client: {e}");
                        }
                    }
                }
            }
            mine
        }));
    }
    let mut lat = Vec::new();
    for h in handles {
        // Bounded like bench.py's join: a task never outlives the phase by more than 30 s.
        match tokio::time::timeout(Duration::from_secs_f64(seconds + 30.0), h).await {
            Ok(Ok(mine)) => lat.extend(mine),
            _ => eprintln!("bench_client: a task did not finish"),
        }
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds().zip(cpu0).map(|(b, a)| b - a);
    Phase {
        lat,
        errors: errors.load(Ordering::Relaxed),
        elapsed,
        cpu,
    }
}

fn report(name: &str, c: usize, p: &mut Phase, json: bool) {
    p.lat.sort_by(f64::total_cmp);
    let n = p.lat.len();
    let mean = if n == 0 {
        f64::NAN
    } else {
        p.lat.iter().sum::<f64>() / n as f64
    };
    let (p50, p99) = (pct(&p.lat, 50.0) * 1e3, pct(&p.lat, 99.0) * 1e3);
    let rate = n as f64 / p.elapsed;
    if json {
        let cpu = match p.cpu {
            Some(cpu) if n > 0 => format!("{:.4}", cpu * 1e3 / n as f64),
            _ => "null".into(),
        };
        let num = |x: f64| {
            if x.is_finite() {
                format!("{x:.3}")
            } else {
                "null".into()
            }
        };
        println!(
            "{{\"client\": \"rust\", \"phase\": \"{name}\", \"concurrency\": {c}, \"ops\": {n}, \
             \"errors\": {}, \"seconds\": {:.3}, \"ops_per_s\": {:.1}, \"p50_ms\": {}, \
             \"p99_ms\": {}, \"mean_ms\": {}, \"cpu_ms_per_op\": {cpu}}}",
            p.errors,
            p.elapsed,
            rate,
            num(p50),
            num(p99),
            num(mean * 1e3)
        );
    } else {
        println!(
            "C={c}: {n} acquire+release in {:.1}s  p50 {p50:.2} ms  p99 {p99:.2} ms  \
             mean {:.2} ms  ({rate:.0} ops/s, {} errors)",
            p.elapsed,
            mean * 1e3,
            p.errors
        );
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut endpoints = None;
    let (mut ops, mut seconds, mut concurrency) = (2000usize, 20.0f64, 16usize);
    let (mut which, mut json) = (String::from("both"), false);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(USAGE);
        match a.as_str() {
            "--ops" => ops = val()?.parse()?,
            "--seconds" => seconds = val()?.parse()?,
            "--concurrency" => concurrency = val()?.parse()?,
            "--phase" => which = val()?,
            "--json" => json = true,
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(());
            }
            _ if endpoints.is_none() && !a.starts_with('-') => endpoints = Some(a),
            _ => return Err(USAGE.into()),
        }
    }
    let endpoints = endpoints
        .or_else(|| std::env::var("LOCKD_ENDPOINTS").ok())
        .ok_or(USAGE)?;
    if !["both", "c1", "cn"].contains(&which.as_str())
        || !seconds.is_finite()
        || seconds <= 0.0
        || concurrency == 0
    {
        return Err(USAGE.into());
    }
    let pid = std::process::id();
    let prefix = format!("bench/rs/{pid}");
    let opts = ClientOptions {
        client_name: format!("bench_client/{pid}"),
        ..Default::default()
    };
    let client = Client::connect_with(endpoints.split(','), opts).await?;
    phase(&client, 1, 50, 5.0, &format!("{prefix}/warm")).await;
    if which != "cn" {
        let mut p = phase(&client, 1, ops, seconds, &format!("{prefix}/c1")).await;
        report("c1", 1, &mut p, json);
    }
    if which != "c1" {
        let name = format!("c{concurrency}");
        let mut p = phase(
            &client,
            concurrency,
            ops * 4,
            seconds,
            &format!("{prefix}/{name}"),
        )
        .await;
        report(&name, concurrency, &mut p, json);
    }
    client.close().await?;
    Ok(())
}
