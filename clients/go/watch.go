package lockd

// The changes of a name or a prefix as they happen (Watch), and an election's leaders.
//
// A watch survives a node that stops answering and a cut-off for falling behind: it reconnects
// (to the next node if need be) and resumes after the last event it received, so no event is
// missed or repeated. It ends with an error the caller must act on: watch_compacted (re-read
// the names, then watch again), a credential refused, or a bad request. The semantics are the
// Python client's _watch.py and lockd-client's watch.rs.

import (
	"context"
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/lockd-dev/lockd/clients/go/internal/pb"
)

// maxWatchFailures is how many opens in a row may find no node before the error goes to the
// caller.
const maxWatchFailures = 20

// eventBuffer is how many received events a watch keeps for a consumer that is not reading.
const eventBuffer = 256

// Watch is an open watch of a name or a prefix (Client.Watch, Client.WatchPrefix). It opens at
// the first Next, or at Open. One consumer at a time.
type Watch struct {
	c   *Client
	req *pb.WatchRequest

	startOnce sync.Once
	ctx       context.Context
	cancel    context.CancelFunc
	events    chan WatchEvent
	opened    chan struct{}
	openOnce  sync.Once
	done      chan struct{}
	err       error // the error that ended the watch (set before done closes)

	mu        sync.Mutex
	delivered []WatchPosition
}

// Watch watches every change of name (who holds or waits), as it happens. It survives a node
// that stops and resumes where it was, with no change missed or repeated; it needs no session.
func (c *Client) Watch(name string) *Watch { return c.newWatch(&pb.WatchRequest{Name: name}) }

// WatchPrefix watches every change of every name that starts with prefix, as Watch.
func (c *Client) WatchPrefix(prefix string) *Watch {
	return c.newWatch(&pb.WatchRequest{Prefix: prefix})
}

func (c *Client) newWatch(req *pb.WatchRequest) *Watch {
	ctx, cancel := context.WithCancel(c.bgCtx)
	return &Watch{c: c, req: req, ctx: ctx, cancel: cancel, events: make(chan WatchEvent, eventBuffer),
		opened: make(chan struct{}), done: make(chan struct{})}
}

func (w *Watch) start() error {
	if (w.req.GetName() == "") == (w.req.GetPrefix() == "") {
		return invalidArg("watch exactly one of a name or a prefix")
	}
	w.startOnce.Do(func() { go w.run() })
	return nil
}

// Open opens the stream now: what changes from here on is delivered. Read the current state
// after this, never before, and no change falls between the read and the watch.
func (w *Watch) Open(ctx context.Context) error {
	if err := w.start(); err != nil {
		return err
	}
	select {
	case <-w.opened:
		return nil
	case <-w.done:
		return w.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Next is the next change. A ctx that ends first returns its error and loses nothing: the next
// call gets the event. After Close, or once the watch ended for good, it returns that error
// (KindClientClosed after Close).
func (w *Watch) Next(ctx context.Context) (WatchEvent, error) {
	if err := w.start(); err != nil {
		return WatchEvent{}, err
	}
	select {
	case ev := <-w.events:
		w.mu.Lock()
		w.delivered = ev.Resume
		w.mu.Unlock()
		return ev, nil
	default:
	}
	select {
	case ev := <-w.events:
		w.mu.Lock()
		w.delivered = ev.Resume
		w.mu.Unlock()
		return ev, nil
	case <-w.done:
		return WatchEvent{}, w.err
	case <-ctx.Done():
		return WatchEvent{}, ctx.Err()
	}
}

// Positions is where the watch is after the last event it delivered, per lock group.
func (w *Watch) Positions() []WatchPosition {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]WatchPosition(nil), w.delivered...)
}

// Close ends the watch; Next then returns an *Error of KindClientClosed.
func (w *Watch) Close() {
	w.startOnce.Do(func() { // never started: end it as if it had run
		w.err = newErr(KindClientClosed, "the watch is closed")
		close(w.done)
	})
	w.cancel()
}

func resumable(e *Error) bool {
	return e.Kind == KindUnavailable || e.Code == "watch_too_slow" || e.Code == "unavailable" || e.Code == "no_leader"
}

