package lockd

// Which waiting acquire a pushed outcome answers (the rules of pushes.go): a port of the
// Python client's push tests (tests/test_unit.py), one table entry each.

import (
	"reflect"
	"testing"

	"github.com/lockd-dev/lockd/clients/go/internal/pb"
)

func grantedEv(waiter uint64, name string, token uint64) *pb.SessionEvent {
	return &pb.SessionEvent{Kind: &pb.SessionEvent_Granted{Granted: &pb.Granted{
		Group: 1, Waiter: waiter, Name: name, FencingToken: token}}}
}

func endedEv(waiter uint64, name string) *pb.SessionEvent {
	return &pb.SessionEvent{Kind: &pb.SessionEvent_WaitEnded{WaitEnded: &pb.WaitEnded{
		Group: 1, Waiter: waiter, Name: name, Reason: "timed_out"}}}
}

func noneOpen(string) bool { return false }
func allOpen(string) bool  { return true }

func answers(t *testing.T, p pushed[string], acq string) {
	t.Helper()
	if !p.answered || p.acq != acq {
		t.Fatalf("want an answer to %q, got %+v", acq, p)
	}
}

func nothing(t *testing.T, p pushed[string]) {
	t.Helper()
	if !p.none() {
		t.Fatalf("want nothing, got %+v", p)
	}
}

func orphan(t *testing.T, p pushed[string], name string, token uint64) {
	t.Helper()
	if !p.orphan || p.orphanName != name || p.orphanToken != token {
		t.Fatalf("want orphan %s/%d, got %+v", name, token, p)
	}
}

