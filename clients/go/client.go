package lockd

// The engine: one session per client over one Session stream. It
//
//   - opens the session, sends a keepalive every TTL/3 and keeps the local lease deadlines:
//     send time of the last acknowledged open/attach/keepalive + TTL - margin on the monotonic
//     clock, one per lock group and one session-wide (groupLeases). The service expires a lease
//     no earlier than TTL after a keepalive it acknowledged, which it received after we sent
//     it, so the client gives up first;
//   - moves the stream to the next endpoint and attaches the same session when the stream
//     breaks or a keepalive goes unanswered for a whole interval, within the local deadline;
//   - matches pushed grants to waiting acquires (a waiting acquire parks in the lock's FIFO
//     queue on the service and is woken by the push, never by polling);
//   - marks a lock lost when its own deadline passes or its group's lease ended, and the
//     session lost when every deadline it has passed without a renewal, or the service says
//     the session is gone; every lock of it reports lost and the next acquire opens a new
//     session. A keepalive refused with 503 is retried; it loses nothing by itself.
//
// The semantics are the Python client's (_core.py) and lockd-client's (session.rs). Every field
// of Client below mu is guarded by mu; methods named ...Locked need it held.

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/lockd-dev/lockd/clients/go/internal/pb"
)

// adoptedSlack is how long past its wait an adopted wait's acquire waits for a push before it
// gives up.
const adoptedSlack = 2.0

// maxWait is MaxWait in seconds; a variable so that a test can show the rounds in seconds.
var maxWait = MaxWait.Seconds()

// Client is a connection to a lockd cluster carrying one session for the process, kept alive
// over one gRPC Session stream. The session opens on first use (or with Connect) and ends with
// Close. A Client is safe for concurrent use.
type Client struct {
	opts      options
	endpoints []string
	targets   []string
	tls       bool
	creds     credentials.TransportCredentials

	connMu sync.Mutex
	conns  []*grpc.ClientConn

	connsClosed bool // set by Close: stub makes no connection after it

	bgCtx    context.Context
	bgCancel context.CancelFunc
	bg       sync.WaitGroup
	// bgMu guards bgStopped, which Close sets before it waits for bg: spawn adds nothing after.
	bgMu      sync.Mutex
	bgStopped bool
	// openSem (capacity 1) lets one open run at a time; a wait for it honours the caller's ctx.
	openSem chan struct{}

	mu            sync.Mutex
	preferred     int
	sess          *session
	conn          *streamConn
	gen           int
	rid           uint64
	pending       map[uint64]*pendingReq
	pushes        *pushes[*acq]
	unsure        []string
	settling      int
	settledCh     chan struct{}
	held          map[int]*hold
	nextHold      int
	closing       bool // Close began: no session opens from now on
	closed        bool // Close's own CloseSession is done: unary calls are refused
	leaseExpired  int
	leaseExtended int
	lastExtension [2]uint64

	// Test hooks: no network for keepalives and reconnects, and expiry reports recorded.
	testNoNet           bool
	testReport          func(names []string)
	testPauseKeepalives bool
	acquiresSent        int // acquire requests sent on the stream (a test checks there is no polling)
	// Set before the client is used: a synthetic node for open and attach; a session's tick
	// about to wait ("wait") and ending ("exit"); an acquire whose ctx ended, before it looks
	// at its answer.
	testHandshake     func(ctx context.Context, i int, first *pb.SessionRequest, limit time.Duration) (*streamConn, *pb.SessionEvent, float64, *Error)
	testTickHook      func(s *session, at string)
	testAcquireGaveUp func()
}

type hold struct {
	id        int
	name      string
	token     uint64
	sessionID string
	lease     *lockLease
	owner     string
	mode      Mode
	reentry   uint32
}

type acqResult struct {
	hold *hold
	err  error
}

type acq struct {
	name  string
	owner string
	mode  Mode
	ch    chan acqResult // buffered 1
	done  bool           // answered or abandoned (under mu)
	// When the acquire was sent (a group the client has no lease for counts its lease from it).
	sent float64
	// When its wait ends on the service (send time + wait).
	waitUntil float64
}

type pendingKind int

const (
	pendKeepalive pendingKind = iota
	pendAcquire
	pendRelease
)

type releaseResult struct {
	remaining uint32
	err       error
}

type pendingReq struct {
	kind  pendingKind
	sent  float64
	named bool
	acq   *acq
	rel   chan releaseResult // buffered 1
}

// errUnsure: a release on the stream whose answer the broken stream took: it may have landed.
var errUnsure = errors.New("lockd: the session stream broke before the release was answered")

type session struct {
	id                string
	gen               int
	ttl, every        float64
	lease             *sessionLease
	nextKeepalive     float64
	reconnectAt       float64
	reconnectAttempt  int
	keepaliveFailures int
	checkDue          float64
	checkedChanges    int
	// wake wakes this session's tick (its own channel: a poke meant for a newer session's
	// tick is never taken by this one's, nor the other way round).
	wake chan struct{}
	// An attach runs (reconnect, in its own goroutine); the tick keeps the deadlines meanwhile.
	reconnecting bool
}

// poke wakes the session's tick, so that it computes its next wake-up again.
func (s *session) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

type streamConn struct {
	stream   pb.Lock_SessionClient
	cancel   context.CancelFunc
	endpoint int
	queue    *sendQueue
}

func (c *streamConn) close() {
	c.queue.close()
	c.cancel()
}

// sendQueue is an unbounded FIFO of requests that one goroutine sends on the stream.
type sendQueue struct {
	mu     sync.Mutex
	items  []*pb.SessionRequest
	closed bool
	notify chan struct{}
}

func newSendQueue() *sendQueue { return &sendQueue{notify: make(chan struct{}, 1)} }

