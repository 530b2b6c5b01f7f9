package dev.lockd.client.it;

import dev.lockd.client.LockdClient;
import dev.lockd.client.NodeStatus;
import java.io.BufferedReader;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Comparator;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.TimeUnit;
import java.util.function.Supplier;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Stream;

/**
 * {@code lockd dev --nodes N} on consecutive ports from (http, grpc, peer), as the Python suite's
 * conftest.Cluster: it waits until every group has a leader where leader balance puts it, finds
 * the nodes' pids on stdout, and is stopped by PID (the dev supervisor with SIGTERM, then any
 * node it left behind with SIGKILL). Every wait is bounded.
 */
public final class Cluster implements AutoCloseable {
  public static final String SECURE_TOKEN = "java-test-namespace-secret";
  static final String CONFIG = "[[namespace]]\n"
      + "name = \"secure\"\n"
      + "prefix = \"secure/\"\n"
      + "token = \"" + SECURE_TOKEN + "\"\n\n"
      + "[[namespace]]\n"
      + "name = \"solo\"\n"
      + "prefix = \"solo/\"\n"
      + "max_sessions = 1\n";
  private static final Pattern NODE = Pattern.compile("^node (\\d+) pid (\\d+) ");

  public final int http;
  public final int grpc;
  public final int peer;
  public final int nodes;
  public final boolean tls;
  public final Path dir;
  public final List<String> endpoints = new ArrayList<>();
  public final Map<Integer, Long> nodePids = new ConcurrentHashMap<>();
  public final List<String> lines = java.util.Collections.synchronizedList(new ArrayList<>());
  private Process proc;

  public Cluster(int http, int grpc, int peer, int nodes, boolean tls) {
    this.http = http;
    this.grpc = grpc;
    this.peer = peer;
    this.nodes = nodes;
    this.tls = tls;
    try {
      this.dir = Files.createTempDirectory("lockd-java-");
    } catch (IOException e) {
      throw new IllegalStateException(e);
    }
    for (int i = 0; i < nodes; i++) {
      endpoints.add("127.0.0.1:" + (grpc + i));
    }
  }

  public Cluster start() {
    Path bin = Prereq.lockdBin();
    try {
      Path cfg = dir.resolve("ns.toml");
      Files.writeString(cfg, CONFIG);
      List<String> cmd = new ArrayList<>(List.of(bin.toString(), "dev", "--nodes",
          String.valueOf(nodes), "--http", "127.0.0.1:" + http, "--grpc", "127.0.0.1:" + grpc,
          "--peer", "127.0.0.1:" + peer, "--data-dir", dir.resolve("data").toString(),
          "--config", cfg.toString()));
      if (tls) {
        cmd.add("--tls");
      }
      ProcessBuilder pb = new ProcessBuilder(cmd)
          .redirectError(dir.resolve("stderr.log").toFile())
          .redirectInput(ProcessBuilder.Redirect.PIPE);
      proc = pb.start();
    } catch (IOException e) {
      throw new IllegalStateException("cannot start " + bin, e);
    }
    Thread reader = new Thread(this::read, "lockd-dev-stdout");
    reader.setDaemon(true);
    reader.start();
    waitUntil(() -> nodePids.size() == nodes, 20, "the dev nodes to start");
    waitHealthy(40);
    return this;
  }

  private void read() {
    try (BufferedReader r = new BufferedReader(new InputStreamReader(proc.getInputStream(),
        StandardCharsets.UTF_8))) {
      String line;
      while ((line = r.readLine()) != null) {
        lines.add(line);
        Matcher m = NODE.matcher(line);
        if (m.find()) {
          nodePids.put(Integer.parseInt(m.group(1)), Long.parseLong(m.group(2)));
        }
      }
    } catch (IOException ignored) {
      // the process ended
    }
  }

  /** A client of this cluster (with its CA under TLS). */
  public LockdClient.Builder client() {
    LockdClient.Builder b = LockdClient.builder(endpoints).ttl(Duration.ofSeconds(6));
    if (tls) {
      b.caFile(caFile());
    }
    return b;
  }

