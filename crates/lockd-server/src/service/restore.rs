//! The service's side of backup and restore (`backup.rs` has the documents and the files): the
//! backup call, and the gate of a restored node, which serves no name until every lock group's
//! revision is raised to the seed's floor.

use lockd_core::{Op, Stats};
use lockd_raft::{GroupId, META_GROUP};

use crate::ask::{answer_of, Query};
use crate::backup::{unix_ms_now, Backup, GroupBackup, RestoreSeed, BACKUP_FORMAT};
use crate::error::{ApiError, ErrorCode};
use crate::service::{Credentials, Service};

impl Service {
    /// `GET /v1/admin/backup`: every lock group's revision and counts (each a linearizable
    /// read of its leader), and the namespaces.
    pub async fn backup(&self, creds: &Credentials) -> Result<Backup, ApiError> {
        self.require_admin(creds, "taking a backup")?;
        // A node whose restore is pending may be in a cluster whose groups are not raised yet:
        // a backup now could record revisions below the tokens the old cluster granted.
        self.check_not_restoring()?;
        let meta = self.route_of(META_GROUP)?;
        let (namespaces_version, namespaces) =
            answer_of!(self, &meta, Query::NamespaceConfig, NamespaceConfig)?;
        let records = answer_of!(self, &meta, Query::Groups, Groups)?;
        let ids: Vec<GroupId> = if records.is_empty() {
            (1..=self.lock_groups).collect()
        } else {
            records.keys().copied().collect()
        };
        let mut groups = Vec::with_capacity(ids.len());
        for g in ids {
            let route = self.route_of(g)?;
            let s: Stats = answer_of!(self, &route, Query::Stats, Stats)?;
            groups.push(GroupBackup {
                group: g,
                revision: s.revision,
                sessions: s.sessions,
                locks: s.locks,
                holds: s.holds,
                waiters: s.waiters,
            });
        }
        Ok(Backup {
            format: BACKUP_FORMAT,
            lockd_version: env!("CARGO_PKG_VERSION").to_string(),
            taken_at_unix_ms: unix_ms_now(),
            max_revision: groups.iter().map(|g| g.revision).max().unwrap_or(0),
            groups,
            namespaces_version,
            namespaces,
        })
    }

    /// Part of a restored node's bootstrap: done once every lock group's revision is at least
    /// the seed's floor. The node raises the groups it leads itself (idempotent: a revision is
    /// never lowered); a bare raise is a leader-only command that no peer forwards
    /// (`Op::leader_only`), so each other group waits for its own leader, every founding node
    /// being restored too. A group led by a node that was not restored is never raised: this
    /// node then stays closed and says so, rather than serve tokens below the backup's.
    pub(crate) async fn raise_to_floor(&self, seed: &RestoreSeed) -> Result<(), ApiError> {
        let (floor, min_floor) = (seed.floor, seed.min_floor);
        // The groups this node leads first, so that no other node waits on them while this one
        // waits on a group it does not lead.
        let mut others = Vec::new();
        for g in self.lock_group_ids() {
            let route = self.route_of(g)?;
            if let lockd_raft::Route::Local(group) = &route {
                if group.status().is_leader {
                    self.propose(&route, Op::RaiseRevision { floor }).await?;
                    continue;
                }
            }
            others.push((g, route));
        }
        for (g, route) in others {
            let s: Stats = answer_of!(self, &route, Query::Stats, Stats)?;
            if s.revision < min_floor {
                return Err(ApiError::new(
                    ErrorCode::Unavailable,
                    format!(
                        "lock group {g} is at revision {}, below the restore's floor {min_floor}: \
                         its leader raises it on its start from a restored dir (restore every \
                         founding node from the same backup)",
                        s.revision
                    ),
                )
                .retry_after(500));
            }
        }
        Ok(())
    }

    /// Records that this node was restored from a backup (`seed`, read from its data dir at
    /// start): it serves no name until every lock group's revision is raised to the floor.
    pub(crate) fn restore_pending(&mut self, seed: RestoreSeed) {
        tracing::info!(
            floor = seed.floor,
            backup_max_revision = seed.backup_max_revision,
            bump = seed.bump,
            "restored from a backup: no name is served until every lock group's revision is \
             raised to the floor"
        );
        self.restore = std::sync::Mutex::new(Some(seed));
    }

    /// The pending restore's seed, if this node was restored and has not applied it yet.
    pub fn pending_restore(&self) -> Option<RestoreSeed> {
        self.restore.lock().expect("restore lock").clone()
    }

    /// The restore is applied: the node may serve names.
    pub(crate) fn restore_applied(&self) {
        *self.restore.lock().expect("restore lock") = None;
    }

    /// 503 while a restore is pending on this node.
    pub(crate) fn check_not_restoring(&self) -> Result<(), ApiError> {
        match &*self.restore.lock().expect("restore lock") {
            None => Ok(()),
            Some(seed) => Err(ApiError::new(
                ErrorCode::Unavailable,
                format!(
                    "this node was restored from a backup and serves no name or session until \
                     every lock group's fencing revision is raised to {} (moments after the \
                     cluster has a leader)",
                    seed.floor
                ),
            )
            .retry_after(500)),
        }
    }
}