func (q *sendQueue) put(r *pb.SessionRequest) {
	q.mu.Lock()
	if !q.closed {
		q.items = append(q.items, r)
	}
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

func (q *sendQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	select {
	case q.notify <- struct{}{}:
	default:
	}
}

func (q *sendQueue) run(stream pb.Lock_SessionClient) {
	for {
		q.mu.Lock()
		items, closed := q.items, q.closed
		q.items = nil
		q.mu.Unlock()
		if closed {
			return
		}
		for _, r := range items {
			if stream.Send(r) != nil {
				return // the reader sees the stream's end
			}
		}
		<-q.notify
	}
}

// New makes a client for the cluster whose gRPC addresses (HOST:PORT, or https://HOST:PORT for
// TLS with the system's roots) are given; the client moves to the next one when a node stops
// answering. Nothing is sent until the first call that needs the service.
func New(endpoints []string, opts ...Option) (*Client, error) {
	o := defaultOptions()
	for _, f := range opts {
		f(&o)
	}
	if err := o.validate(); err != nil {
		return nil, err
	}
	var eps, targets []string
	https := false
	for _, e := range endpoints {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		target := e
		if i := strings.Index(e, "://"); i >= 0 {
			if strings.HasPrefix(e, "https://") {
				https = true
			}
			target = e[i+3:]
		}
		if !strings.Contains(target, ":") {
			return nil, invalidArg("endpoint %q must be HOST:PORT", e)
		}
		eps = append(eps, e)
		targets = append(targets, target)
	}
	if len(eps) == 0 {
		return nil, invalidArg("endpoints must name at least one node's gRPC address (HOST:PORT)")
	}
	c := &Client{opts: o, endpoints: eps, targets: targets, conns: make([]*grpc.ClientConn, len(eps)),
		openSem: make(chan struct{}, 1), pending: map[uint64]*pendingReq{}, pushes: newPushes[*acq](),
		held: map[int]*hold{}, nextHold: 1}
	c.tls = o.caFile != "" || o.certFile != "" || https
	if c.tls {
		creds, err := tlsCredentials(&o)
		if err != nil {
			return nil, err
		}
		c.creds = creds
	} else {
		c.creds = insecure.NewCredentials()
	}
	c.bgCtx, c.bgCancel = context.WithCancel(context.Background())
	return c, nil
}

func tlsCredentials(o *options) (credentials.TransportCredentials, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: o.tlsServerName}
	if o.caFile != "" {
		pem, err := os.ReadFile(o.caFile)
		if err != nil {
			return nil, invalidArg("CA file %q cannot be read: %v", o.caFile, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, invalidArg("CA file %q holds no PEM certificate", o.caFile)
		}
		cfg.RootCAs = pool
	}
	if o.certFile != "" {
		cert, err := tls.LoadX509KeyPair(o.certFile, o.keyFile)
		if err != nil {
			return nil, invalidArg("client certificate %q / key %q cannot be loaded: %v", o.certFile, o.keyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return credentials.NewTLS(cfg), nil
}

// ----- plumbing -----------------------------------------------------------------------------

func (c *Client) stub(i int) (pb.LockClient, error) {
	c.connMu.Lock()
	defer c.connMu.Unlock()
	if c.connsClosed {
		return nil, errClosed()
	}
	if c.conns[i] == nil {
		bc := backoff.DefaultConfig
		bc.BaseDelay = 100 * time.Millisecond
		bc.MaxDelay = time.Second
		cc, err := grpc.NewClient(c.targets[i], grpc.WithTransportCredentials(c.creds),
			grpc.WithConnectParams(grpc.ConnectParams{Backoff: bc, MinConnectTimeout: c.opts.connectTimeout}),
			grpc.WithDisableRetry())
		if err != nil {
			return nil, &Error{Kind: KindUnavailable, Code: "unavailable",
				Message: fmt.Sprintf("%s: %v", c.endpoints[i], err), cause: err}
		}
		c.conns[i] = cc
	}
	return pb.NewLockClient(c.conns[i]), nil
}

func (c *Client) withAuth(ctx context.Context) context.Context {
	if c.opts.token == "" {
		return ctx
	}
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.opts.token)
}

func (c *Client) rpcError(err error, i int, trailer metadata.MD) *Error {
	return fromRPC(err, c.endpoints[i], trailer, c.tls, c.tls && c.opts.certFile == "")
}

func (c *Client) preferredLocked() int { return c.preferred % len(c.endpoints) }

func (c *Client) preferredEndpoint() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.preferredLocked()
}

// rotateLocked moves on to the next endpoint after failed did not answer.
func (c *Client) rotateLocked(failed int) {
	if c.preferred%len(c.endpoints) == failed {
		c.preferred = (failed + 1) % len(c.endpoints)
	}
}

func (c *Client) rotate(failed int) {
	c.mu.Lock()
	c.rotateLocked(failed)
	c.mu.Unlock()
}

func (c *Client) nextRIDLocked() uint64 {
	c.rid++
	return c.rid
}

// spawn runs f in the background (Close waits for it); false, and f does not run, once Close
// has stopped the background work.
func (c *Client) spawn(f func()) bool {
	c.bgMu.Lock()
	defer c.bgMu.Unlock()
	if c.bgStopped {
		return false
	}
	c.bg.Add(1)
	go func() {
		defer c.bg.Done()
		f()
	}()
	return true
}

// pokeLocked wakes the current session's tick.
func (c *Client) pokeLocked() {
	if c.sess != nil {
		c.sess.poke()
	}
}

func errClosed() *Error { return newErr(KindClientClosed, "the client is closed") }

func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

type unaryCall[T any] func(ctx context.Context, st pb.LockClient, opts ...grpc.CallOption) (T, error)

// unary is a call on the preferred node, retried with backoff on retryable errors (moving to the
// next node when one does not answer). landed is set when an attempt failed in a way that may
// have reached the service. timeout 0: the request timeout; attempts 0: the policy's.
func unary[T any](ctx context.Context, c *Client, call unaryCall[T], timeout time.Duration, landed *bool, attempts int) (T, error) {
	var zero T
	policy := c.opts.retry
	if attempts <= 0 {
		attempts = policy.MaxAttempts
	}
	if timeout <= 0 {
		timeout = c.opts.requestTimeout
	}
	for attempt := 1; ; attempt++ {
		c.mu.Lock()
		closed := c.closed
		i := c.preferredLocked()
		c.mu.Unlock()
		if closed {
			return zero, errClosed()
		}
		var err *Error
		st, serr := c.stub(i)
		if serr != nil {
			err = serr.(*Error)
		} else {
			cctx, cancel := context.WithTimeout(c.withAuth(ctx), timeout)
			var trailer metadata.MD
			r, cerr := call(cctx, st, grpc.Trailer(&trailer))
			cancel()
			if cerr == nil {
				return r, nil
			}
			if ctx.Err() != nil {
				return zero, ctx.Err()
			}
			err = c.rpcError(cerr, i, trailer)
		}
		if err.Kind == KindUnavailable && err.Status == 0 {
			c.rotate(i)
			if landed != nil {
				*landed = true
			}
		}
		if err.Status == 503 && landed != nil {
			*landed = true // "no leader" is refused before proposing, but "outcome unknown" is 503 too
		}
		if !err.Retryable() || attempt >= attempts {
			return zero, err
		}
		if serr := sleepCtx(ctx, policy.Delay(attempt-1, err.RetryAfter)); serr != nil {
			return zero, serr
		}
	}
}

// ----- the session ------------------------------------------------------------------------

// Connect opens the session now (otherwise the first acquire does).
func (c *Client) Connect(ctx context.Context) error {
	_, err := c.ensureSession(ctx)
	return err
}

func (c *Client) ensureSession(ctx context.Context) (*session, error) {
	c.mu.Lock()
	closing, s := c.closing, c.sess
	c.mu.Unlock()
	if closing {
		return nil, errClosed()
	}
	if s != nil {
		return s, nil
	}
	select {
	case c.openSem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-c.openSem }()
	c.mu.Lock()
	closing, s = c.closing, c.sess
	c.mu.Unlock()
	if closing {
		return nil, errClosed()
	}
	if s != nil {
		return s, nil
	}
	return c.open(ctx)
}

func (c *Client) open(ctx context.Context) (*session, error) {
	o := &c.opts
	openReq := &pb.OpenSessionRequest{Client: o.clientName, TtlMs: uint64(o.ttl.Milliseconds()), Namespace: o.namespace}
	giveUp := monotonic() + o.connectTimeout.Seconds()
	for attempt := 1; ; attempt++ {
		c.mu.Lock()
		closing := c.closing
		i := c.preferredLocked()
		rid := c.nextRIDLocked()
		c.mu.Unlock()
		if closing {
			return nil, errClosed()
		}
		conn, ev, sent, err := c.handshake(ctx, i, &pb.SessionRequest{RequestId: rid,
			Kind: &pb.SessionRequest_Open{Open: openReq}}, o.requestTimeout)
		if err == nil {
			if r := ev.GetOpened(); r != nil {
				if s := c.opened(r, sent, conn); s != nil {
					return s, nil
				}
				// Close began while the open was in flight: nobody will use this session.
				if conn != nil {
					conn.close()
				}
				c.closeUnused(i, r.GetSessionId())
				return nil, errClosed()
			}
			if conn != nil {
				conn.close()
			}
			err = newErr(KindUnavailable, "unexpected answer to open: %T", ev.GetKind())
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err.Kind == KindUnavailable {
			c.rotate(i)
		}
		pause := o.retry.Delay(attempt-1, err.RetryAfter)
		if !err.Retryable() || attempt >= o.retry.MaxAttempts || monotonic()+pause.Seconds() >= giveUp {
			err.Exhausted = err.Retryable()
			return nil, err
		}
		if serr := sleepCtx(ctx, pause); serr != nil {
			return nil, serr
		}
	}
}

// opened installs the session an open created (nil, and nothing installed, once Close began).
func (c *Client) opened(r *pb.OpenSessionResponse, sent float64, conn *streamConn) *session {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing {
		return nil
	}
	c.gen++
	ttl := float64(r.GetTtlMs()) / 1000.0
	every := float64(max(r.GetKeepaliveEveryMs(), 1)) / 1000.0
	leases := newGroupLeases(sent, ttl, c.opts.marginFor(ttl))
	leases.homed(r.GetGroup(), sent, monotonic())
	lease := &sessionLease{watched: newWatched(), gen: c.gen, sessionID: r.GetSessionId(), leases: leases, engine: &c.mu}
	s := &session{id: r.GetSessionId(), gen: c.gen, ttl: ttl, every: every, lease: lease,
		nextKeepalive: sent + every, reconnectAt: sent, checkedChanges: -1, wake: make(chan struct{}, 1)}
	c.sess = s
	c.installLocked(conn)
	go c.tick(s)
	return s
}

// closeUnused ends, on the service, a session opened on endpoint i that nobody will use (Close
// began while it opened); best effort: otherwise it expires after its TTL.
func (c *Client) closeUnused(i int, id string) {
	if c.testNoNet {
		return
	}
	st, err := c.stub(i)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(c.withAuth(context.Background()), c.opts.requestTimeout)
	defer cancel()
	_, _ = st.CloseSession(ctx, &pb.CloseSessionRequest{SessionId: id})
}

func (c *Client) installLocked(conn *streamConn) {
	c.conn = conn
	if conn != nil {
		go conn.queue.run(conn.stream)
		go c.read(conn)
	}
}

// handshake opens a stream to endpoint i whose first message is first; returns the stream, the
// first answer and when the request was sent. limit bounds the whole exchange.
func (c *Client) handshake(ctx context.Context, i int, first *pb.SessionRequest, limit time.Duration) (*streamConn, *pb.SessionEvent, float64, *Error) {
	if c.testHandshake != nil {
		return c.testHandshake(ctx, i, first, limit)
	}
	st, serr := c.stub(i)
	if serr != nil {
		return nil, nil, 0, serr.(*Error)
	}
	sctx, cancel := context.WithCancel(c.withAuth(c.bgCtx))
	stop := context.AfterFunc(ctx, cancel)
	defer stop()
	timer := time.AfterFunc(limit, cancel)
	sent := monotonic()
	fail := func(err error) (*streamConn, *pb.SessionEvent, float64, *Error) {
		timedOut := !timer.Stop()
		cancel()
		if timedOut && ctx.Err() == nil {
			return nil, nil, 0, newErr(KindUnavailable, "%s did not answer in %s", c.endpoints[i], limit)
		}
		var trailer metadata.MD
		return nil, nil, 0, c.rpcError(err, i, trailer)
	}
	stream, err := st.Session(sctx)
	if err != nil {
		return fail(err)
	}
	if err := stream.Send(first); err != nil {
		_, rerr := stream.Recv() // the real error
		if rerr == nil {
			rerr = err
		}
		return fail(rerr)
	}
	for {
		ev, err := stream.Recv()
		if err != nil {
			return fail(err)
		}
		if ev.GetRequestId() != first.GetRequestId() {
			continue
		}
		if !timer.Stop() {
			cancel()
			return nil, nil, 0, newErr(KindUnavailable, "%s did not answer in %s", c.endpoints[i], limit)
		}
		if e := ev.GetError(); e != nil {
			cancel()
			return nil, nil, 0, fromEvent(e)
		}
		return &streamConn{stream: stream, cancel: cancel, endpoint: i, queue: newSendQueue()}, ev, sent, nil
	}
}

func (c *Client) read(conn *streamConn) {
	why := "the node ended the session stream"
	for {
		ev, err := conn.stream.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				why = fmt.Sprintf("session stream failed: %v", c.rpcError(err, conn.endpoint, nil))
			}
			break
		}
		c.mu.Lock()
		if c.conn != conn {
			c.mu.Unlock()
			return
		}
		c.eventLocked(ev)
		c.mu.Unlock()
	}
	c.mu.Lock()
	if c.conn == conn {
		c.disconnectedLocked(why)
	}
	c.mu.Unlock()
}

// tick runs keepalives, the local deadlines and reconnects of session s, until it ends. It never
// waits for the network itself: an attach runs in its own goroutine (reconnect), so the
// deadlines fire on time however long a handshake or the settling after it takes.
func (c *Client) tick(s *session) {
	if h := c.testTickHook; h != nil {
		defer h(s, "exit")
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		c.mu.Lock()
		if c.sess != s {
			c.mu.Unlock()
			return
		}
		now := monotonic()
		leases := s.lease.leases
		if leases.sessionExpired(now) {
			c.loseLocked("every local lease deadline passed without a renewal", true)
			c.mu.Unlock()
			return
		}
		c.checkLocksLocked(s, now)
		wake := math.Inf(1)
		switch {
		case s.reconnecting:
			// Its end wakes this loop (reconnect pokes s).
		case c.conn != nil || c.testNoNet:
			if now >= s.nextKeepalive {
				c.keepaliveLocked()
				c.mu.Unlock()
				continue
			}
			wake = s.nextKeepalive
		case now >= s.reconnectAt:
			if c.spawn(func() { c.reconnect(s) }) {
				s.reconnecting = true
				c.mu.Unlock()
				continue
			}
			// Close stopped the background work: this session ends with the client.
			c.endOnCloseLocked(s)
			c.mu.Unlock()
			return
		default:
			wake = s.reconnectAt
		}
		wake = math.Min(wake, math.Min(leases.sessionDeadline(), s.checkDue))
		select { // pokes before this point are covered by the computation above
		case <-s.wake:
		default:
		}
		c.mu.Unlock()
		if h := c.testTickHook; h != nil {
			h(s, "wait")
		}
		timer.Reset(max(secs(wake-now), 0))
		select {
		case <-timer.C:
		case <-s.wake:
			timer.Stop() // Go 1.23+: no stale tick is received after Stop or Reset
		case <-c.bgCtx.Done():
			c.mu.Lock()
			c.endOnCloseLocked(s)
			c.mu.Unlock()
			return
		}
	}
}

// endOnCloseLocked: the client is closing and s may still be its session: end it here, so that
// no lock of it outlives Close without reporting lost.
func (c *Client) endOnCloseLocked(s *session) {
	if c.sess != s || s == nil {
		return
	}
	c.sess = nil
	c.endLocallyLocked(s, "the client was closed", func() error { return errClosed() })
}

// renewedLocked: a renewal (keepalive or attach) sent at sent (named: naming its groups) was
// acknowledged with r.
func (c *Client) renewedLocked(sent float64, r *pb.KeepAliveResponse, named bool) {
	s := c.sess
	if s == nil {
		return
	}
	now := monotonic()
	switch s.lease.leases.renewed(sent, r.GetTtlMs(), r.GetGroups(), now, named) {
	case renewTooLate:
		c.loseLocked("every local lease deadline passed without a renewal", true)
		return
	case renewGone:
		c.loseLocked("every lock group said the session has no lease there", true)
		return
	case renewRestarted:
		c.opts.logger.Info("lockd: every lock group answered again after the session-wide deadline " +
			"had passed; the locks that followed it stay lost")
	}
	for _, gl := range r.GetGroups() {
		if gl.GetState() != stateExtended && gl.GetState() != stateNotHere {
			c.opts.logger.Debug("lockd: a lock group could not answer a keepalive", "group", gl.GetGroup(), "error", gl.GetError())
		}
	}
	c.checkLocksLocked(s, now)
}

// checkLocksLocked fires lost for the holds of s that are lost while the session goes on.
func (c *Client) checkLocksLocked(s *session, now float64) {
	leases := s.lease.leases
	if now < s.checkDue && leases.changes == s.checkedChanges {
		return
	}
	s.checkedChanges = leases.changes
	s.poke()
	var lost []*hold
	due := math.Inf(1)
	for _, h := range c.held {
		if h.lease.session != s.lease || h.lease.isFired() {
			continue
		}
		d := h.lease.deadlineLocked()
		if now >= d {
			lost = append(lost, h)
		} else {
			due = math.Min(due, d)
		}
	}
	s.checkDue = due
	if len(lost) == 0 {
		return
	}
	names := make([]string, 0, len(lost))
	for _, h := range lost {
		why := leases.whyLost(h.lease.hold)
		c.opts.logger.Warn("lockd: lock lost", "name", h.name, "client", c.opts.clientName, "why", why)
		h.lease.end(why)
		names = append(names, h.name)
	}
	c.leaseExpired += len(lost)
	c.spawn(func() { c.reportExpired(names) })
}

func (c *Client) reportExpired(names []string) {
	if c.testReport != nil {
		c.testReport(names)
		return
	}
	for _, name := range names {
		_, err := unary(c.bgCtx, c, func(ctx context.Context, st pb.LockClient, o ...grpc.CallOption) (*pb.ReportLeaseExpiredResponse, error) {
			return st.ReportLeaseExpired(ctx, &pb.ReportLeaseExpiredRequest{Name: name}, o...)
		}, 0, nil, 2)
		if err != nil {
			c.opts.logger.Debug("lockd: could not report an expired lease", "error", err)
		}
	}
}

func (c *Client) keepaliveLocked() {
	s, conn := c.sess, c.conn
	if s == nil || conn == nil {
		return
	}
	now := monotonic()
	s.nextKeepalive = now + s.every
	if c.testPauseKeepalives {
		return
	}
	// An adopted wait whose outcome no node pushes: the caller decides again.
	for _, a := range c.pushes.giveUpAdopters(func(a *acq) bool { return a.waitUntil+adoptedSlack <= now }) {
		c.failLocked(a, newErr(KindUnavailable, "the wait for %q queued before the session stream "+
			"broke was not answered on the new stream", a.name))
	}
	// The previous keepalive went unanswered for a whole interval: the node is stuck or gone.
	for _, p := range c.pending {
		if p.kind == pendKeepalive && now-p.sent >= s.every {
			c.rotateLocked(conn.endpoint)
			c.disconnectedLocked("a keepalive went unanswered for a whole interval")
			return
		}
	}
	groups := c.keepaliveGroupsLocked(s)
	rid := c.nextRIDLocked()
	c.pending[rid] = &pendingReq{kind: pendKeepalive, sent: now, named: len(groups) > 0}
	c.sendLocked(&pb.SessionRequest{RequestId: rid, Kind: &pb.SessionRequest_Keepalive{
		Keepalive: &pb.KeepAliveRequest{SessionId: s.id, Groups: groups}}})
}

func (c *Client) keepaliveGroupsLocked(s *session) []uint32 {
	var holds []holdLease
	for _, h := range c.held {
		if h.sessionID == s.id {
			holds = append(holds, h.lease.hold)
		}
	}
	unsure := len(c.unsure) > 0 || c.pushes.hasStrays()
	return s.lease.leases.keepaliveGroups(holds, c.pushes.waitGroups(), unsure, monotonic())
}

func (c *Client) sendLocked(req *pb.SessionRequest) {
	if c.conn != nil {
		c.conn.queue.put(req)
	}
}

// reconnect moves the session to the next node (attach), within the local deadline. It runs in
// its own goroutine (the tick's deadlines go on meanwhile) and wakes the tick when it ends.
func (c *Client) reconnect(s *session) {
	defer func() {
		c.mu.Lock()
		s.reconnecting = false
		c.mu.Unlock()
		s.poke()
	}()
	c.mu.Lock()
	if c.sess != s {
		c.mu.Unlock()
		return
	}
	i := c.preferredLocked()
	rid := c.nextRIDLocked()
	left := s.lease.leases.sessionDeadline() - monotonic()
	c.mu.Unlock()
	limit := c.opts.requestTimeout
	leaseBound := false
	if secs(left) < limit {
		limit, leaseBound = max(secs(left), time.Millisecond), true
	}
	conn, ev, sent, err := c.handshake(c.bgCtx, i, &pb.SessionRequest{RequestId: rid,
		Kind: &pb.SessionRequest_Attach{Attach: s.id}}, limit)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sess != s {
		if conn != nil {
			conn.close()
		}
		return
	}
	if err != nil {
		if leaseBound && monotonic() >= s.lease.leases.sessionDeadline() {
			c.loseLocked("the local lease deadline passed while reconnecting", true)
			return
		}
		if err.Code == "session_not_found" {
			c.loseLocked("the service no longer knows the session", true)
			return
		}
		c.opts.logger.Debug("lockd: attach failed", "endpoint", c.endpoints[i], "error", err)
		c.retryReconnectLocked(s, i)
		return
	}
	ka := ev.GetKeepalive()
	if ka == nil {
		conn.close()
		c.retryReconnectLocked(s, i)
		return
	}
	c.opts.logger.Debug("lockd: session stream moved", "endpoint", c.endpoints[i])
	c.installLocked(conn)
	s.reconnectAttempt = 0
	c.renewedLocked(sent, ka, false)
	s.nextKeepalive = sent + s.every
	if c.sess == s {
		// In the background: settling may take a request timeout (or the interval), and the
		// tick must not wait for it. Acquires wait for it (beginSettleLocked).
		c.spawnSettleLocked(s)
	}
}

func (c *Client) retryReconnectLocked(s *session, failed int) {
	c.rotateLocked(failed)
	s.reconnectAt = monotonic() + c.opts.retry.Delay(min(s.reconnectAttempt, 4), 0).Seconds()
	s.reconnectAttempt++
}

// settleUnsure: acquires whose answer the broken stream lost may have been granted: a hold of
// ours that no lock object knows is given back, so the caller's retry starts clean.
func (c *Client) settleUnsure(s *session) {
	c.mu.Lock()
	unsure := c.unsure
	c.unsure = nil
	c.mu.Unlock()
	if len(unsure) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(c.bgCtx, secs(s.every))
	defer cancel()
	detail, err := unary(ctx, c, func(ctx context.Context, st pb.LockClient, o ...grpc.CallOption) (*pb.SessionDetail, error) {
		return st.GetSession(ctx, &pb.GetSessionRequest{SessionId: s.id}, o...)
	}, 0, nil, 1)
	if err != nil {
		c.opts.logger.Debug("lockd: could not settle unanswered acquires", "error", err)
		return
	}
	listed := make([]heldToken, 0, len(detail.GetHeld()))
	for _, h := range detail.GetHeld() {
		listed = append(listed, heldToken{h.GetName(), h.GetFencingToken()})
	}
	c.mu.Lock()
	back, later := settle(unsure, listed, func(n string, t uint64) bool {
		for _, h := range c.held {
			if h.name == n && h.token == t {
				return true
			}
		}
		return false
	}, func(n string) bool {
		return c.unansweredLocked(n) || c.pushes.waiting(func(a *acq) bool { return a.name == n })
	})
	if len(later) > 0 && c.sess == s {
		c.unsure = append(c.unsure, later...)
		c.spawn(func() {
			if sleepCtx(c.bgCtx, secs(s.every)) != nil {
				return
			}
			c.mu.Lock()
			if c.sess != s {
				c.mu.Unlock()
				return
			}
			run, _ := c.beginSettleLocked(s)
			c.mu.Unlock()
			run()
		})
	}
	c.mu.Unlock()
	for _, h := range back {
		if _, err := c.release(ctx, s.id, h.name, h.token); err != nil {
			c.opts.logger.Debug("lockd: could not give back a hold", "name", h.name, "error", err)
		}
	}
}

// beginSettleLocked starts settling now: acquires on the stream wait until it ends, so that a
// retry is never sent while its first attempt's hold is still to be given back. Returns the
// work to run (without the lock), and what to call instead (with the lock) if it cannot run.
func (c *Client) beginSettleLocked(s *session) (run func(), abandonLocked func()) {
	if c.settling == 0 || c.settledCh == nil {
		c.settledCh = make(chan struct{})
	}
	c.settling++
	ch := c.settledCh
	doneLocked := func() {
		c.settling--
		if c.settling == 0 {
			close(ch)
		}
	}
	return func() {
		defer func() {
			c.mu.Lock()
			doneLocked()
			c.mu.Unlock()
		}()
		c.settleUnsure(s)
	}, doneLocked
}

// spawnSettleLocked settles s in the background (beginSettleLocked).
func (c *Client) spawnSettleLocked(s *session) {
	run, abandonLocked := c.beginSettleLocked(s)
	if !c.spawn(run) {
		abandonLocked() // closing: the session ends with the client
	}
}

// ----- events -------------------------------------------------------------------------------

func (c *Client) eventLocked(ev *pb.SessionEvent) {
	var p *pendingReq
	if ev.GetRequestId() != 0 {
		p = c.pending[ev.GetRequestId()]
		delete(c.pending, ev.GetRequestId())
	}
	switch {
	case p != nil && p.kind == pendKeepalive:
		switch {
		case ev.GetKeepalive() != nil:
			if c.sess != nil {
				c.sess.keepaliveFailures = 0
			}
			c.renewedLocked(p.sent, ev.GetKeepalive(), p.named)
		case ev.GetError() != nil && ev.GetError().GetStatus() == 404:
			c.loseLocked("the service no longer knows the session", true)
		case ev.GetError() != nil:
			// 503 (no group extended, some could not answer) or another refusal: the session goes
			// on while any of its deadlines holds; try again soon.
			c.keepaliveFailedLocked(fromEvent(ev.GetError()))
		}
	case p != nil && p.kind == pendAcquire && p.acq != nil:
		c.acquireAnswerLocked(p.acq, ev)
	case p != nil && p.kind == pendRelease:
		if r := ev.GetReleased(); r != nil {
			p.rel <- releaseResult{remaining: r.GetRemaining()}
		} else if e := ev.GetError(); e != nil {
			p.rel <- releaseResult{err: fromEvent(e)}
		}
	case ev.GetSessionEnded() != nil:
		se := ev.GetSessionEnded()
		if se.GetGroup() != 0 && se.GetReason() == "expired" {
			c.groupEndedLocked(se.GetGroup())
		} else {
			c.loseLocked(fmt.Sprintf("the service ended the session (%s)", se.GetReason()), se.GetReason() != "closed")
		}
	case ev.GetGranted() != nil || ev.GetWaitEnded() != nil:
		c.pushedLocked(c.pushes.pushed(ev, c.unansweredLocked))
	case ev.GetLeaseExtended() != nil:
		le := ev.GetLeaseExtended()
		c.leaseExtended++
		c.lastExtension = [2]uint64{uint64(le.GetGroup()), le.GetRemainingMs()}
		c.opts.logger.Info("lockd: a new leader extended the lease; the local deadline keeps its own, shorter rule",
			"group", le.GetGroup(), "remaining_ms", le.GetRemainingMs())
	default:
		c.opts.logger.Debug("lockd: unexpected session event", "event", fmt.Sprintf("%T", ev.GetKind()))
	}
}

func (c *Client) acquireAnswerLocked(a *acq, ev *pb.SessionEvent) {
	if e := ev.GetError(); e != nil && e.GetCode() == "already_waiting" {
		// Refused by its own first attempt, whose answer a broken stream took: the wait is queued
		// for the session, and this retry adopts it. Its lease counts from the first send.
		if first, ok := c.pushes.straySince(a.name, a.owner); ok && first < a.sent {
			a.sent = first
		}
		adopted, answer := c.pushes.refusedWaiting(a.name, a.owner, a)
		if answer.answered {
			c.outcomeLocked(answer.acq, answer.event)
		} else if !adopted {
			c.failLocked(a, fromEvent(e))
		}
		c.unclaimedLocked(a.name)
		return
	}
	if e := ev.GetError(); e != nil && e.GetCode() == "already_held" && c.firstAttemptHeldLocked(a) {
		// Its own first attempt landed as a hold no lock object knows: give that back, and the
		// caller's retry starts clean.
		c.unsure = append(c.unsure, a.name)
		if s := c.sess; s != nil {
			c.spawnSettleLocked(s)
		}
		c.failLocked(a, newErr(KindUnavailable, "the first attempt at %q landed after its stream broke; "+
			"that hold is given back before the retry", a.name))
		return
	}
	c.pushes.settled(a.name, a.owner)
	switch {
	case ev.GetAcquired() != nil:
		r := ev.GetAcquired()
		if r.GetAcquired() {
			if r.GetLeaseStarted() && c.sess != nil {
				c.sess.lease.leases.started(r.GetGroup(), a.sent, r.GetLeaseTtlMs(), monotonic())
			}
			c.renewedInLocked(r.GetGroup(), r.GetRenewed(), a.sent)
			c.answerLocked(a, r.GetFencingToken(), max(r.GetReentry(), 1), r.GetGroup(), r.GetGroupMoves(), r.GetLeaseTtlMs())
		} else {
			c.failLocked(a, notAcquired(a.name, r))
		}
	case ev.GetQueued() != nil:
		q := ev.GetQueued()
		if q.GetLeaseStarted() && c.sess != nil {
			c.sess.lease.leases.started(q.GetGroup(), a.sent, 0, monotonic())
		}
		c.renewedInLocked(q.GetGroup(), q.GetRenewed(), a.sent)
		if answer := c.pushes.queued(pushKey{q.GetGroup(), q.GetWaiter()}, a); answer.answered {
			c.outcomeLocked(answer.acq, answer.event)
		}
	case ev.GetError() != nil:
		c.failLocked(a, fromEvent(ev.GetError()))
	}
	c.unclaimedLocked(a.name)
}

func notAcquired(name string, r *pb.AcquireResponse) *Error {
	msg := fmt.Sprintf("%q is held", name)
	if r.GetHolder() != "" {
		msg += fmt.Sprintf(" by %q", r.GetHolder())
	}
	e := newErr(KindNotAcquired, "%s", msg)
	e.Holder, e.QueuePosition, e.LockDelayUntilMs = r.GetHolder(), r.GetQueuePosition(), r.GetLockDelayUntilMs()
	return e
}

// renewedInLocked: an acquire sent at sent was granted or queued in group and the group's
// leader renewed the session's lease there as it did (when the service says so).
func (c *Client) renewedInLocked(group uint32, renewed *pb.GroupLease, sent float64) {
	if renewed == nil || renewed.GetState() != stateExtended || c.sess == nil {
		return
	}
	c.sess.lease.leases.renewedIn(group, sent, renewed.GetTtlMs(), renewed.GetGroupMoves(), monotonic())
}

// groupEndedLocked: lock group let the session's lease there run out (a pushed SessionEnded for
// that group): the locks it granted before the push are lost; the session goes on.
func (c *Client) groupEndedLocked(group uint32) {
	s := c.sess
	if s == nil {
		return
	}
	now := monotonic()
	c.opts.logger.Warn("lockd: a lock group ended the session's lease there; its locks there are lost, the session goes on",
		"group", group, "client", c.opts.clientName)
	s.lease.leases.groupEnded(group, now)
	c.checkLocksLocked(s, now)
}

func (c *Client) keepaliveFailedLocked(err *Error) {
	s := c.sess
	if s == nil {
		return
	}
	c.opts.logger.Debug("lockd: keepalive refused", "error", err)
	s.keepaliveFailures++
	retry := monotonic() + math.Min(s.every, c.opts.retry.Delay(min(s.keepaliveFailures, 4), err.RetryAfter).Seconds())
	if retry < s.nextKeepalive {
		s.nextKeepalive = retry
		s.poke()
	}
}

// firstAttemptHeldLocked: whether already_held answering a is its own first attempt's hold: a
// is a stray and no lock of this session holds it.
func (c *Client) firstAttemptHeldLocked(a *acq) bool {
	s := c.sess
	if s == nil {
		return false
	}
	for _, h := range c.held {
		if h.name == a.name && h.lease.session == s.lease {
			return false
		}
	}
	return c.pushes.isStray(a.name, a.owner)
}

// unansweredLocked: whether an acquire of name is still unanswered on the stream.
func (c *Client) unansweredLocked(name string) bool {
	for _, p := range c.pending {
		if p.acq != nil && p.acq.name == name {
			return true
		}
	}
	return false
}

func (c *Client) pushedLocked(p pushed[*acq]) {
	if p.answered {
		c.outcomeLocked(p.acq, p.event)
	} else if p.orphan {
		c.giveBackLocked(p.orphanName, p.orphanToken)
	}
}

func (c *Client) unclaimedLocked(name string) {
	for _, p := range c.pushes.unclaimed(name, c.unansweredLocked) {
		c.pushedLocked(p)
	}
}

// giveBackLocked: a grant nobody waits for: give it back, unless a lock object holds it.
func (c *Client) giveBackLocked(name string, token uint64) {
	s := c.sess
	if s == nil {
		return
	}
	for _, h := range c.held {
		if h.name == name && h.token == token {
			return
		}
	}
	c.opts.logger.Debug("lockd: giving back a grant nobody waits for", "name", name)
	id := s.id
	c.spawn(func() { c.releaseQuietly(id, name, token) })
}

// outcomeLocked: a granted or wait_ended push answers the acquire a.
func (c *Client) outcomeLocked(a *acq, ev *pb.SessionEvent) {
	if g := ev.GetGranted(); g != nil {
		c.answerLocked(a, g.GetFencingToken(), 1, g.GetGroup(), g.GetGroupMoves(), g.GetLeaseTtlMs())
		return
	}
	switch ev.GetWaitEnded().GetReason() {
	case "session_ended":
		c.failLocked(a, newErr(KindSessionLost, "the session ended while waiting"))
	case "moved":
		c.failLocked(a, newErr(KindUnavailable, "the bucket of %q moved to another group", a.name))
	default:
		c.failLocked(a, newErr(KindNotAcquired, "the wait for %q ended without a grant", a.name))
	}
}

func (c *Client) answerLocked(a *acq, token uint64, reentry, group uint32, groupMoves, leaseTTLMs uint64) {
	s := c.sess
	if s == nil {
		c.failLocked(a, newErr(KindSessionLost, "the session ended"))
		return
	}
	if a.done {
		// Nobody waits for this grant any more (the acquire gave up): give it back.
		id, name := s.id, a.name
		c.spawn(func() { c.releaseQuietly(id, name, token) })
		return
	}
	a.done = true
	a.ch <- acqResult{hold: c.holdLocked(s, a.name, token, a.owner, a.mode, reentry, a.sent, group, groupMoves, leaseTTLMs)}
}

// holdLocked registers a grant of session s, tied to the lease of the group that made it.
func (c *Client) holdLocked(s *session, name string, token uint64, owner string, mode Mode, reentry uint32,
	sent float64, group uint32, groupMoves, leaseTTLMs uint64) *hold {
	others, hasOthers := 0.0, false
	for _, p := range c.pending {
		if p.acq != nil && (!hasOthers || p.acq.sent < others) {
			others, hasOthers = p.acq.sent, true
		}
	}
	hl := s.lease.leases.granted(sent, monotonic(), group, groupMoves, leaseTTLMs, others, hasOthers)
	lease := newLockLease(s.lease, hl)
	if d := lease.deadlineLocked(); d < s.checkDue || s.lease.leases.changes != s.checkedChanges {
		s.checkDue = math.Min(s.checkDue, d)
		s.poke()
	}
	h := &hold{id: c.nextHold, name: name, token: token, sessionID: s.id, lease: lease, owner: owner, mode: mode, reentry: reentry}
	c.nextHold++
	c.held[h.id] = h
	return h
}

func (c *Client) failLocked(a *acq, err error) {
	if !a.done {
		a.done = true
		a.ch <- acqResult{err: err}
	}
}

// disconnectedLocked: the stream broke: fail what was in flight (its outcome is unknown), and
// reconnect.
func (c *Client) disconnectedLocked(why string) {
	conn := c.conn
	c.conn = nil
	if conn == nil {
		return
	}
	c.opts.logger.Debug("lockd: session stream lost", "endpoint", c.endpoints[conn.endpoint], "why", why)
	conn.close()
	c.rotateLocked(conn.endpoint)
	pending := c.pending
	c.pending = map[uint64]*pendingReq{}
	for _, p := range pending {
		if p.acq != nil {
			c.failUnsureLocked(p.acq)
		} else if p.rel != nil {
			p.rel <- releaseResult{err: errUnsure}
		}
	}
	for _, a := range c.pushes.broke() {
		c.failUnsureLocked(a)
	}
	if c.sess != nil {
		c.sess.reconnectAt = monotonic()
		c.sess.reconnectAttempt = 0
	}
	c.pokeLocked()
}

func (c *Client) failUnsureLocked(a *acq) {
	if c.sess != nil {
		c.sess.lease.leases.noteUnsure(a.sent)
	}
	c.unsure = append(c.unsure, a.name)
	c.pushes.stray(a.name, a.owner, a.sent)
	c.failLocked(a, newErr(KindUnavailable, "the session stream broke before the acquire was answered"))
}

func (c *Client) endLocallyLocked(s *session, why string, errf func() error) {
	if conn := c.conn; conn != nil {
		c.conn = nil
		conn.close()
	}
	s.lease.end(why)
	pending := c.pending
	c.pending = map[uint64]*pendingReq{}
	for _, p := range pending {
		if p.acq != nil {
			c.failLocked(p.acq, errf())
		} else if p.rel != nil {
			p.rel <- releaseResult{err: errUnsure} // the session is ending, which frees its holds
		}
	}
	for _, a := range c.pushes.end() {
		c.failLocked(a, errf())
	}
	s.poke() // its tick ends
}

// loseLocked: the session is over for this client: every lock of it is lost.
func (c *Client) loseLocked(why string, report bool) {
	s := c.sess
	if s == nil {
		return
	}
	c.sess = nil
	// Not the session id: it is the session's capability, and logs travel.
	c.opts.logger.Warn("lockd: session lost", "client", c.opts.clientName, "why", why)
	var held []string
	if report {
		for _, h := range c.held {
			if h.lease.session == s.lease && !h.lease.isFired() {
				held = append(held, h.name)
			}
		}
	}
	c.endLocallyLocked(s, why, func() error { return newErr(KindSessionLost, "the session ended: %s", why) })
	c.unsure = nil
	c.leaseExpired += len(held)
	id := s.id
	quiet := c.testNoNet || c.testPauseKeepalives
	c.spawn(func() {
		if quiet { // a test's client that cannot reach the service
			if c.testReport != nil {
				c.testReport(held)
			}
			return
		}
		c.reportExpired(held)
		// The locks are lost; free them now rather than at the service's expiry.
		_, _ = unary(c.bgCtx, c, func(ctx context.Context, st pb.LockClient, o ...grpc.CallOption) (*pb.CloseSessionResponse, error) {
			return st.CloseSession(ctx, &pb.CloseSessionRequest{SessionId: id}, o...)
		}, 0, nil, 2)
	})
}

// ----- requests -----------------------------------------------------------------------------

type acquireSpec struct {
	mode      Mode
	limit     uint32
	owner     string
	ownerSet  bool
	reentrant bool
}

// AcquireOption adjusts an acquire.
type AcquireOption func(*acquireSpec)

// SharedMode takes the lock shared: readers together, never beside an exclusive holder.
func SharedMode() AcquireOption { return func(s *acquireSpec) { s.mode = Shared } }

// SemaphoreMode takes one of n permits (1..=10 000), each holder with its own token. Every user
// of a name must use the same limit.
func SemaphoreMode(n uint32) AcquireOption {
	return func(s *acquireSpec) { s.mode, s.limit = Semaphore, n }
}

// WithOwner says who within the session holds the lock (at most 256 bytes; default the client
// name). One client taking two permits of a semaphore (or two shared holds) needs two owners.
func WithOwner(owner string) AcquireOption {
	return func(s *acquireSpec) { s.owner, s.ownerSet = owner, true }
}

// Reentrant lets the same session and owner take the lock again (same token, count + 1); it
// must be released as many times.
func Reentrant() AcquireOption { return func(s *acquireSpec) { s.reentrant = true } }

func (c *Client) spec(name string, opts []AcquireOption) (acquireSpec, error) {
	sp := acquireSpec{}
	for _, o := range opts {
		o(&sp)
	}
	if err := CheckName(name); err != nil {
		return sp, err
	}
	if sp.mode == Semaphore {
		if sp.limit < 1 || sp.limit > maxSemaphore {
			return sp, invalidArg("limit: must lie in 1..=%d for a semaphore (got %d)", maxSemaphore, sp.limit)
		}
	}
	if !sp.ownerSet {
		sp.owner = c.opts.clientName
	}
	return sp, checkOwner(sp.owner)
}

// TryAcquire takes name if it is free now (a try-lock): an *Error of KindNotAcquired naming the
// holder otherwise. Retryable errors (no leader, a node down) are retried with backoff, within
// ctx.
func (c *Client) TryAcquire(ctx context.Context, name string, opts ...AcquireOption) (*Lock, error) {
	return c.acquire(ctx, name, false, opts)
}

// Acquire takes name, waiting in its FIFO queue until ctx's deadline (no deadline: forever),
// woken by the service's pushed grant. Waits beyond the service's 300 s cap queue again, round
// after round, up to the deadline. A wait that ends without a grant returns an *Error of
// KindNotAcquired (wrapping context.DeadlineExceeded when the deadline ended it). Retryable
// errors are retried within the wait; a session lost mid-wait is replaced.
func (c *Client) Acquire(ctx context.Context, name string, opts ...AcquireOption) (*Lock, error) {
	return c.acquire(ctx, name, true, opts)
}

func (c *Client) acquire(ctx context.Context, name string, wait bool, opts []AcquireOption) (*Lock, error) {
	sp, err := c.spec(name, opts)
	if err != nil {
		return nil, err
	}
	h, err := c.acquireHold(ctx, name, wait, sp)
	if err != nil {
		return nil, err
	}
	return newLock(c, h), nil
}

func (c *Client) acquireHold(ctx context.Context, name string, wait bool, sp acquireSpec) (*hold, error) {
	deadline, hasDeadline := ctx.Deadline()
	policy := c.opts.retry
	for attempt := 1; ; attempt++ {
		var waitMs uint64
		capped := false
		if wait {
			left := maxWait
			if hasDeadline {
				left = max(time.Until(deadline).Seconds(), 0)
			}
			capped = !hasDeadline || left > maxWait
			waitMs = uint64(math.Min(left, maxWait) * 1000)
		}
		req := &pb.AcquireRequest{Name: name, Owner: sp.owner, Mode: sp.mode.toPB(), Limit: sp.limit,
			WaitMs: waitMs, Reentrant: sp.reentrant}
		started := monotonic()
		h, err := c.acquireOnce(ctx, req, sp.mode)
		if err == nil {
			return h, nil
		}
		if ctx.Err() != nil {
			if wait && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, &Error{Kind: KindNotAcquired, Code: "not_acquired",
					Message: fmt.Sprintf("the wait for %q ended without a grant (%v)", name, ctx.Err()), cause: ctx.Err()}
			}
			return nil, fmt.Errorf("lockd: acquire %q: %w", name, ctx.Err())
		}
		var le *Error
		if !errors.As(err, &le) {
			return nil, err
		}
		if le.Kind == KindNotAcquired && capped {
			// One round of a longer wait ran out: queue again at the back.
			if monotonic()-started < 1.0 {
				if sleepCtx(ctx, policy.Delay(2, 0)) != nil {
					continue // the next round sees the context's end
				}
			}
			attempt = 0
			continue
		}
		if le.Exhausted && !wait {
			return nil, le
		}
		retry := le.Retryable() || le.Kind == KindSessionLost
		if !retry || !(wait || attempt < policy.MaxAttempts) {
			return nil, le
		}
		pause := policy.Delay(min(attempt-1, 20), le.RetryAfter)
		if wait && hasDeadline {
			pause = min(pause, time.Until(deadline))
		}
		_ = sleepCtx(ctx, pause) // a context that ends is seen by the next round
	}
}

