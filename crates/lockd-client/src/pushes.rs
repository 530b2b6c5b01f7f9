//! Which waiting acquire a pushed `granted` or `wait_ended` answers: pure bookkeeping, no I/O.
//!
//! A wait is queued by a request on the session stream and answered later by a push that names
//! it by `(group, waiter)`. Four things can come between the two, and each has a rule here:
//! - **The push comes first.** The local replica may apply the grant before the `queued` reply
//!   reaches the client. A push for an unknown waiter is kept while an acquire of the same name
//!   is still unanswered on the stream.
//! - **The same outcome is pushed twice** (the stream's node and a relay both deliver it). The
//!   waiters answered lately are remembered, and a second push for one is dropped: it must never
//!   be mistaken for an orphan and released under a live guard.
//! - **The stream breaks while a wait is queued.** The wait lives on in the group (it belongs to
//!   the session, not to the stream), so the caller's retry is refused `already_waiting` by its
//!   own first attempt. Such `(name, owner)` pairs are *strays*: a retry refused that way adopts
//!   the queued wait and takes the next push for the name.
//! - **Nobody is left to take a grant** (the wait's acquire gave up after the stream broke). A
//!   grant pushed with no waiter, no unanswered acquire of its name and no adopter is an
//!   *orphan*: the driver gives it back, or the lock would stay held until the session ends.
//!
//! Generic over the waiting acquire `A` so that the rules are tested without a stream.

use std::collections::{HashMap, HashSet, VecDeque};

use tokio::time::Instant;

use lockd_proto::v1 as pb;
use pb::session_event::Kind as Ev;

/// A wait as the pushes name it: its lock group and waiter id.
pub(crate) type Key = (u32, u64);

/// How many of each remembered kind (early pushes, answered waiters, strays) are kept.
const CAPACITY: usize = 4096;

/// What to do with a push.
#[derive(Debug)]
pub(crate) enum Pushed<A> {
    /// It answers this acquire.
    Answer(A, Ev),
    /// Kept for a `queued` reply still on its way.
    Kept,
    /// A second push of an outcome already given, or a wait's end nobody waits for.
    Dropped,
    /// A grant nobody will take: give it back.
    Orphan { name: String, token: u64 },
}

/// The waits of one session stream and what is known about their pushes.
pub(crate) struct Pushes<A> {
    waits: HashMap<Key, A>,
    early: HashMap<Key, Ev>,
    early_order: VecDeque<Key>,
    answered: HashSet<Key>,
    answered_order: VecDeque<Key>,
    /// Each stray's first attempt's send time: an adopted wait may have been granted before
    /// the retry was sent, so its lease is counted from the first attempt (`lease.rs`).
    strays: HashMap<(String, String), Instant>,
    adopters: HashMap<String, VecDeque<A>>,
}

impl<A> Default for Pushes<A> {
    fn default() -> Self {
        Pushes {
            waits: HashMap::new(),
            early: HashMap::new(),
            early_order: VecDeque::new(),
            answered: HashSet::new(),
            answered_order: VecDeque::new(),
            strays: HashMap::new(),
            adopters: HashMap::new(),
        }
    }
}

/// The wait a push names, and the lock's name.
fn push_key(ev: &Ev) -> Option<(Key, &str)> {
    match ev {
        Ev::Granted(g) => Some(((g.group, g.waiter), &g.name)),
        Ev::WaitEnded(w) => Some(((w.group, w.waiter), &w.name)),
        _ => None,
    }
}

impl<A> Pushes<A> {
    /// An acquire was answered `queued` as `key`: the push that came first answers it now,
    /// else it waits for one.
    pub fn queued(&mut self, key: Key, a: A) -> Option<(A, Ev)> {
        match self.early.remove(&key) {
            Some(ev) => {
                self.answered(key);
                Some((a, ev))
            }
            None => {
                self.waits.insert(key, a);
                None
            }
        }
    }

