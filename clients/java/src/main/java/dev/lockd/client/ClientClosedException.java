package dev.lockd.client;

import java.time.Duration;

/** The client was closed. */
public class ClientClosedException extends LockdException {
  private static final long serialVersionUID = 1L;

  public ClientClosedException(String message) {
    super(message);
  }

  public ClientClosedException(String message, String code, int status, Duration retryAfter) {
    super(message, code, status, retryAfter);
  }

  @Override
  protected String defaultCode() {
    return "client_closed";
  }
}
