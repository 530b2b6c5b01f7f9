// Package testcluster starts a real `lockd dev` cluster (LOCKD_BIN) for the Go client's tests,
// as the Python client's conftest.py does: every process it starts is stopped by its PID (the
// dev supervisor with SIGTERM, then any node it left behind with SIGKILL), every wait is
// bounded, and under CI a missing prerequisite fails instead of skipping.
package testcluster

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	lockd "github.com/lockd-dev/lockd/clients/go"
)

// SecureToken is the bearer token of namespace "secure" in the clusters' config.
const SecureToken = "go-test-namespace-secret"

// Config declares namespace secure (prefix secure/, a bearer token) and namespace solo
// (prefix solo/, max_sessions = 1), as clients/scenarios.md assumes.
const Config = `
[[namespace]]
name = "secure"
prefix = "secure/"
token = "` + SecureToken + `"

[[namespace]]
name = "solo"
prefix = "solo/"
max_sessions = 1
`

// Missing skips the test locally and fails it under CI: a prerequisite must not vanish in
// silence.
func Missing(t testing.TB, what string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("missing prerequisite under CI: %s", what)
	}
	t.Skipf("missing prerequisite: %s", what)
}

// RepoRoot is the repository's root (clients/go/../..).
func RepoRoot() string {
	dir, _ := os.Getwd()
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "proto", "lockd", "v1", "lockd.proto")); err == nil {
			return d
		}
		if filepath.Dir(d) == d {
			return dir
		}
	}
}

// LockdBin is the lockd binary: LOCKD_BIN, else target/debug/lockd under the repository.
func LockdBin() (string, error) {
	p := os.Getenv("LOCKD_BIN")
	if p == "" {
		p = filepath.Join(RepoRoot(), "target", "debug", "lockd")
	}
	st, err := os.Stat(p)
	if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("lockd binary %s (build it: cargo build -p lockd-server --bin lockd, or set LOCKD_BIN)", p)
	}
	return p, nil
}

// Cluster is `lockd dev --nodes N` on consecutive ports from (HTTP, GRPC, Peer): node i listens
// on GRPC+i-1.
type Cluster struct {
	HTTP, GRPC, Peer int
	N                int
	TLS              bool
	Dir              string
	Endpoints        []string

	cmd    *exec.Cmd
	mu     sync.Mutex
	pids   map[int]int
	lines  []string
	exited chan struct{}
}

var (
	allMu sync.Mutex
	all   []*Cluster
)

// Start starts a cluster and waits until every group has a leader where leader balance puts it.
func Start(httpPort, grpcPort, peerPort, nodes int, tls bool) (*Cluster, error) {
	bin, err := LockdBin()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "lockd-go-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{HTTP: httpPort, GRPC: grpcPort, Peer: peerPort, N: nodes, TLS: tls, Dir: dir,
		pids: map[int]int{}, exited: make(chan struct{})}
	for i := 0; i < nodes; i++ {
		c.Endpoints = append(c.Endpoints, fmt.Sprintf("127.0.0.1:%d", grpcPort+i))
	}
	cfg := filepath.Join(dir, "ns.toml")
	if err := os.WriteFile(cfg, []byte(Config), 0o600); err != nil {
		return nil, err
	}
	args := []string{"dev", "--nodes", strconv.Itoa(nodes), "--http", fmt.Sprintf("127.0.0.1:%d", httpPort),
		"--grpc", fmt.Sprintf("127.0.0.1:%d", grpcPort), "--peer", fmt.Sprintf("127.0.0.1:%d", peerPort),
		"--data-dir", filepath.Join(dir, "data"), "--config", cfg}
	if tls {
		args = append(args, "--tls")
	}
	c.cmd = exec.Command(bin, args...)
	stderr, err := os.Create(filepath.Join(dir, "stderr.log"))
	if err != nil {
		return nil, err
	}
	c.cmd.Stderr = stderr
	out, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := c.cmd.Start(); err != nil {
		return nil, err
	}
	allMu.Lock()
	all = append(all, c)
	allMu.Unlock()
	go c.read(out)
	go func() { _ = c.cmd.Wait(); _ = stderr.Close(); close(c.exited) }()
	if err := waitUntil(20*time.Second, func() (bool, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.pids) == nodes, nil
	}); err != nil {
		c.Stop()
		return nil, fmt.Errorf("the dev nodes did not start: %v (stderr in %s)", err, dir)
	}
	if err := c.WaitHealthy(60 * time.Second); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

var nodeLine = regexp.MustCompile(`^node (\d+) pid (\d+) `)

func (c *Cluster) read(out interface{ Read([]byte) (int, error) }) {
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		line := sc.Text()
		c.mu.Lock()
		c.lines = append(c.lines, line)
		if m := nodeLine.FindStringSubmatch(line); m != nil {
			n, _ := strconv.Atoi(m[1])
			pid, _ := strconv.Atoi(m[2])
			c.pids[n] = pid
		}
		c.mu.Unlock()
	}
}

