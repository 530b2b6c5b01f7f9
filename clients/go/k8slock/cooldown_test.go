package k8slock

import (
	"testing"
	"time"
)

// The cool-down after a loss is one whole lease (findings 4 and 12): client-go's record says
// LeaseDurationSeconds = int(LeaseDuration / time.Second), up to a second short of the
// LeaseDuration, and the lockd TTL that counts is the one the service granted.
func TestTheCoolDownIsOneWholeLeaseAndAtLeastTheGrantedTTL(t *testing.T) {
	lease := 9500 * time.Millisecond
	if got := coolDownFor(int(lease/time.Second), 5*time.Second); got < lease {
		t.Fatalf("a LeaseDuration of %s cools down for %s", lease, got)
	}
	if got := coolDownFor(1, 12*time.Second); got != 12*time.Second {
		t.Fatalf("the granted TTL: %s", got)
	}
	if got := coolDownFor(0, 5*time.Second); got != 5*time.Second {
		t.Fatalf("no record yet: %s", got)
	}
}
