package dev.lockd.client;

import java.time.Duration;

/** The lock is lost (its local deadline passed or its session ended): work under it must stop, and a guarded write was not attempted. */
public class LockLostException extends LockdException {
  private static final long serialVersionUID = 1L;

  public LockLostException(String message) {
    super(message);
  }

  public LockLostException(String message, String code, int status, Duration retryAfter) {
    super(message, code, status, retryAfter);
  }

  @Override
  protected String defaultCode() {
    return "lock_lost";
  }
}
