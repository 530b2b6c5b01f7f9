package dev.lockd.client;

import java.time.Duration;

/** The store refused a fenced write: it has seen a newer fencing token, so another holder has taken over. Stop working under this lock. */
public class FenceRejectedException extends LockdException {
  private static final long serialVersionUID = 1L;

  public FenceRejectedException(String message) {
    super(message);
  }

  public FenceRejectedException(String message, String code, int status, Duration retryAfter) {
    super(message, code, status, retryAfter);
  }

  @Override
  protected String defaultCode() {
    return "fence_rejected";
  }
}
