package dev.lockd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.lockd.client.it.Cluster;
import dev.lockd.client.it.Prereq;
import dev.lockd.client.it.Signals;
import dev.lockd.client.it.WithCluster;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStreamWriter;
import java.io.Writer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Path;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.Statement;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInfo;
import org.junit.jupiter.api.extension.ExtendWith;

/**
 * Faults against a real lockd: the leader of a held lock's group SIGKILLed, renewals stopped in
 * the client, a worker process SIGSTOPped past its TTL whose fenced PostgreSQL write is refused,
 * and a watch that resumes on another node.
 */
@ExtendWith(WithCluster.class)
class FaultsIntegrationTest {
  /** A cluster of its own for a test that kills nodes: http 19510, grpc 19610, peer 19710. */
  static Cluster fresh() {
    Cluster c = new Cluster(19510, 19610, 19710, 3, false);
    try {
      return c.start();
    } catch (RuntimeException | Error e) {
      c.close();
      throw e;
    }
  }

  static int leaderOf(LockdClient c, int group) {
    for (NodeStatus.GroupStatus g : c.status().groups()) {
      if (g.id() == group) {
        return (int) g.leader();
      }
    }
    throw new AssertionError("no group " + group);
  }

  // scenario: leader-kill
  @Test
  void aLeaderSigkillKeepsTheLock(TestInfo info) throws Exception {
    String name = LocksIntegrationTest.name(info);
    double ttl = 6.0;
    try (Cluster cl = fresh()) {
      int group;
      int leader;
      try (LockdClient probe = cl.client().build()) {
        try (Lock lk = probe.tryLock(name)) {
          group = probe.getSession().held().get(0).group();
          assertEquals(group, lk.group());
        }
        leader = leaderOf(probe, group);
      }
      assertTrue(leader > 0, "the group has a leader");
      String leaderEp = cl.endpointOf(leader);
      List<String> eps = new ArrayList<>(List.of(leaderEp));
      cl.endpoints.stream().filter(e -> !e.equals(leaderEp)).forEach(eps::add);
      List<String> others = eps.subList(1, eps.size());
      long token;
      try (LockdClient c = cl.client(eps).build()) {
        Lock lk = c.lock(name, Duration.ofSeconds(5));
        token = lk.token();
        assertEquals(leaderEp, c.endpoint(), "the stream is on the leader's node");
        Thread.sleep(500);
        double killedAt = Clock.now();
        cl.signal(leader, "KILL");
        // A keepalive sent after the kill was acknowledged: the deadline moved past what the
        // last renewal before it could give.
        Cluster.waitUntil(() -> lk.deadline() > killedAt + ttl - ttl / 5 + 0.05, ttl,
            "a renewal acknowledged after the leader's death");
        assertFalse(lk.isLost(), "the lock must survive the failover");
        assertNotEquals(leaderEp, c.endpoint(), "the session stream moved to another node");
        Cluster.waitUntil(() -> c.inspect(name).holders().size() == 1, 10,
            "the new leader to answer");
        assertEquals(List.of(token), c.inspect(name).holders().stream()
            .map(LockState.Holder::token).toList(), "same holder, same token");
        int newLeader = leaderOf(c, group);
        assertTrue(newLeader != 0 && newLeader != leader, "a new leader: " + newLeader);
        // Keep holding for two TTLs from the kill.
        Engine.sleep(killedAt + 2 * ttl - Clock.now());
        assertFalse(lk.isLost());
        assertFalse(lk.lost().isDone());
        assertEquals(0, c.leaseExpiredCount());
        assertEquals(token, lk.token());
        assertEquals(0, lk.release(), "the service accepts the release with the same token");
      }
      try (LockdClient after = cl.client(others).build();
          Lock lk2 = after.lock(name, Duration.ofSeconds(5))) {
        assertTrue(lk2.token() > token);
      }
    }
  }

