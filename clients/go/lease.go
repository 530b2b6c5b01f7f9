package lockd

// The client's side of a session's leases: when it must stop believing it holds its locks.
//
// Each lock group keeps its own lease for a session (docs/API.md, "Leases per group"). A
// keepalive reply says what each group answered; every grant says which group made it and the
// group's move count then. groupLeases is the rule, pure (time is an input) so that it is
// tested without a service; sessionLease (a session) and lockLease (one hold) are what the
// lock objects watch. The rule is the Python client's _lease.py and lockd-client's
// (crates/lockd-client/src/lease.rs, GroupLeases), ported line by line.

import (
	"fmt"
	"math"
	"sort"
	"sync"
	"time"

	"github.com/lockd-dev/lockd/clients/go/internal/pb"
)

// clockBase anchors the client's monotonic clock: every instant is seconds since it, measured
// with the monotonic reading Go keeps in time.Time (never the wall clock).
var clockBase = time.Now()

func monotonic() float64 { return time.Since(clockBase).Seconds() }

// instantTime turns an instant on the client's clock into a time.Time (monotonic reading kept).
func instantTime(t float64) time.Time {
	if math.IsInf(t, -1) {
		return clockBase
	}
	return clockBase.Add(time.Duration(t * float64(time.Second)))
}

const (
	stateExtended    = pb.GroupLeaseState_GROUP_LEASE_STATE_EXTENDED
	stateNotHere     = pb.GroupLeaseState_GROUP_LEASE_STATE_NOT_HERE
	stateUnreachable = pb.GroupLeaseState_GROUP_LEASE_STATE_UNREACHABLE
)

// renewOutcome is what a keepalive reply did to the session-wide deadline.
type renewOutcome int

const (
	renewExtended renewOutcome = iota
	renewUnchanged
	renewRestarted
	renewTooLate
	renewGone
)

func (r renewOutcome) String() string {
	return [...]string{"extended", "unchanged", "restarted", "too_late", "gone"}[r]
}

// holdLease is which lease a hold follows, as of its grant (groupLeases.granted).
type holdLease struct {
	group      uint32 // the lock group that granted it
	groupMoves uint64 // the group's move count at the grant
	epoch      int    // the group's lease epoch at the grant
	allEpoch   int    // groupLeases.allEpoch at the grant
}

type groupState struct {
	// Send time of the last keepalive this group extended + its ttl - margin; absent while the
	// session has no lease there that the client knows of (after not_here).
	deadline    float64
	hasDeadline bool
	// The highest move count the group reported (in a keepalive answer or a grant).
	moves uint64
	epoch int
	// When the first grant of this epoch arrived.
	firstGrant    float64
	hasFirstGrant bool
	// Ended epochs: when each counts as having ended (at or before the client learnt it).
	endedAt map[int]float64
	// Why the group last could not answer; cleared when it extends.
	err string
}

func newGroupState(deadline float64, has bool, moves uint64) *groupState {
	return &groupState{deadline: deadline, hasDeadline: has, moves: moves, endedAt: map[int]float64{}}
}

// groupLeases is a session's leases, one per lock group, and the session-wide one. Pure: every
// time is an input (monotonic seconds). Each deadline is send time of a renewal + TTL -
// margin, and moves only forward. See the Python client's _lease.py GroupLeases for the rule
// in full; the comments on each method say the part it implements.
type groupLeases struct {
	ttl, margin float64
	deadlineAll float64
	// Bumped when deadlineAll restarts after it had passed (a hold records it).
	allEpoch int
	// Ended allEpoch values: the deadlineAll each ended at.
	allEndedAt map[int]float64
	groups     map[uint32]*groupState
	// When every group answered not_here (the session is gone).
	goneAt    float64
	hasGoneAt bool
	// Counts the changes that can make a hold (or the session) lost before its deadline as
	// last computed.
	changes int
	// The lock group that opened the session (absent: a service that opens sessions in every
	// group; then every keepalive asks every group).
	home    uint32
	hasHome bool
	// When the session last used each group: keepalives go on naming a group for one TTL after.
	used map[uint32]float64
	// The send time of the earliest acquire whose answer a broken stream took.
	unsureSince    float64
	hasUnsureSince bool
	// Send time + ttl - margin of the last keepalive that asked every group (or of the open).
	everyDeadline float64
}

func newGroupLeases(sent, ttl, margin float64) *groupLeases {
	return &groupLeases{
		ttl: ttl, margin: margin, deadlineAll: sent + ttl - margin,
		allEndedAt: map[int]float64{}, groups: map[uint32]*groupState{},
		used: map[uint32]float64{}, everyDeadline: sent + ttl - margin,
	}
}

