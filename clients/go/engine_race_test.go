package lockd

// The engine's concurrency on synthetic events (no service): Close racing an open, the local
// deadlines while a reconnect is stuck, each session's own tick wake-up, what a Lock keeps
// after Release, and a grant that arrives as its acquire gives up.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"reflect"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/lockd-dev/lockd/clients/go/internal/pb"
)

// fakeStream is a Session stream to nowhere: it keeps what is sent and answers nothing until
// it is cancelled.
type fakeStream struct {
	grpc.ClientStream
	done chan struct{}
	stop sync.Once
	mu   sync.Mutex
	sent []*pb.SessionRequest
}

func newFakeConn(endpoint int) (*streamConn, *fakeStream) {
	fs := &fakeStream{done: make(chan struct{})}
	return &streamConn{stream: fs, cancel: fs.cancel, endpoint: endpoint, queue: newSendQueue()}, fs
}

func (f *fakeStream) cancel() { f.stop.Do(func() { close(f.done) }) }

func (f *fakeStream) Send(r *pb.SessionRequest) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sent = append(f.sent, r)
	return nil
}

func (f *fakeStream) Recv() (*pb.SessionEvent, error) {
	<-f.done
	return nil, io.EOF
}

func (f *fakeStream) CloseSend() error { return nil }

func (f *fakeStream) requests() []*pb.SessionRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*pb.SessionRequest(nil), f.sent...)
}

func openedResp(id string) *pb.OpenSessionResponse {
	return &pb.OpenSessionResponse{SessionId: id, TtlMs: 15_000, KeepaliveEveryMs: 1e9}
}

// stopEngine is Close without the service: the session ends locally, the background work
// stops and is waited for, the connections close.
func stopEngine(t *testing.T, c *Client) {
	t.Helper()
	c.mu.Lock()
	c.closing, c.closed = true, true
	c.endOnCloseLocked(c.sess)
	c.mu.Unlock()
	c.bgCancel()
	c.bgMu.Lock()
	c.bgStopped = true
	c.bgMu.Unlock()
	done := make(chan struct{})
	go func() { c.bg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Error("the background work did not end within 10 s of the client's end")
	}
	c.connMu.Lock()
	c.connsClosed = true
	for i, cc := range c.conns {
		if cc != nil {
			_ = cc.Close()
			c.conns[i] = nil
		}
	}
	c.connMu.Unlock()
}

// blackhole is a node that accepts connections and never answers (port 19390, in the Go
// suite's range).
func blackhole(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:19390")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			cn, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, cn)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, cn := range conns {
			_ = cn.Close()
		}
	})
	return ln.Addr().String()
}

func watcherCount(w *watched) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.watchers)
}