func (c *Client) acquireOnce(ctx context.Context, req *pb.AcquireRequest, mode Mode) (*hold, error) {
	s, err := c.ensureSession(ctx)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	for c.settling > 0 && c.settledCh != nil {
		ch := c.settledCh
		c.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-c.bgCtx.Done():
			return nil, errClosed()
		}
		c.mu.Lock()
	}
	if c.sess != s {
		c.mu.Unlock()
		return nil, newErr(KindSessionLost, "the session ended while acquiring")
	}
	if c.conn == nil {
		c.mu.Unlock()
		return nil, newErr(KindUnavailable, "the session stream is reconnecting")
	}
	rid := c.nextRIDLocked()
	sent := monotonic()
	a := &acq{name: req.GetName(), owner: req.GetOwner(), mode: mode, ch: make(chan acqResult, 1),
		sent: sent, waitUntil: sent + float64(req.GetWaitMs())/1000}
	c.pending[rid] = &pendingReq{kind: pendAcquire, sent: sent, acq: a}
	c.sendLocked(&pb.SessionRequest{RequestId: rid, Kind: &pb.SessionRequest_Acquire{Acquire: req}})
	c.acquiresSent++
	c.mu.Unlock()
	select {
	case r := <-a.ch:
		if r.err != nil {
			return nil, r.err
		}
		return r.hold, nil
	case <-ctx.Done():
		if hook := c.testAcquireGaveUp; hook != nil {
			hook()
		}
		c.mu.Lock()
		if !a.done {
			a.done = true // a later grant is given back (answerLocked)
			c.mu.Unlock()
			return nil, ctx.Err()
		}
		c.mu.Unlock()
		r := <-a.ch
		if r.hold != nil {
			// Granted as the caller gave up: nobody will hold it, so give it back.
			h := r.hold
			c.forget(h)
			h.lease.detach() // nor does its lease follow the session any more
			c.spawn(func() { c.releaseQuietly(h.sessionID, h.name, h.token) })
		}
		return nil, ctx.Err()
	}
}

