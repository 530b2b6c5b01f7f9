package lockd

// Checks that need no cluster: the committed stubs match proto/, gRPC statuses map to typed
// errors with the right Retryable, backoff, the name rule.

import (
	"bytes"
	"context"
	"errors"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lockd-dev/lockd/clients/go/internal/pb"
)

func missing(t *testing.T, what string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("missing prerequisite under CI: %s", what)
	}
	t.Skipf("missing prerequisite: %s", what)
}

// The protoc version line differs between machines' protoc packages; the code does not.
var protocLine = regexp.MustCompile(`(?m)^// (\t| - )protoc +v?[0-9.]+.*$`)

func TestCommittedStubsMatchTheProto(t *testing.T) {
	for _, tool := range []string{"protoc", "bash", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing(t, tool+" (Debian: apt-get install protobuf-compiler)")
		}
	}
	out := t.TempDir()
	cmd := exec.Command("bash", "regen", out)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 3 {
			missing(t, strings.TrimSpace(stderr.String()))
		}
		t.Fatalf("regen: %v: %s", err, stderr.String())
	}
	for _, f := range []string{"lockd.pb.go", "lockd_grpc.pb.go"} {
		fresh, err := os.ReadFile(filepath.Join(out, f))
		if err != nil {
			t.Fatal(err)
		}
		committed, err := os.ReadFile(filepath.Join("internal", "pb", f))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(protocLine.ReplaceAll(fresh, nil), protocLine.ReplaceAll(committed, nil)) {
			t.Fatalf("internal/pb/%s is stale: run clients/go/regen", f)
		}
	}
}

