// Package fencing makes writes to PostgreSQL (through database/sql) that a stale lock holder
// cannot make: every write carries the lock's fencing token, and the store refuses a token
// older than one it has accepted.
//
// A lease can run out under a paused process, so a lock alone cannot stop a stale holder from
// writing. The store must refuse writes that carry a token older than the newest it has seen:
//
//	UPDATE t SET value = $1, fence = $2 WHERE key = $3 AND fence <= $2
//	-- 0 rows: a newer holder exists; stop.
//
// The functions here do exactly that, in the caller's transaction or connection (they never
// commit: pass a *sql.Tx and commit yourself, or a *sql.DB for autocommit). The row lock the
// UPDATE takes is held to the commit, so a newer holder's write waits for it and then passes
// its own check. The SQL is PostgreSQL's ($n placeholders); with pgx use its stdlib driver
// (github.com/jackc/pgx/v5/stdlib, driver name "pgx").
//
//   - CreateTable / Schema: a key-value table with a fence (key, value, fence).
//   - FencedWrite: the conditional update of a key's row (inserting it if absent); a refusal
//     is an *lockd.Error of kind FenceRejected.
//   - Write: FencedWrite guarded by a lock: refuses locally (KindLockLost) once the lock is
//     lost, before anything reaches the store.
//   - AddFenceColumn / FencedUpdate: the same fence on a table of your own.
//
// The same helpers as the Python client's lockd_client.fencing.
package fencing

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	lockd "github.com/lockd-dev/lockd/clients/go"
)

// MaxToken is the largest fencing token: tokens are stored in a BIGINT, and the service never
// mints one above it.
const MaxToken = 1<<63 - 1

// DefaultTable is the key-value table FencedWrite and Write use unless told otherwise.
const DefaultTable = "lockd_fenced"

// Schema is the DDL of the key-value table (%s: its quoted name).
const Schema = `CREATE TABLE IF NOT EXISTS %s (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL,
    fence BIGINT NOT NULL DEFAULT 0 CHECK (fence >= 0)
)`

// Execer is what the helpers write through: *sql.DB, *sql.Tx and *sql.Conn all are.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// Fenced is what Write needs of a lock: a *lockd.Lock (or a *lockd.Leadership's Lock).
type Fenced interface {
	Name() string
	Token() uint64
	IsLost() bool
}

// Reporter reports refusals to the service (a *lockd.Client), so that lockd counts them
// (lockd_fencing_rejections_total).
type Reporter interface {
	ReportFencingRejected(ctx context.Context, name string) error
}

type config struct {
	table    string
	column   string
	reporter Reporter
}

// Option adjusts a helper.
type Option func(*config)

// Table names the table ("name" or "schema.name"; default DefaultTable).
func Table(name string) Option { return func(c *config) { c.table = name } }

// FenceColumn names the fence column of FencedUpdate and AddFenceColumn (default "fence").
func FenceColumn(name string) Option { return func(c *config) { c.column = name } }

// ReportTo reports a refused write to the service through r (e.g. the lockd.Client).
func ReportTo(r Reporter) Option { return func(c *config) { c.reporter = r } }

func configure(opts []Option) config {
	c := config{table: DefaultTable, column: "fence"}
	for _, o := range opts {
		o(&c)
	}
	return c
}

func invalid(format string, args ...any) error {
	return &lockd.Error{Kind: lockd.KindInvalidArgument, Code: "invalid_argument", Message: fmt.Sprintf(format, args...)}
}

// QuoteIdent quotes one identifier for PostgreSQL.
func QuoteIdent(name string) string { return `"` + strings.ReplaceAll(name, `"`, `""`) + `"` }

// tableIdent is "schema"."table" or "table", quoted.
func tableIdent(name string) (string, error) {
	parts := strings.Split(name, ".")
	if len(parts) < 1 || len(parts) > 2 {
		return "", invalid("table must be 'name' or 'schema.name' (got %q)", name)
	}
	for i, p := range parts {
		if p == "" {
			return "", invalid("table must be 'name' or 'schema.name' (got %q)", name)
		}
		parts[i] = QuoteIdent(p)
	}
	return strings.Join(parts, "."), nil
}

func checkToken(token uint64) error {
	if token < 1 || token > MaxToken {
		return invalid("token must lie in 1..=%d to fit a BIGINT fence (got %d)", uint64(MaxToken), token)
	}
	return nil
}

// CreateTable creates the fenced key-value table (idempotent).
func CreateTable(ctx context.Context, db Execer, opts ...Option) error {
	c := configure(opts)
	t, err := tableIdent(c.table)
	if err != nil {
		return err
	}
	_, err = db.ExecContext(ctx, fmt.Sprintf(Schema, t))
	return err
}

// AddFenceColumn adds a `fence BIGINT NOT NULL DEFAULT 0` column to an existing table
// (idempotent); FenceColumn names another column.
func AddFenceColumn(ctx context.Context, db Execer, table string, opts ...Option) error {
	c := configure(opts)
	t, err := tableIdent(table)
	if err != nil {
		return err
	}
	_, err = db.ExecContext(ctx, fmt.Sprintf("ALTER TABLE %s ADD COLUMN IF NOT EXISTS %s BIGINT NOT NULL DEFAULT 0",
		t, QuoteIdent(c.column)))
	return err
}

