package dev.lockd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.lockd.v1.GroupLease;
import dev.lockd.v1.GroupLeaseState;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CyclicBarrier;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;

/**
 * Leases per group (docs/API.md, "Leases per group"): the rule on synthetic replies, ported test
 * by test from the Python client's tests/test_unit.py (itself lockd-client's lease.rs tests).
 */
class LeasesTest {
  static final double TTL = 15.0;
  static final double MARGIN = 3.0; // the default margin is TTL/5

  static GroupLease ext(int group) {
    return ext(group, 0, 15_000);
  }

  static GroupLease ext(int group, long moves) {
    return ext(group, moves, 15_000);
  }

  static GroupLease ext(int group, long moves, long ttlMs) {
    return GroupLease.newBuilder().setGroup(group)
        .setState(GroupLeaseState.GROUP_LEASE_STATE_EXTENDED).setTtlMs(ttlMs)
        .setGroupMoves(moves).build();
  }

  static GroupLease notHere(int group) {
    return GroupLease.newBuilder().setGroup(group)
        .setState(GroupLeaseState.GROUP_LEASE_STATE_NOT_HERE).build();
  }

  /** UNREACHABLE: the group could not answer (no leader, node down). */
  static GroupLease other(int group) {
    return GroupLease.newBuilder().setGroup(group).setStateValue(3)
        .setError("group 1: no leader").build();
  }

  static List<GroupLease> gl(GroupLease... g) {
    return List.of(g);
  }

  @Test
  void aLockFollowsItsGroupsDeadlineWhileTheMoveCountHolds() {
    // (a) Group 1 cannot answer, group 2 keeps extending for longer than the TTL: a lock in group
    // 2 stays held and the session goes on; a lock in group 1 is lost at group 1's deadline.
    assertEquals(3, GroupLeases.UNREACHABLE);
    assertEquals(GroupLeaseState.GROUP_LEASE_STATE_UNREACHABLE_VALUE, GroupLeases.UNREACHABLE);
    GroupLeases l = new GroupLeases(100.0, TTL, MARGIN);
    assertEquals(112.0, l.deadlineAll());
    assertEquals(112.0, l.sessionDeadline());
    HoldLease h = l.granted(101.0, 101.1, 2, 5, 15_000);
    assertEquals(new HoldLease(2, 5, 0, 0), h);
    assertEquals(112.0, l.deadlineOf(h));
    HoldLease one = l.granted(101.0, 101.1, 1, 0, 15_000);
    assertEquals(GroupLeases.Outcome.EXTENDED, l.renewed(102.0, 15_000, gl(ext(1), ext(2, 5)),
        102.1));
    assertEquals(114.0, l.deadlineAll());
    assertEquals(114.0, l.deadlineOf(h));
    assertEquals(114.0, l.deadlineOf(one));
    for (double sent : new double[] {107.0, 112.0, 117.0, 122.0}) {
      assertEquals(GroupLeases.Outcome.UNCHANGED, l.renewed(sent, 15_000,
          gl(other(1), ext(2, 5)), sent + 0.1));
      assertEquals(sent + TTL - MARGIN, l.deadlineOf(h));
      assertEquals(sent + TTL - MARGIN, l.lockDeadline(h));
      assertEquals(sent + TTL - MARGIN, l.sessionDeadline(), "the latest group deadline");
    }
    assertEquals(114.0, l.deadlineAll(), "only a reply every group answered moves it");
    assertEquals(114.0, l.group(1).deadline);
    assertEquals(114.0, l.deadlineOf(one));
    assertEquals(114.0, l.lockDeadline(one));
    assertTrue(l.deadlineOf(h) > 125.0 && 125.0 > l.deadlineAll());
    assertFalse(l.sessionExpired(130.0));
    assertEquals(134.0, l.sessionDeadline());
    assertTrue(l.lockDeadline(one) <= 114.0 && 114.0 < l.lockDeadline(h));
    assertTrue(l.whyLost(one).contains("lock group 1") && l.whyLost(one).contains(
        "could not answer"));
    // A group's own ttl counts (never more than the session's TTL).
    l.renewed(123.0, 9_000, gl(other(1), ext(2, 5, 9_000)), 123.1);
    assertEquals(134.0, l.deadlineOf(h)); // 122 + 12 is later: deadlines only move forward
    l.renewed(124.0, 60_000, gl(other(1), ext(2, 5, 60_000)), 124.1);
    assertEquals(136.0, l.deadlineOf(h));
    // Group 2 stops answering too: the session is lost when its last deadline passes, and a
    // reply after that revives nothing.
    assertFalse(l.sessionExpired(135.9));
    assertTrue(l.sessionExpired(136.0));
    assertEquals(GroupLeases.Outcome.TOO_LATE, l.renewed(130.0, 15_000, gl(ext(1), ext(2, 5)),
        136.5));
    assertEquals(136.0, l.deadlineOf(h));
    assertEquals(114.0, l.deadlineAll());
  }

