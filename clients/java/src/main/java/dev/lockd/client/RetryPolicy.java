package dev.lockd.client;

import java.time.Duration;
import java.util.concurrent.ThreadLocalRandom;

/**
 * Exponential backoff with full jitter: retry {@code n} (from 0) sleeps a uniformly random time
 * in {@code [0, min(cap, base * 2^n)]}, but at least the service's retry-after; at most {@code
 * maxAttempts} attempts in all (the first included). The default (8 attempts, 50 ms doubling to
 * 2 s: about 6 s of retrying) rides out a leader election.
 */
public final class RetryPolicy {
  private final int maxAttempts;
  private final double base;
  private final double cap;

  /** The default: 8 attempts, 50 ms doubling to 2 s. */
  public static final RetryPolicy DEFAULT = new RetryPolicy(8, Duration.ofMillis(50),
      Duration.ofSeconds(2));

  public RetryPolicy(int maxAttempts, Duration base, Duration cap) {
    if (maxAttempts < 1) {
      throw new InvalidArgumentException(
          "retry maxAttempts must be at least 1 (got " + maxAttempts + ")");
    }
    double b = base.toNanos() / 1e9;
    double c = cap.toNanos() / 1e9;
    if (!(0 <= b && b <= c)) {
      throw new InvalidArgumentException(
          "retry base must lie in 0..=cap (got base=" + base + ", cap=" + cap + ")");
    }
    this.maxAttempts = maxAttempts;
    this.base = b;
    this.cap = c;
  }

  public int maxAttempts() {
    return maxAttempts;
  }

  /** Seconds to sleep before retry number {@code attempt} (0 = the first retry). */
  double delay(int attempt, double retryAfter) {
    double ceiling = Math.min(cap, base * Math.pow(2, Math.min(attempt, 20)));
    double r = ThreadLocalRandom.current().nextDouble() * ceiling;
    return Math.max(r, retryAfter);
  }

  /** {@link #delay(int, double)} with the hint of {@code e}, if any. */
  double delay(int attempt, LockdException e) {
    return delay(attempt, e == null ? 0 : e.retryAfter().map(d -> d.toNanos() / 1e9).orElse(0.0));
  }

  /** The ceiling of retry {@code attempt}'s delay without a hint (for tests). */
  double ceiling(int attempt) {
    return Math.min(cap, base * Math.pow(2, Math.min(attempt, 20)));
  }
}
