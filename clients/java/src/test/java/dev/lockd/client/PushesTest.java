package dev.lockd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.lockd.v1.Granted;
import dev.lockd.v1.SessionEvent;
import dev.lockd.v1.WaitEnded;
import java.util.ArrayList;
import java.util.List;
import java.util.function.Predicate;
import org.junit.jupiter.api.Test;

/** Which waiting acquire a pushed outcome answers: the rules of Pushes, ported from the Python
 * client's tests/test_unit.py (itself lockd-client's pushes.rs tests). */
class PushesTest {
  static SessionEvent granted(long waiter, String name, long token) {
    return SessionEvent.newBuilder().setGranted(Granted.newBuilder().setGroup(1)
        .setWaiter(waiter).setName(name).setFencingToken(token)).build();
  }

  static SessionEvent ended(long waiter, String name) {
    return SessionEvent.newBuilder().setWaitEnded(WaitEnded.newBuilder().setGroup(1)
        .setWaiter(waiter).setName(name).setReason("timed_out")).build();
  }

  static final Predicate<String> NONE = n -> false;
  static final Predicate<String> ALL = n -> true;

  static Pushes.Key key(long waiter) {
    return new Pushes.Key(1, waiter);
  }

  @Test
  void aPushAnswersItsQueuedWaitOnce() {
    Pushes<String> p = new Pushes<>();
    assertNull(p.queued(key(7), "a"));
    Pushes.Pushed<String> got = p.pushed(granted(7, "x", 42), NONE);
    assertEquals("a", assertInstanceOf(Pushes.Answer.class, got).acq());
    // The same outcome pushed again (a relay and the local replica) is no orphan.
    assertNull(p.pushed(granted(7, "x", 42), NONE));
  }

  @Test
  void aPushBeforeItsQueuedReplyWaitsForIt() {
    Pushes<String> p = new Pushes<>();
    assertNull(p.pushed(granted(7, "x", 42), ALL));
    Pushes.Answer<String> got = p.queued(key(7), "a");
    assertNotNull(got);
    assertEquals("a", got.acq());
    assertEquals(42, got.event().getGranted().getFencingToken());
    assertEquals(List.of(), p.unclaimed("x", NONE));
  }

  @Test
  void aGrantNobodyWaitsForIsAnOrphanOnce() {
    Pushes<String> p = new Pushes<>();
    assertEquals(new Pushes.Orphan<String>("x", 50), p.pushed(granted(9, "x", 50), NONE));
    assertNull(p.pushed(granted(9, "x", 50), NONE));
    assertNull(p.pushed(ended(10, "x"), NONE));
  }

  @Test
  void aKeptGrantThatNoReplyClaimsIsAnOrphan() {
    Pushes<String> p = new Pushes<>();
    assertNull(p.pushed(granted(9, "x", 50), ALL));
    assertNull(p.queued(key(11), "b"));
    assertEquals(List.of(), p.unclaimed("x", ALL));
    assertEquals(List.of(new Pushes.Orphan<String>("x", 50)), p.unclaimed("x", NONE));
    Pushes.Pushed<String> got = p.pushed(granted(11, "x", 51), NONE);
    assertEquals("b", assertInstanceOf(Pushes.Answer.class, got).acq());
  }

  @Test
  void aStraysRetryAdoptsItsQueuedWait() {
    Pushes<String> p = new Pushes<>();
    assertNull(p.queued(key(7), "first"));
    assertEquals(List.of("first"), p.broke());
    p.stray("x", "me", 1.0);
    assertEquals(new Pushes.Refused<String>(false, null), p.refusedWaiting("x", "other", "o"));
    assertEquals(new Pushes.Refused<String>(true, null), p.refusedWaiting("x", "me", "retry"));
    Pushes.Pushed<String> got = p.pushed(granted(7, "x", 42), NONE);
    assertEquals("retry", assertInstanceOf(Pushes.Answer.class, got).acq());
    assertTrue(p.isStray("x", "me"));
    p.settled("x", "me");
    assertFalse(p.isStray("x", "me"));
    assertEquals(new Pushes.Refused<String>(false, null), p.refusedWaiting("x", "me", "again"));
  }

