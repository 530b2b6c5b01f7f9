package dev.lockd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.lockd.client.it.Cluster;
import dev.lockd.client.it.WithCluster;
import dev.lockd.v1.CloseSessionRequest;
import dev.lockd.v1.LockGrpc;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInfo;
import org.junit.jupiter.api.extension.ExtendWith;

/** Locks against a real 3-node lockd: the scenario rows of clients/scenarios.md about taking,
 * waiting, sharing, releasing and refusing. */
@ExtendWith(WithCluster.class)
class LocksIntegrationTest {
  static final AtomicInteger SEQ = new AtomicInteger();
  static final ExecutorService POOL = Executors.newCachedThreadPool(r -> {
    Thread t = new Thread(r, "test-waiter");
    t.setDaemon(true);
    return t;
  });

  @AfterAll
  static void down() {
    POOL.shutdownNow();
  }

  /** A lock name no other test uses. */
  static String name(TestInfo info) {
    return "java/" + info.getTestMethod().orElseThrow().getName() + "/"
        + ProcessHandle.current().pid() + "-" + SEQ.incrementAndGet();
  }

  static double secondsSince(long t0) {
    return (System.nanoTime() - t0) / 1e9;
  }

  // scenario: try-lock
  @Test
  void tryLockNamesTheHolderAndTokensGrow(Cluster cl, TestInfo info) {
    String name = name(info);
    try (LockdClient a = cl.client().clientName("client-a").build();
        LockdClient b = cl.client().clientName("client-b").build()) {
      long first;
      try (Lock lk = a.tryLock(name)) {
        assertTrue(lk.token() > 0);
        assertFalse(lk.isLost());
        assertEquals(1, lk.reentry());
        b.connect();
        long t0 = System.nanoTime();
        NotAcquiredException e = assertThrows(NotAcquiredException.class, () -> b.tryLock(name));
        assertTrue(secondsSince(t0) < 1.0, "refused at once, not after retries");
        assertEquals("client-a", e.holder().orElseThrow(), "names A as the holder");
        assertFalse(e.isRetryable());
        assertEquals("not_acquired", e.code());
        LockState st = b.inspect(name);
        assertEquals(1, st.holders().size());
        assertEquals("client-a", st.holders().get(0).owner());
        assertEquals(lk.token(), st.holders().get(0).token());
        first = lk.token();
      }
      try (Lock lk2 = b.tryLock(name)) {
        assertTrue(lk2.token() > first, "B's grant has a larger token than A's");
        // CheckToken: the holder's token is valid, the previous holder's is not.
        assertEquals(new LockdClient.TokenCheck(true, lk2.token()), b.checkToken(name,
            lk2.token()));
        assertEquals(new LockdClient.TokenCheck(false, lk2.token()), b.checkToken(name, first));
      }
      assertEquals(new LockdClient.TokenCheck(false, 0), a.checkToken(name, first));
    }
  }

  // scenario: fifo-wait
  @Test
  void fifoWaitersAreGrantedInOrderByThePushedGrant(Cluster cl, TestInfo info) throws Exception {
    String name = name(info);
    try (LockdClient a = cl.client().clientName("a").build();
        LockdClient b = cl.client().clientName("b").build();
        LockdClient c = cl.client().clientName("c").build()) {
      Lock held = a.tryLock(name);
      Future<Lock> bWait = POOL.submit(() -> b.lock(name, Duration.ofSeconds(30)));
      Cluster.waitUntil(() -> a.inspect(name).waiters().size() == 1, 10, "b to queue");
      Future<Lock> cWait = POOL.submit(() -> c.lock(name, Duration.ofSeconds(30)));
      Cluster.waitUntil(() -> a.inspect(name).waiters().size() == 2, 10, "c to queue");
      assertEquals(List.of("b", "c"), a.inspect(name).waiters().stream()
          .map(LockState.Waiter::owner).toList());
      long t0 = System.nanoTime();
      held.release();
      Lock bl = bWait.get(5, TimeUnit.SECONDS);
      assertTrue(secondsSince(t0) < 2.0, "granted by the push, well within its 30 s wait");
      assertEquals("b", bl.owner());
      Thread.sleep(200); // let a wrong grant show itself before handing on
      assertFalse(cWait.isDone(), "c overtook nobody: it waits behind b");
      t0 = System.nanoTime();
      bl.release();
      Lock clk = cWait.get(5, TimeUnit.SECONDS);
      assertTrue(secondsSince(t0) < 2.0);
      assertTrue(held.token() < bl.token() && bl.token() < clk.token(), "tokens rise A < B < C");
      clk.release();
    }
  }

