package dev.lockd.client;

import java.time.Duration;
import java.util.Optional;

/**
 * Leader election on one lock name: the holder of the exclusive lock leads, its owner string is
 * its campaign value and its fencing token numbers its term (a later term has a larger token).
 * For the Curator-shaped recipe see {@link LeaderLatch}.
 */
public final class Election {
  private final LockdClient client;
  private final String name;

  Election(LockdClient client, String name) {
    this.client = client;
    this.name = name;
  }

  public String name() {
    return name;
  }

  /**
   * Waits in line (FIFO, woken by the pushed grant) until this process leads, up to {@code wait}
   * ({@link LockdClient#FOREVER}: no end); {@link NotAcquiredException} when the wait ends first.
   * Interrupting the waiting thread stops the campaign.
   */
  public Leadership campaign(String value, Duration wait) {
    Lock lk = client.newLock(name).owner(value).waitFor(wait).acquire();
    return new Leadership(lk, value);
  }

  /** {@link #campaign(String, Duration)} with no end to the wait. */
  public Leadership campaign(String value) {
    return campaign(value, LockdClient.FOREVER);
  }

  /** The current leader, or empty (a linearizable read). */
  public Optional<Leader> leader() {
    LockState st = client.inspect(name);
    if (st.holders().isEmpty()) {
      return Optional.empty();
    }
    LockState.Holder h = st.holders().get(0);
    return Optional.of(new Leader(h.owner(), h.token(), h.sessionId()));
  }

  /**
   * The leader now, then at every change (empty: nobody leads), pushed by the service's watch:
   * no polling, and no change missed or repeated across a node that stops.
   */
  public Leaders observe() {
    return new Leaders(client, name);
  }
}