  @Test
  void aGroupStaysNamedForOneTtlAfterItsLastUse() {
    GroupLeases l = new GroupLeases(100.0, TTL, MARGIN);
    l.homed(1, 100.0, 100.0);
    l.started(3, 101.0, 15_000, 101.0);
    l.granted(101.0, 101.0, 3, 0, 15_000);
    // Released before any keepalive saw it: group 3 is named until 101 + 15.
    assertEquals(List.of(1, 3), l.keepaliveGroups(List.of(), List.of(), false, 102.0));
    assertEquals(List.of(1, 3), l.keepaliveGroups(List.of(), List.of(), false, 115.0));
    assertEquals(List.of(1), l.keepaliveGroups(List.of(), List.of(), false, 116.0));
    // A wait a keepalive saw counts as a use too.
    assertEquals(List.of(1, 4), l.keepaliveGroups(List.of(), List.of(4), false, 117.0));
    assertEquals(List.of(1, 4), l.keepaliveGroups(List.of(), List.of(), false, 131.0));
    assertEquals(List.of(1), l.keepaliveGroups(List.of(), List.of(), false, 132.0));
  }

  @Test
  void keepalivesNameTheHomeAndTheGroupsInUse() {
    GroupLeases l = new GroupLeases(100.0, TTL, MARGIN);
    assertEquals(List.of(), l.keepaliveGroups(List.of(), List.of(), false, 100.0),
        "no home: every group");
    l.homed(1, 100.0, 100.0);
    assertEquals(List.of(1), l.keepaliveGroups(List.of(), List.of(), false, 100.0));
    assertEquals(112.0, l.group(1).deadline);
    // An acquire sent at 102 adopted the session in group 3 (lease_started).
    l.started(3, 102.0, 15_000, 102.0);
    HoldLease h = l.granted(102.0, 102.0, 3, 4, 15_000);
    assertEquals(114.0, l.deadlineOf(h), "counted from its own send");
    assertEquals(List.of(1, 3, 5), l.keepaliveGroups(List.of(h), List.of(5), false, 102.0));
    assertEquals(List.of(), l.keepaliveGroups(List.of(h), List.of(), true, 102.0), "unsure");
    // A named reply with no move renews the session-wide deadline too.
    assertEquals(GroupLeases.Outcome.EXTENDED, l.renewed(105.0, 15_000, gl(ext(1), ext(3, 4)),
        105.0, true));
    assertEquals(117.0, l.deadlineOf(h));
    assertEquals(117.0, l.deadlineAll());
    // Group 3 reports a move: the named reply leaves deadline_all, the lock follows it from the
    // last reply without a move, and the next keepalive asks every group.
    assertEquals(GroupLeases.Outcome.UNCHANGED, l.renewed(109.0, 15_000, gl(ext(1), ext(3, 5)),
        109.0, true));
    assertEquals(117.0, l.deadlineOf(h));
    assertEquals(List.of(), l.keepaliveGroups(List.of(h), List.of(), false, 109.0));
    // Every group answers in time: the moved lock goes on.
    l.renewed(113.0, 15_000, gl(ext(1), ext(2, 7), ext(3, 5)), 113.0);
    assertEquals(125.0, l.deadlineOf(h));
  }

