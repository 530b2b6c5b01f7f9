package lockd

// Which waiting acquire a pushed granted or wait_ended answers: pure bookkeeping, the rules of
// the Python client's _pushes.py and lockd-client's pushes.rs. A wait is queued by a request on
// the session stream and answered later by a push that names it by (group, waiter):
//
//   - The push comes first: a push for an unknown waiter is kept while an acquire of the same
//     name is still unanswered on the stream (its queued reply may be on the way).
//   - The same outcome is pushed twice: waiters answered lately are remembered, and a second
//     push for one is dropped, never taken for an orphan and released under a live lock.
//   - The stream breaks while a wait is queued: the wait lives on in the group, so the caller's
//     retry is refused already_waiting by its own first attempt. Such (name, owner) pairs are
//     strays; a stray's retry refused that way adopts the queued wait.
//   - Nobody is left to take a grant: a grant with no waiter, no unanswered acquire of its name
//     and no adopter is an orphan, which the engine gives back.

import (
	"sort"

	"github.com/lockd-dev/lockd/clients/go/internal/pb"
)

// pushCapacity is how many of each remembered kind (early pushes, answered waiters, strays)
// are kept.
const pushCapacity = 4096

type pushKey struct {
	group  uint32
	waiter uint64
}

type nameOwner struct{ name, owner string }

// pushed is what became of a push: an answer to an acquire (acq set), an orphan grant to give
// back (orphan true), or nothing (kept for a queued reply on its way, or dropped).
type pushed[A any] struct {
	answered    bool
	acq         A
	event       *pb.SessionEvent
	orphan      bool
	orphanName  string
	orphanToken uint64
}

func (p pushed[A]) none() bool { return !p.answered && !p.orphan }

// orderedEvents is an insertion-ordered map of early pushes.
type orderedEvents struct {
	keys []pushKey
	m    map[pushKey]*pb.SessionEvent
}

func (o *orderedEvents) put(k pushKey, ev *pb.SessionEvent) {
	if _, ok := o.m[k]; !ok {
		o.keys = append(o.keys, k)
	}
	o.m[k] = ev
	for len(o.m) > pushCapacity {
		o.pop(o.keys[0])
	}
}

func (o *orderedEvents) pop(k pushKey) (*pb.SessionEvent, bool) {
	ev, ok := o.m[k]
	if !ok {
		return nil, false
	}
	delete(o.m, k)
	for i, kk := range o.keys {
		if kk == k {
			o.keys = append(o.keys[:i], o.keys[i+1:]...)
			break
		}
	}
	return ev, true
}

func (o *orderedEvents) clear() { o.keys = nil; o.m = map[pushKey]*pb.SessionEvent{} }

func pushKeyOf(ev *pb.SessionEvent) (pushKey, string) {
	if g := ev.GetGranted(); g != nil {
		return pushKey{g.GetGroup(), g.GetWaiter()}, g.GetName()
	}
	w := ev.GetWaitEnded()
	return pushKey{w.GetGroup(), w.GetWaiter()}, w.GetName()
}

// pushes is the waits of one session stream and what is known about their pushes.
type pushes[A any] struct {
	waits     map[pushKey]A
	early     orderedEvents
	answered  []pushKey
	answerSet map[pushKey]bool
	// Each stray's first attempt's send time: an adopted wait may have been granted before
	// the retry was sent, so its lease counts from the first attempt.
	strays   map[nameOwner]float64
	adopters map[string][]A
}

func newPushes[A any]() *pushes[A] {
	return &pushes[A]{
		waits: map[pushKey]A{}, early: orderedEvents{m: map[pushKey]*pb.SessionEvent{}},
		answerSet: map[pushKey]bool{}, strays: map[nameOwner]float64{}, adopters: map[string][]A{},
	}
}

// queued: an acquire was answered queued as key: a push that came first answers it.
func (p *pushes[A]) queued(key pushKey, acq A) pushed[A] {
	ev, ok := p.early.pop(key)
	if !ok {
		p.waits[key] = acq
		return pushed[A]{}
	}
	p.mark(key)
	return pushed[A]{answered: true, acq: acq, event: ev}
}

// pushed: a push arrived; unanswered(name): an acquire of that name is still unanswered.
func (p *pushes[A]) pushed(ev *pb.SessionEvent, unanswered func(string) bool) pushed[A] {
	key, name := pushKeyOf(ev)
	if acq, ok := p.waits[key]; ok {
		delete(p.waits, key)
		p.mark(key)
		return pushed[A]{answered: true, acq: acq, event: ev}
	}
	if p.answerSet[key] {
		return pushed[A]{}
	}
	if unanswered(name) {
		p.early.put(key, ev)
		return pushed[A]{}
	}
	return p.unclaimedPush(key, name, ev)
}

func (p *pushes[A]) unclaimedPush(key pushKey, name string, ev *pb.SessionEvent) pushed[A] {
	p.mark(key)
	if q := p.adopters[name]; len(q) > 0 {
		acq := q[0]
		if len(q) == 1 {
			delete(p.adopters, name)
		} else {
			p.adopters[name] = q[1:]
		}
		return pushed[A]{answered: true, acq: acq, event: ev}
	}
	if g := ev.GetGranted(); g != nil {
		return pushed[A]{orphan: true, orphanName: g.GetName(), orphanToken: g.GetFencingToken()}
	}
	return pushed[A]{}
}

