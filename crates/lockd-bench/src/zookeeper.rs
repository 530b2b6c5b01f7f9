//! ZooKeeper as a comparison target: Debian's ZooKeeper 3.8 as a 3-member ensemble on loopback
//! (`forceSync=yes`: the transaction log is fsync'd before a write is acknowledged), driven
//! through the lock recipe of Apache Curator's `InterProcessMutex`, the way most JVM teams take a
//! lock in ZooKeeper.
//!
//! Why a recipe and not one request: ZooKeeper has no lock operation. Curator's mutex creates an
//! ephemeral sequential node under the lock's directory (`_c_<uuid>-lock-<seq>`, the protected
//! name that lets a retry find its node), lists the directory, and holds the lock if its node
//! sorts first; a waiter watches only its predecessor. `acquire(0)` (a try-lock) deletes its
//! node again when it is not first. So a try-lock costs 2 requests when free and 3 when held,
//! a release 1 (delete the node), a status read 1 (list the directory; served by the member the
//! session is connected to, without consensus: ZooKeeper reads are sequentially consistent, not
//! linearizable). A session's heartbeat is sent by the client library on its own; the mix's
//! keepalive is one round trip to the session's member (an `exists` of `/`), what a ping costs.
//! Each "op" below is one recipe step as a user calls it, so ZooKeeper's rows count recipe
//! calls, not wire requests.
//!
//! The client is `zookeeper-client` (async, on tokio), one session per benchmark client,
//! spread over the members as the other systems' clients are.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use tempfile::TempDir;
use zookeeper_client as zk;

use lockd_testkit::free_ports;

use crate::procs::{loopback, wait_ready, Server};
use crate::target::{LockTarget, Token};

/// Members in the ensemble, as users deploy it.
const MEMBERS: usize = 3;
/// Debian's `zookeeper` package's server jar (its manifest names the jars it needs).
pub const JAR: &str = "/usr/share/java/zookeeper.jar";
/// Where the lock directories live (Curator's recipes take a base path the same way).
const ROOT: &str = "/lockd-bench";
/// Curator's lock name for `InterProcessMutex`.
const LOCK_NAME: &str = "lock-";

/// A running ensemble; dropping it stops every member, then removes the data.
pub struct Ensemble {
    // Field order matters: members stop before their data dir is removed.
    members: Vec<Server>,
    clients: Vec<SocketAddr>,
    _dir: TempDir,
}

impl Ensemble {
    /// Writes each member's `zoo.cfg` and `myid`, starts the JVMs and waits until every member
    /// serves (a member answers only once it is in a quorum).
    pub async fn start(data_root: &Path) -> Result<Ensemble> {
        if !Path::new(JAR).is_file() {
            bail!("{JAR} is missing: apt-get install zookeeper");
        }
        let dir = tempfile::Builder::new()
            .prefix("lockd-bench-zk-")
            .tempdir_in(data_root)?;
        let ports = free_ports(3 * MEMBERS);
        let servers: Vec<String> = (0..MEMBERS)
            .map(|i| {
                format!(
                    "server.{}=127.0.0.1:{}:{}",
                    i + 1,
                    ports[MEMBERS + i],
                    ports[2 * MEMBERS + i]
                )
            })
            .collect();
        let mut members = Vec::new();
        for (i, &client_port) in ports[..MEMBERS].iter().enumerate() {
            let home = dir.path().join(format!("m{}", i + 1));
            let data = home.join("data");
            std::fs::create_dir_all(&data)?;
            std::fs::write(data.join("myid"), format!("{}\n", i + 1))?;
            // tickTime, initLimit and syncLimit are the shipped example's; forceSync=yes is the
            // default, written out because it is the durability this comparison is about.
            let cfg = format!(
                "tickTime=2000\ninitLimit=10\nsyncLimit=5\ndataDir={}\nclientPort={client_port}\n\
                 clientPortAddress=127.0.0.1\nforceSync=yes\nmaxClientCnxns=0\n\
                 admin.enableServer=false\n{}\n",
                data.display(),
                servers.join("\n")
            );
            let cfg_path = home.join("zoo.cfg");
            std::fs::write(&cfg_path, cfg)?;
            let args: Vec<String> = vec![
                // A fixed heap, so a run's memory does not depend on the machine's size.
                "-Xms512m".into(),
                "-Xmx512m".into(),
                "-cp".into(),
                JAR.into(),
                format!("-Dzookeeper.log.dir={}", home.display()),
                "org.apache.zookeeper.server.quorum.QuorumPeerMain".into(),
                cfg_path.display().to_string(),
            ];
            members.push(Server::start(
                &format!("zookeeper-m{}", i + 1),
                "java",
                &args,
                &home,
            )?);
        }
        let clients: Vec<SocketAddr> = ports[..MEMBERS].iter().map(|&p| loopback(p)).collect();
        for &addr in &clients {
            wait_ready(&mut members, Duration::from_secs(60), || async move {
                let c = connect(addr, Duration::from_secs(10)).await?;
                c.list_children("/").await?;
                Ok(())
            })
            .await?;
        }
        Ok(Ensemble {
            members,
            clients,
            _dir: dir,
        })
    }

    pub fn clients(&self) -> &[SocketAddr] {
        &self.clients
    }

    /// The members' pids, for CPU accounting.
    pub fn pids(&self) -> Vec<u32> {
        self.members.iter().map(Server::pid).collect()
    }