func (c *Client) releaseQuietly(sessionID, name string, token uint64) {
	ctx, cancel := context.WithTimeout(c.bgCtx, c.opts.ttl)
	defer cancel()
	if _, err := c.release(ctx, sessionID, name, token); err != nil {
		c.opts.logger.Debug("lockd: background release failed", "name", name, "error", err)
	}
}

// release gives back one hold; returns the re-entries still held (0 = released). On the session
// stream when it carries the hold's session, else (or when the stream's answer does not come in
// time) by unary calls. A release whose earlier attempt may have landed counts a later
// not_holder, stale_token or session_not_found as done.
func (c *Client) release(ctx context.Context, sessionID, name string, token uint64) (uint32, error) {
	req := &pb.ReleaseRequest{SessionId: sessionID, Name: name, FencingToken: token}
	landed := false
	c.mu.Lock()
	if s := c.sess; c.conn != nil && s != nil && s.id == sessionID {
		rid := c.nextRIDLocked()
		ch := make(chan releaseResult, 1)
		c.pending[rid] = &pendingReq{kind: pendRelease, rel: ch}
		c.sendLocked(&pb.SessionRequest{RequestId: rid, Kind: &pb.SessionRequest_Release{Release: req}})
		c.mu.Unlock()
		timer := time.NewTimer(c.opts.requestTimeout)
		select {
		case r := <-ch:
			timer.Stop()
			var le *Error
			switch {
			case r.err == nil:
				return r.remaining, nil
			case errors.Is(r.err, errUnsure):
				landed = true
			case errors.As(r.err, &le) && le.Retryable():
				if sleepCtx(ctx, c.opts.retry.Delay(0, le.RetryAfter)) != nil {
					return 0, ctx.Err()
				}
				if le.Status == 503 {
					landed = true
				}
			default:
				return 0, r.err
			}
		case <-timer.C:
			c.mu.Lock()
			delete(c.pending, rid)
			c.rotateLocked(c.preferredLocked()) // the unary retry starts elsewhere
			c.mu.Unlock()
			landed = true
		case <-ctx.Done():
			timer.Stop()
			return 0, ctx.Err()
		}
	} else {
		c.mu.Unlock()
	}
	r, err := unary(ctx, c, func(ctx context.Context, st pb.LockClient, o ...grpc.CallOption) (*pb.ReleaseResponse, error) {
		return st.Release(ctx, req, o...)
	}, 0, &landed, 0)
	if err != nil {
		var le *Error
		if landed && errors.As(err, &le) && (le.Status == 404 || le.Status == 409) &&
			(le.Code == "not_holder" || le.Code == "stale_token" || le.Code == "session_not_found") {
			return 0, nil
		}
		return 0, err
	}
	return r.GetRemaining(), nil
}

