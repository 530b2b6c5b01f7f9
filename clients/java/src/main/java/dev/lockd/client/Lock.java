package dev.lockd.client;

import java.time.Duration;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ScheduledFuture;
import java.util.concurrent.TimeUnit;
import java.util.function.Consumer;

/**
 * A held lock. Attach {@link #token()} to every write made under it and stop working once it is
 * lost. Closing it (try-with-resources) releases it; so does {@link #release()}.
 *
 * <pre>{@code
 * try (Lock lk = client.lock("payouts/m-1", Duration.ofSeconds(10))) {
 *   for (Batch b : batches) {
 *     if (lk.isLost()) break;                   // the lease may be gone: stop at once
 *     Fencing.write(db, lk, "batch/" + b.id(), "sent");
 *   }
 * }                                             // LockLostException if it was lost meanwhile
 * }</pre>
 *
 * <p>{@link #lost()} completes at the lock's local deadline (send time of the last keepalive its
 * lease counts from + TTL - margin, on the monotonic clock: a timer fires it even if no code of
 * yours runs) unless a renewal moved it, when its lock group's lease is known to have ended, or
 * when the session ends. {@link #isLost()} also compares the deadline with the clock, so it is
 * right at once, e.g. just after a process resumed from a pause.
 *
 * <p>Closing a lock that was lost before the close throws {@link LockLostException} (the work may
 * have overlapped the next holder's), as the Python client's {@code with} block does.
 *
 * <p>Code that waits on the lost signal ({@code lost().thenRun(...)}, {@link #onLost}) runs on
 * the client's callback threads ({@code lockd-client-callback-N}), never on the thread that keeps
 * the session alive: a callback that blocks, or that takes or releases locks, holds up nothing
 * but itself.
 */
public final class Lock implements AutoCloseable {
  private final LockdClient client;
  final Hold hold;
  /** Completed (on whichever thread notices) when the lock is lost: internal only. */
  private final CompletableFuture<Void> lost = new CompletableFuture<>();
  /** What {@link #lost()} hands out (made at its first call): {@link #lost}, completed again on
   * the callback executor so that no dependent of the caller's runs on the engine's loop or the
   * lost timer. */
  private CompletableFuture<Void> view;
  private final Runnable onLeaseLost = () -> markLost(null);
  private volatile String lostReason;
  private volatile boolean released;
  private ScheduledFuture<?> timer;
  private final Object mu = new Object();

  Lock(LockdClient client, Hold hold) {
    this.client = client;
    this.hold = hold;
    hold.lease.watch(onLeaseLost);
    arm();
  }

  /** Schedules the check at the lock's current deadline, on the client's timer. */
  private void arm() {
    synchronized (mu) {
      if (released || lost.isDone()) {
        return;
      }
      long nanos = Math.min(Clock.nanosUntil(hold.lease.deadline()), TimeUnit.HOURS.toNanos(1));
      try {
        timer = client.timer.schedule(this::check, nanos + 1000, TimeUnit.NANOSECONDS);
      } catch (java.util.concurrent.RejectedExecutionException e) {
        timer = null; // the client is closed: its session's end marks the lock lost
      }
    }
  }

  private void check() {
    if (hold.lease.isLost()) {
      markLost(null);
    } else {
      arm(); // a renewal moved the deadline on
    }
  }

  private String reason() {
    Leases.LockLease l = hold.lease;
    if (l.lost && !l.why.isEmpty()) {
      return l.why;
    }
    if (l.session.lost && !l.session.why.isEmpty()) {
      return l.session.why;
    }
    return l.session.leases.whyLost(l.hold);
  }

  private void markLost(String why) {
    if (lost.isDone()) {
      return;
    }
    lostReason = why != null ? why : reason();
    lost.complete(null);
    synchronized (mu) {
      if (timer != null) {
        timer.cancel(false);
      }
    }
  }

  /** The lock's name. */
  public String name() {
    return hold.name;
  }

  /**
   * The fencing token: unique to this grant and larger than every earlier grant's token for the
   * name. Storage that checks it ({@code ... WHERE fence <= token}) refuses a stale holder.
   */
  public long token() {
    return hold.token;
  }

