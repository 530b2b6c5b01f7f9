package lockd_test

// The integration suite's plumbing: TestMain, the shared clusters (ports 19000-19299, the Go
// client's range), per-test helpers, and the pause-fenced worker (this test binary re-run with
// LOCKD_GO_TESTWORKER=1).

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib"

	lockd "github.com/lockd-dev/lockd/clients/go"
	"github.com/lockd-dev/lockd/clients/go/fencing"
	"github.com/lockd-dev/lockd/clients/go/internal/testcluster"
)

var (
	// The suite's cluster, started on first use and stopped by TestMain.
	shared = &testcluster.Shared{HTTP: 19000, GRPC: 19100, Peer: 19200}
	// The TLS cluster (`lockd dev --tls`).
	tlsShared = &testcluster.Shared{HTTP: 19020, GRPC: 19120, Peer: 19220, TLS: true}
)

// Fresh clusters (tests that kill nodes) use 19010/19110/19210.
const freshHTTP, freshGRPC, freshPeer = 19010, 19110, 19210

func TestMain(m *testing.M) {
	if os.Getenv("LOCKD_GO_TESTWORKER") == "1" {
		os.Exit(workerMain())
	}
	code := m.Run()
	testcluster.StopAll()
	os.Exit(code)
}

var nameSeq atomic.Int64

// lockName is a lock name no other test uses.
func lockName(t *testing.T) string {
	return fmt.Sprintf("gotest/%s/%d-%d", strings.ReplaceAll(t.Name(), "/", "_"), os.Getpid(), nameSeq.Add(1))
}

func newClient(t *testing.T, c *testcluster.Cluster, opts ...lockd.Option) *lockd.Client {
	t.Helper()
	all := append([]lockd.Option{lockd.WithTTL(6 * time.Second)}, c.ClientOptions()...)
	cl, err := lockd.New(c.Endpoints, append(all, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.Close(context.Background()) })
	return cl
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func waitUntil(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func lockErr(t *testing.T, err error) *lockd.Error {
	t.Helper()
	var le *lockd.Error
	if !errors.As(err, &le) {
		t.Fatalf("want a *lockd.Error, got %T %v", err, err)
	}
	return le
}

func holders(t *testing.T, c *lockd.Client, name string) []uint64 {
	t.Helper()
	st, err := c.Inspect(ctxFor(t, 10*time.Second), name)
	if err != nil {
		t.Fatal(err)
	}
	var out []uint64
	for _, h := range st.Holders {
		out = append(out, h.Token)
	}
	return out
}

func pgDSN(t *testing.T) string {
	dsn := os.Getenv("LOCKD_CHECK_PG")
	if dsn == "" {
		testcluster.Missing(t, "PostgreSQL: set LOCKD_CHECK_PG (scripts/ci-postgres.sh prints one)")
	}
	return dsn
}

// ----- the pause-fenced worker --------------------------------------------------------------

func say(kv map[string]any) {
	b, _ := json.Marshal(kv)
	fmt.Println(string(b))
}

// workerMain takes a lock, makes a fenced write, reports its token, waits for "go" on stdin (the
// test SIGSTOPs it past its TTL meanwhile), then reports whether its lock is lost and tries its
// writes: the guarded one (must refuse locally) and a raw fenced one with its stale token (the
// store must refuse it). One JSON line per step on stdout.
func workerMain() int {
	endpoints := strings.Split(os.Getenv("W_ENDPOINTS"), ",")
	name, dsn, table, key := os.Getenv("W_NAME"), os.Getenv("W_PG"), os.Getenv("W_TABLE"), os.Getenv("W_KEY")
	ttlS, _ := strconv.ParseFloat(os.Getenv("W_TTL"), 64)
	c, err := lockd.New(endpoints, lockd.WithTTL(time.Duration(ttlS*float64(time.Second))), lockd.WithClientName("go-worker"))
	if err != nil {
		say(map[string]any{"step": "error", "error": err.Error()})
		return 1
	}
	defer func() { _ = c.Close(context.Background()) }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	lk, err := c.Acquire(ctx, name)
	cancel()
	if err != nil {
		say(map[string]any{"step": "error", "error": err.Error()})
		return 1
	}
	db, err := sql.Open("pgx", dsn)
	if err != nil {
		say(map[string]any{"step": "error", "error": err.Error()})
		return 1
	}
	defer db.Close()
	bg := context.Background()
	if err := fencing.Write(bg, db, lk, key, "worker-before-pause", fencing.Table(table)); err != nil {
		say(map[string]any{"step": "error", "error": err.Error()})
		return 1
	}
	say(map[string]any{"step": "acquired", "token": lk.Token()})
	line := make([]byte, 3)
	if n, _ := os.Stdin.Read(line); strings.TrimSpace(string(line[:n])) != "go" {
		return 0
	}
	lost := lk.IsLost()
	guarded := "written"
	switch err := fencing.Write(bg, db, lk, key, "worker-after-pause", fencing.Table(table), fencing.ReportTo(c)); {
	case errors.Is(err, lockd.ErrLockLost):
		guarded = "lost"
	case errors.Is(err, lockd.ErrFenceRejected):
		guarded = "rejected"
	case err != nil:
		guarded = "error: " + err.Error()
	}
	// What a worker that ignored Lost would do: the store itself must refuse it.
	raw := "accepted"
	switch err := fencing.FencedWrite(bg, db, key, "worker-stale", lk.Token(), fencing.Table(table)); {
	case errors.Is(err, lockd.ErrFenceRejected):
		raw = "rejected"
	case err != nil:
		raw = "error: " + err.Error()
	}
	// The engine counts the expired lease once its timer runs after the pause (bounded).
	end := time.Now().Add(3 * time.Second)
	for c.LeaseExpiredCount() == 0 && time.Now().Before(end) {
		time.Sleep(20 * time.Millisecond)
	}
	say(map[string]any{"step": "resumed", "lost": lost, "guarded": guarded, "raw": raw,
		"lease_expired": c.LeaseExpiredCount()})
	return 0
}
