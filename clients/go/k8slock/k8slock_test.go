package k8slock_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/client-go/tools/leaderelection"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/klog/v2"

	lockd "github.com/lockd-dev/lockd/clients/go"
	"github.com/lockd-dev/lockd/clients/go/internal/pb"
	"github.com/lockd-dev/lockd/clients/go/internal/testcluster"
	"github.com/lockd-dev/lockd/clients/go/k8slock"
)

// This package's cluster: ports of its own, so that `go test ./...` may run it beside the
// client's suite.
var shared = &testcluster.Shared{HTTP: 19030, GRPC: 19130, Peer: 19230}

func TestMain(m *testing.M) {
	klog.SetOutput(os.Stderr)
	code := m.Run()
	testcluster.StopAll()
	os.Exit(code)
}

func newClient(t *testing.T, c *testcluster.Cluster, id string, ttl time.Duration) *lockd.Client {
	t.Helper()
	cl, err := lockd.New(c.Endpoints, lockd.WithTTL(ttl), lockd.WithClientName(id))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close(context.Background()) })
	return cl
}

func TestCheckTiming(t *testing.T) {
	if err := k8slock.CheckTiming(15*time.Second, 10*time.Second, 2*time.Second, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := k8slock.CheckTiming(15*time.Second, 14*time.Second, 2*time.Second, 5*time.Second); err == nil {
		t.Fatal("renew + retry above the lease")
	}
	if err := k8slock.CheckTiming(15*time.Second, 10*time.Second, 2*time.Second, 15*time.Second); err == nil {
		t.Fatal("a TTL that cannot fail over within one lease")
	}
}

type replica struct {
	id     string
	cmd    *exec.Cmd
	events chan map[string]any
}

func startReplica(t *testing.T, bin string, c *testcluster.Cluster, name, id string) *replica {
	t.Helper()
	r := &replica{id: id, events: make(chan map[string]any, 256)}
	r.cmd = exec.Command(bin, "-endpoints", strings.Join(c.Endpoints, ","), "-name", name, "-id", id,
		"-ttl", "5s", "-lease", "9s", "-renew", "6s", "-retry", "1s", "-work-every", "500ms")
	stderr, err := os.Create(filepath.Join(t.TempDir(), id+".log"))
	if err != nil {
		t.Fatal(err)
	}
	r.cmd.Stderr = stderr
	out, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if r.cmd.ProcessState == nil {
			_ = r.cmd.Process.Kill()
			_ = r.cmd.Wait()
		}
		_ = stderr.Close()
	})
	go func() {
		defer close(r.events)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			var m map[string]any
			if json.Unmarshal(sc.Bytes(), &m) == nil {
				m["at"] = time.Now()
				r.events <- m
			}
		}
	}()
	return r
}

// next is the replica's next event of one of the kinds, within d (nil: none).
func (r *replica) next(d time.Duration, kinds ...string) map[string]any {
	deadline := time.After(d)
	for {
		select {
		case m, ok := <-r.events:
			if !ok {
				return nil
			}
			for _, k := range kinds {
				if m["event"] == k {
					return m
				}
			}
		case <-deadline:
			return nil
		}
	}
}