  // scenario: modes
  @Test
  void sharedAndSemaphoreModes(Cluster cl, TestInfo info) {
    String name = name(info);
    try (LockdClient one = cl.client().build(); LockdClient two = cl.client().build();
        LockdClient three = cl.client().build()) {
      Lock a = one.newLock(name).shared().acquire();
      Lock b = two.newLock(name).mode(Mode.SHARED, null).acquire();
      assertEquals(Mode.SHARED, a.mode());
      assertNotEquals(0, b.token());
      assertEquals(2, one.inspect(name).holders().size(), "both shared holds are granted");
      assertThrows(NotAcquiredException.class, () -> three.newLock(name).owner("writer")
          .acquire(), "an exclusive try beside shared holders is refused");
      a.release();
      b.release();

      String sem = name + "/sem";
      Lock s1 = one.newLock(sem).semaphore(2).acquire();
      Lock s2 = two.newLock(sem).semaphore(2).acquire();
      assertNotEquals(s1.token(), s2.token());
      assertThrows(NotAcquiredException.class, () -> three.newLock(sem).semaphore(2).acquire(),
          "the third permit is refused");
      ConflictException e = assertThrows(ConflictException.class,
          () -> three.newLock(sem).semaphore(3).acquire());
      assertEquals("mode_conflict", e.code());
      assertEquals(409, e.status().getAsInt());
      s1.release();
      try (Lock s3 = three.newLock(sem).semaphore(2).acquire()) {
        assertTrue(s3.token() > 0, "granted once one released");
      }
      s2.release();
      InvalidArgumentException bad = assertThrows(InvalidArgumentException.class,
          () -> one.newLock(sem).mode(Mode.SEMAPHORE, null).acquire());
      assertTrue(bad.getMessage().contains("limit must lie in 1..=10000"));
      assertTrue(assertThrows(InvalidArgumentException.class,
          () -> one.newLock(sem).mode(Mode.EXCLUSIVE, 2).acquire()).getMessage()
          .contains("limit is only for mode SEMAPHORE"));
    }
  }

  // scenario: reentrant
  @Test
  void reentrantHoldsShareAToken(Cluster cl, TestInfo info) {
    String name = name(info);
    try (LockdClient c = cl.client().build()) {
      Lock a = c.newLock(name).reentrant().acquire();
      Lock b = c.newLock(name).reentrant().acquire();
      assertEquals(a.token(), b.token(), "the second grant carries the first's token");
      assertEquals(2, b.reentry());
      ConflictException e = assertThrows(ConflictException.class, () -> c.tryLock(name));
      assertEquals("already_held", e.code(), "without re-entrancy the second is refused");
      assertFalse(e.isRetryable());
      assertEquals(1, b.release());
      assertEquals(1, c.inspect(name).holders().get(0).reentry(), "still held after one");
      assertEquals(0, a.release());
      assertTrue(c.inspect(name).holders().isEmpty(), "free after the second");
    }
  }

