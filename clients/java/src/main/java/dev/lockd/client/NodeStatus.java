package dev.lockd.client;

import java.util.List;

/** A node and the groups it hosts (group 0 is the meta group). */
public record NodeStatus(long nodeId, int pid, List<GroupStatus> groups, boolean servingNames) {

  /** One Raft group as the node sees it. */
  public record GroupStatus(int id, long leader, long term, List<Long> members, long appliedIndex,
      long revision, long preferredLeader) {}

  static NodeStatus fromProto(dev.lockd.v1.StatusResponse s) {
    return new NodeStatus(s.getNodeId(), s.getPid(),
        s.getGroupsList().stream().map(g -> new GroupStatus(g.getId(), g.getLeader(), g.getTerm(),
            List.copyOf(g.getMembersList()), g.getAppliedIndex(), g.getRevision(),
            g.getPreferredLeader())).toList(),
        s.getServingNames());
  }
}