// The example controller, two replicas as processes: the leader is SIGKILLed and the second
// takes over within one lease (LeaseDuration 9 s), with a larger fencing token.
func TestTheExampleControllerFailsOverWithinOneLease(t *testing.T) {
	c := shared.Get(t)
	bin := filepath.Join(t.TempDir(), "controller")
	build := exec.Command("go", "build", "-o", bin, "../examples/controller")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	name := "leaders/go-k8s-test-" + strings.ReplaceAll(t.Name(), "/", "_")
	lease := 9 * time.Second
	a := startReplica(t, bin, c, name, "replica-a")
	first := a.next(30*time.Second, "started_leading")
	if first == nil {
		t.Fatal("replica-a did not lead")
	}
	b := startReplica(t, bin, c, name, "replica-b")
	if nl := b.next(15*time.Second, "new_leader"); nl == nil || nl["leader"] != "replica-a" {
		t.Fatalf("replica-b should see replica-a lead: %v", nl)
	}
	if m := b.next(3*time.Second, "started_leading"); m != nil {
		t.Fatalf("two leaders at once: %v", m)
	}
	firstToken := uint64(first["token"].(float64))
	if firstToken == 0 {
		t.Fatal("a leader without a token")
	}
	cl := newClient(t, c, "observer", 6*time.Second)
	if ld, err := cl.Election(name).Leader(context.Background()); err != nil || ld == nil || ld.Value != "replica-a" || ld.Token != firstToken {
		t.Fatalf("the lockd holder is replica-a with its token: %+v %v", ld, err)
	}
	killed := time.Now()
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	second := b.next(2*lease, "started_leading")
	if second == nil {
		t.Fatal("replica-b did not take over")
	}
	took := second["at"].(time.Time).Sub(killed)
	t.Logf("replica-b led %s after replica-a was killed (lease %s)", took, lease)
	if took > lease {
		t.Fatalf("failover took %s, more than one lease (%s)", took, lease)
	}
	if tok := uint64(second["token"].(float64)); tok <= firstToken {
		t.Fatalf("the new leader's token %d is not above %d", tok, firstToken)
	}
	if m := b.next(2*time.Second, "working"); m == nil || m["identity"] != "replica-b" {
		t.Fatalf("the new leader works: %v", m)
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	if m := b.next(10*time.Second, "stopped_leading"); m == nil {
		t.Fatal("replica-b did not stop leading on SIGTERM")
	}
	done := make(chan error, 1)
	go func() { done <- b.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("replica-b did not exit")
	}
	// ReleaseOnCancel gave the lock back.
	if ld, err := cl.Election(name).Leader(context.Background()); err != nil || ld != nil {
		t.Fatalf("released on SIGTERM: %+v %v", ld, err)
	}
}

type elector struct {
	lock    *k8slock.Lock
	mu      sync.Mutex
	started []uint64
	stopped time.Time
	done    chan struct{}
}

func runElector(t *testing.T, ctx context.Context, lock *k8slock.Lock) *elector {
	e := &elector{lock: lock, done: make(chan struct{})}
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: 9 * time.Second, RenewDeadline: 6 * time.Second, RetryPeriod: time.Second,
		ReleaseOnCancel: true,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				e.mu.Lock()
				e.started = append(e.started, lock.Token())
				e.mu.Unlock()
			},
			OnStoppedLeading: func() {
				e.mu.Lock()
				e.stopped = time.Now()
				e.mu.Unlock()
			},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() { defer close(e.done); le.Run(ctx) }()
	return e
}

func (e *elector) terms() []uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]uint64(nil), e.started...)
}