// releaseHold is release of h, retried at most until its lease's local deadline (at least one
// request timeout): past it the lock is lost anyway and the service frees it with the session.
func (c *Client) releaseHold(ctx context.Context, h *hold) (uint32, error) {
	budget := max(secs(h.lease.deadline()-monotonic()), c.opts.requestTimeout)
	rctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	n, err := c.release(rctx, h.sessionID, h.name, h.token)
	if err != nil && rctx.Err() != nil && ctx.Err() == nil {
		return 0, newErr(KindSessionLost, "the release of %q was not answered before its lease ended; "+
			"the service frees it when the session expires", h.name)
	}
	return n, err
}

func (c *Client) forget(h *hold) {
	c.mu.Lock()
	delete(c.held, h.id)
	c.mu.Unlock()
}

// releaseLater goes on, in the background, with the release of h that failed with err while h
// may still be held on the service (the answer did not come, or the caller's ctx ended first):
// otherwise the session's keepalives would go on renewing a hold that no lock object knows, for
// as long as the session lives. It stops once the release lands or is refused for good, or h's
// lease (or session, or the client) ends, which frees it anyway.
func (c *Client) releaseLater(h *hold, err error) {
	if !releaseMayBeRetried(err) || h.lease.isLost() {
		return
	}
	c.spawn(func() {
		for attempt := 0; ; attempt++ {
			if sleepCtx(c.bgCtx, c.opts.retry.Delay(min(attempt, 6), 0)) != nil {
				return
			}
			c.mu.Lock()
			s := c.sess
			c.mu.Unlock()
			if s == nil || s.id != h.sessionID || h.lease.isLost() {
				return
			}
			ctx, cancel := context.WithTimeout(c.bgCtx, 2*c.opts.requestTimeout)
			_, err := c.release(ctx, h.sessionID, h.name, h.token)
			cancel()
			if err == nil || !releaseMayBeRetried(err) {
				if err != nil {
					c.opts.logger.Debug("lockd: background release refused", "name", h.name, "error", err)
				}
				return
			}
		}
	})
}