func receive[T comparable](t *testing.T, ch chan T, want T, d time.Duration, what string) {
	t.Helper()
	deadline := time.After(d)
	for {
		select {
		case got := <-ch:
			if got == want {
				return
			}
		case <-deadline:
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
	}
}

// Close racing an open (finding 1): an open answered after Close began installs no session
// (its locks would never report lost), Connect fails with KindClientClosed, Close waits for
// it, and an acquire during Close opens nothing.
func TestCloseRacingAnOpenInstallsNoSession(t *testing.T) {
	c, err := New([]string{"127.0.0.1:1"}, WithTTL(15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	c.testNoNet = true
	c.testReport = func([]string) {}
	var opens atomic.Int32
	entered := make(chan int32, 8)
	answer := make(chan struct{})
	c.testHandshake = func(ctx context.Context, i int, first *pb.SessionRequest, limit time.Duration) (*streamConn, *pb.SessionEvent, float64, *Error) {
		n := opens.Add(1)
		sent := monotonic()
		entered <- n
		if n > 1 {
			<-answer // this node answers only once Close is under way
		}
		return nil, &pb.SessionEvent{RequestId: first.GetRequestId(),
			Kind: &pb.SessionEvent_Opened{Opened: openedResp(fmt.Sprintf("s%d", n))}}, sent, nil
	}
	var closeOnce sync.Once
	t.Cleanup(func() { closeOnce.Do(func() { close(answer) }); stopEngine(t, c) })

	if err := c.Connect(context.Background()); err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	s1 := c.sess
	c.loseLocked("test: the service ended the first session", false)
	c.mu.Unlock()
	if s1 == nil || !s1.lease.isFired() {
		t.Fatal("the first session")
	}
	connected := make(chan error, 1)
	go func() { connected <- c.Connect(context.Background()) }()
	receive(t, entered, 2, 2*time.Second, "the second open")
	closed := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		closed <- c.Close(ctx)
	}()
	waitFor(t, "Close to begin", 2*time.Second, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.closing
	})
	// An acquire while Close runs fails at once, and opens nothing.
	actx, acancel := context.WithTimeout(context.Background(), 2*time.Second)
	_, err = c.TryAcquire(actx, "x")
	acancel()
	if !errors.Is(err, ErrClientClosed) {
		t.Fatalf("an acquire during Close: %v", err)
	}
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while an open was still in flight", err)
	default:
	}
	closeOnce.Do(func() { close(answer) }) // the open's answer arrives now
	select {
	case err := <-connected:
		if !errors.Is(err, ErrClientClosed) {
			t.Fatalf("an open answered after Close began must not succeed: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Connect did not return")
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	c.mu.Lock()
	left := c.sess
	c.mu.Unlock()
	if left != nil || opens.Load() != 2 {
		t.Fatalf("after Close: session %v, %d opens", left, opens.Load())
	}
}

// Close and opens honour their contexts (finding 9): a Connect waiting for another open in
// flight gives up with its ctx, Close stops waiting with its ctx, and after Close no connection
// is made and no background work starts.
func TestCloseAndOpensHonourTheirContexts(t *testing.T) {
	c, err := New([]string{"127.0.0.1:1"}, WithTTL(15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	c.testNoNet = true
	c.testReport = func([]string) {}
	entered := make(chan int, 4)
	answer := make(chan struct{})
	var answerOnce sync.Once
	c.testHandshake = func(ctx context.Context, i int, first *pb.SessionRequest, limit time.Duration) (*streamConn, *pb.SessionEvent, float64, *Error) {
		entered <- 1
		<-answer // a node that answers only when the test says so
		return nil, nil, 0, newErr(KindUnavailable, "the test's node gave up")
	}
	t.Cleanup(func() { answerOnce.Do(func() { close(answer) }); stopEngine(t, c) })
	go func() { _ = c.Connect(context.Background()) }()
	receive(t, entered, 1, 2*time.Second, "the first open")
	within := func(what string, f func() error) error {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- f() }()
		select {
		case err := <-done:
			return err
		case <-time.After(2 * time.Second):
			t.Fatalf("%s did not return within 2 s of its ctx's end", what)
			return nil
		}
	}
	err = within("a Connect behind an open in flight", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		return c.Connect(ctx)
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a Connect behind an open in flight: %v", err)
	}
	err = within("Close", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		return c.Close(ctx)
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close while an open hangs: %v", err)
	}
	if _, err := c.stub(0); !errors.Is(err, ErrClientClosed) {
		t.Fatalf("a connection after Close: %v", err)
	}
	if c.spawn(func() {}) {
		t.Fatal("background work started after Close")
	}
}

// The local deadlines fire on time while the stream reconnects (finding 2): group 1 cannot
// answer, group 2 keeps the session. The attach hangs (a node that never answers, up to its
// request timeout), or it succeeds and the settling after it hangs (its GetSession goes to a
// node that never answers): a lock in group 1 reports lost at group 1's deadline either way.
func TestLostFiresOnTimeWhileAReconnectIsStuck(t *testing.T) {
	for _, stuck := range []string{"handshake", "settle"} {
		t.Run(stuck, func(t *testing.T) { lostOnTimeWhileStuck(t, stuck) })
	}
}

func lostOnTimeWhileStuck(t *testing.T, stuck string) {
	endpoint := "127.0.0.1:1"
	if stuck == "settle" {
		endpoint = blackhole(t)
	}
	c, err := New([]string{endpoint}, WithTTL(15*time.Second), WithRequestTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	c.testReport = func(names []string) { rec.add(names...) }
	var attaches atomic.Int32
	c.testHandshake = func(ctx context.Context, i int, first *pb.SessionRequest, limit time.Duration) (*streamConn, *pb.SessionEvent, float64, *Error) {
		if first.GetAttach() == "" {
			return nil, nil, 0, newErr(KindOther, "the test's node takes attaches only")
		}
		attaches.Add(1)
		sent := monotonic()
		if stuck == "handshake" {
			select { // no answer: the attach gives up at its limit
			case <-time.After(limit):
			case <-ctx.Done():
			}
			return nil, nil, 0, newErr(KindUnavailable, "%s did not answer in %s", c.endpoints[i], limit)
		}
		conn, _ := newFakeConn(i)
		return conn, &pb.SessionEvent{RequestId: first.GetRequestId(), Kind: &pb.SessionEvent_Keepalive{
			Keepalive: &pb.KeepAliveResponse{TtlMs: 15_000, Groups: gls(other(1), ext(2, 5))}}}, sent, nil
	}
	t.Cleanup(func() { stopEngine(t, c) })
	// Opened 11.5 s ago on a stream that is up.
	sent := monotonic() - 11.5
	t0 := sent + 11.5
	conn, _ := newFakeConn(0)
	s := c.opened(openedResp("s"), sent, conn)
	// Group 1 extended a keepalive sent 11 s before t0 (its deadline: t0 + 1) and could not
	// answer the next one, which group 2 extended.
	c.testRenewed(sent, ext(1, 0), ext(2, 5))
	c.testRenewed(t0-11.0, ext(1, 0), other(2))
	c.testRenewed(monotonic(), other(1), ext(2, 5))
	one := c.testHold(s, "one", 8, sent, 1, 0)
	var f fired
	f.watch(one, "one")
	if math.Abs(one.lease.deadline()-(t0+1.0)) > 1e-6 || s.lease.deadline() <= t0+11.0 {
		t.Fatalf("one %.3f, session %.3f", one.lease.deadline()-t0, s.lease.deadline()-t0)
	}
	// The stream breaks, with an acquire's answer lost in it (settled after the attach).
	c.mu.Lock()
	c.unsure = []string{"maybe"}
	c.disconnectedLocked("test: the node stopped answering")
	c.mu.Unlock()
	waitFor(t, "the attach", 2*time.Second, func() bool { return attaches.Load() == 1 })
	waitFor(t, "one to be lost", 4*time.Second, func() bool { _, ok := f.when("one"); return ok })
	at, _ := f.when("one")
	if at < t0+1.0 || at >= t0+1.0+0.4 {
		t.Fatalf("one fired at t0+%.3f, not at its deadline t0+1", at-t0)
	}
	c.mu.Lock()
	current, reconnecting, settling, hasConn := c.sess == s, s.reconnecting, c.settling, c.conn != nil
	c.mu.Unlock()
	if !current || s.lease.isLost() {
		t.Fatal("the session goes on, on group 2's lease")
	}
	switch stuck {
	case "handshake":
		if !reconnecting || hasConn || attaches.Load() != 1 {
			t.Fatalf("the attach is still under way: reconnecting %v, stream %v", reconnecting, hasConn)
		}
	case "settle":
		// The attach is done (a stream that breaks again reconnects at once); only the settle
		// after it hangs, in the background.
		if !hasConn || settling != 1 || reconnecting {
			t.Fatalf("the settle is still under way: stream %v, settling %d, reconnecting %v", hasConn, settling, reconnecting)
		}
	}
	waitFor(t, "the report", time.Second, func() bool { return reflect.DeepEqual(rec.get(), []string{"one"}) })
}

// Each session's tick has its own wake-up (finding 8): the tick of a session that just ended
// takes its own poke and exits, whatever the new session's tick drains, and a poke for the new
// session (a lock with a nearer deadline) reaches the new session's tick.
func TestEachSessionsTickTakesOnlyItsOwnPokes(t *testing.T) {
	c, err := New([]string{"127.0.0.1:1"}, WithTTL(15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	c.testNoNet = true
	c.testReport = func([]string) {}
	var mu sync.Mutex
	gates := map[string]chan struct{}{"s1": make(chan struct{}), "s2": make(chan struct{})}
	var opened [2]sync.Once
	openGate := func(i int, id string) { opened[i].Do(func() { close(gates[id]) }) }
	seen := map[string]bool{}
	waiting := make(chan string, 256)
	exited := make(chan string, 8)
	c.testTickHook = func(s *session, at string) {
		if at == "exit" {
			exited <- s.id
			return
		}
		mu.Lock()
		first := !seen[s.id]
		seen[s.id] = true
		gate := gates[s.id]
		mu.Unlock()
		select {
		case waiting <- s.id:
		default:
		}
		if first && gate != nil {
			<-gate // held just before its wait, after it drained its pokes
		}
	}
	t.Cleanup(func() { openGate(0, "s1"); openGate(1, "s2"); stopEngine(t, c) })

	c.opened(openedResp("s1"), monotonic(), nil)
	receive(t, waiting, "s1", 2*time.Second, "the first session's tick")
	c.mu.Lock()
	c.loseLocked("test: the first session ended", false)
	c.mu.Unlock()
	now := monotonic()
	s2 := c.opened(openedResp("s2"), now, nil)
	receive(t, waiting, "s2", 2*time.Second, "the second session's tick")
	openGate(0, "s1")
	receive(t, exited, "s1", 2*time.Second, "the first session's tick to exit (its poke was taken)")
	// Group 1 ends soon (a keepalive sent 10.5 s ago was its last extension); group 2 keeps
	// the session. A lock in group 1 must fire at group 1's deadline.
	c.testRenewed(now-10.5, ext(1, 0), ext(2, 0))
	c.testRenewed(monotonic(), other(1), ext(2, 0))
	h := c.testHold(s2, "one", 7, now, 1, 0)
	var f fired
	f.watch(h, "one")
	due := h.lease.deadline()
	if math.Abs(due-(now+1.5)) > 1e-6 || s2.lease.deadline() < now+11 {
		t.Fatalf("one due at now+%.3f", due-now)
	}
	openGate(1, "s2")
	waitFor(t, "one to be lost", 4*time.Second, func() bool { _, ok := f.when("one"); return ok })
	if at, _ := f.when("one"); at < due || at >= due+0.4 {
		t.Fatalf("one fired at %.3f s past its deadline", at-due)
	}
}

// A released Lock (finding 5): Lost is closed and IsLost true from Release on, LostReason says
// "released" (or why it was lost, if it was lost first), and a Lock keeps no goroutine of its
// own (finding 7): a callback of its lease closes Lost, and Release unhooks it.
func TestAReleasedLockCountsAsLostAndLocksKeepNoGoroutine(t *testing.T) {
	c, s, _, sent := testEngine(t, 0)
	before := runtime.NumGoroutine()
	locks := make([]*Lock, 100)
	for i := range locks {
		locks[i] = newLock(c, c.testHold(s, fmt.Sprintf("n%d", i), uint64(i+1), sent, 1, 0))
	}
	if n := runtime.NumGoroutine() - before; n > 10 {
		t.Fatalf("100 locks started %d goroutines", n)
	}
	lk := locks[0]
	if lk.IsLost() || lk.LostReason() != "" || watcherCount(&lk.h.lease.watched) != 1 {
		t.Fatal("held")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, _ = lk.Release(ctx) // no node answers: it fails, and goes on in the background
	select {
	case <-lk.Lost():
	default:
		t.Fatal("Release closes Lost")
	}
	if !lk.IsLost() || !lk.Released() || lk.LostReason() != "released" {
		t.Fatalf("released: lost %v reason %q", lk.IsLost(), lk.LostReason())
	}
	if watcherCount(&lk.h.lease.watched) != 0 || watcherCount(&s.lease.watched) != 99 {
		t.Fatal("a released lock's lease watches nothing")
	}
	// Group 1's lease ends: every lock there reports lost by its lease's callback.
	c.testEvent(&pb.SessionEvent{Kind: &pb.SessionEvent_SessionEnded{SessionEnded: &pb.SessionEnded{Group: 1, Reason: "expired"}}})
	for _, l := range locks[1:] {
		select {
		case <-l.Lost():
		default:
			t.Fatalf("%s: Lost not closed at its group's end", l.Name())
		}
	}
	_, _ = locks[1].Release(ctx)
	if why := locks[1].LostReason(); why == "released" || why == "" {
		t.Fatalf("a lock lost before its release says why it was lost: %q", why)
	}
}

// A grant that arrives as its acquire gives up (finding 7): it is given back, and the hold
// leaves nothing behind: not in the client's holds, and its lease no longer watches the session.
func TestAGrantArrivingAsTheAcquireGivesUpIsGivenBackAndUnhooked(t *testing.T) {
	c, s, _, _ := testEngine(t, 0)
	conn, fs := newFakeConn(0)
	c.mu.Lock()
	c.installLocked(conn)
	c.mu.Unlock()
	gaveUp := make(chan struct{})
	c.testAcquireGaveUp = func() { close(gaveUp) }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	result := make(chan error, 1)
	go func() {
		_, err := c.acquireOnce(ctx, &pb.AcquireRequest{Name: "x", Owner: "me"}, Exclusive)
		result <- err
	}()
	var rid uint64
	waitFor(t, "the acquire on the stream", 2*time.Second, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for id, p := range c.pending {
			if p.acq != nil && p.acq.name == "x" {
				rid = id
				return true
			}
		}
		return false
	})
	c.mu.Lock()
	cancel()
	select {
	case <-gaveUp:
	case <-time.After(2 * time.Second):
		c.mu.Unlock()
		t.Fatal("the acquire did not give up")
	}
	// The grant arrives while the acquire that gave up waits for the engine lock.
	c.eventLocked(&pb.SessionEvent{RequestId: rid, Kind: &pb.SessionEvent_Acquired{
		Acquired: &pb.AcquireResponse{Acquired: true, FencingToken: 9, Group: 1}}})
	c.mu.Unlock()
	select {
	case err := <-result:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the acquire: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("the acquire did not return")
	}
	c.mu.Lock()
	held := len(c.held)
	c.mu.Unlock()
	if held != 0 || watcherCount(&s.lease.watched) != 0 {
		t.Fatalf("the given-back hold left %d holds and %d session watchers", held, watcherCount(&s.lease.watched))
	}
	waitFor(t, "the give-back on the stream", 2*time.Second, func() bool {
		for _, r := range fs.requests() {
			if rel := r.GetRelease(); rel != nil && rel.GetName() == "x" && rel.GetFencingToken() == 9 {
				return true
			}
		}
		return false
	})
}

// The TTL the service granted is the session's (finding 12), for the client and each lock.
func TestTheGrantedTTLIsTheSessions(t *testing.T) {
	c, err := New([]string{"127.0.0.1:1"}, WithTTL(15*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	c.testNoNet = true
	c.testReport = func([]string) {}
	t.Cleanup(func() { stopEngine(t, c) })
	if c.SessionTTL() != 15*time.Second {
		t.Fatal("no session yet: the TTL asked for")
	}
	s := c.opened(&pb.OpenSessionResponse{SessionId: "s", TtlMs: 20_000, KeepaliveEveryMs: 1e9}, monotonic(), nil)
	lk := newLock(c, c.testHold(s, "x", 1, monotonic(), 1, 0))
	if c.SessionTTL() != 20*time.Second || lk.SessionTTL() != 20*time.Second || c.TTL() != 15*time.Second {
		t.Fatalf("granted %s / %s, asked %s", c.SessionTTL(), lk.SessionTTL(), c.TTL())
	}
}
