package fencing_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib"

	lockd "github.com/lockd-dev/lockd/clients/go"
	"github.com/lockd-dev/lockd/clients/go/fencing"
)

func db(t *testing.T) *sql.DB {
	dsn := os.Getenv("LOCKD_CHECK_PG")
	if dsn == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("missing prerequisite under CI: PostgreSQL (LOCKD_CHECK_PG)")
		}
		t.Skip("missing prerequisite: PostgreSQL: set LOCKD_CHECK_PG (scripts/ci-postgres.sh prints one)")
	}
	d, err := sql.Open("pgx", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	return d
}

func table(t *testing.T, d *sql.DB, suffix string) string {
	name := fmt.Sprintf("lockd_go_fencing_%s_%d", suffix, os.Getpid())
	ctx := context.Background()
	if _, err := d.ExecContext(ctx, "DROP TABLE IF EXISTS "+name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = d.ExecContext(context.Background(), "DROP TABLE IF EXISTS "+name) })
	return name
}

func row(t *testing.T, d *sql.DB, tbl, key string) (string, int64) {
	var v string
	var f int64
	if err := d.QueryRowContext(context.Background(), "SELECT value, fence FROM "+tbl+" WHERE key = $1", key).Scan(&v, &f); err != nil {
		t.Fatal(err)
	}
	return v, f
}

type fakeLock struct {
	token uint64
	lost  bool
}

func (f fakeLock) Name() string  { return "payouts/m-1" }
func (f fakeLock) Token() uint64 { return f.token }
func (f fakeLock) IsLost() bool  { return f.lost }

type reports struct{ names []string }

func (r *reports) ReportFencingRejected(_ context.Context, name string) error {
	r.names = append(r.names, name)
	return nil
}

func TestFencedWriteAcceptsNewerTokensAndRefusesOlderOnes(t *testing.T) {
	d := db(t)
	ctx := context.Background()
	tbl := table(t, d, "kv")
	if err := fencing.CreateTable(ctx, d, fencing.Table(tbl)); err != nil {
		t.Fatal(err)
	}
	if err := fencing.CreateTable(ctx, d, fencing.Table(tbl)); err != nil {
		t.Fatal("idempotent:", err)
	}
	if err := fencing.FencedWrite(ctx, d, "k", "first", 5, fencing.Table(tbl)); err != nil {
		t.Fatal("insert if absent:", err)
	}
	if err := fencing.FencedWrite(ctx, d, "k", "same", 5, fencing.Table(tbl)); err != nil {
		t.Fatal("the same token again:", err)
	}
	if err := fencing.FencedWrite(ctx, d, "k", "newer", 9, fencing.Table(tbl)); err != nil {
		t.Fatal("a newer token:", err)
	}
	err := fencing.FencedWrite(ctx, d, "k", "stale", 7, fencing.Table(tbl))
	var le *lockd.Error
	if !errors.Is(err, lockd.ErrFenceRejected) || !errors.As(err, &le) || le.Code != "fence_rejected" || le.Retryable() {
		t.Fatalf("a stale token: %v", err)
	}
	if v, f := row(t, d, tbl, "k"); v != "newer" || f != 9 {
		t.Fatalf("row (%s, %d)", v, f)
	}
	if err := fencing.FencedWrite(ctx, d, "k", "x", 0, fencing.Table(tbl)); !errors.Is(err, lockd.ErrInvalidArgument) {
		t.Fatalf("token 0: %v", err)
	}
	if err := fencing.FencedWrite(ctx, d, "k", "x", 1, fencing.Table("a.b.c")); !errors.Is(err, lockd.ErrInvalidArgument) {
		t.Fatalf("a bad table name: %v", err)
	}
	// In a transaction: nothing is committed by the helper.
	tx, err := d.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := fencing.FencedWrite(ctx, tx, "k", "in-tx", 10, fencing.Table(tbl)); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback()
	if v, _ := row(t, d, tbl, "k"); v != "newer" {
		t.Fatal("the helper committed")
	}
}

func TestWriteRefusesLocallyOnceLostAndReportsARefusal(t *testing.T) {
	d := db(t)
	ctx := context.Background()
	tbl := table(t, d, "guard")
	if err := fencing.CreateTable(ctx, d, fencing.Table(tbl)); err != nil {
		t.Fatal(err)
	}
	r := &reports{}
	if err := fencing.Write(ctx, d, fakeLock{token: 20}, "k", "holder", fencing.Table(tbl), fencing.ReportTo(r)); err != nil {
		t.Fatal(err)
	}
	err := fencing.Write(ctx, d, fakeLock{token: 30, lost: true}, "k", "lost-holder", fencing.Table(tbl), fencing.ReportTo(r))
	if !errors.Is(err, lockd.ErrLockLost) {
		t.Fatalf("a lost lock: %v", err)
	}
	if v, f := row(t, d, tbl, "k"); v != "holder" || f != 20 {
		t.Fatalf("a lost lock wrote: (%s, %d)", v, f)
	}
	err = fencing.Write(ctx, d, fakeLock{token: 10}, "k", "stale", fencing.Table(tbl), fencing.ReportTo(r))
	if !errors.Is(err, lockd.ErrFenceRejected) || len(r.names) != 1 || r.names[0] != "payouts/m-1" {
		t.Fatalf("a stale holder: %v, reports %v", err, r.names)
	}
}

func TestFencedUpdateOnATableOfYourOwn(t *testing.T) {
	d := db(t)
	ctx := context.Background()
	tbl := table(t, d, "own")
	if _, err := d.ExecContext(ctx, "CREATE TABLE "+tbl+" (batch_id INT PRIMARY KEY, status TEXT)"); err != nil {
		t.Fatal(err)
	}
	if _, err := d.ExecContext(ctx, "INSERT INTO "+tbl+" VALUES (2210, 'new')"); err != nil {
		t.Fatal(err)
	}
	if err := fencing.AddFenceColumn(ctx, d, tbl); err != nil {
		t.Fatal(err)
	}
	if err := fencing.AddFenceColumn(ctx, d, tbl); err != nil {
		t.Fatal("idempotent:", err)
	}
	set := []fencing.Column{{Name: "status", Value: "sent"}}
	key := []fencing.Column{{Name: "batch_id", Value: 2210}}
	if err := fencing.FencedUpdate(ctx, d, tbl, set, key, 8); err != nil {
		t.Fatal(err)
	}
	if err := fencing.FencedUpdate(ctx, d, tbl, []fencing.Column{{Name: "status", Value: "stale"}}, key, 7); !errors.Is(err, lockd.ErrFenceRejected) {
		t.Fatalf("a stale token: %v", err)
	}
	var status string
	var fence int64
	if err := d.QueryRowContext(ctx, "SELECT status, fence FROM "+tbl+" WHERE batch_id = 2210").Scan(&status, &fence); err != nil {
		t.Fatal(err)
	}
	if status != "sent" || fence != 8 {
		t.Fatalf("row (%s, %d)", status, fence)
	}
	if err := fencing.FencedUpdate(ctx, d, tbl, []fencing.Column{{Name: "fence", Value: 1}}, key, 9); !errors.Is(err, lockd.ErrInvalidArgument) {
		t.Fatalf("setting the fence column: %v", err)
	}
}
