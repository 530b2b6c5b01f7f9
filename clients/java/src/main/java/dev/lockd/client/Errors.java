package dev.lockd.client;

import io.grpc.Metadata;
import io.grpc.Status;
import java.time.Duration;
import java.util.Map;

/** Maps the service's refusals and gRPC failures to typed exceptions (as errors.py). */
final class Errors {
  private Errors() {}

  static final Metadata.Key<String> ERROR_CODE =
      Metadata.Key.of("lockd-error-code", Metadata.ASCII_STRING_MARSHALLER);
  static final Metadata.Key<String> RETRY_AFTER_MS =
      Metadata.Key.of("lockd-retry-after-ms", Metadata.ASCII_STRING_MARSHALLER);

  private static final Map<Status.Code, Integer> STATUS_BY_GRPC = Map.of(
      Status.Code.INVALID_ARGUMENT, 400,
      Status.Code.UNAUTHENTICATED, 401,
      Status.Code.PERMISSION_DENIED, 403,
      Status.Code.NOT_FOUND, 404,
      Status.Code.FAILED_PRECONDITION, 409,
      Status.Code.RESOURCE_EXHAUSTED, 429,
      Status.Code.UNAVAILABLE, 503);

  /** The error for a service refusal with HTTP {@code status} and stable {@code code}. */
  static LockdException fromStatus(int status, String code, String message, long retryAfterMs) {
    Duration ra = retryAfterMs > 0 ? Duration.ofMillis(retryAfterMs) : null;
    switch (status) {
      case 400:
        return new InvalidArgumentException(message, code, status, ra);
      case 401:
        return new UnauthenticatedException(message, code, status, ra);
      case 403:
        return new PermissionDeniedException(message, code, status, ra);
      case 404:
        return new SessionNotFoundException(message, code, status, ra);
      case 409:
        return new ConflictException(message, code, status, ra);
      case 413:
      case 429:
        return new ResourceExhaustedException(message, code, status, ra);
      case 503:
        return new UnavailableException(message, code, status, ra);
      default:
        return new LockdException(message, code, status, ra);
    }
  }

  /** {@code key} from the trailers, else from the headers (either may be null). */
  private static String meta(Metadata.Key<String> key, Metadata headers, Metadata trailers) {
    String v = trailers == null ? null : trailers.get(key);
    if (v == null && headers != null) {
      v = headers.get(key);
    }
    return v;
  }

  /** The error carried by a {@code SessionEvent.error} on the session stream. */
  static LockdException fromEvent(dev.lockd.v1.Error e) {
    return fromStatus(e.getStatus(), e.getCode(), e.getMessage(), e.getRetryAfterMs());
  }

  /** Every message along a throwable's causes, for recognising transport failures. */
  static String causes(Throwable t) {
    StringBuilder sb = new StringBuilder();
    for (Throwable c = t; c != null && sb.length() < 4000; c = c.getCause()) {
      sb.append(c.getClass().getSimpleName()).append(": ").append(c.getMessage()).append(" | ");
      if (c.getCause() == c) {
        break;
      }
    }
    return sb.toString();
  }

  /**
   * What to do about a transport error that looks like a TLS mismatch, if it does.
   * {@code tlsWithoutCert}: the client speaks TLS and has no certificate of its own.
   */
  static String tlsHint(String details, String endpoint, boolean tls, boolean tlsWithoutCert) {
    if (details.contains("PKIX path building failed")
        || details.contains("unable to find valid certification path")
        || details.contains("CERTIFICATE_VERIFY_FAILED")
        || details.contains("signature check failed")) {
      return "the node's certificate is not signed by a CA this client trusts: give its CA "
          + "(Builder.caFile)";
    }
    if (details.contains("certificate_required") || details.contains("CERTIFICATE_REQUIRED")
        || details.contains("bad_certificate")) {
      return "the node asks for a client certificate: give Builder.clientCertificate(cert, key)";
    }
    if (tlsWithoutCert && (details.contains("Connection reset") || details.contains("Broken pipe")
        || details.contains("closed"))) {
      return "the node closed the TLS connection: if it requires client certificates, give "
          + "Builder.clientCertificate(cert, key)";
    }
    if (!tls && (details.contains("Network closed") || details.contains("closed for unknown")
        || details.contains("Connection reset") || details.contains("http2 exception")
        || details.contains("First received frame was not SETTINGS")
        || details.contains("not an SSL/TLS record"))) {
      return "if the node serves TLS, give its CA (Builder.caFile) or use an https:// endpoint; "
          + "a plain-text node refuses TLS";
    }
    return null;
  }

