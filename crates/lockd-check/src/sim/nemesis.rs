//! The nemesis: network, process, clock and topology faults, drawn from the seed.

use super::*;

pub(crate) async fn nemesis(w: Arc<World>) {
    let end = w.t0 + w.cfg.run_for;
    let n = w.node_count();
    let crashed = Arc::new(Mutex::new(Vec::<NodeId>::new()));
    let drain = Arc::new(Mutex::new(DrainState::default()));
    loop {
        tokio::time::sleep(w.rand_ms(500, 2_500)).await;
        if Instant::now() + Duration::from_secs(1) >= end {
            return;
        }
        match w.rand_u64(0..13) {
            11 | 12 => {
                // A draining mark, set on a node or cleared, through a node's admin API; it
                // stays between the two, under every other fault.
                if std::mem::replace(&mut lock(&drain).busy, true) {
                    continue; // the last drain call has not answered yet
                }
                let (w2, d2) = (w.clone(), drain.clone());
                tokio::spawn(async move { drain_fault(&w2, &d2).await });
            }
            8 | 9 => {
                // A topology change: move a name's bucket to the other group while it is in
                // use (sometimes aborted after the freeze), concurrent with every other fault.
                let w2 = w.clone();
                tokio::spawn(async move { move_fault(&w2).await });
            }
            10 => {
                // A membership change: a node joins a group, or one leaves (replace).
                let w2 = w.clone();
                tokio::spawn(async move { member_fault(&w2).await });
            }
            0 | 1 => {
                // Isolate the leader (or a random node) from every other node.
                let g = GROUPS[w.rand_u64(0..GROUPS.len() as u64) as usize];
                let target = leader_of(&w, g).unwrap_or_else(|| w.rand_u64(1..n + 1));
                let pairs: Vec<_> = (1..=n)
                    .filter(|o| *o != target)
                    .flat_map(|o| [(o, target), (target, o)])
                    .collect();
                w.net.block(&pairs);
                // Half of them outlast a session's TTL plus an election, so the majority side
                // expires sessions whose clients still talk to the isolated (deposed) leader.
                let ttl_ms = TTL.as_millis() as u64;
                let dur = if w.chance(0.5) {
                    w.rand_ms(ttl_ms + 2_000, 3 * ttl_ms)
                } else {
                    w.rand_ms(1_000, 3 * ttl_ms)
                };
                w.fault("partition_leader", format!("node {target} for {dur:?}"));
                let w2 = w.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(dur).await;
                    w2.net.unblock(&pairs);
                });
            }
            2 => {
                // A random split: a minority on one side.
                let k = w.rand_u64(1..n.div_ceil(2));
                let mut side = Vec::new();
                while (side.len() as u64) < k {
                    let c = w.rand_u64(1..n + 1);
                    if !side.contains(&c) {
                        side.push(c);
                    }
                }
                let pairs: Vec<_> = side
                    .iter()
                    .flat_map(|a| (1..=n).filter(|b| !side.contains(b)).map(move |b| (*a, b)))
                    .flat_map(|(a, b)| [(a, b), (b, a)])
                    .collect();
                w.net.block(&pairs);
                let dur = w.rand_ms(1_000, 6_000);
                w.fault("partition", format!("{side:?} for {dur:?}"));
                let w2 = w.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(dur).await;
                    w2.net.unblock(&pairs);
                });
            }
            3 => {
                if !lock(&crashed).is_empty() {
                    continue;
                }
                let target = if w.chance(0.5) {
                    leader_of(&w, GROUPS[0]).unwrap_or(1)
                } else {
                    w.rand_u64(1..n + 1)
                };
                lock(&crashed).push(target);
                crash_node(&w, target).await;
                let dur = w.rand_ms(300, 4_000);
                w.fault("crash", format!("node {target}, restart after {dur:?}"));
                let (w2, c2) = (w.clone(), crashed.clone());
                tokio::spawn(async move {
                    tokio::time::sleep(dur).await;
                    if let Err(e) = start_node(&w2, target).await {
                        w2.violation(format!("restart failed: {e:#}"));
                    }
                    lock(&c2).retain(|c| *c != target);
                });
            }
            4 => {
                let target = if w.chance(0.5) {
                    leader_of(&w, GROUPS[1]).unwrap_or(1)
                } else {
                    w.rand_u64(1..n + 1)
                };
                let dur = TTL + w.rand_ms(300, 3_000);
                w.net.pause(target, true);
                w.fault("pause_node", format!("node {target} for {dur:?}"));
                let w2 = w.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(dur).await;
                    w2.net.pause(target, false);
                });
            }
            5 | 6 => {
                let c = w.rand_u64(0..CLIENTS);
                let dur = TTL + w.rand_ms(300, 4_000);
                if w.chance(0.5) {
                    lock(&w.pending_pause).insert(c, dur);
                    w.fault(
                        "pause_client",
                        format!("client {c} for {dur:?} at its next write"),
                    );
                } else {
                    let until = Instant::now() + dur;
                    let mut p = lock(&w.client_pause);
                    let e = p.entry(c).or_insert(until);
                    *e = (*e).max(until);
                    drop(p);
                    w.fault("pause_client", format!("client {c} for {dur:?}"));
                }
            }
            _ => {
                let loss = w.rand_u64(5..30) as f64 / 100.0;
                let max_us = w.rand_u64(20_000..150_000);
                {
                    let mut st = w.net.lock();
                    st.loss = loss;
                    st.delay_us = (200, max_us);
                }
                let dur = w.rand_ms(1_000, 5_000);
                w.fault(
                    "loss_delay",
                    format!("loss {loss} delay<={max_us}us for {dur:?}"),
                );
                let w2 = w.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(dur).await;
                    let mut st = w2.net.lock();
                    st.loss = 0.0;
                    st.delay_us = (200, 3_000);
                });
            }
        }
    }
}