  @Test
  void aGrantInAnUnnamedGroupCountsFromTheEarliestAcquireThatMayHaveAdopted() {
    GroupLeases l = new GroupLeases(100.0, TTL, MARGIN);
    l.homed(1, 100.0, 100.0);
    l.renewed(110.0, 15_000, gl(ext(1)), 110.0, true);
    assertEquals(122.0, l.deadlineAll());
    HoldLease stale = l.granted(109.0, 111.0, 2, 0, 15_000);
    assertEquals(112.0, l.deadlineOf(stale), "a named keepalive says nothing of group 2");
    l.renewed(113.0, 15_000, gl(ext(1), notHere(2), ext(3)), 113.0);
    HoldLease h = l.granted(115.0, 115.0, 4, 0, 15_000, 114.0);
    assertEquals(125.0, l.deadlineOf(h));
    h = l.granted(115.0, 115.0, 5, 0, 15_000, 111.0);
    assertEquals(123.0, l.deadlineOf(h));
    l.noteUnsure(112.0);
    h = l.granted(116.0, 116.0, 6, 0, 15_000);
    assertEquals(124.0, l.deadlineOf(h));
    l.started(7, 116.0, 15_000, 116.0);
    HoldLease adopted = l.granted(116.0, 116.0, 7, 0, 15_000);
    assertEquals(128.0, l.deadlineOf(adopted));
  }

  @Test
  void anAdoptionEndsTheLeaseTheClientKnewThere() {
    GroupLeases l = new GroupLeases(100.0, TTL, MARGIN);
    l.homed(1, 100.0, 100.0);
    l.started(2, 101.0, 15_000, 101.0);
    HoldLease old = l.granted(101.0, 101.0, 2, 0, 15_000);
    l.started(2, 105.0, 15_000, 106.0);
    assertEquals(106.0, l.deadlineOf(old), "lost when the adoption said the lease had ended");
    HoldLease nw = l.granted(105.0, 106.0, 2, 0, 15_000);
    assertEquals(117.0, l.deadlineOf(nw));
  }

  @Test
  void aGrantWithARenewalCountsFromItsSendAndTheLapsedLeasesLocksStayLost() {
    GroupLeases plain = new GroupLeases(100.0, TTL, MARGIN);
    plain.homed(1, 100.0, 100.0);
    plain.started(2, 101.0, 15_000, 101.0);
    HoldLease old = plain.granted(101.0, 101.0, 2, 0, 15_000);
    assertEquals(113.0, plain.deadlineOf(old));
    plain.renewed(110.0, 15_000, gl(ext(1)), 110.0, true);
    GroupLeases renewing = plain.copy();
    HoldLease lost = plain.granted(112.5, 113.5, 2, 0, 15_000);
    assertTrue(plain.deadlineOf(lost) <= 113.5, "lost at once");
    renewing.renewedIn(2, 112.5, 15_000, 0, 113.5);
    HoldLease kept = renewing.granted(112.5, 113.5, 2, 0, 15_000);
    assertEquals(124.5, renewing.deadlineOf(kept));
    assertEquals(113.0, renewing.deadlineOf(old));
    assertEquals(122.0, renewing.deadlineAll());
    GroupLeases gone = new GroupLeases(100.0, TTL, MARGIN);
    gone.homed(1, 100.0, 100.0);
    gone.renewedIn(1, 113.0, 15_000, 0, 113.0);
    assertEquals(112.0, gone.sessionDeadline());
  }