// The lockd lock is taken from the leader (its session closed on the service): the adapter
// refuses every renewal, client-go's elector stops leading within one lease, the other replica
// leads with a larger token, and the first never leads again under the same Run.
func TestALostLockStopsTheElectorWithinOneLease(t *testing.T) {
	c := shared.Get(t)
	name := "leaders/go-k8s-test-" + strings.ReplaceAll(t.Name(), "/", "_")
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	ca, cb := newClient(t, c, "a", 5*time.Second), newClient(t, c, "b", 5*time.Second)
	la, err := k8slock.New(ca, name, "a")
	if err != nil {
		t.Fatal(err)
	}
	lb, err := k8slock.New(cb, name, "b")
	if err != nil {
		t.Fatal(err)
	}
	ea := runElector(t, ctx, la)
	waitFor(t, "a to lead", 20*time.Second, func() bool { return len(ea.terms()) == 1 })
	eb := runElector(t, ctx, lb)
	time.Sleep(2 * time.Second)
	if len(eb.terms()) != 0 || lb.Token() != 0 {
		t.Fatal("b leads beside a")
	}
	rec, raw, err := lb.Get(ctx)
	if err != nil || rec.HolderIdentity != "a" || !strings.Contains(string(raw), `"fencingToken":`) {
		t.Fatalf("b's view of the record: %+v %s %v", rec, raw, err)
	}
	tokenA := ea.terms()[0]
	ld := la.Leadership()
	if ld == nil || ld.Token() != tokenA {
		t.Fatal("a's leadership")
	}
	// Another process closes a's session on the service.
	lostAt := time.Now()
	closeSessionElsewhere(t, ctx, c, ld.Lock.SessionID())
	select {
	case <-ld.Lost():
	case <-time.After(3 * time.Second):
		t.Fatal("a's leadership not lost")
	}
	// a's adapter refuses to lead again within the cool-down, whatever its elector asks.
	err = la.Update(ctx, rl.LeaderElectionRecord{HolderIdentity: "a", LeaseDurationSeconds: 9})
	if err == nil || !strings.Contains(err.Error(), "does not lead again") {
		t.Fatalf("a's update during the cool-down: %v", err)
	}
	waitFor(t, "a to stop leading", 12*time.Second, func() bool {
		ea.mu.Lock()
		defer ea.mu.Unlock()
		return !ea.stopped.IsZero()
	})
	ea.mu.Lock()
	stoppedAfter := ea.stopped.Sub(lostAt)
	ea.mu.Unlock()
	t.Logf("a stopped leading %s after its lock was lost", stoppedAfter)
	if stoppedAfter > 9*time.Second {
		t.Fatalf("a stopped leading %s after the loss, more than one lease", stoppedAfter)
	}
	waitFor(t, "b to lead", 15*time.Second, func() bool { return len(eb.terms()) == 1 })
	if tb := eb.terms()[0]; tb <= tokenA {
		t.Fatalf("b's token %d not above a's %d", tb, tokenA)
	}
	if got := ea.terms(); len(got) != 1 {
		t.Fatalf("a led again: %v", got)
	}
	if rec, _, err := la.Get(ctx); err != nil || rec.HolderIdentity != "b" {
		t.Fatalf("a sees b lead: %+v %v", rec, err)
	}
	cancel()
	<-eb.done
	<-ea.done
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatal("the test ran out of time")
	}
}

// closeSessionElsewhere closes a session on the service from another connection, as another
// process (or the service's own expiry) would end it.
func closeSessionElsewhere(t *testing.T, ctx context.Context, c *testcluster.Cluster, id string) {
	t.Helper()
	conn, err := grpc.NewClient(c.Endpoints[2], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := pb.NewLockClient(conn).CloseSession(ctx, &pb.CloseSessionRequest{SessionId: id}); err != nil {
		t.Fatal(err)
	}
}

// leadNow makes la lead through Update, as client-go's acquire does, and records its event.
func leadNow(t *testing.T, ctx context.Context, la *k8slock.Lock, rec rl.LeaderElectionRecord) *lockd.Leadership {
	t.Helper()
	if err := la.Update(ctx, rec); err != nil {
		t.Fatal(err)
	}
	la.RecordEvent("became leader")
	ld := la.Leadership()
	if ld == nil || la.Token() == 0 || la.Token() != ld.Token() {
		t.Fatal("leads")
	}
	return ld
}

// A leadership resigned by hand, not through client-go (finding 5), no longer leads: no
// leadership, no token, the work's context ends, the record names nobody, and client-go's next
// renewal is refused, so its elector stops leading.
func TestAResignedLeadershipIsNotLeading(t *testing.T) {
	c := shared.Get(t)
	name := "leaders/go-k8s-test-" + strings.ReplaceAll(t.Name(), "/", "_")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	la, err := k8slock.New(newClient(t, c, "a", 5*time.Second), name, "a")
	if err != nil {
		t.Fatal(err)
	}
	rec := rl.LeaderElectionRecord{HolderIdentity: "a", LeaseDurationSeconds: 9}
	ld := leadNow(t, ctx, la, rec)
	wctx, _, wcancel := la.WithLeadership(ctx)
	defer wcancel()
	if err := ld.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-wctx.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("the work's context outlived the resign")
	}
	if la.Leadership() != nil || la.Token() != 0 {
		t.Fatal("a resigned leadership is still reported leading")
	}
	if got, _, err := la.Get(ctx); err != nil || got.HolderIdentity != "" {
		t.Fatalf("the record after the resign: %+v %v", got, err)
	}
	if err := la.Update(ctx, rec); err == nil || !strings.Contains(err.Error(), "does not lead again") {
		t.Fatalf("client-go's renewal after the resign: %v", err)
	}
	la.RecordEvent("stopped leading")
}

