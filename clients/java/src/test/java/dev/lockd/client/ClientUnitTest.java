package dev.lockd.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertSame;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import dev.lockd.v1.KeepAliveResponse;
import dev.lockd.v1.OpenSessionResponse;
import dev.lockd.v1.SessionEnded;
import dev.lockd.v1.SessionEvent;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

/** Checks that need no cluster: typed errors and their retryable classification, backoff, the
 * name rule against the spec, the engine's handling of synthetic replies and pushes. */
class ClientUnitTest {
  static Path repo() {
    return Path.of(System.getProperty("lockd.repo", "../..")).toAbsolutePath().normalize();
  }

  static StatusRuntimeException rpcError(Status.Code code, String details, String lockdCode,
      String retryAfterMs) {
    Metadata md = new Metadata();
    if (lockdCode != null) {
      md.put(Errors.ERROR_CODE, lockdCode);
    }
    if (retryAfterMs != null) {
      md.put(Errors.RETRY_AFTER_MS, retryAfterMs);
    }
    return new StatusRuntimeException(Status.fromCode(code).withDescription(details), md);
  }

  @ParameterizedTest
  @CsvSource({
      "UNAVAILABLE, no_leader, UnavailableException, 503, true",
      "FAILED_PRECONDITION, stale_token, ConflictException, 409, false",
      "NOT_FOUND, session_not_found, SessionNotFoundException, 404, false",
      "RESOURCE_EXHAUSTED, queue_full, ResourceExhaustedException, 429, true",
      "RESOURCE_EXHAUSTED, too_many_sessions, ResourceExhaustedException, 429, false",
      "RESOURCE_EXHAUSTED, payload_too_large, ResourceExhaustedException, 413, false",
      "PERMISSION_DENIED, wrong_namespace, PermissionDeniedException, 403, false",
      "UNAUTHENTICATED, unauthenticated, UnauthenticatedException, 401, false",
      "INVALID_ARGUMENT, ttl_out_of_range, InvalidArgumentException, 400, false",
  })
  void serviceErrorsAreTyped(Status.Code gcode, String code, String cls, int status,
      boolean retryable) {
    LockdException e = Errors.fromGrpc(rpcError(gcode, "why", code, "250"), "", false, false);
    assertEquals(cls, e.getClass().getSimpleName());
    assertEquals(code, e.code());
    assertEquals(status, e.status().getAsInt());
    assertEquals(retryable, e.isRetryable());
    assertEquals(Duration.ofMillis(250), e.retryAfter().orElseThrow());
  }

  @Test
  void transportErrorsAreRetryableUnavailable() {
    LockdException e = Errors.fromGrpc(rpcError(Status.Code.UNAVAILABLE, "connection refused",
        null, null), "n1:1", false, false);
    assertInstanceOf(UnavailableException.class, e);
    assertTrue(e.isRetryable());
    assertTrue(e.status().isEmpty());
    assertTrue(e.getMessage().contains("n1:1"));
    e = Errors.fromGrpc(rpcError(Status.Code.DEADLINE_EXCEEDED, "deadline", null, null), "",
        false, false);
    assertInstanceOf(UnavailableException.class, e);
    assertTrue(e.isRetryable());
    e = Errors.fromGrpc(rpcError(Status.Code.UNIMPLEMENTED, "no such method", null, null), "",
        false, false);
    assertEquals("unimplemented", e.code());
    assertFalse(e.isRetryable());
  }

