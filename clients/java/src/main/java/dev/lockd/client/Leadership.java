package dev.lockd.client;

import java.util.concurrent.CompletableFuture;

/** Won leadership ({@link Election#campaign}): lead while it lasts, stop at once when it is lost.
 * Closing it resigns. */
public final class Leadership implements AutoCloseable {
  private final Lock lock;
  private final String value;
  /** Completed once {@link #resign()} gave the lock up (even if its release failed). */
  private final CompletableFuture<Void> resigned = new CompletableFuture<>();

  Leadership(Lock lock, String value) {
    this.lock = lock;
    this.value = value;
  }

  /** The lock that makes this process the leader. */
  public Lock lock() {
    return lock;
  }

  /** The campaign value. */
  public String value() {
    return value;
  }

  /** The term's fencing token: fence every side effect with it. */
  public long token() {
    return lock.token();
  }

  /** Completes when leadership is lost (see {@link Lock#lost()}). */
  public CompletableFuture<Void> lost() {
    return lock.lost();
  }

  public boolean isLost() {
    return lock.isLost();
  }

  /** Whether this term still leads: not lost and not resigned. */
  public boolean isLeading() {
    return !lock.isReleased() && !lock.isLost();
  }

  /** The internal lost signal of the term's lock (see {@link Lock#lostSignal()}). */
  CompletableFuture<Void> lostSignal() {
    return lock.lostSignal();
  }

  /** Completes once the term was resigned (see {@link #resign()}). */
  CompletableFuture<Void> resigned() {
    return resigned;
  }

  /** Steps down, letting the next candidate in line lead. Idempotent; a lost leadership resigns
   * quietly. Once it returns (or throws), this term no longer leads. */
  public void resign() {
    if (lock.isReleased()) {
      resigned.complete(null);
      return;
    }
    try {
      lock.release();
    } catch (LockdException e) {
      if (!lock.isLost()) {
        throw e;
      }
    } finally {
      resigned.complete(null);
    }
  }

  @Override
  public void close() {
    resign();
  }
}
