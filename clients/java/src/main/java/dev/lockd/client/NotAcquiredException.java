package dev.lockd.client;

import java.util.Optional;

/** The lock is held by someone else (a try-lock), or the wait ended without a grant. */
public class NotAcquiredException extends LockdException {
  private static final long serialVersionUID = 1L;

  private final String holder;
  private final int queuePosition;
  private final long lockDelayUntilMs;

  public NotAcquiredException(String message) {
    this(message, null, 0, 0);
  }

  public NotAcquiredException(String message, String holder, int queuePosition,
      long lockDelayUntilMs) {
    super(message, "not_acquired", 0, null);
    this.holder = holder == null || holder.isEmpty() ? null : holder;
    this.queuePosition = queuePosition;
    this.lockDelayUntilMs = lockDelayUntilMs;
  }

  @Override
  protected String defaultCode() {
    return "not_acquired";
  }

  /** The owner string of the current holder, when the service said. */
  public Optional<String> holder() {
    return Optional.ofNullable(holder);
  }

  /** The queue position the caller had or would have had (0 if unknown). */
  public int queuePosition() {
    return queuePosition;
  }

  /** Group time a lock-delay after a failed holder ends (0 = none). */
  public long lockDelayUntilMs() {
    return lockDelayUntilMs;
  }
}
