package dev.lockd.client;

import java.time.Duration;
import java.util.Optional;
import java.util.concurrent.TimeoutException;

/**
 * An election's leader now, then at every change ({@link Election#observe()}); empty: nobody
 * leads. One consumer at a time; {@link #close()} ends it.
 */
public final class Leaders implements AutoCloseable {
  private final LockdClient client;
  private final String name;
  private final Watch watch;
  private Leader current;
  private boolean started;

  Leaders(LockdClient client, String name) {
    this.client = client;
    this.name = name;
    this.watch = client.watch(name);
  }

  /** The leader now (the first call), then the next change, waiting as long as it takes. */
  public Optional<Leader> next() {
    try {
      return next(null);
    } catch (TimeoutException e) {
      throw new IllegalStateException(e);
    }
  }

  /**
   * The leader now (the first call), then the next change; {@link TimeoutException} after
   * {@code timeout} without one (nothing is lost).
   */
  public synchronized Optional<Leader> next(Duration timeout) throws TimeoutException {
    if (!started) {
      // Watch first, then read: a change in between shows in the watch, and the token
      // comparison below drops what the read already saw.
      watch.open();
      LockState st = client.inspect(name);
      current = st.holders().isEmpty() ? null : new Leader(st.holders().get(0).owner(),
          st.holders().get(0).token(), st.holders().get(0).sessionId());
      started = true;
      return Optional.ofNullable(current);
    }
    double end = timeout == null ? Double.POSITIVE_INFINITY
        : Clock.now() + LockdClient.seconds(timeout, "timeout");
    while (true) {
      Duration left = end == Double.POSITIVE_INFINITY ? null
          : Duration.ofNanos((long) (Math.max(0, end - Clock.now()) * 1e9));
      WatchEvent e = watch.next(left);
      Long now = current == null ? null : current.token();
      if ("hold_started".equals(e.kind()) && (now == null || e.token() > now)) {
        current = new Leader(e.owner(), e.token(), e.sessionId());
        return Optional.of(current);
      }
      if ("hold_ended".equals(e.kind()) && now != null && now == e.token()) {
        current = null;
        return Optional.empty();
      }
    }
  }

  @Override
  public void close() {
    watch.close();
  }
}