func (w *Watch) run() {
	var endErr error
	defer func() {
		if w.ctx.Err() != nil {
			endErr = newErr(KindClientClosed, "the watch is closed")
		}
		w.err = endErr
		close(w.done)
	}()
	failures, compacted := 0, 0
	var after []*pb.WatchPosition
	for {
		if w.ctx.Err() != nil {
			return
		}
		i := w.c.preferredEndpoint()
		stream, cancel, err := w.connect(i, after)
		if err != nil {
			if w.ctx.Err() != nil {
				return
			}
			// A failed open: try another node, back off and retry, or give up.
			if err.Code == "watch_compacted" && compacted+1 < len(w.c.endpoints) {
				compacted++
				w.c.rotate(i)
				continue
			}
			if !resumable(err) || failures >= maxWatchFailures {
				endErr = err
				return
			}
			failures++
			w.c.rotate(i)
			if sleepCtx(w.ctx, w.c.opts.retry.Delay(failures-1, err.RetryAfter)) != nil {
				return
			}
			continue
		}
		w.openOnce.Do(func() { close(w.opened) })
		for {
			ev, rerr := stream.Recv()
			if rerr != nil {
				cancel()
				if w.ctx.Err() != nil {
					return
				}
				if errors.Is(rerr, io.EOF) {
					w.c.rotate(i) // the node is stopping: resume on the next one
					break
				}
				e := w.c.rpcError(rerr, i, stream.Trailer())
				if e.Code == "watch_compacted" || !resumable(e) {
					if e.Code == "watch_compacted" && compacted+1 < len(w.c.endpoints) {
						compacted++
						w.c.rotate(i)
						break
					}
					endErr = e
					return
				}
				// A stream that broke after it opened resumes on the next node at once.
				w.c.rotate(i)
				break
			}
			failures, compacted = 0, 0
			after = ev.GetResume()
			select {
			case w.events <- watchEventFromPB(ev):
			case <-w.ctx.Done():
				cancel()
				return
			}
		}
	}
}

// connect opens the watch on endpoint i after the given positions. The service answers with
// headers at once: a refusal shows here, and a node that never answers is given up on.
func (w *Watch) connect(i int, after []*pb.WatchPosition) (pb.Lock_WatchClient, context.CancelFunc, *Error) {
	st, serr := w.c.stub(i)
	if serr != nil {
		return nil, nil, serr.(*Error)
	}
	ctx, cancel := context.WithCancel(w.c.withAuth(w.ctx))
	req := &pb.WatchRequest{Name: w.req.GetName(), Prefix: w.req.GetPrefix(), After: after}
	timer := time.AfterFunc(w.c.opts.requestTimeout, cancel)
	stream, err := st.Watch(ctx, req)
	if err == nil {
		var md metadata.MD
		md, err = stream.Header()
		_ = md
	}
	if !timer.Stop() {
		cancel()
		return nil, nil, newErr(KindUnavailable, "%s: the watch did not open in %s", w.c.endpoints[i], w.c.opts.requestTimeout)
	}
	if err != nil {
		cancel()
		var trailer metadata.MD
		if stream != nil {
			trailer = stream.Trailer()
		}
		return nil, nil, w.c.rpcError(err, i, trailer)
	}
	return stream, cancel, nil
}

// ----- elections ----------------------------------------------------------------------------

// Election is leader election on one lock name: the holder of the exclusive lock leads, its
// owner string is its campaign value and its fencing token numbers its term.
type Election struct {
	c    *Client
	name string
}

// Election is an election on name (e.g. "leaders/partition-9").
func (c *Client) Election(name string) *Election { return &Election{c: c, name: name} }

// Name is the election's lock name.
func (e *Election) Name() string { return e.name }

// Leadership is won leadership: lead while it lasts, stop at once when Lost is closed, and
// fence every side effect with Token.
type Leadership struct {
	Lock  *Lock
	Value string
}

// Token is the term's fencing token.
func (l *Leadership) Token() uint64 { return l.Lock.Token() }

