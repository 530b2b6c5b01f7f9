package dev.lockd.client;

import java.time.Duration;

/**
 * One acquire, set up step by step: {@code client.newLock("jobs/a").shared().waitFor(d)
 * .acquire()}. Without a wait it is a try-lock.
 */
public final class LockRequest {
  private final LockdClient client;
  private final String name;
  private Mode mode = Mode.EXCLUSIVE;
  private Integer limit;
  private String owner;
  private boolean reentrant;
  private Double wait;

  LockRequest(LockdClient client, String name) {
    this.client = client;
    this.name = name;
  }

  /** Any number of shared holders, never beside an exclusive one. */
  public LockRequest shared() {
    this.mode = Mode.SHARED;
    this.limit = null;
    return this;
  }

  /** Up to {@code limit} holders (1..=10 000), each with its own token; every user of the name
   * must give the same limit. */
  public LockRequest semaphore(int limit) {
    this.mode = Mode.SEMAPHORE;
    this.limit = limit;
    return this;
  }

  /** The mode (and, for a semaphore, the limit) as values. */
  public LockRequest mode(Mode mode, Integer limit) {
    this.mode = mode;
    this.limit = limit;
    return this;
  }

  /** Who within the client holds it (default: the client name). One client taking a second
   * semaphore permit or shared hold of a name needs another owner for each. */
  public LockRequest owner(String owner) {
    this.owner = owner;
    return this;
  }

  /** The same session and owner may take it again (same token, count + 1) and must release as
   * often. */
  public LockRequest reentrant() {
    this.reentrant = true;
    return this;
  }

  /** Wait in the name's FIFO queue up to {@code wait} (zero: try once; {@link
   * LockdClient#FOREVER}: no end). */
  public LockRequest waitFor(Duration wait) {
    this.wait = wait == null || wait.isZero() ? null : LockdClient.seconds(wait, "wait");
    if (wait != null && wait.isNegative()) {
      this.wait = wait.getSeconds() + wait.getNano() / 1e9;
    }
    return this;
  }

  /** Takes the lock; {@link NotAcquiredException} if it was not granted in time. */
  public Lock acquire() {
    return client.acquire(name, wait, mode, limit, owner, reentrant);
  }
}
