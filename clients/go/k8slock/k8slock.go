// Package k8slock lets a Kubernetes controller elect its leader through lockd: Lock implements
// client-go's resourcelock.Interface (k8s.io/client-go/tools/leaderelection/resourcelock), so
// a controller switches by replacing its resourcelock, and its leader gets a fencing token
// (client-go's Lease lock has none).
//
//	client, _ := lockd.New(endpoints, lockd.WithTTL(10*time.Second), lockd.WithClientName(id))
//	lock, _ := k8slock.New(client, "leaders/my-controller", id)
//	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
//	    Lock: lock, LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second,
//	    RetryPeriod: 2 * time.Second, ReleaseOnCancel: true,
//	    Callbacks: leaderelection.LeaderCallbacks{
//	        OnStartedLeading: func(ctx context.Context) {
//	            // Cancelled at the lockd lock's local deadline, not only when client-go stops.
//	            ctx, token, cancel := lock.WithLeadership(ctx)
//	            defer cancel()
//	            run(ctx, token) // fence every side effect with token
//	        },
//	        OnStoppedLeading: func() { os.Exit(0) },
//	    },
//	})
//
// Run the work under the context WithLeadership returns, and fence its side effects with the
// token: those two are what is safe. client-go's own view (IsLeader, the ctx it passes to
// OnStartedLeading, OnStoppedLeading) lags the lockd lock by up to RetryPeriod + RenewDeadline
// after a loss (see Timing), while the service frees the name at once and another replica may
// lead.
//
// # How the record maps to the lockd lock
//
// The lockd lock (an exclusive lock on the election's name, owned by the identity) is the only
// truth; the LeaderElectionRecord is derived from it, and client-go's CAS on the record becomes
// a try-lock:
//
//   - Get returns the record this replica last wrote while it holds the lockd lock; otherwise a
//     record naming the lockd holder's identity (HolderIdentity "" when the name is free, so that
//     a candidate tries at once). A hold of the name by an earlier, lost session of this same
//     identity is reported as "<identity> (an earlier session)", never as this replica.
//   - Create and Update with this replica's identity succeed only while it holds the lockd lock
//     (not lost: its local deadline, on the monotonic clock, has not passed) or when a try-lock
//     takes it now; Update with HolderIdentity "" (client-go's release) releases it.
//   - Once a hold is lost (or resigned by hand: a released leadership counts as lost), Create
//     and Update with this replica's identity fail until client-go's elector that was leading
//     has stopped (it records the event "stopped leading" as it leaves its renew loop), and for
//     at least one lease (the record's LeaseDurationSeconds, which client-go truncates to whole
//     seconds, plus one second; at least the TTL the service granted). So a loss never turns
//     silently into a new term under the same Run, whatever the timing: the failing renew
//     round cannot take the lock again. A failed Resign (client-go's release) starts the same
//     lease-long wait, and lockd goes on releasing the hold in the background.
//
// Only the lockd holder is ever reported leader: OnNewLeader and GetLeader see either the
// identity this replica wrote while holding the lock, or the lockd holder's owner from Get.
//
// # The fencing token
//
// Token returns the current term's fencing token (0 while this replica does not lead); Leader
// returns the lockd holder's identity and token; and the raw record Get returns (the bytes
// client-go compares) is the record's JSON with a "fencingToken" field, the token of the
// holder it names. Fence every side effect of the leader with Token: a stale leader's writes
// are refused by the store (package fencing).
//
// # Timing
//
// client-go drives the lock by polling (RetryPeriod), so after the leader's process dies the
// next leader starts within the lockd TTL (its session expires on the service) plus up to 2.2
// RetryPeriods. For a failover within one LeaseDuration, use a lockd TTL of at most
// LeaseDuration - 2.2*RetryPeriod (CheckTiming says so).
//
// When the lockd lock is lost, client-go goes on reporting this replica leader (IsLeader, the
// ctx of OnStartedLeading still live) until its renew round fails: up to RetryPeriod +
// RenewDeadline after the local deadline, while another replica may take the name as soon as
// the service frees it. Only Lost() / WithLeadership (the local deadline, which passes before
// the service can hand the lock to anyone else) and fencing with the token are safe; stop the
// work on them, never on client-go's view alone.
package k8slock

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"k8s.io/client-go/tools/leaderelection"
	rl "k8s.io/client-go/tools/leaderelection/resourcelock"

	lockd "github.com/lockd-dev/lockd/clients/go"
)

// Lock is a resourcelock.Interface backed by a lockd election on one name.
type Lock struct {
	client   *lockd.Client
	election *lockd.Election
	name     string
	identity string
	onEvent  func(string)

	mu     sync.Mutex
	lead   *lockd.Leadership
	record rl.LeaderElectionRecord
	// When the last hold was lost, and how long this replica then stays out.
	lostAt   time.Time
	coolDown time.Duration
	// client-go's elector leads: between its events "became leader" and "stopped leading".
	electorLeading bool
	// A hold was lost while the elector led: no new term before it records "stopped leading".
	awaitStop bool
}