  /**
   * Maps a failed gRPC call to a typed error. A refusal by the service carries its stable code
   * in the {@code lockd-error-code} metadata and a retry hint in {@code lockd-retry-after-ms}; a
   * status without that code came from the transport (refused, reset, timed out) and is {@link
   * UnavailableException}, except INVALID_ARGUMENT and UNIMPLEMENTED, which no retry can fix.
   */
  static LockdException fromGrpc(Throwable t, String endpoint, boolean tls,
      boolean tlsWithoutCert) {
    return fromGrpc(t, null, endpoint, tls, tlsWithoutCert, true);
  }

  /** {@code hint}: add what to do about a TLS mismatch (not for a stream that was working). */
  static LockdException fromGrpc(Throwable t, String endpoint, boolean tls, boolean tlsWithoutCert,
      boolean hint) {
    return fromGrpc(t, null, endpoint, tls, tlsWithoutCert, hint);
  }

  /**
   * {@link #fromGrpc(Throwable, String, boolean, boolean, boolean)} of a call whose initial
   * metadata was {@code headers} (null: unknown). The service's metadata is read from the
   * headers and the trailers both, the trailers winning, as the Python client does: grpc-java
   * puts only the trailers in a {@link io.grpc.StatusRuntimeException}.
   */
  static LockdException fromGrpc(Throwable t, Metadata headers, String endpoint, boolean tls,
      boolean tlsWithoutCert, boolean hint) {
    if (t instanceof LockdException) {
      return (LockdException) t;
    }
    Status st = Status.fromThrowable(t);
    Metadata md = Status.trailersFromThrowable(t);
    String code = meta(ERROR_CODE, headers, md);
    String details = st.getDescription() != null ? st.getDescription() : String.valueOf(t);
    int nl = details.indexOf('\n');
    String full = details;
    if (nl >= 0) {
      details = details.substring(0, nl); // grpc-java adds the channel's pipeline on a new line
    }
    String where = endpoint == null || endpoint.isEmpty() ? "" : endpoint + ": ";
    Status.Code g = st.getCode();
    if (code == null) {
      if (g == Status.Code.INVALID_ARGUMENT) {
        return new InvalidArgumentException(where + details);
      }
      if (g == Status.Code.UNIMPLEMENTED) {
        return new LockdException(where + details, "unimplemented", 0, null);
      }
      if (g == Status.Code.DEADLINE_EXCEEDED) {
        return new UnavailableException(where + "no answer in time (" + details + ")");
      }
      if (g == Status.Code.CANCELLED) {
        return new UnavailableException(where + "the call was cancelled (" + details + ")");
      }
      String h = hint ? tlsHint(full + " " + causes(t), endpoint == null ? "" : endpoint, tls,
          tlsWithoutCert) : null;
      LockdException e = new UnavailableException(
          where + g + ": " + details + (h != null ? " (" + h + ")" : ""));
      e.initCause(t);
      return e;
    }
    int status = STATUS_BY_GRPC.getOrDefault(g, 500);
    if (g == Status.Code.RESOURCE_EXHAUSTED
        && ("payload_too_large".equals(code) || "body_too_large".equals(code))) {
      status = 413;
    }
    long retryAfterMs = 0;
    String ra = meta(RETRY_AFTER_MS, headers, md);
    if (ra != null) {
      try {
        retryAfterMs = Long.parseLong(ra.trim());
      } catch (NumberFormatException ignored) {
        retryAfterMs = 0;
      }
    }
    return fromStatus(status, code, details, retryAfterMs);
  }
}