  @Test
  void aLockFollowsTheSessionWideDeadlineOnceItsGroupsMoveCountRose() {
    GroupLeases l = new GroupLeases(100.0, TTL, MARGIN);
    l.renewed(101.0, 15_000, gl(ext(1), ext(2, 5)), 101.1);
    HoldLease h = l.granted(101.5, 101.6, 2, 5, 15_000);
    l.renewed(106.0, 15_000, gl(other(1), ext(2, 5)), 106.1);
    assertEquals(118.0, l.deadlineOf(h));
    assertEquals(113.0, l.deadlineAll());
    // Group 2 extends at a higher move count: the lock falls back to deadline_all.
    l.renewed(107.0, 15_000, gl(other(1), ext(2, 6)), 107.1);
    assertEquals(113.0, l.deadlineOf(h));
    assertEquals(113.0, l.deadlineAll());
    // A late answer with the old count does not lower the count (the max is kept).
    l.renewed(106.5, 15_000, gl(other(1), ext(2, 5)), 107.2);
    assertEquals(6, l.group(2).moves);
    assertEquals(113.0, l.deadlineOf(h));
    // Only a reply every group answered moves it on.
    l.renewed(108.0, 15_000, gl(ext(1), ext(2, 6)), 108.1);
    assertEquals(120.0, l.deadlineOf(h));
    assertEquals(120.0, l.deadlineAll());
    // A grant after the move follows group 2 again; a grant at a higher count raises moves.
    HoldLease later = l.granted(108.5, 108.6, 2, 6, 15_000);
    assertEquals(120.0, l.deadlineOf(later));
    l.renewed(110.0, 15_000, gl(other(1), ext(2, 6)), 110.1);
    assertEquals(122.0, l.deadlineOf(later));
    assertEquals(120.0, l.deadlineOf(h));
    HoldLease newer = l.granted(110.5, 110.6, 2, 7, 15_000);
    assertEquals(7, l.group(2).moves);
    assertEquals(122.0, l.deadlineOf(newer));
    assertEquals(120.0, l.deadlineOf(later));
  }

  @Test
  void notHereForItsGroupMakesALockLost() {
    GroupLeases l = new GroupLeases(100.0, TTL, MARGIN);
    HoldLease a = l.granted(101.0, 101.1, 1, 0, 15_000);
    HoldLease b = l.granted(101.0, 101.1, 2, 0, 15_000);
    assertEquals(GroupLeases.Outcome.EXTENDED, l.renewed(102.0, 15_000,
        gl(notHere(1), ext(2)), 102.1));
    assertTrue(l.deadlineOf(a) <= 102.1, "lost when the client learnt it");
    assertEquals(114.0, l.deadlineOf(b));
    assertEquals(114.0, l.deadlineAll());
    int epoch = l.group(1).epoch;
    l.renewed(105.0, 15_000, gl(ext(1), ext(2)), 105.1);
    assertTrue(l.deadlineOf(a) <= 102.1, "a lost lease stays lost");
    // A later grant there (the acquire adopted the session in group 1) is a new epoch.
    HoldLease c = l.granted(106.0, 106.1, 1, 0, 15_000);
    assertEquals(epoch, c.epoch());
    assertEquals(117.0, l.deadlineOf(c));
    // A not_here from a keepalive sent before that grant arrived may predate the adoption: it
    // ends nothing.
    l.renewed(106.05, 15_000, gl(notHere(1), ext(2)), 106.2);
    assertEquals(117.0, l.deadlineOf(c));
    assertEquals(epoch, l.group(1).epoch);
    // Without a lock there, not_here forgets the group's lease; the next grant starts one.
    GroupLeases l2 = new GroupLeases(100.0, TTL, MARGIN);
    l2.renewed(101.0, 15_000, gl(ext(1), ext(2)), 101.1);
    l2.renewed(102.0, 15_000, gl(notHere(1), ext(2)), 102.1);
    assertEquals(0, l2.group(1).epoch);
    assertNull(l2.group(1).deadline);
    HoldLease d = l2.granted(103.0, 103.1, 1, 0, 15_000);
    assertEquals(114.0, l2.deadlineOf(d)); // 103 + 12, capped at deadline_all
  }

  @Test
  void aLateExtensionDoesNotReviveALockButALaterGrantHolds() {
    GroupLeases l = new GroupLeases(100.0, TTL, MARGIN);
    l.renewed(101.0, 15_000, gl(ext(1), ext(2), ext(3)), 101.1);
    HoldLease b = l.granted(101.5, 101.6, 2, 0, 15_000);
    HoldLease c = l.granted(102.0, 102.1, 2, 0, 15_000);
    l.renewed(106.0, 15_000, gl(other(1), ext(2), ext(3)), 106.1);
    assertEquals(118.0, l.deadlineOf(b));
    assertEquals(118.0, l.deadlineOf(c));
    l.renewed(112.0, 15_000, gl(other(1), other(2), ext(3)), 112.1);
    assertEquals(124.0, l.sessionDeadline());
    // Sent at 117.5, answered at 118.5: group 2's deadline (118) had passed.
    assertEquals(GroupLeases.Outcome.UNCHANGED, l.renewed(117.5, 15_000,
        gl(other(1), ext(2), ext(3)), 118.5));
    assertEquals(118.0, l.deadlineOf(b), "acknowledged after its deadline: still lost");
    assertEquals(118.0, l.deadlineOf(c), "the same lease as b");
    assertEquals(1, l.group(2).epoch);
    assertEquals(129.5, l.group(2).deadline);
    l.renewed(122.0, 15_000, gl(other(1), ext(2)), 122.1);
    assertEquals(118.0, l.deadlineOf(b), "later renewals do not revive it either");
    HoldLease d = l.granted(122.5, 122.6, 2, 0, 15_000);
    assertEquals(1, d.epoch());
    assertEquals(134.0, l.deadlineOf(d));
  }

