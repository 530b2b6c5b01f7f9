package dev.lockd.client.it;

import dev.lockd.client.FenceRejectedException;
import dev.lockd.client.Fencing;
import dev.lockd.client.Lock;
import dev.lockd.client.LockLostException;
import dev.lockd.client.LockdClient;
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.time.Duration;
import java.util.Arrays;

/**
 * A worker process for the pause-fenced scenario (FaultsIntegrationTest): takes a lock, makes a
 * fenced write, reports its token, waits for "go" on stdin (the test SIGSTOPs it past its TTL
 * meanwhile), then reports whether its lock is lost and tries its fenced writes. One JSON line
 * per step on stdout.
 *
 * <pre>java -cp TEST_CLASSPATH dev.lockd.client.it.Worker ENDPOINTS NAME TTL_S JDBC_URL TABLE KEY</pre>
 */
public final class Worker {
  private Worker() {}

  static void say(String json) {
    System.out.println(json);
    System.out.flush();
  }

  public static void main(String[] args) throws Exception {
    String endpoints = args[0];
    String name = args[1];
    double ttl = Double.parseDouble(args[2]);
    String url = args[3];
    String table = args[4];
    String key = args[5];
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in,
        StandardCharsets.UTF_8));
    try (LockdClient c = LockdClient.builder(Arrays.asList(endpoints.split(",")))
            .ttl(Duration.ofMillis((long) (ttl * 1000))).clientName("java-worker").build();
        Connection db = DriverManager.getConnection(url)) {
      db.setAutoCommit(true);
      Lock lk = c.lock(name, Duration.ofSeconds(10));
      Fencing.write(db, lk, table, key, "worker-before-pause", c);
      say("{\"step\": \"acquired\", \"token\": " + lk.token() + "}");
      if (!"go".equals(in.readLine())) {
        return;
      }
      // The first thing a resumed worker does: ask the clock, not the client's threads.
      boolean lost = lk.isLost();
      String guarded;
      try {
        Fencing.write(db, lk, table, key, "worker-after-pause", c);
        guarded = "written";
      } catch (LockLostException e) {
        guarded = "lost";
      } catch (FenceRejectedException e) {
        guarded = "rejected";
      }
      // What a worker that ignored `lost` would do: the store itself must refuse it.
      boolean raw = Fencing.fencedWrite(db, table, key, "worker-stale", lk.token());
      // The client's own threads count the expired lease once they run after the pause.
      long end = System.nanoTime() + 3_000_000_000L;
      while (c.leaseExpiredCount() == 0 && System.nanoTime() < end) {
        Thread.sleep(20);
      }
      boolean future = lk.lost().isDone();
      say("{\"step\": \"resumed\", \"lost\": " + lost + ", \"lost_future\": " + future
          + ", \"guarded\": \"" + guarded + "\", \"raw_accepted\": " + raw
          + ", \"lease_expired\": " + c.leaseExpiredCount() + "}");
    }
  }
}