  /** Who within the client holds it (default: the client name). */
  public String owner() {
    return hold.owner;
  }

  public Mode mode() {
    return hold.mode;
  }

  /** The hold count after this grant (1 for a first grant, more for a re-entry). */
  public int reentry() {
    return hold.reentry;
  }

  /** The holding session's id: its capability; do not log it. */
  public String sessionId() {
    return hold.sessionId;
  }

  /** The lock group that granted the lock (whose lease the lock follows). */
  public int group() {
    return hold.lease.group();
  }

  /** How long until the local deadline as it stands (negative once passed); moves forward with
   * renewals. */
  public Duration timeLeft() {
    return Duration.ofNanos((long) ((hold.lease.deadline() - Clock.now()) * 1e9));
  }

  /** The local deadline in seconds on the client's monotonic clock (tests). */
  double deadline() {
    return hold.lease.deadline();
  }

  /**
   * Completes when the lock is lost: at its local deadline, or when the service ended its
   * session or its group's lease. Never completes for a lock released in time. Every call
   * returns the same future, completed on a callback thread of the client (so what you chain to
   * it runs there, never on the thread that renews the session), or by this call itself once
   * {@link #isLost()} is true. Do not complete or cancel it: every caller shares it (the
   * client's own state does not depend on it).
   */
  public CompletableFuture<Void> lost() {
    boolean isLost = isLost();
    CompletableFuture<Void> v;
    synchronized (mu) {
      if (view == null) {
        view = lost.thenRunAsync(() -> { }, client.callbacks);
      }
      v = view;
    }
    if (isLost) {
      v.complete(null); // done as soon as isLost() says so (on the caller's thread, not ours)
    }
    return v;
  }

  /** The internal lost signal (completes on whichever thread notices; no application code may
   * depend on it). */
  CompletableFuture<Void> lostSignal() {
    isLost();
    return lost;
  }

  /** Calls {@code listener} with the reason once the lock is lost, on a callback thread of the
   * client (each listener its own task, so one that blocks delays no other). */
  public void onLost(Consumer<String> listener) {
    isLost();
    lost.thenRunAsync(() -> listener.accept(lostReason), client.callbacks);
  }

  /** Whether the lock is lost: the signal fired, or the deadline passed by the clock. */
  public boolean isLost() {
    if (!lost.isDone() && hold.lease.isLost()) {
      markLost(null);
    }
    return lost.isDone();
  }

  /** Why the lock was lost, or null while it is not. */
  public String lostReason() {
    return isLost() ? lostReason : null;
  }

  public boolean isReleased() {
    return released;
  }

  /**
   * Gives the lock back (one level of re-entry); returns the re-entries still held. A lost
   * lock's release is refused ({@code session_not_found}, {@code not_holder}, {@code
   * stale_token}) unless an earlier attempt of the same call may have landed. Idempotent.
   */
  public int release() {
    synchronized (mu) {
      if (released) {
        return 0;
      }
      released = true;
      if (timer != null) {
        timer.cancel(false);
      }
    }
    hold.lease.unwatch(onLeaseLost);
    client.engine.forget(hold);
    return client.engine.releaseHold(hold);
  }

  /**
   * Releases the lock; throws {@link LockLostException} if it was lost before (the work under it
   * may have overlapped the next holder's).
   */
  @Override
  public void close() {
    boolean wasLost = isLost();
    try {
      release();
    } catch (LockdException e) {
      String c = e.code();
      if (wasLost || "session_not_found".equals(c) || "not_holder".equals(c)
          || "stale_token".equals(c) || "session_lost".equals(c)) {
        LockLostException lle = new LockLostException(
            "the lock '" + name() + "' was lost before it was closed (" + c + ")");
        lle.initCause(e);
        throw lle;
      }
      throw e;
    }
    if (wasLost) {
      throw new LockLostException("the lock '" + name() + "' was lost before it was closed: "
          + lostReason);
    }
  }

  @Override
  public String toString() {
    return "Lock{name='" + name() + "', token=" + token() + ", lost=" + isLost() + "}";
  }
}
