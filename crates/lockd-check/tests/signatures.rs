//! Negative controls with signatures: each sabotage of the simulation must cause its own kind
//! of violation on its seed, and that same seed must be clean without it.
//!
//! The seeds are fixed: the simulation is deterministic, so a control caught on its seed always
//! is. A change to lockd or to the simulator moves the trajectories; then pick the first seed
//! again with `lockd-check sim --seeds 100 --sabotage X --verbose` (release build) and check it
//! with `--seeds 1 --seed N --sabotage X` (exit 0: caught) and without `--sabotage` (clean).
//! Picked again when lease reads began to be answered in batches and a node's groups began to
//! share its entry slot (each moved every trajectory): a seed of 1..200 that each sabotage is
//! caught on, the first one when picked (1,000 seeds from 1 are clean without any).

use lockd_check::checker::Signature;
use lockd_check::sim::{run_seed, Sabotage, SimConfig};

/// `sabotage` shows `want` on `seed`, and `seed` without it shows no violation at all.
fn signature_then_clean(sabotage: Sabotage, want: Signature, seed: u64) {
    assert_eq!(sabotage.signature(), want);
    let cfg = SimConfig {
        sabotage: Some(sabotage),
        ..SimConfig::new(seed)
    };
    let sabotaged = run_seed(&cfg).expect("sabotaged seed runs");
    assert!(
        sabotaged.caught(sabotage),
        "seed {seed} under {sabotage:?} does not show {want}: {:?} {:?}",
        sabotaged.violations,
        sabotaged.signatures
    );
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
    signature_then_clean(Sabotage::ClientDeadline, Signature::BeliefOverlap, 12);
}

#[test]
fn leader_lease_causes_a_grant_while_believed() {
    signature_then_clean(Sabotage::LeaderLease, Signature::GrantWhileBelieved, 1);
}

#[test]
fn store_fence_causes_a_stale_write() {
    signature_then_clean(Sabotage::StoreFence, Signature::StaleWrite, 8);
}

#[test]
fn stale_read_causes_a_stale_read() {
    signature_then_clean(Sabotage::StaleRead, Signature::StaleRead, 1);
}

/// Leaders that answer reads from their belief that they lead, without the lease the lease
/// reads rely on (`ReadPath::lease_index`), answer stale reads.
#[test]
fn read_lease_causes_a_stale_read() {
    signature_then_clean(Sabotage::ReadLease, Signature::StaleRead, 40);
}

#[test]
fn revision_floor_causes_a_token_regression() {
    signature_then_clean(Sabotage::RevisionFloor, Signature::TokenRegression, 54);
}

#[test]
fn ownership_causes_a_double_grant() {
    signature_then_clean(Sabotage::Ownership, Signature::DoubleGrant, 1);
}
