package lockd

// Leases per group (docs/API.md, "Leases per group"): the rule on synthetic replies. A port of
// the Python client's tests/test_unit.py (and through it lockd-client's lease.rs tests), one
// table entry per Python test, the same numbers.

import (
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/lockd-dev/lockd/clients/go/internal/pb"
)

const ttlS, marginS = 15.0, 3.0 // the default margin is TTL/5

func ext(group uint32, moves uint64, ttlMs ...uint64) *pb.GroupLease {
	t := uint64(15_000)
	if len(ttlMs) > 0 {
		t = ttlMs[0]
	}
	return &pb.GroupLease{Group: group, State: stateExtended, TtlMs: t, GroupMoves: moves}
}

func notHereGL(group uint32) *pb.GroupLease {
	return &pb.GroupLease{Group: group, State: stateNotHere}
}

// other: UNREACHABLE, the group could not answer (no leader, node down).
func other(group uint32) *pb.GroupLease {
	return &pb.GroupLease{Group: group, State: stateUnreachable, Error: "group 1: no leader"}
}

func gls(g ...*pb.GroupLease) []*pb.GroupLease { return g }

type tb struct{ *testing.T }

func (t tb) eq(got, want any, what string) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: got %v, want %v", what, got, want)
	}
}

func (t tb) ok(cond bool, what string) {
	t.Helper()
	if !cond {
		t.Fatalf("%s", what)
	}
}

func grant(l *groupLeases, sent, now float64, group uint32, moves uint64) holdLease {
	return l.granted(sent, now, group, moves, 15_000, 0, false)
}

