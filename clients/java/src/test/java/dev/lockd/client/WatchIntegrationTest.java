package dev.lockd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.lockd.client.it.Cluster;
import dev.lockd.client.it.WithCluster;
import java.time.Duration;
import java.util.List;
import java.util.Optional;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInfo;
import org.junit.jupiter.api.extension.ExtendWith;

/** Watches, elections and the Curator-shaped recipes against a real 3-node lockd. */
@ExtendWith(WithCluster.class)
class WatchIntegrationTest {

  // scenario: watch
  @Test
  void aWatchSeesEachChangeOfItsNameOnceAndAPrefixItsNames(Cluster cl, TestInfo info)
      throws Exception {
    String name = LocksIntegrationTest.name(info);
    try (LockdClient client = cl.client().build(); LockdClient other = cl.client().build();
        Watch w = client.watch(name).open(); Watch pw = client.watchPrefix(name + "/").open()) {
      Lock lk = other.tryLock(name);
      lk.release();
      WatchEvent started = w.next(Duration.ofSeconds(10));
      WatchEvent ended = w.next(Duration.ofSeconds(10));
      assertEquals("hold_started", started.kind());
      assertEquals(name, started.name());
      assertEquals(lk.token(), started.token());
      assertEquals(lk.owner(), started.owner());
      assertEquals(6000, started.leaseTtlMs());
      assertEquals("hold_ended", ended.kind());
      assertEquals("release", ended.cause());
      assertEquals(lk.token(), ended.token());
      assertTrue(ended.index() > started.index(), "in order, each with its revision");
      assertEquals(lk.group(), started.group());
      assertEquals(lk.group(), ended.group());
      assertEquals(lk.group(), w.positions().get(0).group());
      // A name under the prefix: the prefix watch sees it, the name's watch does not, and a
      // caller that stops waiting loses nothing.
      Lock child = other.tryLock(name + "/a");
      WatchEvent ev = pw.next(Duration.ofSeconds(10));
      assertEquals("hold_started", ev.kind());
      assertEquals(name + "/a", ev.name());
      assertEquals(child.token(), ev.token());
      assertThrows(TimeoutException.class, () -> w.next(Duration.ofMillis(500)));
      Lock again = other.tryLock(name);
      ev = w.next(Duration.ofSeconds(10));
      assertEquals("hold_started", ev.kind());
      assertEquals(again.token(), ev.token(), "seen once: not the first hold again");
      assertTrue(again.token() > lk.token());
      again.release();
      child.release();
      assertEquals("hold_ended", w.next(Duration.ofSeconds(10)).kind());
      WatchEvent pend = pw.next(Duration.ofSeconds(10));
      assertEquals("hold_ended", pend.kind());
      assertEquals(name + "/a", pend.name(), "the prefix watch sees only names under it");
      assertThrows(TimeoutException.class, () -> pw.next(Duration.ofMillis(300)));
    }
  }

  @Test
  void aWatchNamesOneOfANameOrAPrefixAndAClosedWatchEnds(Cluster cl) {
    try (LockdClient client = cl.client().build()) {
      assertThrows(InvalidArgumentException.class, () -> client.watch(""));
      Watch w = client.watch("java/closed-watch").open();
      w.close();
      assertThrows(ClientClosedException.class, () -> w.next(Duration.ofSeconds(1)));
    }
  }

  // scenario: election
  @Test
  void leadersFollowAnElectionAsItChanges(Cluster cl, TestInfo info) throws Exception {
    String name = LocksIntegrationTest.name(info);
    try (LockdClient observer = cl.client().build(); LockdClient a = cl.client().build();
        LockdClient b = cl.client().build();
        Leaders leaders = observer.election(name).observe()) {
      assertEquals(Optional.empty(), leaders.next(Duration.ofSeconds(10)), "nobody leads yet");
      Leadership first = a.election(name).campaign("node-a", Duration.ofSeconds(5));
      assertEquals(Optional.of(new Leader("node-a", first.token(), "")),
          leaders.next(Duration.ofSeconds(10)));
      // b queues behind a; when a resigns, b leads: the observer sees b, not a gap it polled.
      CompletableFuture<Leadership> second = CompletableFuture.supplyAsync(
          () -> b.election(name).campaign("node-b", Duration.ofSeconds(10)));
      Cluster.waitUntil(() -> a.inspect(name).waiters().size() == 1, 10, "b to queue");
      assertFalse(second.isDone(), "one leader at a time");
      first.resign();
      Leadership sb = second.get(10, TimeUnit.SECONDS);
      Optional<Leader> seen = leaders.next(Duration.ofSeconds(10));
      if (seen.isEmpty()) { // the hand-off's end and start are two changes
        seen = leaders.next(Duration.ofSeconds(10));
      }
      assertEquals(Optional.of(new Leader("node-b", sb.token(), "")), seen);
      assertTrue(sb.token() > first.token(), "the second leader's token is larger");
      assertEquals("node-b", b.election(name).leader().orElseThrow().value());
      sb.close();
      assertEquals(Optional.empty(), leaders.next(Duration.ofSeconds(10)));
    }
  }

