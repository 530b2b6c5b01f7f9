package dev.lockd.client;

import dev.lockd.v1.GroupLease;
import dev.lockd.v1.GroupLeaseState;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;

/**
 * A session's leases, one per lock group, and the session-wide one (docs/API.md, "Leases per
 * group"); the same rule as lockd-client's {@code GroupLeases} (crates/lockd-client/src/lease.rs)
 * and the Python client's {@code _lease.py}.
 *
 * <p>Pure: every time is an input (seconds on {@link Clock}), so the rule is tested without a
 * service. Each deadline is {@code send time of a renewal + TTL - margin}, and moves only forward.
 *
 * <ul>
 *   <li>{@code deadlineAll} (the session-wide deadline) moves only with a keepalive reply in which
 *       every listed group answered {@code extended} or {@code not_here} (a reply without groups
 *       counts as every group extended with the reply's ttl). A group that could not answer
 *       (UNREACHABLE) extends nothing and keeps the reply from counting. When such a reply
 *       arrives after {@code deadlineAll} had passed, it restarts from it and {@code allEpoch} is
 *       bumped: the holds that followed it are lost for good.
 *   <li>Per group: {@code deadline} (last reply that said extended for it), {@code moves} (highest
 *       move count seen, never lowered) and {@code epoch}, bumped when the client learns the
 *       lease there ended: the group answered {@code not_here} although a grant of the epoch
 *       arrived before the keepalive was sent, or an {@code extended} arrived after the group's
 *       deadline had passed. A lost lease stays lost for the holds of its epoch.
 *   <li>A group's lease also ends when the service pushes {@code SessionEnded} for that group
 *       ({@link #groupEnded}).
 *   <li>A hold follows its group's deadline while the group's move count is still the grant's;
 *       once the count differs it follows {@code deadlineAll}, and is lost if {@code allEpoch}
 *       moved since its grant; once its group's epoch ended it is lost.
 *   <li>The session itself is lost when {@link #sessionDeadline()} passes: the latest of {@code
 *       deadlineAll} and every group's deadline, or at once when every group answered {@code
 *       not_here}.
 * </ul>
 *
 * <p>Thread-safe: every method synchronizes on the instance (the engine writes, callers read).
 */
final class GroupLeases {
  /** A group's answer to a keepalive, by number (stubs may predate a state). */
  static final int EXTENDED = GroupLeaseState.GROUP_LEASE_STATE_EXTENDED_VALUE;
  static final int NOT_HERE = GroupLeaseState.GROUP_LEASE_STATE_NOT_HERE_VALUE;
  static final int UNREACHABLE = 3;

  /** What {@link #renewed} did. */
  enum Outcome { TOO_LATE, GONE, EXTENDED, UNCHANGED, RESTARTED }

  static final class GroupState {
    /** Send time of the last keepalive this group extended + its ttl - margin; null while the
     * session has no lease there that the client knows of (after not_here). */
    Double deadline;
    /** The highest move count the group reported. */
    long moves;
    int epoch;
    /** When the first grant of this epoch arrived (null: none yet). */
    Double firstGrant;
    /** Ended epochs: when each counts as having ended. */
    final Map<Integer, Double> endedAt = new HashMap<>();
    /** Why the group last could not answer; cleared when it extends. */
    String error = "";

    GroupState(Double deadline, long moves) {
      this.deadline = deadline;
      this.moves = moves;
    }
  }

  final double ttl;
  final double margin;
  double deadlineAll;
  int allEpoch;
  final Map<Integer, Double> allEndedAt = new HashMap<>();
  final Map<Integer, GroupState> groups = new TreeMap<>();
  /** When every group answered not_here (the session is gone); null until then. */
  Double goneAt;
  /** Counts the changes that can make a hold (or the session) lost before its deadline as last
   * computed. */
  long changes;
  /** The lock group that opened the session (null: a service that opens sessions in every
   * group; then every keepalive asks every group). */
  Integer home;
  /** When the session last used each group. */
  Map<Integer, Double> used = new HashMap<>();
  /** The send time of the earliest acquire whose answer a broken stream took. */
  Double unsureSince;
  /** Send time + ttl - margin of the last keepalive that asked every group (or of the open). */
  double everyDeadline;