  // scenario: acquire-all
  @Test
  void acquireAllTakesNamesInSortedOrderWithOneDeadline(Cluster cl, TestInfo info)
      throws Exception {
    String name = name(info);
    List<String> names = List.of(name + "/c", name + "/a", name + "/b", name + "/a");
    try (LockdClient c = cl.client().build(); LockdClient other = cl.client().build()) {
      try (LockSet ls = c.acquireAll(names, Duration.ofSeconds(5))) {
        assertEquals(List.of(name + "/a", name + "/b", name + "/c"), ls.locks().stream()
            .map(Lock::name).toList());
        assertEquals(3, ls.tokens().size());
      }
      // The watch opens before the blocker takes b, so its events come in revision order from
      // there: the blocker's hold first, whichever node serves the watch and however far that
      // node's replica lags.
      Lock blocker;
      try (Watch w = c.watchPrefix(name + "/").open()) {
        blocker = other.tryLock(name + "/b");
        long t0 = System.nanoTime();
        assertThrows(NotAcquiredException.class, () -> c.acquireAll(names,
            Duration.ofMillis(1500)));
        double took = secondsSince(t0);
        assertTrue(took >= 1.0 && took < 4.0, "one overall deadline of 1.5 s, took " + took);
        assertTrue(other.inspect(name + "/a").holders().isEmpty(),
            "a name taken before the failure was released");
        assertTrue(other.inspect(name + "/c").holders().isEmpty(), "nothing of c is held");
        // Sorted order: a was taken (and given back), b waited, c was never tried.
        List<String> seen = new ArrayList<>();
        while (true) {
          try {
            WatchEvent ev = w.next(Duration.ofMillis(700));
            seen.add(ev.kind() + " " + ev.name().substring(name.length()));
          } catch (TimeoutException e) {
            break;
          }
        }
        // A watch on a lagging node may also show the end of the first set's holds, applied
        // there after it opened: read from the blocker's hold on.
        int from = seen.indexOf("hold_started /b");
        assertTrue(from >= 0, seen.toString());
        seen = new ArrayList<>(seen.subList(from, seen.size()));
        assertEquals(List.of("hold_started /b", "hold_started /a"), seen.subList(0, 2),
            seen.toString());
        assertTrue(seen.contains("wait_started /b"), seen.toString());
        assertTrue(seen.stream().noneMatch(s -> s.endsWith("/c")), seen.toString());
        assertTrue(seen.indexOf("hold_ended /a") > seen.indexOf("wait_started /b"),
            seen.toString());
      }
      CompletableFuture<LockSet> all = CompletableFuture.supplyAsync(
          () -> c.acquireAll(names, Duration.ofSeconds(10)), POOL);
      Thread.sleep(300);
      blocker.release();
      try (LockSet ls = all.get(10, TimeUnit.SECONDS)) {
        assertEquals(3, ls.locks().size(), "once the middle is free the call takes all three");
        assertTrue(ls.get(name + "/b").token() > blocker.token());
      }
    }
  }

  // scenario: bearer-token
  @Test
  void bearerTokenIsSentOnEveryCall(Cluster cl, TestInfo info) throws Exception {
    String secure = "secure/" + name(info);
    try (LockdClient c = cl.client().namespace("secure").token(Cluster.SECURE_TOKEN).build()) {
      try (Lock lk = c.lock(secure, Duration.ofSeconds(2))) {
        assertEquals(lk.token(), c.inspect(secure).holders().get(0).token());
        assertEquals(secure, c.getSession().held().get(0).name(), "GetSession takes it too");
        Thread.sleep(2500); // keepalives on the stream (with the metadata) keep it
        assertFalse(lk.isLost());
      }
      assertTrue(c.inspect(secure).holders().isEmpty());
    }
    try (LockdClient c = cl.client().namespace("secure").build()) {
      UnauthenticatedException e = assertThrows(UnauthenticatedException.class,
          () -> c.tryLock(secure));
      assertEquals(401, e.status().getAsInt());
      assertFalse(e.isRetryable());
      assertTrue(e.getMessage().contains("secure"), e.getMessage());
    }
    try (LockdClient c = cl.client().namespace("secure").token("not-the-token").build()) {
      UnauthenticatedException e = assertThrows(UnauthenticatedException.class,
          () -> c.tryLock(secure));
      assertFalse(e.isRetryable());
      assertTrue(e.getMessage().contains("not valid for namespace 'secure'"), e.getMessage());
    }
    // A default-namespace session may not take another namespace's names, whatever the token.
    try (LockdClient c = cl.client().token(Cluster.SECURE_TOKEN).build()) {
      PermissionDeniedException e = assertThrows(PermissionDeniedException.class,
          () -> c.tryLock(secure));
      assertEquals("wrong_namespace", e.code());
      assertEquals(403, e.status().getAsInt());
    }
    try (LockdClient c = cl.client().build()) { // inspect of a guarded name needs the token
      assertThrows(UnauthenticatedException.class, () -> c.inspect(secure));
    }
    try (LockdClient c = cl.client().namespace("secure").token(Cluster.SECURE_TOKEN).build()) {
      assertTrue(c.inspect(secure).holders().isEmpty(), "nothing is held");
    }
  }

