package dev.lockd.client;

import java.time.Duration;

/** The session ended (expired, closed by the service, or its local deadline passed) while the request was in flight. An acquire that sees it retries on a new session. */
public class SessionLostException extends LockdException {
  private static final long serialVersionUID = 1L;

  public SessionLostException(String message) {
    super(message);
  }

  public SessionLostException(String message, String code, int status, Duration retryAfter) {
    super(message, code, status, retryAfter);
  }

  @Override
  protected String defaultCode() {
    return "session_lost";
  }
}
