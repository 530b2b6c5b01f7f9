//! Loopback ports for nodes.

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    free_ports(1)[0]
}

/// `n` distinct ports that were free a moment ago: each stays bound until all are picked, so
/// the kernel cannot hand the same one out twice.
pub fn free_ports(n: usize) -> Vec<u16> {
    let held: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").expect("bind a loopback port"))
        .collect();
    held.iter()
        .map(|l| l.local_addr().expect("a bound port").port())
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn ports_are_distinct() {
        let mut p = super::free_ports(64);
        p.sort_unstable();
        p.dedup();
        assert_eq!(p.len(), 64);
    }
}