  @Test
  void aWatchResumesOnAnotherNodeWithNoChangeMissedOrRepeated(TestInfo info) throws Exception {
    String name = LocksIntegrationTest.name(info);
    try (Cluster cl = fresh()) {
      int victim = 1;
      String first = cl.endpointOf(victim);
      List<String> rest = cl.endpoints.stream().filter(e -> !e.equals(first)).toList();
      List<String> watchEps = new ArrayList<>(List.of(first));
      watchEps.addAll(rest);
      try (LockdClient watcher = cl.client(watchEps).build();
          LockdClient writer = cl.client(rest).build();
          Watch w = watcher.watch(name).open()) {
        List<Long> tokens = new ArrayList<>();
        Lock lk = writer.lock(name, Duration.ofSeconds(10));
        tokens.add(lk.token());
        lk.release();
        assertEquals("hold_started", w.next(Duration.ofSeconds(10)).kind());
        assertEquals("hold_ended", w.next(Duration.ofSeconds(10)).kind());
        // The node under the watch's stream dies; the changes made meanwhile arrive once.
        cl.signal(victim, "KILL");
        for (int i = 0; i < 3; i++) {
          Lock l = writer.lock(name, Duration.ofSeconds(20));
          tokens.add(l.token());
          l.release();
        }
        List<WatchEvent> seen = new ArrayList<>();
        for (int i = 0; i < 6; i++) {
          seen.add(w.next(Duration.ofSeconds(30)));
        }
        assertEquals(List.of("hold_started", "hold_ended", "hold_started", "hold_ended",
            "hold_started", "hold_ended"), seen.stream().map(WatchEvent::kind).toList());
        assertEquals(tokens.subList(1, 4), List.of(seen.get(0).token(), seen.get(2).token(),
            seen.get(4).token()));
        assertThrows(TimeoutException.class, () -> w.next(Duration.ofSeconds(1)),
            "nothing repeated");
      }
    }
  }

  @Test
  void aRetryAfterABrokenStreamTakesTheWaitItQueued(TestInfo info) throws Exception {
    // SIGKILL the node that carries a waiting client's session stream (a follower of the name's
    // group, so the group keeps its leader): the wait lives on in the group, the acquire's retry
    // on the moved stream is refused already_waiting by its own first attempt and adopts that
    // wait, and the grant pushed later answers it.
    String name = LocksIntegrationTest.name(info);
    try (Cluster cl = fresh(); LockdClient holder = cl.client().build()) {
      Lock held = holder.tryLock(name);
      int group = holder.getSession().held().get(0).group();
      int leader = leaderOf(holder, group);
      int follower = cl.nodePids.keySet().stream().sorted().filter(n -> n != leader)
          .findFirst().orElseThrow();
      String ep = cl.endpointOf(follower);
      List<String> eps = new ArrayList<>(List.of(ep));
      cl.endpoints.stream().filter(e -> !e.equals(ep)).forEach(eps::add);
      try (LockdClient w = cl.client(eps).build()) {
        CompletableFuture<Lock> wait = CompletableFuture.supplyAsync(
            () -> w.lock(name, Duration.ofSeconds(30)));
        Cluster.waitUntil(() -> holder.inspect(name).waiters().size() == 1, 10,
            "the wait to queue");
        assertEquals(ep, w.endpoint());
        cl.signal(follower, "KILL");
        Cluster.waitUntil(() -> !w.endpoint().equals(ep), 10, "the stream to move");
        Thread.sleep(1500);
        assertEquals(1, holder.inspect(name).waiters().size(), "one wait, not two");
        held.release();
        Lock lk = wait.get(20, TimeUnit.SECONDS);
        assertEquals(List.of(lk.token()), holder.inspect(name).holders().stream()
            .map(LockState.Holder::token).toList());
        assertTrue(lk.token() > held.token());
        assertEquals(0, lk.release());
      }
    }
  }

