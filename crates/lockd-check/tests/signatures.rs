//! Negative controls with signatures: each sabotage of the simulation must cause its own kind
//! of violation on some seed of a small range, and that same seed must be clean without it.

use lockd_check::checker::Signature;
use lockd_check::sim::{run_seed, Sabotage, SimConfig};

/// Seeds searched for a sabotage's signature.
const SEEDS: std::ops::RangeInclusive<u64> = 1..=40;

/// The first seed on which `sabotage` shows its signature; then the same seed, unsabotaged,
/// must show no violation at all.
fn signature_then_clean(sabotage: Sabotage, want: Signature) {
    assert_eq!(sabotage.signature(), want);
    let seed = SEEDS
        .clone()
        .find(|&seed| {
            let cfg = SimConfig {
                sabotage: Some(sabotage),
                ..SimConfig::new(seed)
            };
            run_seed(&cfg)
                .expect("sabotaged seed runs")
                .caught(sabotage)
        })
        .unwrap_or_else(|| panic!("no seed in {SEEDS:?} shows {want} under {sabotage:?}"));
    let clean = run_seed(&SimConfig::new(seed)).expect("clean seed runs");
    assert!(
        !clean.failed() && clean.signatures.is_empty(),
        "seed {seed} without {sabotage:?}: {:?} {:?}",
        clean.violations,
        clean.report.details
    );
}

#[test]
fn client_deadline_causes_a_belief_overlap() {
    signature_then_clean(Sabotage::ClientDeadline, Signature::BeliefOverlap);
}

#[test]
fn leader_lease_causes_a_grant_while_believed() {
    signature_then_clean(Sabotage::LeaderLease, Signature::GrantWhileBelieved);
}

#[test]
fn store_fence_causes_a_stale_write() {
    signature_then_clean(Sabotage::StoreFence, Signature::StaleWrite);
}

#[test]
fn stale_read_causes_a_stale_read() {
    signature_then_clean(Sabotage::StaleRead, Signature::StaleRead);
}