/// A membership change through a random live node (which sends it to the group's leader): in
/// a group of no more voters than founders, a node that is not a member joins (learner, then
/// voter) and then a voter leaves (a replace); in one with an extra voter, a voter leaves. The
/// leader itself may be the one to leave (it hands the group over first). Under every other
/// fault, so a change may stop half-way; the next one, or the leader, finishes it.
pub(crate) async fn member_fault(w: &Arc<World>) {
    use lockd_raft::MemberCall;
    let groups: Vec<GroupId> = std::iter::once(lockd_raft::META_GROUP)
        .chain(GROUPS)
        .collect();
    let group = groups[w.rand_u64(0..groups.len() as u64) as usize];
    let Some(m) = leader_of(w, group)
        .and_then(|l| w.net.node(l))
        .and_then(|(_, n)| n.memberships().remove(&group))
    else {
        return;
    };
    if m.joint {
        return; // a change is half done: leave it to its leader
    }
    let mut calls = Vec::new();
    if m.voters.len() as u64 <= w.cfg.replicas {
        let outside: Vec<NodeId> = (1..=w.node_count())
            .filter(|n| !m.voters.contains(n))
            .collect();
        if outside.is_empty() {
            return;
        }
        let id = outside[w.rand_u64(0..outside.len() as u64) as usize];
        calls.push(MemberCall::Add {
            id,
            addr: format!("sim-node-{id}"),
        });
        let stay: Vec<NodeId> = m.voters.clone();
        calls.push(MemberCall::Remove {
            id: stay[w.rand_u64(0..stay.len() as u64) as usize],
        });
    } else {
        calls.push(MemberCall::Remove {
            id: m.voters[w.rand_u64(0..m.voters.len() as u64) as usize],
        });
    }
    for call in calls {
        let via = w.any_node();
        let Some((_, node)) = w.net.node(via) else {
            w.fault(
                "member_change",
                format!("group {group} {call:?}: node {via} is down"),
            );
            return;
        };
        let kind = match call {
            MemberCall::Add { .. } => "member_add",
            _ => "member_remove",
        };
        let r = tokio::time::timeout(
            Duration::from_secs(15),
            node.member_call(group, call.clone()),
        )
        .await;
        let outcome = match &r {
            Ok(Ok(m)) => format!("ok, voters {:?}", m.voters),
            Ok(Err(e)) => format!("refused: {e}"),
            Err(_) => "no answer in 15 s".into(),
        };
        w.fault(
            kind,
            format!("group {group} {call:?} via node {via}: {outcome}"),
        );
        if !matches!(r, Ok(Ok(_))) {
            return;
        }
    }
}

/// The drain toggle: the node marked draining (as far as the nemesis knows), and whether a
/// drain call is in flight.
#[derive(Default)]
pub(crate) struct DrainState {
    marked: Option<NodeId>,
    busy: bool,
}

/// Marks a node draining through a random node's `Service::set_draining` (the admin API's
/// code: it proposes the mark to the meta group and waits up to 20 s until the node leads no
/// group), or clears the mark it set. Half the time the node marked leads a group (its groups
/// must move); otherwise it is any node, a spare that is a member of nothing too (refused).
/// A failed mark is remembered all the same (it may have committed): the next draw clears it.
pub(crate) async fn drain_fault(w: &Arc<World>, state: &Mutex<DrainState>) {
    let marked = lock(state).marked;
    let (target, draining) = match marked {
        Some(id) => (id, false),
        None => {
            let leader = if w.chance(0.5) {
                let g = GROUPS[w.rand_u64(0..GROUPS.len() as u64) as usize];
                leader_of(w, g)
            } else {
                None
            };
            (leader.unwrap_or_else(|| w.any_node()), true)
        }
    };
    if draining {
        lock(state).marked = Some(target);
    }
    let via = w.any_node();
    let r = match w.service(via) {
        None => Err(format!("node {via} is down")),
        Some(svc) => {
            let creds = Credentials {
                bearer: Some(ADMIN_TOKEN.into()),
                from: None,
            };
            match tokio::time::timeout(
                Duration::from_secs(30),
                svc.set_draining(&creds, target, draining),
            )
            .await
            {
                Ok(Ok(groups)) => Ok(groups
                    .iter()
                    .filter_map(|g| g.membership.leader.map(|l| (g.group, l)))
                    .collect::<Vec<_>>()),
                Ok(Err(e)) => Err(format!("refused: {e}")),
                Err(_) => Err("no answer in 30 s".into()),
            }
        }
    };
    let mut st = lock(state);
    st.busy = false;
    let what = if draining { "drain" } else { "undrain" };
    match r {
        Ok(leaders) => {
            if !draining {
                st.marked = None;
            }
            drop(st);
            w.fault(
                what,
                format!("node {target} via node {via}: ok, leaders (group, node) {leaders:?}"),
            );
        }
        Err(e) => {
            drop(st);
            w.fault(
                &format!("{what}_failed"),
                format!("node {target} via node {via}: {e}"),
            );
        }
    }
}