  @Test
  void closingALockAfterTheClusterStoppedTakesAtMostTheLease(TestInfo info) {
    // Every node stops answering (SIGSTOP) while a lock is held: closing it retries the release
    // only until the lock's lease ends (then LockLostException: the work may have overlapped the
    // next holder's), rather than every retry of every attempt.
    String name = LocksIntegrationTest.name(info);
    double ttl = 5.0;
    try (Cluster cl = fresh()) {
      LockdClient c = cl.client().ttl(Duration.ofSeconds(5)).build();
      long[] started = new long[1];
      try {
        assertThrows(LockLostException.class, () -> {
          try (Lock lk = c.tryLock(name)) {
            assertTrue(lk.token() > 0);
            for (int n : cl.nodePids.keySet()) {
              cl.signal(n, "STOP");
            }
            started[0] = System.nanoTime();
          }
        });
        double took = (System.nanoTime() - started[0]) / 1e9;
        // The lease ends at most ttl - margin after the last keepalive; one request timeout
        // (2 s) more at most, and slack for a busy machine.
        assertTrue(took < ttl + 2.0 + 2.0, "closing took " + took + " s");
      } finally {
        for (int n : cl.nodePids.keySet()) {
          cl.signal(n, "CONT");
        }
        c.close();
      }
    }
  }

  // scenario: lost-before-expiry
  @Test
  void lostFiresAtTheLocalDeadlineBeforeTheServiceExpiresTheSession(Cluster cl, TestInfo info)
      throws Exception {
    String name = LocksIntegrationTest.name(info);
    // A wide margin (2.5 s of the 5 s TTL) leaves the check below seconds before the service may
    // expire the session, even on a slow machine.
    double ttl = 5.0;
    try (LockdClient c = cl.client().ttl(Duration.ofSeconds(5)).margin(Duration.ofMillis(2500))
        .build()) {
      Lock lk = c.tryLock(name);
      // Wait for a keepalive reply, so the deadline counts from an acknowledged keepalive.
      double opened = lk.deadline();
      Cluster.waitUntil(() -> lk.deadline() > opened, 5, "a keepalive reply");
      double deadline = lk.deadline();
      // Block the client's own renewal loop so that no keepalive is sent (what a GC pause or a
      // stuck thread does): the lost signal is a timer of its own.
      c.engine.stallLoopForTest(deadline - Clock.now() + 0.3);
      lk.lost().get((long) ((ttl + 2) * 1000), TimeUnit.MILLISECONDS);
      double fired = Clock.now();
      assertTrue(fired >= deadline - 0.05, "fired " + (deadline - fired) + " s early");
      assertTrue(fired - deadline < 0.5, "fired " + (fired - deadline) + " s late");
      assertTrue(lk.isLost());
      // The service has not expired the session yet: the local deadline comes first.
      try (LockdClient other = cl.client().build()) {
        assertEquals(List.of(lk.token()), other.inspect(name).holders().stream()
            .map(LockState.Holder::token).toList());
        assertTrue(Clock.now() < deadline + 2.5, "the check came after the margin");
      }
      assertThrows(LockLostException.class, lk::close);
    }
  }

  static final Pattern FIELD = Pattern.compile(
      "\"(\\w+)\":\\s*(\"[^\"]*\"|true|false|-?\\d+)");

  static Map<String, String> readJson(BufferedReader r, Process p, double timeout)
      throws Exception {
    CompletableFuture<String> line = CompletableFuture.supplyAsync(() -> {
      try {
        return r.readLine();
      } catch (IOException e) {
        throw new IllegalStateException(e);
      }
    });
    String s;
    try {
      s = line.get((long) (timeout * 1000), TimeUnit.MILLISECONDS);
    } catch (TimeoutException e) {
      throw new AssertionError("the worker said nothing in " + timeout + " s");
    }
    if (s == null) {
      throw new AssertionError("the worker exited (" + p.waitFor(5, TimeUnit.SECONDS)
          + ") without a line");
    }
    Map<String, String> out = new HashMap<>();
    Matcher m = FIELD.matcher(s);
    while (m.find()) {
      out.put(m.group(1), m.group(2).replace("\"", ""));
    }
    return out;
  }