  GroupLeases(double sent, double ttl, double margin) {
    this.ttl = ttl;
    this.margin = margin;
    this.deadlineAll = sent + ttl - margin;
    this.everyDeadline = sent + ttl - margin;
  }

  /** The open sent at {@code sent} was answered by lock group {@code home} (0: a service that
   * opens sessions in every group). */
  synchronized void homed(int home, double sent, double now) {
    if (home == 0) {
      return;
    }
    this.home = home;
    started(home, sent, 0, now);
  }

  /**
   * The groups a keepalive sent at {@code now} should renew: the home, every group a hold or a
   * queued wait lives in, and every group the session used within the last TTL. Empty means
   * every lock group: asked while a hold may have left its group, while {@code unsure}, and for
   * a service that opens sessions in every group.
   */
  synchronized List<Integer> keepaliveGroups(Iterable<HoldLease> holds, Iterable<Integer> waits,
      boolean unsure, double now) {
    if (home == null) {
      return List.of();
    }
    TreeSet<Integer> named = new TreeSet<>();
    named.add(home);
    boolean moved = false;
    for (HoldLease h : holds) {
      GroupState st = groups.get(h.group());
      moved = moved || st == null || st.moves != h.groupMoves();
      named.add(h.group());
    }
    for (Integer w : waits) {
      named.add(w);
    }
    for (Integer g : named) {
      used.put(g, now);
    }
    used.entrySet().removeIf(e -> !(e.getValue() + ttl > now));
    if (unsure || moved) {
      return List.of();
    }
    named.addAll(used.keySet());
    return new ArrayList<>(named);
  }

  /** An acquire sent at {@code sent} lost its answer with a broken stream. */
  synchronized void noteUnsure(double sent) {
    unsureSince = unsureSince == null ? sent : Math.min(unsureSince, sent);
  }

  /** A request sent at {@code sent} started the session's lease in {@code group}. */
  synchronized void started(int group, double sent, long ttlMs, double now) {
    used.put(group, now);
    double d = deadline(sent, ttlMs);
    GroupState st = groups.get(group);
    if (st == null) {
      groups.put(group, new GroupState(d, 0));
      return;
    }
    if (st.deadline == null) {
      st.deadline = d;
    } else if (st.firstGrant == null || st.firstGrant <= sent) {
      endEpoch(st, Math.min(st.deadline, now));
      st.deadline = d;
    }
  }

  /** The latest of deadlineAll and every group's deadline; once every group answered not_here,
   * when that answer arrived. */
  synchronized double sessionDeadline() {
    double d = deadlineAll;
    for (GroupState st : groups.values()) {
      if (st.deadline != null && st.deadline > d) {
        d = st.deadline;
      }
    }
    if (goneAt != null) {
      d = Math.min(d, goneAt);
    }
    return d;
  }

  synchronized boolean sessionExpired(double now) {
    return now >= sessionDeadline();
  }

  private double deadline(double sent, long ttlMs) {
    double t = ttlMs <= 0 ? ttl : Math.min(ttl, ttlMs / 1000.0);
    return sent + t - margin;
  }