  // scenario: input-errors
  @Test
  void inputErrorsNameTheFieldAndTheLimit(Cluster cl) {
    try (LockdClient c = cl.client().build()) {
      InvalidArgumentException e = assertThrows(InvalidArgumentException.class,
          () -> c.tryLock(""));
      assertTrue(e.getMessage().contains("lock name must be 1..=512 bytes"), e.getMessage());
      assertFalse(e.isRetryable());
      e = assertThrows(InvalidArgumentException.class, () -> c.tryLock("x".repeat(513)));
      assertTrue(e.getMessage().contains("1..=512 bytes") && e.getMessage().contains("513"),
          e.getMessage());
      e = assertThrows(InvalidArgumentException.class, () -> c.newLock("ok").owner("o".repeat(300))
          .acquire());
      assertTrue(e.getMessage().contains("owner must be at most 256 bytes (got 300)"));
      e = assertThrows(InvalidArgumentException.class,
          () -> c.lock("ok", Duration.ofSeconds(-1)));
      assertTrue(e.getMessage().contains("wait must be >= 0"), e.getMessage());
      assertTrue(c.sessionId().isEmpty(), "nothing was sent: no session opened");
    }
    // A TTL above the namespace's maximum (60 s): the service refuses the session.
    try (LockdClient c = cl.client().ttl(Duration.ofSeconds(120)).build()) {
      InvalidArgumentException e = assertThrows(InvalidArgumentException.class,
          () -> c.tryLock("java/input-errors/ttl"));
      assertEquals("ttl_out_of_range", e.code());
      assertFalse(e.isRetryable());
      assertTrue(e.getMessage().contains("60000") || e.getMessage().contains("60 000")
          || e.getMessage().contains("60s") || e.getMessage().contains("60 s"), e.getMessage());
      assertTrue(e.getMessage().toLowerCase().contains("ttl"), e.getMessage());
      assertTrue(c.inspect("java/input-errors/ttl").holders().isEmpty());
    }
    assertTrue(assertThrows(InvalidArgumentException.class,
        () -> cl.client().ttl(Duration.ZERO).build()).getMessage().contains("ttl must lie in"));
  }

  // scenario: stale-release
  @Test
  void aStaleReleaseIsRefusedWithATypedError(Cluster cl, TestInfo info) {
    String name = name(info);
    try (LockdClient c = cl.client().build()) {
      Lock old = c.tryLock(name);
      old.release();
      Lock lk = c.tryLock(name);
      assertTrue(lk.token() > old.token());
      ConflictException e = assertThrows(ConflictException.class,
          () -> c.engine.release(lk.sessionId(), name, old.token(), Double.POSITIVE_INFINITY));
      assertTrue(List.of("stale_token", "not_holder").contains(e.code()), e.code());
      assertFalse(e.isRetryable());
      assertTrue(e.getMessage().contains("not") || e.getMessage().contains("stale"),
          e.getMessage());
      LockState st = c.inspect(name);
      assertEquals(List.of(lk.token()), st.holders().stream().map(LockState.Holder::token)
          .toList(), "the current holder still holds");
      lk.release();
    }
  }

  // scenario: lost-on-close
  @Test
  void lostFiresWhenTheSessionEnds(Cluster cl, TestInfo info) throws Exception {
    String name = name(info);
    // Once by closing the client.
    LockdClient c = cl.client().build();
    Lock lk = c.tryLock(name);
    c.close();
    lk.lost().get(2, TimeUnit.SECONDS);
    assertTrue(lk.isLost());
    assertThrows(LockLostException.class, lk::close, "closing after the loss says so");
    // Once from outside: a unary CloseSession naming its session, on another connection.
    try (LockdClient c2 = cl.client().build()) {
      Lock lk2 = c2.tryLock(name);
      String sid = lk2.sessionId();
      List<String> reasons = new java.util.concurrent.CopyOnWriteArrayList<>();
      lk2.onLost(reasons::add);
      ManagedChannel ch = Grpc.newChannelBuilder(cl.endpoints.get(2),
          InsecureChannelCredentials.create()).build();
      try {
        LockGrpc.newBlockingStub(ch).withDeadlineAfter(5, TimeUnit.SECONDS)
            .closeSession(CloseSessionRequest.newBuilder().setSessionId(sid).build());
      } finally {
        ch.shutdownNow();
      }
      lk2.lost().get(5, TimeUnit.SECONDS);
      // The listener runs on a callback thread of its own, maybe just after the future completes.
      Cluster.waitUntil(() -> reasons.size() == 1, 2, "the lost listener");
      assertTrue(reasons.get(0).contains("ended the session"), reasons.toString());
      try (Lock lk3 = c2.lock(name, Duration.ofSeconds(5))) {
        assertNotEquals(sid, lk3.sessionId(), "a later acquire opens a new session");
        assertFalse(lk3.isLost());
      }
    }
  }

