package dev.lockd.client;

import dev.lockd.v1.AcquireRequest;
import dev.lockd.v1.AcquireResponse;
import dev.lockd.v1.CheckTokenRequest;
import dev.lockd.v1.CheckTokenResponse;
import dev.lockd.v1.CloseSessionRequest;
import dev.lockd.v1.GetSessionRequest;
import dev.lockd.v1.GroupLease;
import dev.lockd.v1.InspectRequest;
import dev.lockd.v1.KeepAliveRequest;
import dev.lockd.v1.KeepAliveResponse;
import dev.lockd.v1.LockGrpc;
import dev.lockd.v1.OpenSessionRequest;
import dev.lockd.v1.OpenSessionResponse;
import dev.lockd.v1.Queued;
import dev.lockd.v1.ReleaseRequest;
import dev.lockd.v1.ReportFencingRejectedRequest;
import dev.lockd.v1.ReportLeaseExpiredRequest;
import dev.lockd.v1.SessionEnded;
import dev.lockd.v1.SessionEvent;
import dev.lockd.v1.SessionRequest;
import dev.lockd.v1.StatusRequest;
import dev.lockd.v1.StatusResponse;
import io.grpc.ChannelCredentials;
import io.grpc.ClientInterceptor;
import io.grpc.Grpc;
import io.grpc.InsecureChannelCredentials;
import io.grpc.ManagedChannel;
import io.grpc.ManagedChannelBuilder;
import io.grpc.Metadata;
import io.grpc.StatusRuntimeException;
import io.grpc.TlsChannelCredentials;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import io.grpc.stub.MetadataUtils;
import java.io.IOException;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Callable;
import java.util.concurrent.CancellationException;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.ThreadFactory;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.concurrent.locks.ReentrantLock;
import java.util.function.Function;
import java.util.logging.Level;
import java.util.logging.Logger;

/**
 * The engine: one session per client over one {@code Session} stream (the Python client's {@code
 * _core.py}, itself lockd-client's {@code session.rs}).
 *
 * <p>It opens the session, sends a keepalive every TTL/3 and keeps the <b>local lease
 * deadlines</b>: send time of the last acknowledged open/attach/keepalive + TTL - margin on the
 * monotonic clock, one per lock group and one session-wide ({@link GroupLeases}); moves the stream
 * to the next endpoint and attaches the same session when the stream breaks or a keepalive goes
 * unanswered for a whole interval; matches pushed grants to waiting acquires; marks a lock lost
 * when its own deadline passes or its group's lease ended, and the session lost when every
 * deadline it has passed or the service says it is gone.
 *
 * <p>Threads: every field marked "loop" belongs to one thread, the engine's loop ({@link #loop});
 * the caller's threads block in their own calls and hand work to the loop. Unary calls (retries,
 * reports, give-backs) never run on the loop: they run on the caller's thread or on {@link
 * #background}. No application code runs on the loop either (a lock's lost signal reaches the
 * application through {@link LockdClient#callbacks}), and acquire/release refuse to run there.
 */
final class Engine {
  static final Logger LOG = Logger.getLogger("dev.lockd.client");

  /** The longest wait the service accepts for one acquire (wait_ms <= 300 000). A longer wait
   * queues again, round after round, up to the caller's deadline. Lowered by tests only. */
  static volatile double maxWait = 300.0;
  /** How long past its wait an adopted wait's acquire waits for a push before it gives up. */
  static final double ADOPTED_SLACK = 2.0;

  final Options opts;
  final List<String> endpoints;
  private final List<String> targets;
  private final boolean tls;
  private final ChannelCredentials credentials;
  private final ManagedChannel[] channels;
  private final ClientInterceptor auth;
  final Metadata authHeaders;

  final ScheduledExecutorService loop;
  private final Thread loopThread;
  final ExecutorService background;
  private final AtomicInteger preferred = new AtomicInteger();
  private final AtomicLong rid = new AtomicLong();
  private final ReentrantLock openLock = new ReentrantLock();
  volatile boolean closed;
  private volatile boolean closing;

  // ----- loop state -----
  private volatile Sess sess;
  private volatile Conn conn;
  private int gen;
  private final Map<Long, Pending> pending = new LinkedHashMap<>();
  private final Pushes<Acq> pushes = new Pushes<>();
  private List<String> unsure = new ArrayList<>();
  private int settling;
  private CompletableFuture<Void> settled = CompletableFuture.completedFuture(null);
  private long nextHold = 1;
  /** Holds the application keeps (hold id -> hold). A grant is registered before its acquire is
   * answered, so that no give-back takes it for an orphan meanwhile. */
  final Map<Long, Hold> held = new LinkedHashMap<>();
  private ScheduledFuture<?> tickTask;
  private final AtomicBoolean tickQueued = new AtomicBoolean();

  final AtomicInteger leaseExpired = new AtomicInteger();
  final AtomicInteger leaseExtended = new AtomicInteger();
  volatile long[] leaseExtension;
  volatile Leases.Lease lease;
  /** Tests: a session opened by a synthetic answer, with no stream to reconnect. */
  volatile boolean synthetic;
  /** Tests: where lease-expired reports go instead of the service. */
  volatile java.util.function.Consumer<List<String>> reportHook;
  /** Tests: answers a unary Release where the stub would (it may throw what the stub throws). */
  volatile Function<ReleaseRequest, Integer> releaseHook;
  /** Tests: run at the start of each tick. */
  volatile Runnable tickHook;
  /** Tests: the safety-net bound of an acquire's wait for its answer, in seconds (null: the
   * computed one). */
  static volatile Double acquireBoundForTest;

  /** A waiting or unanswered acquire. */
  static final class Acq {
    final String name;
    final String owner;
    final Mode mode;
    final CompletableFuture<Hold> fut = new CompletableFuture<>();
    /** When the acquire was sent (a group the client has no lease for counts from it). */
    double sent;
    /** When its wait ends on the service (send time + wait). */
    final double waitUntil;

    Acq(String name, String owner, Mode mode, double sent, double waitUntil) {
      this.name = name;
      this.owner = owner;
      this.mode = mode;
      this.sent = sent;
      this.waitUntil = waitUntil;
    }
  }

  private enum Kind { KEEPALIVE, ACQUIRE, RELEASE }

  private static final class Pending {
    final Kind kind;
    final double sent;
    final boolean named;
    final Acq acq;
    final CompletableFuture<Integer> fut;

    Pending(Kind kind, double sent, boolean named, Acq acq, CompletableFuture<Integer> fut) {
      this.kind = kind;
      this.sent = sent;
      this.named = named;
      this.acq = acq;
      this.fut = fut;
    }
  }

