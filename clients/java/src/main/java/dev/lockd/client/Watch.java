package dev.lockd.client;

import dev.lockd.v1.LockGrpc;
import dev.lockd.v1.WatchPosition;
import dev.lockd.v1.WatchRequest;
import io.grpc.CallOptions;
import io.grpc.ClientCall;
import io.grpc.Metadata;
import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;

/**
 * An open watch ({@link LockdClient#watch}): every change of a name or of the names under a
 * prefix, pushed once, in order. It survives a node that stops answering and a cut-off for
 * falling behind: it reconnects (to the next node if need be) and resumes after the last event
 * it delivered, so no event is missed or repeated. It ends with an error the caller must act on:
 * {@code watch_compacted} (re-read the names, then watch again), a credential refused, or a bad
 * request.
 *
 * <p>One consumer at a time. The stream opens at the first {@link #next} or at {@link #open()};
 * {@link #close()} ends it. The semantics follow the Python client's {@code _watch.py}.
 */
public final class Watch implements AutoCloseable {
  /** Reconnects in a row that found no node before the error goes to the caller. */
  static final int MAX_FAILURES = 20;

  private final Engine engine;
  private final WatchRequest.Builder req;
  private final LinkedBlockingQueue<Item> queue = new LinkedBlockingQueue<>();
  private volatile ClientCall<WatchRequest, dev.lockd.v1.WatchEvent> call;
  private int gen;
  private int index;
  private int failures;
  private int compacted;
  private volatile boolean closed;
  private List<WatchEvent.Position> delivered = List.of();

  private record Item(int gen, dev.lockd.v1.WatchEvent ev, Status status, Metadata trailers,
      Metadata headers) {}

  Watch(Engine engine, String name, String prefix) {
    if (name.isEmpty() == prefix.isEmpty()) {
      throw new InvalidArgumentException("watch exactly one of a name or a prefix");
    }
    if (!name.isEmpty()) {
      Names.checkName(name);
    }
    this.engine = engine;
    this.req = WatchRequest.newBuilder().setName(name).setPrefix(prefix);
  }

  /** Where the watch is after the last event it delivered, per lock group. */
  public synchronized List<WatchEvent.Position> positions() {
    return delivered;
  }

  private static boolean resumable(LockdException e) {
    return e instanceof UnavailableException || "watch_too_slow".equals(e.code())
        || "unavailable".equals(e.code()) || "no_leader".equals(e.code());
  }

  private void connect() {
    if (engine.closed) {
      throw new ClientClosedException("the client is closed");
    }
    if (closed) {
      throw new ClientClosedException("the watch is closed");
    }
    index = engine.preferred();
    int g = ++gen;
    CompletableFuture<Void> headers = new CompletableFuture<>();
    java.util.concurrent.atomic.AtomicReference<Metadata> initial =
        new java.util.concurrent.atomic.AtomicReference<>();
    ClientCall<WatchRequest, dev.lockd.v1.WatchEvent> c = engine.channel(index)
        .newCall(LockGrpc.getWatchMethod(), CallOptions.DEFAULT);
    c.start(new ClientCall.Listener<>() {
      @Override
      public void onHeaders(Metadata md) {
        initial.set(md);
        headers.complete(null);
      }

      @Override
      public void onMessage(dev.lockd.v1.WatchEvent ev) {
        queue.add(new Item(g, ev, null, null, null));
      }

      @Override
      public void onClose(Status status, Metadata trailers) {
        headers.completeExceptionally(new StatusRuntimeException(status, trailers));
        queue.add(new Item(g, null, status, trailers, initial.get()));
      }
    }, new Metadata());
    c.sendMessage(req.build());
    c.halfClose();
    c.request(1);
    // The service answers with headers at once: a refusal (a bad request, a credential) shows
    // here, before any event; a node that never answers is given up on.
    double wait = engine.opts.requestTimeout;
    try {
      headers.get((long) (wait * 1000), TimeUnit.MILLISECONDS);
    } catch (TimeoutException e) {
      c.cancel("no headers", null);
      throw new UnavailableException(engine.endpoints.get(index) + ": the watch did not open in "
          + wait + " s");
    } catch (ExecutionException e) {
      throw engine.rpcError(e.getCause(), index, initial.get());
    } catch (InterruptedException e) {
      c.cancel("interrupted", null);
      Thread.currentThread().interrupt();
      throw new ClientClosedException("interrupted");
    }
    call = c;
    // close() may have run meanwhile and seen no call to cancel: one of the two cancels it
    // (each writes its own volatile field, then reads the other's).
    if (closed) {
      call = null;
      c.cancel("the watch was closed", null);
      throw new ClientClosedException("the watch is closed");
    }
  }