func rejected(name, key string, token uint64) error {
	who := ""
	if name != "" {
		who = fmt.Sprintf(" of %q", name)
	}
	return &lockd.Error{Kind: lockd.KindFenceRejected, Code: "fence_rejected",
		Message: fmt.Sprintf("the store refused token %d for %q: a newer holder%s has written", token, key, who)}
}

func affected(r sql.Result) (int64, error) {
	n, err := r.RowsAffected()
	if err != nil {
		return 0, err
	}
	return n, nil
}

// FencedWrite sets key to value in the fenced key-value table if token is at least the key's
// fence, inserting the key if it is new:
//
//	UPDATE t SET value = $1, fence = $2 WHERE key = $3 AND fence <= $2
//	-- 0 rows: INSERT ... ON CONFLICT (key) DO NOTHING, and if the key exists after all, the
//	-- UPDATE once more (a concurrent first write)
//
// A refusal (the store holds a newer token) is an *lockd.Error of kind FenceRejected
// (errors.Is(err, lockd.ErrFenceRejected)).
func FencedWrite(ctx context.Context, db Execer, key, value string, token uint64, opts ...Option) error {
	return fencedWrite(ctx, db, "", key, value, token, configure(opts))
}

func fencedWrite(ctx context.Context, db Execer, lockName, key, value string, token uint64, c config) error {
	if err := checkToken(token); err != nil {
		return err
	}
	t, err := tableIdent(c.table)
	if err != nil {
		return err
	}
	update := fmt.Sprintf("UPDATE %s SET value = $1, fence = $2 WHERE key = $3 AND fence <= $2", t)
	insert := fmt.Sprintf("INSERT INTO %s (key, value, fence) VALUES ($1, $2, $3) ON CONFLICT (key) DO NOTHING", t)
	for round := 0; round < 2; round++ {
		r, err := db.ExecContext(ctx, update, value, int64(token), key)
		if err != nil {
			return err
		}
		if n, err := affected(r); err != nil || n == 1 {
			return err
		}
		if round == 1 {
			break
		}
		r, err = db.ExecContext(ctx, insert, key, value, int64(token))
		if err != nil {
			return err
		}
		if n, err := affected(r); err != nil || n == 1 {
			return err
		}
	}
	return rejected(lockName, key, token)
}

// Write is FencedWrite under lock: an *lockd.Error of kind LockLost, without writing, once the
// lock is lost (its local deadline passed or its session ended), and of kind FenceRejected
// when the store has seen a newer token (reported to the service with ReportTo).
func Write(ctx context.Context, db Execer, lock Fenced, key, value string, opts ...Option) error {
	c := configure(opts)
	if lock == nil {
		return invalid("no lock to write under")
	}
	if lock.IsLost() {
		return &lockd.Error{Kind: lockd.KindLockLost, Code: "lock_lost",
			Message: fmt.Sprintf("the lock %q is lost; not writing %q", lock.Name(), key)}
	}
	err := fencedWrite(ctx, db, lock.Name(), key, value, lock.Token(), c)
	if err != nil && c.reporter != nil && isRejected(err) {
		_ = c.reporter.ReportFencingRejected(ctx, lock.Name())
	}
	return err
}

func isRejected(err error) bool {
	le, ok := err.(*lockd.Error)
	return ok && le.Kind == lockd.KindFenceRejected
}

// Column is one column's value in FencedUpdate (an ordered list keeps the SQL stable).
type Column struct {
	Name  string
	Value any
}

// FencedUpdate runs `UPDATE table SET <set>, fence = $token WHERE <key> AND fence <= $token` on a
// table of your own (with a fence column, AddFenceColumn). 0 rows (a newer token is stored, or
// no row matches the key) is an *lockd.Error of kind FenceRejected. Example:
//
//	fencing.FencedUpdate(ctx, tx, "payout_batches",
//	    []fencing.Column{{"status", "sent"}}, []fencing.Column{{"batch_id", 2210}}, lk.Token())
func FencedUpdate(ctx context.Context, db Execer, table string, set, key []Column, token uint64, opts ...Option) error {
	c := configure(opts)
	if err := checkToken(token); err != nil {
		return err
	}
	t, err := tableIdent(table)
	if err != nil {
		return err
	}
	if len(set) == 0 {
		return invalid("set must name at least one column")
	}
	if len(key) == 0 {
		return invalid("key must name at least one column to match")
	}
	var args []any
	var sets, where []string
	for _, col := range set {
		if col.Name == c.column {
			return invalid("the fence column %q is set from the token; leave it out of set and key", c.column)
		}
		args = append(args, col.Value)
		sets = append(sets, fmt.Sprintf("%s = $%d", QuoteIdent(col.Name), len(args)))
	}
	args = append(args, int64(token))
	tok := len(args)
	f := QuoteIdent(c.column)
	sets = append(sets, fmt.Sprintf("%s = $%d", f, tok))
	for _, col := range key {
		if col.Name == c.column {
			return invalid("the fence column %q is set from the token; leave it out of set and key", c.column)
		}
		args = append(args, col.Value)
		where = append(where, fmt.Sprintf("%s = $%d", QuoteIdent(col.Name), len(args)))
	}
	q := fmt.Sprintf("UPDATE %s SET %s WHERE %s AND %s <= $%d", t, strings.Join(sets, ", "),
		strings.Join(where, " AND "), f, tok)
	r, err := db.ExecContext(ctx, q, args...)
	if err != nil {
		return err
	}
	n, err := affected(r)
	if err != nil {
		return err
	}
	if n != 1 {
		return rejected("", fmt.Sprint(key), token)
	}
	return nil
}