  @Test
  void theServicesCodeIsReadFromTheInitialMetadataTooTheTrailersWinning() {
    // grpc-java puts only the trailers in the exception; the headers come from the call.
    Metadata headers = new Metadata();
    headers.put(Errors.ERROR_CODE, "queue_full");
    headers.put(Errors.RETRY_AFTER_MS, "300");
    StatusRuntimeException bare = rpcError(Status.Code.RESOURCE_EXHAUSTED, "full", null, null);
    LockdException e = Errors.fromGrpc(bare, headers, "n:1", false, false, true);
    assertInstanceOf(ResourceExhaustedException.class, e);
    assertEquals("queue_full", e.code());
    assertEquals(429, e.status().getAsInt());
    assertTrue(e.isRetryable());
    assertEquals(Duration.ofMillis(300), e.retryAfter().orElseThrow());
    // Without them the same status is the transport's.
    assertInstanceOf(UnavailableException.class, Errors.fromGrpc(bare, null, "n:1", false, false,
        true));
    e = Errors.fromGrpc(rpcError(Status.Code.FAILED_PRECONDITION, "stale", "stale_token", null),
        headers, "n:1", false, false, true);
    assertEquals("stale_token", e.code());
    assertEquals(Duration.ofMillis(300), e.retryAfter().orElseThrow(), "absent from the trailers");
  }

  @Test
  void aFencedWriteIsOneConditionalUpsertStatement() throws Exception {
    // Inserting, or updating only under a token at least the stored fence, in one statement (as
    // the Python client's): no window between an UPDATE and an INSERT for another writer.
    List<String> statements = new ArrayList<>();
    List<Object> params = new ArrayList<>();
    int[] rows = {1};
    java.sql.PreparedStatement ps = (java.sql.PreparedStatement) java.lang.reflect.Proxy
        .newProxyInstance(getClass().getClassLoader(),
            new Class<?>[] {java.sql.PreparedStatement.class}, (proxy, m, args) -> {
              switch (m.getName()) {
                case "setString", "setLong", "setObject" -> params.add(args[1]);
                case "executeUpdate" -> {
                  return rows[0];
                }
                default -> { }
              }
              return null;
            });
    java.sql.Connection conn = (java.sql.Connection) java.lang.reflect.Proxy.newProxyInstance(
        getClass().getClassLoader(), new Class<?>[] {java.sql.Connection.class},
        (proxy, m, args) -> {
          if (m.getName().equals("prepareStatement")) {
            statements.add((String) args[0]);
            return ps;
          }
          throw new UnsupportedOperationException(m.getName());
        });
    assertTrue(Fencing.fencedWrite(conn, "kv", "k", "v", 42));
    assertEquals(List.of("INSERT INTO \"kv\" AS cur (key, value, fence) VALUES (?, ?, ?) "
        + "ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value, fence = EXCLUDED.fence "
        + "WHERE cur.fence <= EXCLUDED.fence"), statements);
    assertEquals(List.of("k", "v", 42L), params);
    rows[0] = 0; // the stored fence is newer: no row written
    assertFalse(Fencing.fencedWrite(conn, "kv", "k", "v", 41));
    assertEquals(2, statements.size(), "one statement per write, refused or not");
  }

  @Test
  void clientSideOutcomesAreNotRetryableAndTheEventErrorsMapAsTheStatuses() {
    for (LockdException e : List.of(new NotAcquiredException("x"), new SessionLostException("x"),
        new ClientClosedException("x"), new LockLostException("x"),
        new FenceRejectedException("x"))) {
      assertFalse(e.isRetryable(), e.getClass().getSimpleName());
    }
    assertEquals("not_acquired", new NotAcquiredException("x").code());
    assertEquals("lock_lost", new LockLostException("x").code());
    LockdException e = Errors.fromEvent(dev.lockd.v1.Error.newBuilder().setStatus(503)
        .setCode("no_leader").setMessage("m").setRetryAfterMs(100).build());
    assertInstanceOf(UnavailableException.class, e);
    assertTrue(e.isRetryable());
    e = Errors.fromEvent(dev.lockd.v1.Error.newBuilder().setStatus(429)
        .setCode("too_many_sessions").setMessage("m").build());
    assertInstanceOf(ResourceExhaustedException.class, e);
    assertFalse(e.isRetryable());
  }

  @Test
  void tlsMistakesGetTheHintTheClientsOwnSettingsPointTo() {
    assertTrue(Errors.tlsHint("SSLHandshakeException: PKIX path building failed", "n:1", true,
        true).contains("Builder.caFile"));
    assertTrue(Errors.tlsHint("Network closed for unknown reason", "n:1", false, false)
        .contains("caFile"));
    assertNull(Errors.tlsHint("Connection refused", "n:1", true, true));
    assertNull(Errors.tlsHint("Connection refused", "n:1", false, false));
  }