// releaseMayBeRetried: a release that failed so may not have landed, and a retry may land.
func releaseMayBeRetried(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var le *Error
	return errors.As(err, &le) && le.Retryable()
}

// Inspect is a linearizable view of name: holders, tokens, queue (no session needed).
func (c *Client) Inspect(ctx context.Context, name string) (*LockState, error) {
	if err := CheckName(name); err != nil {
		return nil, err
	}
	r, err := unary(ctx, c, func(ctx context.Context, st pb.LockClient, o ...grpc.CallOption) (*pb.LockState, error) {
		return st.Inspect(ctx, &pb.InspectRequest{Name: name}, o...)
	}, 0, nil, 0)
	if err != nil {
		return nil, err
	}
	return lockStateFromPB(r), nil
}

// CheckToken says whether token is a current holder's fencing token of name (Chubby's
// CheckSequencer), as a linearizable read, and the newest holder's token (0 when free). For a
// resource that asks lockd before it acts; one that can keep the largest token it has seen
// should fence instead (package fencing).
func (c *Client) CheckToken(ctx context.Context, name string, token uint64) (valid bool, newest uint64, err error) {
	if err := CheckName(name); err != nil {
		return false, 0, err
	}
	if token < 1 || token > maxFencingToken {
		return false, 0, invalidArg("fencing_token: must lie in 1..=%d (got %d)", uint64(maxFencingToken), token)
	}
	r, err := unary(ctx, c, func(ctx context.Context, st pb.LockClient, o ...grpc.CallOption) (*pb.CheckTokenResponse, error) {
		return st.CheckToken(ctx, &pb.CheckTokenRequest{Name: name, FencingToken: token}, o...)
	}, 0, nil, 0)
	if err != nil {
		return false, 0, err
	}
	return r.GetValid(), r.GetNewestToken(), nil
}

