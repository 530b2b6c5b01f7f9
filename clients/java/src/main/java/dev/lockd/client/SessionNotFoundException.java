package dev.lockd.client;

import java.time.Duration;

/** The session is unknown or has expired on the service (404 {@code session_not_found}). */
public class SessionNotFoundException extends LockdException {
  private static final long serialVersionUID = 1L;

  public SessionNotFoundException(String message) {
    super(message);
  }

  public SessionNotFoundException(String message, String code, int status, Duration retryAfter) {
    super(message, code, status, retryAfter);
  }

  @Override
  protected String defaultCode() {
    return "session_not_found";
  }
}
