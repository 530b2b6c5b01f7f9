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
//! **Zones.** With the founders' zones given (`--initial-zones`), each lock group instead takes
//! its replicas one at a time from the zone it has fewest in, then the node with the fewest
//! groups so far, then the same rotation: 5 replicas over 3 zones land 2+2+1, 3 over 3 land one
//! per zone, and the groups still fill the nodes evenly. Without zones the placement is the one
//! above, bit for bit, so a dir founded before zones opens the same groups on every start.
//! [`zone_majority`] is the rule every placement and membership change keeps.
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

/// Node id → the zone it declared (`--zone`). A node missing from the map, or mapped to "",
/// declared none; those count together as one unnamed zone.
pub type Zones = BTreeMap<NodeId, String>;

/// A zone that holds a majority of a group's voters: losing it (a power or network failure
/// of one zone) loses the group's quorum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZoneMajority {
    /// The zone ("" for nodes that declared none).
    pub zone: String,
    /// Its voters.
    pub nodes: Vec<NodeId>,
    /// The group's voters in all.
    pub voters: usize,
}

impl std::fmt::Display for ZoneMajority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let zone = match self.zone.as_str() {
            "" => "no zone".to_string(),
            z => format!("zone {z}"),
        };
        write!(
            f,
            "{} of its {} voters ({:?}) would be in {zone}, so losing {zone} would lose its \
             quorum",
            self.nodes.len(),
            self.voters,
            self.nodes
        )
    }
}

/// The zone holding more than half of `voters`, if the cluster spans at least three zones
/// (`zones`' distinct values, the unnamed one included when a node is missing from it). With
/// one or two zones a majority cannot be avoided, so there is none to refuse.
pub fn zone_majority(voters: &[NodeId], zones: &Zones) -> Option<ZoneMajority> {
    let zone_of = |n: &NodeId| zones.get(n).map_or("", String::as_str);
    let mut distinct: BTreeSet<&str> = zones.values().map(String::as_str).collect();
    distinct.extend(voters.iter().map(zone_of));
    if distinct.len() < 3 {
        return None;
    }
    let voters: BTreeSet<NodeId> = voters.iter().copied().collect();
    let mut per_zone = BTreeMap::<&str, Vec<NodeId>>::new();
    for n in &voters {
        per_zone.entry(zone_of(n)).or_default().push(*n);
    }
    per_zone
        .into_iter()
        .find(|(_, nodes)| 2 * nodes.len() > voters.len())
        .map(|(zone, nodes)| ZoneMajority {
            zone: zone.to_string(),
            nodes,
            voters: voters.len(),
        })
}

/// Group id → the founders it is placed on, in id order, for groups 0..=`lock_groups`, over
/// the founders' `zones` (empty: no zones; see the module doc).
pub fn initial_placement(
    founders: &[NodeId],
    lock_groups: u32,
    replicas: usize,
    zones: &Zones,
) -> BTreeMap<GroupId, Vec<NodeId>> {
    let mut sorted = founders.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let n = sorted.len();
    let mut out = BTreeMap::from([(META_GROUP, sorted.clone())]);
    let mut load = vec![0usize; n];
    for g in 1..=lock_groups {
        let start = (g as usize - 1) * replicas;
        let nodes = if replicas == 0 || replicas >= n {
            sorted.clone()
        } else if zones.is_empty() {
            let mut v: Vec<NodeId> = (0..replicas).map(|k| sorted[(start + k) % n]).collect();
            v.sort_unstable();
            v
        } else {
            spread_over_zones(&sorted, replicas, start, zones, &mut load)
        };
        out.insert(g, nodes);
    }
    out
}