var _ rl.Interface = (*Lock)(nil)

// Option adjusts a Lock.
type Option func(*Lock)

// WithEventHook is called with each event client-go records ("became leader", "stopped
// leading"): RecordEvent's target, as the Lease lock's EventRecorder would be.
func WithEventHook(f func(event string)) Option { return func(l *Lock) { l.onEvent = f } }

// New is a lock on the lockd name (an election: its holder leads) for the replica called
// identity (unique among the candidates; at most 256 bytes; it is the lockd lock's owner).
func New(client *lockd.Client, name, identity string, opts ...Option) (*Lock, error) {
	if err := lockd.CheckName(name); err != nil {
		return nil, err
	}
	if identity == "" || len(identity) > 256 {
		return nil, &lockd.Error{Kind: lockd.KindInvalidArgument, Code: "invalid_argument",
			Message: fmt.Sprintf("identity must be 1..=256 bytes (got %d)", len(identity))}
	}
	l := &Lock{client: client, election: client.Election(name), name: name, identity: identity}
	for _, o := range opts {
		o(l)
	}
	return l, nil
}

// CheckTiming says whether a LeaderElectionConfig's timing suits a lockd TTL: the elector must
// stop leading within one lease of a loss (RenewDeadline + RetryPeriod <= LeaseDuration), and a
// candidate must take over within one lease of the leader's death (TTL + 2.2 RetryPeriod <=
// LeaseDuration).
func CheckTiming(lease, renew, retry, ttl time.Duration) error {
	if renew+retry > lease {
		return fmt.Errorf("k8slock: RenewDeadline %s + RetryPeriod %s must not exceed LeaseDuration %s", renew, retry, lease)
	}
	if need := ttl + time.Duration(leaderelection.JitterFactor*float64(retry)) + retry; need > lease {
		return fmt.Errorf("k8slock: a failover takes up to the lockd TTL %s + %.1f RetryPeriods (%s), more than LeaseDuration %s",
			ttl, leaderelection.JitterFactor+1, need, lease)
	}
	return nil
}

// rawRecord is what Get returns as the raw record: the record plus the holder's fencing token.
type rawRecord struct {
	rl.LeaderElectionRecord
	FencingToken uint64 `json:"fencingToken"`
}

// leaseSeconds is the TTL the service granted (the one asked for while no session is open), in
// whole seconds, rounded up.
func (l *Lock) leaseSeconds() int {
	return int(math.Ceil(l.client.SessionTTL().Seconds()))
}

// coolDownFor is how long a replica stays out after a loss: one lease, as client-go's record
// says it (LeaseDurationSeconds, which client-go truncates from LeaseDuration: up to a second
// short), and at least the TTL the service granted the session.
func coolDownFor(leaseDurationSeconds int, grantedTTL time.Duration) time.Duration {
	return max(time.Duration(leaseDurationSeconds+1)*time.Second, grantedTTL)
}

// checkLostLocked forgets a hold that is lost, or released (a leadership resigned by hand no
// longer leads), starting the cool-down.
func (l *Lock) checkLostLocked() {
	if l.lead != nil && (l.lead.IsLost() || l.lead.Lock.Released()) {
		l.lostLocked(l.lead)
	}
}

func (l *Lock) lostLocked(ld *lockd.Leadership) {
	if l.lead != ld {
		return
	}
	l.lead = nil
	l.startCoolDownLocked(ld)
	if l.electorLeading {
		l.awaitStop = true
	}
	go func() { // free it on the service now, if it still has it
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = ld.Resign(ctx)
	}()
}

func (l *Lock) startCoolDownLocked(ld *lockd.Leadership) {
	l.lostAt = time.Now()
	l.coolDown = coolDownFor(l.record.LeaseDurationSeconds, ld.Lock.SessionTTL())
}

// Get returns the election record: this replica's own while it holds the lockd lock, else one
// naming the lockd holder (HolderIdentity "" when the name is free).
func (l *Lock) Get(ctx context.Context) (*rl.LeaderElectionRecord, []byte, error) {
	l.mu.Lock()
	l.checkLostLocked()
	if l.lead != nil {
		rec := l.record
		token := l.lead.Token()
		l.mu.Unlock()
		raw, err := json.Marshal(rawRecord{rec, token})
		return &rec, raw, err
	}
	l.mu.Unlock()
	leader, err := l.election.Leader(ctx)
	if err != nil {
		return nil, nil, err
	}
	rec := rl.LeaderElectionRecord{LeaseDurationSeconds: l.leaseSeconds()}
	var token uint64
	if leader != nil {
		rec.HolderIdentity = leader.Value
		token = leader.Token
		if rec.HolderIdentity == l.identity {
			rec.HolderIdentity = l.identity + " (an earlier session)"
		}
	}
	raw, err := json.Marshal(rawRecord{rec, token})
	return &rec, raw, err
}

