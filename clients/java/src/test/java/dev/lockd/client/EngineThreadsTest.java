package dev.lockd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.lockd.v1.Granted;
import dev.lockd.v1.Queued;
import dev.lockd.v1.ReleaseRequest;
import dev.lockd.v1.SessionEvent;
import dev.lockd.v1.SessionRequest;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/** The engine's threads on synthetic replies (no service): what runs where, what an interrupt
 * or a stuck thread does, and what becomes of requests nobody answers. */
class EngineThreadsTest {
  @AfterEach
  void reset() {
    Engine.acquireBoundForTest = null;
    Thread.interrupted();
  }

  static void waitFor(java.util.function.BooleanSupplier cond, double seconds) {
    ClientUnitTest.waitFor(cond, seconds);
  }

  @Test
  void aLostCallbackThatBlocksHoldsUpNeitherTheEngineNorOtherLocksSignals() throws Exception {
    List<ReleaseRequest> released = Synthetic.releases();
    LockdClient c = Synthetic.client(released, 3);
    CountDownLatch block = new CountDownLatch(1);
    try {
      Lock one = Synthetic.lock(c, "one", 7, 2);
      Lock two = Synthetic.lock(c, "two", 8, 3);
      List<String> threads = Collections.synchronizedList(new ArrayList<>());
      Runnable stuck = () -> {
        threads.add(Thread.currentThread().getName());
        try {
          block.await(30, TimeUnit.SECONDS); // a callback that blocks (or takes a lock)
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
        }
      };
      one.onLost(why -> stuck.run());
      one.lost().thenRun(stuck);
      CompletableFuture<String> twoLost = new CompletableFuture<>();
      two.onLost(twoLost::complete);
      // Group 2's lease ends on the engine's loop: `one` is lost there.
      c.engine.execute(() -> c.engine.event(Synthetic.groupEnded(2)));
      waitFor(() -> threads.size() == 2, 5);
      assertEquals(2, threads.size(), "both callbacks run, each on its own: " + threads);
      for (String t : threads) {
        assertTrue(t.startsWith("lockd-client-callback-"), t);
      }
      // The loop answers at once (a keepalive would go out), and the next loss still arrives.
      assertEquals(1, c.engine.loop.submit(() -> 1).get(2, TimeUnit.SECONDS));
      c.engine.execute(() -> c.engine.event(Synthetic.groupEnded(3)));
      assertNotNull(twoLost.get(2, TimeUnit.SECONDS));
      assertTrue(one.isLost());
      assertTrue(two.isLost());
      // Code that does get onto the loop cannot acquire there: only the loop could answer it.
      ExecutionException e = assertThrows(ExecutionException.class, () -> c.engine.loop.submit(
          () -> c.engine.acquire("x", null, Mode.EXCLUSIVE, null, null, false))
          .get(2, TimeUnit.SECONDS));
      assertInstanceOf(IllegalStateException.class, e.getCause());
    } finally {
      block.countDown();
      c.close();
    }
  }

  @Test
  void theLostFutureIsOneViewCompletedOffTheEngine() throws Exception {
    List<ReleaseRequest> released = Synthetic.releases();
    LockdClient c = Synthetic.client(released, 3);
    try {
      Lock lk = Synthetic.lock(c, "one", 7, 2);
      assertTrue(lk.lost() == lk.lost(), "one view, not a new copy per call");
      String[] where = new String[1];
      CompletableFuture<Void> after = lk.lost().thenRun(() -> where[0] =
          Thread.currentThread().getName());
      c.engine.injectEvent(Synthetic.groupEnded(2));
      after.get(2, TimeUnit.SECONDS);
      assertTrue(where[0].startsWith("lockd-client-callback-"), where[0]);
    } finally {
      c.close();
    }
  }

  @Test
  void aReleaseFromAnInterruptedThreadGoesOnInTheBackground() {
    List<ReleaseRequest> released = Synthetic.releases();
    LockdClient c = Synthetic.client(released, 3);
    try {
      Lock lk = Synthetic.lock(c, "one", 7, 1);
      Thread.currentThread().interrupt();
      try {
        assertThrows(ClientClosedException.class, lk::release);
        assertTrue(Thread.currentThread().isInterrupted(), "the interrupt is kept");
      } finally {
        Thread.interrupted();
      }
      assertTrue(lk.isReleased());
      waitFor(() -> released.size() == 1, 5);
      assertEquals(1, released.size(), "the hold is given back, not leaked");
      assertEquals("one", released.get(0).getName());
      assertEquals(7, released.get(0).getFencingToken());
      assertEquals("s", released.get(0).getSessionId());
    } finally {
      c.close();
    }
  }