  // scenario: pause-fenced
  @Test
  void aSigstoppedWorkerIsFencedOut(Cluster cl, TestInfo info) throws Exception {
    String url = Prereq.jdbcUrl();
    String name = LocksIntegrationTest.name(info);
    double ttl = 5.0;
    String table = "lockd_java_test_" + ProcessHandle.current().pid();
    String key = "payouts/m-1";
    try (Connection db = DriverManager.getConnection(url); Statement st = db.createStatement()) {
      st.execute("DROP TABLE IF EXISTS " + table);
      Fencing.createTable(db, table);
    }
    String cp = System.getProperty("surefire.test.class.path",
        System.getProperty("java.class.path"));
    Path java = Path.of(System.getProperty("java.home"), "bin", "java");
    Process worker = new ProcessBuilder(java.toString(), "-Xshare:auto", "-XX:TieredStopAtLevel=1",
        "-cp", cp, "dev.lockd.client.it.Worker", String.join(",", cl.endpoints), name,
        String.valueOf(ttl), url, table, key)
        .redirectError(ProcessBuilder.Redirect.appendTo(Path.of("target", "worker-stderr.log")
            .toFile())).start();
    BufferedReader out = new BufferedReader(new InputStreamReader(worker.getInputStream(),
        StandardCharsets.UTF_8));
    boolean stopped = false;
    try {
      Map<String, String> first = readJson(out, worker, 30);
      assertEquals("acquired", first.get("step"));
      long firstToken = Long.parseLong(first.get("token"));
      Signals.send(worker.pid(), "STOP");
      stopped = true;
      Cluster.waitUntil(() -> "T".equals(Cluster.procState(worker.pid())), 5,
          "the worker to be stopped");
      long pausedAt = System.nanoTime();
      try (LockdClient c = cl.client().ttl(Duration.ofSeconds(5)).build()) {
        // The worker's session expires on the service (no keepalives from a stopped process);
        // the lock goes to us, the next waiter.
        Lock lk = c.lock(name, Duration.ofSeconds((long) (4 * ttl)));
        double waited = (System.nanoTime() - pausedAt) / 1e9;
        assertTrue(lk.token() > firstToken, "a larger token");
        assertTrue(waited >= ttl - 1.5, "granted " + waited + " s into the pause: before the TTL?");
        try (Connection db = DriverManager.getConnection(url)) {
          Fencing.write(db, lk, table, key, "next-holder", c); // accepted
        }
        assertEquals("T", Cluster.procState(worker.pid()), "the worker stayed stopped");
        Signals.send(worker.pid(), "CONT");
        stopped = false;
        Writer in = new OutputStreamWriter(worker.getOutputStream(), StandardCharsets.UTF_8);
        in.write("go\n");
        in.flush();
        Map<String, String> res = readJson(out, worker, 20);
        assertEquals("resumed", res.get("step"));
        assertEquals("true", res.get("lost"), "lost at the local deadline, before it writes");
        assertEquals("true", res.get("lost_future"), "the lost future completed too");
        assertEquals("lost", res.get("guarded"), "the guarded write refuses locally once lost");
        assertEquals("false", res.get("raw_accepted"), "the store refuses the stale token");
        assertTrue(Integer.parseInt(res.get("lease_expired")) >= 1);
        try (Connection db = DriverManager.getConnection(url);
            PreparedStatement ps = db.prepareStatement("SELECT value, fence FROM " + table
                + " WHERE key = ?")) {
          ps.setString(1, key);
          try (ResultSet rs = ps.executeQuery()) {
            assertTrue(rs.next());
            assertEquals("next-holder", rs.getString(1));
            assertEquals(lk.token(), rs.getLong(2), "the row holds the second holder's token");
          }
        }
        lk.release();
      }
      assertTrue(worker.waitFor(15, TimeUnit.SECONDS));
      assertEquals(0, worker.exitValue());
    } finally {
      if (worker.isAlive()) {
        if (stopped) {
          Signals.send(worker.pid(), "CONT");
        }
        worker.destroyForcibly();
        worker.waitFor(5, TimeUnit.SECONDS);
      }
      try (Connection db = DriverManager.getConnection(url);
          Statement st = db.createStatement()) {
        st.execute("DROP TABLE IF EXISTS " + table);
      }
    }
  }
}