  @Test
  void aReplyWithoutGroupsFallsBackToTheSessionWideDeadline() {
    GroupLeases l = new GroupLeases(100.0, TTL, MARGIN);
    assertEquals(GroupLeases.Outcome.EXTENDED, l.renewed(105.0, 15_000, gl(), 105.1));
    assertEquals(117.0, l.deadlineAll());
    HoldLease h = l.granted(106.0, 106.1, 0, 0, 15_000); // an older service says group 0
    assertEquals(117.0, l.deadlineOf(h));
    for (double sent : new double[] {110.0, 115.0}) {
      l.renewed(sent, 15_000, gl(), sent + 0.1);
      assertEquals(sent + TTL - MARGIN, l.deadlineOf(h));
      assertEquals(l.deadlineAll(), l.deadlineOf(h));
    }
    // A shorter ttl_ms in the answer counts as is; an older renewal changes nothing.
    assertEquals(GroupLeases.Outcome.EXTENDED, l.renewed(121.0, 10_000, gl(), 121.1));
    assertEquals(128.0, l.deadlineOf(h));
    assertEquals(128.0, l.deadlineAll());
    assertEquals(GroupLeases.Outcome.UNCHANGED, l.renewed(115.5, 15_000, gl(), 121.2));
    // Answered after the deadline: too late, nothing moves.
    assertEquals(128.0, l.sessionDeadline());
    assertEquals(GroupLeases.Outcome.TOO_LATE, l.renewed(127.0, 15_000, gl(), 128.5));
    assertEquals(128.0, l.deadlineAll());
    assertTrue(l.sessionExpired(128.5));
  }

  @Test
  void aLockThatFollowedDeadlineAllStaysLostOnceItRestarts() {
    GroupLeases l = new GroupLeases(100.0, TTL, MARGIN);
    l.renewed(101.0, 15_000, gl(ext(1), ext(2, 5)), 101.1);
    HoldLease h = l.granted(101.5, 101.6, 2, 5, 15_000);
    assertEquals(113.0, l.deadlineOf(h));
    long changes = l.changes();
    // A bucket moved in or out of group 2 (count 6): h may live in group 1 now.
    assertEquals(GroupLeases.Outcome.UNCHANGED, l.renewed(106.0, 15_000,
        gl(other(1), ext(2, 6)), 106.1));
    assertTrue(l.changes() > changes);
    assertEquals(113.0, l.deadlineOf(h));
    assertEquals(113.0, l.deadlineAll());
    assertEquals(118.0, l.group(2).deadline);
    assertEquals(GroupLeases.Outcome.UNCHANGED, l.renewed(110.0, 15_000,
        gl(other(1), ext(2, 6)), 110.1));
    assertEquals(113.0, l.lockDeadline(h), "lost when deadline_all lapses");
    assertFalse(l.sessionExpired(113.0));
    assertEquals(122.0, l.sessionDeadline(), "the session goes on");
    assertTrue(l.whyLost(h).contains("session-wide deadline"));
    // Every group answers again, after deadline_all (113) had passed: it restarts from this
    // reply, in a new all_epoch; h stays lost (at the deadline it lapsed at).
    changes = l.changes();
    assertEquals(GroupLeases.Outcome.RESTARTED, l.renewed(114.0, 15_000,
        gl(ext(1), ext(2, 6)), 114.1));
    assertEquals(1, l.allEpoch());
    assertEquals(126.0, l.deadlineAll());
    assertTrue(l.changes() > changes);
    assertEquals(113.0, l.deadlineOf(h));
    assertEquals(113.0, l.lockDeadline(h));
    assertEquals(GroupLeases.Outcome.EXTENDED, l.renewed(118.0, 15_000,
        gl(ext(1), ext(2, 6)), 118.1));
    assertEquals(113.0, l.deadlineOf(h));
    assertEquals(130.0, l.deadlineAll(), "later renewals revive nothing");
    // Grants after the restart are fine: one at the new count follows group 2's deadline ...
    HoldLease later = l.granted(118.5, 118.6, 2, 6, 15_000);
    assertEquals(1, later.allEpoch());
    assertEquals(130.0, l.deadlineOf(later));
    // ... and once a move makes it follow deadline_all, it follows the live one.
    l.renewed(120.0, 15_000, gl(other(1), ext(2, 7)), 120.1);
    assertEquals(130.0, l.deadlineOf(later));
    assertEquals(130.0, l.deadlineAll());
    assertEquals(132.0, l.group(2).deadline);
    // A reply every group answered that arrives when even its own deadline has passed restarts
    // nothing.
    assertEquals(GroupLeases.Outcome.UNCHANGED, l.renewed(117.0, 15_000,
        gl(ext(1), ext(2, 7)), 131.0));
    assertEquals(1, l.allEpoch());
    assertEquals(130.0, l.deadlineAll());
  }

