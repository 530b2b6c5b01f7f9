//! Leader election on a lock name: campaign, observe, resign.

use std::future::Future;
use std::time::Duration;

use crate::{Client, Error, LockGuard};

/// An election on one name, e.g. `"leaders/partition-9"`: the holder of the exclusive lock is
/// the leader, its owner string says who it is, and its fencing token numbers its term.
#[derive(Clone, Debug)]
pub struct Election {
    client: Client,
    name: String,
}

/// Who leads, as [`Election::observe`] sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    /// The leader's campaign value (its owner string), e.g. `"node-7 10.0.0.7:9000"`.
    pub value: String,
    /// Its fencing token: a larger token is a later leadership.
    pub token: u64,
    /// The leader's session id: empty unless this client presents the admin token (a session
    /// id is its session's capability, so the service shows it only to the admin).
    pub session_id: String,
}

/// One leadership won by [`Election::run`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Term {
    /// The leadership's fencing token: fence every side effect with it. Later terms (of any
    /// candidate) have larger tokens.
    pub token: u64,
    /// Which of this run's leaderships it is: 1 for the first, 2 after one loss, ...
    pub number: u32,
}

/// Won leadership. Lead while it lasts; stop at once when [`lost`](Leadership::lost) fires.
#[derive(Debug)]
#[must_use = "dropping leadership resigns"]
pub struct Leadership {
    guard: LockGuard,
}

impl Client {
    /// An election on `name`.
    pub fn election(&self, name: impl Into<String>) -> Election {
        Election {
            client: self.clone(),
            name: name.into(),
        }
    }
}

impl Election {
    /// Waits in line (FIFO, woken by the pushed grant) until this process leads, announcing
    /// `value` to observers. Waits as long as it takes; race it against a timeout or shutdown
    /// signal to give up (dropping the future leaves the line).
    pub async fn campaign(&self, value: impl Into<String>) -> Result<Leadership, Error> {
        // A wait without end: the client queues again, round after round, past the longest
        // wait one request may ask for.
        let guard = self
            .client
            .acquire(self.name.clone())
            .owner(value)
            .wait(Duration::MAX)
            .await?;
        Ok(Leadership { guard })
    }

    /// Leads, and leads again after every loss, until `lead` finishes: like Curator's
    /// `LeaderSelector` with auto-requeue and client-go's `RunOrDie` in a loop.
    ///
    /// Each time this process wins, `lead` is called with the [`Term`] and its future is raced
    /// against the loss of leadership. When leadership is lost (the lease's local deadline passed,
    /// the session ended), the future is dropped (cancelled at its next `.await`) and the
    /// candidate campaigns again at the back of the line. When the future finishes, the leader
    /// resigns and `run` returns its output. To stop a candidate, drop `run`'s future (e.g. in
    /// a `select!` against a shutdown signal): a leader's lock is then released in the background.
    ///
    /// Errors that retrying cannot mend (bad name, denied, the client closed) end the run.
    pub async fn run<F, Fut>(
        &self,
        value: impl Into<String>,
        mut lead: F,
    ) -> Result<Fut::Output, Error>
    where
        F: FnMut(Term) -> Fut,
        Fut: Future,
    {
        let value = value.into();
        let mut number = 0;
        loop {
            let leadership = self.campaign(value.clone()).await?;
            number += 1;
            let term = Term {
                token: leadership.token(),
                number,
            };
            match leadership.guard.run(lead(term)).await {
                Ok(out) => return Ok(out),
                Err(_) => {
                    tracing::warn!(
                        election = %self.name,
                        token = term.token,
                        "leadership lost; campaigning again"
                    );
                }
            }
        }
    }

    /// The current leader, or `None` when nobody leads (a linearizable read).
    pub async fn observe(&self) -> Result<Option<Leader>, Error> {
        let state = self.client.inspect(&self.name).await?;
        Ok(state.holders.into_iter().next().map(|h| Leader {
            value: h.owner,
            token: h.fencing_token,
            session_id: h.session_id,
        }))
    }

    /// The leader now, then at every change: a new leader (a larger token), or nobody. Pushed
    /// by the service's watch, so no polling and no missed or repeated change, across a node
    /// that stops.
    pub fn leaders(&self) -> Leaders {
        Leaders {
            election: self.clone(),
            watcher: self.client.watch(&self.name),
            current: None,
            started: false,
        }
    }

    /// The name the election runs on.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl Leadership {
    /// The leadership's fencing token: fence every side effect with it.
    pub fn token(&self) -> u64 {
        self.guard.token()
    }

    /// Completes when leadership is lost (see [`LockGuard::lost`]).
    pub fn lost(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        self.guard.lost()
    }

    /// Whether leadership is lost.
    pub fn is_lost(&self) -> bool {
        self.guard.is_lost()
    }

    /// The lock behind the leadership.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// Steps down, letting the next candidate in line lead.
    pub async fn resign(self) -> Result<(), Error> {
        self.guard.release().await
    }
}

/// The stream of [`Election::leaders`].
pub struct Leaders {
    election: Election,
    watcher: crate::Watcher,
    current: Option<Leader>,
    started: bool,
}

impl Leaders {
    /// The leader now (the first call), then the next change.
    pub async fn next(&mut self) -> Result<Option<Leader>, Error> {
        if !self.started {
            // Watch first, then read: a change in between shows up in the watch, and the
            // token comparison below drops what the read already saw.
            self.watcher.open().await?;
            self.current = self.election.observe().await?;
            self.started = true;
            return Ok(self.current.clone());
        }
        loop {
            let e = self.watcher.next().await?;
            let now = self.current.as_ref().map(|l| l.token);
            match e.kind.as_str() {
                "hold_started" if now.is_none_or(|t| e.fencing_token > t) => {
                    self.current = Some(Leader {
                        value: e.owner,
                        token: e.fencing_token,
                        session_id: e.session_id,
                    });
                    return Ok(self.current.clone());
                }
                "hold_ended" if now == Some(e.fencing_token) => {
                    self.current = None;
                    return Ok(None);
                }
                _ => {}
            }
        }
    }
}
