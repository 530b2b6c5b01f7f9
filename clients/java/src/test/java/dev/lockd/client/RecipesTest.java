package dev.lockd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.lockd.v1.ReleaseRequest;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.Supplier;
import org.junit.jupiter.api.Test;

/** The Curator-shaped recipes (LeaderLatch, LockdMutex) on a client with synthetic grants. */
class RecipesTest {
  static final String NAME = "leaders/p-9";

  /** Listeners that record what they hear. */
  static LeaderLatchListener recorder(List<String> events) {
    return new LeaderLatchListener() {
      @Override
      public void isLeader() {
        events.add("leads");
      }

      @Override
      public void notLeader() {
        events.add("stops");
      }
    };
  }

  /**
   * Campaigns that win at once with a synthetic grant in {@code group} (token 7) the first
   * time; later ones call {@code later} and then wait in line until the latch closes.
   */
  static Supplier<Leadership> campaigns(LockdClient c, int group, AtomicInteger count,
      Runnable later) {
    return () -> {
      if (count.incrementAndGet() == 1) {
        return new Leadership(Synthetic.lock(c, NAME, 7, group), "node-a");
      }
      later.run();
      Engine.sleep(60); // ClientClosedException when close() interrupts it
      throw new IllegalStateException("unreachable");
    };
  }

  // C1
  @Test
  void aLatchWhoseLeadershipWasResignedDirectlyNoLongerLeadsAndQueuesAgain() throws Exception {
    List<ReleaseRequest> released = Synthetic.releases();
    LockdClient c = Synthetic.client(released, 3);
    try (LeaderLatch latch = c.leaderLatch(NAME, "node-a")) {
      List<String> events = new CopyOnWriteArrayList<>();
      latch.addListener(recorder(events));
      CountDownLatch again = new CountDownLatch(1);
      AtomicInteger count = new AtomicInteger();
      latch.campaigner = campaigns(c, 1, count, again::countDown);
      latch.start();
      assertTrue(latch.await(5, TimeUnit.SECONDS));
      assertEquals(7, latch.token().getAsLong());
      Leadership l = latch.leadership().orElseThrow();
      l.resign();
      assertFalse(l.isLeading());
      assertFalse(latch.hasLeadership(), "a resigned term does not lead");
      assertTrue(latch.token().isEmpty());
      assertTrue(latch.leadership().isEmpty());
      assertFalse(latch.await(50, TimeUnit.MILLISECONDS));
      assertTrue(again.await(5, TimeUnit.SECONDS), "the latch campaigns again");
      ClientUnitTest.waitFor(() -> events.size() == 2, 5);
      assertEquals(List.of("leads", "stops"), events);
      assertEquals(1, released.size(), "released once: the resign");
      assertEquals(7, released.get(0).getFencingToken());
      latch.close();
      assertEquals(List.of("leads", "stops"), events, "close tells no one twice");
    } finally {
      c.close();
    }
  }

  // M2
  @Test
  void aLatchGivesALostHoldBackBeforeItCampaignsAgain() throws Exception {
    List<ReleaseRequest> released = Synthetic.releases();
    LockdClient c = Synthetic.client(released, 3);
    try (LeaderLatch latch = c.leaderLatch(NAME, "node-a")) {
      List<String> events = new CopyOnWriteArrayList<>();
      latch.addListener(recorder(events));
      CompletableFuture<List<ReleaseRequest>> atSecond = new CompletableFuture<>();
      AtomicInteger count = new AtomicInteger();
      latch.campaigner = campaigns(c, 2, count,
          () -> atSecond.complete(new ArrayList<>(released)));
      latch.start();
      assertTrue(latch.await(5, TimeUnit.SECONDS));
      // Group 2 ends the session's lease there: the term is lost, the session goes on.
      c.engine.injectEvent(Synthetic.groupEnded(2));
      List<ReleaseRequest> before = atSecond.get(5, TimeUnit.SECONDS);
      assertEquals(1, before.size(), "the lost hold is given back before the next campaign "
          + "(the service may still count it, and refuse this owner already_held)");
      assertEquals(NAME, before.get(0).getName());
      assertEquals(7, before.get(0).getFencingToken());
      assertFalse(latch.hasLeadership());
      ClientUnitTest.waitFor(() -> events.size() == 2, 5);
      assertEquals(List.of("leads", "stops"), events);
    } finally {
      c.close();
    }
  }

  // M4
  @Test
  void aReentrantMutexAcquireOnALostHoldThrowsAndKeepsTheCount() {
    List<ReleaseRequest> released = Synthetic.releases();
    LockdClient c = Synthetic.client(released, 3);
    try {
      LockdMutex m = c.mutex("jobs/reindex");
      Lock lk = Synthetic.lock(c, "jobs/reindex", 7, 2);
      m.threads.put(Thread.currentThread(), new LockdMutex.Held(lk)); // acquired once
      assertTrue(m.acquire(1, TimeUnit.SECONDS));
      assertEquals(2, m.holdCount());
      c.engine.injectEvent(Synthetic.groupEnded(2));
      assertTrue(lk.isLost());
      assertThrows(LockLostException.class, () -> m.acquire(1, TimeUnit.SECONDS));
      assertThrows(LockLostException.class, m::acquire);
      assertEquals(2, m.holdCount(), "the count stays balanced with the caller's acquires");
      assertEquals(List.of(), released, "nothing taken or given back behind the caller's back");
      m.release();
      assertEquals(1, m.holdCount());
      assertThrows(LockLostException.class, m::release, "the last release reports the loss");
      assertEquals(0, m.holdCount());
      assertFalse(m.isOwnedByCurrentThread());
      assertEquals(1, released.size());
      assertEquals(7, released.get(0).getFencingToken());
      assertThrows(IllegalMonitorStateException.class, m::release);
    } finally {
      c.close();
    }
  }
}
