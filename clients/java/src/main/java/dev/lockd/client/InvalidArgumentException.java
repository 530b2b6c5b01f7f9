package dev.lockd.client;

import java.time.Duration;

/** The request was malformed or out of bounds (400); the message names the field and the limit. */
public class InvalidArgumentException extends LockdException {
  private static final long serialVersionUID = 1L;

  public InvalidArgumentException(String message) {
    super(message);
  }

  public InvalidArgumentException(String message, String code, int status, Duration retryAfter) {
    super(message, code, status, retryAfter);
  }

  @Override
  protected String defaultCode() {
    return "invalid_argument";
  }
}
