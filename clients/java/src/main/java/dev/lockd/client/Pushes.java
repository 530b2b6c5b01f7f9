package dev.lockd.client;

import dev.lockd.v1.SessionEvent;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.HashMap;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.TreeSet;
import java.util.function.Predicate;

/**
 * Which waiting acquire a pushed {@code granted} or {@code wait_ended} answers: pure bookkeeping,
 * the same rules as the Rust client's {@code pushes.rs} and the Python client's {@code
 * _pushes.py}. A wait is queued by a request on the session stream and answered later by a push
 * that names it by (group, waiter):
 *
 * <ul>
 *   <li><b>The push comes first</b>: a push for an unknown waiter is kept while an acquire of the
 *       same name is still unanswered on the stream (its {@code queued} reply may be on the way).
 *   <li><b>The same outcome is pushed twice</b>: waiters answered lately are remembered, and a
 *       second push for one is dropped, never taken for an orphan and released under a live lock.
 *   <li><b>The stream breaks while a wait is queued</b>: the wait lives on in the group, so the
 *       caller's retry is refused {@code already_waiting} by its own first attempt. Such (name,
 *       owner) pairs are <em>strays</em>; a stray's retry refused that way adopts the queued wait.
 *   <li><b>Nobody is left to take a grant</b>: a grant with no waiter, no unanswered acquire of its
 *       name and no adopter is an <em>orphan</em>, which the engine gives back.
 * </ul>
 *
 * <p>Not thread-safe: the engine's thread owns it.
 */
final class Pushes<A> {
  /** How many of each remembered kind (early pushes, answered waiters, strays) are kept. */
  static final int CAPACITY = 4096;

  record Key(int group, long waiter) {}

  record NameOwner(String name, String owner) {}

  /** What a push resolves to: an answer to an acquire, or an orphan grant to give back. */
  sealed interface Pushed<A> permits Answer, Orphan {}

  /** The push answers this acquire. */
  record Answer<A>(A acq, SessionEvent event) implements Pushed<A> {}

  /** A grant nobody will take: give it back. */
  record Orphan<A>(String name, long token) implements Pushed<A> {}

  /** The result of {@link #refusedWaiting}. */
  record Refused<A>(boolean adopted, Answer<A> answer) {}

  private final Map<Key, A> waits = new HashMap<>();
  private final LinkedHashMap<Key, SessionEvent> early = new LinkedHashMap<>();
  private final LinkedHashSet<Key> answered = new LinkedHashSet<>();
  /** Each stray's first attempt's send time. */
  private final Map<NameOwner, Double> strays = new HashMap<>();
  private final Map<String, Deque<A>> adopters = new LinkedHashMap<>();

  static Key key(SessionEvent ev) {
    if (ev.hasGranted()) {
      return new Key(ev.getGranted().getGroup(), ev.getGranted().getWaiter());
    }
    return new Key(ev.getWaitEnded().getGroup(), ev.getWaitEnded().getWaiter());
  }

  static String name(SessionEvent ev) {
    return ev.hasGranted() ? ev.getGranted().getName() : ev.getWaitEnded().getName();
  }

  /** An acquire was answered {@code queued} as {@code key}: a push that came first answers it. */
  Answer<A> queued(Key key, A acq) {
    SessionEvent ev = early.remove(key);
    if (ev == null) {
      waits.put(key, acq);
      return null;
    }
    mark(key);
    return new Answer<>(acq, ev);
  }

  /** A push arrived; {@code unanswered.test(name)}: an acquire of that name is still unanswered.
   * Returns null when the push was kept for a {@code queued} reply on its way, or dropped. */
  Pushed<A> pushed(SessionEvent ev, Predicate<String> unanswered) {
    Key key = key(ev);
    String name = name(ev);
    A acq = waits.remove(key);
    if (acq != null) {
      mark(key);
      return new Answer<>(acq, ev);
    }
    if (answered.contains(key)) {
      return null;
    }
    if (unanswered.test(name)) {
      early.put(key, ev);
      while (early.size() > CAPACITY) {
        Iterator<Key> it = early.keySet().iterator();
        it.next();
        it.remove();
      }
      return null;
    }
    return unclaimedPush(key, name, ev);
  }

  private Pushed<A> unclaimedPush(Key key, String name, SessionEvent ev) {
    mark(key);
    Deque<A> q = adopters.get(name);
    if (q != null && !q.isEmpty()) {
      A acq = q.pollFirst();
      if (q.isEmpty()) {
        adopters.remove(name);
      }
      return new Answer<>(acq, ev);
    }
    if (ev.hasGranted()) {
      return new Orphan<>(ev.getGranted().getName(), ev.getGranted().getFencingToken());
    }
    return null;
  }

  /** The acquire was refused {@code already_waiting}: (true, answer-or-null) when a stray's retry
   * adopts its queued wait, (false, null) when the refusal is the caller's. */
  Refused<A> refusedWaiting(String name, String owner, A acq) {
    if (!strays.containsKey(new NameOwner(name, owner))) {
      return new Refused<>(false, null);
    }
    for (Iterator<Map.Entry<Key, SessionEvent>> it = early.entrySet().iterator(); it.hasNext();) {
      Map.Entry<Key, SessionEvent> e = it.next();
      if (name(e.getValue()).equals(name)) {
        it.remove();
        mark(e.getKey());
        return new Refused<>(true, new Answer<>(acq, e.getValue()));
      }
    }
    adopters.computeIfAbsent(name, n -> new ArrayDeque<>()).addLast(acq);
    return new Refused<>(true, null);
  }