  /** A client of the given endpoints of this cluster. */
  public LockdClient.Builder client(List<String> eps) {
    LockdClient.Builder b = LockdClient.builder(eps).ttl(Duration.ofSeconds(6));
    if (tls) {
      b.caFile(caFile());
    }
    return b;
  }

  /**
   * Every live node answers and every group has a leader that sits where leader balance puts it,
   * so tests start from a settled cluster.
   */
  public void waitHealthy(double timeout) {
    List<String> live = new ArrayList<>();
    for (int i = 0; i < nodes; i++) {
      if (alive(i + 1)) {
        live.add(endpoints.get(i));
      }
    }
    try (LockdClient c = client(live).requestTimeout(Duration.ofSeconds(1)).build()) {
      waitUntil(() -> {
        for (String ep : live) {
          NodeStatus st = c.statusOf(ep);
          if (!st.servingNames()) {
            return false;
          }
          for (NodeStatus.GroupStatus g : st.groups()) {
            if (g.leader() == 0) {
              return false;
            }
            if (live.size() == nodes && g.preferredLeader() != 0
                && g.leader() != g.preferredLeader()) {
              return false;
            }
          }
        }
        return true;
      }, timeout, "every group to have its leader");
    }
  }

  public boolean alive(int node) {
    Long pid = nodePids.get(node);
    if (pid == null) {
      return false;
    }
    String st = procState(pid);
    return st != null && !st.equals("Z") && !st.equals("X");
  }

  /** The state letter of /proc/PID/stat (R, S, T for stopped, Z...), or null if gone. */
  public static String procState(long pid) {
    try {
      String s = Files.readString(Path.of("/proc/" + pid + "/stat"));
      return s.substring(s.lastIndexOf(')') + 2).split(" ")[0];
    } catch (IOException e) {
      return null;
    }
  }

  public String endpointOf(int node) {
    return endpoints.get(node - 1);
  }

  /** The throwaway CA of {@code lockd dev --tls}. */
  public Path caFile() {
    return dir.resolve("data").resolve("tls").resolve("ca.pem");
  }

  public String adminToken() {
    try {
      return Files.readString(dir.resolve("data").resolve("admin-token")).strip();
    } catch (IOException e) {
      throw new IllegalStateException(e);
    }
  }

  /** Sends {@code signal} (KILL, STOP, CONT) to node {@code node}'s process. */
  public void signal(int node, String signal) {
    Signals.send(nodePids.get(node), signal);
  }

  @Override
  public void close() {
    if (proc != null && proc.isAlive()) {
      Signals.send(proc.pid(), "TERM");
      try {
        if (!proc.waitFor(15, TimeUnit.SECONDS)) {
          Signals.send(proc.pid(), "KILL");
          proc.waitFor(5, TimeUnit.SECONDS);
        }
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }
    for (long pid : nodePids.values()) { // anything the supervisor left behind
      if (procState(pid) != null) {
        Signals.send(pid, "CONT");
        Signals.send(pid, "KILL");
      }
    }
    try (Stream<Path> s = Files.walk(dir)) {
      s.sorted(Comparator.reverseOrder()).forEach(p -> p.toFile().delete());
    } catch (IOException ignored) {
      // best effort
    }
  }

  /** Polls {@code cond} until it is true, at most {@code timeout} seconds. */
  public static void waitUntil(Supplier<Boolean> cond, double timeout, String what) {
    long end = System.nanoTime() + (long) (timeout * 1e9);
    Throwable last = null;
    while (System.nanoTime() < end) {
      try {
        if (Boolean.TRUE.equals(cond.get())) {
          return;
        }
      } catch (RuntimeException e) { // the cluster may still be electing
        last = e;
      }
      try {
        Thread.sleep(50);
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
        throw new AssertionError("interrupted waiting for " + what);
      }
    }
    throw new AssertionError("timed out after " + timeout + " s waiting for " + what
        + " (last error: " + last + ")");
  }
}
