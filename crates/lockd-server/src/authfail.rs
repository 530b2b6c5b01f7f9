//! A budget of failed authentications per client address.
//!
//! A bearer token is guessed one request at a time; without a limit, a client on the network
//! could try thousands per second against a namespace's token or the admin's. Each address may
//! fail [`BURST`] times in a row, then one more time per [`REFILL_S`] seconds. An address with
//! nothing left is answered `429 rate_limited` (with `Retry-After`) for every call that needs a
//! credential checked, *before* its credential is looked at, so a right guess cannot be told
//! from a wrong one while the budget is spent. Calls that need no credential (an open
//! namespace) go on. IPv6 addresses count by /64, the block one host usually holds.
//!
//! An address that is out of budget can still be shared by good clients (a NAT, a host running
//! two services, one of them with a stale token). So a (address, token) pair that passed a
//! check recently skips the pre-check: the budget stops guessing, and a token that works is no
//! guess. Such a pair that then fails (its token was rotated out) counts as a failure and is
//! forgotten.
//!
//! Memory is bounded: at most [`MAX_ADDRESSES`] addresses are tracked; beyond that, addresses
//! whose budget has refilled are dropped first, then the whole table (failing open on a flood
//! from more addresses than that, rather than growing without bound).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Instant;

/// Failures an address may make in a row, by default (`--auth-failure-burst`).
pub const BURST: u32 = 20;
/// Seconds for one more failure to be allowed.
pub const REFILL_S: f64 = 1.0;
/// Addresses tracked at most.
pub const MAX_ADDRESSES: usize = 100_000;

/// Failures left per address, as of when it was last seen.
pub struct AuthFailures {
    /// Failures in a row; 0: no budget (every call's token is checked).
    burst: f64,
    left: Mutex<HashMap<IpAddr, (f64, Instant)>>,
    /// (address, keyed hash of the token) pairs that passed a check: they skip the pre-check.
    good: Mutex<std::collections::HashSet<(IpAddr, u64)>>,
    /// The key of those hashes (random per process: the table holds no token).
    hasher: std::collections::hash_map::RandomState,
}

impl Default for AuthFailures {
    fn default() -> Self {
        AuthFailures::new(BURST)
    }
}

/// The key an address counts under: itself, or its /64 for IPv6.
pub(crate) fn key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

fn refilled((left, at): (f64, Instant), now: Instant, burst: f64) -> f64 {
    (left + now.saturating_duration_since(at).as_secs_f64() / REFILL_S).min(burst)
}

impl AuthFailures {
    /// A budget of `burst` failures in a row (0: none, nothing is refused).
    pub fn new(burst: u32) -> AuthFailures {
        AuthFailures {
            burst: f64::from(burst),
            left: Mutex::default(),
            good: Mutex::default(),
            hasher: Default::default(),
        }
    }

    fn pair(&self, ip: IpAddr, token: &str) -> (IpAddr, u64) {
        use std::hash::BuildHasher as _;
        (key(ip), self.hasher.hash_one(token))
    }

    /// Whether `token` passed a check from `ip` recently (then the pre-check is skipped).
    pub fn known_good(&self, ip: IpAddr, token: &str) -> bool {
        let pair = self.pair(ip, token);
        self.good.lock().expect("auth good lock").contains(&pair)
    }

    /// `token` passed a check from `ip`.
    pub fn succeeded(&self, ip: IpAddr, token: &str) {
        if self.burst == 0.0 {
            return;
        }
        let pair = self.pair(ip, token);
        let mut good = self.good.lock().expect("auth good lock");
        if good.len() >= MAX_ADDRESSES && !good.contains(&pair) {
            good.clear();
        }
        good.insert(pair);
    }

    /// `token` failed a check from `ip`: it is no longer known good there.
    pub fn forget(&self, ip: IpAddr, token: &str) {
        let pair = self.pair(ip, token);
        self.good.lock().expect("auth good lock").remove(&pair);
    }

    /// The failures allowed in a row.
    pub fn burst(&self) -> u32 {
        self.burst as u32
    }

