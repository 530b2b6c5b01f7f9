package lockd_test

// Every row of clients/scenarios.md against a real 3-node `lockd dev`; each test carries the
// marker of the row it covers (the word scenario, a colon and the row's id, in a comment).

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	lockd "github.com/lockd-dev/lockd/clients/go"
	"github.com/lockd-dev/lockd/clients/go/fencing"
	"github.com/lockd-dev/lockd/clients/go/internal/pb"
	"github.com/lockd-dev/lockd/clients/go/internal/testcluster"
)

// scenario: try-lock
func TestTryLockNamesTheHolderAndTokensGrow(t *testing.T) {
	cl := shared.Get(t)
	name := lockName(t)
	a, b := newClient(t, cl), newClient(t, cl)
	lk, err := a.TryAcquire(ctxFor(t, 10*time.Second), name, lockd.WithOwner("first"))
	if err != nil {
		t.Fatal(err)
	}
	if lk.Token() == 0 || lk.IsLost() || lk.Reentry() != 1 {
		t.Fatalf("token %d lost %v reentry %d", lk.Token(), lk.IsLost(), lk.Reentry())
	}
	started := time.Now()
	_, err = b.TryAcquire(ctxFor(t, 10*time.Second), name)
	le := lockErr(t, err)
	if !errors.Is(err, lockd.ErrNotAcquired) || le.Holder != "first" || le.Retryable() || !strings.Contains(le.Error(), `"first"`) {
		t.Fatalf("want not acquired naming first, got %v (holder %q)", err, le.Holder)
	}
	if took := time.Since(started); took > 2*time.Second {
		t.Fatalf("a try-lock refused at once, took %s", took)
	}
	if got := holders(t, b, name); len(got) != 1 || got[0] != lk.Token() {
		t.Fatalf("holders %v", got)
	}
	if _, err := lk.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	lk2, err := b.TryAcquire(ctxFor(t, 10*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	if lk2.Token() <= lk.Token() {
		t.Fatalf("B's token %d not above A's %d", lk2.Token(), lk.Token())
	}
	// CheckToken: the holder's token is valid, the previous holder's is not.
	if v, newest, err := b.CheckToken(ctxFor(t, 10*time.Second), name, lk2.Token()); err != nil || !v || newest != lk2.Token() {
		t.Fatalf("check current: %v %d %v", v, newest, err)
	}
	if v, newest, err := b.CheckToken(ctxFor(t, 10*time.Second), name, lk.Token()); err != nil || v || newest != lk2.Token() {
		t.Fatalf("check old: %v %d %v", v, newest, err)
	}
	if _, err := lk2.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
}

// scenario: fifo-wait
func TestFIFOWaitersAreGrantedInOrderByThePushedGrant(t *testing.T) {
	cl := shared.Get(t)
	name := lockName(t)
	a, b, c := newClient(t, cl), newClient(t, cl), newClient(t, cl)
	holder, err := a.TryAcquire(ctxFor(t, 10*time.Second), name, lockd.WithOwner("A"))
	if err != nil {
		t.Fatal(err)
	}
	type grant struct {
		lk  *lockd.Lock
		err error
		at  time.Time
	}
	wait := func(cl *lockd.Client, owner string) chan grant {
		ch := make(chan grant, 1)
		go func() {
			lk, err := cl.Acquire(ctxFor(t, 30*time.Second), name, lockd.WithOwner(owner))
			ch <- grant{lk, err, time.Now()}
		}()
		return ch
	}
	queued := func(n int) func() bool {
		return func() bool {
			st, err := a.Inspect(context.Background(), name)
			return err == nil && len(st.Waiters) == n
		}
	}
	bCh := wait(b, "B")
	waitUntil(t, "B queued", 10*time.Second, queued(1))
	cCh := wait(c, "C") // C starts after B is queued
	waitUntil(t, "C queued", 10*time.Second, queued(2))
	st, _ := a.Inspect(ctxFor(t, 5*time.Second), name)
	if st.Waiters[0].Owner != "B" || st.Waiters[1].Owner != "C" {
		t.Fatalf("queue %+v", st.Waiters)
	}
	released := time.Now()
	if _, err := holder.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	var gb grant
	select {
	case gb = <-bCh:
	case <-time.After(10 * time.Second):
		t.Fatal("B was not granted")
	}
	if gb.err != nil {
		t.Fatal(gb.err)
	}
	// Pushed at once, well within the 30 s wait (no polling: the client sent one acquire).
	if d := gb.at.Sub(released); d > 3*time.Second {
		t.Fatalf("B granted %s after the release", d)
	}
	select {
	case g := <-cCh:
		t.Fatalf("C overtook B: %+v", g)
	case <-time.After(300 * time.Millisecond): // let a wrong grant show itself
	}
	released = time.Now()
	if _, err := gb.lk.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	gc := <-cCh
	if gc.err != nil {
		t.Fatal(gc.err)
	}
	if d := gc.at.Sub(released); d > 3*time.Second {
		t.Fatalf("C granted %s after B's release", d)
	}
	// One acquire each: the grant was pushed, the client did not poll.
	if nb, nc := lockd.AcquiresSent(b), lockd.AcquiresSent(c); nb != 1 || nc != 1 {
		t.Fatalf("acquires sent: B %d, C %d (want one each)", nb, nc)
	}
	if !(holder.Token() < gb.lk.Token() && gb.lk.Token() < gc.lk.Token()) {
		t.Fatalf("tokens A %d B %d C %d", holder.Token(), gb.lk.Token(), gc.lk.Token())
	}
	_, _ = gc.lk.Release(ctxFor(t, 10*time.Second))
}

// scenario: modes
func TestSharedExclusiveAndSemaphoreModes(t *testing.T) {
	cl := shared.Get(t)
	name := lockName(t)
	a, b, c := newClient(t, cl), newClient(t, cl), newClient(t, cl)
	ctx := ctxFor(t, 30*time.Second)
	s1, err := a.TryAcquire(ctx, name, lockd.SharedMode())
	if err != nil {
		t.Fatal(err)
	}
	s2, err := b.TryAcquire(ctx, name, lockd.SharedMode())
	if err != nil {
		t.Fatal(err)
	}
	if s1.Mode() != lockd.Shared || s2.Token() == 0 {
		t.Fatal("shared holds")
	}
	if _, err := c.TryAcquire(ctx, name); !errors.Is(err, lockd.ErrNotAcquired) {
		t.Fatalf("an exclusive try beside shared holders: %v", err)
	}
	_, _ = s1.Release(ctx)
	_, _ = s2.Release(ctx)

	sem := name + "/sem"
	p1, err := a.TryAcquire(ctx, sem, lockd.SemaphoreMode(2))
	if err != nil {
		t.Fatal(err)
	}
	p2, err := b.TryAcquire(ctx, sem, lockd.SemaphoreMode(2))
	if err != nil {
		t.Fatal(err)
	}
	if p1.Token() == p2.Token() {
		t.Fatal("each permit has its own token")
	}
	if _, err := c.TryAcquire(ctx, sem, lockd.SemaphoreMode(2)); !errors.Is(err, lockd.ErrNotAcquired) {
		t.Fatalf("a third permit: %v", err)
	}
	_, err = c.TryAcquire(ctx, sem, lockd.SemaphoreMode(3)) // every user must use the same limit
	if le := lockErr(t, err); le.Code != "mode_conflict" || le.Status != 409 || !errors.Is(err, lockd.ErrConflict) {
		t.Fatalf("another limit: %v", err)
	}
	if _, err := p1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	p3, err := c.TryAcquire(ctx, sem, lockd.SemaphoreMode(2))
	if err != nil {
		t.Fatalf("the third is granted once one releases: %v", err)
	}
	_, _ = p2.Release(ctx)
	_, _ = p3.Release(ctx)
	if _, err := a.TryAcquire(ctx, sem, lockd.SemaphoreMode(0)); !errors.Is(err, lockd.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "1..=10000") {
		t.Fatalf("limit 0: %v", err)
	}
}

// scenario: reentrant
func TestReentrantHoldsShareATokenAndReleaseInTurn(t *testing.T) {
	cl := shared.Get(t)
	name := lockName(t)
	c := newClient(t, cl)
	ctx := ctxFor(t, 30*time.Second)
	first, err := c.TryAcquire(ctx, name, lockd.Reentrant())
	if err != nil {
		t.Fatal(err)
	}
	second, err := c.TryAcquire(ctx, name, lockd.Reentrant())
	if err != nil {
		t.Fatal(err)
	}
	if second.Token() != first.Token() || second.Reentry() != 2 {
		t.Fatalf("second grant: token %d (first %d) reentry %d", second.Token(), first.Token(), second.Reentry())
	}
	_, err = c.TryAcquire(ctx, name) // the same session and owner without re-entrancy
	if le := lockErr(t, err); le.Code != "already_held" || le.Retryable() || !errors.Is(err, lockd.ErrConflict) {
		t.Fatalf("without reentrant: %v", err)
	}
	if n, err := second.Release(ctx); err != nil || n != 1 {
		t.Fatalf("first release: %d %v", n, err)
	}
	st, _ := c.Inspect(ctx, name)
	if len(st.Holders) != 1 || st.Holders[0].Reentry != 1 {
		t.Fatalf("still held once: %+v", st.Holders)
	}
	if n, err := first.Release(ctx); err != nil || n != 0 {
		t.Fatalf("second release: %d %v", n, err)
	}
	if got := holders(t, c, name); len(got) != 0 {
		t.Fatalf("free after the second release: %v", got)
	}
}

// scenario: acquire-all
func TestAcquireAllInSortedOrderWithOneDeadline(t *testing.T) {
	cl := shared.Get(t)
	name := lockName(t)
	c, other := newClient(t, cl), newClient(t, cl)
	names := []string{name + "/c", name + "/a", name + "/b", name + "/a"}
	set, err := c.AcquireAll(ctxFor(t, 5*time.Second), names)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range set.Locks {
		got = append(got, l.Name())
	}
	if want := []string{name + "/a", name + "/b", name + "/c"}; strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("order %v", got)
	}
	// Tokens rise in the order taken (one group, one revision counter, sorted order).
	if err := set.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	blocker, err := other.TryAcquire(ctxFor(t, 10*time.Second), name+"/b")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	started := time.Now()
	_, err = c.AcquireAll(ctx, names)
	took := time.Since(started)
	if !errors.Is(err, lockd.ErrNotAcquired) {
		t.Fatalf("want not acquired, got %v", err)
	}
	if took < time.Second || took > 4*time.Second {
		t.Fatalf("one overall deadline of 1.5 s, took %s", took)
	}
	// /a was taken before the failure and released; /c was never taken.
	for _, n := range []string{name + "/a", name + "/c"} {
		if h := holders(t, other, n); len(h) != 0 {
			t.Fatalf("%s is still held: %v", n, h)
		}
	}
	done := make(chan error, 1)
	var set2 *lockd.LockSet
	go func() {
		var err error
		set2, err = c.AcquireAll(ctxFor(t, 20*time.Second), names)
		done <- err
	}()
	waitUntil(t, "the set to queue on /b", 10*time.Second, func() bool {
		st, err := other.Inspect(context.Background(), name+"/b")
		return err == nil && len(st.Waiters) == 1
	})
	if h := holders(t, other, name+"/c"); len(h) != 0 {
		t.Fatal("/c taken before /b: not sorted order")
	}
	if _, err := blocker.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(set2.Tokens()) != 3 || set2.IsLost() {
		t.Fatalf("all three: %v", set2.Tokens())
	}
	_ = set2.Release(ctxFor(t, 10*time.Second))
}

// scenario: bearer-token
func TestBearerTokenIsSentOnEveryCall(t *testing.T) {
	cl := shared.Get(t)
	secure := "secure/" + lockName(t)
	ctx := ctxFor(t, 60*time.Second)
	// A default-namespace session may not take another namespace's names, whatever the token.
	c := newClient(t, cl, lockd.WithToken(testcluster.SecureToken))
	_, err := c.TryAcquire(ctx, secure)
	if le := lockErr(t, err); le.Code != "wrong_namespace" || le.Status != 403 || !errors.Is(err, lockd.ErrPermissionDenied) {
		t.Fatalf("wrong namespace: %v", err)
	}
	// Without a token: refused at the session's open, typed, not retried, naming the namespace.
	c = newClient(t, cl, lockd.WithNamespace("secure"))
	started := time.Now()
	_, err = c.TryAcquire(ctx, secure)
	le := lockErr(t, err)
	if !errors.Is(err, lockd.ErrUnauthenticated) || le.Status != 401 || le.Retryable() || !strings.Contains(le.Message, "secure") {
		t.Fatalf("without a token: %v", err)
	}
	if time.Since(started) > 2*time.Second {
		t.Fatal("refused at once, not retried")
	}
	// A wrong token.
	c = newClient(t, cl, lockd.WithNamespace("secure"), lockd.WithToken("not-the-token"))
	_, err = c.TryAcquire(ctx, secure)
	le = lockErr(t, err)
	if !(errors.Is(err, lockd.ErrUnauthenticated) || errors.Is(err, lockd.ErrPermissionDenied)) || le.Retryable() ||
		!strings.Contains(le.Message, "secure") {
		t.Fatalf("a wrong token: %v", err)
	}
	// The right token: granted, and keepalives (with the metadata) keep it.
	c = newClient(t, cl, lockd.WithNamespace("secure"), lockd.WithToken(testcluster.SecureToken))
	lk, err := c.TryAcquire(ctx, secure)
	if err != nil {
		t.Fatal(err)
	}
	if h := holders(t, c, secure); len(h) != 1 || h[0] != lk.Token() {
		t.Fatalf("holders %v", h)
	}
	if d, err := c.GetSession(ctx, ""); err != nil || len(d.Held) != 1 || d.Held[0].Name != secure {
		t.Fatalf("get session: %+v %v", d, err)
	}
	time.Sleep(2500 * time.Millisecond) // keepalives on the stream carry the token
	if lk.IsLost() {
		t.Fatal("lost")
	}
	if _, err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Nothing is held by the refused clients, and an inspect of a guarded name needs the token.
	if _, err := newClient(t, cl).Inspect(ctx, secure); !errors.Is(err, lockd.ErrUnauthenticated) {
		t.Fatalf("inspect without a token: %v", err)
	}
	if h := holders(t, c, secure); len(h) != 0 {
		t.Fatalf("held: %v", h)
	}
	if _, err := lockd.New(cl.Endpoints, lockd.WithToken("has space")); !errors.Is(err, lockd.ErrInvalidArgument) {
		t.Fatalf("a token with a space: %v", err)
	}
}

// scenario: input-errors
func TestInputErrorsNameTheFieldAndTheLimit(t *testing.T) {
	cl := shared.Get(t)
	c := newClient(t, cl)
	ctx := ctxFor(t, 30*time.Second)
	for _, tc := range []struct {
		name, want string
	}{
		{"", "1..=512 bytes"},
		{strings.Repeat("x", 513), "1..=512 bytes"},
		{"pay\u202eexe.sh", "U+202E"},
	} {
		_, err := c.TryAcquire(ctx, tc.name)
		le := lockErr(t, err)
		if !errors.Is(err, lockd.ErrInvalidArgument) || le.Retryable() || !strings.Contains(le.Message, "name") ||
			!strings.Contains(le.Message, tc.want) {
			t.Fatalf("name %q: %v", tc.name, err)
		}
	}
	_, err := c.TryAcquire(ctx, "ok", lockd.WithOwner(strings.Repeat("o", 300)))
	if !errors.Is(err, lockd.ErrInvalidArgument) || !strings.Contains(err.Error(), "owner must be at most 256 bytes (got 300)") {
		t.Fatalf("owner: %v", err)
	}
	if c.SessionID() != "" {
		t.Fatal("refused before anything was sent: no session")
	}
	// A TTL above the namespace's maximum (60 s): the service refuses the session's open.
	long := newClient(t, cl, lockd.WithTTL(61*time.Second))
	name := lockName(t)
	_, err = long.TryAcquire(ctx, name)
	le := lockErr(t, err)
	if !errors.Is(err, lockd.ErrInvalidArgument) || le.Code != "ttl_out_of_range" || le.Retryable() ||
		!strings.Contains(le.Message, "ttl") || !strings.Contains(le.Message, "60000") {
		t.Fatalf("ttl above the maximum: %v", err)
	}
	if _, err := lockd.New(cl.Endpoints, lockd.WithTTL(0)); !errors.Is(err, lockd.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "ttl must lie in") {
		t.Fatalf("ttl 0: %v", err)
	}
	if h := holders(t, c, name); len(h) != 0 {
		t.Fatalf("held: %v", h)
	}
}

// scenario: stale-release
func TestAStaleReleaseIsRefusedWithATypedError(t *testing.T) {
	cl := shared.Get(t)
	name := lockName(t)
	c := newClient(t, cl)
	ctx := ctxFor(t, 30*time.Second)
	old, err := c.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := old.Release(ctx); err != nil {
		t.Fatal(err)
	}
	cur, err := c.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	_, err = lockd.ReleaseToken(ctx, c, cur.SessionID(), name, old.Token())
	le := lockErr(t, err)
	if !errors.Is(err, lockd.ErrConflict) || (le.Code != "stale_token" && le.Code != "not_holder") || le.Retryable() {
		t.Fatalf("a stale release: %v", err)
	}
	if time.Since(started) > 2*time.Second {
		t.Fatal("not retried")
	}
	if h := holders(t, c, name); len(h) != 1 || h[0] != cur.Token() {
		t.Fatalf("the current holder still holds: %v", h)
	}
	if _, err := cur.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// scenario: lost-on-close
func TestLostFiresWhenTheSessionIsClosedHereOrElsewhere(t *testing.T) {
	cl := shared.Get(t)
	name := lockName(t)
	ctx := ctxFor(t, 60*time.Second)
	c, err := lockd.New(cl.Endpoints, lockd.WithTTL(6*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	lk, err := c.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Close(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lk.Lost():
	case <-time.After(3 * time.Second):
		t.Fatal("Lost not closed after Close")
	}
	if !lk.IsLost() {
		t.Fatal("IsLost")
	}

	// From outside: a unary CloseSession naming the session, on another connection.
	c = newClient(t, cl)
	lk, err = c.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	first := lk.SessionID()
	conn, err := grpc.NewClient(cl.Endpoints[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := pb.NewLockClient(conn).CloseSession(ctx, &pb.CloseSessionRequest{SessionId: first}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lk.Lost():
	case <-time.After(3 * time.Second):
		t.Fatal("Lost not closed after a CloseSession from outside")
	}
	if !strings.Contains(lk.LostReason(), "closed") {
		t.Fatalf("reason %q", lk.LostReason())
	}
	lk2, err := c.TryAcquire(ctx, name) // a later acquire opens a new session
	if err != nil {
		t.Fatal(err)
	}
	if lk2.SessionID() == first || lk2.Token() <= lk.Token() {
		t.Fatal("a new session, a newer token")
	}
	_, _ = lk2.Release(ctx)
}

// scenario: lost-before-expiry
func TestLostFiresAtTheLocalDeadlineBeforeTheServerExpiry(t *testing.T) {
	cl := shared.Get(t)
	name := lockName(t)
	// A wide margin (2.5 s of the 5 s TTL) leaves the check seconds before the service may
	// expire the session, even on a slow machine.
	c := newClient(t, cl, lockd.WithTTL(5*time.Second), lockd.WithMargin(2500*time.Millisecond))
	other := newClient(t, cl)
	w := other.Watch(name)
	defer w.Close()
	if err := w.Open(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	lk, err := c.TryAcquire(ctxFor(t, 10*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	lockd.PauseKeepalives(c, true) // the renewal loop sends nothing from now on
	deadline := lk.Deadline()
	select {
	case <-lk.Lost():
	case <-time.After(8 * time.Second):
		t.Fatal("Lost did not fire")
	}
	fired := time.Now()
	if d := fired.Sub(deadline); d < -50*time.Millisecond || d > 500*time.Millisecond {
		t.Fatalf("Lost fired %s from the local deadline", d)
	}
	// The service has not expired the session yet: the local deadline comes first.
	if h := holders(t, other, name); len(h) != 1 || h[0] != lk.Token() {
		t.Fatalf("the service still shows the hold: %v", h)
	}
	if time.Since(deadline) > 2500*time.Millisecond {
		t.Fatal("the check came after the margin")
	}
	if c.LeaseExpiredCount() != 1 {
		t.Fatalf("lease expired count %d", c.LeaseExpiredCount())
	}
	// Later the service expires the session: the hold ends by expiry, after the local deadline.
	for {
		ev, err := w.Next(ctxFor(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if ev.Kind == "hold_ended" {
			if ev.Cause != "expire" || ev.Token != lk.Token() {
				t.Fatalf("the hold ended by %+v", ev)
			}
			if time.Now().Before(deadline) {
				t.Fatal("the service expired it before the local deadline")
			}
			break
		}
	}
}

func groupLeader(t *testing.T, c *lockd.Client, group uint32) uint64 {
	st, err := c.Status(ctxFor(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range st.Groups {
		if g.ID == group {
			return g.Leader
		}
	}
	return 0
}

// scenario: leader-kill
func TestLeaderKillKeepsTheLock(t *testing.T) {
	cl := testcluster.Fresh(t, freshHTTP, freshGRPC, freshPeer)
	name := lockName(t)
	ttl := 6 * time.Second
	probe := newClient(t, cl, lockd.WithTTL(ttl))
	plk, err := probe.TryAcquire(ctxFor(t, 10*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	group := plk.Group()
	_, _ = plk.Release(ctxFor(t, 10*time.Second))
	leader := int(groupLeader(t, probe, group))
	if leader == 0 {
		t.Fatal("the group has no leader")
	}
	leaderEP := cl.EndpointOf(leader)
	eps := []string{leaderEP}
	for _, e := range cl.Endpoints {
		if e != leaderEP {
			eps = append(eps, e)
		}
	}
	c, err := lockd.New(eps, lockd.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	lk, err := c.Acquire(ctxFor(t, 10*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	if c.Endpoint() != leaderEP {
		t.Fatalf("the stream is on %s, not the leader %s", c.Endpoint(), leaderEP)
	}
	time.Sleep(500 * time.Millisecond)
	killedAt := time.Now()
	if err := cl.Signal(leader, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// A keepalive sent after the kill was acknowledged: the deadline moved past what the last
	// pre-kill renewal could give.
	waitUntil(t, "a renewal acknowledged after the leader's death", ttl, func() bool {
		return lk.Deadline().After(killedAt.Add(ttl - ttl/5 + 50*time.Millisecond))
	})
	if lk.IsLost() {
		t.Fatal("the lock must survive the failover")
	}
	if c.Endpoint() == leaderEP {
		t.Fatal("the session stream did not move")
	}
	waitUntil(t, "the new leader to answer", 10*time.Second, func() bool {
		st, err := c.Inspect(context.Background(), name)
		return err == nil && len(st.Holders) == 1 && st.Holders[0].Token == lk.Token()
	})
	if nl := groupLeader(t, c, group); nl == 0 || int(nl) == leader {
		t.Fatalf("new leader %d", nl)
	}
	// Keep holding for two TTLs.
	end := time.Now().Add(2 * ttl)
	for time.Now().Before(end) {
		if lk.IsLost() {
			t.Fatalf("lost during the hold: %s", lk.LostReason())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if c.LeaseExpiredCount() != 0 {
		t.Fatal("a lease expired")
	}
	if n, err := lk.Release(ctxFor(t, 10*time.Second)); err != nil || n != 0 {
		t.Fatalf("release after the failover: %d %v", n, err)
	}
	after, err := lockd.New(eps[1:], lockd.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer after.Close(context.Background())
	lk2, err := after.Acquire(ctxFor(t, 10*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	if lk2.Token() <= lk.Token() {
		t.Fatal("tokens grow across the failover")
	}
}

type worker struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  chan map[string]any
	paused bool
}

func (w *worker) read(t *testing.T, d time.Duration) map[string]any {
	t.Helper()
	select {
	case m, ok := <-w.lines:
		if !ok {
			t.Fatal("the worker exited without a line")
		}
		return m
	case <-time.After(d):
		t.Fatalf("the worker said nothing in %s", d)
	}
	return nil
}

// scenario: pause-fenced
func TestAPausedWorkerSeesLostAndIsFencedOut(t *testing.T) {
	cl := shared.Get(t)
	dsn := pgDSN(t)
	name := lockName(t)
	ttl := 5.0
	table := fmt.Sprintf("lockd_go_test_%d", os.Getpid())
	key := "payouts/m-1"
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	bg := context.Background()
	if _, err := db.ExecContext(bg, "DROP TABLE IF EXISTS "+table); err != nil {
		t.Fatal(err)
	}
	if err := fencing.CreateTable(bg, db, fencing.Table(table)); err != nil {
		t.Fatal(err)
	}
	defer db.ExecContext(bg, "DROP TABLE IF EXISTS "+table)

	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	w := &worker{cmd: exec.Command(self, "-test.run=^$"), lines: make(chan map[string]any, 4)}
	w.cmd.Env = append(os.Environ(), "LOCKD_GO_TESTWORKER=1", "W_ENDPOINTS="+strings.Join(cl.Endpoints, ","),
		"W_NAME="+name, fmt.Sprintf("W_TTL=%g", ttl), "W_PG="+dsn, "W_TABLE="+table, "W_KEY="+key)
	w.cmd.Stderr = os.Stderr
	out, err := w.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if w.stdin, err = w.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := w.cmd.Process.Pid
	defer func() {
		if w.cmd.ProcessState == nil {
			if w.paused {
				_ = syscall.Kill(pid, syscall.SIGCONT)
			}
			_ = w.cmd.Process.Kill()
			_ = w.cmd.Wait()
		}
	}()
	go func() {
		defer close(w.lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				w.lines <- m
			}
		}
	}()
	first := w.read(t, 30*time.Second)
	if first["step"] != "acquired" {
		t.Fatalf("worker: %v", first)
	}
	workerToken := uint64(first["token"].(float64))
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	w.paused = true
	waitUntil(t, "the worker to be stopped", 5*time.Second, func() bool { return testcluster.ProcState(pid) == "T" })
	pausedAt := time.Now()
	c := newClient(t, cl, lockd.WithTTL(5*time.Second))
	// The worker's session expires on the service (a stopped process sends no keepalive); the
	// lock goes to us, the next waiter.
	lk, err := c.Acquire(ctxFor(t, 20*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	waited := time.Since(pausedAt)
	if lk.Token() <= workerToken {
		t.Fatalf("token %d not above the worker's %d", lk.Token(), workerToken)
	}
	if waited < time.Duration((ttl-1.5)*float64(time.Second)) {
		t.Fatalf("granted %s into the pause: before the TTL?", waited)
	}
	if err := fencing.Write(bg, db, lk, key, "next-holder", fencing.Table(table)); err != nil {
		t.Fatal(err)
	}
	if testcluster.ProcState(pid) != "T" {
		t.Fatal("the worker stayed stopped throughout")
	}
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	w.paused = false
	if _, err := io.WriteString(w.stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	res := w.read(t, 20*time.Second)
	if res["step"] != "resumed" {
		t.Fatalf("worker: %v", res)
	}
	if res["lost"] != true {
		t.Fatalf("lost is set at the local deadline, before the write: %v", res)
	}
	if res["guarded"] != "lost" {
		t.Fatalf("the guarded write refuses locally once lost: %v", res)
	}
	if res["raw"] != "rejected" {
		t.Fatalf("the store refuses the stale token: %v", res)
	}
	if res["lease_expired"].(float64) < 1 {
		t.Fatalf("the expiry is counted: %v", res)
	}
	var value string
	var fence int64
	if err := db.QueryRowContext(bg, "SELECT value, fence FROM "+table+" WHERE key = $1", key).Scan(&value, &fence); err != nil {
		t.Fatal(err)
	}
	if value != "next-holder" || uint64(fence) != lk.Token() {
		t.Fatalf("row (%q, %d), want the second holder's (next-holder, %d)", value, fence, lk.Token())
	}
	_, _ = lk.Release(ctxFor(t, 10*time.Second))
	_ = w.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- w.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("the worker exited with %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the worker did not exit")
	}
}

// scenario: watch
func TestAWatchSeesEachChangeOnceInOrderAndAPrefixItsNames(t *testing.T) {
	cl := shared.Get(t)
	name := lockName(t)
	c, other := newClient(t, cl), newClient(t, cl)
	ctx := ctxFor(t, 60*time.Second)
	w := c.Watch(name)
	defer w.Close()
	pw := c.WatchPrefix(name + "/")
	defer pw.Close()
	if err := w.Open(ctx); err != nil {
		t.Fatal(err)
	}
	if err := pw.Open(ctx); err != nil {
		t.Fatal(err)
	}
	next := func(w *lockd.Watch) lockd.WatchEvent {
		t.Helper()
		ev, err := w.Next(ctxFor(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}
	lk, err := other.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	started, ended := next(w), next(w)
	if started.Kind != "hold_started" || started.Name != name || started.Token != lk.Token() || started.Owner != lk.Owner() ||
		started.LeaseTTLMs != 6000 {
		t.Fatalf("started %+v", started)
	}
	if ended.Kind != "hold_ended" || ended.Cause != "release" || ended.Token != lk.Token() {
		t.Fatalf("ended %+v", ended)
	}
	if ended.Index <= started.Index || ended.Group != started.Group || started.Group != lk.Group() {
		t.Fatalf("revisions: %+v %+v", started, ended)
	}
	if ps := w.Positions(); len(ps) == 0 || ps[0].Group != lk.Group() {
		t.Fatalf("positions %+v", ps)
	}
	// A name under the prefix: the prefix watch sees it, the name's watch does not, and a
	// caller that stops waiting loses nothing.
	child, err := other.TryAcquire(ctx, name+"/a")
	if err != nil {
		t.Fatal(err)
	}
	ev := next(pw)
	if ev.Kind != "hold_started" || ev.Name != name+"/a" || ev.Token != child.Token() {
		t.Fatalf("prefix %+v", ev)
	}
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	if _, err := w.Next(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the name's watch sees nothing of the child: %v", err)
	}
	cancel()
	again, err := other.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if ev := next(w); ev.Kind != "hold_started" || ev.Token != again.Token() || again.Token() <= lk.Token() {
		t.Fatalf("again %+v", ev)
	}
	_, _ = again.Release(ctx)
	_, _ = child.Release(ctx)
	if ev := next(w); ev.Kind != "hold_ended" || ev.Token != again.Token() {
		t.Fatalf("%+v", ev)
	}
	if ev := next(pw); ev.Kind != "hold_ended" || ev.Name != name+"/a" {
		t.Fatalf("%+v", ev)
	}
	// The name itself is not under name + "/": the prefix watch saw only its child.
	short, cancel = context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if ev, err := pw.Next(short); err == nil {
		t.Fatalf("the prefix watch saw %+v", ev)
	}
	w.Close()
	if _, err := w.Next(ctx); !errors.Is(err, lockd.ErrClientClosed) {
		t.Fatalf("a closed watch ends: %v", err)
	}
	if err := c.Watch("").Open(ctx); !errors.Is(err, lockd.ErrInvalidArgument) {
		t.Fatalf("an empty watch: %v", err)
	}
}

// scenario: election
func TestElectionLeadersChangeOnResignAndAnObserverFollows(t *testing.T) {
	cl := shared.Get(t)
	name := lockName(t)
	obs, a, b := newClient(t, cl), newClient(t, cl), newClient(t, cl)
	ctx := ctxFor(t, 60*time.Second)
	octx, stop := context.WithCancel(ctx)
	defer stop()
	seen := obs.Election(name).Observe(octx)
	next := func() *lockd.Leader {
		t.Helper()
		select {
		case l, ok := <-seen:
			if !ok {
				t.Fatal("the observer ended")
			}
			return l
		case <-time.After(10 * time.Second):
			t.Fatal("the observer saw nothing")
		}
		return nil
	}
	if l := next(); l != nil {
		t.Fatalf("nobody leads yet: %+v", l)
	}
	first, err := a.Election(name).Campaign(ctxFor(t, 5*time.Second), "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if l := next(); l == nil || l.Value != "node-a" || l.Token != first.Token() {
		t.Fatalf("first leader %+v", l)
	}
	secondCh := make(chan *lockd.Leadership, 1)
	go func() {
		s, err := b.Election(name).Campaign(ctxFor(t, 20*time.Second), "node-b")
		if err != nil {
			t.Error(err)
		}
		secondCh <- s
	}()
	waitUntil(t, "node-b to queue", 10*time.Second, func() bool {
		st, err := obs.Inspect(context.Background(), name)
		return err == nil && len(st.Waiters) == 1
	})
	if ld, err := obs.Election(name).Leader(ctx); err != nil || ld == nil || ld.Value != "node-a" {
		t.Fatalf("one leader at a time: %+v %v", ld, err)
	}
	if err := first.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	second := <-secondCh
	if second == nil {
		t.Fatal("no second leader")
	}
	l := next()
	if l == nil { // the hand-off's end and start are two changes
		l = next()
	}
	if l == nil || l.Value != "node-b" || l.Token != second.Token() || second.Token() <= first.Token() {
		t.Fatalf("second leader %+v (first token %d)", l, first.Token())
	}
	if !first.IsLost() && first.Lock.Released() == false {
		t.Fatal("the first resigned")
	}
	_ = second.Resign(ctx)
	if l := next(); l != nil {
		t.Fatalf("nobody leads after the resign: %+v", l)
	}
}

// scenario: full-namespace
func TestAFullNamespaceRefusesASessionAtOnce(t *testing.T) {
	cl := shared.Get(t)
	name := lockName(t)
	ctx := ctxFor(t, 60*time.Second)
	first := newClient(t, cl, lockd.WithNamespace("solo"))
	lk, err := first.TryAcquire(ctx, "solo/"+name)
	if err != nil {
		t.Fatal(err)
	}
	second := newClient(t, cl, lockd.WithNamespace("solo"))
	started := time.Now()
	_, err = second.TryAcquire(ctx, "solo/"+name+"-b")
	took := time.Since(started)
	le := lockErr(t, err)
	if !errors.Is(err, lockd.ErrResourceExhausted) || le.Code != "too_many_sessions" || le.Status != 429 || le.Retryable() {
		t.Fatalf("want too_many_sessions, got %v", err)
	}
	if !strings.Contains(le.Message, "max_sessions") {
		t.Fatalf("the message names the limit: %q", le.Message)
	}
	if took > 900*time.Millisecond { // the service's answer at once, not after backoff
		t.Fatalf("took %s", took)
	}
	_, _ = lk.Release(ctx)
	if err := first.Close(ctx); err != nil {
		t.Fatal(err)
	}
	third := newClient(t, cl, lockd.WithNamespace("solo"))
	lk3, err := third.TryAcquire(ctx, "solo/"+name+"-c")
	if err != nil {
		t.Fatalf("the namespace takes a new session once the first closed: %v", err)
	}
	_, _ = lk3.Release(ctx)
}

// scenario: tls
func TestTLSWithTheCAAndWithoutIt(t *testing.T) {
	cl := tlsShared.Get(t)
	name := lockName(t)
	ctx := ctxFor(t, 60*time.Second)
	if _, err := os.Stat(cl.CAFile()); err != nil {
		t.Fatalf("lockd dev --tls wrote no CA at %s: %v", cl.CAFile(), err)
	}
	c := newClient(t, cl) // the cluster's CA (WithCAFile)
	lk, err := c.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if lk.Token() < 1 || lk.IsLost() {
		t.Fatal("granted over TLS")
	}
	if _, err := lk.Release(ctx); err != nil {
		t.Fatal(err)
	}
	once := lockd.WithRetryPolicy(lockd.RetryPolicy{MaxAttempts: 1, Base: 0, Cap: 0})
	// TLS trusting only the system's roots, which do not know the throwaway CA.
	var https []string
	for _, e := range cl.Endpoints {
		https = append(https, "https://"+e)
	}
	sys, err := lockd.New(https, lockd.WithRequestTimeout(time.Second), once)
	if err != nil {
		t.Fatal(err)
	}
	defer sys.Close(ctx)
	_, err = sys.TryAcquire(ctx, name)
	if err == nil || !strings.Contains(err.Error(), "give its CA (WithCAFile)") {
		t.Fatalf("without the CA: %v", err)
	}
	// Plain text against the TLS port.
	plain, err := lockd.New(cl.Endpoints, lockd.WithRequestTimeout(time.Second), once)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close(ctx)
	_, err = plain.TryAcquire(ctx, name)
	if err == nil || !strings.Contains(err.Error(), "WithCAFile") {
		t.Fatalf("in plain text: %v", err)
	}
}

// ----- beyond the table ----------------------------------------------------------------------

func TestALockRecordsItsGroupAndFollowsItsLease(t *testing.T) {
	cl := shared.Get(t)
	name := lockName(t)
	c := newClient(t, cl)
	ctx := ctxFor(t, 30*time.Second)
	lk, err := c.TryAcquire(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	lk2, err := c.TryAcquire(ctx, name+"/2")
	if err != nil {
		t.Fatal(err)
	}
	d, err := c.GetSession(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint32{}
	for _, h := range d.Held {
		got[h.Name] = h.Group
	}
	if got[name] != lk.Group() || got[name+"/2"] != lk2.Group() || len(got) != 2 {
		t.Fatalf("the service's groups %v, the locks' %d %d", got, lk.Group(), lk2.Group())
	}
	st, err := c.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	groups := map[uint32]bool{}
	for _, g := range st.Groups {
		groups[g.ID] = true
	}
	if !groups[lk.Group()] || !groups[lk2.Group()] || lk.Group() == 0 {
		t.Fatalf("lock groups %d %d not among %v", lk.Group(), lk2.Group(), groups)
	}
	first := lk.Deadline()
	waitUntil(t, "a keepalive reply", 6*time.Second, func() bool { return lk.Deadline().After(first) })
	if lk.IsLost() || lk2.IsLost() {
		t.Fatal("lost")
	}
	_, _ = lk2.Release(ctx)
	_, _ = lk.Release(ctx)
}

func TestWatchResumesOnAnotherNodeWithNoChangeMissedOrRepeated(t *testing.T) {
	cl := testcluster.Fresh(t, freshHTTP, freshGRPC, freshPeer)
	name := lockName(t)
	victim := 1
	firstEP := cl.EndpointOf(victim)
	eps := []string{firstEP}
	for _, e := range cl.Endpoints {
		if e != firstEP {
			eps = append(eps, e)
		}
	}
	watcher, err := lockd.New(eps, lockd.WithTTL(6*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close(context.Background())
	writer, err := lockd.New(eps[1:], lockd.WithTTL(6*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Close(context.Background())
	ctx := ctxFor(t, 120*time.Second)
	w := watcher.Watch(name)
	defer w.Close()
	if err := w.Open(ctx); err != nil {
		t.Fatal(err)
	}
	var tokens []uint64
	take := func() {
		lk, err := writer.Acquire(ctxFor(t, 20*time.Second), name)
		if err != nil {
			t.Fatal(err)
		}
		tokens = append(tokens, lk.Token())
		if _, err := lk.Release(ctxFor(t, 20*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	take()
	for _, kind := range []string{"hold_started", "hold_ended"} {
		ev, err := w.Next(ctxFor(t, 10*time.Second))
		if err != nil || ev.Kind != kind {
			t.Fatalf("%s: %+v %v", kind, ev, err)
		}
	}
	// The node under the watch's stream dies; the changes made meanwhile arrive once.
	if err := cl.Signal(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		take()
	}
	var seen []lockd.WatchEvent
	for i := 0; i < 6; i++ {
		ev, err := w.Next(ctxFor(t, 30*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		seen = append(seen, ev)
	}
	for i, ev := range seen {
		want := []string{"hold_started", "hold_ended"}[i%2]
		if ev.Kind != want || ev.Token != tokens[1+i/2] {
			t.Fatalf("event %d: %+v (tokens %v)", i, ev, tokens)
		}
	}
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if ev, err := w.Next(short); err == nil {
		t.Fatalf("a repeated event: %+v", ev)
	}
}

func TestWaitsPastTheServersCapRunInRounds(t *testing.T) {
	cl := shared.Get(t)
	name := lockName(t)
	restore := lockd.SetMaxWait(1.0) // the service's 300 s, lowered to show the rounds
	defer restore()
	c, other := newClient(t, cl), newClient(t, cl)
	blocker, err := other.TryAcquire(ctxFor(t, 10*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	time.AfterFunc(2500*time.Millisecond, func() { _, _ = blocker.Release(context.Background()) })
	started := time.Now()
	lk, err := c.Acquire(ctxFor(t, 6*time.Second), name) // three rounds of 1 s before the grant
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(started); took < 2300*time.Millisecond || took > 5*time.Second || lk.Token() <= blocker.Token() {
		t.Fatalf("took %s", took)
	}
	_, _ = lk.Release(ctxFor(t, 10*time.Second))
	blocker2, err := other.TryAcquire(ctxFor(t, 10*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	started = time.Now()
	_, err = c.Acquire(ctxFor(t, 2200*time.Millisecond), name)
	if !errors.Is(err, lockd.ErrNotAcquired) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the caller's deadline ends the rounds: %v", err)
	}
	if took := time.Since(started); took < 2*time.Second || took > 4*time.Second {
		t.Fatalf("took %s", took)
	}
	_, _ = blocker2.Release(ctxFor(t, 10*time.Second))
}

func TestARetryAfterABrokenStreamTakesTheWaitItQueued(t *testing.T) {
	cl := testcluster.Fresh(t, freshHTTP, freshGRPC, freshPeer)
	name := lockName(t)
	holder := newClient(t, cl)
	held, err := holder.TryAcquire(ctxFor(t, 10*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	leader := int(groupLeader(t, holder, held.Group()))
	follower := 0
	for _, n := range cl.Nodes() {
		if n != leader {
			follower = n
			break
		}
	}
	ep := cl.EndpointOf(follower)
	eps := []string{ep}
	for _, e := range cl.Endpoints {
		if e != ep {
			eps = append(eps, e)
		}
	}
	w, err := lockd.New(eps, lockd.WithTTL(6*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(context.Background())
	type res struct {
		lk  *lockd.Lock
		err error
	}
	got := make(chan res, 1)
	go func() {
		lk, err := w.Acquire(ctxFor(t, 30*time.Second), name)
		got <- res{lk, err}
	}()
	waitUntil(t, "the wait to queue", 10*time.Second, func() bool {
		st, err := holder.Inspect(context.Background(), name)
		return err == nil && len(st.Waiters) == 1
	})
	if err := cl.Signal(follower, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	st, err := holder.Inspect(ctxFor(t, 10*time.Second), name)
	if err != nil || len(st.Waiters) != 1 {
		t.Fatalf("one wait, not two: %+v %v", st, err)
	}
	if _, err := held.Release(ctxFor(t, 10*time.Second)); err != nil {
		t.Fatal(err)
	}
	var r res
	select {
	case r = <-got:
	case <-time.After(25 * time.Second):
		t.Fatal("no answer")
	}
	if r.err != nil {
		t.Fatalf("the retry did not take its wait: %v", r.err)
	}
	if h := holders(t, holder, name); len(h) != 1 || h[0] != r.lk.Token() {
		t.Fatalf("holders %v, want [%d]", h, r.lk.Token())
	}
	if n, err := r.lk.Release(ctxFor(t, 10*time.Second)); err != nil || n != 0 {
		t.Fatal(n, err)
	}
}