// homed: the open sent at sent was answered by lock group home (0: a service that opens
// sessions in every group). Its lease there started after sent.
func (l *groupLeases) homed(home uint32, sent, now float64) {
	if home == 0 {
		return
	}
	l.home, l.hasHome = home, true
	l.started(home, sent, 0, now)
}

// keepaliveGroups is the groups a keepalive sent at now should renew (empty: every group).
func (l *groupLeases) keepaliveGroups(holds []holdLease, waits []uint32, unsure bool, now float64) []uint32 {
	if !l.hasHome {
		return nil
	}
	named := map[uint32]bool{l.home: true}
	moved := false
	for _, h := range holds {
		st, ok := l.groups[h.group]
		moved = moved || !ok || st.moves != h.groupMoves
		named[h.group] = true
	}
	for _, w := range waits {
		named[w] = true
	}
	for g := range named {
		l.used[g] = now
	}
	for g, t := range l.used {
		if !(t+l.ttl > now) {
			delete(l.used, g)
		}
	}
	if unsure || moved {
		return nil
	}
	for g := range l.used {
		named[g] = true
	}
	out := make([]uint32, 0, len(named))
	for g := range named {
		out = append(out, g)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// noteUnsure: an acquire sent at sent lost its answer with a broken stream.
func (l *groupLeases) noteUnsure(sent float64) {
	if !l.hasUnsureSince || sent < l.unsureSince {
		l.unsureSince, l.hasUnsureSince = sent, true
	}
}

// started: a request sent at sent started the session's lease in group (lease_started). A
// lease the client knew there before has ended, unless a grant of it arrived after sent.
func (l *groupLeases) started(group uint32, sent float64, ttlMs uint64, now float64) {
	l.used[group] = now
	d := l.deadlineFor(sent, ttlMs)
	st, ok := l.groups[group]
	if !ok {
		l.groups[group] = newGroupState(d, true, 0)
		return
	}
	if !st.hasDeadline {
		st.deadline, st.hasDeadline = d, true
	} else if !st.hasFirstGrant || st.firstGrant <= sent {
		l.endEpoch(st, math.Min(st.deadline, now))
		st.deadline = d
	}
}

// sessionDeadline is the latest of deadlineAll and every group's deadline; once every group
// answered not_here, when that answer arrived.
func (l *groupLeases) sessionDeadline() float64 {
	d := l.deadlineAll
	for _, st := range l.groups {
		if st.hasDeadline && st.deadline > d {
			d = st.deadline
		}
	}
	if l.hasGoneAt {
		d = math.Min(d, l.goneAt)
	}
	return d
}

func (l *groupLeases) sessionExpired(now float64) bool { return now >= l.sessionDeadline() }

// deadlineFor is sent + ttl - margin for a renewal granting ttlMs (never more than the TTL of
// the open; 0 counts as that TTL).
func (l *groupLeases) deadlineFor(sent float64, ttlMs uint64) float64 {
	ttl := l.ttl
	if ttlMs > 0 {
		ttl = math.Min(l.ttl, float64(ttlMs)/1000.0)
	}
	return sent + ttl - l.margin
}

// renewed: a keepalive (or attach) sent at sent was answered at now. named: the keepalive
// named its groups. Returns what became of deadlineAll (or tooLate / gone).
func (l *groupLeases) renewed(sent float64, ttlMs uint64, groups []*pb.GroupLease, now float64, named bool) renewOutcome {
	if l.sessionExpired(now) {
		return renewTooLate
	}
	every := true
	if named {
		for _, gl := range groups {
			st, ok := l.groups[gl.GetGroup()]
			if gl.GetState() == stateExtended && ok && gl.GetGroupMoves() > st.moves {
				every = false
				break
			}
		}
	}
	if len(groups) == 0 {
		for _, known := range l.groups {
			l.extended(known, sent, ttlMs, known.moves, now)
		}
	}
	for _, gl := range groups {
		switch gl.GetState() {
		case stateExtended:
			st, ok := l.groups[gl.GetGroup()]
			if !ok {
				l.groups[gl.GetGroup()] = newGroupState(l.deadlineFor(sent, gl.GetTtlMs()), true, gl.GetGroupMoves())
			} else {
				l.extended(st, sent, gl.GetTtlMs(), gl.GetGroupMoves(), now)
			}
		case stateNotHere:
			l.notHere(gl.GetGroup(), sent, now)
		default:
			every = false
			if st, ok := l.groups[gl.GetGroup()]; ok {
				st.err = gl.GetError()
				if st.err == "" {
					st.err = "unreachable"
				}
			}
		}
	}
	if len(groups) > 0 {
		allNotHere := true
		for _, gl := range groups {
			if gl.GetState() != stateNotHere {
				allNotHere = false
				break
			}
		}
		if allNotHere {
			l.goneAt, l.hasGoneAt = now, true
			l.changes++
			return renewGone
		}
	}
	if !every {
		return renewUnchanged
	}
	d := l.deadlineFor(sent, ttlMs)
	if !named {
		l.everyDeadline = math.Max(l.everyDeadline, d)
	}
	if now >= l.deadlineAll {
		if d <= now {
			return renewUnchanged
		}
		l.allEndedAt[l.allEpoch] = l.deadlineAll
		l.allEpoch++
		l.deadlineAll = d
		l.changes++
		return renewRestarted
	}
	if d > l.deadlineAll {
		l.deadlineAll = d
		return renewExtended
	}
	return renewUnchanged
}

func (l *groupLeases) raiseMoves(st *groupState, moves uint64) {
	if moves > st.moves {
		st.moves = moves
		l.changes++
	}
}

func (l *groupLeases) extended(st *groupState, sent float64, ttlMs uint64, moves uint64, now float64) {
	l.raiseMoves(st, moves)
	st.err = ""
	d := l.deadlineFor(sent, ttlMs)
	if st.hasDeadline && now >= st.deadline {
		// Too late for the holds of this epoch; the group's lease goes on for later grants.
		l.endEpoch(st, st.deadline)
		st.deadline = d
	} else if !st.hasDeadline || d > st.deadline {
		st.deadline, st.hasDeadline = d, true
	}
}

// renewedIn: an acquire sent at sent was granted or queued in group, and the group's leader
// renewed the session's lease there as it did. Counted as a keepalive sent at sent that only
// group answered; deadlineAll is untouched. A lost session stays lost.
func (l *groupLeases) renewedIn(group uint32, sent float64, ttlMs, groupMoves uint64, now float64) {
	if l.sessionExpired(now) {
		return
	}
	l.used[group] = now
	st, ok := l.groups[group]
	if !ok {
		l.groups[group] = newGroupState(l.deadlineFor(sent, ttlMs), true, groupMoves)
	} else {
		l.extended(st, sent, ttlMs, groupMoves, now)
	}
}

// groupEnded: the service pushed SessionEnded for group, which arrived at at: as a not_here
// answer to a keepalive sent at at.
func (l *groupLeases) groupEnded(group uint32, at float64) { l.notHere(group, at, at) }

func (l *groupLeases) notHere(group uint32, sent, now float64) {
	st, ok := l.groups[group]
	if !ok {
		return
	}
	if st.hasFirstGrant && st.firstGrant > sent {
		// Every grant of this epoch arrived after the keepalive was sent: nothing is known to end.
		return
	}
	if st.hasFirstGrant {
		at := now
		if st.hasDeadline {
			at = math.Min(st.deadline, now)
		}
		l.endEpoch(st, at)
	}
	st.hasDeadline = false
	st.deadline = 0
	l.changes++
}

func (l *groupLeases) endEpoch(st *groupState, at float64) {
	st.endedAt[st.epoch] = at
	st.epoch++
	st.hasFirstGrant = false
	l.changes++
}

// granted: a hold granted by group at its move count groupMoves, for an acquire sent at sent
// and answered at now, with the session's lease leaseTTLMs. others: the earliest send of
// another acquire still unanswered (hasOthers false: none).
func (l *groupLeases) granted(sent, now float64, group uint32, groupMoves, leaseTTLMs uint64, others float64, hasOthers bool) holdLease {
	st, ok := l.groups[group]
	if !ok {
		st = newGroupState(0, false, groupMoves)
		l.groups[group] = st
	}
	if !st.hasDeadline {
		start := math.Min(l.deadlineFor(sent, leaseTTLMs), l.everyDeadline)
		if l.hasHome {
			unknown, has := 0.0, false
			if hasOthers {
				unknown, has = others, true
			}
			if l.hasUnsureSince && (!has || l.unsureSince < unknown) {
				unknown, has = l.unsureSince, true
			}
			if has {
				start = math.Min(start, l.deadlineFor(unknown, 0))
			}
		}
		st.deadline, st.hasDeadline = start, true
	}
	l.raiseMoves(st, groupMoves)
	if !st.hasFirstGrant {
		st.firstGrant, st.hasFirstGrant = now, true
	}
	l.used[group] = now
	return holdLease{group: group, groupMoves: groupMoves, epoch: st.epoch, allEpoch: l.allEpoch}
}

// deadlineOf is the per-lock rule: when hold counts as lost, apart from the session's own end.
func (l *groupLeases) deadlineOf(h holdLease) float64 {
	if st, ok := l.groups[h.group]; ok {
		if st.epoch != h.epoch {
			if at, ok := st.endedAt[h.epoch]; ok {
				return at
			}
			return math.Inf(-1)
		}
		if st.moves == h.groupMoves && st.hasDeadline {
			return st.deadline
		}
	}
	if h.allEpoch != l.allEpoch {
		if at, ok := l.allEndedAt[h.allEpoch]; ok {
			return at
		}
		return math.Inf(-1)
	}
	return l.deadlineAll
}

// lockDeadline is when hold counts as lost, the session's end included.
func (l *groupLeases) lockDeadline(h holdLease) float64 {
	return math.Min(l.deadlineOf(h), l.sessionDeadline())
}

func (l *groupLeases) whyLost(h holdLease) string {
	st, ok := l.groups[h.group]
	if ok && st.epoch != h.epoch {
		return fmt.Sprintf("the session's lease in lock group %d ended", h.group)
	}
	if ok && st.moves == h.groupMoves && st.hasDeadline {
		why := fmt.Sprintf("the local lease deadline of lock group %d passed without a renewal", h.group)
		if st.err != "" {
			why += fmt.Sprintf(" (the group could not answer: %s)", st.err)
		}
		return why
	}
	return fmt.Sprintf("a bucket moved in or out of lock group %d and the session-wide deadline "+
		"passed before every lock group renewed the lease", h.group)
}

// watched is a lost signal fired once: a channel closed when it fires, and callbacks.
type watched struct {
	mu       sync.Mutex
	lost     bool
	why      string
	ch       chan struct{}
	watchers map[int]func()
	nextID   int
}

func newWatched() watched { return watched{ch: make(chan struct{}), watchers: map[int]func(){}} }

func (w *watched) fire(why string) bool {
	w.mu.Lock()
	if w.lost {
		w.mu.Unlock()
		return false
	}
	w.lost = true
	w.why = why
	close(w.ch)
	cbs := w.watchers
	w.watchers = nil
	w.mu.Unlock()
	for _, cb := range cbs {
		cb()
	}
	return true
}

func (w *watched) isFired() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.lost
}

func (w *watched) reason() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.why
}