  // scenario: full-namespace
  @Test
  void aFullNamespaceRefusesASessionAtOnce(Cluster cl, TestInfo info) {
    String name = name(info);
    // Namespace "solo" holds at most one live session (Cluster's config).
    try (LockdClient first = cl.client().namespace("solo").build()) {
      try (Lock lk = first.tryLock("solo/" + name)) {
        long t0 = System.nanoTime();
        ResourceExhaustedException e;
        try (LockdClient second = cl.client().namespace("solo").build()) {
          e = assertThrows(ResourceExhaustedException.class,
              () -> second.tryLock("solo/" + name + "-b"));
        }
        double took = secondsSince(t0);
        assertEquals("too_many_sessions", e.code());
        assertEquals(429, e.status().getAsInt());
        assertFalse(e.isRetryable());
        assertTrue(e.getMessage().contains("holds 1 live session, its max_sessions"),
            e.getMessage());
        // The service's answer at once, not after seconds of backoff (Retry-After is 1 s).
        assertTrue(took < 0.9, "took " + took);
        assertTrue(lk.token() > 0);
      }
    }
    try (LockdClient third = cl.client().namespace("solo").build();
        Lock lk = third.tryLock("solo/" + name + "-c")) {
      assertTrue(lk.token() > 0, "the first client closed: the namespace takes a new one");
    }
  }

  @Test
  void waitsPastTheServersCapRunInRounds(Cluster cl, TestInfo info) throws Exception {
    // The service holds a waiter at most 300 s; a longer wait queues again round after round.
    // Lowering the client's cap to 1 s shows the rounds in a few seconds.
    String name = name(info);
    double was = Engine.maxWait;
    Engine.maxWait = 1.0;
    try (LockdClient c = cl.client().build(); LockdClient other = cl.client().build()) {
      Lock blocker = other.tryLock(name);
      CompletableFuture.delayedExecutor(2500, TimeUnit.MILLISECONDS, POOL)
          .execute(blocker::release);
      long t0 = System.nanoTime();
      try (Lock lk = c.lock(name, Duration.ofSeconds(6))) { // three rounds of 1 s first
        double took = secondsSince(t0);
        assertTrue(took > 2.3 && took < 5.0, "took " + took);
        assertTrue(lk.token() > blocker.token());
      }
      Lock blocker2 = other.tryLock(name);
      long t1 = System.nanoTime();
      assertThrows(NotAcquiredException.class, () -> c.lock(name, Duration.ofMillis(2200)));
      double took = secondsSince(t1);
      assertTrue(took > 2.0 && took < 4.0, "the caller's deadline ends the rounds: " + took);
      blocker2.release();
    } finally {
      Engine.maxWait = was;
    }
  }

  @Test
  void aLockRecordsItsGroupAndFollowsItsLease(Cluster cl, TestInfo info) {
    String name = name(info);
    try (LockdClient c = cl.client().build();
        Lock lk = c.lock(name, Duration.ofSeconds(2));
        Lock lk2 = c.lock(name + "/2", Duration.ofSeconds(2))) {
      Map<String, Integer> held = new java.util.HashMap<>();
      for (SessionDetail.HeldLock h : c.getSession().held()) {
        held.put(h.name(), h.group());
      }
      assertEquals(Map.of(name, lk.group(), name + "/2", lk2.group()), held);
      double first = lk.deadline();
      Cluster.waitUntil(() -> lk.deadline() > first, 6, "a keepalive reply");
      assertFalse(lk.isLost());
      assertFalse(lk2.isLost());
      assertTrue(lk.timeLeft().toMillis() > 0);
    }
  }
}
