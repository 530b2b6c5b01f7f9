package dev.lockd.client;

import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Collection;
import java.util.List;
import java.util.Optional;
import java.util.TreeSet;
import java.util.concurrent.Executor;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.RejectedExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A connection to a lockd cluster carrying <b>one session</b> for the process, kept alive in the
 * background over one gRPC {@code Session} stream. Thread-safe: share one client per process.
 *
 * <pre>{@code
 * try (LockdClient client = LockdClient.builder("127.0.0.1:7170", "127.0.0.1:7171").build();
 *      Lock lk = client.lock("payouts/m-1", Duration.ofSeconds(10))) {
 *   write(batch, lk.token());                  // every write carries the fencing token
 * }
 * }</pre>
 *
 * <p>The endpoints are some of the cluster's gRPC addresses (HOST:PORT, or https://HOST:PORT);
 * the client moves to the next one when a node stops answering. The session opens on first use
 * (or with {@link #connect()}); {@link #close()} closes it, releasing every lock at once.
 */
public final class LockdClient implements AutoCloseable {
  /** A wait with no end (it queues again, round after round, past the service's 300 s cap). */
  public static final Duration FOREVER = Duration.ofSeconds(Long.MAX_VALUE);

  final Engine engine;
  final ScheduledExecutorService timer;
  private final ExecutorService callbackPool;
  /**
   * Where the application's code runs when a lock is lost ({@link Lock#lost()}'s dependents,
   * {@link Lock#onLost}): never the engine's loop or the lost timer, whose stalls would stop
   * keepalives or other locks' signals. Once the client is closed, on the calling thread.
   */
  final Executor callbacks;

  LockdClient(Options opts) {
    this.engine = new Engine(opts);
    this.timer = Executors.newSingleThreadScheduledExecutor(r -> {
      Thread t = new Thread(r, "lockd-client-lost-timer");
      t.setDaemon(true);
      return t;
    });
    AtomicInteger n = new AtomicInteger();
    this.callbackPool = Executors.newCachedThreadPool(r -> {
      Thread t = new Thread(r, "lockd-client-callback-" + n.incrementAndGet());
      t.setDaemon(true);
      return t;
    });
    this.callbacks = r -> {
      try {
        callbackPool.execute(r);
      } catch (RejectedExecutionException e) {
        r.run(); // closed: no keepalive left to hold up
      }
    };
  }

  /** A builder for a client of the nodes at {@code endpoints}. */
  public static Builder builder(String... endpoints) {
    return new Builder(Arrays.asList(endpoints));
  }

  /** A builder for a client of the nodes at {@code endpoints}. */
  public static Builder builder(Collection<String> endpoints) {
    return new Builder(new ArrayList<>(endpoints));
  }

  /** How a client behaves; the defaults suit most workers. */
  public static final class Builder {
    private final List<String> endpoints;
    private String clientName;
    private Duration ttl = Duration.ofSeconds(15);
    private Duration margin;
    private String namespace = "";
    private String token;
    private Duration requestTimeout = Duration.ofSeconds(2);
    private Duration connectTimeout = Duration.ofSeconds(5);
    private RetryPolicy retry = RetryPolicy.DEFAULT;
    private Path caFile;
    private Path certFile;
    private Path keyFile;
    private String tlsServerName;

    private Builder(List<String> endpoints) {
      this.endpoints = endpoints;
    }

    /** Names this process in the service's views and is the default owner of its locks (at most
     * 256 bytes). Default HOST/PID. */
    public Builder clientName(String name) {
      this.clientName = name;
      return this;
    }

    /** The session TTL to ask for (the namespace's bounds apply; default 5..=60 s). Default
     * 15 s. */
    public Builder ttl(Duration ttl) {
      this.ttl = ttl;
      return this;
    }

    /** How long before the lease's end a lock reports lost. Default TTL/5. */
    public Builder margin(Duration margin) {
      this.margin = margin;
      return this;
    }

    /** The namespace whose TTL bounds and token the session uses ("" = default). */
    public Builder namespace(String namespace) {
      this.namespace = namespace;
      return this;
    }

    /** The namespace's bearer token (or the admin token), sent as {@code authorization: Bearer}
     * metadata on every call and on the session stream. */
    public Builder token(String token) {
      this.token = token;
      return this;
    }

    /** How long one request may take before its node counts as unreachable. Default 2 s. */
    public Builder requestTimeout(Duration d) {
      this.requestTimeout = d;
      return this;
    }

    /** How long opening a session may take in all, every endpoint and retry included. Default
     * 5 s: a wrong endpoint or a cluster that is down fails fast. */
    public Builder connectTimeout(Duration d) {
      this.connectTimeout = d;
      return this;
    }

    /** Backoff for retryable errors. Default {@link RetryPolicy#DEFAULT}. */
    public Builder retry(RetryPolicy retry) {
      this.retry = retry;
      return this;
    }

    /** Speak TLS to the nodes, trusting this CA (PEM); {@code lockd dev --tls} prints its path.
     * An https:// endpoint without it trusts the system's roots. */
    public Builder caFile(Path caFile) {
      this.caFile = caFile;
      return this;
    }

    /** A client certificate and its PKCS#8 key (PEM), for clusters that require one. */
    public Builder clientCertificate(Path certFile, Path keyFile) {
      this.certFile = certFile;
      this.keyFile = keyFile;
      return this;
    }

    /** The name the nodes' certificates carry, when the endpoints' hosts are not it. */
    public Builder tlsServerName(String name) {
      this.tlsServerName = name;
      return this;
    }

    /** The client; nothing is sent until the first call. Bad settings throw {@link
     * InvalidArgumentException} here. */
    public LockdClient build() {
      return new LockdClient(new Options(endpoints, clientName, seconds(ttl, "ttl"),
          margin == null ? null : seconds(margin, "margin"), namespace, token,
          seconds(requestTimeout, "requestTimeout"), seconds(connectTimeout, "connectTimeout"),
          retry, caFile, certFile, keyFile, tlsServerName));
    }
  }

  static double seconds(Duration d, String what) {
    if (d == null) {
      throw new InvalidArgumentException(what + " must be given (got null)");
    }
    if (d.getSeconds() >= 100L * 365 * 86400) {
      return Double.POSITIVE_INFINITY;
    }
    return d.getSeconds() + d.getNano() / 1e9;
  }

  /** Opens the session now (otherwise the first acquire does). */
  public LockdClient connect() {
    engine.ensureSession();
    return this;
  }

  /** A lock request on {@code name}: set its mode, wait and owner, then {@link
   * LockRequest#acquire()}. */
  public LockRequest newLock(String name) {
    return new LockRequest(this, name);
  }

  /** Takes {@code name} exclusively if it is free now (a try-lock): {@link
   * NotAcquiredException} names the holder otherwise. */
  public Lock tryLock(String name) {
    return newLock(name).acquire();
  }

  /** Takes {@code name} exclusively, waiting in its FIFO queue up to {@code wait} ({@link
   * #FOREVER}: no end); {@link NotAcquiredException} when the wait ends first. */
  public Lock lock(String name, Duration wait) {
    return newLock(name).waitFor(wait).acquire();
  }

  Lock acquire(String name, Double wait, Mode mode, Integer limit, String owner,
      boolean reentrant) {
    Hold h = engine.acquire(name, wait, mode, limit, owner, reentrant);
    return new Lock(this, h);
  }

  /**
   * Takes every name in sorted order (duplicates once) within <b>one</b> overall deadline {@code
   * wait} (null or zero: try each once). Processes that take overlapping sets this way cannot
   * deadlock. On failure the names already taken are released and the error thrown.
   */
  public LockSet acquireAll(Collection<String> names, Duration wait) {
    return acquireAll(names, wait, Mode.EXCLUSIVE, null, null);
  }

  /** {@link #acquireAll(Collection, Duration)} in another mode, or with another owner. */
  public LockSet acquireAll(Collection<String> names, Duration wait, Mode mode, Integer limit,
      String owner) {
    if (wait != null && wait.isNegative()) {
      throw new InvalidArgumentException("wait must be >= 0 seconds, or none for a try-lock (got "
          + wait + ")");
    }
    List<String> ordered = new ArrayList<>(new TreeSet<>(names));
    Double until = wait == null || wait.isZero() ? null : Clock.now() + seconds(wait, "wait");
    List<Lock> locks = new ArrayList<>();
    try {
      for (String name : ordered) {
        Double left = until == null ? null : Math.max(until - Clock.now(), 0.0);
        locks.add(acquire(name, left, mode, limit, owner, false));
      }
    } catch (RuntimeException | Error e) {
      for (int i = locks.size() - 1; i >= 0; i--) {
        try {
          locks.get(i).release();
        } catch (LockdException ignored) {
          // the first failure is what the caller needs
        }
      }
      throw e;
    }
    return new LockSet(locks);
  }

  /** A linearizable view of {@code name}: holders, tokens, queue (no session needed). */
  public LockState inspect(String name) {
    return LockState.fromProto(engine.inspect(name));
  }

  /** What {@link #checkToken} answers. */
  public record TokenCheck(boolean valid, long newestToken) {}

  /**
   * Whether {@code token} is a current holder's fencing token of {@code name} (Chubby's
   * CheckSequencer), as a linearizable read; {@code newestToken} is the largest token among the
   * current holders (0 when free).
   */
  public TokenCheck checkToken(String name, long token) {
    dev.lockd.v1.CheckTokenResponse r = engine.checkToken(name, token);
    return new TokenCheck(r.getValid(), r.getNewestToken());
  }

  /**
   * Tells the service that a fenced resource refused a write under {@code name} because a newer
   * holder's token had reached it; counted per namespace as {@code
   * lockd_fencing_rejections_total}. Best effort: a failure to report is logged. {@link
   * Fencing#write} does it for its own refusals when given the client.
   */
  public void reportFencingRejected(String name) {
    engine.reportFencingRejected(name);
  }

  /** The status of the node the client talks to: its groups, leaders, terms. */
  public NodeStatus status() {
    return NodeStatus.fromProto(engine.status());
  }

  /** The status of {@code endpoint} exactly (no failover, no retry). */
  public NodeStatus statusOf(String endpoint) {
    int i = engine.endpoints.indexOf(endpoint);
    if (i < 0) {
      throw new InvalidArgumentException("'" + endpoint + "' is not one of this client's "
          + "endpoints " + engine.endpoints);
    }
    return NodeStatus.fromProto(engine.statusOf(i));
  }

  /** This client's session's holds and waits in every group. */
  public SessionDetail getSession() {
    String sid = engine.sessionId();
    if (sid == null) {
      throw new SessionLostException("the client has no open session");
    }
    return getSession(sid);
  }

  /** A session's holds and waits in every group. */
  public SessionDetail getSession(String sessionId) {
    return SessionDetail.fromProto(engine.getSession(sessionId));
  }

  /** The current session's id, if one is open and not lost. */
  public Optional<String> sessionId() {
    return Optional.ofNullable(engine.sessionId());
  }

  /** The endpoint the session stream uses now (or the next one tried). */
  public String endpoint() {
    return engine.endpoint();
  }

  /** How many times a lease ran out while the application still held a lock. */
  public int leaseExpiredCount() {
    return engine.leaseExpired.get();
  }

  /** How many times a group's new leader extended this client's lease and said so. */
  public int leaseExtendedCount() {
    return engine.leaseExtended.get();
  }

  /**
   * Every change of {@code name} as it happens; survives a node that stops and resumes where it
   * was, with no change missed or repeated; needs no session.
   */
  public Watch watch(String name) {
    return new Watch(engine, name, "");
  }

  /** Every change of every name that starts with {@code prefix}, as {@link #watch}. */
  public Watch watchPrefix(String prefix) {
    return new Watch(engine, "", prefix);
  }

  /** An election on {@code name} (e.g. "leaders/partition-9"). */
  public Election election(String name) {
    Names.checkName(name);
    return new Election(this, name);
  }

  /** A mutex on {@code name} in the shape of Curator's InterProcessMutex. */
  public LockdMutex mutex(String name) {
    Names.checkName(name);
    return new LockdMutex(this, name);
  }

  /** A leader latch on {@code name} in the shape of Curator's LeaderLatch; {@code id} is this
   * participant's campaign value. */
  public LeaderLatch leaderLatch(String name, String id) {
    Names.checkName(name);
    return new LeaderLatch(this, name, id);
  }

  /** The client's name (the default owner of its locks). */
  public String clientName() {
    return engine.opts.clientName;
  }

  /**
   * Closes the session (every lock it holds is released at once and reports lost), then the
   * connections and the client's threads. Idempotent.
   */
  @Override
  public void close() {
    try {
      engine.close();
    } finally {
      timer.shutdownNow();
      // Not shutdownNow: the lost signals the close itself fired must still reach their callers.
      callbackPool.shutdown();
    }
  }
}
