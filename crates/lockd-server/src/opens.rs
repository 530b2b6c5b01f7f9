//! A budget of session opens per client address.
//!
//! A session takes a place in the cluster (at most 250,000, the namespaces without a token
//! sharing 150,000 of them) and lives one TTL without a keepalive. Without a limit, one client
//! on the network could open sessions as fast as the cluster commits them and fill the open
//! namespaces' share in under a minute. Each address may open [`BURST_SECONDS`] seconds' worth
//! of its rate at once, then its rate per second (`--session-opens-per-address`); past that an
//! open is answered `429 rate_limited` with `Retry-After`, before anything is proposed.
//! Addresses count as in `authfail.rs` (IPv6 by /64). A worker process opens one session per
//! life, so a host of many workers, or a NAT in front of many hosts, stays well inside it; a
//! benchmark that stands in for thousands of hosts from one address turns it off (0).
//!
//! Memory is bounded as in `authfail.rs`: at most [`MAX_ADDRESSES`] addresses; past that,
//! addresses whose budget has refilled are dropped first, then the whole table if that left
//! it over nine tenths full.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Instant;

use crate::authfail::key;

/// Opens per second an address may make, by default (`--session-opens-per-address`).
pub const PER_S: u32 = 100;
/// The burst: this many seconds of an address's rate.
pub const BURST_SECONDS: u32 = 10;
/// Addresses tracked at most.
pub const MAX_ADDRESSES: usize = 100_000;

/// Opens left per address, as of when it was last seen.
pub struct OpenBudget {
    /// Opens per second (0: no budget).
    rate: f64,
    left: Mutex<HashMap<IpAddr, (f64, Instant)>>,
}

impl Default for OpenBudget {
    fn default() -> Self {
        OpenBudget::new(PER_S)
    }
}

impl OpenBudget {
    /// `per_s` opens a second per address, [`BURST_SECONDS`] of them at once (0: no budget).
    pub fn new(per_s: u32) -> OpenBudget {
        OpenBudget {
            rate: f64::from(per_s),
            left: Mutex::default(),
        }
    }

    /// The opens per second allowed (0: no budget).
    pub fn per_s(&self) -> u32 {
        self.rate as u32
    }

    /// The opens allowed at once.
    pub fn burst(&self) -> u32 {
        (self.rate * f64::from(BURST_SECONDS)) as u32
    }

    fn refilled(&self, (left, at): (f64, Instant), now: Instant) -> f64 {
        let burst = f64::from(self.burst());
        (left + now.saturating_duration_since(at).as_secs_f64() * self.rate).min(burst)
    }

    /// Takes one open for `ip` at `now`; `Err(ms)`: none left, one is back in `ms`.
    pub fn take(&self, ip: IpAddr, now: Instant) -> Result<(), u64> {
        if self.rate == 0.0 {
            return Ok(());
        }
        let burst = f64::from(self.burst());
        let mut map = self.left.lock().expect("open budget lock");
        if map.len() >= MAX_ADDRESSES {
            map.retain(|_, e| self.refilled(*e, now) < burst);
            // Room for a tenth more before the next sweep, so a full table of partly spent
            // addresses costs one sweep per 10,000 new ones, not one per open.
            if map.len() >= MAX_ADDRESSES / 10 * 9 {
                tracing::warn!(
                    addresses = map.len(),
                    "session opens from more addresses than tracked; starting over"
                );
                map.clear();
            }
        }
        let k = key(ip);
        let (left, at) = match map.get(&k) {
            // A caller that read the clock before another took the lock: never back in time.
            Some(&(left, at)) => (self.refilled((left, at), now), now.max(at)),
            None => (burst, now),
        };
        if left < 1.0 {
            return Err(((1.0 - left) / self.rate * 1000.0).ceil() as u64);
        }
        map.insert(k, (left - 1.0, at));
        Ok(())
    }

    /// Addresses tracked now.
    pub fn tracked(&self) -> usize {
        self.left.lock().expect("open budget lock").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_address_opens_its_burst_then_its_rate() {
        let b = OpenBudget::new(10);
        let (a, other): (IpAddr, IpAddr) =
            ("10.0.0.5".parse().unwrap(), "10.0.0.6".parse().unwrap());
        let t0 = Instant::now();
        for _ in 0..100 {
            assert_eq!(b.take(a, t0), Ok(()));
        }
        assert_eq!(b.take(a, t0), Err(100), "one more in 100 ms at 10/s");
        assert_eq!(b.take(other, t0), Ok(()), "another address is not affected");
        assert_eq!(b.take(a, t0 + Duration::from_millis(100)), Ok(()));
        assert!(b.take(a, t0 + Duration::from_millis(100)).is_err());
        // Idle time refills the whole burst, no more.
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..100 {
            assert_eq!(b.take(a, later), Ok(()));
        }
        assert!(b.take(a, later).is_err());
        assert!(
            b.take("::ffff:10.0.0.5".parse().unwrap(), later).is_err(),
            "mapped v4"
        );
    }

    #[test]
    fn a_rate_of_zero_is_no_budget() {
        let b = OpenBudget::new(0);
        let (a, t0): (IpAddr, _) = ("10.0.0.5".parse().unwrap(), Instant::now());
        for _ in 0..10_000 {
            assert_eq!(b.take(a, t0), Ok(()));
        }
        assert_eq!(b.tracked(), 0);
    }

    #[test]
    fn the_table_is_bounded() {
        let b = OpenBudget::default();
        let t0 = Instant::now();
        for i in 0..(MAX_ADDRESSES as u32 + 10) {
            let _ = b.take(IpAddr::V4(std::net::Ipv4Addr::from(i)), t0);
        }
        assert!(b.tracked() <= MAX_ADDRESSES, "{}", b.tracked());
    }
}