  @Test
  void aPushedSessionEndedForOneGroupEndsOnlyThatGroupsLease() {
    GroupLeases l = new GroupLeases(100.0, TTL, MARGIN);
    l.renewed(101.0, 15_000, gl(ext(1), ext(2)), 101.1);
    HoldLease a = l.granted(101.5, 101.6, 1, 0, 15_000);
    HoldLease a2 = l.granted(104.0, 104.1, 1, 0, 15_000);
    HoldLease b = l.granted(101.5, 101.6, 2, 0, 15_000);
    l.renewed(105.0, 15_000, gl(other(1), ext(2)), 105.1);
    long changes = l.changes();
    l.groupEnded(1, 106.0);
    assertTrue(l.changes() > changes);
    assertEquals(106.0, l.lockDeadline(a), "lost when the push arrived");
    assertEquals(106.0, l.lockDeadline(a2));
    assertTrue(l.whyLost(a).contains("lock group 1") && l.whyLost(a).contains("ended"));
    assertEquals(117.0, l.deadlineOf(b));
    assertNull(l.group(1).deadline);
    assertFalse(l.sessionExpired(110.0));
    assertEquals(117.0, l.sessionDeadline());
    HoldLease c = l.granted(106.5, 106.6, 1, 0, 15_000);
    assertEquals(a.epoch() + 1, c.epoch());
    assertEquals(113.0, l.deadlineOf(c)); // 106.5 + 12, capped by deadline_all
    l.renewed(107.0, 15_000, gl(ext(1), ext(2)), 107.1);
    assertEquals(119.0, l.deadlineOf(c));
    assertEquals(106.0, l.lockDeadline(a), "a stays lost");
    // A push for a group the client never heard of changes nothing.
    l.groupEnded(9, 108.0);
    assertEquals(119.0, l.deadlineOf(c));
    assertEquals(119.0, l.deadlineOf(b));
  }

  @Test
  void everyGroupNotHereMeansTheSessionIsGone() {
    GroupLeases l = new GroupLeases(100.0, TTL, MARGIN);
    l.renewed(101.0, 15_000, gl(ext(1), ext(2)), 101.1);
    HoldLease a = l.granted(101.5, 101.6, 1, 0, 15_000);
    assertEquals(GroupLeases.Outcome.EXTENDED, l.renewed(102.0, 15_000,
        gl(notHere(1), ext(2)), 102.1));
    assertFalse(l.sessionExpired(102.2));
    assertEquals(GroupLeases.Outcome.GONE, l.renewed(103.0, 15_000,
        gl(notHere(1), notHere(2)), 103.1));
    assertTrue(l.sessionExpired(103.1));
    assertEquals(103.1, l.sessionDeadline());
    assertTrue(l.lockDeadline(a) <= 103.1);
    assertEquals(GroupLeases.Outcome.TOO_LATE, l.renewed(104.0, 15_000, gl(ext(1), ext(2)),
        104.1));
  }

