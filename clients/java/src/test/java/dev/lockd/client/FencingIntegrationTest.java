package dev.lockd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.lockd.client.it.Cluster;
import dev.lockd.client.it.Prereq;
import dev.lockd.client.it.WithCluster;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.Statement;
import java.util.Map;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInfo;
import org.junit.jupiter.api.extension.ExtendWith;

/** The JDBC fencing helpers against a real PostgreSQL, under real locks. */
@ExtendWith(WithCluster.class)
class FencingIntegrationTest {
  static String row(Connection db, String sql) throws Exception {
    try (Statement st = db.createStatement(); ResultSet rs = st.executeQuery(sql)) {
      return rs.next() ? rs.getString(1) + "/" + rs.getLong(2) : null;
    }
  }

  @Test
  void fencedWritesRefuseAnOlderTokenAndTheGuardedWriteRefusesALostLock(Cluster cl,
      TestInfo info) throws Exception {
    String url = Prereq.jdbcUrl();
    String name = LocksIntegrationTest.name(info);
    String kv = "lockd_java_kv_" + ProcessHandle.current().pid();
    String own = "lockd_java_own_" + ProcessHandle.current().pid();
    try (Connection db = DriverManager.getConnection(url);
        LockdClient c = cl.client().build()) {
      try (Statement st = db.createStatement()) {
        st.execute("DROP TABLE IF EXISTS " + kv);
        st.execute("DROP TABLE IF EXISTS " + own);
        st.execute("CREATE TABLE " + own + " (batch_id INT PRIMARY KEY, status TEXT)");
        st.execute("INSERT INTO " + own + " VALUES (2210, 'new')");
      }
      try {
        Fencing.createTable(db, kv);
        Fencing.createTable(db, kv); // idempotent
        Lock first = c.tryLock(name);
        first.release();
        Lock second = c.tryLock(name);
        // Inserted when absent, then updated by the same or a newer token only.
        assertTrue(Fencing.fencedWrite(db, kv, "k", "a", second.token()));
        assertEquals("a/" + second.token(), row(db, "SELECT value, fence FROM " + kv));
        assertTrue(Fencing.fencedWrite(db, kv, "k", "b", second.token()));
        assertFalse(Fencing.fencedWrite(db, kv, "k", "stale", first.token()));
        assertEquals("b/" + second.token(), row(db, "SELECT value, fence FROM " + kv));
        FenceRejectedException e = assertThrows(FenceRejectedException.class,
            () -> Fencing.write(db, first, kv, "k", "stale", c));
        assertFalse(e.isRetryable());
        assertThrows(InvalidArgumentException.class, () -> Fencing.fencedWrite(db, kv, "k", "x",
            0));
        // On a table of one's own.
        Fencing.addFenceColumn(db, own, "fence");
        Fencing.addFenceColumn(db, own, "fence");
        assertTrue(Fencing.fencedUpdate(db, own, Map.of("status", "sent"),
            Map.of("batch_id", 2210), second.token(), "fence"));
        assertFalse(Fencing.fencedUpdate(db, own, Map.of("status", "stale"),
            Map.of("batch_id", 2210), first.token(), "fence"));
        assertFalse(Fencing.fencedUpdate(db, own, Map.of("status", "sent"),
            Map.of("batch_id", 9999), second.token(), "fence"), "no such row");
        assertEquals("sent/" + second.token(), row(db, "SELECT status, fence FROM " + own));
        assertThrows(InvalidArgumentException.class, () -> Fencing.fencedUpdate(db, own,
            Map.of("fence", 1), Map.of("batch_id", 2210), second.token(), "fence"));
        // A lost lock writes nothing: the guard refuses before the store is asked.
        c.engine.loseForTest("test");
        assertTrue(second.isLost());
        assertThrows(LockLostException.class,
            () -> Fencing.write(db, second, kv, "k", "after-loss", c));
        assertEquals("b/" + second.token(), row(db, "SELECT value, fence FROM " + kv));
      } finally {
        try (Statement st = db.createStatement()) {
          st.execute("DROP TABLE IF EXISTS " + kv);
          st.execute("DROP TABLE IF EXISTS " + own);
        }
      }
    }
  }
}