    /// A push arrived. `unanswered(name)`: an acquire of that name is still unanswered on the
    /// stream (its `queued` reply may be on the way).
    pub fn pushed(&mut self, ev: Ev, unanswered: impl Fn(&str) -> bool) -> Pushed<A> {
        let Some((key, name)) = push_key(&ev) else {
            return Pushed::Dropped;
        };
        if let Some(a) = self.waits.remove(&key) {
            self.answered(key);
            return Pushed::Answer(a, ev);
        }
        if self.answered.contains(&key) {
            return Pushed::Dropped;
        }
        if unanswered(name) {
            self.keep(key, ev);
            return Pushed::Kept;
        }
        let name = name.to_string();
        self.unclaimed_push(key, &name, ev)
    }

    /// A push no waiter and no unanswered acquire claims: an adopter's, else an orphan.
    fn unclaimed_push(&mut self, key: Key, name: &str, ev: Ev) -> Pushed<A> {
        self.answered(key);
        if let Some(q) = self.adopters.get_mut(name) {
            let a = q.pop_front();
            if q.is_empty() {
                self.adopters.remove(name);
            }
            if let Some(a) = a {
                return Pushed::Answer(a, ev);
            }
        }
        match ev {
            Ev::Granted(g) => Pushed::Orphan {
                name: g.name,
                token: g.fencing_token,
            },
            _ => Pushed::Dropped,
        }
    }

    /// The acquire of `name` by `owner` was refused `already_waiting`. A stray's retry adopts
    /// the queued wait (`Ok`: answered now by a push that came first, or later); any other
    /// acquire gets the refusal (`Err`).
    pub fn refused_waiting(&mut self, name: &str, owner: &str, a: A) -> Result<Option<(A, Ev)>, A> {
        if !self.is_stray(name, owner) {
            return Err(a);
        }
        let first = self.early_order.iter().copied().find(|k| {
            self.early
                .get(k)
                .and_then(push_key)
                .is_some_and(|(_, n)| n == name)
        });
        if let Some(key) = first {
            if let Some(ev) = self.early.remove(&key) {
                self.answered(key);
                return Ok(Some((a, ev)));
            }
        }
        self.adopters
            .entry(name.to_string())
            .or_default()
            .push_back(a);
        Ok(None)
    }

    /// Whether `(name, owner)`'s last acquire lost its outcome with a broken stream.
    pub fn is_stray(&self, name: &str, owner: &str) -> bool {
        self.strays
            .contains_key(&(name.to_string(), owner.to_string()))
    }

    /// The acquire of `name` by `owner` got an answer other than `already_waiting`: it is not
    /// a stray any more.
    pub fn settled(&mut self, name: &str, owner: &str) {
        if !self.strays.is_empty() {
            self.strays.remove(&(name.to_string(), owner.to_string()));
        }
    }

    /// Kept pushes of `name` that no acquire can claim any more (no acquire of the name is
    /// unanswered): each goes to an adopter, or is an orphan if a grant.
    pub fn unclaimed(&mut self, name: &str, unanswered: impl Fn(&str) -> bool) -> Vec<Pushed<A>> {
        if self.early.is_empty() || unanswered(name) {
            return Vec::new();
        }
        let keys: Vec<Key> = self
            .early_order
            .iter()
            .copied()
            .filter(|k| {
                self.early
                    .get(k)
                    .and_then(push_key)
                    .is_some_and(|(_, n)| n == name)
            })
            .collect();
        let mut out = Vec::new();
        for key in keys {
            if let Some(ev) = self.early.remove(&key) {
                out.push(self.unclaimed_push(key, name, ev));
            }
        }
        self.early_order.retain(|k| self.early.contains_key(k));
        out.retain(|p| !matches!(p, Pushed::Dropped));
        out
    }

    /// Whether a queued wait or an adopter matches `f` (its grant may come at any time).
    /// The groups the queued waits live in (each once).
    pub fn wait_groups(&self) -> Vec<u32> {
        let groups: std::collections::BTreeSet<u32> = self.waits.keys().map(|k| k.0).collect();
        groups.into_iter().collect()
    }

    /// Whether an acquire whose outcome a broken stream took is still unsettled (its wait or
    /// hold may live in a group nobody can name yet).
    pub fn has_strays(&self) -> bool {
        !self.strays.is_empty() || self.adopters.values().any(|q| !q.is_empty())
    }

    pub fn waiting(&self, f: impl Fn(&A) -> bool) -> bool {
        self.waits.values().any(&f) || self.adopters.values().flatten().any(&f)
    }