  /**
   * A keepalive (or attach) sent at {@code sent} was answered at {@code now}. {@code named}: the
   * keepalive named the groups it renews; such a reply renews deadlineAll only if no group
   * reported a move count above the one the client knew.
   */
  synchronized Outcome renewed(double sent, long ttlMs, List<GroupLease> gls, double now,
      boolean named) {
    if (sessionExpired(now)) {
      return Outcome.TOO_LATE;
    }
    boolean every = true;
    if (named) {
      for (GroupLease gl : gls) {
        GroupState st = groups.get(gl.getGroup());
        if (gl.getStateValue() == EXTENDED && st != null && gl.getGroupMoves() > st.moves) {
          every = false;
          break;
        }
      }
    }
    if (gls.isEmpty()) {
      for (GroupState known : groups.values()) {
        extended(known, sent, ttlMs, known.moves, now);
      }
    }
    for (GroupLease gl : gls) {
      int state = gl.getStateValue();
      if (state == EXTENDED) {
        GroupState st = groups.get(gl.getGroup());
        if (st == null) {
          groups.put(gl.getGroup(), new GroupState(deadline(sent, gl.getTtlMs()),
              gl.getGroupMoves()));
        } else {
          extended(st, sent, gl.getTtlMs(), gl.getGroupMoves(), now);
        }
      } else if (state == NOT_HERE) {
        notHere(gl.getGroup(), sent, now);
      } else {
        every = false;
        GroupState st = groups.get(gl.getGroup());
        if (st != null) {
          st.error = gl.getError().isEmpty() ? "unreachable" : gl.getError();
        }
      }
    }
    if (!gls.isEmpty() && gls.stream().allMatch(gl -> gl.getStateValue() == NOT_HERE)) {
      goneAt = now;
      changes++;
      return Outcome.GONE;
    }
    if (!every) {
      return Outcome.UNCHANGED;
    }
    double d = deadline(sent, ttlMs);
    if (!named) {
      everyDeadline = Math.max(everyDeadline, d);
    }
    if (now >= deadlineAll) {
      if (d <= now) {
        return Outcome.UNCHANGED;
      }
      allEndedAt.put(allEpoch, deadlineAll);
      allEpoch++;
      deadlineAll = d;
      changes++;
      return Outcome.RESTARTED;
    }
    if (d > deadlineAll) {
      deadlineAll = d;
      return Outcome.EXTENDED;
    }
    return Outcome.UNCHANGED;
  }

  synchronized Outcome renewed(double sent, long ttlMs, List<GroupLease> gls, double now) {
    return renewed(sent, ttlMs, gls, now, false);
  }

  private void raiseMoves(GroupState st, long moves) {
    if (moves > st.moves) {
      st.moves = moves;
      changes++;
    }
  }

  private void extended(GroupState st, double sent, long ttlMs, long moves, double now) {
    raiseMoves(st, moves);
    st.error = "";
    double d = deadline(sent, ttlMs);
    if (st.deadline != null && now >= st.deadline) {
      endEpoch(st, st.deadline);
      st.deadline = d;
    } else if (st.deadline == null || d > st.deadline) {
      st.deadline = d;
    }
  }

  /** An acquire sent at {@code sent} was granted or queued in {@code group}, and the group's
   * leader said it renewed the session's lease there as it did. */
  synchronized void renewedIn(int group, double sent, long ttlMs, long groupMoves, double now) {
    if (sessionExpired(now)) {
      return;
    }
    used.put(group, now);
    GroupState st = groups.get(group);
    if (st == null) {
      groups.put(group, new GroupState(deadline(sent, ttlMs), groupMoves));
    } else {
      extended(st, sent, ttlMs, groupMoves, now);
    }
  }

  /** The service pushed SessionEnded for {@code group}, which arrived at {@code at}. */
  synchronized void groupEnded(int group, double at) {
    notHere(group, at, at);
  }

  private void notHere(int group, double sent, double now) {
    GroupState st = groups.get(group);
    if (st == null) {
      return;
    }
    if (st.firstGrant != null && st.firstGrant > sent) {
      return;
    }
    if (st.firstGrant != null) {
      endEpoch(st, st.deadline == null ? now : Math.min(st.deadline, now));
    }
    st.deadline = null;
    changes++;
  }

  private void endEpoch(GroupState st, double at) {
    st.endedAt.put(st.epoch, at);
    st.epoch++;
    st.firstGrant = null;
    changes++;
  }