  /** Whether (name, owner)'s last acquire lost its outcome with a broken stream. */
  boolean isStray(String name, String owner) {
    return strays.containsKey(new NameOwner(name, owner));
  }

  /** The acquire got another answer than {@code already_waiting}: no longer a stray. */
  void settled(String name, String owner) {
    strays.remove(new NameOwner(name, owner));
  }

  /** Kept pushes of {@code name} that no acquire can claim any more: each goes to an adopter, or
   * is an orphan if a grant. */
  List<Pushed<A>> unclaimed(String name, Predicate<String> unanswered) {
    List<Pushed<A>> out = new ArrayList<>();
    if (early.isEmpty() || unanswered.test(name)) {
      return out;
    }
    List<Key> keys = new ArrayList<>();
    for (Map.Entry<Key, SessionEvent> e : early.entrySet()) {
      if (name(e.getValue()).equals(name)) {
        keys.add(e.getKey());
      }
    }
    for (Key k : keys) {
      Pushed<A> p = unclaimedPush(k, name, early.remove(k));
      if (p != null) {
        out.add(p);
      }
    }
    return out;
  }

  /** Whether a queued wait or an adopter matches (its grant may come at any time). */
  boolean waiting(Predicate<A> match) {
    for (A a : waits.values()) {
      if (match.test(a)) {
        return true;
      }
    }
    for (Deque<A> q : adopters.values()) {
      for (A a : q) {
        if (match.test(a)) {
          return true;
        }
      }
    }
    return false;
  }

  /** Forgets the queued wait or adopter {@code acq} (its caller stopped waiting); returns whether
   * it was there. */
  boolean forget(A acq) {
    boolean found = waits.values().removeIf(a -> a == acq);
    for (Iterator<Map.Entry<String, Deque<A>>> it = adopters.entrySet().iterator();
        it.hasNext();) {
      Deque<A> q = it.next().getValue();
      found |= q.removeIf(a -> a == acq);
      if (q.isEmpty()) {
        it.remove();
      }
    }
    return found;
  }

  /** Hands back the adopters {@code expired} says have waited long enough for a push. */
  List<A> giveUpAdopters(Predicate<A> expired) {
    List<A> out = new ArrayList<>();
    for (Iterator<Map.Entry<String, Deque<A>>> it = adopters.entrySet().iterator();
        it.hasNext();) {
      Deque<A> q = it.next().getValue();
      for (Iterator<A> ai = q.iterator(); ai.hasNext();) {
        A a = ai.next();
        if (expired.test(a)) {
          out.add(a);
          ai.remove();
        }
      }
      if (q.isEmpty()) {
        it.remove();
      }
    }
    return out;
  }

  /** The stream broke: its early pushes are gone; every wait and adopter is handed back. */
  List<A> broke() {
    early.clear();
    List<A> out = new ArrayList<>(waits.values());
    waits.clear();
    for (Deque<A> q : adopters.values()) {
      out.addAll(q);
    }
    adopters.clear();
    return out;
  }

  /** The groups the queued waits live in (each once, sorted). */
  List<Integer> waitGroups() {
    TreeSet<Integer> gs = new TreeSet<>();
    for (Key k : waits.keySet()) {
      gs.add(k.group());
    }
    return new ArrayList<>(gs);
  }

  /** Whether an acquire whose outcome a broken stream took is still unsettled. */
  boolean hasStrays() {
    if (!strays.isEmpty()) {
      return true;
    }
    for (Deque<A> q : adopters.values()) {
      if (!q.isEmpty()) {
        return true;
      }
    }
    return false;
  }

  /** (name, owner)'s acquire, sent at {@code sent}, lost its outcome with the stream; a stray
   * already known keeps its earlier send time. */
  void stray(String name, String owner, double sent) {
    NameOwner k = new NameOwner(name, owner);
    Double was = strays.get(k);
    if (was != null) {
      strays.put(k, Math.min(was, sent));
    } else if (strays.size() < CAPACITY) {
      strays.put(k, sent);
    }
  }

  /** When the first attempt of stray (name, owner) was sent, or null. */
  Double straySince(String name, String owner) {
    return strays.get(new NameOwner(name, owner));
  }

  /** The session ended: everything is forgotten; waits and adopters are handed back. */
  List<A> end() {
    List<A> out = broke();
    answered.clear();
    strays.clear();
    return out;
  }

  private void mark(Key key) {
    answered.remove(key);
    answered.add(key);
    while (answered.size() > CAPACITY) {
      Iterator<Key> it = answered.iterator();
      it.next();
      it.remove();
    }
  }

  /** A hold the service lists for the session: (name, token). */
  record Listed(String name, long token) {}

  /** What {@link #settle} decided. */
  record Settled(List<Listed> giveBack, List<String> later) {}

  /** Whether a lock object knows (name, token). */
  interface Known {
    boolean test(String name, long token);
  }

  /**
   * What to do with the holds the service lists for the session after an acquire's outcome was
   * lost ({@code unsure}): each listed hold of an unsure name that no lock object knows is given
   * back, so the caller's retry starts clean. A name with an acquire or a wait still open is left
   * for later: the listed hold may be that acquire's grant.
   */
  static Settled settle(List<String> unsure, List<Listed> listed, Known known,
      Predicate<String> open) {
    List<Listed> giveBack = new ArrayList<>();
    List<String> later = new ArrayList<>();
    for (String name : new LinkedHashSet<>(unsure)) {
      if (open.test(name)) {
        later.add(name);
        continue;
      }
      for (Listed l : listed) {
        if (l.name().equals(name) && !known.test(l.name(), l.token())) {
          giveBack.add(l);
        }
      }
    }
    return new Settled(giveBack, later);
  }
}