    /// Hands back the adopters `expired` says have waited long enough for a push (a wait in a
    /// group whose outcome no node relays to the new stream).
    pub fn give_up_adopters(&mut self, expired: impl Fn(&A) -> bool) -> Vec<A> {
        let mut out = Vec::new();
        for q in self.adopters.values_mut() {
            let (gone, kept): (VecDeque<A>, VecDeque<A>) = q.drain(..).partition(&expired);
            out.extend(gone);
            *q = kept;
        }
        self.adopters.retain(|_, q| !q.is_empty());
        out
    }

    /// The stream broke: its early pushes are gone with it, and every wait and adopter is
    /// handed back (their outcome is unknown; the caller marks them strays).
    pub fn broke(&mut self) -> Vec<A> {
        self.early.clear();
        self.early_order.clear();
        let mut out: Vec<A> = self.waits.drain().map(|(_, a)| a).collect();
        out.extend(self.adopters.drain().flat_map(|(_, q)| q));
        out
    }

    /// `(name, owner)`'s acquire, sent at `sent`, lost its outcome with the stream; its wait
    /// may still be queued. A stray already known keeps its earlier send time.
    pub fn stray(&mut self, name: String, owner: String, sent: Instant) {
        let key = (name, owner);
        if let Some(t) = self.strays.get_mut(&key) {
            *t = (*t).min(sent);
        } else if self.strays.len() < CAPACITY {
            self.strays.insert(key, sent);
        }
    }

    /// When the first attempt of stray `(name, owner)` was sent: the send time an adopting
    /// retry must count its grant's lease from.
    pub fn stray_since(&self, name: &str, owner: &str) -> Option<Instant> {
        self.strays
            .get(&(name.to_string(), owner.to_string()))
            .copied()
    }

    /// The session ended: everything is forgotten; the waits and adopters are handed back.
    pub fn end(&mut self) -> Vec<A> {
        let out = self.broke();
        self.answered.clear();
        self.answered_order.clear();
        self.strays.clear();
        out
    }

    fn keep(&mut self, key: Key, ev: Ev) {
        if self.early.insert(key, ev).is_none() {
            self.early_order.push_back(key);
            while self.early_order.len() > CAPACITY {
                if let Some(old) = self.early_order.pop_front() {
                    self.early.remove(&old);
                }
            }
        }
    }

    fn answered(&mut self, key: Key) {
        if self.answered.insert(key) {
            self.answered_order.push_back(key);
            while self.answered_order.len() > CAPACITY {
                if let Some(old) = self.answered_order.pop_front() {
                    self.answered.remove(&old);
                }
            }
        }
    }
}

/// An acquire whose outcome was lost: `(name, owner)`.
pub(crate) type Unsure = (String, String);
/// A hold the service lists for the session: `(name, fencing token)`.
pub(crate) type ListedHold = (String, u64);

