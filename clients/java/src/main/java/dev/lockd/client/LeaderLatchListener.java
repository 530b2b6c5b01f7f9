package dev.lockd.client;

/** Told when a {@link LeaderLatch} gains or loses leadership (Curator's listener shape). Called
 * on the latch's thread: return soon. */
public interface LeaderLatchListener {
  /** This participant leads now. */
  void isLeader();

  /** This participant no longer leads (resigned, closed, or its lock was lost). */
  void notLeader();
}