// watch calls cb once when fired (at once if already fired); returns an id for unwatch.
func (w *watched) watch(cb func()) int {
	w.mu.Lock()
	if w.lost {
		w.mu.Unlock()
		cb()
		return -1
	}
	w.nextID++
	id := w.nextID
	w.watchers[id] = cb
	w.mu.Unlock()
	return id
}

func (w *watched) unwatch(id int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.watchers, id)
}

// sessionLease is one session as its locks see it: its per-group leases and whether it is
// lost, which is final. leases is read and written under the client's engine lock.
type sessionLease struct {
	watched
	gen       int
	sessionID string
	leases    *groupLeases
	engine    *sync.Mutex // the client's engine lock, which guards leases
}

func (s *sessionLease) deadline() float64 {
	s.engine.Lock()
	defer s.engine.Unlock()
	return s.leases.sessionDeadline()
}

// isLost: lost, or past the local deadline (against the clock, so that a process resumed after
// a pause sees it before the engine's timer has run).
func (s *sessionLease) isLost() bool {
	return s.isFired() || monotonic() >= s.deadline()
}

func (s *sessionLease) end(why string) { s.fire(why) }

// lockLease is one hold's lease: lost when its session is, at its own deadline, or when its
// group's lease epoch ended.
type lockLease struct {
	watched
	session *sessionLease
	hold    holdLease
	sessID  int
}

func newLockLease(s *sessionLease, h holdLease) *lockLease {
	l := &lockLease{watched: newWatched(), session: s, hold: h}
	l.sessID = s.watch(func() { l.fire(s.reason()) })
	return l
}

// deadlineLocked is the lock's local deadline; the engine lock must be held.
func (l *lockLease) deadlineLocked() float64 { return l.session.leases.lockDeadline(l.hold) }

func (l *lockLease) deadline() float64 {
	l.session.engine.Lock()
	defer l.session.engine.Unlock()
	return l.deadlineLocked()
}

func (l *lockLease) isLost() bool {
	return l.isFired() || l.session.isFired() || monotonic() >= l.deadline()
}

func (l *lockLease) end(why string) {
	if l.fire(why) {
		l.session.unwatch(l.sessID)
	}
}

// detach stops following the session (a released lock).
func (l *lockLease) detach() { l.session.unwatch(l.sessID) }
