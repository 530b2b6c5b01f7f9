package lockd

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/lockd-dev/lockd/clients/go/internal/pb"
)

// Kind says what kind of failure an [Error] is. The kinds follow the gRPC status the service
// answered with (the same classes as the Python client's errors.py), plus the outcomes the
// client itself decides (NotAcquired, SessionLost, ClientClosed, LockLost, FenceRejected).
type Kind int

const (
	// KindOther is a refusal with a status no other kind covers (500, UNIMPLEMENTED...).
	KindOther Kind = iota
	// KindInvalidArgument (400): the request was malformed or out of bounds; the message names
	// the field and the limit.
	KindInvalidArgument
	// KindUnauthenticated (401): the namespace needs a bearer token and none (or one that opens
	// nothing) was sent.
	KindUnauthenticated
	// KindPermissionDenied (403): a token for another namespace, or a name outside the session's
	// namespace (wrong_namespace).
	KindPermissionDenied
	// KindSessionNotFound (404): the session is unknown or has expired on the service.
	KindSessionNotFound
	// KindConflict (409): not_holder, stale_token, already_held, mode_conflict...
	KindConflict
	// KindResourceExhausted (429, 413): queue_full, too_many_locks, rate_limited (retryable),
	// too_many_sessions (not retryable), payload_too_large (413, not retryable).
	KindResourceExhausted
	// KindUnavailable (503, or no answer at all): no leader, no quorum, a node down, a timeout.
	// Always retryable.
	KindUnavailable
	// KindNotAcquired: the lock is held by someone else (a try-lock), or the wait ended without
	// a grant.
	KindNotAcquired
	// KindSessionLost: the session ended while the request was in flight.
	KindSessionLost
	// KindClientClosed: the client was closed.
	KindClientClosed
	// KindLockLost: the lock is lost (its local deadline passed or its session ended): work
	// under it must stop; a guarded write was not attempted.
	KindLockLost
	// KindFenceRejected: a fenced store refused a write because it has seen a newer token.
	KindFenceRejected
)

var kindNames = map[Kind]string{
	KindOther: "lockd_error", KindInvalidArgument: "invalid_argument",
	KindUnauthenticated: "unauthenticated", KindPermissionDenied: "permission_denied",
	KindSessionNotFound: "session_not_found", KindConflict: "conflict",
	KindResourceExhausted: "resource_exhausted", KindUnavailable: "unavailable",
	KindNotAcquired: "not_acquired", KindSessionLost: "session_lost",
	KindClientClosed: "client_closed", KindLockLost: "lock_lost", KindFenceRejected: "fence_rejected",
}

func (k Kind) String() string { return kindNames[k] }

// Error is every error the client returns for a refusal by the service or an outcome it
// decides. Match it with errors.Is against the Err* sentinels (which compare the Kind), or get
// the details with errors.As:
//
//	var le *lockd.Error
//	if errors.As(err, &le) && le.Code == "stale_token" { ... }
//	if errors.Is(err, lockd.ErrNotAcquired) { ... }
type Error struct {
	Kind Kind
	// Code is the service's stable error code (stale_token, queue_full...; docs/API.md) when
	// the service refused the request, else the kind's name (unavailable, not_acquired...).
	Code string
	// Status is the HTTP status the service mapped the error to (400, 401, 403, 404, 409, 413,
	// 429, 503), or 0 when no service answered.
	Status int
	// Message says what happened; for a service refusal, the service's own words.
	Message string
	// RetryAfter is the service's hint (429 and 503), or 0.
	RetryAfter time.Duration
	// Exhausted: the client already retried this as far as its options allow (opening a
	// session within the connect timeout); a caller's own retry loop passes it on.
	Exhausted bool

	// For KindNotAcquired: the owner holding the lock (when the service said), the queue
	// position the caller had or would have had, and the group time a lock-delay ends.
	Holder           string
	QueuePosition    uint32
	LockDelayUntilMs uint64

	cause error
}