var leaseRuleTests = []struct {
	name string
	run  func(t tb)
}{
	{"a lock follows its group's deadline while the move count holds", func(t tb) {
		// Group 1 cannot answer, group 2 keeps extending for longer than the TTL: a lock in group
		// 2 stays held and the session goes on; a lock in group 1 is lost at group 1's deadline.
		l := newGroupLeases(100, ttlS, marginS)
		t.eq(l.deadlineAll, 112.0, "deadline_all")
		t.eq(l.sessionDeadline(), 112.0, "session deadline")
		h := grant(l, 101, 101.1, 2, 5)
		t.eq(h, holdLease{2, 5, 0, 0}, "hold")
		t.eq(l.deadlineOf(h), 112.0, "capped at the session-wide deadline")
		one := grant(l, 101, 101.1, 1, 0)
		t.eq(l.renewed(102, 15_000, gls(ext(1, 0), ext(2, 5)), 102.1, false), renewExtended, "renewed")
		t.eq(l.deadlineAll, 114.0, "deadline_all")
		t.eq(l.deadlineOf(h), 114.0, "h")
		t.eq(l.deadlineOf(one), 114.0, "one")
		for _, sent := range []float64{107, 112, 117, 122} {
			t.eq(l.renewed(sent, 15_000, gls(other(1), ext(2, 5)), sent+0.1, false), renewUnchanged, "unchanged")
			t.eq(l.deadlineOf(h), sent+ttlS-marginS, "h follows group 2")
			t.eq(l.lockDeadline(h), sent+ttlS-marginS, "lock deadline")
			t.eq(l.sessionDeadline(), sent+ttlS-marginS, "the latest group deadline")
		}
		t.eq(l.deadlineAll, 114.0, "only a reply every group answered moves it")
		t.eq(l.groups[1].deadline, 114.0, "group 1")
		t.eq(l.deadlineOf(one), 114.0, "one")
		t.eq(l.lockDeadline(one), 114.0, "one's lock deadline")
		t.ok(l.deadlineOf(h) > 125.0 && 125.0 > l.deadlineAll, "h beyond deadline_all")
		t.ok(!l.sessionExpired(130) && l.sessionDeadline() == 134.0, "the session goes on")
		t.ok(l.lockDeadline(one) <= 114.0 && 114.0 < l.lockDeadline(h), "one lost, h held")
		t.ok(strings.Contains(l.whyLost(one), "lock group 1") && strings.Contains(l.whyLost(one), "could not answer"), l.whyLost(one))
		// A group's own ttl counts (never more than the session's TTL).
		l.renewed(123, 9_000, gls(other(1), ext(2, 5, 9_000)), 123.1, false)
		t.eq(l.deadlineOf(h), 134.0, "deadlines only move forward")
		l.renewed(124, 60_000, gls(other(1), ext(2, 5, 60_000)), 124.1, false)
		t.eq(l.deadlineOf(h), 136.0, "capped at the TTL")
		t.ok(!l.sessionExpired(135.9) && l.sessionExpired(136.0), "expires at 136")
		t.eq(l.renewed(130, 15_000, gls(ext(1, 0), ext(2, 5)), 136.5, false), renewTooLate, "too late")
		t.eq(l.deadlineOf(h), 136.0, "h")
		t.eq(l.deadlineAll, 114.0, "deadline_all")
	}},
	{"a group stays named for one TTL after its last use", func(t tb) {
		l := newGroupLeases(100, ttlS, marginS)
		l.homed(1, 100, 100)
		l.started(3, 101, 15_000, 101)
		grant(l, 101, 101, 3, 0)
		t.eq(join(l.keepaliveGroups(nil, nil, false, 102)), "1,3", "102")
		t.eq(join(l.keepaliveGroups(nil, nil, false, 115)), "1,3", "115")
		t.eq(join(l.keepaliveGroups(nil, nil, false, 116)), "1", "116")
		t.eq(join(l.keepaliveGroups(nil, []uint32{4}, false, 117)), "1,4", "a wait counts as a use")
		t.eq(join(l.keepaliveGroups(nil, nil, false, 131)), "1,4", "131")
		t.eq(join(l.keepaliveGroups(nil, nil, false, 132)), "1", "132")
	}},
	{"keepalives name the home and the groups in use", func(t tb) {
		l := newGroupLeases(100, ttlS, marginS)
		t.eq(join(l.keepaliveGroups(nil, nil, false, 100)), "", "no home: every group")
		l.homed(1, 100, 100)
		t.eq(join(l.keepaliveGroups(nil, nil, false, 100)), "1", "home")
		t.eq(l.groups[1].deadline, 112.0, "home's deadline")
		l.started(3, 102, 15_000, 102)
		h := grant(l, 102, 102, 3, 4)
		t.eq(l.deadlineOf(h), 114.0, "counted from its own send")
		t.eq(join(l.keepaliveGroups([]holdLease{h}, []uint32{5}, false, 102)), "1,3,5", "holds and waits")
		t.eq(join(l.keepaliveGroups([]holdLease{h}, nil, true, 102)), "", "unsure")
		t.eq(l.renewed(105, 15_000, gls(ext(1, 0), ext(3, 4)), 105, true), renewExtended, "named, no move")
		t.eq(l.deadlineOf(h), 117.0, "h")
		t.eq(l.deadlineAll, 117.0, "deadline_all")
		t.eq(l.renewed(109, 15_000, gls(ext(1, 0), ext(3, 5)), 109, true), renewUnchanged, "a move")
		t.eq(l.deadlineOf(h), 117.0, "h follows deadline_all")
		t.eq(join(l.keepaliveGroups([]holdLease{h}, nil, false, 109)), "", "every group after a move")
		l.renewed(113, 15_000, gls(ext(1, 0), ext(2, 7), ext(3, 5)), 113, false)
		t.eq(l.deadlineOf(h), 125.0, "the moved lock goes on")
	}},
	{"a grant in an unnamed group counts from the earliest acquire that may have adopted", func(t tb) {
		l := newGroupLeases(100, ttlS, marginS)
		l.homed(1, 100, 100)
		l.renewed(110, 15_000, gls(ext(1, 0)), 110, true)
		t.eq(l.deadlineAll, 122.0, "deadline_all")
		stale := l.granted(109, 111, 2, 0, 15_000, 0, false)
		t.eq(l.deadlineOf(stale), 112.0, "a named keepalive says nothing of group 2")
		l.renewed(113, 15_000, gls(ext(1, 0), notHereGL(2), ext(3, 0)), 113, false)
		h := l.granted(115, 115, 4, 0, 15_000, 114, true)
		t.eq(l.deadlineOf(h), 125.0, "others at 114")
		h = l.granted(115, 115, 5, 0, 15_000, 111, true)
		t.eq(l.deadlineOf(h), 123.0, "others at 111")
		l.noteUnsure(112)
		h = l.granted(116, 116, 6, 0, 15_000, 0, false)
		t.eq(l.deadlineOf(h), 124.0, "unsure since 112")
		l.started(7, 116, 15_000, 116)
		adopted := l.granted(116, 116, 7, 0, 15_000, 0, false)
		t.eq(l.deadlineOf(adopted), 128.0, "its own adoption")
	}},
	{"an adoption ends the lease the client knew there", func(t tb) {
		l := newGroupLeases(100, ttlS, marginS)
		l.homed(1, 100, 100)
		l.started(2, 101, 15_000, 101)
		old := grant(l, 101, 101, 2, 0)
		l.started(2, 105, 15_000, 106)
		t.eq(l.deadlineOf(old), 106.0, "lost when the adoption said the lease had ended")
		nw := grant(l, 105, 106, 2, 0)
		t.eq(l.deadlineOf(nw), 117.0, "new")
	}},
	{"a grant with a renewal counts from its send and the lapsed lease's locks stay lost", func(t tb) {
		build := func() (*groupLeases, holdLease) {
			l := newGroupLeases(100, ttlS, marginS)
			l.homed(1, 100, 100)
			l.started(2, 101, 15_000, 101)
			old := grant(l, 101, 101, 2, 0)
			t.eq(l.deadlineOf(old), 113.0, "old")
			l.renewed(110, 15_000, gls(ext(1, 0)), 110, true)
			return l, old
		}
		plain, _ := build()
		lost := grant(plain, 112.5, 113.5, 2, 0)
		t.ok(plain.deadlineOf(lost) <= 113.5, "lost at once")
		renewing, old := build()
		renewing.renewedIn(2, 112.5, 15_000, 0, 113.5)
		kept := grant(renewing, 112.5, 113.5, 2, 0)
		t.eq(renewing.deadlineOf(kept), 124.5, "kept")
		t.eq(renewing.deadlineOf(old), 113.0, "old stays lost")
		t.eq(renewing.deadlineAll, 122.0, "deadline_all untouched")
		gone := newGroupLeases(100, ttlS, marginS)
		gone.homed(1, 100, 100)
		gone.renewedIn(1, 113, 15_000, 0, 113)
		t.eq(gone.sessionDeadline(), 112.0, "a lost session is not revived")
	}},
	{"a lock follows the session-wide deadline once its group's move count rose", func(t tb) {
		l := newGroupLeases(100, ttlS, marginS)
		l.renewed(101, 15_000, gls(ext(1, 0), ext(2, 5)), 101.1, false)
		h := grant(l, 101.5, 101.6, 2, 5)
		l.renewed(106, 15_000, gls(other(1), ext(2, 5)), 106.1, false)
		t.eq(l.deadlineOf(h), 118.0, "h")
		t.eq(l.deadlineAll, 113.0, "deadline_all")
		l.renewed(107, 15_000, gls(other(1), ext(2, 6)), 107.1, false)
		t.eq(l.deadlineOf(h), 113.0, "falls back to deadline_all")
		l.renewed(106.5, 15_000, gls(other(1), ext(2, 5)), 107.2, false)
		t.eq(l.groups[2].moves, uint64(6), "the max is kept")
		t.eq(l.deadlineOf(h), 113.0, "h")
		l.renewed(108, 15_000, gls(ext(1, 0), ext(2, 6)), 108.1, false)
		t.eq(l.deadlineOf(h), 120.0, "every group answered")
		t.eq(l.deadlineAll, 120.0, "deadline_all")
		later := grant(l, 108.5, 108.6, 2, 6)
		t.eq(l.deadlineOf(later), 120.0, "later")
		l.renewed(110, 15_000, gls(other(1), ext(2, 6)), 110.1, false)
		t.eq(l.deadlineOf(later), 122.0, "later follows group 2")
		t.eq(l.deadlineOf(h), 120.0, "h follows deadline_all")
		newer := grant(l, 110.5, 110.6, 2, 7)
		t.eq(l.groups[2].moves, uint64(7), "moves raised by a grant")
		t.eq(l.deadlineOf(newer), 122.0, "newer")
		t.eq(l.deadlineOf(later), 120.0, "later now follows deadline_all")
	}},
	{"not_here for its group makes a lock lost", func(t tb) {
		l := newGroupLeases(100, ttlS, marginS)
		a := grant(l, 101, 101.1, 1, 0)
		b := grant(l, 101, 101.1, 2, 0)
		t.eq(l.renewed(102, 15_000, gls(notHereGL(1), ext(2, 0)), 102.1, false), renewExtended, "still every group's")
		t.ok(l.deadlineOf(a) <= 102.1, "lost when the client learnt it")
		t.eq(l.deadlineOf(b), 114.0, "b")
		t.eq(l.deadlineAll, 114.0, "deadline_all")
		epoch := l.groups[1].epoch
		l.renewed(105, 15_000, gls(ext(1, 0), ext(2, 0)), 105.1, false)
		t.ok(l.deadlineOf(a) <= 102.1, "a lost lease stays lost")
		c := grant(l, 106, 106.1, 1, 0)
		t.eq(c.epoch, epoch, "a new epoch")
		t.eq(l.deadlineOf(c), 117.0, "c")
		l.renewed(106.05, 15_000, gls(notHereGL(1), ext(2, 0)), 106.2, false)
		t.eq(l.deadlineOf(c), 117.0, "a not_here sent before the grant ends nothing")
		t.eq(l.groups[1].epoch, epoch, "epoch")
		l2 := newGroupLeases(100, ttlS, marginS)
		l2.renewed(101, 15_000, gls(ext(1, 0), ext(2, 0)), 101.1, false)
		l2.renewed(102, 15_000, gls(notHereGL(1), ext(2, 0)), 102.1, false)
		t.ok(l2.groups[1].epoch == 0 && !l2.groups[1].hasDeadline, "the group's lease forgotten")
		d := grant(l2, 103, 103.1, 1, 0)
		t.eq(l2.deadlineOf(d), 114.0, "capped at deadline_all")
	}},
	{"a late extension does not revive a lock but a later grant holds", func(t tb) {
		l := newGroupLeases(100, ttlS, marginS)
		l.renewed(101, 15_000, gls(ext(1, 0), ext(2, 0), ext(3, 0)), 101.1, false)
		b := grant(l, 101.5, 101.6, 2, 0)
		c := grant(l, 102, 102.1, 2, 0)
		l.renewed(106, 15_000, gls(other(1), ext(2, 0), ext(3, 0)), 106.1, false)
		t.eq(l.deadlineOf(b), 118.0, "b")
		t.eq(l.deadlineOf(c), 118.0, "c")
		l.renewed(112, 15_000, gls(other(1), other(2), ext(3, 0)), 112.1, false)
		t.eq(l.sessionDeadline(), 124.0, "session")
		t.eq(l.renewed(117.5, 15_000, gls(other(1), ext(2, 0), ext(3, 0)), 118.5, false), renewUnchanged, "late")
		t.eq(l.deadlineOf(b), 118.0, "acknowledged after its deadline: still lost")
		t.eq(l.deadlineOf(c), 118.0, "the same lease as b")
		t.eq(l.groups[2].epoch, 1, "epoch")
		t.eq(l.groups[2].deadline, 129.5, "group 2's new lease")
		l.renewed(122, 15_000, gls(other(1), ext(2, 0)), 122.1, false)
		t.eq(l.deadlineOf(b), 118.0, "later renewals do not revive it either")
		d := grant(l, 122.5, 122.6, 2, 0)
		t.eq(d.epoch, 1, "d's epoch")
		t.eq(l.deadlineOf(d), 134.0, "d holds")
	}},
	{"a reply without groups falls back to the session-wide deadline", func(t tb) {
		l := newGroupLeases(100, ttlS, marginS)
		t.eq(l.renewed(105, 15_000, nil, 105.1, false), renewExtended, "extended")
		t.eq(l.deadlineAll, 117.0, "deadline_all")
		h := grant(l, 106, 106.1, 0, 0)
		t.eq(l.deadlineOf(h), 117.0, "h")
		for _, sent := range []float64{110, 115} {
			l.renewed(sent, 15_000, nil, sent+0.1, false)
			t.eq(l.deadlineOf(h), sent+ttlS-marginS, "h")
			t.eq(l.deadlineAll, sent+ttlS-marginS, "deadline_all")
		}
		t.eq(l.renewed(121, 10_000, nil, 121.1, false), renewExtended, "shorter ttl")
		t.eq(l.deadlineOf(h), 128.0, "h")
		t.eq(l.deadlineAll, 128.0, "deadline_all")
		t.eq(l.renewed(115.5, 15_000, nil, 121.2, false), renewUnchanged, "older renewal")
		t.eq(l.sessionDeadline(), 128.0, "session")
		t.eq(l.renewed(127, 15_000, nil, 128.5, false), renewTooLate, "too late")
		t.ok(l.deadlineAll == 128.0 && l.sessionExpired(128.5), "expired")
	}},
	{"a lock that followed deadline_all stays lost once it restarts", func(t tb) {
		l := newGroupLeases(100, ttlS, marginS)
		l.renewed(101, 15_000, gls(ext(1, 0), ext(2, 5)), 101.1, false)
		h := grant(l, 101.5, 101.6, 2, 5)
		t.eq(l.deadlineOf(h), 113.0, "h")
		changes := l.changes
		t.eq(l.renewed(106, 15_000, gls(other(1), ext(2, 6)), 106.1, false), renewUnchanged, "a move")
		t.ok(l.changes > changes, "changes")
		t.ok(l.deadlineOf(h) == 113.0 && l.deadlineAll == 113.0 && l.groups[2].deadline == 118.0, "h follows deadline_all")
		t.eq(l.renewed(110, 15_000, gls(other(1), ext(2, 6)), 110.1, false), renewUnchanged, "unchanged")
		t.eq(l.lockDeadline(h), 113.0, "lost when deadline_all lapses")
		t.ok(!l.sessionExpired(113) && l.sessionDeadline() == 122.0, "the session goes on")
		t.ok(strings.Contains(l.whyLost(h), "session-wide deadline"), l.whyLost(h))
		changes = l.changes
		t.eq(l.renewed(114, 15_000, gls(ext(1, 0), ext(2, 6)), 114.1, false), renewRestarted, "restarted")
		t.ok(l.allEpoch == 1 && l.deadlineAll == 126.0 && l.changes > changes, "a new all_epoch")
		t.ok(l.deadlineOf(h) == 113.0 && l.lockDeadline(h) == 113.0, "h stays lost")
		t.eq(l.renewed(118, 15_000, gls(ext(1, 0), ext(2, 6)), 118.1, false), renewExtended, "extended")
		t.ok(l.deadlineOf(h) == 113.0 && l.deadlineAll == 130.0, "later renewals revive nothing")
		later := grant(l, 118.5, 118.6, 2, 6)
		t.ok(later.allEpoch == 1 && l.deadlineOf(later) == 130.0, "a grant after the restart")
		l.renewed(120, 15_000, gls(other(1), ext(2, 7)), 120.1, false)
		t.ok(l.deadlineOf(later) == 130.0 && l.deadlineAll == 130.0 && l.groups[2].deadline == 132.0, "follows the live deadline_all")
		t.eq(l.renewed(117, 15_000, gls(ext(1, 0), ext(2, 7)), 131, false), renewUnchanged, "its own deadline passed")
		t.ok(l.allEpoch == 1 && l.deadlineAll == 130.0, "nothing restarted")
	}},
	{"a pushed session_ended for one group ends only that group's lease", func(t tb) {
		l := newGroupLeases(100, ttlS, marginS)
		l.renewed(101, 15_000, gls(ext(1, 0), ext(2, 0)), 101.1, false)
		a := grant(l, 101.5, 101.6, 1, 0)
		a2 := grant(l, 104, 104.1, 1, 0)
		b := grant(l, 101.5, 101.6, 2, 0)
		l.renewed(105, 15_000, gls(other(1), ext(2, 0)), 105.1, false)
		changes := l.changes
		l.groupEnded(1, 106)
		t.ok(l.changes > changes, "changes")
		t.ok(l.lockDeadline(a) == 106.0 && l.lockDeadline(a2) == 106.0, "lost when the push arrived")
		t.ok(strings.Contains(l.whyLost(a), "lock group 1") && strings.Contains(l.whyLost(a), "ended"), l.whyLost(a))
		t.ok(l.deadlineOf(b) == 117.0 && !l.groups[1].hasDeadline, "b holds")
		t.ok(!l.sessionExpired(110) && l.sessionDeadline() == 117.0, "the session goes on")
		c := grant(l, 106.5, 106.6, 1, 0)
		t.eq(c.epoch, a.epoch+1, "c's epoch")
		t.eq(l.deadlineOf(c), 113.0, "106.5 + 12, capped by deadline_all")
		l.renewed(107, 15_000, gls(ext(1, 0), ext(2, 0)), 107.1, false)
		t.ok(l.deadlineOf(c) == 119.0 && l.lockDeadline(a) == 106.0, "a stays lost")
		l.groupEnded(9, 108)
		t.ok(l.deadlineOf(c) == 119.0 && l.deadlineOf(b) == 119.0, "an unknown group changes nothing")
	}},
	{"every group not_here means the session is gone", func(t tb) {
		l := newGroupLeases(100, ttlS, marginS)
		l.renewed(101, 15_000, gls(ext(1, 0), ext(2, 0)), 101.1, false)
		a := grant(l, 101.5, 101.6, 1, 0)
		t.eq(l.renewed(102, 15_000, gls(notHereGL(1), ext(2, 0)), 102.1, false), renewExtended, "extended")
		t.ok(!l.sessionExpired(102.2), "alive")
		t.eq(l.renewed(103, 15_000, gls(notHereGL(1), notHereGL(2)), 103.1, false), renewGone, "gone")
		t.ok(l.sessionExpired(103.1) && l.sessionDeadline() == 103.1, "expired at once")
		t.ok(l.lockDeadline(a) <= 103.1, "a")
		t.eq(l.renewed(104, 15_000, gls(ext(1, 0), ext(2, 0)), 104.1, false), renewTooLate, "nothing revives it")
	}},
}