/// What to do with the holds the service lists for the session after an acquire's outcome was
/// lost (`unsure`): each listed hold of an unsure name that no guard knows (`known(name,
/// token)`) is given back, so the caller's retry starts clean. A name with an acquire or a
/// wait still open (`open`) is left for later: the listed hold may be that acquire's grant,
/// whose answer has not come yet, and giving it back would leave its guard holding nothing.
/// Returns the holds to give back and the unsure pairs to settle later.
pub(crate) fn settle(
    unsure: Vec<Unsure>,
    listed: &[ListedHold],
    known: impl Fn(&str, u64) -> bool,
    open: impl Fn(&str) -> bool,
) -> (Vec<ListedHold>, Vec<Unsure>) {
    let mut give_back = Vec::new();
    let mut later: Vec<Unsure> = Vec::new();
    let mut done = HashSet::new();
    for (name, owner) in unsure {
        if open(&name) {
            if !later.iter().any(|(n, o)| *n == name && *o == owner) {
                later.push((name, owner));
            }
            continue;
        }
        if !done.insert(name.clone()) {
            continue;
        }
        for (n, token) in listed {
            if *n == name && !known(n, *token) {
                give_back.push((name.clone(), *token));
            }
        }
    }
    (give_back, later)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn granted(waiter: u64, name: &str, token: u64) -> Ev {
        Ev::Granted(pb::Granted {
            group: 1,
            waiter,
            name: name.into(),
            fencing_token: token,
            ..Default::default()
        })
    }

    fn ended(waiter: u64, name: &str) -> Ev {
        Ev::WaitEnded(pb::WaitEnded {
            group: 1,
            waiter,
            name: name.into(),
            reason: "timed_out".into(),
        })
    }

    const NONE: fn(&str) -> bool = |_| false;
    const ALL: fn(&str) -> bool = |_| true;

    #[test]
    fn a_push_answers_its_queued_wait_once() {
        let mut p = Pushes::default();
        assert!(p.queued((1, 7), "a").is_none());
        assert!(matches!(
            p.pushed(granted(7, "x", 42), NONE),
            Pushed::Answer("a", _)
        ));
        // The same outcome pushed again (a relay and the local replica) is no orphan.
        assert!(matches!(
            p.pushed(granted(7, "x", 42), NONE),
            Pushed::Dropped
        ));
    }

    #[test]
    fn a_push_before_its_queued_reply_waits_for_it() {
        let mut p = Pushes::default();
        assert!(matches!(p.pushed(granted(7, "x", 42), ALL), Pushed::Kept));
        let (a, ev) = p.queued((1, 7), "a").expect("the kept push answers");
        assert_eq!(a, "a");
        assert!(matches!(ev, Ev::Granted(g) if g.fencing_token == 42));
        assert!(p.unclaimed("x", NONE).is_empty());
    }

    #[test]
    fn a_grant_nobody_waits_for_is_an_orphan() {
        let mut p: Pushes<&str> = Pushes::default();
        match p.pushed(granted(9, "x", 50), NONE) {
            Pushed::Orphan { name, token } => assert_eq!((name.as_str(), token), ("x", 50)),
            other => panic!("{other:?}"),
        }
        // Pushed again: given back once only.
        assert!(matches!(
            p.pushed(granted(9, "x", 50), NONE),
            Pushed::Dropped
        ));
        assert!(matches!(p.pushed(ended(10, "x"), NONE), Pushed::Dropped));
    }

    #[test]
    fn a_kept_grant_that_no_reply_claims_is_an_orphan() {
        let mut p: Pushes<&str> = Pushes::default();
        // Kept while another acquire of "x" (another owner) was unanswered ...
        assert!(matches!(p.pushed(granted(9, "x", 50), ALL), Pushed::Kept));
        // ... which was queued under another waiter.
        assert!(p.queued((1, 11), "b").is_none());
        assert!(p.unclaimed("x", ALL).is_empty(), "still claimable");
        let out = p.unclaimed("x", NONE);
        assert!(
            matches!(&out[..], [Pushed::Orphan { name, token: 50 }] if name == "x"),
            "{out:?}"
        );
        assert!(p.unclaimed("x", NONE).is_empty());
        assert!(matches!(
            p.pushed(granted(11, "x", 51), NONE),
            Pushed::Answer("b", _)
        ));
    }

    #[test]
    fn a_strays_retry_adopts_its_queued_wait() {
        let mut p = Pushes::default();
        assert!(p.queued((1, 7), "first").is_none());
        let lost = p.broke();
        assert_eq!(lost, vec!["first"]);
        p.stray("x".into(), "me".into(), Instant::now());
        // Someone else's refusal is theirs.
        assert_eq!(p.refused_waiting("x", "other", "o").unwrap_err(), "o");
        assert!(p.refused_waiting("x", "me", "retry").unwrap().is_none());
        assert!(matches!(
            p.pushed(granted(7, "x", 42), NONE),
            Pushed::Answer("retry", _)
        ));
        // Answered: no longer a stray.
        assert!(p.is_stray("x", "me"));
        p.settled("x", "me");
        assert!(!p.is_stray("x", "me"));
        assert_eq!(p.refused_waiting("x", "me", "again").unwrap_err(), "again");
    }

    #[test]
    fn a_stray_keeps_its_first_attempts_send_time() {
        let mut p: Pushes<&str> = Pushes::default();
        let first = Instant::now();
        p.stray("x".into(), "me".into(), first);
        p.stray(
            "x".into(),
            "me".into(),
            first + std::time::Duration::from_secs(1),
        );
        assert_eq!(p.stray_since("x", "me"), Some(first));
        assert_eq!(p.stray_since("x", "other"), None);
    }

    #[test]
    fn a_strays_grant_pushed_before_the_refusal_answers_the_retry() {
        let mut p: Pushes<&str> = Pushes::default();
        p.stray("x".into(), "me".into(), Instant::now());
        // The retry is unanswered when the grant comes: kept.
        assert!(matches!(p.pushed(granted(7, "x", 42), ALL), Pushed::Kept));
        let (a, ev) = p
            .refused_waiting("x", "me", "retry")
            .unwrap()
            .expect("answered");
        assert_eq!(a, "retry");
        assert!(matches!(ev, Ev::Granted(g) if g.fencing_token == 42));
    }

    #[test]
    fn a_kept_grant_goes_to_an_adopter_before_it_is_called_an_orphan() {
        let mut p: Pushes<&str> = Pushes::default();
        p.stray("x".into(), "me".into(), Instant::now());
        assert!(p.refused_waiting("x", "me", "retry").unwrap().is_none());
        // Another owner's acquire of "x" is unanswered: the grant is kept ...
        assert!(matches!(p.pushed(granted(7, "x", 42), ALL), Pushed::Kept));
        // ... and that acquire was answered at once; the adopter takes the grant.
        let out = p.unclaimed("x", NONE);
        assert!(matches!(&out[..], [Pushed::Answer("retry", _)]), "{out:?}");
    }

    #[test]
    fn adopters_that_waited_too_long_are_handed_back() {
        let mut p = Pushes::default();
        p.stray("x".into(), "me".into(), Instant::now());
        p.stray("y".into(), "me".into(), Instant::now());
        assert!(p.refused_waiting("x", "me", 1).unwrap().is_none());
        assert!(p.refused_waiting("y", "me", 2).unwrap().is_none());
        assert_eq!(p.give_up_adopters(|a| *a == 1), vec![1]);
        assert!(p.give_up_adopters(|a| *a == 1).is_empty());
        // The other still takes its push.
        assert!(matches!(
            p.pushed(granted(7, "y", 42), NONE),
            Pushed::Answer(2, _)
        ));
    }

    #[test]
    fn settling_gives_back_only_holds_no_guard_and_no_open_acquire_can_claim() {
        let unsure = vec![
            ("x".to_string(), "me".to_string()),
            ("x".to_string(), "me".to_string()),
            ("y".to_string(), "me".to_string()),
            ("z".to_string(), "me".to_string()),
        ];
        let listed = [
            ("x".to_string(), 10),
            ("x".to_string(), 11),
            ("y".to_string(), 20),
            ("z".to_string(), 30),
            ("w".to_string(), 40),
        ];
        // A guard holds x's 11; an acquire of z is still open (30 may be its grant).
        let (back, later) = settle(unsure, &listed, |n, t| (n, t) == ("x", 11), |n| n == "z");
        assert_eq!(back, vec![("x".to_string(), 10), ("y".to_string(), 20)]);
        assert_eq!(later, vec![("z".to_string(), "me".to_string())]);
    }

    #[test]
    fn a_queued_wait_or_an_adopter_keeps_its_name_open() {
        let mut p = Pushes::default();
        assert!(!p.waiting(|a: &&str| a.starts_with('x')));
        assert!(p.queued((1, 7), "x-wait").is_none());
        assert!(p.waiting(|a| a.starts_with('x')));
        p.stray("y".into(), "me".into(), Instant::now());
        assert!(p.refused_waiting("y", "me", "y-adopter").unwrap().is_none());
        assert!(p.waiting(|a| a.starts_with('y')));
        assert!(!p.waiting(|a| a.starts_with('z')));
    }

    #[test]
    fn the_end_of_a_session_hands_back_waits_and_adopters() {
        let mut p = Pushes::default();
        assert!(p.queued((1, 7), "w").is_none());
        p.stray("x".into(), "me".into(), Instant::now());
        assert!(p.refused_waiting("x", "me", "adopter").unwrap().is_none());
        let mut out = p.end();
        out.sort();
        assert_eq!(out, vec!["adopter", "w"]);
        assert_eq!(p.refused_waiting("x", "me", "z").unwrap_err(), "z");
    }
}
