//! Takes a lock and holds it until its lease is lost or stdin closes, narrating on stdout.
//!
//! `cargo run -p lockd-client --example hold -- ENDPOINTS NAME [TTL_MS] [NAMESPACE]`
//!
//! Prints `acquired TOKEN SESSION`; when the lease is lost, `lost LATE_MS` (how long after the
//! local deadline the loss was noticed), then `release refused CODE` or `released`, and
//! `lease_expired_count N`. The paused-client test drives it with SIGSTOP/SIGCONT.

use std::time::Duration;

use lockd_client::{Client, ClientOptions};
use tokio::io::AsyncReadExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let endpoints = args
        .get(1)
        .ok_or("usage: hold ENDPOINTS NAME [TTL_MS] [NAMESPACE]")?;
    let name = args
        .get(2)
        .ok_or("usage: hold ENDPOINTS NAME [TTL_MS] [NAMESPACE]")?;
    let ttl_ms: u64 = args.get(3).map_or(Ok(15_000), |s| s.parse())?;
    let opts = ClientOptions {
        client_name: "hold-example".into(),
        ttl: Duration::from_millis(ttl_ms),
        namespace: args.get(4).cloned().unwrap_or_default(),
        ..Default::default()
    };
    let client = Client::connect_with(endpoints.split(','), opts).await?;
    let guard = client
        .acquire(name.as_str())
        .wait(Duration::from_secs(30))
        .await?;
    println!("acquired {} {}", guard.token(), guard.session_id());

    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 64];
    tokio::select! {
        _ = guard.lost() => {
            let late = tokio::time::Instant::now().saturating_duration_since(guard.deadline());
            println!("lost {}", late.as_millis());
            // Let the driver notice too, so the local count is settled.
            tokio::time::sleep(Duration::from_millis(100)).await;
            match guard.release().await {
                Ok(()) => println!("released"),
                Err(e) => println!("release refused {}", e.code()),
            }
            println!("lease_expired_count {}", client.lease_expired_count());
        }
        _ = async { while stdin.read(&mut buf).await.map(|n| n > 0).unwrap_or(false) {} } => {
            guard.release().await?;
            println!("released");
        }
    }
    Ok(())
}