/// One group's `replicas` of `sorted` (the founders in id order): each pick from the zone the
/// group has fewest in, then the node with the fewest groups (`load`, updated), then the
/// rotation that starts at `start`. Water-filling the zones keeps the largest zone's share as
/// small as the zones' sizes allow, so no zone gets a majority when any placement avoids one.
fn spread_over_zones(
    sorted: &[NodeId],
    replicas: usize,
    start: usize,
    zones: &Zones,
    load: &mut [usize],
) -> Vec<NodeId> {
    let n = sorted.len();
    let zone_of = |i: usize| zones.get(&sorted[i]).map_or("", String::as_str);
    let mut chosen: Vec<usize> = Vec::with_capacity(replicas);
    let mut in_group = BTreeMap::<&str, usize>::new();
    for _ in 0..replicas {
        let pick = (0..n)
            .filter(|i| !chosen.contains(i))
            .min_by_key(|&i| {
                let zone_count = in_group.get(zone_of(i)).copied().unwrap_or(0);
                (zone_count, load[i], (i + n - start % n) % n)
            })
            .expect("replicas < founders");
        *in_group.entry(zone_of(pick)).or_default() += 1;
        load[pick] += 1;
        chosen.push(pick);
    }
    let mut v: Vec<NodeId> = chosen.into_iter().map(|i| sorted[i]).collect();
    v.sort_unstable();
    v
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

    fn no_zones() -> Zones {
        Zones::new()
    }

    #[test]
    fn groups_fill_the_nodes_evenly() {
        let p = initial_placement(&[1, 2, 3, 4, 5, 6], 2, 3, &no_zones());
        assert_eq!(p[&0], vec![1, 2, 3, 4, 5, 6]);
        assert_eq!(p[&1], vec![1, 2, 3]);
        assert_eq!(p[&2], vec![4, 5, 6]);
        let p = initial_placement(&[5, 1, 4, 2, 3], 4, 3, &no_zones());
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
            let p = initial_placement(&[1, 2, 3], 4, r, &no_zones());
            assert!(p.values().all(|v| *v == vec![1, 2, 3]), "{r}: {p:?}");
        }
    }

    fn zones(spec: &[(NodeId, &str)]) -> Zones {
        spec.iter().map(|(n, z)| (*n, z.to_string())).collect()
    }

    #[test]
    fn a_zone_majority_is_found_only_over_three_zones_or_more() {
        let three = zones(&[(1, "a"), (2, "a"), (3, "b"), (4, "c"), (5, "a")]);
        let m = zone_majority(&[1, 2, 5], &three).unwrap();
        assert_eq!(
            (m.zone.as_str(), m.nodes.clone(), m.voters),
            ("a", vec![1, 2, 5], 3)
        );
        let msg = m.to_string();
        assert!(
            msg.contains("3 of its 3 voters") && msg.contains("zone a"),
            "{msg}"
        );
        assert_eq!(zone_majority(&[1, 3, 4], &three), None);
        assert_eq!(
            zone_majority(&[1, 2, 3, 4], &three),
            None,
            "2 of 4 is no majority"
        );
        assert!(
            zone_majority(&[1, 2, 3, 4, 5], &three).is_some(),
            "3 of 5 in a"
        );
        let two = zones(&[(1, "a"), (2, "a"), (3, "b")]);
        assert_eq!(
            zone_majority(&[1, 2, 3], &two),
            None,
            "two zones cannot avoid one"
        );
        // Nodes without a zone count together as one unnamed zone.
        let m = zone_majority(&[1, 6, 7], &zones(&[(1, "a"), (2, "b"), (3, "c")])).unwrap();
        assert_eq!((m.zone.as_str(), m.nodes), ("", vec![6, 7]));
        assert!(zone_majority(&[1, 2, 3], &no_zones()).is_none());
    }

    /// Every lock group of every layout is placed with no zone majority whenever the founders
    /// have none, and the groups still fill the nodes evenly when the zones are even.
    #[test]
    fn zone_placement_never_gives_a_zone_a_majority_the_layout_can_avoid() {
        for n in 3..=9usize {
            for zone_count in 3..=4usize {
                for skew in 0..3usize {
                    // Round-robin zones, with the first `skew` nodes moved into zone "z0".
                    let spec: Zones = (1..=n as NodeId)
                        .map(|i| {
                            let z = if (i as usize) <= skew {
                                0
                            } else {
                                (i as usize - 1) % zone_count
                            };
                            (i, format!("z{z}"))
                        })
                        .collect();
                    let founders: Vec<NodeId> = spec.keys().copied().collect();
                    if zone_majority(&founders, &spec).is_some() {
                        continue;
                    }
                    for r in [3usize, 5] {
                        let p = initial_placement(&founders, 8, r, &spec);
                        for (g, v) in &p {
                            let want = if *g == META_GROUP { n } else { r.min(n) };
                            assert_eq!(v.len(), want, "{n}/{zone_count}/{skew} g{g}");
                            assert!(
                                zone_majority(v, &spec).is_none(),
                                "n={n} zones={zone_count} skew={skew} r={r} g{g}: {v:?} {spec:?}"
                            );
                        }
                        if skew == 0 && n % zone_count == 0 && r < n {
                            let mut per_node = BTreeMap::<NodeId, usize>::new();
                            for v in (1..=8).map(|g| &p[&g]) {
                                for x in v {
                                    *per_node.entry(*x).or_default() += 1;
                                }
                            }
                            let (lo, hi) = (
                                per_node.values().min().copied().unwrap_or(0),
                                per_node.values().max().copied().unwrap_or(0),
                            );
                            assert!(hi - lo <= 1 && per_node.len() == n, "{n}/{r}: {per_node:?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn five_replicas_over_three_zones_land_two_two_one() {
        let z = zones(&[(1, "a"), (2, "b"), (3, "c"), (4, "a"), (5, "b"), (6, "c")]);
        let p = initial_placement(&[1, 2, 3, 4, 5, 6], 2, 5, &z);
        for g in [1, 2] {
            let mut per = BTreeMap::<&str, usize>::new();
            for n in &p[&g] {
                *per.entry(z[n].as_str()).or_default() += 1;
            }
            let mut counts: Vec<usize> = per.into_values().collect();
            counts.sort_unstable();
            assert_eq!(counts, [1, 2, 2], "group {g}: {:?}", p[&g]);
        }
        let p = initial_placement(&[1, 2, 3, 4, 5, 6], 2, 3, &z);
        assert_eq!(
            (p[&1].clone(), p[&2].clone()),
            (vec![1, 2, 3], vec![4, 5, 6])
        );
    }
}