  @Test
  void aLeaderLatchLeadsResignsOnCloseAndHandsOverWithALargerToken(Cluster cl, TestInfo info)
      throws Exception {
    String name = LocksIntegrationTest.name(info);
    List<String> events = new CopyOnWriteArrayList<>();
    try (LockdClient a = cl.client().build(); LockdClient b = cl.client().build()) {
      LeaderLatch la = a.leaderLatch(name, "node-a");
      LeaderLatch lb = b.leaderLatch(name, "node-b");
      la.addListener(new LeaderLatchListener() {
        @Override
        public void isLeader() {
          events.add("a leads");
        }

        @Override
        public void notLeader() {
          events.add("a stops");
        }
      });
      lb.addListener(new LeaderLatchListener() {
        @Override
        public void isLeader() {
          events.add("b leads");
        }

        @Override
        public void notLeader() {
          events.add("b stops");
        }
      });
      la.start();
      assertTrue(la.await(10, TimeUnit.SECONDS));
      lb.start();
      Cluster.waitUntil(() -> a.inspect(name).waiters().size() == 1, 10, "b to queue");
      assertTrue(la.hasLeadership());
      assertFalse(lb.hasLeadership());
      assertFalse(lb.await(300, TimeUnit.MILLISECONDS));
      long ta = la.token().orElseThrow();
      assertEquals("node-a", lb.getLeader().orElseThrow().value());
      la.close(); // resigns
      assertFalse(la.hasLeadership());
      assertTrue(lb.await(10, TimeUnit.SECONDS));
      assertTrue(lb.token().orElseThrow() > ta, "the new leader's token is larger");
      assertEquals("node-b", la.getLeader().orElseThrow().value());
      lb.close();
      Cluster.waitUntil(() -> a.inspect(name).holders().isEmpty(), 5, "b to resign");
      assertEquals(List.of("a leads", "a stops", "b leads", "b stops"), events);
    }
  }

  @Test
  void aMutexInTheShapeOfInterProcessMutex(Cluster cl, TestInfo info) throws Exception {
    String name = LocksIntegrationTest.name(info);
    try (LockdClient a = cl.client().build(); LockdClient b = cl.client().build()) {
      LockdMutex ma = a.mutex(name);
      LockdMutex mb = b.mutex(name);
      ma.acquire();
      ma.acquire(); // re-entrant in the same thread: counted locally
      assertTrue(ma.isOwnedByCurrentThread());
      assertTrue(ma.isAcquiredInThisProcess());
      long token = ma.lock().orElseThrow().token();
      assertFalse(mb.acquire(300, TimeUnit.MILLISECONDS), "held by the other process");
      // Another thread of the same process contends like another process.
      CompletableFuture<Boolean> otherThread = CompletableFuture.supplyAsync(
          () -> ma.acquire(200, TimeUnit.MILLISECONDS));
      assertFalse(otherThread.get(5, TimeUnit.SECONDS));
      CompletableFuture<Boolean> waiting = CompletableFuture.supplyAsync(() -> {
        boolean got = mb.acquire(10, TimeUnit.SECONDS);
        if (got) {
          mb.release();
        }
        return got;
      });
      ma.release();
      assertTrue(ma.isOwnedByCurrentThread(), "one acquire still held");
      Thread.sleep(200);
      assertFalse(waiting.isDone());
      ma.release();
      assertFalse(ma.isOwnedByCurrentThread());
      assertTrue(waiting.get(10, TimeUnit.SECONDS));
      assertThrows(IllegalMonitorStateException.class, ma::release);
      ma.acquire();
      assertTrue(ma.lock().orElseThrow().token() > token);
      ma.release();
    }
  }
}
