package lockd

// The engine on synthetic events (no service): a port of the Python client's engine tests in
// tests/test_unit.py.

import (
	"math"
	"reflect"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockd-dev/lockd/clients/go/internal/pb"
)

type recorder struct {
	mu    sync.Mutex
	names []string
}

func (r *recorder) add(names ...string) {
	r.mu.Lock()
	r.names = append(r.names, names...)
	r.mu.Unlock()
}

func (r *recorder) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := append([]string(nil), r.names...)
	sort.Strings(out)
	return out
}

// testEngine is a Client with a session opened sentAgo seconds ago by a synthetic answer (no
// service; no keepalive is due for ages).
func testEngine(t *testing.T, sentAgo float64) (*Client, *session, *recorder, float64) {
	t.Helper()
	c, err := New([]string{"127.0.0.1:1"}, WithTTL(15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	c.testNoNet = true
	c.testReport = func(names []string) { rec.add(names...) }
	sent := monotonic() - sentAgo
	s := c.opened(&pb.OpenSessionResponse{SessionId: "s", TtlMs: 15_000, KeepaliveEveryMs: 1e9}, sent, nil)
	t.Cleanup(func() {
		c.mu.Lock()
		c.sess = nil
		c.closed = true
		c.mu.Unlock()
		c.bgCancel()
	})
	return c, s, rec, sent
}

func (c *Client) testHold(s *session, name string, token uint64, sent float64, group uint32, moves uint64) *hold {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.holdLocked(s, name, token, "me", Exclusive, 1, sent, group, moves, 15_000)
}

func (c *Client) testRenewed(sent float64, groups ...*pb.GroupLease) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.renewedLocked(sent, &pb.KeepAliveResponse{TtlMs: 15_000, Groups: groups}, false)
}

func (c *Client) testEvent(ev *pb.SessionEvent) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.eventLocked(ev)
}

type fired struct {
	mu sync.Mutex
	at map[string]float64
	in []string
}

func (f *fired) watch(h *hold, name string) {
	h.lease.watch(func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.at == nil {
			f.at = map[string]float64{}
		}
		if _, ok := f.at[name]; !ok {
			f.at[name] = monotonic()
			f.in = append(f.in, name)
		}
	})
}

func (f *fired) order() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.in...)
}

