package dev.lockd.client;

import java.time.Duration;

/** A limit was hit: {@code queue_full}, {@code too_many_locks}, {@code rate_limited} (429, retryable), {@code too_many_sessions} (429, not retryable: a full namespace or cluster) or {@code payload_too_large} (413, not retryable). */
public class ResourceExhaustedException extends LockdException {
  private static final long serialVersionUID = 1L;

  public ResourceExhaustedException(String message) {
    super(message);
  }

  public ResourceExhaustedException(String message, String code, int status, Duration retryAfter) {
    super(message, code, status, retryAfter);
  }

  @Override
  protected String defaultCode() {
    return "resource_exhausted";
  }
}