  /**
   * Opens the stream now: what changes from here on is delivered. Read the current state after
   * this, never before, and no change falls between the read and the watch.
   */
  public synchronized Watch open() {
    while (call == null) {
      if (closed) {
        throw new ClientClosedException("the watch is closed");
      }
      try {
        connect();
      } catch (LockdException e) {
        backoff(e);
      }
    }
    return this;
  }

  /** The next change, waiting as long as it takes. */
  public WatchEvent next() {
    try {
      return next(null);
    } catch (TimeoutException e) {
      throw new IllegalStateException(e);
    }
  }

  /**
   * The next change; {@link TimeoutException} after {@code timeout} without one. A timeout loses
   * no event: the next call gets it.
   */
  public synchronized WatchEvent next(Duration timeout) throws TimeoutException {
    double end = timeout == null ? Double.POSITIVE_INFINITY
        : Clock.now() + LockdClient.seconds(timeout, "timeout");
    while (true) {
      if (closed) {
        throw new ClientClosedException("the watch is closed");
      }
      open();
      Item it;
      try {
        double left = end - Clock.now();
        if (left <= 0) {
          throw new TimeoutException("no change in " + timeout);
        }
        it = left == Double.POSITIVE_INFINITY ? queue.take()
            : queue.poll(Math.max(1, (long) (left * 1e6)), TimeUnit.MICROSECONDS);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new ClientClosedException("interrupted");
      }
      if (it == null) {
        throw new TimeoutException("no change in " + timeout);
      }
      if (closed) {
        throw new ClientClosedException("the watch is closed");
      }
      if (it.gen() != gen) {
        continue; // a stream given up on
      }
      if (it.ev() != null) {
        dev.lockd.v1.WatchEvent ev = it.ev();
        failures = 0;
        compacted = 0;
        req.clearAfter();
        req.addAllAfter(ev.getResumeList());
        WatchEvent out = WatchEvent.fromProto(ev);
        delivered = out.resume();
        call.request(1);
        return out;
      }
      call = null;
      if (it.status().isOk()) {
        // The node is stopping: resume on the next one.
        engine.rotate(index);
        continue;
      }
      LockdException err = engine.rpcError(new StatusRuntimeException(it.status(),
          it.trailers()), index, it.headers());
      if ("watch_compacted".equals(err.code()) || !resumable(err)) {
        backoff(err); // throws, or moves on to the next node
      } else {
        // A stream that broke after it opened resumes on the next node at once.
        engine.rotate(index);
      }
    }
  }

  /** After a failed open (or a stream ended by {@code e}): try another node, back off and
   * retry, or throw to the caller. */
  private void backoff(LockdException e) {
    if ("watch_compacted".equals(e.code()) && compacted + 1 < engine.endpoints.size()) {
      // This node no longer keeps the position: another may still.
      compacted++;
      engine.rotate(index);
      return;
    }
    if (!resumable(e) || failures >= MAX_FAILURES) {
      throw e;
    }
    failures++;
    engine.rotate(index);
    Engine.sleep(engine.opts.retry.delay(failures - 1, e));
  }

  /** The resume positions to pass as {@code after}, as the proto has them (tests). */
  synchronized List<WatchPosition> after() {
    return new ArrayList<>(req.getAfterList());
  }

  public boolean isClosed() {
    return closed;
  }

  /** Ends the stream; {@link #next} then throws {@link ClientClosedException}. */
  @Override
  public void close() {
    closed = true;
    ClientCall<WatchRequest, dev.lockd.v1.WatchEvent> c = call;
    if (c != null) {
      c.cancel("the watch was closed", null);
    }
    queue.add(new Item(-1, null, Status.CANCELLED, new Metadata(), null));
  }
}