    /// Fails if a member died (e.g. during a run).
    pub fn check_alive(&mut self) -> Result<()> {
        for m in &mut self.members {
            m.check_alive()?;
        }
        Ok(())
    }
}

/// The package's version, for the table's machine facts.
pub fn version() -> String {
    std::process::Command::new("dpkg-query")
        .args(["-W", "-f", "${Version}", "zookeeper"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map_or_else(
            || "zookeeper: not installed".into(),
            |v| format!("zookeeper {v}"),
        )
}

async fn connect(addr: SocketAddr, session: Duration) -> Result<zk::Client> {
    zk::Client::connector()
        .with_session_timeout(session)
        .connect(&addr.to_string())
        .await
        .with_context(|| format!("connect zookeeper {addr}"))
}

/// The lock directory of `name` (its slashes become levels, as a Curator user's lock path).
fn lock_dir(name: &str) -> String {
    format!("{ROOT}/{name}")
}

/// A node's sequence: the 10 digits ZooKeeper appends.
fn sequence(child: &str) -> &str {
    &child[child.len().saturating_sub(10)..]
}

/// ZooKeeper through Curator's `InterProcessMutex` recipe, as a `LockTarget`.
pub struct ZkTarget {
    members: Vec<SocketAddr>,
}

impl ZkTarget {
    pub fn new(members: &[SocketAddr]) -> ZkTarget {
        ZkTarget {
            members: members.to_vec(),
        }
    }
}

/// One benchmark client: its session, and the uuid of Curator's protected names.
pub struct ZkClient {
    zk: zk::Client,
    uuid: String,
}

impl ZkClient {
    /// Creates this client's node under `dir` (Curator's `creatingParentContainersIfNeeded`:
    /// on a missing parent, the parents are made as containers, which the server removes once
    /// empty, and the create is tried again).
    async fn create_node(&self, dir: &str, owner: &str) -> Result<String> {
        let path = format!("{dir}/_c_{}-{LOCK_NAME}", self.uuid);
        let mode = zk::CreateMode::EphemeralSequential.with_acls(zk::Acls::anyone_all());
        let (_, seq) = match self.zk.create(&path, owner.as_bytes(), &mode).await {
            Err(zk::Error::NoNode) => {
                self.create_parents(dir).await?;
                self.zk.create(&path, owner.as_bytes(), &mode).await?
            }
            r => r?,
        };
        Ok(format!("{path}{seq}"))
    }

    /// As Curator's `ZKPaths.mkdirs`: each level is looked up first (a read, on the session's
    /// member) and created only when missing.
    async fn create_parents(&self, dir: &str) -> Result<()> {
        let container = zk::CreateMode::Container.with_acls(zk::Acls::anyone_all());
        let mut at = String::new();
        for part in dir.trim_start_matches('/').split('/') {
            at.push('/');
            at.push_str(part);
            if self.zk.check_stat(&at).await?.is_some() {
                continue;
            }
            match self.zk.create(&at, &[], &container).await {
                Ok(_) | Err(zk::Error::NodeExists) => {}
                Err(e) => return Err(e).with_context(|| format!("create {at}")),
            }
        }
        Ok(())
    }
}

impl LockTarget for ZkTarget {
    type Client = ZkClient;

    async fn prepare(&self, id: usize, ttl: Duration) -> Result<ZkClient> {
        let addr = self.members[id % self.members.len()];
        Ok(ZkClient {
            zk: connect(addr, ttl).await?,
            uuid: format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..)),
        })
    }

    async fn acquire(&self, c: &mut ZkClient, name: &str, owner: &str) -> Result<Option<Token>> {
        let dir = lock_dir(name);
        let ours = c.create_node(&dir, owner).await?;
        let children = c.zk.list_children(&dir).await?;
        let first = children.iter().min_by(|a, b| sequence(a).cmp(sequence(b)));
        let ours_name = &ours[dir.len() + 1..];
        if first.map(String::as_str) == Some(ours_name) {
            return Ok(Some(ours));
        }
        // acquire(0): not first, so the attempt ends and its node goes.
        c.zk.delete(&ours, None).await?;
        Ok(None)
    }

    async fn release(&self, c: &mut ZkClient, name: &str, token: &str) -> Result<bool> {
        // A token is the node's path; anything else (the mix releasing a name it does not
        // hold) names a node that cannot exist, and the server refuses the delete.
        let path = match token.starts_with('/') {
            true => token.to_string(),
            false => format!("{}/{token}", lock_dir(name)),
        };
        match c.zk.delete(&path, None).await {
            Ok(()) => Ok(true),
            Err(zk::Error::NoNode) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    async fn keepalive(&self, c: &mut ZkClient, _held: Option<(&str, &str)>) -> Result<()> {
        c.zk.check_stat("/").await?;
        Ok(())
    }

    async fn read(&self, c: &mut ZkClient, name: &str) -> Result<Option<String>> {
        match c.zk.list_children(&lock_dir(name)).await {
            Ok(children) => Ok(children
                .into_iter()
                .min_by(|a, b| sequence(a).cmp(sequence(b)))),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn finish(&self, c: ZkClient) -> Result<()> {
        drop(c.zk);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_node_is_the_lowest_sequence_whatever_its_uuid() {
        let a = "_c_ffff-lock-0000000012";
        let b = "_c_0000-lock-0000000013";
        assert!(sequence(a) < sequence(b));
        assert_eq!(sequence(a), "0000000012");
        assert_eq!(lock_dir("jobs/17"), "/lockd-bench/jobs/17");
    }
}
