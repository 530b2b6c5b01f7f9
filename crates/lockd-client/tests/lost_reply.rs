//! A release whose reply is lost after it committed: the retry finds the hold already gone and
//! must report success, not a refusal (a refusal reads as "the lock is still held", which made a
//! nemesis worker record a hold overlapping the next holder's).
//!
//! Needs `target/debug/lockd`: `cargo build -p lockd-server --bin lockd` first.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use lockd_client::{Client, ClientOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// A TCP proxy to one node that can swallow everything the node sends back: requests still
/// arrive and commit, their replies never do.
struct Proxy {
    addr: String,
    swallow: Arc<AtomicBool>,
    swallowed: Arc<AtomicU64>,
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let swallow = Arc::new(AtomicBool::new(false));
        let swallowed = Arc::new(AtomicU64::new(0));
        let (sw, count) = (swallow.clone(), swallowed.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw2) = server.into_split();
                tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut cr, &mut sw2).await;
                });
                let (sw, count) = (sw.clone(), count.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 16 * 1024];
                    loop {
                        let n = match sr.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        if sw.load(Ordering::SeqCst) {
                            count.fetch_add(n as u64, Ordering::SeqCst);
                        } else if cw.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Proxy {
            addr,
            swallow,
            swallowed,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_reply_is_lost_after_commit_reports_success() {
    let _serial = SERIAL.lock().await;
    let c = Cluster::start(3, 1).await;
    let proxy = Proxy::start(c.grpc[0].clone()).await;
    // The proxied node first; a timed-out call moves on to the next endpoint.
    let opts = ClientOptions {
        request_timeout: Duration::from_millis(1500),
        ..options(Duration::from_secs(10))
    };
    let client = Client::connect_with([proxy.addr.as_str(), c.grpc[1].as_str()], opts)
        .await
        .unwrap();
    let name = "fast/lost-reply";
    let guard = client.acquire(name).await.unwrap();
    let token = guard.token();

    // From here the proxied node's replies vanish: the release commits, its answer never comes.
    proxy.swallow.store(true, Ordering::SeqCst);
    let started = Instant::now();
    let release = tokio::spawn(guard.release());

    // The first attempt landed: the hold is gone while the client still waits for its answer.
    let observer = Client::connect_with(&c.grpc[1..], options(Duration::from_secs(10)))
        .await
        .unwrap();
    eventually(Duration::from_secs(10), "the release to commit", || {
        let o = observer.clone();
        async move { o.inspect(name).await.is_ok_and(|s| s.holders.is_empty()) }
    })
    .await;
    assert!(
        !release.is_finished(),
        "the release answered before its reply was lost"
    );

    // The retry, on the next node, finds no hold: that is success, not "not the holder".
    let r = release.await.unwrap();
    assert!(r.is_ok(), "release after a lost reply: {r:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "the first attempt was answered ({:?})",
        started.elapsed()
    );
    assert!(proxy.swallowed.load(Ordering::SeqCst) > 0);

    // The lock is free for the next holder, with a larger token.
    let next = observer.acquire(name).await.unwrap();
    assert!(next.token() > token);
    next.release().await.unwrap();
}