// Sentinels for errors.Is: an *Error matches the sentinel of its Kind.
var (
	ErrInvalidArgument   = &Error{Kind: KindInvalidArgument}
	ErrUnauthenticated   = &Error{Kind: KindUnauthenticated}
	ErrPermissionDenied  = &Error{Kind: KindPermissionDenied}
	ErrSessionNotFound   = &Error{Kind: KindSessionNotFound}
	ErrConflict          = &Error{Kind: KindConflict}
	ErrResourceExhausted = &Error{Kind: KindResourceExhausted}
	ErrUnavailable       = &Error{Kind: KindUnavailable}
	ErrNotAcquired       = &Error{Kind: KindNotAcquired}
	ErrSessionLost       = &Error{Kind: KindSessionLost}
	ErrClientClosed      = &Error{Kind: KindClientClosed}
	ErrLockLost          = &Error{Kind: KindLockLost}
	ErrFenceRejected     = &Error{Kind: KindFenceRejected}
)

func (e *Error) Error() string {
	code := e.Code
	if code == "" {
		code = e.Kind.String()
	}
	where := ""
	if e.Status != 0 {
		where = fmt.Sprintf(" (%d)", e.Status)
	}
	return code + where + ": " + e.Message
}

// Is matches a sentinel of the same Kind (errors.Is(err, lockd.ErrConflict)), or an *Error
// with the same Kind and Code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok {
		return false
	}
	if t.Code == "" && t.Message == "" {
		return t.Kind == e.Kind
	}
	return t.Kind == e.Kind && t.Code == e.Code
}

// Unwrap returns the error that caused this one (e.g. context.DeadlineExceeded for a wait that
// ran out), if any.
func (e *Error) Unwrap() error { return e.cause }

// Retryable says whether sending the same request again soon may succeed: 429 and 503 answers
// and no answer at all, but not too_many_sessions (a session place frees only when another
// process closes its session). The client has already retried these with backoff before
// returning them.
func (e *Error) Retryable() bool {
	if e.Kind == KindUnavailable {
		return true
	}
	return (e.Status == 429 || e.Status == 503) && e.Code != "too_many_sessions"
}

// IsRetryable reports whether err is an *Error that is Retryable.
func IsRetryable(err error) bool {
	var le *Error
	return errors.As(err, &le) && le.Retryable()
}

func newErr(kind Kind, format string, args ...any) *Error {
	return &Error{Kind: kind, Code: kind.String(), Message: fmt.Sprintf(format, args...)}
}

func invalidArg(format string, args ...any) *Error {
	return newErr(KindInvalidArgument, format, args...)
}

var kindByStatus = map[int]Kind{
	400: KindInvalidArgument, 401: KindUnauthenticated, 403: KindPermissionDenied,
	404: KindSessionNotFound, 409: KindConflict, 413: KindResourceExhausted,
	429: KindResourceExhausted, 503: KindUnavailable,
}

var statusByCode = map[codes.Code]int{
	codes.InvalidArgument: 400, codes.Unauthenticated: 401, codes.PermissionDenied: 403,
	codes.NotFound: 404, codes.FailedPrecondition: 409, codes.ResourceExhausted: 429,
	codes.Unavailable: 503,
}

// fromStatus is the error for a service refusal with HTTP status and stable code.
func fromStatus(httpStatus int, code, message string, retryAfterMs uint64) *Error {
	kind, ok := kindByStatus[httpStatus]
	if !ok {
		kind = KindOther
	}
	return &Error{Kind: kind, Code: code, Status: httpStatus, Message: message,
		RetryAfter: time.Duration(retryAfterMs) * time.Millisecond}
}

// fromEvent is the error carried by a SessionEvent.error on the session stream.
func fromEvent(e *pb.Error) *Error {
	return fromStatus(int(e.GetStatus()), e.GetCode(), e.GetMessage(), e.GetRetryAfterMs())
}