var pushTests = []struct {
	name string
	run  func(t *testing.T)
}{
	{"a push answers its queued wait once", func(t *testing.T) {
		p := newPushes[string]()
		nothing(t, p.queued(pushKey{1, 7}, "a"))
		answers(t, p.pushed(grantedEv(7, "x", 42), noneOpen), "a")
		// The same outcome pushed again (a relay and the local replica) is no orphan.
		nothing(t, p.pushed(grantedEv(7, "x", 42), noneOpen))
	}},
	{"a push before its queued reply waits for it", func(t *testing.T) {
		p := newPushes[string]()
		nothing(t, p.pushed(grantedEv(7, "x", 42), allOpen))
		got := p.queued(pushKey{1, 7}, "a")
		answers(t, got, "a")
		if got.event.GetGranted().GetFencingToken() != 42 {
			t.Fatal("token")
		}
		if len(p.unclaimed("x", noneOpen)) != 0 {
			t.Fatal("nothing left")
		}
	}},
	{"a grant nobody waits for is an orphan once", func(t *testing.T) {
		p := newPushes[string]()
		orphan(t, p.pushed(grantedEv(9, "x", 50), noneOpen), "x", 50)
		nothing(t, p.pushed(grantedEv(9, "x", 50), noneOpen))
		nothing(t, p.pushed(endedEv(10, "x"), noneOpen))
	}},
	{"a kept grant that no reply claims is an orphan", func(t *testing.T) {
		p := newPushes[string]()
		nothing(t, p.pushed(grantedEv(9, "x", 50), allOpen))
		nothing(t, p.queued(pushKey{1, 11}, "b"))
		if len(p.unclaimed("x", allOpen)) != 0 {
			t.Fatal("an open acquire may still claim it")
		}
		out := p.unclaimed("x", noneOpen)
		if len(out) != 1 {
			t.Fatalf("got %v", out)
		}
		orphan(t, out[0], "x", 50)
		answers(t, p.pushed(grantedEv(11, "x", 51), noneOpen), "b")
	}},
	{"a stray's retry adopts its queued wait", func(t *testing.T) {
		p := newPushes[string]()
		nothing(t, p.queued(pushKey{1, 7}, "first"))
		if got := p.broke(); !reflect.DeepEqual(got, []string{"first"}) {
			t.Fatalf("broke %v", got)
		}
		p.stray("x", "me", 1)
		if adopted, a := p.refusedWaiting("x", "other", "o"); adopted || !a.none() {
			t.Fatal("another owner's refusal is its own")
		}
		if adopted, a := p.refusedWaiting("x", "me", "retry"); !adopted || !a.none() {
			t.Fatal("the stray's retry adopts")
		}
		answers(t, p.pushed(grantedEv(7, "x", 42), noneOpen), "retry")
		if !p.isStray("x", "me") {
			t.Fatal("still a stray until settled")
		}
		p.settled("x", "me")
		if p.isStray("x", "me") {
			t.Fatal("settled")
		}
		if adopted, _ := p.refusedWaiting("x", "me", "again"); adopted {
			t.Fatal("no longer a stray")
		}
	}},
	{"a stray keeps its first attempt's send time", func(t *testing.T) {
		p := newPushes[string]()
		p.stray("x", "me", 1)
		p.stray("x", "me", 2)
		if s, ok := p.straySince("x", "me"); !ok || s != 1 {
			t.Fatalf("since %v", s)
		}
		if _, ok := p.straySince("x", "other"); ok {
			t.Fatal("no such stray")
		}
	}},
	{"a stray's grant pushed before the refusal answers the retry", func(t *testing.T) {
		p := newPushes[string]()
		p.stray("x", "me", 1)
		nothing(t, p.pushed(grantedEv(7, "x", 42), allOpen))
		adopted, got := p.refusedWaiting("x", "me", "retry")
		if !adopted {
			t.Fatal("adopted")
		}
		answers(t, got, "retry")
		if got.event.GetGranted().GetFencingToken() != 42 {
			t.Fatal("token")
		}
	}},
	{"a kept grant goes to an adopter before it is called an orphan", func(t *testing.T) {
		p := newPushes[string]()
		p.stray("x", "me", 1)
		if adopted, a := p.refusedWaiting("x", "me", "retry"); !adopted || !a.none() {
			t.Fatal("adopts")
		}
		nothing(t, p.pushed(grantedEv(7, "x", 42), allOpen))
		out := p.unclaimed("x", noneOpen)
		if len(out) != 1 {
			t.Fatalf("got %v", out)
		}
		answers(t, out[0], "retry")
	}},
	{"adopters that waited too long are handed back", func(t *testing.T) {
		p := newPushes[string]()
		p.stray("x", "me", 1)
		p.stray("y", "me", 1)
		p.refusedWaiting("x", "me", "ax")
		p.refusedWaiting("y", "me", "ay")
		if got := p.giveUpAdopters(func(a string) bool { return a == "ax" }); !reflect.DeepEqual(got, []string{"ax"}) {
			t.Fatalf("got %v", got)
		}
		if got := p.giveUpAdopters(func(a string) bool { return a == "ax" }); len(got) != 0 {
			t.Fatalf("got %v", got)
		}
		answers(t, p.pushed(grantedEv(7, "y", 42), noneOpen), "ay")
	}},
	{"settling gives back only holds no lock and no open acquire can claim", func(t *testing.T) {
		listed := []heldToken{{"x", 10}, {"x", 11}, {"y", 20}, {"z", 30}, {"w", 40}}
		back, later := settle([]string{"x", "x", "y", "z"}, listed,
			func(n string, tok uint64) bool { return n == "x" && tok == 11 },
			func(n string) bool { return n == "z" })
		if !reflect.DeepEqual(back, []heldToken{{"x", 10}, {"y", 20}}) || !reflect.DeepEqual(later, []string{"z"}) {
			t.Fatalf("back %v later %v", back, later)
		}
	}},
	{"a queued wait or an adopter keeps its name open", func(t *testing.T) {
		p := newPushes[string]()
		hasX := func(a string) bool { return len(a) > 0 && a[0] == 'x' }
		hasY := func(a string) bool { return len(a) > 0 && a[0] == 'y' }
		hasZ := func(a string) bool { return len(a) > 0 && a[0] == 'z' }
		if p.waiting(hasX) {
			t.Fatal("nothing waits")
		}
		p.queued(pushKey{1, 7}, "x-wait")
		if !p.waiting(hasX) {
			t.Fatal("x waits")
		}
		p.stray("y", "me", 1)
		p.refusedWaiting("y", "me", "y-adopter")
		if !p.waiting(hasY) || p.waiting(hasZ) {
			t.Fatal("y adopter")
		}
	}},
	{"the end of a session hands back waits and adopters", func(t *testing.T) {
		p := newPushes[string]()
		p.queued(pushKey{1, 7}, "w")
		p.stray("x", "me", 1)
		p.refusedWaiting("x", "me", "adopter")
		got := p.end()
		if len(got) != 2 || !(contains(got, "w") && contains(got, "adopter")) {
			t.Fatalf("got %v", got)
		}
		if adopted, _ := p.refusedWaiting("x", "me", "z"); adopted {
			t.Fatal("strays forgotten")
		}
	}},
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestPushes(t *testing.T) {
	for _, tc := range pushTests {
		t.Run(tc.name, tc.run)
	}
}
