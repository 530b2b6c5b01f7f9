package dev.lockd.client;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.lockd.client.it.Cluster;
import java.time.Duration;
import java.util.List;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInfo;

/**
 * TLS: a client with the cluster's CA holds locks over {@code lockd dev --nodes 3 --tls} (client
 * ports over TLS, mutual TLS between the nodes); without the CA, or in plain text, it reaches
 * nothing, and the error says what to set.
 */
class TlsIntegrationTest {
  static Cluster cluster;

  /** http 19520, grpc 19620, peer 19720. */
  @BeforeAll
  static void up() {
    Cluster c = new Cluster(19520, 19620, 19720, 3, true);
    try {
      cluster = c.start();
    } catch (RuntimeException | Error e) {
      c.close();
      throw e;
    }
  }

  @AfterAll
  static void down() {
    if (cluster != null) {
      cluster.close();
    }
  }

  // scenario: tls
  @Test
  void aClientWithTheCaHoldsALockAndWithoutItTheErrorPointsToTheCa(TestInfo info) {
    String name = LocksIntegrationTest.name(info);
    try (LockdClient c = LockdClient.builder(cluster.endpoints).caFile(cluster.caFile())
        .ttl(Duration.ofSeconds(6)).build()) {
      try (Lock lk = c.lock(name, Duration.ofSeconds(5))) {
        assertTrue(lk.token() >= 1);
        assertFalse(lk.isLost());
      }
      assertTrue(c.inspect(name).holders().isEmpty());
    }
    RetryPolicy once = new RetryPolicy(1, Duration.ofMillis(50), Duration.ofSeconds(2));
    // TLS trusting only the system's roots, which do not know the throwaway CA.
    List<String> https = cluster.endpoints.stream().map(e -> "https://" + e).toList();
    try (LockdClient c = LockdClient.builder(https).ttl(Duration.ofSeconds(6))
        .requestTimeout(Duration.ofMillis(500)).retry(once).build()) {
      LockdException e = assertThrows(LockdException.class, () -> c.tryLock(name));
      System.out.println("without the CA: " + e.getMessage());
      assertTrue(e.getMessage().contains("give its CA (Builder.caFile)"), e.getMessage());
    }
    // Plain text to a TLS node. The node's refusal comes at once; the request timeout only
    // bounds a machine so loaded that it does not (at 0.5 s it once ran out first).
    try (LockdClient c = LockdClient.builder(cluster.endpoints).ttl(Duration.ofSeconds(6))
        .requestTimeout(Duration.ofSeconds(3)).retry(once).build()) {
      LockdException e = assertThrows(LockdException.class, () -> c.tryLock(name));
      System.out.println("in plain text: " + e.getMessage());
      assertTrue(e.getMessage().contains("caFile"), e.getMessage());
    }
  }
}
