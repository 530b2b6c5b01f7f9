package lockd

import (
	"time"

	"github.com/lockd-dev/lockd/clients/go/internal/pb"
)

// Holder is one holder of a lock. SessionID is empty unless the client presents the admin token.
type Holder struct {
	Owner     string
	Token     uint64
	Mode      Mode
	HeldFor   time.Duration
	Reentry   uint32
	SessionID string
}

// Waiter is one waiter in a lock's FIFO queue (Position 1 = head).
type Waiter struct {
	Owner     string
	Mode      Mode
	Position  uint32
	WaitedFor time.Duration
	SessionID string
}

// LockState is a linearizable view of one name.
type LockState struct {
	Name      string
	Namespace string
	Holders   []Holder
	Waiters   []Waiter
	// Group time a pending lock-delay ends (0 = none).
	LockDelayUntilMs uint64
}

func lockStateFromPB(s *pb.LockState) *LockState {
	out := &LockState{Name: s.GetName(), Namespace: s.GetNamespace(), LockDelayUntilMs: s.GetLockDelayUntilMs()}
	for _, h := range s.GetHolders() {
		out.Holders = append(out.Holders, Holder{Owner: h.GetOwner(), Token: h.GetFencingToken(),
			Mode: modeFromPB(h.GetMode()), HeldFor: time.Duration(h.GetHeldForMs()) * time.Millisecond,
			Reentry: h.GetReentry(), SessionID: h.GetSessionId()})
	}
	for _, w := range s.GetWaiters() {
		out.Waiters = append(out.Waiters, Waiter{Owner: w.GetOwner(), Mode: modeFromPB(w.GetMode()),
			Position: w.GetPosition(), WaitedFor: time.Duration(w.GetWaitedMs()) * time.Millisecond,
			SessionID: w.GetSessionId()})
	}
	return out
}

// GroupStatus is one Raft group as a node sees it (group 0 is the meta group).
type GroupStatus struct {
	ID              uint32
	Leader          uint64
	Term            uint64
	Members         []uint64
	AppliedIndex    uint64
	Revision        uint64
	PreferredLeader uint64
}

// NodeStatus is a node and the groups it hosts.
type NodeStatus struct {
	NodeID       uint64
	PID          uint32
	Groups       []GroupStatus
	ServingNames bool
}

func nodeStatusFromPB(s *pb.StatusResponse) *NodeStatus {
	out := &NodeStatus{NodeID: s.GetNodeId(), PID: s.GetPid(), ServingNames: s.GetServingNames()}
	for _, g := range s.GetGroups() {
		out.Groups = append(out.Groups, GroupStatus{ID: g.GetId(), Leader: g.GetLeader(), Term: g.GetTerm(),
			Members: g.GetMembers(), AppliedIndex: g.GetAppliedIndex(), Revision: g.GetRevision(),
			PreferredLeader: g.GetPreferredLeader()})
	}
	return out
}

// HeldLock is one hold of a session, as the service lists it.
type HeldLock struct {
	Name  string
	Token uint64
	Group uint32
}

// QueuedWait is one queued wait of a session.
type QueuedWait struct {
	Name          string
	QueuePosition uint32
	Group         uint32
}

// SessionDetail is one session's holds and waits in every group.
type SessionDetail struct {
	SessionID string
	Client    string
	TTL       time.Duration
	Held      []HeldLock
	Waits     []QueuedWait
	// Lock groups that could not answer: what the session holds or waits for there is not listed.
	UnavailableGroups []uint32
}

func sessionDetailFromPB(s *pb.SessionDetail) *SessionDetail {
	out := &SessionDetail{SessionID: s.GetSessionId(), Client: s.GetClient(),
		TTL: time.Duration(s.GetTtlMs()) * time.Millisecond, UnavailableGroups: s.GetUnavailableGroups()}
	for _, h := range s.GetHeld() {
		out.Held = append(out.Held, HeldLock{Name: h.GetName(), Token: h.GetFencingToken(), Group: h.GetGroup()})
	}
	for _, w := range s.GetWaits() {
		out.Waits = append(out.Waits, QueuedWait{Name: w.GetName(), QueuePosition: w.GetQueuePosition(), Group: w.GetGroup()})
	}
	return out
}

// WatchPosition is how far a watch got in one lock group.
type WatchPosition struct {
	Group  uint32
	Index  uint64
	Events uint32
}

// WatchEvent is one change of who holds or waits for a name (docs/API.md, "Watch").
type WatchEvent struct {
	Group  uint32
	Index  uint64
	TimeMs uint64
	// hold_started, hold_ended, hold_moved_out, hold_moved_in, wait_started or wait_ended.
	Kind string
	Name string
	// The holder's or waiter's session: shown to the admin only.
	SessionID string
	Owner     string
	// The hold's fencing token (hold_*).
	Token uint64
	Mode  Mode
	Limit uint32
	// hold_ended: release, close, expire or dropped; wait_ended: timed_out, session_ended, moved.
	Cause            string
	Waiter           uint64
	Position         uint32
	DeadlineMs       uint64
	WaitedMs         uint64
	HeldMs           uint64
	LockDelayUntilMs uint64
	LeaseTTLMs       uint64
	UnixMs           uint64
	// Where the watch is after this event, every group it covers.
	Resume []WatchPosition
}

func watchEventFromPB(e *pb.WatchEvent) WatchEvent {
	out := WatchEvent{Group: e.GetGroup(), Index: e.GetIndex(), TimeMs: e.GetTimeMs(), Kind: e.GetKind(),
		Name: e.GetName(), SessionID: e.GetSessionId(), Owner: e.GetOwner(), Token: e.GetFencingToken(),
		Mode: modeFromPB(e.GetMode()), Limit: e.GetLimit(), Cause: e.GetCause(), Waiter: e.GetWaiter(),
		Position: e.GetPosition(), DeadlineMs: e.GetDeadlineMs(), WaitedMs: e.GetWaitedMs(),
		HeldMs: e.GetHeldMs(), LockDelayUntilMs: e.GetLockDelayUntilMs(), LeaseTTLMs: e.GetLeaseTtlMs(),
		UnixMs: e.GetUnixMs()}
	for _, p := range e.GetResume() {
		out.Resume = append(out.Resume, WatchPosition{Group: p.GetGroup(), Index: p.GetIndex(), Events: p.GetEvents()})
	}
	return out
}

// Leader is an election's leader: its campaign value (the lock's owner), its term's fencing
// token, and its session (shown to the admin only).
type Leader struct {
	Value     string
	Token     uint64
	SessionID string
}
