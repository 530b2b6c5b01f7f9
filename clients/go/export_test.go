package lockd

import "context"

// Hooks for the external tests (package lockd_test), compiled only into the test binary.

// ReleaseToken sends a release of name with any token on the client's session: what a holder
// with a stale token would send.
func ReleaseToken(ctx context.Context, c *Client, sessionID, name string, token uint64) (uint32, error) {
	return c.release(ctx, sessionID, name, token)
}

// PauseKeepalives stops (true) or restarts the client's keepalives: its renewal loop sends
// nothing while paused, as a stuck process's would, nor does the close the client sends once
// its session is lost (the service then expires the session, as it would a stuck process's).
// The local timers go on.
func PauseKeepalives(c *Client, paused bool) {
	c.mu.Lock()
	c.testPauseKeepalives = paused
	c.pokeLocked()
	c.mu.Unlock()
}

// SetMaxWait lowers the client's cap on one wait (the service's 300 s), so a test shows the
// rounds of a longer wait in seconds; returns a function that restores it.
func SetMaxWait(seconds float64) func() {
	old := maxWait
	maxWait = seconds
	return func() { maxWait = old }
}

// AcquiresSent is how many acquire requests the client sent on its session stream.
func AcquiresSent(c *Client) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.acquiresSent
}
