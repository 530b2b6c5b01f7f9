package dev.lockd.client;

import java.time.Duration;
import java.util.Optional;
import java.util.OptionalInt;

/**
 * Base class of every exception this client throws.
 *
 * <p>Every error has
 * <ul>
 *   <li>{@link #code()}: a stable string: the service's own error code ({@code stale_token},
 *       {@code queue_full}, ...; see docs/API.md "Limits and errors") when the service refused the
 *       request, otherwise one of {@code unavailable}, {@code not_acquired}, {@code session_lost},
 *       {@code client_closed}, {@code invalid_argument}, {@code lock_lost}, {@code fence_rejected};
 *   <li>{@link #status()}: the HTTP status the service mapped the error to (400, 401, 403, 404,
 *       409, 413, 429, 503), or empty when the service did not answer;
 *   <li>{@link #isRetryable()}: whether the same request may succeed soon (no leader yet, a node
 *       or the network is down, load shedding: 429 and 503). The client has already retried those
 *       with backoff before throwing them. A cluster or namespace at its session cap
 *       ({@code too_many_sessions}, 429) is not retryable: a place frees only when another
 *       process closes its session, so the client throws it at once;
 *   <li>{@link #retryAfter()}: the service's hint (429 and 503), or empty.
 * </ul>
 * The class says what kind of failure it is; match on the class or on {@link #code()}. The
 * exceptions are unchecked, as gRPC's own are.
 */
public class LockdException extends RuntimeException {
  private static final long serialVersionUID = 1L;

  private final String code;
  private final int status;
  private final Duration retryAfter;
  private volatile boolean exhausted;

  /**
   * @param message what happened, for people
   * @param code the stable code, or null for the class's default
   * @param status the HTTP status, or 0 when no node answered
   * @param retryAfter the service's retry hint, or null
   */
  public LockdException(String message, String code, int status, Duration retryAfter) {
    super(message);
    this.code = code != null ? code : defaultCode();
    this.status = status;
    this.retryAfter = retryAfter;
  }

  public LockdException(String message) {
    this(message, null, 0, null);
  }

  /** The code used when none is given: the class's own. */
  protected String defaultCode() {
    return "lockd_error";
  }

  /** The service's stable error code, or the client-side outcome's. */
  public String code() {
    return code;
  }

  /** The HTTP status the service answered with; empty when no node answered. */
  public OptionalInt status() {
    return status == 0 ? OptionalInt.empty() : OptionalInt.of(status);
  }

  /** The service's retry hint. */
  public Optional<Duration> retryAfter() {
    return Optional.ofNullable(retryAfter);
  }

  /**
   * Whether sending the same request again soon may succeed (429, 503, no answer): the client
   * retries these itself; not {@code too_many_sessions}.
   */
  public boolean isRetryable() {
    return (status == 429 || status == 503) && !"too_many_sessions".equals(code);
  }

  /**
   * The client already retried this as far as its options allow (opening a session within the
   * connect timeout): a caller's own retry loop passes it on rather than retry again.
   */
  public boolean isExhausted() {
    return exhausted;
  }

  void setExhausted(boolean exhausted) {
    this.exhausted = exhausted;
  }

  int rawStatus() {
    return status;
  }

  @Override
  public String getMessage() {
    return code + (status != 0 ? " (" + status + ")" : "") + ": " + super.getMessage();
  }

  /** The message without the code and status. */
  public String detail() {
    return super.getMessage();
  }
}