func (f *fired) when(name string) (float64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.at[name]
	return t, ok
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestEngineFiresLostWhenAReplyEndsALocksGroupLease(t *testing.T) {
	c, s, rec, sent := testEngine(t, 0)
	h1 := c.testHold(s, "one", 7, sent, 2, 4)
	h2 := c.testHold(s, "two", 8, sent, 3, 0)
	var f fired
	f.watch(h1, "one")
	f.watch(h2, "two")
	if h1.lease.hold.group != 2 || h2.lease.hold.group != 3 {
		t.Fatal("groups")
	}
	c.testRenewed(monotonic(), notHereGL(2), ext(3, 0))
	if !reflect.DeepEqual(f.order(), []string{"one"}) || !h1.lease.isLost() || h2.lease.isLost() {
		t.Fatalf("fired %v", f.order())
	}
	if !strings.Contains(h1.lease.reason(), "lock group 2") {
		t.Fatal(h1.lease.reason())
	}
	if c.sess != s || s.lease.isFired() {
		t.Fatal("the session goes on")
	}
	waitFor(t, "the report", time.Second, func() bool { return len(rec.get()) == 1 })
	if rec.get()[0] != "one" || c.LeaseExpiredCount() != 1 {
		t.Fatal(rec.get())
	}
	// A move in group 3: lock two now follows the session-wide deadline.
	before := h2.lease.deadline()
	c.testRenewed(monotonic(), ext(2, 0), ext(3, 1))
	if h2.lease.deadline() != s.lease.deadline() || h2.lease.deadline() < before || h2.lease.isLost() {
		t.Fatal("two follows the session-wide deadline")
	}
	// The session's end fires the rest, and counts only what was not reported yet.
	c.mu.Lock()
	c.loseLocked("test", true)
	c.mu.Unlock()
	if !reflect.DeepEqual(f.order(), []string{"one", "two"}) || c.LeaseExpiredCount() != 2 {
		t.Fatalf("fired %v count %d", f.order(), c.LeaseExpiredCount())
	}
	waitFor(t, "both reports", time.Second, func() bool { return reflect.DeepEqual(rec.get(), []string{"one", "two"}) })
}

func TestEngineEndsOneGroupsLocksOnAPushedSessionEnded(t *testing.T) {
	c, s, rec, sent := testEngine(t, 0)
	h1 := c.testHold(s, "one", 7, sent, 1, 0)
	h2 := c.testHold(s, "two", 8, sent, 2, 0)
	var f fired
	f.watch(h1, "one")
	f.watch(h2, "two")
	c.testEvent(&pb.SessionEvent{Kind: &pb.SessionEvent_SessionEnded{SessionEnded: &pb.SessionEnded{Group: 1, Reason: "expired"}}})
	if !reflect.DeepEqual(f.order(), []string{"one"}) || !h1.lease.isLost() || h2.lease.isLost() {
		t.Fatalf("fired %v", f.order())
	}
	if !strings.Contains(h1.lease.reason(), "lock group 1") || h1.lease.deadline() > monotonic() {
		t.Fatal(h1.lease.reason())
	}
	if c.sess != s || s.lease.isLost() {
		t.Fatal("the session goes on")
	}
	waitFor(t, "the report", time.Second, func() bool { return len(rec.get()) == 1 })
	// A later grant in group 1 (the acquire adopted the session there again) holds.
	h3 := c.testHold(s, "three", 9, monotonic(), 1, 0)
	if h3.lease.isLost() || h3.lease.deadline() < monotonic()+5 {
		t.Fatal("three holds")
	}
	f.watch(h3, "three")
	c.testEvent(&pb.SessionEvent{Kind: &pb.SessionEvent_SessionEnded{SessionEnded: &pb.SessionEnded{Group: 0, Reason: "closed"}}})
	c.mu.Lock()
	gone := c.sess == nil
	c.mu.Unlock()
	if !gone || !s.lease.isFired() || !h3.lease.isLost() || len(f.order()) != 3 {
		t.Fatalf("closed: fired %v", f.order())
	}
	if c.LeaseExpiredCount() != 1 {
		t.Fatal("a close is no expiry")
	}
}

func TestKeepaliveRefused503LosesNothingBut404LosesTheSession(t *testing.T) {
	c, s, _, sent := testEngine(t, 0)
	h := c.testHold(s, "one", 7, sent, 1, 0)
	c.mu.Lock()
	c.pending[41] = &pendingReq{kind: pendKeepalive, sent: monotonic()}
	c.eventLocked(&pb.SessionEvent{RequestId: 41, Kind: &pb.SessionEvent_Error{Error: &pb.Error{
		Status: 503, Code: "no_leader", Message: "group 1: no leader", RetryAfterMs: 100}}})
	if c.sess != s || s.keepaliveFailures != 1 || s.nextKeepalive > monotonic()+5 {
		t.Fatal("a 503 is retried soon")
	}
	c.mu.Unlock()
	if s.lease.isLost() || h.lease.isLost() {
		t.Fatal("a 503 loses nothing")
	}
	c.mu.Lock()
	c.pending[42] = &pendingReq{kind: pendKeepalive, sent: monotonic()}
	c.eventLocked(&pb.SessionEvent{RequestId: 42, Kind: &pb.SessionEvent_Error{Error: &pb.Error{
		Status: 404, Code: "session_not_found", Message: "gone"}}})
	gone := c.sess == nil
	c.mu.Unlock()
	if !gone || !s.lease.isFired() || !h.lease.isLost() {
		t.Fatal("a 404 loses the session")
	}

	c, s, _, sent = testEngine(t, 0)
	h = c.testHold(s, "one", 7, sent, 1, 0)
	c.testRenewed(monotonic(), notHereGL(1), notHereGL(2))
	c.mu.Lock()
	gone = c.sess == nil
	c.mu.Unlock()
	if !gone || !s.lease.isFired() || !h.lease.isLost() || !strings.Contains(s.lease.reason(), "no lease") {
		t.Fatal("every group not_here loses the session")
	}
}

func TestEngineFiresLostAtEachLocksOwnDeadlineWhileTheSessionGoesOn(t *testing.T) {
	// Opened 11.5 s ago: deadline_all (sent + 15 - 3) is 0.5 s away.
	c, s, rec, sent := testEngine(t, 11.5)
	t0 := sent + 11.5
	leases := s.lease.leases
	c.testRenewed(sent, ext(1, 0), ext(2, 5))
	// Group 1 extended a keepalive sent 11 s before t0 (its deadline: t0 + 1) and could not
	// answer the next one, which group 2 extended (at move count 5).
	c.testRenewed(t0-11.0, ext(1, 0), other(2))
	c.testRenewed(monotonic(), other(1), ext(2, 5))
	moved := c.testHold(s, "moved", 7, monotonic(), 2, 5)
	one := c.testHold(s, "one", 8, sent, 1, 0)
	var f fired
	f.watch(moved, "moved")
	f.watch(one, "one")
	if moved.lease.deadline() <= t0+11.0 || math.Abs(one.lease.deadline()-(t0+1.0)) > 1e-6 {
		t.Fatalf("moved %v one %v", moved.lease.deadline()-t0, one.lease.deadline()-t0)
	}
	time.Sleep(50 * time.Millisecond) // the engine's timer now sleeps to t0 + 1
	if len(f.order()) != 0 {
		t.Fatal("nothing fired yet")
	}
	// Group 2 answers at a higher move count: moved follows deadline_all, nearer than the
	// timer's wake-up.
	c.testRenewed(monotonic(), other(1), ext(2, 6))
	c.mu.Lock()
	all := leases.deadlineAll
	c.mu.Unlock()
	if math.Abs(moved.lease.deadline()-(t0+0.5)) > 1e-6 || moved.lease.deadline() != all ||
		math.Abs(one.lease.deadline()-(t0+1.0)) > 1e-6 {
		t.Fatal("moved follows deadline_all")
	}
	if s.lease.deadline() <= t0+11.0 {
		t.Fatal("the session lives on group 2's lease")
	}
	waitFor(t, "both locks lost", 3*time.Second, func() bool { return len(f.order()) == 2 })
	fm, _ := f.when("moved")
	fo, _ := f.when("one")
	// Deadlines are float sums (sent + TTL - margin against t0 + 0.5): compare within 1 µs.
	if fm < t0+0.5-1e-6 || fm >= t0+0.5+0.4 {
		t.Fatalf("moved fired at t0+%.3f", fm-t0)
	}
	if fo < t0+1.0-1e-6 || fo >= t0+1.0+0.4 {
		t.Fatalf("one fired at t0+%.3f", fo-t0)
	}
	if !strings.Contains(moved.lease.reason(), "session-wide") || !strings.Contains(one.lease.reason(), "lock group 1") {
		t.Fatal(moved.lease.reason(), one.lease.reason())
	}
	if c.sess != s || s.lease.isLost() {
		t.Fatal("the session goes on")
	}
	waitFor(t, "both reports", time.Second, func() bool { return reflect.DeepEqual(rec.get(), []string{"moved", "one"}) })
	// Every group answers again: deadline_all restarts, neither lock comes back.
	c.testRenewed(monotonic(), ext(1, 0), ext(2, 6))
	c.mu.Lock()
	epoch, all := leases.allEpoch, leases.deadlineAll
	c.mu.Unlock()
	if epoch != 1 || all <= monotonic()+10 {
		t.Fatal("deadline_all restarts")
	}
	if !moved.lease.isLost() || !one.lease.isLost() || moved.lease.deadline() > t0+0.5+1e-6 || one.lease.deadline() > t0+1.0+1e-6 {
		t.Fatal("neither comes back")
	}
	nw := c.testHold(s, "new", 9, monotonic(), 2, 6)
	if nw.lease.isLost() || nw.lease.deadline() <= monotonic()+10 || c.LeaseExpiredCount() != 2 {
		t.Fatal("a new grant holds")
	}
}