// ReportFencingRejected tells the service that a fenced resource refused a write under name
// because a newer holder's token had reached it (counted as lockd_fencing_rejections_total).
// Best effort: a failure to report is logged, except a bad name.
func (c *Client) ReportFencingRejected(ctx context.Context, name string) error {
	if err := CheckName(name); err != nil {
		return err
	}
	_, err := unary(ctx, c, func(ctx context.Context, st pb.LockClient, o ...grpc.CallOption) (*pb.ReportFencingRejectedResponse, error) {
		return st.ReportFencingRejected(ctx, &pb.ReportFencingRejectedRequest{Name: name}, o...)
	}, 0, nil, 2)
	if err != nil {
		c.opts.logger.Debug("lockd: could not report a fencing rejection", "error", err)
	}
	return nil
}

// Status is the status of the node the client talks to: its groups, leaders, terms.
func (c *Client) Status(ctx context.Context) (*NodeStatus, error) {
	r, err := unary(ctx, c, func(ctx context.Context, st pb.LockClient, o ...grpc.CallOption) (*pb.StatusResponse, error) {
		return st.Status(ctx, &pb.StatusRequest{}, o...)
	}, 0, nil, 0)
	if err != nil {
		return nil, err
	}
	return nodeStatusFromPB(r), nil
}

