package dev.lockd.client;

import java.util.List;

/**
 * One change of a watched name, at log {@code index} of lock group {@code group}, at group time
 * {@code timeMs} (docs/API.md, "Watch").
 *
 * <p>{@code kind}: {@code hold_started}, {@code hold_ended}, {@code hold_moved_out}, {@code
 * hold_moved_in}, {@code wait_started} or {@code wait_ended}. {@code cause}: for {@code
 * hold_ended} {@code release}, {@code close}, {@code expire} or {@code dropped}; for {@code
 * wait_ended} {@code timed_out}, {@code session_ended} or {@code moved}. {@code sessionId} is
 * empty unless the client presents the admin token. Fields that do not apply to a kind are 0 or
 * empty. {@code unixMs} is the sending node's wall clock, for display.
 */
public record WatchEvent(int group, long index, long timeMs, String kind, String name,
    String sessionId, String owner, long token, Mode mode, int limit, String cause, long waiter,
    int position, long deadlineMs, long waitedMs, long heldMs, long lockDelayUntilMs,
    long leaseTtlMs, long unixMs, List<Position> resume) {

  /** Where a watch is in one lock group: past entry {@code index}, or past its first {@code
   * events} events. */
  public record Position(int group, long index, int events) {}

  static WatchEvent fromProto(dev.lockd.v1.WatchEvent e) {
    return new WatchEvent(e.getGroup(), e.getIndex(), e.getTimeMs(), e.getKind(), e.getName(),
        e.getSessionId(), e.getOwner(), e.getFencingToken(), Mode.fromProto(e.getMode()),
        e.getLimit(), e.getCause(), e.getWaiter(), e.getPosition(), e.getDeadlineMs(),
        e.getWaitedMs(), e.getHeldMs(), e.getLockDelayUntilMs(), e.getLeaseTtlMs(), e.getUnixMs(),
        e.getResumeList().stream().map(p -> new Position(p.getGroup(), p.getIndex(),
            p.getEvents())).toList());
  }
}
