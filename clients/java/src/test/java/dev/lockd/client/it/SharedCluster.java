package dev.lockd.client.it;

import org.junit.jupiter.api.extension.ExtensionContext;

/**
 * The one cluster the test classes share (started at first use, stopped when the whole run
 * ends), on ports of the Java suite's own range (19500-19899).
 */
public final class SharedCluster {
  private SharedCluster() {}

  /** Closed by JUnit at the end of the run (an AutoCloseable in the root store). */
  private static final class Holder implements AutoCloseable {
    final Cluster cluster;

    Holder(Cluster c) {
      this.cluster = c;
    }

    @Override
    public void close() {
      cluster.close();
    }
  }

  /** The shared cluster: http 19500, grpc 19600, peer 19700 (+ node - 1). */
  public static Cluster get(ExtensionContext ctx) {
    return ctx.getRoot().getStore(ExtensionContext.Namespace.GLOBAL).getOrComputeIfAbsent(
        "lockd-shared-cluster", k -> {
          Cluster c = new Cluster(19500, 19600, 19700, 3, false);
          try {
            c.start();
          } catch (RuntimeException | Error e) {
            c.close();
            throw e;
          }
          return new Holder(c);
        }, Holder.class).cluster;
  }
}