  /** A release on the stream whose answer the broken stream took with it: it may have landed. */
  static final class UnsureException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    UnsureException() {
      super("the stream broke before the release was answered", null, false, false);
    }
  }

  /** One session stream to one endpoint. */
  final class Conn implements ClientResponseObserver<SessionRequest, SessionEvent> {
    final int endpoint;
    final long firstRid;
    final CompletableFuture<SessionEvent> first = new CompletableFuture<>();
    volatile boolean firstDone;
    ClientCallStreamObserver<SessionRequest> req;
    /** The stream's initial metadata, once it came (a refusal's code may ride there). */
    final AtomicReference<Metadata> headers = new AtomicReference<>();
    final AtomicReference<Metadata> trailers = new AtomicReference<>();
    // loop:
    boolean live;
    final List<SessionEvent> buffered = new ArrayList<>();
    String endedWhy;

    Conn(int endpoint, long firstRid) {
      this.endpoint = endpoint;
      this.firstRid = firstRid;
    }

    @Override
    public void beforeStart(ClientCallStreamObserver<SessionRequest> r) {
      this.req = r;
    }

    @Override
    public void onNext(SessionEvent ev) {
      if (!firstDone) {
        if (ev.getRequestId() == firstRid) {
          firstDone = true;
          first.complete(ev);
        }
        return;
      }
      execute(() -> deliver(this, ev));
    }

    @Override
    public void onError(Throwable t) {
      if (!firstDone) {
        firstDone = true;
        first.completeExceptionally(rpcError(t, endpoint, headers.get()));
        return;
      }
      String why = "session stream failed: " + Errors.fromGrpc(t, headers.get(),
          endpoints.get(endpoint), tls, false, false).getMessage();
      execute(() -> ended(this, why));
    }

    @Override
    public void onCompleted() {
      if (!firstDone) {
        firstDone = true;
        first.completeExceptionally(new UnavailableException(
            endpoints.get(endpoint) + " closed the session stream"));
        return;
      }
      execute(() -> ended(this, "the node ended the session stream"));
    }

    void send(SessionRequest r) {
      try {
        req.onNext(r);
      } catch (RuntimeException e) { // a call cancelled meanwhile: its end is on its way
        LOG.log(Level.FINE, "lockd: send on a closed session stream", e);
      }
    }

    void close() {
      try {
        if (req != null) {
          req.cancel("the client moved on", null);
        }
      } catch (RuntimeException ignored) {
        // already closed
      }
    }
  }

  /** The session as the loop keeps it. */
  static final class Sess {
    final String id;
    final int gen;
    final double ttl;
    final double every;
    final Leases.Lease lease;
    double nextKeepalive;
    double reconnectAt;
    int reconnectAttempt;
    int keepaliveFailures;
    boolean reconnecting;
    /** When a hold of the session may next be lost (its deadline as last computed), and the
     * GroupLeases.changes that computation saw. */
    double checkDue;
    long checkedChanges = -1;

    Sess(String id, int gen, double ttl, double every, Leases.Lease lease, double nextKeepalive,
        double reconnectAt) {
      this.id = id;
      this.gen = gen;
      this.ttl = ttl;
      this.every = every;
      this.lease = lease;
      this.nextKeepalive = nextKeepalive;
      this.reconnectAt = reconnectAt;
    }
  }

  private record Handshake(Conn conn, SessionEvent ev, double sent) {}

  Engine(Options opts) {
    this.opts = opts;
    this.endpoints = opts.endpoints;
    this.targets = endpoints.stream()
        .map(e -> e.contains("://") ? e.substring(e.indexOf("://") + 3) : e).toList();
    this.tls = opts.tls();
    this.credentials = tls ? tlsCredentials(opts) : InsecureChannelCredentials.create();
    this.channels = new ManagedChannel[endpoints.size()];
    if (opts.token != null) {
      Metadata md = new Metadata();
      md.put(Metadata.Key.of("authorization", Metadata.ASCII_STRING_MARSHALLER),
          "Bearer " + opts.token);
      this.authHeaders = md;
      this.auth = MetadataUtils.newAttachHeadersInterceptor(md);
    } else {
      this.authHeaders = null;
      this.auth = null;
    }
    Thread[] t = new Thread[1];
    ThreadFactory tf = r -> {
      Thread th = new Thread(r, "lockd-client");
      th.setDaemon(true);
      t[0] = th;
      return th;
    };
    ScheduledExecutorService l = Executors.newSingleThreadScheduledExecutor(tf);
    try {
      l.submit(() -> null).get();
    } catch (InterruptedException | ExecutionException e) {
      throw new IllegalStateException(e);
    }
    this.loop = l;
    this.loopThread = t[0];
    AtomicInteger n = new AtomicInteger();
    this.background = Executors.newCachedThreadPool(r -> {
      Thread th = new Thread(r, "lockd-client-bg-" + n.incrementAndGet());
      th.setDaemon(true);
      return th;
    });
  }

  private static ChannelCredentials tlsCredentials(Options o) {
    TlsChannelCredentials.Builder b = TlsChannelCredentials.newBuilder();
    try {
      if (o.caFile != null) {
        b.trustManager(o.caFile.toFile());
      }
      if (o.certFile != null) {
        b.keyManager(o.certFile.toFile(), o.keyFile.toFile());
      }
    } catch (IOException | RuntimeException e) {
      throw new InvalidArgumentException("the TLS files cannot be read (caFile=" + o.caFile
          + ", certFile=" + o.certFile + ", keyFile=" + o.keyFile + "): " + e.getMessage());
    }
    return b.build();
  }

  // ----- plumbing ------------------------------------------------------------------------------

  ManagedChannel channel(int i) {
    synchronized (channels) {
      ManagedChannel ch = channels[i];
      if (ch == null) {
        ManagedChannelBuilder<?> b = Grpc.newChannelBuilder(targets.get(i), credentials)
            .disableRetry();
        if (opts.tlsServerName != null) {
          b.overrideAuthority(opts.tlsServerName);
        }
        if (auth != null) {
          b.intercept(auth);
        }
        ch = b.build();
        channels[i] = ch;
      }
      return ch;
    }
  }

  LockGrpc.LockBlockingStub blocking(int i, double timeout) {
    return LockGrpc.newBlockingStub(channel(i))
        .withDeadlineAfter(Math.max(1_000_000L, (long) (timeout * 1e9)), TimeUnit.NANOSECONDS);
  }

  LockGrpc.LockStub async(int i) {
    return LockGrpc.newStub(channel(i));
  }

  boolean tls() {
    return tls;
  }

  /** A failed call to endpoint {@code i} as a typed error, with a hint for the TLS mistakes
   * this client's own settings make likely. */
  LockdException rpcError(Throwable t, int i) {
    return rpcError(t, i, null);
  }

  /** {@link #rpcError(Throwable, int)} of a call whose initial metadata was {@code headers}. */
  LockdException rpcError(Throwable t, int i, Metadata headers) {
    return Errors.fromGrpc(t, headers, endpoints.get(i), tls, tls && opts.certFile == null, true);
  }

  /** {@code stub} recording the call's initial metadata in {@code headers}. */
  static <S extends io.grpc.stub.AbstractStub<S>> S capturing(S stub,
      AtomicReference<Metadata> headers) {
    return stub.withInterceptors(MetadataUtils.newCaptureMetadataInterceptor(headers,
        new AtomicReference<>()));
  }

  int preferred() {
    return Math.floorMod(preferred.get(), endpoints.size());
  }

  /** Moves on to the next endpoint after {@code failed} did not answer. */
  void rotate(int failed) {
    preferred.compareAndSet(failed, (failed + 1) % endpoints.size());
  }

  double margin(double ttl) {
    return opts.margin != null ? opts.margin : ttl / 5;
  }

  private long nextRid() {
    return rid.incrementAndGet();
  }

  boolean onLoop() {
    return Thread.currentThread() == loopThread;
  }

  /** Runs {@code r} on the loop (dropped once the client is shut down). */
  void execute(Runnable r) {
    try {
      loop.execute(() -> {
        try {
          r.run();
        } catch (RuntimeException e) {
          LOG.log(Level.WARNING, "lockd: engine task failed", e);
        }
      });
    } catch (java.util.concurrent.RejectedExecutionException ignored) {
      // shut down
    }
  }

  /** Runs {@code c} on the loop and waits for it (at once when already there). */
  <T> T call(Callable<T> c) {
    if (onLoop()) {
      try {
        return c.call();
      } catch (RuntimeException e) {
        throw e;
      } catch (Exception e) {
        throw new IllegalStateException(e);
      }
    }
    java.util.concurrent.Future<T> f;
    try {
      f = loop.submit(c);
    } catch (java.util.concurrent.RejectedExecutionException e) {
      throw new ClientClosedException("the client is closed");
    }
    // Uninterruptible: the loop's tasks are short, and a task that sent a request must have its
    // result taken (an acquire left unclaimed would leak its grant). The interrupt is kept.
    boolean interrupted = false;
    try {
      while (true) {
        try {
          return f.get(100, TimeUnit.MILLISECONDS);
        } catch (TimeoutException e) {
          if (loop.isShutdown() && !f.isDone()) {
            throw new ClientClosedException("the client is closed");
          }
        } catch (InterruptedException e) {
          interrupted = true;
        } catch (CancellationException e) {
          throw new ClientClosedException("the client is closed");
        } catch (ExecutionException e) {
          Throwable cause = e.getCause();
          if (cause instanceof RuntimeException) {
            throw (RuntimeException) cause;
          }
          throw new IllegalStateException(cause);
        }
      }
    } finally {
      if (interrupted) {
        Thread.currentThread().interrupt();
      }
    }
  }

  /** {@link #call} bounded by {@code seconds}: TimeoutException when the loop does not run it in
   * time (a stuck loop). Uninterruptible as {@link #call}. */
  <T> T callWithin(Callable<T> c, double seconds) throws TimeoutException {
    if (onLoop()) {
      return call(c);
    }
    java.util.concurrent.Future<T> f;
    try {
      f = loop.submit(c);
    } catch (java.util.concurrent.RejectedExecutionException e) {
      throw new ClientClosedException("the client is closed");
    }
    long end = System.nanoTime() + (long) (seconds * 1e9);
    boolean interrupted = false;
    try {
      while (true) {
        try {
          return f.get(Math.max(0, end - System.nanoTime()), TimeUnit.NANOSECONDS);
        } catch (TimeoutException e) {
          f.cancel(true);
          throw e;
        } catch (InterruptedException e) {
          interrupted = true;
        } catch (CancellationException e) {
          throw new ClientClosedException("the client is closed");
        } catch (ExecutionException e) {
          Throwable cause = e.getCause();
          if (cause instanceof RuntimeException) {
            throw (RuntimeException) cause;
          }
          throw new IllegalStateException(cause);
        }
      }
    } finally {
      if (interrupted) {
        Thread.currentThread().interrupt();
      }
    }
  }

  void spawn(Runnable r) {
    try {
      background.execute(() -> {
        try {
          r.run();
        } catch (RuntimeException e) {
          LOG.log(Level.FINE, "lockd: background task failed", e);
        }
      });
    } catch (java.util.concurrent.RejectedExecutionException ignored) {
      // shut down
    }
  }

  static void sleep(double seconds) {
    if (seconds <= 0) {
      return;
    }
    try {
      Thread.sleep((long) (seconds * 1000), (int) ((seconds * 1e9) % 1_000_000));
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new ClientClosedException("interrupted");
    }
  }

  /**
   * A unary call on the preferred node, retried with backoff on retryable errors (moving to the
   * next node when one does not answer). Adds true to {@code landed} when an attempt failed in a
   * way that may have reached the service. Stops at {@code until} (seconds on {@link Clock};
   * infinity for none).
   */
  <R> R unary(Function<LockGrpc.LockBlockingStub, R> call, double timeout, List<Boolean> landed,
      int attempts, double until) {
    RetryPolicy policy = opts.retry;
    int max = attempts > 0 ? attempts : policy.maxAttempts();
    int attempt = 0;
    double t = timeout > 0 ? timeout : opts.requestTimeout;
    while (true) {
      if (closed) {
        throw new ClientClosedException("the client is closed");
      }
      int i = preferred();
      LockdException err;
      double left = until - Clock.now();
      if (left <= 0) {
        throw new UnavailableException("no answer before the call's deadline");
      }
      AtomicReference<Metadata> headers = new AtomicReference<>();
      try {
        return call.apply(capturing(blocking(i, Math.min(t, left)), headers));
      } catch (StatusRuntimeException e) {
        err = rpcError(e, i, headers.get());
      }
      if (err instanceof UnavailableException && err.rawStatus() == 0) {
        rotate(i);
        if (landed != null) {
          landed.add(true);
        }
      }
      if (err.rawStatus() == 503 && landed != null) {
        // "No leader" is refused before proposing, but "outcome unknown" is also 503.
        landed.add(true);
      }
      attempt++;
      if (!err.isRetryable() || attempt >= max) {
        throw err;
      }
      double pause = policy.delay(attempt - 1, err);
      if (Clock.now() + pause >= until) {
        // No attempt fits before the deadline: the caller learns at the deadline, not before.
        sleep(until - Clock.now());
        throw err;
      }
      sleep(pause);
    }
  }

  <R> R unary(Function<LockGrpc.LockBlockingStub, R> call) {
    return unary(call, 0, null, 0, Double.POSITIVE_INFINITY);
  }

  // ----- the session ---------------------------------------------------------------------------

  /** The live session, opened (with retries) if there is none. Never on the loop. */
  Sess ensureSession() {
    if (closed || closing) {
      throw new ClientClosedException("the client is closed");
    }
    Sess s = sess;
    if (s != null) {
      return s;
    }
    openLock.lock();
    try {
      s = sess;
      if (s != null) {
        return s;
      }
      return open();
    } finally {
      openLock.unlock();
    }
  }

  private Sess open() {
    OpenSessionRequest openReq = OpenSessionRequest.newBuilder().setClient(opts.clientName)
        .setTtlMs((long) (opts.ttl * 1000)).setNamespace(opts.namespace).build();
    int attempt = 0;
    double giveUp = Clock.now() + opts.connectTimeout;
    while (true) {
      if (closed || closing) {
        throw new ClientClosedException("the client is closed");
      }
      int i = preferred();
      LockdException err;
      try {
        SessionRequest first = SessionRequest.newBuilder().setRequestId(nextRid())
            .setOpen(openReq).build();
        CompletableFuture<Handshake> hs = handshake(i, first, opts.requestTimeout);
        Handshake h;
        try {
          h = hs.get();
        } catch (InterruptedException e) {
          // The caller gave up: a session this handshake still opens is closed, not left open
          // on its stream until the service expires it.
          hs.thenAccept(this::discard);
          Thread.currentThread().interrupt();
          throw new ClientClosedException("interrupted while opening the session");
        } catch (ExecutionException e) {
          Throwable c = e.getCause();
          throw c instanceof RuntimeException ? (RuntimeException) c : new IllegalStateException(c);
        }
        if (!h.ev().hasOpened()) {
          h.conn().close();
          throw new UnavailableException("unexpected answer to open: " + h.ev().getKindCase());
        }
        OpenSessionResponse r = h.ev().getOpened();
        try {
          return call(() -> opened(r, h.sent(), h.conn()));
        } catch (ClientClosedException e) {
          discard(h); // closed meanwhile
          throw e;
        }
      } catch (LockdException e) {
        err = e;
      }
      if (err instanceof UnavailableException) {
        rotate(i);
      }
      attempt++;
      double pause = opts.retry.delay(attempt - 1, err);
      if (!err.isRetryable() || attempt >= opts.retry.maxAttempts()
          || Clock.now() + pause >= giveUp) {
        err.setExhausted(err.isRetryable());
        throw err;
      }
      sleep(pause);
    }
  }

  /** A handshake nobody takes any more: its stream is closed, and the session it opened too. */
  private void discard(Handshake h) {
    h.conn().close();
    if (h.ev().hasOpened()) {
      String id = h.ev().getOpened().getSessionId();
      Runnable closeIt = () -> {
        try {
          unary(st -> st.closeSession(CloseSessionRequest.newBuilder().setSessionId(id).build()),
              0, null, 2, Double.POSITIVE_INFINITY);
        } catch (LockdException e) {
          LOG.fine(() -> "lockd: could not close a session opened for nobody: " + e.getMessage());
        }
      };
      try {
        background.execute(closeIt);
      } catch (java.util.concurrent.RejectedExecutionException e) {
        Thread t = new Thread(closeIt, "lockd-client-discard");
        t.setDaemon(true);
        t.start();
      }
    }
  }

  /** loop: the open sent at {@code sent} was answered with {@code r} on {@code c}. */
  Sess opened(OpenSessionResponse r, double sent, Conn c) {
    gen++;
    double ttl = r.getTtlMs() / 1000.0;
    double every = Math.max(r.getKeepaliveEveryMs(), 1) / 1000.0;
    GroupLeases leases = new GroupLeases(sent, ttl, margin(ttl));
    leases.homed(r.getGroup(), sent, Clock.now());
    Leases.Lease l = new Leases.Lease(gen, r.getSessionId(), leases);
    Sess s = new Sess(r.getSessionId(), gen, ttl, every, l, sent + every, sent);
    sess = s;
    lease = l;
    if (c != null) {
      adopt(c);
    }
    poke();
    return s;
  }

  /** Opens a stream to endpoint {@code i} whose first message is {@code first}. */
  private CompletableFuture<Handshake> handshake(int i, SessionRequest first, double timeout) {
    Conn c = new Conn(i, first.getRequestId());
    double sent;
    try {
      async(i).withInterceptors(MetadataUtils.newCaptureMetadataInterceptor(c.headers,
          c.trailers)).session(c);
      sent = Clock.now();
      c.send(first);
    } catch (RuntimeException e) {
      c.close();
      return CompletableFuture.failedFuture(rpcError(e, i));
    }
    return c.first.orTimeout(Math.max(1, (long) (timeout * 1000)), TimeUnit.MILLISECONDS)
        .handle((ev, t) -> {
          if (t != null) {
            c.close();
            Throwable cause = t instanceof ExecutionException || t instanceof
                java.util.concurrent.CompletionException ? t.getCause() : t;
            if (cause instanceof TimeoutException) {
              throw new UnavailableException(endpoints.get(i) + " did not answer in "
                  + timeout + " s");
            }
            throw cause instanceof LockdException ? (LockdException) cause
                : rpcError(cause, i, c.headers.get());
          }
          if (ev.hasError()) {
            c.close();
            throw Errors.fromEvent(ev.getError());
          }
          return new Handshake(c, ev, sent);
        });
  }

  /** loop: {@code c} carries the session from now on. */
  private void adopt(Conn c) {
    conn = c;
    c.live = true;
    List<SessionEvent> evs = new ArrayList<>(c.buffered);
    c.buffered.clear();
    for (SessionEvent ev : evs) {
      if (conn != c) {
        return;
      }
      event(ev);
    }
    if (c.endedWhy != null && conn == c) {
      disconnected(c.endedWhy);
    }
  }

  /** loop: an event of {@code c} after its handshake. */
  private void deliver(Conn c, SessionEvent ev) {
    if (!c.live) {
      c.buffered.add(ev);
      return;
    }
    if (conn == c) {
      event(ev);
    }
  }

  /** loop: {@code c}'s stream ended after its handshake. */
  private void ended(Conn c, String why) {
    if (!c.live) {
      c.endedWhy = why;
      return;
    }
    if (conn == c) {
      disconnected(why);
    }
  }

  // ----- the loop's timer ------------------------------------------------------------------------

  /** Wakes the tick now (from any thread). */
  void poke() {
    if (tickQueued.compareAndSet(false, true)) {
      execute(this::runTick);
    }
  }

  private void schedule(double wake) {
    if (tickTask != null) {
      tickTask.cancel(false);
    }
    long nanos = Math.min(Clock.nanosUntil(wake), TimeUnit.HOURS.toNanos(1));
    try {
      tickTask = loop.schedule(this::runTick, nanos, TimeUnit.NANOSECONDS);
    } catch (java.util.concurrent.RejectedExecutionException ignored) {
      // shut down
    }
  }

  /** loop: {@link #tick}, which must never stop for good (keepalives and the lost checks live on
   * it): a failure is logged and the tick runs again shortly. */
  private void runTick() {
    try {
      tick();
    } catch (RuntimeException e) {
      tickQueued.set(false);
      LOG.log(Level.WARNING, "lockd: the engine's tick failed; it runs again in 100 ms", e);
      schedule(Clock.now() + 0.1);
    }
  }

  /** loop: keepalives, the local deadline and reconnects of the session, until it ends. */
  private void tick() {
    tickQueued.set(false);
    Runnable hook = tickHook;
    if (hook != null) {
      hook.run();
    }
    Sess s = sess;
    if (s == null || closed) {
      return;
    }
    for (int guard = 0; guard < 8; guard++) {
      double now = Clock.now();
      if (s.lease.leases.sessionExpired(now)) {
        lose("every local lease deadline passed without a renewal", true);
        return;
      }
      checkLocks(s, now);
      if (sess != s) {
        return;
      }
      double wake;
      if (conn != null) {
        if (now >= s.nextKeepalive) {
          keepalive();
          if (sess != s) {
            return;
          }
          continue;
        }
        wake = s.nextKeepalive;
      } else {
        if (!s.reconnecting && now >= s.reconnectAt && !synthetic) {
          reconnect(s);
          continue;
        }
        wake = s.reconnecting || synthetic ? Double.POSITIVE_INFINITY : s.reconnectAt;
      }
      wake = Math.min(wake, Math.min(s.lease.deadline(), s.checkDue));
      schedule(wake);
      return;
    }
    schedule(Clock.now() + 0.01);
  }

  /** loop: a renewal sent at {@code sent} ({@code named}: naming its groups) was answered. */
  private void renewedReply(double sent, KeepAliveResponse r, boolean named) {
    Sess s = sess;
    if (s == null) {
      return;
    }
    double now = Clock.now();
    GroupLeases.Outcome outcome = s.lease.leases.renewed(sent, r.getTtlMs(), r.getGroupsList(),
        now, named);
    if (outcome == GroupLeases.Outcome.TOO_LATE) {
      lose("every local lease deadline passed without a renewal", true);
      return;
    }
    if (outcome == GroupLeases.Outcome.GONE) {
      lose("every lock group said the session has no lease there", true);
      return;
    }
    for (GroupLease gl : r.getGroupsList()) {
      int st = gl.getStateValue();
      if (st != GroupLeases.EXTENDED && st != GroupLeases.NOT_HERE) {
        LOG.fine(() -> "lockd: lock group " + gl.getGroup() + " could not answer a keepalive: "
            + (gl.getError().isEmpty() ? "state " + st : gl.getError()));
      }
    }
    if (outcome == GroupLeases.Outcome.RESTARTED) {
      LOG.info("lockd: every lock group answered again after the session-wide deadline had "
          + "passed; the locks that followed it stay lost");
    }
    checkLocks(s, now);
  }

  /** loop: fires lost for the holds of {@code s} that are lost while the session goes on. */
  private void checkLocks(Sess s, double now) {
    GroupLeases leases = s.lease.leases;
    long changes = leases.changes();
    if (now < s.checkDue && changes == s.checkedChanges) {
      return;
    }
    s.checkedChanges = changes;
    poke();
    List<Hold> lost = new ArrayList<>();
    double due = Double.POSITIVE_INFINITY;
    for (Hold h : held.values()) {
      if (h.lease.session != s.lease || h.lease.lost) {
        continue;
      }
      double d = h.lease.deadline();
      if (now >= d) {
        lost.add(h);
      } else {
        due = Math.min(due, d);
      }
    }
    s.checkDue = due;
    if (lost.isEmpty()) {
      return;
    }
    List<String> names = new ArrayList<>();
    for (Hold h : lost) {
      String why = leases.whyLost(h.lease.hold);
      LOG.warning("lockd lock '" + h.name + "' of " + opts.clientName + " lost: " + why);
      h.lease.end(why);
      names.add(h.name);
    }
    leaseExpired.addAndGet(lost.size());
    spawn(() -> reportExpired(names));
  }

  void reportExpired(List<String> names) {
    java.util.function.Consumer<List<String>> hook = reportHook;
    if (hook != null) {
      hook.accept(names);
      return;
    }
    for (String name : names) {
      try {
        unary(st -> st.reportLeaseExpired(ReportLeaseExpiredRequest.newBuilder().setName(name)
            .build()), 0, null, 2, Double.POSITIVE_INFINITY);
      } catch (LockdException e) {
        LOG.fine(() -> "lockd: could not report an expired lease: " + e.getMessage());
      }
    }
  }

  /** loop: sends a keepalive, or breaks a stream whose last keepalive went unanswered. */
  private void keepalive() {
    Sess s = sess;
    Conn c = conn;
    if (s == null || c == null) {
      return;
    }
    double now = Clock.now();
    s.nextKeepalive = now + s.every;
    // An adopted wait whose outcome no node pushes: the caller decides again.
    for (Acq a : pushes.giveUpAdopters(a -> a.waitUntil + ADOPTED_SLACK <= now)) {
      fail(a, new UnavailableException("the wait for '" + a.name + "' queued before the session "
          + "stream broke was not answered on the new stream"));
    }
    // The previous keepalive went unanswered for a whole interval: the node is stuck or gone.
    for (Pending p : pending.values()) {
      if (p.kind == Kind.KEEPALIVE && now - p.sent >= s.every) {
        rotate(c.endpoint);
        disconnected("a keepalive went unanswered for a whole interval");
        return;
      }
    }
    List<Integer> groups = keepaliveGroups(s);
    long id = nextRid();
    pending.put(id, new Pending(Kind.KEEPALIVE, now, !groups.isEmpty(), null, null));
    c.send(SessionRequest.newBuilder().setRequestId(id).setKeepalive(
        KeepAliveRequest.newBuilder().setSessionId(s.id).addAllGroups(groups)).build());
  }

  private List<Integer> keepaliveGroups(Sess s) {
    List<HoldLease> holds = new ArrayList<>();
    for (Hold h : held.values()) {
      if (h.sessionId.equals(s.id)) {
        holds.add(h.lease.hold);
      }
    }
    boolean uns = !unsure.isEmpty() || pushes.hasStrays();
    return s.lease.leases.keepaliveGroups(holds, pushes.waitGroups(), uns, Clock.now());
  }

  /** loop: moves the session to the next node (attach), within the local deadline. */
  private void reconnect(Sess s) {
    s.reconnecting = true;
    int i = preferred();
    double left = s.lease.deadline() - Clock.now();
    SessionRequest first = SessionRequest.newBuilder().setRequestId(nextRid()).setAttach(s.id)
        .build();
    // An attach answered after the local deadline could not save the lease anyway.
    handshake(i, first, Math.max(0.001, Math.min(left, opts.requestTimeout)))
        .whenComplete((h, t) -> execute(() -> reconnected(s, i, h, t)));
  }

  private void reconnected(Sess s, int i, Handshake h, Throwable t) {
    s.reconnecting = false;
    if (t != null) {
      Throwable c = t instanceof java.util.concurrent.CompletionException ? t.getCause() : t;
      LockdException e = c instanceof LockdException ? (LockdException) c : rpcError(c, i);
      if (sess != s) {
        return;
      }
      if ("session_not_found".equals(e.code())) {
        lose("the service no longer knows the session", true);
        return;
      }
      LOG.fine(() -> "lockd: attach to " + endpoints.get(i) + " failed: " + e.getMessage());
      retryReconnect(s, i);
      poke();
      return;
    }
    if (sess != s) {
      h.conn().close();
      return;
    }
    if (!h.ev().hasKeepalive()) {
      h.conn().close();
      retryReconnect(s, i);
      poke();
      return;
    }
    LOG.fine(() -> "lockd: session stream moved to " + endpoints.get(i));
    s.reconnectAttempt = 0;
    adopt(h.conn());
    if (sess != s || conn != h.conn()) {
      return;
    }
    renewedReply(h.sent(), h.ev().getKeepalive(), false);
    s.nextKeepalive = h.sent() + s.every;
    poke();
    beginSettle(s);
  }

  private void retryReconnect(Sess s, int failed) {
    rotate(failed);
    s.reconnectAt = Clock.now() + opts.retry.delay(Math.min(s.reconnectAttempt, 4), 0);
    s.reconnectAttempt++;
  }

  /** loop: starts settling acquires whose answer the broken stream lost; acquires on the stream
   * wait until it ends. */
  private void beginSettle(Sess s) {
    if (settling == 0) {
      settled = new CompletableFuture<>();
    }
    settling++;
    spawn(() -> {
      try {
        settleUnsure(s);
      } finally {
        execute(() -> {
          settling--;
          if (settling == 0) {
            settled.complete(null);
          }
        });
      }
    });
  }

  /** background: a hold of ours that no lock object knows is given back, so the caller's retry
   * starts clean ({@link Pushes#settle}). */
  private void settleUnsure(Sess s) {
    List<String> names = call(() -> {
      List<String> u = unsure;
      unsure = new ArrayList<>();
      return u;
    });
    if (names.isEmpty()) {
      return;
    }
    double until = Clock.now() + s.every;
    try {
      dev.lockd.v1.SessionDetail detail = unary(st -> st.getSession(
          GetSessionRequest.newBuilder().setSessionId(s.id).build()), 0, null, 1, until);
      List<Pushes.Listed> listed = detail.getHeldList().stream()
          .map(h -> new Pushes.Listed(h.getName(), h.getFencingToken())).toList();
      Pushes.Settled st = call(() -> {
        Pushes.Settled r = Pushes.settle(names, listed,
            (n, t) -> held.values().stream().anyMatch(h -> h.name.equals(n) && h.token == t),
            n -> unanswered(n) || pushes.waiting(a -> a.name.equals(n)));
        if (!r.later().isEmpty() && sess == s) {
          unsure.addAll(r.later());
          loop.schedule(() -> {
            try {
              if (sess == s) {
                beginSettle(s);
              }
            } catch (RuntimeException e) {
              LOG.log(Level.WARNING, "lockd: engine task failed", e);
            }
          }, (long) (s.every * 1000), TimeUnit.MILLISECONDS);
        }
        return r;
      });
      for (Pushes.Listed l : st.giveBack()) {
        release(s.id, l.name(), l.token(), until);
      }
    } catch (LockdException e) {
      LOG.fine(() -> "lockd: could not settle unanswered acquires: " + e.getMessage());
    }
  }

  // ----- losing --------------------------------------------------------------------------------

  private static void fail(Acq a, LockdException e) {
    a.fut.completeExceptionally(e);
  }

  /** loop: the stream broke: fail what was in flight (its outcome is unknown), and reconnect. */
  private void disconnected(String why) {
    Conn c = conn;
    conn = null;
    if (c == null) {
      return;
    }
    LOG.fine(() -> "lockd: session stream to " + endpoints.get(c.endpoint) + " lost: " + why);
    c.close();
    rotate(c.endpoint);
    List<Pending> ps = new ArrayList<>(pending.values());
    pending.clear();
    for (Pending p : ps) {
      if (p.acq != null) {
        failUnsure(p.acq);
      } else if (p.fut != null) {
        p.fut.completeExceptionally(new UnsureException());
      }
    }
    for (Acq a : pushes.broke()) {
      failUnsure(a);
    }
    Sess s = sess;
    if (s != null) {
      s.reconnectAt = Clock.now();
      s.reconnectAttempt = 0;
    }
    poke();
  }

  private void failUnsure(Acq a) {
    Sess s = sess;
    if (s != null) {
      s.lease.leases.noteUnsure(a.sent);
    }
    unsure.add(a.name);
    pushes.stray(a.name, a.owner, a.sent);
    fail(a, new UnavailableException("the session stream broke before the acquire was answered"));
  }

  private void endLocally(Sess s, String why, java.util.function.Supplier<LockdException> err) {
    Conn c = conn;
    conn = null;
    if (c != null) {
      c.close();
    }
    s.lease.end(why);
    List<Pending> ps = new ArrayList<>(pending.values());
    pending.clear();
    for (Pending p : ps) {
      if (p.acq != null) {
        fail(p.acq, err.get());
      } else if (p.fut != null) {
        p.fut.completeExceptionally(new UnsureException()); // the session's end frees its holds
      }
    }
    for (Acq a : pushes.end()) {
      fail(a, err.get());
    }
    poke();
  }

  /** loop: the session is over for this client: every lock of it is lost. */
  void lose(String why, boolean report) {
    Sess s = sess;
    sess = null;
    if (s == null) {
      return;
    }
    // Not the session id: it is the session's capability, and logs travel.
    LOG.warning("lockd session of " + opts.clientName + " lost: " + why);
    List<String> names = new ArrayList<>();
    if (report) {
      for (Hold h : held.values()) {
        if (h.lease.session == s.lease && !h.lease.lost) {
          names.add(h.name);
        }
      }
    }
    endLocally(s, why, () -> new SessionLostException("the session ended: " + why));
    unsure.clear();
    leaseExpired.addAndGet(names.size());
    spawn(() -> {
      reportExpired(names);
      // The locks are lost; free them now rather than at the service's expiry.
      try {
        unary(st -> st.closeSession(CloseSessionRequest.newBuilder().setSessionId(s.id).build()),
            0, null, 2, Double.POSITIVE_INFINITY);
      } catch (LockdException ignored) {
        // best effort
      }
    });
  }

  // ----- requests ------------------------------------------------------------------------------

  /**
   * Takes {@code name}, waiting in its FIFO queue up to {@code wait} seconds (null = try once,
   * infinity = forever). Waits beyond the service's 300 s cap queue again, round after round, to
   * the caller's deadline. Retryable errors are retried within the wait (or, for a try-lock, up to
   * the retry policy's attempts); a session lost mid-wait is replaced.
   */
  Hold acquire(String name, Double wait, Mode mode, Integer limit, String owner,
      boolean reentrant) {
    if (onLoop()) {
      // Its answer could only be delivered by this very thread.
      throw new IllegalStateException("acquire on the lockd client's engine thread");
    }
    Names.checkName(name);
    int lim = Names.checkModeAndLimit(mode, limit);
    String own = owner != null ? owner : opts.clientName;
    Names.checkOwner(own);
    if (wait != null && (wait.isNaN() || wait < 0)) {
      throw new InvalidArgumentException(
          "wait must be >= 0 seconds, or none for a try-lock (got " + wait + ")");
    }
    Double until = wait == null ? null : Clock.now() + wait;
    RetryPolicy policy = opts.retry;
    int attempt = 0;
    while (true) {
      Double left = until == null ? null : Math.max(until - Clock.now(), 0.0);
      boolean capped = left != null && left > maxWait;
      long waitMs = left == null ? 0 : (long) (Math.min(left, maxWait) * 1000);
      AcquireRequest req = AcquireRequest.newBuilder().setName(name).setOwner(own)
          .setMode(mode.toProto()).setLimit(lim).setWaitMs(waitMs).setReentrant(reentrant)
          .build();
      double started = Clock.now();
      LockdException err;
      try {
        return acquireOnce(req, mode);
      } catch (NotAcquiredException e) {
        if (capped) {
          // One round of a longer wait ran out: queue again at the back (the service cannot
          // hold a waiter longer than its cap, so the FIFO place is not kept).
          if (Clock.now() - started < 1.0) {
            sleep(policy.delay(2, 0)); // never spin on a quick refusal
          }
          continue;
        }
        err = e;
      } catch (LockdException e) {
        // A try-lock does not retry a session open that already retried for connectTimeout; a
        // wait goes on trying until it ends.
        if (e.isExhausted() && until == null) {
          throw e;
        }
        err = e;
      }
      attempt++;
      boolean retry = err.isRetryable() || err instanceof SessionLostException;
      boolean timeLeft = until != null && Clock.now() < until;
      if (!retry || !(timeLeft || attempt < policy.maxAttempts())) {
        throw err;
      }
      double pause = policy.delay(attempt - 1, err);
      if (until != null && timeLeft) {
        pause = Math.min(pause, until - Clock.now());
      }
      sleep(pause);
    }
  }

  private Hold acquireOnce(AcquireRequest req, Mode mode) {
    Sess s = ensureSession();
    CompletableFuture<Void> settle = call(() -> settling > 0 ? settled : null);
    if (settle != null) {
      try {
        settle.get((long) (s.every * 2000) + 1000, TimeUnit.MILLISECONDS);
      } catch (TimeoutException | ExecutionException e) {
        // settling is best effort; the acquire goes on
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new ClientClosedException("interrupted");
      }
    }
    Acq acq = call(() -> {
      if (conn == null) {
        throw new UnavailableException("the session stream is reconnecting");
      }
      long id = nextRid();
      double sent = Clock.now();
      Acq a = new Acq(req.getName(), req.getOwner(), mode, sent, sent + req.getWaitMs() / 1000.0);
      pending.put(id, new Pending(Kind.ACQUIRE, sent, false, a, null));
      conn.send(SessionRequest.newBuilder().setRequestId(id).setAcquire(req).build());
      return a;
    });
    // Every path answers the future (a reply, a push, a broken stream, the session's end); the
    // bound is a safety net only.
    Double forTest = acquireBoundForTest;
    double bound = forTest != null ? forTest
        : req.getWaitMs() / 1000.0 + s.ttl + opts.requestTimeout + ADOPTED_SLACK;
    try {
      return acq.fut.get((long) (bound * 1000), TimeUnit.MILLISECONDS);
    } catch (ExecutionException e) {
      Throwable c = e.getCause();
      throw c instanceof RuntimeException ? (RuntimeException) c : new IllegalStateException(c);
    } catch (TimeoutException | InterruptedException | CancellationException e) {
      if (e instanceof InterruptedException) {
        Thread.currentThread().interrupt();
      }
      if (!acq.fut.cancel(false)) {
        Hold h = acq.fut.getNow(null);
        if (h != null) {
          // Granted as the caller gave up: nobody will hold it, so give it back.
          forget(h);
          spawn(() -> releaseQuietly(h.sessionId, h.name, h.token));
        }
      } else if (e instanceof TimeoutException) {
        execute(() -> unanswerable(acq));
      }
      if (e instanceof InterruptedException) {
        throw new ClientClosedException("interrupted while acquiring '" + req.getName() + "'");
      }
      throw new UnavailableException("no answer to the acquire of '" + req.getName() + "'");
    }
  }

  /**
   * loop: the caller of acquire {@code a} stopped waiting for an answer that every path should
   * have given long ago. Still unanswered on the stream: the stream carries requests it does not
   * answer, so it is treated as broken (each request on it is settled as after a break, this one
   * included: noted unsure, a stray whose queued wait a retry adopts, a grant given back). Queued
   * and never pushed an outcome: the same for this wait alone.
   */
  private void unanswerable(Acq a) {
    for (Pending p : pending.values()) {
      if (p.acq == a) {
        disconnected("the acquire of '" + a.name + "' went unanswered past its bound");
        return;
      }
    }
    if (pushes.forget(a)) {
      failUnsure(a);
      Sess s = sess;
      if (s != null) {
        beginSettle(s);
      }
    }
  }

  void releaseQuietly(String sessionId, String name, long token) {
    try {
      release(sessionId, name, token, Double.POSITIVE_INFINITY);
    } catch (LockdException e) {
      LOG.fine(() -> "lockd: background release of '" + name + "' failed: " + e.getMessage());
    }
  }

  private static boolean isDone(String code) {
    return "not_holder".equals(code) || "stale_token".equals(code)
        || "session_not_found".equals(code);
  }

  /** Inside {@link #release}: the calling thread was interrupted; the rest of the release goes
   * on in the background. */
  private static final class Interrupted extends RuntimeException {
    private static final long serialVersionUID = 1L;

    Interrupted() {
      super("interrupted", null, false, false);
    }
  }

  /**
   * Gives back one hold; returns the re-entries still held (0 = released). On the session stream
   * when it carries the hold's session, else (or when the stream's answer does not come in time)
   * by unary calls. A release whose earlier attempt may have landed counts a later {@code
   * not_holder}, {@code stale_token} or {@code session_not_found} as done.
   *
   * <p>A calling thread that is interrupted (before or during the call) does not leak the hold:
   * the release goes on in the background, and this throws {@link ClientClosedException} with
   * the thread's interrupt flag kept.
   */
  int release(String sessionId, String name, long token, double until) {
    if (onLoop()) {
      throw new IllegalStateException("release on the lockd client's engine thread");
    }
    ReleaseRequest req = ReleaseRequest.newBuilder().setSessionId(sessionId).setName(name)
        .setFencingToken(token).build();
    if (Thread.currentThread().isInterrupted()) {
      // grpc-java refuses a blocking call on an interrupted thread: all of it goes elsewhere.
      spawn(() -> {
        try {
          release(sessionId, name, token, until);
        } catch (LockdException e) {
          LOG.fine(() -> "lockd: background release of '" + name + "' failed: " + e);
        }
      });
      throw interrupted(name);
    }
    List<Boolean> landed = new ArrayList<>();
    CompletableFuture<Integer> f = call(() -> {
      Sess s = sess;
      if (conn != null && s != null && s.id.equals(sessionId)) {
        CompletableFuture<Integer> fut = new CompletableFuture<>();
        long id = nextRid();
        pending.put(id, new Pending(Kind.RELEASE, Clock.now(), false, null, fut));
        conn.send(SessionRequest.newBuilder().setRequestId(id).setRelease(req).build());
        return fut;
      }
      return null;
    });
    try {
      return finishRelease(req, f, landed, until);
    } catch (Interrupted e) {
      throw handOff(req, f, landed, until);
    }
  }

  /** The interrupted caller's release, finished by a background thread. */
  private ClientClosedException handOff(ReleaseRequest req, CompletableFuture<Integer> f,
      List<Boolean> landed, double until) {
    spawn(() -> {
      try {
        finishRelease(req, f, landed, until);
      } catch (Interrupted | LockdException e) {
        LOG.fine(() -> "lockd: background release of '" + req.getName() + "' failed: " + e);
      }
    });
    return interrupted(req.getName());
  }

  private static ClientClosedException interrupted(String name) {
    return new ClientClosedException("interrupted; the release of '" + name + "' goes on in the "
        + "background");
  }

  private static void pause(double seconds) {
    try {
      sleep(seconds);
    } catch (ClientClosedException e) {
      throw new Interrupted(); // sleep kept the flag
    }
  }

  /** {@link #release} from its request on the stream ({@code f}, or null: none), then by unary
   * calls; throws {@link Interrupted} when the thread is interrupted. */
  private int finishRelease(ReleaseRequest req, CompletableFuture<Integer> f,
      List<Boolean> landed, double until) {
    if (f != null) {
      double wait = Math.max(0.001, Math.min(opts.requestTimeout, until - Clock.now()));
      try {
        return f.get((long) (wait * 1000), TimeUnit.MILLISECONDS);
      } catch (TimeoutException e) {
        execute(() -> pending.values().removeIf(p -> p.fut == f));
        // The stream's node did not answer in time; the unary retry starts elsewhere.
        rotate(preferred());
        landed.add(true);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new Interrupted(); // the stream's answer is still awaited, in the background
      } catch (ExecutionException e) {
        Throwable c = e.getCause();
        if (c instanceof UnsureException) {
          landed.add(true);
        } else if (c instanceof LockdException) {
          LockdException le = (LockdException) c;
          if (!le.isRetryable()) {
            throw le;
          }
          if (le.rawStatus() == 503) {
            landed.add(true);
          }
          pause(opts.retry.delay(0, le));
        } else {
          throw new IllegalStateException(c);
        }
      }
    }
    try {
      return unary(st -> {
        Function<ReleaseRequest, Integer> hook = releaseHook;
        return hook != null ? hook.apply(req) : st.release(req).getRemaining();
      }, 0, landed, 0, until);
    } catch (LockdException e) {
      if (Thread.currentThread().isInterrupted() && !closed) {
        // grpc-java cancels a blocking call on an interrupted thread, and sleep gives up.
        landed.add(true);
        throw new Interrupted();
      }
      // The hold is gone and an earlier attempt may have ended it.
      if (!landed.isEmpty() && (e.rawStatus() == 404 || e.rawStatus() == 409)
          && isDone(e.code())) {
        return 0;
      }
      throw e;
    }
  }

  /** {@link #release} of {@code hold}, retried at most until its lease's local deadline (at least
   * one request timeout): past it the lock is lost anyway and the service frees it with the
   * session, so a cluster that died does not hold the caller any longer. */
  int releaseHold(Hold hold) {
    double budget = Math.max(hold.lease.deadline() - Clock.now(), opts.requestTimeout);
    double until = Clock.now() + budget;
    try {
      return release(hold.sessionId, hold.name, hold.token, until);
    } catch (UnavailableException e) {
      if (Clock.now() >= until - 0.01) {
        SessionLostException sl = new SessionLostException("the release of '" + hold.name
            + "' was not answered before its lease ended; the service frees it when the session "
            + "expires");
        sl.initCause(e);
        throw sl;
      }
      throw e;
    }
  }

  void forget(Hold hold) {
    if (onLoop()) {
      held.remove(hold.id);
    } else {
      execute(() -> held.remove(hold.id));
    }
  }

  dev.lockd.v1.LockState inspect(String name) {
    Names.checkName(name);
    return unary(st -> st.inspect(InspectRequest.newBuilder().setName(name).build()));
  }

  CheckTokenResponse checkToken(String name, long token) {
    Names.checkName(name);
    return unary(st -> st.checkToken(CheckTokenRequest.newBuilder().setName(name)
        .setFencingToken(token).build()));
  }

  void reportFencingRejected(String name) {
    Names.checkName(name);
    try {
      unary(st -> st.reportFencingRejected(ReportFencingRejectedRequest.newBuilder()
          .setName(name).build()), 0, null, 2, Double.POSITIVE_INFINITY);
    } catch (LockdException e) {
      LOG.fine(() -> "lockd: could not report a fencing rejection: " + e.getMessage());
    }
  }

  StatusResponse status() {
    return unary(st -> st.status(StatusRequest.getDefaultInstance()));
  }

  /** The status of endpoint {@code i} exactly (no failover, no retry). */
  StatusResponse statusOf(int i) {
    AtomicReference<Metadata> headers = new AtomicReference<>();
    try {
      return capturing(blocking(i, opts.requestTimeout), headers)
          .status(StatusRequest.getDefaultInstance());
    } catch (StatusRuntimeException e) {
      throw rpcError(e, i, headers.get());
    }
  }

  dev.lockd.v1.SessionDetail getSession(String sessionId) {
    return unary(st -> st.getSession(GetSessionRequest.newBuilder().setSessionId(sessionId)
        .build()));
  }

  String sessionId() {
    Sess s = sess;
    return s != null && !s.lease.isLost() ? s.id : null;
  }

  /** The endpoint the client currently prefers (the session stream's node). */
  String endpoint() {
    Conn c = conn;
    return endpoints.get(c != null ? c.endpoint : preferred());
  }

  /** Closes the session (freeing every lock at once) and the channels. */
  void close() {
    if (closed || closing) {
      return;
    }
    closing = true;
    LockdException err = null;
    Callable<Sess> end = () -> {
      Sess x = sess;
      sess = null;
      if (x != null) {
        endLocally(x, "the client was closed", () -> new ClientClosedException(
            "the client is closed"));
      }
      return x;
    };
    Sess s;
    try {
      s = callWithin(end, opts.requestTimeout + 1);
    } catch (TimeoutException e) {
      // The loop is stuck in a task: close without it rather than hang. Once it has stopped,
      // its state is this thread's to end; if it does not stop, only the thread-safe lease is.
      LOG.warning("lockd: the engine thread of " + opts.clientName + " did not answer in "
          + (opts.requestTimeout + 1) + " s; closing without it");
      loop.shutdownNow();
      boolean stopped = false;
      try {
        stopped = loop.awaitTermination(1, TimeUnit.SECONDS);
      } catch (InterruptedException ie) {
        Thread.currentThread().interrupt();
      }
      if (stopped) {
        try {
          s = end.call();
        } catch (Exception ex) {
          throw new IllegalStateException(ex);
        }
      } else {
        s = sess;
        sess = null;
        if (s != null) {
          s.lease.end("the client was closed");
        }
      }
    }
    if (s != null) {
      String id = s.id;
      try {
        unary(st -> st.closeSession(CloseSessionRequest.newBuilder().setSessionId(id).build()),
            0, null, 3, Double.POSITIVE_INFINITY);
      } catch (UnavailableException e) {
        // No node answered: the service frees the session's locks when it expires.
        LOG.warning("lockd: could not close the session of " + opts.clientName + " ("
            + e.getMessage() + "); its locks are freed when it expires");
      } catch (LockdException e) {
        if (!"session_not_found".equals(e.code())) {
          err = e;
        }
      }
    }
    closed = true;
    loop.shutdownNow();
    background.shutdownNow();
    synchronized (channels) {
      for (ManagedChannel ch : channels) {
        if (ch != null) {
          ch.shutdownNow();
        }
      }
    }
    if (err != null) {
      throw err;
    }
  }

  // ----- events --------------------------------------------------------------------------------

  /** loop: one event of the live stream. */
  void event(SessionEvent ev) {
    SessionEvent.KindCase kind = ev.getKindCase();
    Pending p = ev.getRequestId() != 0 ? pending.remove(ev.getRequestId()) : null;
    if (p != null && p.kind == Kind.KEEPALIVE) {
      if (kind == SessionEvent.KindCase.KEEPALIVE) {
        Sess s = sess;
        if (s != null) {
          s.keepaliveFailures = 0;
        }
        renewedReply(p.sent, ev.getKeepalive(), p.named);
      } else if (kind == SessionEvent.KindCase.ERROR && ev.getError().getStatus() == 404) {
        lose("the service no longer knows the session", true);
      } else if (kind == SessionEvent.KindCase.ERROR) {
        // 503 (no group extended, some could not answer) or another refusal: the session goes
        // on while any of its deadlines holds; try again soon.
        keepaliveFailed(Errors.fromEvent(ev.getError()));
      }
    } else if (p != null && p.kind == Kind.ACQUIRE) {
      acquireAnswered(p.acq, ev);
    } else if (p != null && p.kind == Kind.RELEASE) {
      if (kind == SessionEvent.KindCase.RELEASED) {
        p.fut.complete(ev.getReleased().getRemaining());
      } else if (kind == SessionEvent.KindCase.ERROR) {
        p.fut.completeExceptionally(Errors.fromEvent(ev.getError()));
      }
    } else if (kind == SessionEvent.KindCase.SESSION_ENDED) {
      SessionEnded se = ev.getSessionEnded();
      if (se.getGroup() != 0 && "expired".equals(se.getReason())) {
        groupEnded(se.getGroup());
      } else {
        lose("the service ended the session (" + se.getReason() + ")",
            !"closed".equals(se.getReason()));
      }
    } else if (kind == SessionEvent.KindCase.GRANTED || kind == SessionEvent.KindCase.WAIT_ENDED) {
      pushed(pushes.pushed(ev, this::unanswered));
    } else if (kind == SessionEvent.KindCase.LEASE_EXTENDED) {
      leaseExtended.incrementAndGet();
      leaseExtension = new long[] {ev.getLeaseExtended().getGroup(),
          ev.getLeaseExtended().getRemainingMs()};
      LOG.info("lockd: a new leader of group " + ev.getLeaseExtended().getGroup()
          + " extended the lease (" + ev.getLeaseExtended().getRemainingMs() + " ms left); the "
          + "local deadline keeps its own, shorter rule");
    } else {
      LOG.fine(() -> "lockd: unexpected session event " + kind);
    }
  }

  private void acquireAnswered(Acq a, SessionEvent ev) {
    SessionEvent.KindCase kind = ev.getKindCase();
    if (kind == SessionEvent.KindCase.ERROR && "already_waiting".equals(ev.getError().getCode())) {
      // Refused by its own first attempt, whose answer a broken stream took: the wait is queued
      // for the session, and this retry adopts it. It may have been granted before this retry
      // was sent: its lease counts from the first send.
      Double firstSent = pushes.straySince(a.name, a.owner);
      if (firstSent != null) {
        a.sent = Math.min(a.sent, firstSent);
      }
      Pushes.Refused<Acq> r = pushes.refusedWaiting(a.name, a.owner, a);
      if (r.adopted()) {
        LOG.fine(() -> "lockd: the retry of '" + a.name + "' adopts the wait its first attempt "
            + "queued before the stream broke");
      }
      if (r.answer() != null) {
        outcome(r.answer().acq(), r.answer().event());
      } else if (!r.adopted()) {
        fail(a, Errors.fromEvent(ev.getError()));
      }
      unclaimed(a.name);
      return;
    }
    if (kind == SessionEvent.KindCase.ERROR && "already_held".equals(ev.getError().getCode())
        && firstAttemptHeld(a)) {
      // Its own first attempt landed as a hold no lock object knows: give that back, and the
      // caller's retry starts clean.
      unsure.add(a.name);
      Sess s = sess;
      if (s != null) {
        beginSettle(s);
      }
      fail(a, new UnavailableException("the first attempt at '" + a.name + "' landed after its "
          + "stream broke; that hold is given back before the retry"));
      return;
    }
    pushes.settled(a.name, a.owner);
    Sess s = sess;
    if (kind == SessionEvent.KindCase.ACQUIRED) {
      AcquireResponse r = ev.getAcquired();
      if (r.getAcquired()) {
        if (r.getLeaseStarted() && s != null) {
          // The group adopted the session for this acquire: the lease there counts from its send.
          s.lease.leases.started(r.getGroup(), a.sent, r.getLeaseTtlMs(), Clock.now());
        }
        renewedIn(r.getGroup(), r.hasRenewed() ? r.getRenewed() : null, a.sent);
        answer(a, r.getFencingToken(), Math.max(r.getReentry(), 1), r.getGroup(),
            r.getGroupMoves(), r.getLeaseTtlMs());
      } else {
        fail(a, new NotAcquiredException("'" + a.name + "' is held"
            + (r.getHolder().isEmpty() ? "" : " by '" + r.getHolder() + "'"), r.getHolder(),
            r.getQueuePosition(), r.getLockDelayUntilMs()));
      }
    } else if (kind == SessionEvent.KindCase.QUEUED) {
      Queued q = ev.getQueued();
      if (q.getLeaseStarted() && s != null) {
        // The wait's group adopted the session for it (its grant is pushed later).
        s.lease.leases.started(q.getGroup(), a.sent, 0, Clock.now());
      }
      renewedIn(q.getGroup(), q.hasRenewed() ? q.getRenewed() : null, a.sent);
      Pushes.Answer<Acq> answer = pushes.queued(new Pushes.Key(q.getGroup(), q.getWaiter()), a);
      if (answer != null) {
        outcome(answer.acq(), answer.event());
      }
    } else if (kind == SessionEvent.KindCase.ERROR) {
      fail(a, Errors.fromEvent(ev.getError()));
    }
    unclaimed(a.name);
  }

  private void renewedIn(int group, GroupLease renewed, double sent) {
    Sess s = sess;
    if (renewed == null || renewed.getStateValue() != GroupLeases.EXTENDED || s == null) {
      return;
    }
    s.lease.leases.renewedIn(group, sent, renewed.getTtlMs(), renewed.getGroupMoves(),
        Clock.now());
  }

  /** loop: a lock group let the session's lease there run out (a pushed SessionEnded for that
   * group): the locks it granted before the push are lost; the session goes on. */
  void groupEnded(int group) {
    Sess s = sess;
    if (s == null) {
      return;
    }
    double now = Clock.now();
    LOG.warning("lockd: lock group " + group + " ended the lease of the session of "
        + opts.clientName + " there; its locks there are lost, the session goes on");
    s.lease.leases.groupEnded(group, now);
    checkLocks(s, now);
  }

  private void keepaliveFailed(LockdException err) {
    Sess s = sess;
    if (s == null) {
      return;
    }
    LOG.fine(() -> "lockd: keepalive refused: " + err.getMessage());
    s.keepaliveFailures++;
    double retry = Clock.now() + Math.min(s.every,
        opts.retry.delay(Math.min(s.keepaliveFailures, 4), err));
    if (retry < s.nextKeepalive) {
      s.nextKeepalive = retry;
      poke();
    }
  }

  private boolean firstAttemptHeld(Acq a) {
    Sess s = sess;
    if (s == null) {
      return false;
    }
    for (Hold h : held.values()) {
      if (h.name.equals(a.name) && h.lease.session == s.lease) {
        return false;
      }
    }
    return pushes.isStray(a.name, a.owner);
  }

  /** Whether an acquire of {@code name} is still unanswered on the stream. */
  private boolean unanswered(String name) {
    for (Pending p : pending.values()) {
      if (p.acq != null && p.acq.name.equals(name)) {
        return true;
      }
    }
    return false;
  }

  private void pushed(Pushes.Pushed<Acq> p) {
    if (p instanceof Pushes.Answer<Acq> a) {
      outcome(a.acq(), a.event());
    } else if (p instanceof Pushes.Orphan<Acq> o) {
      giveBack(o.name(), o.token());
    }
  }

  private void unclaimed(String name) {
    for (Pushes.Pushed<Acq> p : pushes.unclaimed(name, this::unanswered)) {
      pushed(p);
    }
  }

  /** A grant nobody waits for: give it back, unless a lock object holds it. */
  private void giveBack(String name, long token) {
    Sess s = sess;
    if (s == null) {
      return;
    }
    for (Hold h : held.values()) {
      if (h.name.equals(name) && h.token == token) {
        return;
      }
    }
    LOG.fine(() -> "lockd: giving back a grant of '" + name + "' nobody waits for");
    String id = s.id;
    spawn(() -> releaseQuietly(id, name, token));
  }

  /** loop: a granted or wait_ended push answers the acquire {@code a}. */
  private void outcome(Acq a, SessionEvent ev) {
    if (ev.hasGranted()) {
      dev.lockd.v1.Granted g = ev.getGranted();
      answer(a, g.getFencingToken(), 1, g.getGroup(), g.getGroupMoves(), g.getLeaseTtlMs());
      return;
    }
    String reason = ev.getWaitEnded().getReason();
    if ("session_ended".equals(reason)) {
      fail(a, new SessionLostException("the session ended while waiting"));
    } else if ("moved".equals(reason)) {
      // The name's bucket moved to another group: retryable, so the acquire queues again.
      fail(a, new UnavailableException("the bucket of '" + a.name + "' moved to another group"));
    } else {
      fail(a, new NotAcquiredException("the wait for '" + a.name + "' ended without a grant"));
    }
  }

  private void answer(Acq a, long token, int reentry, int group, long groupMoves,
      long leaseTtlMs) {
    Sess s = sess;
    if (s == null) {
      fail(a, new SessionLostException("the session ended"));
      return;
    }
    if (a.fut.isDone()) {
      // Nobody waits for this grant any more (the acquire gave up): give it back.
      String id = s.id;
      spawn(() -> releaseQuietly(id, a.name, token));
      return;
    }
    Hold h = hold(s, a.name, token, a.owner, a.mode, reentry, a.sent, group, groupMoves,
        leaseTtlMs);
    if (!a.fut.complete(h)) {
      held.remove(h.id);
      String id = s.id;
      spawn(() -> releaseQuietly(id, a.name, token));
    }
  }

  /** loop: a grant of session {@code s}, tied to the lease of the group that made it. */
  Hold hold(Sess s, String name, long token, String owner, Mode mode, int reentry, double sent,
      int group, long groupMoves, long leaseTtlMs) {
    // Other acquires still unanswered may have brought the session into the group.
    Double others = null;
    for (Pending p : pending.values()) {
      if (p.acq != null) {
        others = others == null ? p.acq.sent : Math.min(others, p.acq.sent);
      }
    }
    Leases.LockLease ll = new Leases.LockLease(s.lease, s.lease.leases.granted(sent, Clock.now(),
        group, groupMoves, leaseTtlMs, others));
    if (ll.deadline() < s.checkDue || s.lease.leases.changes() != s.checkedChanges) {
      s.checkDue = Math.min(s.checkDue, ll.deadline());
      poke();
    }
    Hold h = new Hold(name, token, s.id, ll, owner, mode, reentry);
    h.id = nextHold++;
    held.put(h.id, h);
    return h;
  }

  // ----- test hooks ----------------------------------------------------------------------------

  /** loop: {@code c} carries the session from now on, as if its handshake was answered (unit
   * tests: a stream whose requests the test sees and answers with {@link #injectEvent}). */
  void attachForTest(Conn c) {
    call(() -> {
      c.firstDone = true;
      adopt(c);
      return null;
    });
  }

  /** Whether an acquire of {@code name} is unanswered on the stream (tests). */
  boolean unansweredForTest(String name) {
    return call(() -> unanswered(name));
  }

  /** Whether (name, owner)'s acquire lost its outcome (tests). */
  boolean strayForTest(String name, String owner) {
    return call(() -> pushes.isStray(name, owner));
  }

  Sess currentSession() {
    return sess;
  }

  /** loop: an event as if the stream had carried it (unit tests). */
  void injectEvent(SessionEvent ev) {
    call(() -> {
      event(ev);
      return null;
    });
  }

  /** loop: a synthetic open (unit tests): a session with no stream. */
  Sess openSynthetic(OpenSessionResponse r, double sent) {
    synthetic = true;
    return call(() -> opened(r, sent, null));
  }

  /** loop: a synthetic keepalive answer (unit tests). */
  void renewedForTest(double sent, KeepAliveResponse r) {
    call(() -> {
      renewedReply(sent, r, false);
      return null;
    });
  }

  /** loop: a synthetic grant (unit tests). */
  Hold holdForTest(String name, long token, double sent, int group, long groupMoves) {
    return call(() -> {
      Sess s = sess;
      return hold(s, name, token, "me", Mode.EXCLUSIVE, 1, sent, group, groupMoves, 15_000);
    });
  }

  /** loop: registers a keepalive in flight (unit tests). */
  void pendingKeepaliveForTest(long id, double sent) {
    call(() -> pending.put(id, new Pending(Kind.KEEPALIVE, sent, false, null, null)));
  }

  /** loop: what {@link #lose} does (unit tests). */
  void loseForTest(String why) {
    call(() -> {
      lose(why, true);
      return null;
    });
  }

  /** Blocks the engine's loop for {@code seconds}: no keepalive goes out meanwhile (what a GC
   * pause or a stuck thread does to the renewal loop). Tests only. */
  void stallLoopForTest(double seconds) {
    execute(() -> {
      try {
        Thread.sleep((long) (seconds * 1000));
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    });
  }
}
