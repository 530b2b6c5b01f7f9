package dev.lockd.client;

import java.time.Duration;

/** The namespace needs a bearer token and none (or a wrong one) was sent (401). */
public class UnauthenticatedException extends LockdException {
  private static final long serialVersionUID = 1L;

  public UnauthenticatedException(String message) {
    super(message);
  }

  public UnauthenticatedException(String message, String code, int status, Duration retryAfter) {
    super(message, code, status, retryAfter);
  }

  @Override
  protected String defaultCode() {
    return "unauthenticated";
  }
}