// tlsHint says what to do about a transport error that looks like a TLS mismatch, if it does.
// tlsWithoutCert: the client speaks TLS and has no certificate of its own.
func tlsHint(details, endpoint string, tls, tlsWithoutCert bool) string {
	switch {
	case strings.Contains(details, "certificate signed by unknown authority") ||
		strings.Contains(details, "certificate is not trusted") ||
		strings.Contains(details, "x509:"):
		return "the node's certificate is not signed by a CA this client trusts: give its CA (WithCAFile)"
	case strings.Contains(details, "certificate required") || strings.Contains(details, "bad certificate"):
		return "the node asks for a client certificate: give WithClientCert(certFile, keyFile)"
	case tlsWithoutCert && (strings.Contains(details, "connection reset") ||
		strings.Contains(details, "broken pipe") || strings.Contains(details, "EOF")):
		return "the node closed the TLS connection: if it requires client certificates, give " +
			"WithClientCert(certFile, keyFile)"
	case tls && (strings.Contains(details, "first record does not look like a TLS handshake") ||
		strings.Contains(details, "tls:")):
		return "the node does not speak TLS here: use a plain HOST:PORT endpoint without WithCAFile"
	case !tls && (strings.Contains(details, "error reading server preface") ||
		strings.Contains(details, "connection closed before server preface") ||
		strings.Contains(details, "EOF") || strings.Contains(details, "connection reset")):
		return "if the node serves TLS, give its CA (WithCAFile) or use an https:// endpoint; a " +
			"plain-text client cannot talk to a TLS port"
	}
	return ""
}

// fromRPC maps a failed gRPC call to a typed error. A refusal by the service carries its stable
// code as a google.rpc.ErrorInfo (domain "lockd") in the status details and in the
// lockd-error-code metadata; a status without it came from the transport (refused, reset,
// timed out) and is Unavailable, except INVALID_ARGUMENT and UNIMPLEMENTED, which no retry
// can fix.
func fromRPC(err error, endpoint string, trailer metadata.MD, tls, tlsWithoutCert bool) *Error {
	var le *Error
	if errors.As(err, &le) {
		return le
	}
	where := ""
	if endpoint != "" {
		where = endpoint + ": "
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return &Error{Kind: KindUnavailable, Code: "unavailable",
			Message: where + "no answer in time", cause: err}
	}
	st, ok := status.FromError(err)
	if !ok {
		return &Error{Kind: KindUnavailable, Code: "unavailable", Message: where + err.Error(), cause: err}
	}
	code := ""
	var retryAfterMs uint64
	for _, d := range st.Details() {
		switch v := d.(type) {
		case *errdetails.ErrorInfo:
			if v.GetDomain() == "lockd" || v.GetDomain() == "" {
				code = strings.ToLower(v.GetReason())
			}
		case *errdetails.RetryInfo:
			if v.GetRetryDelay() != nil {
				retryAfterMs = uint64(v.GetRetryDelay().AsDuration().Milliseconds())
			}
		}
	}
	if vals := trailer.Get("lockd-error-code"); code == "" && len(vals) > 0 {
		code = vals[0]
	}
	if vals := trailer.Get("lockd-retry-after-ms"); retryAfterMs == 0 && len(vals) > 0 {
		if n, perr := strconv.ParseUint(vals[0], 10, 64); perr == nil {
			retryAfterMs = n
		}
	}
	details := st.Message()
	if code == "" {
		switch st.Code() {
		case codes.InvalidArgument:
			return &Error{Kind: KindInvalidArgument, Code: "invalid_argument", Message: where + details}
		case codes.Unimplemented:
			return &Error{Kind: KindOther, Code: "unimplemented", Message: where + details}
		case codes.DeadlineExceeded:
			return &Error{Kind: KindUnavailable, Code: "unavailable",
				Message: fmt.Sprintf("%sno answer in time (%s)", where, details)}
		case codes.Canceled:
			return &Error{Kind: KindUnavailable, Code: "unavailable", Message: where + "cancelled: " + details, cause: err}
		}
		msg := fmt.Sprintf("%s%s: %s", where, st.Code(), details)
		if hint := tlsHint(details, endpoint, tls, tlsWithoutCert); hint != "" {
			msg += " (" + hint + ")"
		}
		return &Error{Kind: KindUnavailable, Code: "unavailable", Message: msg}
	}
	httpStatus, ok := statusByCode[st.Code()]
	if !ok {
		httpStatus = 500
	}
	if st.Code() == codes.ResourceExhausted && (code == "payload_too_large" || code == "body_too_large") {
		httpStatus = 413
	}
	return fromStatus(httpStatus, code, details, retryAfterMs)
}
