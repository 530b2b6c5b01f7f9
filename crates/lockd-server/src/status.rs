//! The cluster's status as one node gathers it (`lockctl status --cluster`, `GET
//! /v1/admin/cluster/status`, gRPC `Admin.ClusterStatus`): every member node's own report, asked over
//! the peer port ([`lockd_raft::NODE_CALL`]), beside the node's own. etcd's
//! `etcdctl endpoint status --cluster` is the model: version, data size, the leader and the
//! indices of every replica, and an error for each node that did not answer, so one command
//! shows a dead, lagging or mismatched node.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use lockd_raft::{GroupId, NodeId};
use serde::{Deserialize, Serialize};

use crate::ask::Ask;
use crate::error::{ApiError, ErrorCode};
use crate::service::Service;

/// How long the gatherer waits for each node's report (asked all at once).
const ASK_TIMEOUT: Duration = Duration::from_secs(3);

/// One replica of one group, as its node reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaReport {
    pub group: GroupId,
    /// `leader`, `follower` (a voter) or `learner`.
    pub role: String,
    /// The leader the replica knows of.
    pub leader: Option<NodeId>,
    pub term: u64,
    /// The group's commit index as the replica last heard it (`None`: not yet).
    pub committed_index: Option<u64>,
    pub applied_index: u64,
    /// The group's fencing-token revision as applied here.
    pub revision: u64,
    /// The replica's log and last snapshot on disk (`None` for in-memory storage).
    pub log_bytes: Option<u64>,
    pub snapshot_bytes: Option<u64>,
}

/// One node's own report (what a peer's `Ask::NodeStatus` asks).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeReport {
    pub node_id: NodeId,
    /// The node's zone (empty when it declared none).
    pub zone: String,
    /// The lockd version it runs.
    pub version: String,
    pub pid: u32,
    pub uptime_s: u64,
    /// Whether `/readyz` answers 200, and if not, why (`Service::not_ready`).
    pub ready: bool,
    pub not_ready: Vec<String>,
    pub replicas: Vec<ReplicaReport>,
}

/// A member node and what it said.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodeEntry {
    pub node_id: NodeId,
    /// Its peer address, as the group memberships record it.
    pub peer_addr: String,
    /// Its report, or why there is none (unreachable, or a version that cannot say).
    #[serde(flatten)]
    pub report: Reported,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reported {
    Report(NodeReport),
    Error(String),
}

/// When this process started (`main` marks it; an embedding without it counts from the first
/// report).
fn started() -> Instant {
    static STARTED: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    *STARTED.get_or_init(Instant::now)
}

impl NodeReport {
    /// This node's report.
    pub fn of(svc: &Service) -> NodeReport {
        let node = &svc.node;
        let me = node.node_id();
        let replicas = node
            .group_ids()
            .into_iter()
            .filter_map(|id| node.group(id))
            .map(|g| {
                let s = g.status();
                let role = if s.is_leader {
                    "leader"
                } else if s.members.contains(&me) {
                    "follower"
                } else {
                    "learner"
                };
                let disk = node.disk_usage(g.id());
                ReplicaReport {
                    group: g.id(),
                    role: role.to_string(),
                    leader: s.leader,
                    term: s.term,
                    committed_index: s.committed_index,
                    applied_index: s.applied_index,
                    revision: s.revision,
                    log_bytes: disk.map(|d| d.log_bytes),
                    snapshot_bytes: disk.map(|d| d.snapshot_bytes),
                }
            })
            .collect();
        let not_ready = svc.not_ready();
        NodeReport {
            node_id: me,
            zone: node.zone().to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            pid: std::process::id(),
            uptime_s: started().elapsed().as_secs(),
            ready: not_ready.is_empty(),
            not_ready,
            replicas,
        }
    }
}

/// Marks the process start for `uptime_s` (`lockd`'s `main` calls it first).
pub fn mark_start() {
    started();
}

impl Service {
    /// Every member node's report, asked at once over the peer port, with this node's own;
    /// a node that does not answer within a few seconds is listed with the error. The members
    /// are those of the groups this node hosts, as its replicas see them: no group's leader is
    /// needed, so the status still comes when groups have lost their quorum. Needs the admin
    /// credential, as `members list` does.
    pub async fn cluster_status(
        &self,
        creds: &crate::service::Credentials,
    ) -> Result<Vec<NodeEntry>, ApiError> {
        self.require_admin(creds, "the cluster status")?;
        let mut addrs: BTreeMap<NodeId, String> = BTreeMap::new();
        for g in self
            .node
            .group_ids()
            .into_iter()
            .filter_map(|id| self.node.group(id))
        {
            for (id, addr) in g.membership().addrs {
                addrs.entry(id).or_insert(addr);
            }
        }
        let me = self.node.node_id();
        let payload = crate::ask::encode(&Ask::NodeStatus)
            .map_err(|e| ApiError::new(ErrorCode::Internal, e.message().to_string()))?;
        let asks = addrs.iter().map(|(id, addr)| {
            let payload = payload.clone();
            async move {
                let report = if *id == me {
                    Reported::Report(NodeReport::of(self))
                } else {
                    match self
                        .node
                        .app_call_node(*id, addr, payload, ASK_TIMEOUT)
                        .await
                    {
                        Ok(bytes) => match postcard::from_bytes::<NodeReport>(&bytes) {
                            Ok(r) => Reported::Report(r),
                            Err(e) => Reported::Error(format!("unreadable report: {e}")),
                        },
                        Err(st) => Reported::Error(describe(&st)),
                    }
                };
                NodeEntry {
                    node_id: *id,
                    peer_addr: addr.clone(),
                    report,
                }
            }
        });
        Ok(futures::future::join_all(asks).await)
    }
}

/// Why a node gave no report, for an operator.
fn describe(st: &tonic::Status) -> String {
    match st.code() {
        tonic::Code::DeadlineExceeded => format!(
            "no answer within {} s (stopped, paused or cut off?)",
            ASK_TIMEOUT.as_secs()
        ),
        // What a node before NODE_CALL answers: no group has that id.
        tonic::Code::NotFound => format!(
            "it cannot report its status (a lockd older than this one?): {}",
            st.message()
        ),
        _ => format!("unreachable: {}", st.message()),
    }
}