  @Test
  void aStrayKeepsItsFirstAttemptsSendTime() {
    Pushes<String> p = new Pushes<>();
    p.stray("x", "me", 1.0);
    p.stray("x", "me", 2.0);
    assertEquals(1.0, p.straySince("x", "me"));
    assertNull(p.straySince("x", "other"));
  }

  @Test
  void aStraysGrantPushedBeforeTheRefusalAnswersTheRetry() {
    Pushes<String> p = new Pushes<>();
    p.stray("x", "me", 1.0);
    assertNull(p.pushed(granted(7, "x", 42), ALL));
    Pushes.Refused<String> r = p.refusedWaiting("x", "me", "retry");
    assertTrue(r.adopted());
    assertNotNull(r.answer());
    assertEquals("retry", r.answer().acq());
    assertEquals(42, r.answer().event().getGranted().getFencingToken());
  }

  @Test
  void aKeptGrantGoesToAnAdopterBeforeItIsCalledAnOrphan() {
    Pushes<String> p = new Pushes<>();
    p.stray("x", "me", 1.0);
    assertEquals(new Pushes.Refused<String>(true, null), p.refusedWaiting("x", "me", "retry"));
    assertNull(p.pushed(granted(7, "x", 42), ALL));
    List<Pushes.Pushed<String>> out = p.unclaimed("x", NONE);
    assertEquals(1, out.size());
    assertEquals("retry", assertInstanceOf(Pushes.Answer.class, out.get(0)).acq());
  }

  @Test
  void adoptersThatWaitedTooLongAreHandedBack() {
    Pushes<String> p = new Pushes<>();
    p.stray("x", "me", 1.0);
    p.stray("y", "me", 1.0);
    assertEquals(new Pushes.Refused<String>(true, null), p.refusedWaiting("x", "me", "ax"));
    assertEquals(new Pushes.Refused<String>(true, null), p.refusedWaiting("y", "me", "ay"));
    assertEquals(List.of("ax"), p.giveUpAdopters(a -> a.equals("ax")));
    assertEquals(List.of(), p.giveUpAdopters(a -> a.equals("ax")));
    Pushes.Pushed<String> got = p.pushed(granted(7, "y", 42), NONE);
    assertEquals("ay", assertInstanceOf(Pushes.Answer.class, got).acq());
  }

  @Test
  void settlingGivesBackOnlyHoldsNoLockAndNoOpenAcquireCanClaim() {
    List<Pushes.Listed> listed = List.of(new Pushes.Listed("x", 10), new Pushes.Listed("x", 11),
        new Pushes.Listed("y", 20), new Pushes.Listed("z", 30), new Pushes.Listed("w", 40));
    // A lock object holds x's 11; an acquire of z is still open (30 may be its grant).
    Pushes.Settled s = Pushes.settle(List.of("x", "x", "y", "z"), listed,
        (n, t) -> n.equals("x") && t == 11, n -> n.equals("z"));
    assertEquals(List.of(new Pushes.Listed("x", 10), new Pushes.Listed("y", 20)), s.giveBack());
    assertEquals(List.of("z"), s.later());
  }

  @Test
  void aQueuedWaitOrAnAdopterKeepsItsNameOpen() {
    Pushes<String> p = new Pushes<>();
    assertFalse(p.waiting(a -> a.startsWith("x")));
    assertNull(p.queued(key(7), "x-wait"));
    assertTrue(p.waiting(a -> a.startsWith("x")));
    p.stray("y", "me", 1.0);
    assertEquals(new Pushes.Refused<String>(true, null),
        p.refusedWaiting("y", "me", "y-adopter"));
    assertTrue(p.waiting(a -> a.startsWith("y")));
    assertFalse(p.waiting(a -> a.startsWith("z")));
  }

  @Test
  void theEndOfASessionHandsBackWaitsAndAdopters() {
    Pushes<String> p = new Pushes<>();
    assertNull(p.queued(key(7), "w"));
    p.stray("x", "me", 1.0);
    assertEquals(new Pushes.Refused<String>(true, null), p.refusedWaiting("x", "me", "adopter"));
    List<String> out = new ArrayList<>(p.end());
    out.sort(null);
    assertEquals(List.of("adopter", "w"), out);
    assertEquals(new Pushes.Refused<String>(false, null), p.refusedWaiting("x", "me", "z"));
  }
}
