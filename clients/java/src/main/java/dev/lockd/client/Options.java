package dev.lockd.client;

import java.net.InetAddress;
import java.nio.file.Path;
import java.util.List;

/** The client's settings, checked once (times in seconds). */
final class Options {
  final List<String> endpoints;
  final String clientName;
  final double ttl;
  /** null: ttl / 5 of the TTL the service grants. */
  final Double margin;
  final String namespace;
  final String token;
  final double requestTimeout;
  final double connectTimeout;
  final RetryPolicy retry;
  final Path caFile;
  final Path certFile;
  final Path keyFile;
  final String tlsServerName;

  Options(List<String> endpoints, String clientName, double ttl, Double margin, String namespace,
      String token, double requestTimeout, double connectTimeout, RetryPolicy retry, Path caFile,
      Path certFile, Path keyFile, String tlsServerName) {
    this.endpoints = endpoints.stream().map(String::strip).filter(e -> !e.isEmpty()).toList();
    this.clientName = clientName != null ? clientName : hostPid();
    this.ttl = ttl;
    this.margin = margin;
    this.namespace = namespace == null ? "" : namespace;
    this.token = token;
    this.requestTimeout = requestTimeout;
    this.connectTimeout = connectTimeout;
    this.retry = retry == null ? RetryPolicy.DEFAULT : retry;
    this.caFile = caFile;
    this.certFile = certFile;
    this.keyFile = keyFile;
    this.tlsServerName = tlsServerName;
    check();
  }

  private void check() {
    if (endpoints.isEmpty()) {
      throw new InvalidArgumentException(
          "endpoints must name at least one node's gRPC address (HOST:PORT)");
    }
    for (String e : endpoints) {
      String target = e.contains("://") ? e.substring(e.indexOf("://") + 3) : e;
      if (!target.contains(":")) {
        throw new InvalidArgumentException("endpoint '" + e + "' must be HOST:PORT");
      }
    }
    if (!(ttl > 0 && ttl <= 3600)) {
      throw new InvalidArgumentException("ttl must lie in (0, 3600] seconds (got " + ttl + ")");
    }
    if (margin != null && !(margin >= 0 && margin < ttl)) {
      throw new InvalidArgumentException(
          "margin must lie in [0, ttl=" + ttl + ") seconds (got " + margin + ")");
    }
    if (!(requestTimeout > 0)) {
      throw new InvalidArgumentException(
          "requestTimeout must be positive (got " + requestTimeout + ")");
    }
    if (!(connectTimeout > 0)) {
      throw new InvalidArgumentException(
          "connectTimeout must be positive (got " + connectTimeout + ")");
    }
    int n = Names.utf8Length(clientName);
    if (n > 256) {
      throw new InvalidArgumentException("clientName must be at most 256 bytes (got " + n + ")");
    }
    if ((certFile == null) != (keyFile == null)) {
      throw new InvalidArgumentException(
          "certFile and keyFile go together (a client certificate and its key)");
    }
    if (token != null) {
      boolean ok = !token.isEmpty() && token.chars().allMatch(c -> c >= 33 && c <= 126);
      if (!ok) {
        throw new InvalidArgumentException("token must be non-empty printable ASCII without spaces"
            + " (it is sent as an authorization header)");
      }
    }
  }

  /** Whether the client speaks TLS. */
  boolean tls() {
    return caFile != null || certFile != null
        || endpoints.stream().anyMatch(e -> e.startsWith("https://"));
  }

  /** HOST/PID of this process: the default client name and lock owner. */
  static String hostPid() {
    String host = "";
    try {
      host = InetAddress.getLocalHost().getHostName().strip();
    } catch (Exception e) {
      host = "";
    }
    if (host.isEmpty()) {
      String env = System.getenv("HOSTNAME");
      host = env != null && !env.isBlank() ? env.strip() : "localhost";
    }
    return host + "/" + ProcessHandle.current().pid();
  }
}