func join(gs []uint32) string {
	var b strings.Builder
	for i, g := range gs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(itoa(uint64(g)))
	}
	return b.String()
}

func itoa(n uint64) string {
	if n == 0 {
		return "0"
	}
	var d []byte
	for n > 0 {
		d = append([]byte{byte('0' + n%10)}, d...)
		n /= 10
	}
	return string(d)
}

func TestLeaseRule(t *testing.T) {
	for _, tc := range leaseRuleTests {
		t.Run(tc.name, func(t *testing.T) { tc.run(tb{t}) })
	}
}

func TestLockLeaseWatchersFireOnceForTheLockOrItsSession(t *testing.T) {
	mu := &sync.Mutex{}
	now := monotonic() // an hour's lease: only end loses these
	session := &sessionLease{watched: newWatched(), gen: 1, sessionID: "s", leases: newGroupLeases(now, 3600, 1), engine: mu}
	a := newLockLease(session, session.leases.granted(now, now, 1, 0, 3_600_000, 0, false))
	b := newLockLease(session, session.leases.granted(now, now, 2, 0, 3_600_000, 0, false))
	var fired []string
	a.watch(func() { fired = append(fired, "a") })
	b.watch(func() { fired = append(fired, "b") })
	a.end("group 1 ended it")
	a.end("again")
	if len(fired) != 1 || !a.isLost() || a.reason() != "group 1 ended it" || b.isLost() {
		t.Fatalf("fired %v a.lost %v b.lost %v why %q", fired, a.isLost(), b.isLost(), a.reason())
	}
	select {
	case <-a.ch:
	default:
		t.Fatal("a's channel is not closed")
	}
	session.end("closed")
	if len(fired) != 2 || fired[1] != "b" || b.reason() != "closed" {
		t.Fatalf("fired %v why %q", fired, b.reason())
	}
	late := 0
	b.watch(func() { late++ })
	if late != 1 {
		t.Fatal("watching a lost lock calls back at once")
	}
	// A detached (released) lock leaves nothing registered with its session.
	s2 := &sessionLease{watched: newWatched(), gen: 2, sessionID: "s2", leases: newGroupLeases(now, 3600, 1), engine: mu}
	c := newLockLease(s2, s2.leases.granted(now, now, 1, 0, 3_600_000, 0, false))
	if len(s2.watchers) != 1 {
		t.Fatalf("watchers %d", len(s2.watchers))
	}
	c.detach()
	if len(s2.watchers) != 0 {
		t.Fatalf("watchers %d after detach", len(s2.watchers))
	}
	if math.IsNaN(c.deadline()) {
		t.Fatal("deadline")
	}
}