// refusedWaiting: the acquire was refused already_waiting. adopted: a stray's retry adopts its
// queued wait (with the answer at once when its push came first); not adopted: the refusal is
// the caller's.
func (p *pushes[A]) refusedWaiting(name, owner string, acq A) (adopted bool, answer pushed[A]) {
	if _, ok := p.strays[nameOwner{name, owner}]; !ok {
		return false, pushed[A]{}
	}
	for _, key := range p.early.keys {
		ev := p.early.m[key]
		if _, n := pushKeyOf(ev); n == name {
			p.early.pop(key)
			p.mark(key)
			return true, pushed[A]{answered: true, acq: acq, event: ev}
		}
	}
	p.adopters[name] = append(p.adopters[name], acq)
	return true, pushed[A]{}
}

// isStray: whether (name, owner)'s last acquire lost its outcome with a broken stream.
func (p *pushes[A]) isStray(name, owner string) bool {
	_, ok := p.strays[nameOwner{name, owner}]
	return ok
}

// settled: the acquire got another answer than already_waiting: no longer a stray.
func (p *pushes[A]) settled(name, owner string) { delete(p.strays, nameOwner{name, owner}) }

// unclaimed: kept pushes of name that no acquire can claim any more: each goes to an adopter,
// or is an orphan if a grant.
func (p *pushes[A]) unclaimed(name string, unanswered func(string) bool) []pushed[A] {
	if len(p.early.m) == 0 || unanswered(name) {
		return nil
	}
	var keys []pushKey
	for _, k := range p.early.keys {
		if _, n := pushKeyOf(p.early.m[k]); n == name {
			keys = append(keys, k)
		}
	}
	var out []pushed[A]
	for _, k := range keys {
		ev, _ := p.early.pop(k)
		if r := p.unclaimedPush(k, name, ev); !r.none() {
			out = append(out, r)
		}
	}
	return out
}

// waiting: whether a queued wait or an adopter matches (its grant may come at any time).
func (p *pushes[A]) waiting(match func(A) bool) bool {
	for _, a := range p.waits {
		if match(a) {
			return true
		}
	}
	for _, q := range p.adopters {
		for _, a := range q {
			if match(a) {
				return true
			}
		}
	}
	return false
}

// giveUpAdopters hands back the adopters expired says have waited long enough for a push.
func (p *pushes[A]) giveUpAdopters(expired func(A) bool) []A {
	var out []A
	for _, name := range sortedKeys(p.adopters) {
		var kept []A
		for _, a := range p.adopters[name] {
			if expired(a) {
				out = append(out, a)
			} else {
				kept = append(kept, a)
			}
		}
		if len(kept) > 0 {
			p.adopters[name] = kept
		} else {
			delete(p.adopters, name)
		}
	}
	return out
}

// broke: the stream broke: its early pushes are gone; every wait and adopter is handed back.
func (p *pushes[A]) broke() []A {
	p.early.clear()
	var out []A
	keys := make([]pushKey, 0, len(p.waits))
	for k := range p.waits {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].group != keys[j].group {
			return keys[i].group < keys[j].group
		}
		return keys[i].waiter < keys[j].waiter
	})
	for _, k := range keys {
		out = append(out, p.waits[k])
	}
	p.waits = map[pushKey]A{}
	for _, name := range sortedKeys(p.adopters) {
		out = append(out, p.adopters[name]...)
	}
	p.adopters = map[string][]A{}
	return out
}

// waitGroups is the groups the queued waits live in (each once, sorted).
func (p *pushes[A]) waitGroups() []uint32 {
	seen := map[uint32]bool{}
	var out []uint32
	for k := range p.waits {
		if !seen[k.group] {
			seen[k.group] = true
			out = append(out, k.group)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// hasStrays: whether an acquire whose outcome a broken stream took is still unsettled.
func (p *pushes[A]) hasStrays() bool {
	if len(p.strays) > 0 {
		return true
	}
	for _, q := range p.adopters {
		if len(q) > 0 {
			return true
		}
	}
	return false
}

// stray: (name, owner)'s acquire, sent at sent, lost its outcome with the stream; a stray
// already known keeps its earlier send time.
func (p *pushes[A]) stray(name, owner string, sent float64) {
	k := nameOwner{name, owner}
	if t, ok := p.strays[k]; ok {
		if sent < t {
			p.strays[k] = sent
		}
	} else if len(p.strays) < pushCapacity {
		p.strays[k] = sent
	}
}

// straySince: when the first attempt of stray (name, owner) was sent.
func (p *pushes[A]) straySince(name, owner string) (float64, bool) {
	t, ok := p.strays[nameOwner{name, owner}]
	return t, ok
}

// end: the session ended: everything is forgotten; waits and adopters are handed back.
func (p *pushes[A]) end() []A {
	out := p.broke()
	p.answered = nil
	p.answerSet = map[pushKey]bool{}
	p.strays = map[nameOwner]float64{}
	return out
}

func (p *pushes[A]) mark(key pushKey) {
	if !p.answerSet[key] {
		p.answerSet[key] = true
		p.answered = append(p.answered, key)
	}
	for len(p.answered) > pushCapacity {
		delete(p.answerSet, p.answered[0])
		p.answered = p.answered[1:]
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

type heldToken struct {
	name  string
	token uint64
}

// settle decides what to do with the holds the service lists for the session after an
// acquire's outcome was lost (unsure): each listed hold of an unsure name that no lock object
// knows is given back, so the caller's retry starts clean. A name with an acquire or a wait
// still open is left for later. Returns the holds to give back and the names to settle later.
func settle(unsure []string, listed []heldToken, known func(string, uint64) bool, open func(string) bool) (giveBack []heldToken, later []string) {
	seen := map[string]bool{}
	for _, name := range unsure {
		if seen[name] {
			continue
		}
		seen[name] = true
		if open(name) {
			later = append(later, name)
			continue
		}
		for _, h := range listed {
			if h.name == name && !known(h.name, h.token) {
				giveBack = append(giveBack, h)
			}
		}
	}
	return giveBack, later
}