    /// `Err(ms)`: `ip` has no failure left; one is back in `ms`.
    pub fn check(&self, ip: IpAddr, now: Instant) -> Result<(), u64> {
        if self.burst == 0.0 {
            return Ok(());
        }
        let map = self.left.lock().expect("auth failures lock");
        let Some(&entry) = map.get(&key(ip)) else {
            return Ok(());
        };
        let left = refilled(entry, now, self.burst);
        if left >= 1.0 {
            Ok(())
        } else {
            Err(((1.0 - left) * REFILL_S * 1000.0).ceil() as u64)
        }
    }

    /// `ip` failed to authenticate.
    pub fn failed(&self, ip: IpAddr, now: Instant) {
        if self.burst == 0.0 {
            return;
        }
        let burst = self.burst;
        let mut map = self.left.lock().expect("auth failures lock");
        if map.len() >= MAX_ADDRESSES {
            map.retain(|_, e| refilled(*e, now, burst) < burst);
            if map.len() >= MAX_ADDRESSES {
                tracing::warn!(
                    addresses = map.len(),
                    "failed authentications from more addresses than tracked; starting over"
                );
                map.clear();
            }
        }
        let k = key(ip);
        let left = map.get(&k).map_or(burst, |e| refilled(*e, now, burst));
        map.insert(k, ((left - 1.0).max(0.0), now));
    }

    /// Addresses tracked now.
    pub fn tracked(&self) -> usize {
        self.left.lock().expect("auth failures lock").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_address_fails_its_burst_then_one_per_second() {
        let f = AuthFailures::default();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.5".parse().unwrap(), "10.0.0.6".parse().unwrap());
        let t0 = Instant::now();
        for _ in 0..BURST {
            assert_eq!(f.check(a, t0), Ok(()));
            f.failed(a, t0);
        }
        assert_eq!(f.check(a, t0), Err(1000));
        assert_eq!(f.check(b, t0), Ok(()), "another address is not affected");
        assert_eq!(f.check(a, t0 + Duration::from_millis(400)), Err(600));
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(f.check(a, t1), Ok(()));
        f.failed(a, t1);
        assert!(f.check(a, t1).is_err(), "one more failure, then none");
        // Idle time refills the whole burst, no more.
        let later = t1 + Duration::from_secs(3600);
        for _ in 0..BURST {
            assert_eq!(f.check(a, later), Ok(()));
            f.failed(a, later);
        }
        assert!(f.check(a, later).is_err());
    }

    #[test]
    fn a_token_that_worked_from_an_address_is_known_there_until_it_fails() {
        let f = AuthFailures::default();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.5".parse().unwrap(), "10.0.0.6".parse().unwrap());
        assert!(!f.known_good(a, "right"));
        f.succeeded(a, "right");
        assert!(f.known_good(a, "right"));
        assert!(!f.known_good(a, "wrong"), "another token");
        assert!(!f.known_good(b, "right"), "another address");
        f.forget(a, "right");
        assert!(!f.known_good(a, "right"));
    }

    #[test]
    fn a_burst_of_zero_is_no_budget() {
        let f = AuthFailures::new(0);
        let (a, t0): (IpAddr, _) = ("10.0.0.5".parse().unwrap(), Instant::now());
        for _ in 0..1000 {
            f.failed(a, t0);
        }
        assert_eq!(f.check(a, t0), Ok(()));
        assert_eq!(f.tracked(), 0);
    }

    #[test]
    fn ipv6_counts_by_64_and_mapped_v4_as_v4() {
        let f = AuthFailures::default();
        let t0 = Instant::now();
        for i in 0..BURST as u16 {
            let ip: IpAddr = format!("2001:db8:1:2::{i:x}").parse().unwrap();
            f.failed(ip, t0);
        }
        assert!(f
            .check("2001:db8:1:2:ffff::1".parse().unwrap(), t0)
            .is_err());
        assert!(f.check("2001:db8:1:3::1".parse().unwrap(), t0).is_ok());
        for _ in 0..BURST {
            f.failed("::ffff:10.1.1.1".parse().unwrap(), t0);
        }
        assert!(f.check("10.1.1.1".parse().unwrap(), t0).is_err());
    }

    #[test]
    fn the_table_is_bounded() {
        let f = AuthFailures::default();
        let t0 = Instant::now();
        for i in 0..(MAX_ADDRESSES as u32 + 10) {
            f.failed(IpAddr::V4(std::net::Ipv4Addr::from(i)), t0);
        }
        assert!(f.tracked() <= MAX_ADDRESSES, "{}", f.tracked());
    }
}
