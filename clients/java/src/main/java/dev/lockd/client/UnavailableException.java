package dev.lockd.client;

import java.time.Duration;

/** No node answered, the connection broke, or the service has no leader or quorum (503). Always retryable. */
public class UnavailableException extends LockdException {
  private static final long serialVersionUID = 1L;

  public UnavailableException(String message) {
    super(message);
  }

  public UnavailableException(String message, String code, int status, Duration retryAfter) {
    super(message, code, status, retryAfter);
  }

  @Override
  protected String defaultCode() {
    return "unavailable";
  }

  /** Always: the same request may succeed once a node answers. */
  @Override
  public boolean isRetryable() {
    return true;
  }
}
