//! [`Client::watch`](crate::Client::watch): the changes of a name or a prefix as they happen.

use std::sync::Arc;

use lockd_proto::v1 as pb;

use crate::session::Core;
use crate::Error;

/// One change, as the service sends it (`kind`: `hold_started`, `hold_ended`,
/// `hold_moved_out`, `hold_moved_in`, `wait_started` or `wait_ended`; docs/API.md, *Watch*).
pub type WatchEvent = pb::WatchEvent;

/// An open watch. It survives a node that stops answering, and a cut-off for falling behind:
/// it reconnects (to the next node if need be) and resumes where it was, so no event is missed
/// or repeated. It ends with an error the caller must act on: `watch_compacted` (re-read the
/// names, then watch again), a credential refused, or a bad request.
pub struct Watcher {
    core: Arc<Core>,
    req: pb::WatchRequest,
    stream: Option<tonic::Streaming<pb::WatchEvent>>,
    /// Consecutive reconnects that found no node, for backing off.
    failures: u32,
    /// Nodes in a row that no longer kept the watch's position.
    compacted: usize,
}

impl Watcher {
    pub(crate) fn new(core: Arc<Core>, name: String, prefix: String) -> Watcher {
        Watcher {
            core,
            req: pb::WatchRequest {
                name,
                prefix,
                after: Vec::new(),
            },
            stream: None,
            failures: 0,
            compacted: 0,
        }
    }

    /// Where the watch is: what it would resume after.
    pub fn positions(&self) -> &[pb::WatchPosition] {
        &self.req.after
    }

    /// Opens the stream now (a watch opens lazily, at its first [`next`](Self::next)): what
    /// changes from here on is delivered. Read the current state after this, never before, and
    /// no change falls between the read and the watch.
    pub async fn open(&mut self) -> Result<(), Error> {
        if self.stream.is_none() {
            self.stream = Some(self.core.watch(self.req.clone()).await?);
        }
        Ok(())
    }

    /// The next change.
    pub async fn next(&mut self) -> Result<WatchEvent, Error> {
        loop {
            if self.stream.is_none() {
                match self.core.watch(self.req.clone()).await {
                    Ok(s) => self.stream = Some(s),
                    Err(e) if self.elsewhere(&e) => continue,
                    Err(e) if resumable(&e) && self.failures < 20 => {
                        self.failures += 1;
                        let delay = self.core.retry_delay(self.failures, e.retry_after());
                        tokio::time::sleep(delay).await;
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            let stream = self.stream.as_mut().expect("opened above");
            match stream.message().await {
                Ok(Some(e)) => {
                    self.failures = 0;
                    self.compacted = 0;
                    self.req.after = e.resume.clone();
                    return Ok(e);
                }
                // The node is stopping: resume on the next one.
                Ok(None) => {
                    self.stream = None;
                    self.core.rotate_preferred();
                }
                Err(s) => {
                    let e = Error::from(s);
                    self.stream = None;
                    if self.elsewhere(&e) {
                        continue;
                    }
                    if !resumable(&e) {
                        return Err(e);
                    }
                    self.core.rotate_preferred();
                }
            }
        }
    }
}

impl Watcher {
    /// A node that no longer keeps the watch's position (a restarted node whose snapshot
    /// covers it): another may still, so try each once before giving the error to the caller.
    fn elsewhere(&mut self, e: &Error) -> bool {
        let compacted = matches!(e, Error::Api { code, .. } if code == "watch_compacted");
        if !compacted || self.compacted + 1 >= self.core.endpoints() {
            return false;
        }
        self.compacted += 1;
        self.core.rotate_preferred();
        true
    }
}

/// Whether a watch ended by `e` picks up where it was by itself.
fn resumable(e: &Error) -> bool {
    matches!(e, Error::Unavailable(_))
        || matches!(e, Error::Api { code, .. } if code == "watch_too_slow" || code == "unavailable" || code == "no_leader")
}