// A loss while client-go's elector leads starts no new term in its failing renew round,
// however long that round outlasts the lease (finding 4: RetryPeriod + RenewDeadline >
// LeaseDuration here): the adapter waits for the elector's "stopped leading", then a new Run
// may lead, with a larger token.
func TestALossStartsNoNewTermBeforeTheElectorStopped(t *testing.T) {
	c := shared.Get(t)
	name := "leaders/go-k8s-test-" + strings.ReplaceAll(t.Name(), "/", "_")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := newClient(t, c, "a", 5*time.Second)
	la, err := k8slock.New(cl, name, "a")
	if err != nil {
		t.Fatal(err)
	}
	rec := rl.LeaderElectionRecord{HolderIdentity: "a", LeaseDurationSeconds: 1}
	ld := leadNow(t, ctx, la, rec)
	first := ld.Token()
	closeSessionElsewhere(t, ctx, c, ld.Lock.SessionID())
	select {
	case <-ld.Lost():
	case <-time.After(3 * time.Second):
		t.Fatal("the leadership was not lost")
	}
	// The cool-down (one lease: here the 5 s TTL) runs out while the elector still renews.
	time.Sleep(6 * time.Second)
	if err := la.Update(ctx, rec); err == nil || !strings.Contains(err.Error(), "stopped leading") {
		t.Fatalf("a renewal in the failing round: %v", err)
	}
	if ld, err := cl.Election(name).Leader(ctx); err != nil || ld != nil {
		t.Fatalf("the name is free (only the adapter refuses): %+v %v", ld, err)
	}
	la.RecordEvent("stopped leading")
	if err := la.Update(ctx, rec); err != nil {
		t.Fatalf("a new Run leads again: %v", err)
	}
	if la.Token() <= first {
		t.Fatalf("the new term's token %d is not above %d", la.Token(), first)
	}
	if err := la.Update(ctx, rl.LeaderElectionRecord{}); err != nil {
		t.Fatal(err)
	}
}

// client-go's release (ReleaseOnCancel) failing, here with a ctx that already ended (finding
// 6): the replica stays out for one lease as after a loss, and the hold is released all the
// same (the client goes on with it in the background).
func TestAFailedReleaseStartsTheCoolDown(t *testing.T) {
	c := shared.Get(t)
	name := "leaders/go-k8s-test-" + strings.ReplaceAll(t.Name(), "/", "_")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cl := newClient(t, c, "a", 5*time.Second)
	la, err := k8slock.New(cl, name, "a")
	if err != nil {
		t.Fatal(err)
	}
	rec := rl.LeaderElectionRecord{HolderIdentity: "a", LeaseDurationSeconds: 9}
	leadNow(t, ctx, la, rec)
	ended, end := context.WithCancel(ctx)
	end()
	if err := la.Update(ended, rl.LeaderElectionRecord{LeaseDurationSeconds: 1}); err == nil {
		t.Fatal("a release with an ended ctx reported success")
	}
	la.RecordEvent("stopped leading")
	if la.Leadership() != nil || la.Token() != 0 {
		t.Fatal("still leading after the release")
	}
	if err := la.Update(ctx, rec); err == nil || !strings.Contains(err.Error(), "does not lead again") {
		t.Fatalf("an update right after the failed release: %v", err)
	}
	waitFor(t, "the name to be free", 5*time.Second, func() bool {
		ld, err := cl.Election(name).Leader(ctx)
		return err == nil && ld == nil
	})
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
