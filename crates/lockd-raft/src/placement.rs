//! Which nodes a cluster's founders place each group on.
//!
//! The meta group is on every founder. Lock group `g` (1..=G) gets `replicas` consecutive
//! founders in id order, starting `(g - 1) * replicas` places in and wrapping round, so groups
//! fill the nodes evenly: 6 nodes, 2 groups of 3 give {1,2,3} and {4,5,6}; 5 nodes, 4 groups of
//! 3 give every node 2 or 3 groups. `replicas` 0 (or ≥ the founders) puts every group on every
//! founder. The placement is a pure function of the founders and these two numbers, which the
//! data dir's identity pins, so every founder computes the same one on every start; later
//! changes go through membership calls and are read from each group's own membership.
//!
//! Also here, as the pure rule it is: each group's preferred leader among its voters, which
//! leader balance (`node/balance.rs`) and a group's status both read.

use std::collections::{BTreeMap, BTreeSet};

use crate::{GroupId, NodeId, META_GROUP};

/// The preferred leader of `group` among `voters` (any order, repeats allowed): the
/// `(group mod n)`-th of the `n` distinct ids in id order that are not `draining`, or of all
/// of them if every one is.
pub(crate) fn preferred_leader(
    group: GroupId,
    voters: impl IntoIterator<Item = NodeId>,
    draining: &BTreeSet<NodeId>,
) -> Option<NodeId> {
    let voters: BTreeSet<NodeId> = voters.into_iter().collect();
    let staying: BTreeSet<NodeId> = voters.difference(draining).copied().collect();
    let pool = if staying.is_empty() { voters } else { staying };
    if pool.is_empty() {
        return None;
    }
    pool.iter().nth(group as usize % pool.len()).copied()
}

/// Group id → the founders it is placed on, in id order, for groups 0..=`lock_groups`.
pub fn initial_placement(
    founders: &[NodeId],
    lock_groups: u32,
    replicas: usize,
) -> BTreeMap<GroupId, Vec<NodeId>> {
    let mut sorted = founders.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let n = sorted.len();
    let mut out = BTreeMap::from([(META_GROUP, sorted.clone())]);
    for g in 1..=lock_groups {
        let nodes = if replicas == 0 || replicas >= n {
            sorted.clone()
        } else {
            let start = (g as usize - 1) * replicas;
            let mut v: Vec<NodeId> = (0..replicas).map(|k| sorted[(start + k) % n]).collect();
            v.sort_unstable();
            v
        };
        out.insert(g, nodes);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preferred_leaders_spread_over_the_voters_in_id_order() {
        let none = BTreeSet::new();
        let p: Vec<_> = (0..6)
            .map(|g| preferred_leader(g, [7, 3, 5, 3], &none).unwrap())
            .collect();
        assert_eq!(p, [3, 5, 7, 3, 5, 7]);
        assert_eq!(preferred_leader(4, [9], &none), Some(9));
        assert_eq!(preferred_leader(1, [], &none), None);
    }

    #[test]
    fn draining_voters_are_never_preferred_unless_all_are() {
        let five = BTreeSet::from([5]);
        let p: Vec<_> = (0..4)
            .map(|g| preferred_leader(g, [7, 3, 5], &five).unwrap())
            .collect();
        assert_eq!(p, [3, 7, 3, 7], "node 5's groups spread over 3 and 7");
        let all = BTreeSet::from([3, 5, 7]);
        assert_eq!(preferred_leader(1, [7, 3, 5], &all), Some(5));
        assert_eq!(preferred_leader(1, [], &five), None);
    }

    #[test]
    fn groups_fill_the_nodes_evenly() {
        let p = initial_placement(&[1, 2, 3, 4, 5, 6], 2, 3);
        assert_eq!(p[&0], vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(p[&1], vec![1, 2, 3]);
        assert_eq!(p[&2], vec![4, 5, 6]);
        let p = initial_placement(&[5, 1, 4, 2, 3], 4, 3);
        assert_eq!(p[&1], vec![1, 2, 3]);
        assert_eq!(p[&2], vec![1, 4, 5]);
        assert_eq!(p[&3], vec![2, 3, 4]);
        assert_eq!(p[&4], vec![1, 2, 5]);
        let mut per_node = BTreeMap::<NodeId, usize>::new();
        for g in 1..=4 {
            for n in &p[&g] {
                *per_node.entry(*n).or_default() += 1;
            }
        }
        assert!(
            per_node.values().all(|c| (2..=3).contains(c)),
            "{per_node:?}"
        );
    }

    #[test]
    fn zero_or_too_many_replicas_put_every_group_everywhere() {
        for r in [0, 3, 7] {
            let p = initial_placement(&[1, 2, 3], 4, r);
            assert!(p.values().all(|v| *v == vec![1, 2, 3]), "{r}: {p:?}");
        }
    }
}
