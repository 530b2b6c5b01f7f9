package dev.lockd.client;

import java.time.Duration;

/** The lock's state refuses the request (409): {@code not_holder}, {@code stale_token}, {@code already_held}, {@code mode_conflict}, {@code too_many_reentries}, {@code counter_limit}. */
public class ConflictException extends LockdException {
  private static final long serialVersionUID = 1L;

  public ConflictException(String message) {
    super(message);
  }

  public ConflictException(String message, String code, int status, Duration retryAfter) {
    super(message, code, status, retryAfter);
  }

  @Override
  protected String defaultCode() {
    return "conflict";
  }
}