  /**
   * A hold granted by {@code group} at its move count {@code groupMoves}, for an acquire sent at
   * {@code sent} and answered at {@code now}. {@code others}: the earliest send of another
   * acquire still unanswered (null: none).
   */
  synchronized HoldLease granted(double sent, double now, int group, long groupMoves,
      long leaseTtlMs, Double others) {
    GroupState st = groups.get(group);
    if (st == null) {
      st = new GroupState(null, groupMoves);
      groups.put(group, st);
    }
    if (st.deadline == null) {
      double start = Math.min(deadline(sent, leaseTtlMs), everyDeadline);
      if (home != null) {
        Double unknown = null;
        for (Double t : new Double[] {others, unsureSince}) {
          if (t != null) {
            unknown = unknown == null ? t : Math.min(unknown, t);
          }
        }
        if (unknown != null) {
          start = Math.min(start, deadline(unknown, 0));
        }
      }
      st.deadline = start;
    }
    raiseMoves(st, groupMoves);
    if (st.firstGrant == null) {
      st.firstGrant = now;
    }
    used.put(group, now);
    return new HoldLease(group, groupMoves, st.epoch, allEpoch);
  }

  synchronized HoldLease granted(double sent, double now, int group, long groupMoves,
      long leaseTtlMs) {
    return granted(sent, now, group, groupMoves, leaseTtlMs, null);
  }

  /** The per-lock rule: when {@code hold} counts as lost, apart from the session's own end. */
  synchronized double deadlineOf(HoldLease hold) {
    GroupState st = groups.get(hold.group());
    if (st != null) {
      if (st.epoch != hold.epoch()) {
        return st.endedAt.getOrDefault(hold.epoch(), Double.NEGATIVE_INFINITY);
      }
      if (st.moves == hold.groupMoves() && st.deadline != null) {
        return st.deadline;
      }
    }
    if (hold.allEpoch() != allEpoch) {
      return allEndedAt.getOrDefault(hold.allEpoch(), Double.NEGATIVE_INFINITY);
    }
    return deadlineAll;
  }

  /** When {@code hold} counts as lost, the session's end included. */
  synchronized double lockDeadline(HoldLease hold) {
    return Math.min(deadlineOf(hold), sessionDeadline());
  }

  synchronized String whyLost(HoldLease hold) {
    GroupState st = groups.get(hold.group());
    if (st != null && st.epoch != hold.epoch()) {
      return "the session's lease in lock group " + hold.group() + " ended";
    }
    if (st != null && st.moves == hold.groupMoves() && st.deadline != null) {
      String why = "the local lease deadline of lock group " + hold.group()
          + " passed without a renewal";
      return why + (st.error.isEmpty() ? "" : " (the group could not answer: " + st.error + ")");
    }
    return "a bucket moved in or out of lock group " + hold.group()
        + " and the session-wide deadline passed before every lock group renewed the lease";
  }

  // Views for tests and the engine.
  synchronized double deadlineAll() {
    return deadlineAll;
  }

  synchronized int allEpoch() {
    return allEpoch;
  }

  synchronized long changes() {
    return changes;
  }

  synchronized GroupState group(int g) {
    return groups.get(g);
  }

  synchronized double everyDeadline() {
    return everyDeadline;
  }

  /** A deep copy (for tests that fork the state). */
  synchronized GroupLeases copy() {
    GroupLeases c = new GroupLeases(0, ttl, margin);
    c.deadlineAll = deadlineAll;
    c.allEpoch = allEpoch;
    c.allEndedAt.putAll(allEndedAt);
    for (Map.Entry<Integer, GroupState> e : groups.entrySet()) {
      GroupState s = e.getValue();
      GroupState n = new GroupState(s.deadline, s.moves);
      n.epoch = s.epoch;
      n.firstGrant = s.firstGrant;
      n.endedAt.putAll(s.endedAt);
      n.error = s.error;
      c.groups.put(e.getKey(), n);
    }
    c.goneAt = goneAt;
    c.changes = changes;
    c.home = home;
    c.used = new HashMap<>(used);
    c.unsureSince = unsureSince;
    c.everyDeadline = everyDeadline;
    return c;
  }
}
