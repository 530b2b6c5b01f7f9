package dev.lockd.client;

/**
 * The monotonic clock every local deadline is measured on: seconds since this class loaded,
 * from {@link System#nanoTime()} (never the wall clock, which can jump).
 */
final class Clock {
  private Clock() {}

  private static final long ORIGIN = System.nanoTime();

  /** Now, in seconds on the monotonic clock. */
  static double now() {
    return (System.nanoTime() - ORIGIN) / 1e9;
  }

  /** Nanoseconds from now until {@code at} (seconds on this clock), at least 0. */
  static long nanosUntil(double at) {
    double d = (at - now()) * 1e9;
    if (d <= 0) {
      return 0;
    }
    return d >= Long.MAX_VALUE ? Long.MAX_VALUE : (long) d;
  }
}
