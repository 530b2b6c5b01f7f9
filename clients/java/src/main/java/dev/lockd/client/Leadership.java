package dev.lockd.client;

import java.util.concurrent.CompletableFuture;

/** Won leadership ({@link Election#campaign}): lead while it lasts, stop at once when it is lost.
 * Closing it resigns. */
public final class Leadership implements AutoCloseable {
  private final Lock lock;
  private final String value;

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

  /** Steps down, letting the next candidate in line lead. Idempotent; a lost leadership resigns
   * quietly. */
  public void resign() {
    if (lock.isReleased()) {
      return;
    }
    try {
      lock.release();
    } catch (LockdException e) {
      if (!lock.isLost()) {
        throw e;
      }
    }
  }

  @Override
  public void close() {
    resign();
  }
}
