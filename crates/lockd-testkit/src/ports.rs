//! Loopback ports for nodes.
//!
//! A node restarted in a test binds its old peer address again, so its ports are drawn below
//! Linux's ephemeral range (32768+): a port the kernel hands to an outgoing connection (another
//! test's client, a proxy) while the node is down can then never be one of them.

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

/// The ports drawn from: below the ephemeral range, above the well-known ones.
const LOW: std::ops::Range<u16> = 20_000..32_000;

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    free_ports(1)[0]
}

/// `n` distinct ports that were free a moment ago: each stays bound until all are picked, so
/// no two are the same.
pub fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<TcpListener> = (0..n).map(|_| low_listener()).collect();
    held.iter()
        .map(|l| l.local_addr().expect("a bound port").port())
        .collect()
}

/// A loopback listener on a free port below the ephemeral range.
pub fn low_listener() -> TcpListener {
    use std::hash::{BuildHasher, Hasher};
    // Each RandomState is seeded afresh: a different walk per call and per process.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    let span = u64::from(LOW.end - LOW.start);
    let start = h.finish() % span;
    for i in 0..span {
        let port = LOW.start + ((start + i * 7919) % span) as u16;
        if let Ok(l) = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port))) {
            return l;
        }
    }
    panic!("no free loopback port in {LOW:?}")
}

/// [`low_listener`] for tokio.
pub fn low_tokio_listener() -> tokio::net::TcpListener {
    let l = low_listener();
    l.set_nonblocking(true).expect("a non-blocking listener");
    tokio::net::TcpListener::from_std(l).expect("a tokio listener")
}

/// Binds `addr` again for a restarted node, waiting up to 30 s while the old listener (or a
/// connection in its last state) lets go; panics naming the address and the error after that.
pub async fn rebind(addr: &str) -> tokio::net::TcpListener {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => return l,
            Err(e) if Instant::now() < deadline => {
                if e.kind() != std::io::ErrorKind::AddrInUse {
                    panic!("bind {addr}: {e}");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("bind {addr} for 30 s: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn ports_are_distinct_and_below_the_ephemeral_range() {
        let mut p = super::free_ports(64);
        assert!(p.iter().all(|p| super::LOW.contains(p)), "{p:?}");
        p.sort_unstable();
        p.dedup();
        assert_eq!(p.len(), 64);
    }
}
