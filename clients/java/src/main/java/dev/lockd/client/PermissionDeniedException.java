package dev.lockd.client;

import java.time.Duration;

/** The bearer token does not open this namespace or call, or the name lies outside the session's namespace (403 {@code wrong_namespace}). */
public class PermissionDeniedException extends LockdException {
  private static final long serialVersionUID = 1L;

  public PermissionDeniedException(String message) {
    super(message);
  }

  public PermissionDeniedException(String message, String code, int status, Duration retryAfter) {
    super(message, code, status, retryAfter);
  }

  @Override
  protected String defaultCode() {
    return "permission_denied";
  }
}