func serviceErr(t *testing.T, c codes.Code, code string, retryMs int64) error {
	t.Helper()
	st, err := status.New(c, "why").WithDetails(
		&errdetails.ErrorInfo{Domain: "lockd", Reason: strings.ToUpper(code)},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(time.Duration(retryMs) * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}

func TestServiceErrorsAreTyped(t *testing.T) {
	for _, tc := range []struct {
		grpc      codes.Code
		code      string
		sentinel  *Error
		status    int
		retryable bool
	}{
		{codes.Unavailable, "no_leader", ErrUnavailable, 503, true},
		{codes.FailedPrecondition, "stale_token", ErrConflict, 409, false},
		{codes.NotFound, "session_not_found", ErrSessionNotFound, 404, false},
		{codes.ResourceExhausted, "queue_full", ErrResourceExhausted, 429, true},
		{codes.ResourceExhausted, "too_many_sessions", ErrResourceExhausted, 429, false},
		{codes.ResourceExhausted, "payload_too_large", ErrResourceExhausted, 413, false},
		{codes.PermissionDenied, "wrong_namespace", ErrPermissionDenied, 403, false},
		{codes.Unauthenticated, "unauthenticated", ErrUnauthenticated, 401, false},
		{codes.InvalidArgument, "ttl_out_of_range", ErrInvalidArgument, 400, false},
	} {
		t.Run(tc.code, func(t *testing.T) {
			e := fromRPC(serviceErr(t, tc.grpc, tc.code, 250), "", nil, false, false)
			if !errors.Is(e, tc.sentinel) || e.Code != tc.code || e.Status != tc.status {
				t.Fatalf("got %#v", e)
			}
			if e.Retryable() != tc.retryable || e.RetryAfter != 250*time.Millisecond || IsRetryable(e) != tc.retryable {
				t.Fatalf("retryable %v retry after %s", e.Retryable(), e.RetryAfter)
			}
			// The same from the metadata alone (a proxy that dropped the details).
			md := metadata.Pairs("lockd-error-code", tc.code, "lockd-retry-after-ms", "250")
			e2 := fromRPC(status.Error(tc.grpc, "why"), "", md, false, false)
			if e2.Code != tc.code || e2.Status != tc.status || e2.RetryAfter != 250*time.Millisecond {
				t.Fatalf("from metadata: %#v", e2)
			}
		})
	}
}

func TestStreamErrorsAreTypedAsUnaryOnes(t *testing.T) {
	e := fromEvent(&pb.Error{Status: 409, Code: "not_holder", Message: "no"})
	if !errors.Is(e, ErrConflict) || e.Retryable() {
		t.Fatal(e)
	}
	e = fromEvent(&pb.Error{Status: 503, Code: "unavailable", Message: "x", RetryAfterMs: 100})
	if !errors.Is(e, ErrUnavailable) || !e.Retryable() || e.RetryAfter != 100*time.Millisecond {
		t.Fatal(e)
	}
	var target *Error
	if !errors.As(error(e), &target) || target != e {
		t.Fatal("errors.As")
	}
	if errors.Is(e, ErrConflict) {
		t.Fatal("kinds differ")
	}
}

func TestTransportErrorsAreRetryableUnavailable(t *testing.T) {
	e := fromRPC(status.Error(codes.Unavailable, "connection refused"), "n1:1", nil, false, false)
	if !errors.Is(e, ErrUnavailable) || !e.Retryable() || e.Status != 0 || !strings.Contains(e.Error(), "n1:1") {
		t.Fatal(e)
	}
	e = fromRPC(status.Error(codes.DeadlineExceeded, "deadline"), "", nil, false, false)
	if !errors.Is(e, ErrUnavailable) || !e.Retryable() {
		t.Fatal(e)
	}
	e = fromRPC(context.DeadlineExceeded, "", nil, false, false)
	if !errors.Is(e, ErrUnavailable) || !errors.Is(e, context.DeadlineExceeded) {
		t.Fatal(e)
	}
	e = fromRPC(status.Error(codes.Unimplemented, "no such method"), "", nil, false, false)
	if e.Code != "unimplemented" || e.Retryable() {
		t.Fatal(e)
	}
}

func TestTLSMistakesGetAHint(t *testing.T) {
	if h := tlsHint("tls: failed to verify certificate: x509: certificate signed by unknown authority", "", true, true); !strings.Contains(h, "WithCAFile") {
		t.Fatal(h)
	}
	if h := tlsHint("error reading server preface: EOF", "127.0.0.1:1", false, false); !strings.Contains(h, "WithCAFile") {
		t.Fatal(h)
	}
	if h := tlsHint("remote error: tls: certificate required", "", true, true); !strings.Contains(h, "WithClientCert") {
		t.Fatal(h)
	}
	if h := tlsHint("connection refused", "127.0.0.1:1", false, false); h != "" {
		t.Fatal(h)
	}
}

func TestBackoffStaysUnderItsCeilingAndHonoursRetryAfter(t *testing.T) {
	p := DefaultRetryPolicy
	for attempt := 0; attempt < 30; attempt++ {
		ceiling := min(p.Cap, p.Base*time.Duration(1<<min(attempt, 20)))
		for i := 0; i < 20; i++ {
			if d := p.Delay(attempt, 0); d < 0 || d > ceiling {
				t.Fatalf("attempt %d: %s above %s", attempt, d, ceiling)
			}
		}
	}
	if d := p.Delay(0, 700*time.Millisecond); d < 700*time.Millisecond {
		t.Fatal(d)
	}
	if err := (RetryPolicy{MaxAttempts: 0}).validate(); !errors.Is(err, ErrInvalidArgument) {
		t.Fatal(err)
	}
}

// A policy with Base 0 retries at once (finding 11; the Python client's delay gives 0 too),
// but still honours retry-after; a huge Base does not overflow past Cap.
func TestBackoffWithBaseZeroDoesNotWait(t *testing.T) {
	p := RetryPolicy{MaxAttempts: 3, Base: 0, Cap: 2 * time.Second}
	if err := p.validate(); err != nil {
		t.Fatal(err)
	}
	for attempt := -1; attempt < 30; attempt++ {
		if d := p.Delay(attempt, 0); d != 0 {
			t.Fatalf("attempt %d: %s", attempt, d)
		}
	}
	if d := p.Delay(3, 300*time.Millisecond); d != 300*time.Millisecond {
		t.Fatal(d)
	}
	big := RetryPolicy{MaxAttempts: 3, Base: time.Duration(math.MaxInt64 / 4), Cap: time.Duration(math.MaxInt64 / 2)}
	for attempt := 0; attempt < 30; attempt++ {
		if d := big.Delay(attempt, 0); d < 0 || d > big.Cap {
			t.Fatalf("attempt %d: %s", attempt, d)
		}
	}
}

// TestCheckNameIsTheSpecsNamePattern: the client refuses exactly the names
// docs/openapi.yaml's Name pattern (the server's rule) refuses, at every code point near an
// edge of an excluded range and a stride of the rest.
func TestCheckNameIsTheSpecsNamePattern(t *testing.T) {
	root, _ := filepath.Abs(filepath.Join("..", ".."))
	text, err := os.ReadFile(filepath.Join(root, "docs", "openapi.yaml"))
	if err != nil {
		missing(t, "docs/openapi.yaml: "+err.Error())
	}
	parts := strings.SplitN(string(text), "\n    Name:\n      type: string\n", 2)
	if len(parts) != 2 {
		t.Fatal("no Name schema in docs/openapi.yaml")
	}
	schema := strings.SplitN(parts[1], "description:", 2)[0]
	var pats []string
	for _, ln := range strings.Split(schema, "\n") {
		ln = strings.TrimSpace(ln)
		if strings.HasPrefix(ln, `pattern: "`) {
			p := strings.TrimSuffix(strings.TrimPrefix(ln, `pattern: "`), `"`)
			p = strings.ReplaceAll(p, `\\`, `\`)
			p = regexp.MustCompile(`\\U([0-9A-Fa-f]{8})`).ReplaceAllString(p, `\x{$1}`)
			p = regexp.MustCompile(`\\u([0-9A-Fa-f]{4})`).ReplaceAllString(p, `\x{$1}`)
			pats = append(pats, p)
		}
	}
	if len(pats) != 2 {
		t.Fatalf("want the pattern and the not-pattern, got %q", pats)
	}
	allowed, refused := regexp.MustCompile(pats[0]), regexp.MustCompile(pats[1])
	near := map[rune]bool{}
	for _, r := range notInNames {
		for _, c := range []rune{r[0], r[1]} {
			for d := rune(-1); d <= 1; d++ {
				near[c+d] = true
			}
		}
	}
	for c := rune(0); c < 0x110000; c += 7 {
		near[c] = true
	}
	var differ []string
	for c := range near {
		if c < 0 || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF) {
			continue
		}
		s := string(c)
		spec := allowed.MatchString(s) && !refused.MatchString(s)
		client := CheckName(s) == nil
		if spec != client {
			differ = append(differ, strings.ToUpper(string(rune(c))))
			if len(differ) > 20 {
				break
			}
		}
	}
	if len(differ) > 0 {
		t.Fatalf("%d code points differ", len(differ))
	}
	for _, bad := range []string{"pay\u202eexe.sh", "shard\u200b17", "a\xed\xb0\x80"} {
		if err := CheckName(bad); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("%q accepted", bad)
		}
	}
	if err := CheckName("caf\u00e9/\u65e5\u672c \U0001f512"); err != nil {
		t.Fatal(err)
	}
}

func TestAClientWithNothingListeningFailsFast(t *testing.T) {
	c, err := New([]string{"127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	started := time.Now()
	_, err = c.TryAcquire(context.Background(), "x")
	var le *Error
	if !errors.As(err, &le) || le.Kind != KindUnavailable || !le.Exhausted {
		t.Fatalf("got %v", err)
	}
	if took := time.Since(started); took > 7*time.Second {
		t.Fatalf("took %s (connect timeout 5 s)", took)
	}
}

func TestOptionsAreChecked(t *testing.T) {
	for _, tc := range []struct {
		opts []Option
		want string
	}{
		{[]Option{WithTTL(0)}, "ttl must lie in"},
		{[]Option{WithTTL(2 * time.Hour)}, "ttl must lie in"},
		{[]Option{WithMargin(20 * time.Second)}, "margin must lie in"},
		{[]Option{WithToken("has space")}, "printable ASCII"},
		{[]Option{WithClientCert("a.pem", "")}, "go together"},
		{[]Option{WithClientName(strings.Repeat("n", 300))}, "at most 256 bytes"},
		{[]Option{WithCAFile("/nonexistent/ca.pem")}, "cannot be read"},
	} {
		if _, err := New([]string{"127.0.0.1:1"}, tc.opts...); !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("want %q, got %v", tc.want, err)
		}
	}
	if _, err := New(nil); !errors.Is(err, ErrInvalidArgument) {
		t.Fatal(err)
	}
	if _, err := New([]string{"nohost"}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatal(err)
	}
}