  @Test
  void lockLeaseWatchersFireOnceForTheLockOrItsSession() {
    double t = Clock.now(); // an hour's lease: only `end` loses these
    Leases.Lease session = new Leases.Lease(1, "s", new GroupLeases(t, 3600.0, 1.0));
    Leases.LockLease a = new Leases.LockLease(session, session.leases.granted(t, t, 1, 0,
        3_600_000));
    Leases.LockLease b = new Leases.LockLease(session, session.leases.granted(t, t, 2, 0,
        3_600_000));
    List<String> fired = new ArrayList<>();
    a.watch(() -> fired.add("a"));
    b.watch(() -> fired.add("b"));
    b.watch(() -> fired.add("b2"));
    a.end("group 1 ended it");
    a.end("again");
    assertEquals(List.of("a"), fired);
    assertTrue(a.isLost());
    assertEquals("group 1 ended it", a.why);
    assertFalse(b.isLost());
    session.end("closed");
    assertEquals(List.of("a", "b", "b2"), fired);
    assertEquals("closed", b.why);
    List<Integer> late = new ArrayList<>();
    b.watch(() -> late.add(1));
    assertEquals(List.of(1), late, "watching a lost lock calls back at once");
    // An unwatched lock leaves nothing registered with its session.
    Leases.Lease s2 = new Leases.Lease(2, "s2", new GroupLeases(t, 3600.0, 1.0));
    Leases.LockLease c = new Leases.LockLease(s2, s2.leases.granted(t, t, 1, 0, 3_600_000));
    Runnable cb = () -> { };
    c.watch(cb);
    assertEquals(1, s2.watcherCount());
    c.unwatch(cb);
    assertEquals(0, s2.watcherCount());
  }

  @Test
  void aWatchRacingAWatchOrAnUnwatchKeepsTheSessionRegistrationExactlyOnce() throws Exception {
    // The first watcher registers the lock with its session and the last unwatch takes it off.
    // Raced, the two steps must not leave a lock with watchers but no registration (its
    // session's end would not reach them), nor two registrations (one leaks past the unwatch).
    double t = Clock.now();
    ExecutorService pool = Executors.newFixedThreadPool(2);
    List<String> bad = new ArrayList<>();
    try {
      CyclicBarrier go = new CyclicBarrier(2);
      double end = Clock.now() + 10;
      for (int i = 0; i < 100_000 && Clock.now() < end && bad.size() < 5; i++) {
        Leases.Lease session = new Leases.Lease(1, "s", new GroupLeases(t, 3600.0, 1.0));
        Leases.LockLease ll = new Leases.LockLease(session, session.leases.granted(t, t, 1, 0,
            3_600_000));
        Runnable a = () -> { };
        Runnable b = () -> { };
        boolean unwatchRace = i % 2 == 1;
        if (unwatchRace) {
          ll.watch(a);
        }
        Future<?> f1 = pool.submit(() -> {
          go.await(5, TimeUnit.SECONDS);
          if (unwatchRace) {
            ll.unwatch(a);
          } else {
            ll.watch(a);
          }
          return null;
        });
        Future<?> f2 = pool.submit(() -> {
          go.await(5, TimeUnit.SECONDS);
          ll.watch(b);
          return null;
        });
        f1.get(5, TimeUnit.SECONDS);
        f2.get(5, TimeUnit.SECONDS);
        int expect = ll.watcherCount() > 0 ? 1 : 0;
        if (session.watcherCount() != expect) {
          bad.add("iteration " + i + (unwatchRace ? " (unwatch race)" : " (watch race)")
              + ": " + ll.watcherCount() + " watcher(s), " + session.watcherCount()
              + " registration(s)");
        }
        ll.unwatch(a);
        ll.unwatch(b);
        if (session.watcherCount() != 0) {
          bad.add("iteration " + i + ": a registration left after every unwatch");
        }
      }
    } finally {
      pool.shutdownNow();
    }
    assertEquals(List.of(), bad);
  }
}