  @Test
  void backoffStaysUnderItsCeilingAndHonoursRetryAfter() {
    RetryPolicy p = RetryPolicy.DEFAULT;
    for (int attempt = 0; attempt < 30; attempt++) {
      assertTrue(p.delay(attempt, 0) <= Math.min(2.0, 0.05 * Math.pow(2, Math.min(attempt, 20))));
    }
    assertTrue(p.delay(0, 0.7) >= 0.7);
    assertThrows(InvalidArgumentException.class,
        () -> new RetryPolicy(0, Duration.ofMillis(1), Duration.ofMillis(2)));
  }

  @Test
  void checkNameIsTheSpecsNamePattern() throws Exception {
    // The client refuses exactly the names docs/openapi.yaml's Name pattern (the server's rule)
    // refuses: every code point near an edge of an excluded range, and a stride of the rest.
    String text = Files.readString(repo().resolve("docs/openapi.yaml"));
    String schema = text.split("\n    Name:\n      type: string\n", 2)[1].split("description:",
        2)[0];
    List<String> pats = new ArrayList<>();
    for (String ln : schema.split("\n")) {
      String s = ln.strip();
      if (s.startsWith("pattern: \"")) {
        pats.add(s.substring("pattern: \"".length(), s.length() - 1));
      }
    }
    assertEquals(2, pats.size(), schema);
    Pattern allowed = Pattern.compile(pats.get(0).replace("\\\\", "\\"));
    Matcher astral = Pattern.compile("\\\\U([0-9A-Fa-f]{8})").matcher(pats.get(1));
    StringBuilder sb = new StringBuilder();
    while (astral.find()) {
      astral.appendReplacement(sb, Matcher.quoteReplacement("\\x{" + astral.group(1) + "}"));
    }
    astral.appendTail(sb);
    Pattern refused = Pattern.compile(sb.toString());
    TreeSet<Integer> points = new TreeSet<>();
    for (int[] r : Names.NOT_IN_NAMES) {
      for (int c : r) {
        for (int d = -1; d <= 1; d++) {
          points.add(c + d);
        }
      }
    }
    for (int c = 0; c < 0x110000; c += 7) {
      points.add(c);
    }
    List<String> differ = new ArrayList<>();
    for (int c : points) {
      if (c < 0 || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) {
        continue;
      }
      String s = new String(Character.toChars(c));
      boolean spec = allowed.matcher(s).matches() && !refused.matcher(s).find();
      boolean client;
      try {
        Names.checkName(s);
        client = true;
      } catch (InvalidArgumentException e) {
        client = false;
      }
      if (spec != client) {
        differ.add(String.format("U+%04X spec=%s client=%s", c, spec, client));
      }
    }
    assertEquals(List.of(), differ.subList(0, Math.min(20, differ.size())));
    for (String bad : List.of("pay\u202eexe.sh", "shard\u200b17", "a\udc00")) {
      InvalidArgumentException e = assertThrows(InvalidArgumentException.class,
          () -> Names.checkName(bad));
      assertTrue(e.getMessage().contains("U+"), e.getMessage());
    }
    Names.checkName("caf\u00e9/\u65e5\u672c \uD83D\uDD12");
  }

  @Test
  void badOptionsAreRefusedBeforeAnythingIsSent() {
    assertTrue(assertThrows(InvalidArgumentException.class,
        () -> LockdClient.builder("127.0.0.1:1").ttl(Duration.ZERO).build()).getMessage()
        .contains("ttl must lie in (0, 3600]"));
    assertThrows(InvalidArgumentException.class,
        () -> LockdClient.builder("127.0.0.1:1").token("has space").build());
    assertThrows(InvalidArgumentException.class, () -> LockdClient.builder().build());
    assertThrows(InvalidArgumentException.class, () -> LockdClient.builder("nohostport").build());
    assertThrows(InvalidArgumentException.class, () -> LockdClient.builder("127.0.0.1:1")
        .ttl(Duration.ofSeconds(5)).margin(Duration.ofSeconds(5)).build());
    assertThrows(InvalidArgumentException.class, () -> LockdClient.builder("127.0.0.1:1")
        .clientCertificate(Path.of("c.pem"), null).build());
  }

