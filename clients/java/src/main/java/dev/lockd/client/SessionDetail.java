package dev.lockd.client;

import java.util.List;

/**
 * One session's holds and waits in every group.
 *
 * @param unavailableGroups lock groups that could not answer: holds and waits there are not
 *     listed
 */
public record SessionDetail(String sessionId, String client, long ttlMs, List<HeldLock> held,
    List<QueuedWait> waits, List<Integer> unavailableGroups) {

  /** A lock the session holds, and the group it lives in. */
  public record HeldLock(String name, long token, int group) {}

  /** A wait the session has queued. */
  public record QueuedWait(String name, int queuePosition, int group) {}

  static SessionDetail fromProto(dev.lockd.v1.SessionDetail s) {
    return new SessionDetail(s.getSessionId(), s.getClient(), s.getTtlMs(),
        s.getHeldList().stream()
            .map(h -> new HeldLock(h.getName(), h.getFencingToken(), h.getGroup())).toList(),
        s.getWaitsList().stream()
            .map(w -> new QueuedWait(w.getName(), w.getQueuePosition(), w.getGroup())).toList(),
        List.copyOf(s.getUnavailableGroupsList()));
  }
}
