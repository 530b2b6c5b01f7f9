package lockd

import (
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/lockd-dev/lockd/clients/go/internal/pb"
)

const (
	// MaxWait is the longest wait the service accepts for one acquire (wait_ms <= 300 000). A
	// longer wait queues again, round after round, up to the caller's deadline.
	MaxWait         = 300 * time.Second
	maxNameBytes    = 512
	maxOwnerBytes   = 256
	maxSemaphore    = 10_000
	maxFencingToken = 1<<63 - 1
)

// Characters a lock name may not hold, as the server's rule (lockd_core::limits::is_invisible)
// and docs/openapi.yaml's Name pattern have them: controls, then invisible and bidi-control
// ones. The same table as the Python client's _core.py.
var notInNames = [][2]rune{
	{0x00, 0x1F}, {0x7F, 0x9F}, {0xAD, 0xAD}, {0x34F, 0x34F}, {0x600, 0x605}, {0x61C, 0x61C},
	{0x6DD, 0x6DD}, {0x70F, 0x70F}, {0x890, 0x891}, {0x8E2, 0x8E2}, {0x115F, 0x1160},
	{0x17B4, 0x17B5}, {0x180B, 0x180F}, {0x200B, 0x200F}, {0x2028, 0x202E}, {0x2060, 0x206F},
	{0x3164, 0x3164}, {0xFE00, 0xFE0F}, {0xFEFF, 0xFEFF}, {0xFFA0, 0xFFA0}, {0xFFF9, 0xFFFB},
	{0x110BD, 0x110BD}, {0x110CD, 0x110CD}, {0x13430, 0x1343F}, {0x1BCA0, 0x1BCA3},
	{0x1D173, 0x1D17A}, {0xE0000, 0xE0FFF},
}

func shortName(name string) string {
	if len(name) <= 40 {
		return fmt.Sprintf("%q", name)
	}
	return fmt.Sprintf("%q...", name[:40])
}

// CheckName applies the server's name rule, so that a bad name fails before any call: 1..=512
// bytes of UTF-8 with no control, invisible or bidirectional-control character. Names are
// compared as bytes and never normalised: send NFC.
func CheckName(name string) error {
	n := len(name)
	if n < 1 || n > maxNameBytes {
		return invalidArg("name: a lock name must be 1..=%d bytes of UTF-8 (got %d bytes: %s)",
			maxNameBytes, n, shortName(name))
	}
	if !utf8.ValidString(name) {
		return invalidArg("name: a lock name must be valid UTF-8: %s", shortName(name))
	}
	for _, c := range name {
		for _, r := range notInNames {
			if r[0] <= c && c <= r[1] {
				return invalidArg("name: a lock name holds U+%04X, a control, invisible or "+
					"bidirectional-control character: %s", c, shortName(name))
			}
		}
	}
	return nil
}

func checkOwner(owner string) error {
	if n := len(owner); n > maxOwnerBytes {
		return invalidArg("owner must be at most %d bytes (got %d)", maxOwnerBytes, n)
	}
	return nil
}

// Mode is how a lock may be shared. Every user of a name must use the same mode (and limit).
type Mode int

const (
	// Exclusive: one holder.
	Exclusive Mode = iota
	// Shared: any number of shared holders, never beside an exclusive one; a reader behind a
	// waiting writer waits.
	Shared
	// Semaphore: up to a limit of holders (1..=10 000), each with its own token.
	Semaphore
)

func (m Mode) String() string {
	switch m {
	case Shared:
		return "shared"
	case Semaphore:
		return "semaphore"
	}
	return "exclusive"
}

func (m Mode) toPB() pb.Mode {
	switch m {
	case Shared:
		return pb.Mode_MODE_SHARED
	case Semaphore:
		return pb.Mode_MODE_SEMAPHORE
	}
	return pb.Mode_MODE_EXCLUSIVE
}

func modeFromPB(m pb.Mode) Mode {
	switch m {
	case pb.Mode_MODE_SHARED:
		return Shared
	case pb.Mode_MODE_SEMAPHORE:
		return Semaphore
	}
	return Exclusive
}