  @Test
  void aClientWhoseEndpointHasNothingListeningFailsFast() throws Exception {
    int port;
    try (ServerSocket s = new ServerSocket(0)) {
      port = s.getLocalPort();
    }
    long t = System.nanoTime();
    try (LockdClient c = LockdClient.builder("127.0.0.1:" + port).build()) {
      UnavailableException e = assertThrows(UnavailableException.class, () -> c.tryLock("x"));
      assertTrue(e.isExhausted(), e.toString());
    }
    double took = (System.nanoTime() - t) / 1e9;
    assertTrue(took < 5.0 + 2.0, "took " + took + " s");
  }

  // ----- the engine on synthetic replies (no service) -----

  /** An engine with a session opened {@code sentAgo} seconds ago by a synthetic answer (no
   * stream; no keepalive is due for ages); reports of expired leases go to {@code reported}. */
  static Engine engine(double sentAgo, List<String> reported) {
    Engine core = new Engine(new Options(List.of("127.0.0.1:1"), "me", 15, null, "", null, 2, 5,
        RetryPolicy.DEFAULT, null, null, null, null));
    core.reportHook = names -> {
      synchronized (reported) {
        reported.addAll(names);
      }
    };
    double sent = Clock.now() - sentAgo;
    core.openSynthetic(OpenSessionResponse.newBuilder().setSessionId("s").setTtlMs(15_000)
        .setKeepaliveEveryMs(1_000_000_000L).build(), sent);
    return core;
  }

  static KeepAliveResponse reply(dev.lockd.v1.GroupLease... gls) {
    return KeepAliveResponse.newBuilder().setTtlMs(15_000).addAllGroups(List.of(gls)).build();
  }

  static void waitFor(java.util.function.BooleanSupplier cond, double seconds) {
    double end = Clock.now() + seconds;
    while (!cond.getAsBoolean() && Clock.now() < end) {
      Engine.sleep(0.005);
    }
  }

  @Test
  void theEngineFiresLostWhenAReplyEndsALocksGroupLease() {
    List<String> reported = Collections.synchronizedList(new ArrayList<>());
    Engine core = engine(0, reported);
    try {
      double sent = Clock.now();
      Hold h1 = core.holdForTest("one", 7, sent, 2, 4);
      Hold h2 = core.holdForTest("two", 8, sent, 3, 0);
      List<String> fired = Collections.synchronizedList(new ArrayList<>());
      h1.lease.watch(() -> fired.add("one"));
      h2.lease.watch(() -> fired.add("two"));
      assertEquals(2, h1.lease.group());
      assertEquals(3, h2.lease.group());
      core.renewedForTest(Clock.now(), reply(LeasesTest.notHere(2), LeasesTest.ext(3, 0)));
      assertEquals(List.of("one"), fired);
      assertTrue(h1.lease.isLost());
      assertFalse(h2.lease.isLost());
      assertTrue(h1.lease.why.contains("lock group 2"));
      assertNotNull(core.currentSession(), "the session goes on");
      waitFor(() -> reported.size() == 1, 2);
      assertEquals(List.of("one"), reported);
      assertEquals(1, core.leaseExpired.get());
      // A move in group 3: lock two now follows the session-wide deadline.
      double before = h2.lease.deadline();
      core.renewedForTest(Clock.now(), reply(LeasesTest.ext(2, 0), LeasesTest.ext(3, 1)));
      assertEquals(core.currentSession().lease.leases.deadlineAll(), h2.lease.deadline());
      assertTrue(h2.lease.deadline() >= before);
      assertFalse(h2.lease.isLost());
      // The session's end fires the rest, and counts only what was not reported yet.
      core.loseForTest("test");
      assertEquals(List.of("one", "two"), fired);
      assertEquals(2, core.leaseExpired.get());
      waitFor(() -> reported.size() == 2, 2);
      assertEquals(List.of("one", "two"), reported);
    } finally {
      core.close();
    }
  }