func waitUntil(d time.Duration, cond func() (bool, error)) error {
	end := time.Now().Add(d)
	var last error
	for time.Now().Before(end) {
		ok, err := cond()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("timed out after %s (last error: %v)", d, last)
}

// ClientOptions are the options a test client of this cluster needs (the CA under TLS).
func (c *Cluster) ClientOptions() []lockd.Option {
	if c.TLS {
		return []lockd.Option{lockd.WithCAFile(c.CAFile())}
	}
	return nil
}

// WaitHealthy waits until every live node serves names and every group has a leader that sits
// where leader balance puts it (when every node is up), so tests start from a settled cluster.
func (c *Cluster) WaitHealthy(timeout time.Duration) error {
	var live []int
	for i := 1; i <= c.N; i++ {
		if c.Alive(i) {
			live = append(live, i)
		}
	}
	opts := append(c.ClientOptions(), lockd.WithRequestTimeout(time.Second))
	cl, err := lockd.New(c.Endpoints, opts...)
	if err != nil {
		return err
	}
	defer func() { _ = cl.Close(context.Background()) }()
	err = waitUntil(timeout, func() (bool, error) {
		for _, n := range live {
			st, err := cl.StatusOf(context.Background(), n-1)
			if err != nil {
				return false, err
			}
			if !st.ServingNames {
				return false, nil
			}
			for _, g := range st.Groups {
				if g.Leader == 0 {
					return false, nil
				}
				if len(live) == c.N && g.PreferredLeader != 0 && g.Leader != g.PreferredLeader {
					return false, nil
				}
			}
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("every group to have its leader: %v", err)
	}
	return nil
}

// PID is node's process id (0: unknown).
func (c *Cluster) PID(node int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pids[node]
}

// Nodes is the node ids, in order.
func (c *Cluster) Nodes() []int {
	out := make([]int, 0, c.N)
	for i := 1; i <= c.N; i++ {
		out = append(out, i)
	}
	return out
}

// ProcState is the state letter of /proc/PID/stat (R, S, T for stopped, Z...), "" if gone.
func ProcState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	return strings.Fields(s[i+1:])[0]
}

// Alive reports whether node's process runs (not a zombie).
func (c *Cluster) Alive(node int) bool {
	pid := c.PID(node)
	if pid == 0 {
		return false
	}
	st := ProcState(pid)
	return st != "" && st != "Z" && st != "X"
}

// EndpointOf is node's gRPC endpoint.
func (c *Cluster) EndpointOf(node int) string { return c.Endpoints[node-1] }

// Signal sends sig to node's process.
func (c *Cluster) Signal(node int, sig syscall.Signal) error {
	pid := c.PID(node)
	if pid == 0 {
		return fmt.Errorf("node %d has no known pid", node)
	}
	return syscall.Kill(pid, sig)
}

// CAFile is the throwaway CA of `lockd dev --tls`.
func (c *Cluster) CAFile() string { return filepath.Join(c.Dir, "data", "tls", "ca.pem") }

// AdminToken is the admin token `lockd dev` made.
func (c *Cluster) AdminToken() string {
	b, _ := os.ReadFile(filepath.Join(c.Dir, "data", "admin-token"))
	return strings.TrimSpace(string(b))
}

// Stop stops the supervisor (SIGTERM, then SIGKILL after 15 s), then any node it left behind
// (SIGKILL, SIGCONT first for a stopped one), and removes the data.
func (c *Cluster) Stop() {
	if c.cmd != nil && c.cmd.Process != nil {
		select {
		case <-c.exited:
		default:
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-c.exited:
			case <-time.After(15 * time.Second):
				_ = c.cmd.Process.Kill()
				select {
				case <-c.exited:
				case <-time.After(5 * time.Second):
				}
			}
		}
	}
	c.mu.Lock()
	pids := make([]int, 0, len(c.pids))
	for _, pid := range c.pids {
		pids = append(pids, pid)
	}
	c.mu.Unlock()
	for _, pid := range pids {
		if st := ProcState(pid); st != "" && st != "Z" {
			_ = syscall.Kill(pid, syscall.SIGCONT)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	_ = os.RemoveAll(c.Dir)
}

// StopAll stops every cluster this process started (TestMain calls it).
func StopAll() {
	allMu.Lock()
	cs := all
	all = nil
	allMu.Unlock()
	for _, c := range cs {
		c.Stop()
	}
}

// Shared starts one cluster per port triple, once per process, and returns it to every test
// that asks; a start that fails fails (or, without the binary, skips) each of them.
type Shared struct {
	HTTP, GRPC, Peer int
	TLS              bool
	once             sync.Once
	c                *Cluster
	err              error
	noBin            bool
}

// Get is the shared cluster, started on first use.
func (s *Shared) Get(t testing.TB) *Cluster {
	t.Helper()
	s.once.Do(func() {
		if _, err := LockdBin(); err != nil {
			s.err, s.noBin = err, true
			return
		}
		s.c, s.err = Start(s.HTTP, s.GRPC, s.Peer, 3, s.TLS)
	})
	if s.noBin {
		Missing(t, s.err.Error())
	}
	if s.err != nil {
		t.Fatalf("cluster: %v", s.err)
	}
	return s.c
}

// Fresh starts a cluster of the test's own (for a test that kills nodes), stopped at its end.
func Fresh(t testing.TB, httpPort, grpcPort, peerPort int) *Cluster {
	t.Helper()
	if _, err := LockdBin(); err != nil {
		Missing(t, err.Error())
	}
	c, err := Start(httpPort, grpcPort, peerPort, 3, false)
	if err != nil {
		t.Fatalf("cluster: %v", err)
	}
	t.Cleanup(c.Stop)
	return c
}
