//! A node's background duties, one function each. `start` (lib.rs) spawns every one until the
//! node stops; the simulator spawns those it needs through the same functions, so both run the
//! duties as `lockd serve` does.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use lockd_core::Namespace;
use tokio::time::Instant;

use crate::service::Service;
use crate::{backup, ADMIN_SERVICE, LOCK_SERVICE};

/// Every duty a node runs, as `start` spawns them.
pub(crate) fn every_duty(
    svc: &Arc<Service>,
    namespaces: Vec<Namespace>,
    data_dir: PathBuf,
    orphans: tokio::sync::mpsc::UnboundedReceiver<crate::waits::Orphan>,
    health: tonic_health::server::HealthReporter,
    leaving: Arc<tokio::sync::Mutex<bool>>,
) -> Vec<BoxFuture<'static, ()>> {
    vec![
        // Fail closed: no name or session is served until the meta replica has caught up.
        Box::pin({
            let svc = svc.clone();
            async move { svc.catch_up_meta().await }
        }),
        Box::pin(bootstrap(svc.clone(), namespaces, data_dir)),
        Box::pin(follow_topology(svc.clone())),
        // The lock groups' copies of the namespaces follow the meta group's.
        Box::pin(crate::namespaces::sync_loop(svc.clone())),
        // Moves a crashed mover left half done are finished, so their buckets do not stay
        // frozen.
        Box::pin(crate::moves::resume_janitor(svc.clone())),
        // Grants nobody waits for any more go back.
        Box::pin({
            let svc = svc.clone();
            async move { svc.release_orphans(orphans).await }
        }),
        Box::pin(health_follows_readiness(svc.clone(), health, leaving)),
        Box::pin(follow_leaders(svc.clone())),
    ]
}

/// Puts the shard map and the namespaces in place (retried, backing off to 1 s, until a
/// leader takes them); then, on a restored node, marks the restore applied (`backup.rs`).
pub async fn bootstrap(svc: Arc<Service>, namespaces: Vec<Namespace>, data_dir: PathBuf) {
    let mut delay = Duration::from_millis(50);
    let started = Instant::now();
    let mut warned = started;
    loop {
        match svc.bootstrap(&namespaces).await {
            Ok(()) => break,
            // A restore that does not finish keeps the node closed: say why, now and then.
            Err(e)
                if svc.pending_restore().is_some()
                    && warned.elapsed() > Duration::from_secs(10) =>
            {
                warned = Instant::now();
                tracing::warn!(
                    error = %e,
                    waited_s = started.elapsed().as_secs(),
                    "the restore is not applied yet; serving no name"
                );
            }
            Err(e) => tracing::debug!(error = %e, "bootstrap not done yet"),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(1));
    }
    tracing::info!("shard map and namespaces are in place");
    if let Some(seed) = svc.pending_restore() {
        match backup::mark_applied(&data_dir) {
            Ok(path) => tracing::info!(
                floor = seed.floor,
                file = %path.display(),
                "the restore is applied: every lock group's revision is at least the floor"
            ),
            // Applied all the same; the next start raises the floor again (a no-op).
            Err(e) => tracing::warn!(error = %e, "could not mark the restore applied"),
        }
        svc.restore_applied();
    }
}

/// Groups created on the running cluster: hosts those placed here and learns where the others
/// are, reading the meta group's records every `topology::RECONCILE_EVERY` (which is also how
/// a node learns the draining marks).
pub async fn follow_topology(svc: Arc<Service>) {
    loop {
        if let Err(e) = svc.reconcile_topology().await {
            tracing::debug!(error = %e, "could not read the group records yet");
        }
        tokio::time::sleep(crate::topology::RECONCILE_EVERY).await;
    }
}

/// Keeps the gRPC health statuses in step with readiness (`Service::not_ready`) until the node
/// starts leaving (`leaving`), every 250 ms.
pub async fn health_follows_readiness(
    svc: Arc<Service>,
    reporter: tonic_health::server::HealthReporter,
    leaving: Arc<tokio::sync::Mutex<bool>>,
) {
    let mut serving = None;
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tick.tick().await;
        let ready = svc.not_ready().is_empty();
        let gone = leaving.lock().await;
        if *gone {
            break;
        }
        if serving != Some(ready) {
            let status = if ready {
                tonic_health::ServingStatus::Serving
            } else {
                tonic_health::ServingStatus::NotServing
            };
            for name in ["", LOCK_SERVICE, ADMIN_SERVICE] {
                reporter.set_service_status(name, status).await;
            }
            serving = Some(ready);
        }
    }
}

/// Counts leader changes between scrapes, and tells the session streams here when a group's
/// new leader extended their leases (`Service::tell_lease_extended`), every 250 ms.
pub async fn follow_leaders(svc: Arc<Service>) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tick.tick().await;
        for group in svc.metrics.observe_leaders(&svc.node) {
            tokio::spawn(svc.clone().tell_lease_extended(group));
        }
    }
}
