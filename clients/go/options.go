package lockd

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strings"
	"time"
)

// RetryPolicy is exponential backoff with full jitter: retry n (from 0) sleeps a uniformly random
// time in [0, min(Cap, Base*2^n)], but at least the service's retry-after hint; at most
// MaxAttempts attempts in all (the first included). The default (8 attempts, 50 ms doubling to
// 2 s: about 6 s of retrying) rides out a leader election.
type RetryPolicy struct {
	MaxAttempts int
	Base        time.Duration
	Cap         time.Duration
}

// DefaultRetryPolicy is 8 attempts, 50 ms doubling to 2 s.
var DefaultRetryPolicy = RetryPolicy{MaxAttempts: 8, Base: 50 * time.Millisecond, Cap: 2 * time.Second}

func (p RetryPolicy) validate() error {
	if p.MaxAttempts < 1 {
		return invalidArg("retry MaxAttempts must be at least 1 (got %d)", p.MaxAttempts)
	}
	if p.Base < 0 || p.Base > p.Cap {
		return invalidArg("retry Base must lie in 0..=Cap (got Base=%s, Cap=%s)", p.Base, p.Cap)
	}
	return nil
}

// Delay is how long to sleep before retry number attempt (0 = the first retry).
func (p RetryPolicy) Delay(attempt int, retryAfter time.Duration) time.Duration {
	attempt = min(max(attempt, 0), 20)
	// min(Cap, Base*2^attempt), computed without overflow; Base 0 gives 0 (as in the Python
	// client), not Cap.
	var ceiling time.Duration
	switch {
	case p.Base <= 0 || p.Cap <= 0:
		ceiling = 0
	case p.Base > p.Cap>>attempt:
		ceiling = p.Cap
	default:
		ceiling = min(p.Base<<attempt, p.Cap)
	}
	d := time.Duration(rand.Int64N(int64(ceiling) + 1))
	if d < retryAfter {
		d = retryAfter
	}
	return d
}

type options struct {
	clientName     string
	ttl            time.Duration
	margin         time.Duration
	marginSet      bool
	namespace      string
	token          string
	requestTimeout time.Duration
	connectTimeout time.Duration
	retry          RetryPolicy
	caFile         string
	certFile       string
	keyFile        string
	tlsServerName  string
	logger         *slog.Logger
}

// Option configures a [Client].
type Option func(*options)

// HostPID is HOST/PID of this process: the default client name and lock owner.
func HostPID() string {
	host, err := os.Hostname()
	host = strings.TrimSpace(host)
	if err != nil || host == "" {
		host = "localhost"
	}
	return fmt.Sprintf("%s/%d", host, os.Getpid())
}

func defaultOptions() options {
	return options{
		clientName:     HostPID(),
		ttl:            15 * time.Second,
		requestTimeout: 2 * time.Second,
		connectTimeout: 5 * time.Second,
		retry:          DefaultRetryPolicy,
		logger:         slog.New(slog.DiscardHandler),
	}
}

// WithClientName names this process in the service's views; it is the default owner of its
// locks (at most 256 bytes). Default HOST/PID.
func WithClientName(name string) Option { return func(o *options) { o.clientName = name } }

// WithTTL is the session TTL to ask for (the namespace's bounds apply: by default 5 s to 60 s).
// Default 15 s.
func WithTTL(ttl time.Duration) Option { return func(o *options) { o.ttl = ttl } }

// WithMargin is how long before the lease's end a lock reports lost. Default TTL/5.
func WithMargin(m time.Duration) Option {
	return func(o *options) { o.margin = m; o.marginSet = true }
}

// WithNamespace is the namespace whose TTL bounds and token the session uses ("" = default). A
// session takes only its own namespace's names.
func WithNamespace(ns string) Option { return func(o *options) { o.namespace = ns } }

// WithToken is the namespace's bearer token (or the admin token), sent as
// `authorization: Bearer <token>` metadata on every call and on the session stream.
func WithToken(token string) Option { return func(o *options) { o.token = token } }

// WithRequestTimeout is how long one request may take before its node counts as unreachable.
// Default 2 s.
func WithRequestTimeout(d time.Duration) Option { return func(o *options) { o.requestTimeout = d } }

// WithConnectTimeout is how long opening a session may take in all, every endpoint and retry
// included, before the call that needed it fails. Default 5 s.
func WithConnectTimeout(d time.Duration) Option { return func(o *options) { o.connectTimeout = d } }

// WithRetryPolicy sets the backoff for retryable errors (default [DefaultRetryPolicy]).
func WithRetryPolicy(p RetryPolicy) Option { return func(o *options) { o.retry = p } }

// WithCAFile makes the client speak TLS to the nodes, trusting this CA (PEM); `lockd dev --tls`
// writes its CA to DATA_DIR/tls/ca.pem. An https:// endpoint without it trusts the system's
// roots.
func WithCAFile(path string) Option { return func(o *options) { o.caFile = path } }

// WithClientCert adds a client certificate and its key (PEM), for clusters that require one
// (`lockd serve --tls-client-ca-file`).
func WithClientCert(certFile, keyFile string) Option {
	return func(o *options) { o.certFile = certFile; o.keyFile = keyFile }
}

// WithTLSServerName overrides the name the nodes' certificates are checked against.
func WithTLSServerName(name string) Option { return func(o *options) { o.tlsServerName = name } }

// WithLogger sets where the client logs (lost locks and sessions at Warn, the rest at Debug).
// Default: nowhere.
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

func (o *options) validate() error {
	if o.ttl <= 0 || o.ttl > time.Hour {
		return invalidArg("ttl must lie in (0, 3600] seconds (got %s)", o.ttl)
	}
	if o.ttl%time.Millisecond != 0 {
		return invalidArg("ttl must be a whole number of milliseconds (got %s)", o.ttl)
	}
	if o.marginSet && (o.margin < 0 || o.margin >= o.ttl) {
		return invalidArg("margin must lie in [0, ttl=%s) (got %s)", o.ttl, o.margin)
	}
	if o.requestTimeout <= 0 {
		return invalidArg("request timeout must be positive (got %s)", o.requestTimeout)
	}
	if o.connectTimeout <= 0 {
		return invalidArg("connect timeout must be positive (got %s)", o.connectTimeout)
	}
	if n := len(o.clientName); n > maxOwnerBytes {
		return invalidArg("client name must be at most %d bytes (got %d)", maxOwnerBytes, n)
	}
	if (o.certFile == "") != (o.keyFile == "") {
		return invalidArg("a client certificate and its key go together (WithClientCert)")
	}
	if o.token != "" {
		for _, c := range o.token {
			if c < 33 || c > 126 {
				return invalidArg("token must be non-empty printable ASCII without spaces " +
					"(it is sent as an authorization header)")
			}
		}
	}
	if o.logger == nil {
		o.logger = slog.New(slog.DiscardHandler)
	}
	return o.retry.validate()
}

func (o *options) marginFor(ttl float64) float64 {
	if o.marginSet {
		return o.margin.Seconds()
	}
	return ttl / 5
}