  @Test
  void aReleaseInterruptedWhileItsStreamRequestIsOutIsFinishedInTheBackground() throws Exception {
    List<ReleaseRequest> released = Synthetic.releases();
    LockdClient c = Synthetic.client(released, 3);
    try {
      Synthetic.FakeStream st = Synthetic.attach(c.engine);
      Lock lk = Synthetic.lock(c, "one", 7, 1);
      CompletableFuture<Throwable> thrown = new CompletableFuture<>();
      Thread t = new Thread(() -> {
        try {
          lk.release();
          thrown.complete(null);
        } catch (RuntimeException e) {
          thrown.complete(Thread.currentThread().isInterrupted() ? e
              : new AssertionError("the interrupt was not kept", e));
        }
      });
      t.start();
      SessionRequest out = st.await(SessionRequest::hasRelease);
      assertEquals(7, out.getRelease().getFencingToken());
      t.interrupt(); // while it waits for the stream's answer
      assertInstanceOf(ClientClosedException.class, thrown.get(5, TimeUnit.SECONDS));
      assertEquals(List.of(), released);
      // The stream's node answers "no leader": the release must be tried again.
      c.engine.injectEvent(SessionEvent.newBuilder().setRequestId(out.getRequestId()).setError(
          dev.lockd.v1.Error.newBuilder().setStatus(503).setCode("no_leader").setMessage("m")
              .setRetryAfterMs(10)).build());
      waitFor(() -> released.size() == 1, 5);
      assertEquals(1, released.size(), "retried by unary call after the stream's refusal");
      assertEquals("one", released.get(0).getName());
    } finally {
      c.close();
    }
  }

  @Test
  void aReleaseFromAnInterruptedThreadUsesTheStreamInTheBackground() {
    List<ReleaseRequest> released = Synthetic.releases();
    LockdClient c = Synthetic.client(released, 3);
    try {
      Synthetic.FakeStream st = Synthetic.attach(c.engine);
      Lock lk = Synthetic.lock(c, "one", 7, 1);
      Thread.currentThread().interrupt();
      try {
        assertThrows(ClientClosedException.class, lk::release);
      } finally {
        Thread.interrupted();
      }
      SessionRequest out = st.await(SessionRequest::hasRelease);
      assertEquals(7, out.getRelease().getFencingToken());
      assertEquals("one", out.getRelease().getName());
    } finally {
      c.close();
    }
  }

  @Test
  void anAcquireUnansweredPastItsBoundIsSettledAsAfterABrokenStream() {
    List<ReleaseRequest> released = Synthetic.releases();
    LockdClient c = Synthetic.client(released, 1);
    try {
      Engine.acquireBoundForTest = 0.3;
      Synthetic.FakeStream st = Synthetic.attach(c.engine);
      assertThrows(UnavailableException.class, () -> c.tryLock("a"));
      assertTrue(st.await(SessionRequest::hasAcquire).getAcquire().getName().equals("a"));
      assertFalse(c.engine.unansweredForTest("a"), "no longer parked as unanswered");
      assertTrue(c.engine.strayForTest("a", "me"), "a retry adopts the wait it may have queued");
      assertTrue(st.cancelled, "the stream that left it unanswered is given up");
    } finally {
      c.close();
    }
  }

  @Test
  void aQueuedWaitWhoseOutcomeNeverCameIsAStrayAndItsLateGrantIsGivenBack() {
    List<ReleaseRequest> released = Synthetic.releases();
    LockdClient c = Synthetic.client(released, 1);
    try {
      Engine.acquireBoundForTest = 0.3;
      Synthetic.FakeStream st = Synthetic.attach(c.engine);
      CompletableFuture<Lock> acq = CompletableFuture.supplyAsync(() -> c.tryLock("q"));
      SessionRequest out = st.await(SessionRequest::hasAcquire);
      c.engine.injectEvent(SessionEvent.newBuilder().setRequestId(out.getRequestId())
          .setQueued(Queued.newBuilder().setGroup(1).setWaiter(5)).build());
      ExecutionException e = assertThrows(ExecutionException.class,
          () -> acq.get(5, TimeUnit.SECONDS));
      assertInstanceOf(UnavailableException.class, e.getCause());
      waitFor(() -> c.engine.strayForTest("q", "me"), 2);
      assertTrue(c.engine.strayForTest("q", "me"), "a retry adopts the queued wait");
      assertFalse(st.cancelled, "the stream answered; it stays");
      // Its grant arrives after all: nobody holds it, so it is given back.
      c.engine.injectEvent(SessionEvent.newBuilder().setGranted(Granted.newBuilder()
          .setName("q").setGroup(1).setWaiter(5).setFencingToken(11)).build());
      SessionRequest back = st.await(SessionRequest::hasRelease);
      assertEquals(11, back.getRelease().getFencingToken());
    } finally {
      c.close();
    }
  }

  @Test
  void aTickThatFailsRunsAgain() {
    List<ReleaseRequest> released = Synthetic.releases();
    LockdClient c = Synthetic.client(released, 3);
    try {
      AtomicInteger ticks = new AtomicInteger();
      c.engine.tickHook = () -> {
        if (ticks.incrementAndGet() == 1) {
          throw new IllegalStateException("a bug in the tick");
        }
      };
      c.engine.poke();
      waitFor(() -> ticks.get() >= 2, 3);
      assertTrue(ticks.get() >= 2, "keepalives and lost checks live on the tick: it must go on");
    } finally {
      c.close();
    }
  }

  @Test
  void closingAClientWhoseEngineThreadIsStuckDoesNotHang() throws Exception {
    List<ReleaseRequest> released = Synthetic.releases();
    LockdClient c = Synthetic.client(released, 3);
    Lock lk = Synthetic.lock(c, "one", 7, 1);
    c.engine.stallLoopForTest(8);
    long t = System.nanoTime();
    c.close();
    double took = (System.nanoTime() - t) / 1e9;
    assertTrue(took < 6, "took " + took + " s"); // request timeout + 1 s, then 1 s for the loop
    lk.lost().get(2, TimeUnit.SECONDS);
    assertTrue(lk.isLost());
  }
}