// Lost is closed when the leadership is lost, or resigned (Lock.Lost).
func (l *Leadership) Lost() <-chan struct{} { return l.Lock.Lost() }

// IsLost checks the clock too (Lock.IsLost).
func (l *Leadership) IsLost() bool { return l.Lock.IsLost() }

// Resign steps down, letting the next candidate in line lead. A leadership already lost
// resigns without error.
func (l *Leadership) Resign(ctx context.Context) error {
	if l.Lock.Released() {
		return nil
	}
	if _, err := l.Lock.Release(ctx); err != nil && !l.Lock.leaseLost() {
		return err
	}
	return nil
}

// Campaign waits in line (FIFO, woken by the pushed grant) until this process leads, up to
// ctx's deadline (none: forever). Cancel ctx to leave the line.
func (e *Election) Campaign(ctx context.Context, value string) (*Leadership, error) {
	l, err := e.c.Acquire(ctx, e.name, WithOwner(value))
	if err != nil {
		return nil, err
	}
	return &Leadership{Lock: l, Value: value}, nil
}

// TryCampaign leads if nobody does now (a try-lock), else an *Error of KindNotAcquired.
func (e *Election) TryCampaign(ctx context.Context, value string) (*Leadership, error) {
	l, err := e.c.TryAcquire(ctx, e.name, WithOwner(value))
	if err != nil {
		return nil, err
	}
	return &Leadership{Lock: l, Value: value}, nil
}

// Leader is the current leader, or nil (a linearizable read).
func (e *Election) Leader(ctx context.Context) (*Leader, error) {
	st, err := e.c.Inspect(ctx, e.name)
	if err != nil {
		return nil, err
	}
	if len(st.Holders) == 0 {
		return nil, nil
	}
	h := st.Holders[0]
	return &Leader{Value: h.Owner, Token: h.Token, SessionID: h.SessionID}, nil
}

// Leaders follows the election: the leader now, then at every change (nil: nobody leads),
// pushed by the service's watch, with no change missed or repeated across a node that stops.
func (e *Election) Leaders() *LeaderStream {
	return &LeaderStream{e: e, w: e.c.Watch(e.name)}
}

// Observe is Leaders as a channel: the leader now, then each change (nil: nobody leads). It is
// closed when ctx ends or the watch ends for good (see Leaders for the error).
func (e *Election) Observe(ctx context.Context) <-chan *Leader {
	out := make(chan *Leader)
	ls := e.Leaders()
	go func() {
		defer close(out)
		defer ls.Close()
		for {
			l, err := ls.Next(ctx)
			if err != nil {
				if ctx.Err() == nil {
					e.c.opts.logger.Warn("lockd: an election's observer ended", "name", e.name, "error", err)
				}
				return
			}
			select {
			case out <- l:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out
}

// LeaderStream is an election's leader now, then at every change (Election.Leaders).
type LeaderStream struct {
	e       *Election
	w       *Watch
	current *Leader
	started bool
}

// Next is the leader now (the first call), then the next change; nil: nobody leads. A ctx that
// ends first returns its error and loses nothing.
func (s *LeaderStream) Next(ctx context.Context) (*Leader, error) {
	if !s.started {
		// Watch first, then read: a change in between shows in the watch, and the token
		// comparison below drops what the read already saw.
		if err := s.w.Open(ctx); err != nil {
			return nil, err
		}
		l, err := s.e.Leader(ctx)
		if err != nil {
			return nil, err
		}
		s.current, s.started = l, true
		return l, nil
	}
	for {
		ev, err := s.w.Next(ctx)
		if err != nil {
			return nil, err
		}
		switch {
		case ev.Kind == "hold_started" && (s.current == nil || ev.Token > s.current.Token):
			s.current = &Leader{Value: ev.Owner, Token: ev.Token, SessionID: ev.SessionID}
			return s.current, nil
		case ev.Kind == "hold_ended" && s.current != nil && s.current.Token == ev.Token:
			s.current = nil
			return nil, nil
		}
	}
}

// Close ends the stream.
func (s *LeaderStream) Close() { s.w.Close() }