  @Test
  void theEngineEndsOneGroupsLocksOnAPushedSessionEnded() {
    List<String> reported = Collections.synchronizedList(new ArrayList<>());
    Engine core = engine(0, reported);
    try {
      double sent = Clock.now();
      Hold h1 = core.holdForTest("one", 7, sent, 1, 0);
      Hold h2 = core.holdForTest("two", 8, sent, 2, 0);
      List<String> fired = Collections.synchronizedList(new ArrayList<>());
      h1.lease.watch(() -> fired.add("one"));
      h2.lease.watch(() -> fired.add("two"));
      Engine.Sess s = core.currentSession();
      core.injectEvent(SessionEvent.newBuilder().setSessionEnded(SessionEnded.newBuilder()
          .setGroup(1).setReason("expired")).build());
      assertEquals(List.of("one"), fired);
      assertTrue(h1.lease.isLost());
      assertFalse(h2.lease.isLost());
      assertTrue(h1.lease.why.contains("lock group 1"));
      assertTrue(h1.lease.deadline() <= Clock.now());
      assertSame(s, core.currentSession(), "the session goes on");
      assertFalse(s.lease.isLost());
      waitFor(() -> reported.size() == 1, 2);
      assertEquals(List.of("one"), reported);
      assertEquals(1, core.leaseExpired.get());
      // A later grant in group 1 (the acquire adopted the session there again) holds.
      Hold h3 = core.holdForTest("three", 9, Clock.now(), 1, 0);
      assertFalse(h3.lease.isLost());
      assertTrue(h3.lease.deadline() > Clock.now() + 5);
      core.injectEvent(SessionEvent.newBuilder().setSessionEnded(SessionEnded.newBuilder()
          .setGroup(0).setReason("closed")).build());
      assertNull(core.currentSession());
      assertTrue(s.lease.lost);
      assertEquals(List.of("one", "two"), fired);
      assertTrue(h3.lease.isLost());
      assertEquals(1, core.leaseExpired.get(), "a close is no expiry");
    } finally {
      core.close();
    }
  }

  @Test
  void aKeepaliveRefusedWith503LosesNothingBut404LosesTheSession() {
    List<String> reported = Collections.synchronizedList(new ArrayList<>());
    Engine core = engine(0, reported);
    try {
      Hold h = core.holdForTest("one", 7, Clock.now(), 1, 0);
      Engine.Sess s = core.currentSession();
      core.pendingKeepaliveForTest(41, Clock.now());
      core.injectEvent(SessionEvent.newBuilder().setRequestId(41).setError(
          dev.lockd.v1.Error.newBuilder().setStatus(503).setCode("no_leader")
              .setMessage("group 1: no leader").setRetryAfterMs(100)).build());
      assertSame(s, core.currentSession());
      assertFalse(s.lease.isLost());
      assertFalse(h.lease.isLost());
      assertEquals(1, core.call(() -> s.keepaliveFailures));
      assertTrue(core.call(() -> s.nextKeepalive) < Clock.now() + 5);
      core.pendingKeepaliveForTest(42, Clock.now());
      core.injectEvent(SessionEvent.newBuilder().setRequestId(42).setError(
          dev.lockd.v1.Error.newBuilder().setStatus(404).setCode("session_not_found")
              .setMessage("gone")).build());
      assertNull(core.currentSession());
      assertTrue(s.lease.lost);
      assertTrue(h.lease.isLost());
    } finally {
      core.close();
    }
    core = engine(0, reported);
    try {
      Hold h = core.holdForTest("one", 7, Clock.now(), 1, 0);
      Engine.Sess s = core.currentSession();
      core.renewedForTest(Clock.now(), reply(LeasesTest.notHere(1), LeasesTest.notHere(2)));
      assertNull(core.currentSession());
      assertTrue(s.lease.lost);
      assertTrue(h.lease.isLost());
      assertTrue(s.lease.why.contains("no lease"));
    } finally {
      core.close();
    }
  }