// StatusOf is the status of endpoint i exactly (no failover, one attempt).
func (c *Client) StatusOf(ctx context.Context, i int) (*NodeStatus, error) {
	if i < 0 || i >= len(c.endpoints) {
		return nil, invalidArg("endpoint index %d out of range", i)
	}
	st, err := c.stub(i)
	if err != nil {
		return nil, err
	}
	cctx, cancel := context.WithTimeout(c.withAuth(ctx), c.opts.requestTimeout)
	defer cancel()
	var trailer metadata.MD
	r, err := st.Status(cctx, &pb.StatusRequest{}, grpc.Trailer(&trailer))
	if err != nil {
		return nil, c.rpcError(err, i, trailer)
	}
	return nodeStatusFromPB(r), nil
}

// GetSession is a session's holds and waits in every group ("": this client's session).
func (c *Client) GetSession(ctx context.Context, sessionID string) (*SessionDetail, error) {
	if sessionID == "" {
		sessionID = c.SessionID()
		if sessionID == "" {
			return nil, newErr(KindSessionLost, "the client has no open session")
		}
	}
	r, err := unary(ctx, c, func(ctx context.Context, st pb.LockClient, o ...grpc.CallOption) (*pb.SessionDetail, error) {
		return st.GetSession(ctx, &pb.GetSessionRequest{SessionId: sessionID}, o...)
	}, 0, nil, 0)
	if err != nil {
		return nil, err
	}
	return sessionDetailFromPB(r), nil
}

// SessionTTL is the TTL the service granted the current session (what WithTTL asked for while
// none is open).
func (c *Client) SessionTTL() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sess != nil {
		return secs(c.sess.ttl)
	}
	return c.opts.ttl
}

// SessionID is the current session's id, if one is open and not lost ("" otherwise). It is the
// session's capability: do not log it.
func (c *Client) SessionID() string {
	c.mu.Lock()
	s := c.sess
	c.mu.Unlock()
	if s == nil || s.lease.isLost() {
		return ""
	}
	return s.id
}

// TTL is the session TTL the client asks for (WithTTL); SessionTTL is the one granted.
func (c *Client) TTL() time.Duration { return c.opts.ttl }

// ClientName is the client's name, the default owner of its locks (WithClientName).
func (c *Client) ClientName() string { return c.opts.clientName }

// Endpoint is the endpoint the session stream uses now (or the next one tried).
func (c *Client) Endpoint() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != nil {
		return c.endpoints[c.conn.endpoint]
	}
	return c.endpoints[c.preferredLocked()]
}

// LeaseExpiredCount is how many times a lease ran out while the application still held a lock
// (each is also reported to the service's lockd_lease_expired_while_holding_total).
func (c *Client) LeaseExpiredCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leaseExpired
}

// LeaseExtendedCount is how many times a group's new leader extended this client's lease and
// said so; LeaseExtension is the last notice's group and the milliseconds the lease had left.
func (c *Client) LeaseExtendedCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leaseExtended
}

// LeaseExtension is the last new leader's notice: its group and the lease left in ms.
func (c *Client) LeaseExtension() (group uint32, remainingMs uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return uint32(c.lastExtension[0]), c.lastExtension[1]
}

// Close closes the session (every lock it holds is released at once and reports lost) and the
// connections. Further calls fail with KindClientClosed. From its start no session opens: an
// acquire or Connect racing it fails with KindClientClosed (an open in flight is ended on the
// service). It waits for the client's background work to end, within ctx: ctx's error if ctx
// ended first (the client is closed all the same).
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.closing {
		c.mu.Unlock()
		return nil
	}
	c.closing = true
	s := c.sess
	c.sess = nil
	if s != nil {
		c.endLocallyLocked(s, "the client was closed", func() error { return errClosed() })
	}
	c.mu.Unlock()
	var err error
	if s != nil {
		// unary refuses calls only once closed is set: this one goes through.
		_, cerr := unary(ctx, c, func(ctx context.Context, st pb.LockClient, o ...grpc.CallOption) (*pb.CloseSessionResponse, error) {
			return st.CloseSession(ctx, &pb.CloseSessionRequest{SessionId: s.id}, o...)
		}, 0, nil, 3)
		var le *Error
		if cerr != nil && !(errors.As(cerr, &le) && le.Code == "session_not_found") {
			err = cerr
		}
	}
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.bgCancel() // handshakes and background work in flight end now
	var waitErr error
	// An open in flight ends (opened refuses once closing is set, and its handshake is cut).
	select {
	case c.openSem <- struct{}{}:
		<-c.openSem
	case <-ctx.Done():
		waitErr = ctx.Err()
	}
	c.bgMu.Lock()
	c.bgStopped = true // spawn adds nothing from now on, so bg.Wait below is sound
	c.bgMu.Unlock()
	if waitErr == nil {
		done := make(chan struct{})
		go func() { c.bg.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			waitErr = ctx.Err()
		}
	}
	// No session should be current now; if one is, it ends here too, reporting its locks lost.
	c.mu.Lock()
	c.endOnCloseLocked(c.sess)
	c.mu.Unlock()
	c.connMu.Lock()
	c.connsClosed = true
	for i, cc := range c.conns {
		if cc != nil {
			_ = cc.Close()
			c.conns[i] = nil
		}
	}
	c.connMu.Unlock()
	if err == nil {
		err = waitErr
	}
	return err
}