// Create is Update: the record exists as soon as the lockd name does.
func (l *Lock) Create(ctx context.Context, ler rl.LeaderElectionRecord) error {
	return l.Update(ctx, ler)
}

// ErrNotHolder: a record naming another identity (only the holder writes its own record).
var ErrNotHolder = errors.New("k8slock: a replica writes only its own identity")

// Update succeeds while this replica holds the lockd lock, or takes it now with a try-lock
// (refused with the lockd error, e.g. not acquired, while another holds it). A record with no
// holder releases it. After a loss it fails until the elector that was leading has stopped,
// and for one lease (see the package doc).
func (l *Lock) Update(ctx context.Context, ler rl.LeaderElectionRecord) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.checkLostLocked()
	if ler.HolderIdentity == "" { // client-go's release
		if ld := l.lead; ld != nil {
			l.lead = nil
			if err := ld.Resign(ctx); err != nil {
				// It may still be held on the service: lockd goes on releasing it in the
				// background (Lock.Release), and this replica stays out for one lease meanwhile.
				l.startCoolDownLocked(ld)
				return err
			}
		}
		l.record = ler
		return nil
	}
	if ler.HolderIdentity != l.identity {
		return fmt.Errorf("%w (record for %q, this lock is %q)", ErrNotHolder, ler.HolderIdentity, l.identity)
	}
	if l.lead != nil {
		l.record = ler
		return nil
	}
	if l.awaitStop {
		return fmt.Errorf("k8slock: the lockd lock %q was lost at %s while this replica led; it does not lead again "+
			"before its elector has stopped leading (client-go's event \"stopped leading\")", l.name, l.lostAt.Format(time.RFC3339Nano))
	}
	if !l.lostAt.IsZero() {
		if until := l.lostAt.Add(l.coolDown); time.Now().Before(until) {
			return fmt.Errorf("k8slock: the lockd lock %q was lost at %s; this replica does not lead again before %s, "+
				"so that an elector that was leading stops first", l.name, l.lostAt.Format(time.RFC3339Nano), until.Format(time.RFC3339Nano))
		}
	}
	ld, err := l.election.TryCampaign(ctx, l.identity)
	if err != nil {
		return err
	}
	l.lead = ld
	l.record = ler
	go func() {
		<-ld.Lost() // closed when the term ends: lost, or resigned (released)
		l.mu.Lock()
		defer l.mu.Unlock()
		l.lostLocked(ld)
	}()
	return nil
}

// RecordEvent follows client-go's elector ("became leader", "stopped leading": a loss while it
// leads keeps this replica out until it has stopped) and passes each event to the hook
// (WithEventHook), if any.
func (l *Lock) RecordEvent(event string) {
	l.mu.Lock()
	switch event {
	case "became leader":
		l.electorLeading = true
	case "stopped leading":
		l.electorLeading = false
		l.awaitStop = false
	}
	l.mu.Unlock()
	if l.onEvent != nil {
		l.onEvent(event)
	}
}

// Identity is this replica's identity (the lockd lock's owner).
func (l *Lock) Identity() string { return l.identity }

// Describe names the lock: "lockd/<name>".
func (l *Lock) Describe() string { return "lockd/" + l.name }

// Leadership is the lockd leadership this replica holds now (nil: it does not lead). Stop
// working when its Lost() is closed.
func (l *Lock) Leadership() *lockd.Leadership {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.checkLostLocked()
	return l.lead
}

// Token is the fencing token of this replica's current term (0 while it does not lead).
func (l *Lock) Token() uint64 {
	if ld := l.Leadership(); ld != nil {
		return ld.Token()
	}
	return 0
}

// Leader is the lockd holder: its identity and fencing token (nil: nobody leads), a
// linearizable read.
func (l *Lock) Leader(ctx context.Context) (*lockd.Leader, error) { return l.election.Leader(ctx) }

// WithLeadership is ctx cancelled when this replica's current leadership is lost (at once if it
// does not lead), and the term's token: pass it to the work started in OnStartedLeading.
func (l *Lock) WithLeadership(ctx context.Context) (context.Context, uint64, context.CancelFunc) {
	wctx, cancel := context.WithCancel(ctx)
	ld := l.Leadership()
	if ld == nil {
		cancel()
		return wctx, 0, cancel
	}
	go func() {
		select {
		case <-ld.Lost():
			cancel()
		case <-wctx.Done():
		}
	}()
	return wctx, ld.Token(), cancel
}
