package lockd

import (
	"context"
	"sort"
	"sync"
	"time"
)

// Lock is a held lock. Attach Token to every write made under it and stop working when Lost is
// closed (or IsLost says so). Release gives it back.
type Lock struct {
	c        *Client
	h        *hold
	mu       sync.Mutex
	released bool
	// Whether the lease was already lost when Release was called (LostReason).
	lostAtRelease bool
	lostOnce      sync.Once
	lost          chan struct{}
	watchID       int // the lease's callback that closes lost (no goroutine per lock)
}

func newLock(c *Client, h *hold) *Lock {
	l := &Lock{c: c, h: h, lost: make(chan struct{})}
	l.watchID = h.lease.watch(l.closeLost)
	return l
}

func (l *Lock) closeLost() { l.lostOnce.Do(func() { close(l.lost) }) }

// Name is the lock's name.
func (l *Lock) Name() string { return l.h.name }

// Token is the fencing token: unique to this grant and larger than every earlier grant's token
// for the name. A store that checks it (... WHERE fence <= token) refuses a stale holder.
func (l *Lock) Token() uint64 { return l.h.token }

// Owner is who within the session holds it.
func (l *Lock) Owner() string { return l.h.owner }

// Mode is how the lock is held.
func (l *Lock) Mode() Mode { return l.h.mode }

// Reentry is the hold count after this grant (1 for a first grant, more for a re-entry).
func (l *Lock) Reentry() uint32 { return l.h.reentry }

// SessionID is the holding session's id: its capability; do not log it.
func (l *Lock) SessionID() string { return l.h.sessionID }

// Group is the lock group that granted the lock (whose lease the lock follows).
func (l *Lock) Group() uint32 { return l.h.lease.hold.group }

// Deadline is the lock's local deadline (on the monotonic clock: compare with time.Now() or use
// time.Until). It moves forward with renewals, and back to the session-wide deadline once a
// bucket moved in or out of the lock's group.
func (l *Lock) Deadline() time.Time { return instantTime(l.h.lease.deadline()) }

// Lost is closed when the lock is lost: at its local deadline (send time of the last keepalive
// its lease counts from + TTL - margin) unless a renewal moved it, when its lock group's lease
// is known to have ended, or when the session ends (Close included). A timer of the client
// closes it even when no code of the caller runs. It is also closed by Release: a released lock
// protects nothing any more (LostReason says which).
func (l *Lock) Lost() <-chan struct{} { return l.lost }

// IsLost reports whether the lock is lost (or released), comparing its deadline with the clock,
// so that it is right even before the client's timer has run (e.g. just after the process was
// resumed from a pause); once true, Lost is closed too.
func (l *Lock) IsLost() bool {
	select {
	case <-l.lost:
		return true
	default:
	}
	if l.h.lease.isLost() {
		l.closeLost()
		return true
	}
	return false
}

// LostReason says why the lock was lost ("" while it is not); "released" once Release was
// called on a lock that was not lost before.
func (l *Lock) LostReason() string {
	l.mu.Lock()
	released, lostFirst := l.released, l.lostAtRelease
	l.mu.Unlock()
	if released && !lostFirst {
		return "released"
	}
	if why := l.h.lease.reason(); why != "" {
		return why
	}
	if l.IsLost() {
		return "the local lease deadline passed"
	}
	return ""
}

// SessionTTL is the TTL the service granted the session that holds the lock.
func (l *Lock) SessionTTL() time.Duration { return secs(l.h.lease.session.leases.ttl) }

// Released reports whether Release was called.
func (l *Lock) Released() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.released
}

// Release gives the lock back (one level of re-entry); returns the re-entries still held. From
// its call the lock counts as lost (Lost closed, IsLost true). A lost lock's release is refused
// (session_not_found, not_holder, stale_token) unless an earlier attempt of the same call may
// have landed. Retried at most until the lock's lease ends: a release still unanswered then is
// an *Error of KindSessionLost (the service frees the lock with the session). A release that
// fails while the hold may still be on the service (no answer, ctx ended, a retryable refusal)
// is retried in the background until it lands, is refused for good, or the hold's lease ends,
// so a hold never outlives its Release for the rest of the session. A second call returns 0, nil.
func (l *Lock) Release(ctx context.Context) (uint32, error) {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return 0, nil
	}
	l.released = true
	l.lostAtRelease = l.h.lease.isLost()
	l.mu.Unlock()
	l.h.lease.unwatch(l.watchID)
	l.closeLost()
	l.c.forget(l.h)
	l.h.lease.detach()
	n, err := l.c.releaseHold(ctx, l.h)
	if err != nil {
		l.c.releaseLater(l.h, err)
	}
	return n, err
}

// leaseLost: the lock's lease is lost (not counting Release).
func (l *Lock) leaseLost() bool { return l.h.lease.isLost() }

// Do runs work with a context that is cancelled when the lock is lost or released (or ctx
// ends), and returns work's error; if the lock's lease was lost before work returned, an
// *Error of KindLockLost (work's own error, if any, is wrapped in its message).
func (l *Lock) Do(ctx context.Context, work func(ctx context.Context) error) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-l.lost:
			cancel()
		case <-stop:
		}
	}()
	err := work(wctx)
	if l.leaseLost() {
		l.closeLost()
		le := newErr(KindLockLost, "the lock %q was lost while the work ran: %s", l.Name(), l.LostReason())
		le.cause = err
		return le
	}
	return err
}

// LockSet is locks taken together by AcquireAll, in sorted name order.
type LockSet struct {
	Locks []*Lock
}

// Tokens maps each name to its fencing token.
func (s *LockSet) Tokens() map[string]uint64 {
	out := make(map[string]uint64, len(s.Locks))
	for _, l := range s.Locks {
		out[l.Name()] = l.Token()
	}
	return out
}

// Get is the lock of name (nil if not in the set).
func (s *LockSet) Get(name string) *Lock {
	for _, l := range s.Locks {
		if l.Name() == name {
			return l
		}
	}
	return nil
}

// IsLost reports whether any lock of the set is lost.
func (s *LockSet) IsLost() bool {
	for _, l := range s.Locks {
		if l.IsLost() {
			return true
		}
	}
	return false
}

// Release releases every lock, last taken first; returns the first failure after trying all.
func (s *LockSet) Release(ctx context.Context) error {
	var first error
	for i := len(s.Locks) - 1; i >= 0; i-- {
		if _, err := s.Locks[i].Release(ctx); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// AcquireAll takes every name in sorted order (duplicates once) within one overall deadline,
// ctx's (no deadline: each waits as long as it takes). Processes that take overlapping sets
// this way cannot deadlock. On failure the names already taken are released and the error
// returned.
func (c *Client) AcquireAll(ctx context.Context, names []string, opts ...AcquireOption) (*LockSet, error) {
	seen := map[string]bool{}
	var ordered []string
	for _, n := range names {
		if !seen[n] {
			seen[n] = true
			ordered = append(ordered, n)
		}
	}
	sort.Strings(ordered)
	for _, n := range ordered { // every name is checked before anything is sent
		if _, err := c.spec(n, opts); err != nil {
			return nil, err
		}
	}
	set := &LockSet{}
	for _, n := range ordered {
		l, err := c.Acquire(ctx, n, opts...)
		if err != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.opts.requestTimeout*2)
			_ = set.Release(rctx)
			cancel()
			return nil, err
		}
		set.Locks = append(set.Locks, l)
	}
	return set, nil
}
