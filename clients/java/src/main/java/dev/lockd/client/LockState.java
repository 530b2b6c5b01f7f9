package dev.lockd.client;

import java.util.List;

/**
 * A linearizable view of one name: its holders, its FIFO queue and a pending lock-delay.
 *
 * @param name the name
 * @param namespace the namespace it falls into
 * @param holders empty when free
 * @param waiters in queue order
 * @param lockDelayUntilMs group time a pending lock-delay ends (0 = none)
 */
public record LockState(String name, String namespace, List<Holder> holders,
    List<Waiter> waiters, long lockDelayUntilMs) {

  /**
   * One holder. {@code sessionId} is empty unless the client presents the admin token.
   */
  public record Holder(String owner, long token, Mode mode, long heldForMs, int reentry,
      String sessionId) {}

  /** One waiter in the FIFO queue (position 1 = head). */
  public record Waiter(String owner, Mode mode, int position, long waitedMs, String sessionId) {}

  static LockState fromProto(dev.lockd.v1.LockState s) {
    return new LockState(s.getName(), s.getNamespace(),
        s.getHoldersList().stream().map(h -> new Holder(h.getOwner(), h.getFencingToken(),
            Mode.fromProto(h.getMode()), h.getHeldForMs(), h.getReentry(), h.getSessionId()))
            .toList(),
        s.getWaitersList().stream().map(w -> new Waiter(w.getOwner(), Mode.fromProto(w.getMode()),
            w.getPosition(), w.getWaitedMs(), w.getSessionId())).toList(),
        s.getLockDelayUntilMs());
  }
}