  @Test
  void theEngineFiresLostAtEachLocksOwnDeadlineWhileTheSessionGoesOn() {
    // Opened 11.5 s ago: deadline_all (sent + 15 - 3) is 0.5 s away.
    List<String> reported = Collections.synchronizedList(new ArrayList<>());
    Engine core = engine(11.5, reported);
    try {
      Engine.Sess s = core.currentSession();
      GroupLeases leases = s.lease.leases;
      double sent = leases.deadlineAll() - 12.0;
      double t0 = sent + 11.5;
      core.renewedForTest(sent, reply(LeasesTest.ext(1), LeasesTest.ext(2, 5)));
      // Group 1 extended a keepalive sent 11 s before t0 (its deadline: t0 + 1) and could not
      // answer the next one, which group 2 extended (at move count 5).
      core.renewedForTest(t0 - 11.0, reply(LeasesTest.ext(1), LeasesTest.other(2)));
      core.renewedForTest(Clock.now(), reply(LeasesTest.other(1), LeasesTest.ext(2, 5)));
      Hold moved = core.holdForTest("moved", 7, Clock.now(), 2, 5);
      Hold one = core.holdForTest("one", 8, sent, 1, 0);
      Map<String, Double> fired = new java.util.concurrent.ConcurrentHashMap<>();
      moved.lease.watch(() -> fired.putIfAbsent("moved", Clock.now()));
      one.lease.watch(() -> fired.putIfAbsent("one", Clock.now()));
      assertTrue(moved.lease.deadline() > t0 + 11.0);
      assertEquals(t0 + 1.0, one.lease.deadline(), 1e-6);
      Engine.sleep(0.05); // the engine's timer now sleeps to t0 + 1
      assertTrue(fired.isEmpty());
      // Group 2 answers at a higher move count: `moved` follows deadline_all, nearer than the
      // timer's wake-up.
      core.renewedForTest(Clock.now(), reply(LeasesTest.other(1), LeasesTest.ext(2, 6)));
      assertEquals(t0 + 0.5, moved.lease.deadline(), 1e-6);
      assertEquals(leases.deadlineAll(), moved.lease.deadline());
      assertEquals(t0 + 1.0, one.lease.deadline(), 1e-6);
      assertTrue(s.lease.deadline() > t0 + 11.0, "the session lives on group 2's lease");
      waitFor(() -> fired.containsKey("one"), 3);
      assertEquals(Set.of("moved", "one"), fired.keySet());
      assertTrue(fired.get("moved") >= t0 + 0.5 && fired.get("moved") < t0 + 0.5 + 0.4,
          "moved fired at t0+" + (fired.get("moved") - t0));
      assertTrue(fired.get("one") >= t0 + 1.0 && fired.get("one") < t0 + 1.0 + 0.4,
          "one fired at t0+" + (fired.get("one") - t0));
      assertTrue(moved.lease.why.contains("session-wide"));
      assertTrue(one.lease.why.contains("lock group 1"));
      assertSame(s, core.currentSession());
      assertFalse(s.lease.isLost());
      waitFor(() -> reported.size() == 2, 2);
      List<String> r = new ArrayList<>(reported);
      r.sort(null);
      assertEquals(List.of("moved", "one"), r);
      assertEquals(2, core.leaseExpired.get());
      // Every group answers again: deadline_all restarts, neither lock comes back.
      core.renewedForTest(Clock.now(), reply(LeasesTest.ext(1), LeasesTest.ext(2, 6)));
      assertEquals(1, leases.allEpoch());
      assertTrue(leases.deadlineAll() > Clock.now() + 10);
      assertTrue(moved.lease.isLost());
      assertTrue(one.lease.isLost());
      assertTrue(moved.lease.deadline() <= t0 + 0.5);
      assertTrue(one.lease.deadline() <= t0 + 1.0);
      Hold nw = core.holdForTest("new", 9, Clock.now(), 2, 6);
      assertFalse(nw.lease.isLost());
      assertTrue(nw.lease.deadline() > Clock.now() + 10);
      assertEquals(2, core.leaseExpired.get());
    } finally {
      core.close();
    }
  }
}
