package scheduler

import (
	"fmt"
	"math"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/egressip/egressip/api/v1alpha1"

	"pgregory.net/rapid"
)

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

func at(sec int) time.Time { return epoch.Add(time.Duration(sec) * time.Second) }

// eg is an Egress created sec seconds after epoch; ip "" means none yet.
func eg(name string, sec int, pool, ip, cur string) Egress {
	e := Egress{Name: name, Created: at(sec), Pool: pool, CurrentNode: cur}
	if ip != "" {
		e.IP = addr(ip)
	}
	return e
}

func nodesCap(capacity int, names ...string) []Node {
	ns := make([]Node, len(names))
	for i, n := range names {
		ns[i] = Node{Name: n, Eligible: true, Capacity: capacity}
	}
	return ns
}

func pool4(name string, nodes ...string) Pool {
	return Pool{Name: name, Family: IPv4, EligibleNodes: nodes}
}

// run schedules in, checks every rule with checkResult, that in is left
// unchanged and that the reference scheduler (reference_test.go) gives the
// same Result, and returns the result.
func run(t *testing.T, in Input) Result {
	t.Helper()
	before := cloneInput(in)
	out := Schedule(in)
	if err := checkResult(in, out); err != nil {
		t.Fatalf("rule broken: %v\ninput: %+v\nresult: %+v", err, in, out)
	}
	if !sameInput(before, in) {
		t.Fatalf("Schedule modified its input")
	}
	checkReference(t, in)
	return out
}

// sameInput is reflect.DeepEqual that also matches a NaN BalanceFactor.
func sameInput(a, b Input) bool {
	if math.Float64bits(a.BalanceFactor) != math.Float64bits(b.BalanceFactor) {
		return false
	}
	a.BalanceFactor, b.BalanceFactor = 0, 0
	return reflect.DeepEqual(a, b)
}

func placementOf(t *testing.T, r Result, name string) Placement {
	t.Helper()
	for _, p := range r.Placements {
		if p.Egress == name {
			return p
		}
	}
	t.Fatalf("no placement for %q in %+v", name, r.Placements)
	return Placement{}
}

// Named case (a): two Nodes of capacity 1 and two Egresses created in the
// same second are both placed, on different Nodes, in every input order.
func TestTwoCapacityOneNodesSameSecond(t *testing.T) {
	es := []Egress{eg("a", 0, "p", "192.0.2.1", ""), eg("b", 0, "p", "192.0.2.2", "")}
	ns := nodesCap(1, "n1", "n2")
	var first string
	for _, eOrder := range [][]int{{0, 1}, {1, 0}} {
		for _, nOrder := range [][]int{{0, 1}, {1, 0}} {
			in := Input{
				Pools:    []Pool{pool4("p", ns[nOrder[0]].Name, ns[nOrder[1]].Name)},
				Nodes:    []Node{ns[nOrder[0]], ns[nOrder[1]]},
				Egresses: []Egress{es[eOrder[0]], es[eOrder[1]]},
			}
			out := run(t, in)
			a, b := placementOf(t, out, "a"), placementOf(t, out, "b")
			if a.Node == "" || b.Node == "" || a.Node == b.Node {
				t.Fatalf("orders %v %v: want both placed on different Nodes, got %+v", eOrder, nOrder, out.Placements)
			}
			if d := dump(out); first == "" {
				first = d
			} else if d != first {
				t.Fatalf("orders %v %v: result differs from the first order:\n%s\n%s", eOrder, nOrder, d, first)
			}
		}
	}
}

// Named case (b): two passes over inputs that differ only by a newer Egress
// give the older Egresses identical placements, whether the pass starts
// from nothing or from the cluster's current assignments.
func TestNewerEgressLeavesOlderPlacements(t *testing.T) {
	// Few Nodes, small capacities, shared IPs and a load bound that
	// changes with the number of Egresses (ceil(1.25·k/3)), so a bound
	// computed from all Egresses would shift the older ones.
	base := Input{
		Pools: []Pool{pool4("p", "n1", "n2", "n3"), pool4("q", "n2", "n3")},
		Nodes: []Node{
			{Name: "n1", Eligible: true, Capacity: 3},
			{Name: "n2", Eligible: true, Capacity: 2},
			{Name: "n3", Eligible: true, Capacity: 4},
		},
	}
	for i := range 9 {
		pool := "p"
		if i%3 == 2 {
			pool = "q"
		}
		base.Egresses = append(base.Egresses, eg(fmt.Sprintf("e%d", i), i, pool, fmt.Sprintf("192.0.2.%d", i+1), ""))
	}
	warm := applyResult(base, run(t, base))
	newer := []Egress{
		eg("z-new-ip", 100, "p", "192.0.2.200", ""),
		eg("z-shared-ip", 100, "p", "192.0.2.1", ""), // shares e0's IP
		eg("a-new-name-first", 100, "q", "192.0.2.201", ""),
	}
	for _, start := range []struct {
		name string
		in   Input
	}{{"cold", base}, {"warm", warm}} {
		before := nodesOf(run(t, start.in))
		for _, n := range newer {
			in := cloneInput(start.in)
			in.Egresses = append(in.Egresses, n)
			out := run(t, in)
			for _, p := range out.Placements {
				if p.Egress == n.Name {
					continue
				}
				if p.Node != before[p.Egress] {
					t.Errorf("%s + %s: %s moved from %q to %q", start.name, n.Name, p.Egress, before[p.Egress], p.Node)
				}
			}
		}
	}
}

func TestSharedIPIsOneUnit(t *testing.T) {
	in := Input{
		Pools: []Pool{pool4("p", "n1", "n2")},
		Nodes: []Node{{Name: "n1", Eligible: true, Capacity: 1}, {Name: "n2", Eligible: true, Capacity: 1}},
		Egresses: []Egress{
			eg("a", 0, "p", "192.0.2.1", ""),
			eg("b", 1, "p", "192.0.2.1", ""),
			eg("c", 2, "p", "192.0.2.1", ""),
			eg("d", 3, "p", "192.0.2.2", ""),
		},
	}
	out := run(t, in)
	a, b, c, d := placementOf(t, out, "a"), placementOf(t, out, "b"), placementOf(t, out, "c"), placementOf(t, out, "d")
	if a.Node == "" || b.Node != a.Node || c.Node != a.Node {
		t.Errorf("a, b, c share an IP and must share a Node: %+v", out.Placements)
	}
	if d.Node == "" || d.Node == a.Node {
		t.Errorf("the shared IP counts once, so d fits on the other Node: %+v", out.Placements)
	}
}

func TestSharedIPPriorityIsOldestMember(t *testing.T) {
	in := Input{
		Pools: []Pool{pool4("p", "n1")},
		Nodes: nodesCap(1, "n1"),
		Egresses: []Egress{
			eg("mid", 5, "p", "192.0.2.9", ""),
			eg("new", 9, "p", "192.0.2.1", ""),
			eg("old", 1, "p", "192.0.2.1", ""),
		},
	}
	out := run(t, in)
	if placementOf(t, out, "new").Node != "n1" || placementOf(t, out, "old").Node != "n1" {
		t.Errorf("the unit of old and new has old's priority and wins: %+v", out.Placements)
	}
	if p := placementOf(t, out, "mid"); p.Node != "" || p.Reason != v1.ReasonCapacityExhausted {
		t.Errorf("mid should be unplaced with %s: %+v", v1.ReasonCapacityExhausted, p)
	}
}

func TestPriorityWhenCapacityShort(t *testing.T) {
	in := Input{
		Pools: []Pool{pool4("p", "n1", "n2")},
		Nodes: nodesCap(2, "n1", "n2"),
	}
	// Six Egresses for four places; two share a creation second and are
	// ordered by name.
	for i, name := range []string{"f", "e", "d", "c", "b", "a"} {
		in.Egresses = append(in.Egresses, eg(name, 10-i, "p", fmt.Sprintf("192.0.2.%d", i+1), ""))
	}
	in.Egresses[1].Created = in.Egresses[0].Created // "e" and "f" at second 10: "e" first
	out := run(t, in)
	got := nodesOf(out)
	for _, name := range []string{"a", "b", "c", "d"} {
		if got[name] == "" {
			t.Errorf("older Egress %s should be placed: %+v", name, out.Placements)
		}
	}
	for _, name := range []string{"e", "f"} {
		if got[name] != "" {
			t.Errorf("newest Egress %s should be unplaced: %+v", name, out.Placements)
		}
	}
}

func TestInvalidEgresses(t *testing.T) {
	in := Input{
		Pools: []Pool{
			pool4("p", "n1"),
			{Name: "v6", Family: IPv6, EligibleNodes: []string{"n1"}},
			pool4("dup", "n1"), pool4("dup", "n1"),
			{Name: "nofamily", EligibleNodes: []string{"n1"}},
		},
		Nodes: nodesCap(10, "n1"),
		Egresses: []Egress{
			eg("ok4", 0, "p", "192.0.2.1", ""),
			eg("ok6", 0, "v6", "2001:db8::1", ""),
			eg("nopool", 0, "missing", "192.0.2.2", "n1"),
			eg("duppool", 0, "dup", "192.0.2.3", ""),
			eg("badfamily", 0, "nofamily", "192.0.2.4", ""),
			eg("noip", 0, "p", "", ""),
			eg("v6in4", 0, "p", "2001:db8::2", ""),
			eg("v4in6", 0, "v6", "192.0.2.5", ""),
			eg("mapped", 0, "p", "::ffff:192.0.2.6", ""),
			eg("zoned", 0, "v6", "fe80::1%eth0", ""),
			eg("twice", 0, "p", "192.0.2.7", "n1"),
			eg("twice", 1, "p", "192.0.2.8", ""),
		},
	}
	out := run(t, in)
	want := map[string]string{
		"ok4": "", "ok6": "",
		"nopool":    v1.ReasonPoolNotFound,
		"duppool":   v1.ReasonPoolInvalid,
		"badfamily": v1.ReasonPoolInvalid,
		"noip":      v1.ReasonIPNotAllocated,
		"v6in4":     v1.ReasonIPInvalid,
		"v4in6":     v1.ReasonIPInvalid,
		"mapped":    v1.ReasonIPInvalid,
		"zoned":     v1.ReasonIPInvalid,
		"twice":     v1.ReasonDuplicateEgress,
	}
	if len(out.Placements) != len(want) {
		t.Fatalf("want one placement per distinct name, got %+v", out.Placements)
	}
	for name, reason := range want {
		p := placementOf(t, out, name)
		if p.Reason != reason || (reason == "") != (p.Node == "n1") || (reason == "") != (p.Message == "") {
			t.Errorf("%s: want reason %q, got %+v", name, reason, p)
		}
	}
	for _, tc := range []struct{ name, sub string }{
		{"nopool", `pool "missing" not found`},
		{"duppool", "more than once"},
		{"badfamily", "unknown IP family 0"},
		{"v6in4", "is not IPv4"},
		{"zoned", "zone"},
		{"twice", "2 times"},
	} {
		if m := placementOf(t, out, tc.name).Message; !strings.Contains(m, tc.sub) {
			t.Errorf("%s: message %q should contain %q", tc.name, m, tc.sub)
		}
	}
	// nopool was on n1: it leaves with its placement reason. "twice" has
	// no Move, being ambiguous.
	wantMoves := []Move{{Egress: "nopool", From: "n1", Reason: v1.ReasonPoolNotFound}}
	if !reflect.DeepEqual(out.Moves, wantMoves) {
		t.Errorf("moves = %+v, want %+v", out.Moves, wantMoves)
	}
}

func TestNoEligibleNodeAndCapacityExhausted(t *testing.T) {
	in := Input{
		Pools: []Pool{pool4("none", "sick", "zero", "ghost"), pool4("full", "n1")},
		Nodes: []Node{
			{Name: "sick", Eligible: false, Reason: "NotReady", Capacity: 5},
			{Name: "zero", Eligible: true, Capacity: 0},
			{Name: "n1", Eligible: true, Capacity: 1},
		},
		Egresses: []Egress{
			eg("a", 0, "none", "192.0.2.1", ""),
			eg("b", 0, "full", "192.0.2.2", ""),
			eg("c", 1, "full", "192.0.2.3", ""),
		},
	}
	out := run(t, in)
	if p := placementOf(t, out, "a"); p.Reason != v1.ReasonNoEligibleNode || !strings.Contains(p.Message, `pool "none"`) {
		t.Errorf("a: %+v", p)
	}
	if p := placementOf(t, out, "b"); p.Node != "n1" {
		t.Errorf("b: %+v", p)
	}
	if p := placementOf(t, out, "c"); p.Reason != v1.ReasonCapacityExhausted || p.Message != `the only eligible Node of pool "full" is at capacity` {
		t.Errorf("c: %+v", p)
	}
}

// The capacity message counts the pool's eligible Nodes in words that fit
// the number: one Node is "the only eligible Node", more are "all N".
func TestCapacityExhaustedMessageCountsNodes(t *testing.T) {
	in := Input{
		Pools: []Pool{pool4("pair", "n1", "n2")},
		Nodes: nodesCap(1, "n1", "n2"),
		Egresses: []Egress{
			eg("a", 0, "pair", "192.0.2.1", ""),
			eg("b", 1, "pair", "192.0.2.2", ""),
			eg("c", 2, "pair", "192.0.2.3", ""),
		},
	}
	out := run(t, in)
	if p := placementOf(t, out, "c"); p.Reason != v1.ReasonCapacityExhausted || p.Message != `all 2 eligible Nodes of pool "pair" are at capacity` {
		t.Errorf("c: %+v", p)
	}
}

func TestStickyKeepsCurrentNode(t *testing.T) {
	in := Input{
		Pools:    []Pool{pool4("p", "n1", "n2", "n3")},
		Nodes:    nodesCap(10, "n1", "n2", "n3"),
		Egresses: []Egress{eg("a", 0, "p", "192.0.2.1", "")},
	}
	hashed := placementOf(t, run(t, in), "a").Node
	for _, cur := range []string{"n1", "n2", "n3"} {
		in.Egresses[0].CurrentNode = cur
		out := run(t, in)
		if p := placementOf(t, out, "a"); p.Node != cur || out.Moves != nil {
			t.Errorf("on %s (hashing picks %s): got %+v, moves %+v", cur, hashed, p, out.Moves)
		}
	}
}

func TestRecoveredNodeTakesNothingBack(t *testing.T) {
	in := Input{
		Pools: []Pool{pool4("p", "n1", "n2")},
		Nodes: nodesCap(10, "n1", "n2"),
	}
	for i := range 6 {
		in.Egresses = append(in.Egresses, eg(fmt.Sprintf("e%d", i), i, "p", fmt.Sprintf("192.0.2.%d", i+1), "n1"))
	}
	in.Nodes[0].Eligible, in.Nodes[0].Reason = false, "NotReady"
	down := run(t, in)
	if len(down.Moves) != 6 {
		t.Fatalf("all six should leave n1: %+v", down.Moves)
	}
	for _, m := range down.Moves {
		if m.To != "n2" || m.Reason != "NodeIneligible/NotReady" {
			t.Errorf("move %+v, want to n2 for NodeIneligible/NotReady", m)
		}
	}
	back := applyResult(in, down)
	back.Nodes[0].Eligible, back.Nodes[0].Reason = true, ""
	out := run(t, back)
	if out.Moves != nil {
		t.Errorf("n1 is back but must take nothing back: %+v", out.Moves)
	}
}

func TestMoveReasons(t *testing.T) {
	in := Input{
		Pools: []Pool{pool4("p", "ok", "cordoned", "silent", "zero", "small"), pool4("q", "ok")},
		Nodes: []Node{
			{Name: "ok", Eligible: true, Capacity: 100},
			{Name: "cordoned", Eligible: false, Reason: "Cordoned", Capacity: 10},
			{Name: "silent", Eligible: false, Capacity: 10},
			{Name: "zero", Eligible: true, Capacity: 0},
			{Name: "small", Eligible: true, Capacity: 1},
			{Name: "notinpool", Eligible: true, Capacity: 10},
		},
		Egresses: []Egress{
			eg("removed", 0, "p", "192.0.2.1", "gone"),
			eg("cordoned", 0, "p", "192.0.2.2", "cordoned"),
			eg("silent", 0, "p", "192.0.2.3", "silent"),
			eg("zero", 0, "p", "192.0.2.4", "zero"),
			eg("small-old", 0, "p", "192.0.2.5", "small"),
			eg("small-new", 1, "p", "192.0.2.6", "small"),
			eg("notinpool", 0, "q", "192.0.2.7", "notinpool"),
			eg("shared-old", 0, "p", "192.0.2.8", "ok"),
			eg("shared-new", 1, "p", "192.0.2.8", "small"),
			eg("stays", 0, "p", "192.0.2.9", "ok"),
		},
	}
	out := run(t, in)
	want := map[string]string{
		"removed":    v1.MoveNodeRemoved,
		"cordoned":   "NodeIneligible/Cordoned",
		"silent":     v1.MoveNodeIneligible,
		"zero":       v1.MoveCapacityReduced,
		"small-new":  v1.MoveCapacityReduced,
		"notinpool":  v1.MoveNodeNotInPool,
		"shared-new": v1.MoveSharedIP,
	}
	got := map[string]string{}
	for _, m := range out.Moves {
		got[m.Egress] = m.Reason
		if m.To != "ok" {
			t.Errorf("%+v: only ok has room", m)
		}
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("move reasons = %v, want %v", got, want)
	}
	if placementOf(t, out, "small-old").Node != "small" {
		t.Errorf("small-old is the older on small and stays: %+v", out.Placements)
	}
}

// Capacity counts IPs across pools.
func TestCapacityAcrossPools(t *testing.T) {
	in := Input{
		Pools: []Pool{pool4("p", "n1"), {Name: "q", Family: IPv6, EligibleNodes: []string{"n1"}}},
		Nodes: nodesCap(2, "n1"),
		Egresses: []Egress{
			eg("p1", 0, "p", "192.0.2.1", ""),
			eg("q1", 1, "q", "2001:db8::1", ""),
			eg("p2", 2, "p", "192.0.2.2", ""),
		},
	}
	out := run(t, in)
	if got := nodesOf(out); got["p1"] != "n1" || got["q1"] != "n1" || got["p2"] != "" {
		t.Errorf("n1 holds two IPs of any pool: %+v", out.Placements)
	}
}

// Property 8: a capacity change takes effect in the next pass; on a
// decrease the newest Egresses leave first, on an increase the waiting
// ones are placed and nothing moves.
func TestCapacityChangeAtRuntime(t *testing.T) {
	in := Input{
		Pools: []Pool{pool4("p", "n1", "n2")},
		Nodes: []Node{{Name: "n1", Eligible: true, Capacity: 4}, {Name: "n2", Eligible: true, Capacity: 1}},
	}
	for i := range 6 {
		in.Egresses = append(in.Egresses, eg(fmt.Sprintf("e%d", i), i, "p", fmt.Sprintf("192.0.2.%d", i+1), ""))
	}
	cur := applyResult(in, run(t, in))
	onN1 := 0
	for _, e := range cur.Egresses {
		if e.CurrentNode == "n1" {
			onN1++
		}
	}
	if onN1 != 4 {
		t.Fatalf("want n1 full with 4, got %+v", cur.Egresses)
	}

	down := cloneInput(cur)
	down.Nodes[0].Capacity = 2
	out := run(t, down)
	var left []string
	for _, m := range out.Moves {
		if m.From != "n1" || m.Reason != v1.MoveCapacityReduced {
			t.Errorf("unexpected move %+v", m)
		}
		left = append(left, m.Egress)
	}
	var n1 []string
	for _, e := range cur.Egresses {
		if e.CurrentNode == "n1" {
			n1 = append(n1, e.Name)
		}
	}
	slices.Sort(n1) // names follow creation order here
	if !reflect.DeepEqual(left, n1[2:]) {
		t.Errorf("the two newest on n1 (%v) should leave, got %v", n1[2:], left)
	}

	up := cloneInput(cur)
	up.Nodes[1].Capacity = 3
	out = run(t, up)
	if out.Moves != nil {
		t.Errorf("a capacity increase moves nothing: %+v", out.Moves)
	}
	for _, p := range out.Placements {
		if p.Node == "" {
			t.Errorf("with room for all, %s is unplaced: %+v", p.Egress, p)
		}
	}
}

// With c = 1 the bound is the exact average, so new placements are
// perfectly even; an invalid c falls back to the default.
func TestBalanceFactor(t *testing.T) {
	in := Input{
		Pools: []Pool{pool4("p", "n1", "n2", "n3", "n4")},
		Nodes: nodesCap(100, "n1", "n2", "n3", "n4"),
	}
	for i := range 12 {
		in.Egresses = append(in.Egresses, eg(fmt.Sprintf("e%02d", i), i, "p", fmt.Sprintf("192.0.2.%d", i+1), ""))
	}
	in.BalanceFactor = 1
	load := map[string]int{}
	for _, p := range run(t, in).Placements {
		load[p.Node]++
	}
	if !reflect.DeepEqual(load, map[string]int{"n1": 3, "n2": 3, "n3": 3, "n4": 3}) {
		t.Errorf("c=1: want 3 per Node, got %v", load)
	}
	in.BalanceFactor = DefaultBalanceFactor
	want := dump(run(t, in))
	for _, c := range []float64{0, -1, 0.5, math.NaN()} {
		in.BalanceFactor = c
		if got := dump(run(t, in)); got != want {
			t.Errorf("c=%v should act as the default %v", c, DefaultBalanceFactor)
		}
	}
	in.BalanceFactor = math.Inf(1)
	run(t, in) // the checker verifies the capacity-only rule
}

func TestDuplicateNodesMergeConservatively(t *testing.T) {
	a := Node{Name: "n1", Eligible: true, Capacity: 5}
	b := Node{Name: "n1", Eligible: true, Capacity: 1}
	c := Node{Name: "n2", Eligible: false, Reason: "NotReady", Capacity: 5}
	d := Node{Name: "n2", Eligible: false, Reason: "AgentDead", Capacity: 5}
	e := Node{Name: "n2", Eligible: true, Capacity: 5}
	es := []Egress{
		eg("x", 0, "p", "192.0.2.1", "n2"),
		eg("y", 1, "p", "192.0.2.2", ""),
	}
	var first string
	for _, order := range [][]Node{{a, b, c, d, e}, {e, d, c, b, a}, {c, e, a, d, b}} {
		out := run(t, Input{Pools: []Pool{pool4("p", "n1", "n2")}, Nodes: order, Egresses: es})
		if got := nodesOf(out); got["x"] != "n1" || got["y"] != "" {
			t.Errorf("n1 has capacity 1 and n2 is ineligible: %+v", out.Placements)
		}
		if len(out.Moves) != 1 || out.Moves[0].Reason != "NodeIneligible/AgentDead" {
			t.Errorf("want x to leave n2 with the smallest reason: %+v", out.Moves)
		}
		if d := dump(out); first == "" {
			first = d
		} else if d != first {
			t.Errorf("result depends on the order of duplicate Nodes")
		}
	}
}

func TestEmptyInput(t *testing.T) {
	out := run(t, Input{})
	if out.Placements == nil || len(out.Placements) != 0 || out.Moves != nil {
		t.Errorf("empty input: got %#v", out)
	}
}

// When no Node of the pool has room, the unit is refused without looking at
// the ring, and every later unit of that pool is refused too.
func TestFullPoolRefusesEveryLaterUnit(t *testing.T) {
	in := Input{
		Pools: []Pool{pool4("p", "n1", "n2", "n3")},
		Nodes: nodesCap(2, "n1", "n2", "n3"),
	}
	for i := range 20 {
		in.Egresses = append(in.Egresses, eg(fmt.Sprintf("e%02d", i), i, "p", fmt.Sprintf("192.0.2.%d", i+1), ""))
	}
	out := run(t, in)
	for i, p := range out.Placements {
		if (i < 6) != (p.Node != "") {
			t.Errorf("want the 6 oldest placed and the rest refused: %+v", p)
		}
	}
}

// Schedule keeps no shared state: concurrent passes over one input (run
// with -race) give the same result.
func TestScheduleConcurrent(t *testing.T) {
	in := benchInput(benchScenarios[1])
	want := dump(Schedule(in))
	got := make([]string, 4)
	done := make(chan int)
	for g := range got {
		go func() {
			got[g] = dump(Schedule(in))
			done <- g
		}()
	}
	for range got {
		<-done
	}
	for g, d := range got {
		if d != want {
			t.Errorf("goroutine %d got a different result", g)
		}
	}
}

// When every Node with room is at the bound (here because another pool
// filled the rest), the unit goes to a Node with the fewest units of its
// pool, wherever the hash points.
func TestPastTheBoundGoesToTheLeastLoaded(t *testing.T) {
	in := Input{
		Pools: []Pool{pool4("p", "n1", "n2", "n3", "n4"), pool4("q", "n1", "n2")},
		Nodes: []Node{
			{Name: "n1", Eligible: true, Capacity: 1},
			{Name: "n2", Eligible: true, Capacity: 1},
			{Name: "n3", Eligible: true, Capacity: 10},
			{Name: "n4", Eligible: true, Capacity: 10},
		},
		Egresses: []Egress{
			eg("q1", 0, "q", "198.51.100.1", "n1"),
			eg("q2", 0, "q", "198.51.100.2", "n2"),
			eg("p1", 1, "p", "192.0.2.1", "n3"),
			eg("p2", 1, "p", "192.0.2.2", "n3"),
			eg("p3", 1, "p", "192.0.2.3", "n4"),
		},
		BalanceFactor: 1, // bound for the 4th unit of p: ceil(4/4) = 1
	}
	for i := range 20 { // many hashes: every one must end on n4
		in := cloneInput(in)
		in.Egresses = append(in.Egresses, eg("new", 2, "p", fmt.Sprintf("192.0.2.%d", 100+i), ""))
		if got := placementOf(t, run(t, in), "new").Node; got != "n4" {
			t.Fatalf("IP %v went to %q; n4 holds fewer units of p than n3", in.Egresses[5].IP, got)
		}
	}
}

// The reference design's busiest of 10 Nodes held 1.5 times the average.
// Here, with any number of new Egresses on 10 Nodes of ample capacity, the
// busiest holds at most ceil(c × average), for the default c and for c = 1.
func TestBalanceTenNodes(t *testing.T) {
	names := make([]string, 10)
	for i := range names {
		names[i] = fmt.Sprintf("worker-%d", i)
	}
	for _, c := range []float64{DefaultBalanceFactor, 1} {
		for _, e := range []int{7, 10, 33, 100, 250, 1000} {
			in := Input{Pools: []Pool{pool4("p", names...)}, Nodes: nodesCap(1000, names...), BalanceFactor: c}
			for i := range e {
				in.Egresses = append(in.Egresses, eg(fmt.Sprintf("e%04d", i), i, "p", fmt.Sprintf("10.%d.%d.1", i/256, i%256), ""))
			}
			load := map[string]int{}
			busiest := 0
			for _, p := range run(t, in).Placements {
				load[p.Node]++
				busiest = max(busiest, load[p.Node])
			}
			if limit := int(math.Ceil(c * float64(e) / 10)); busiest > limit {
				t.Errorf("c=%v, %d Egresses: busiest Node holds %d, above ceil(c × %v) = %d", c, e, busiest, float64(e)/10, limit)
			}
		}
	}
}

// A unit with a Preferred Node takes it while that Node is below the
// balance bound and has room, and otherwise goes by the ring; a kept unit
// ignores its preference.
func TestPreferredNodeWithinTheBound(t *testing.T) {
	nodes := nodesCap(10, "n1", "n2", "n3")
	p := pool4("p", "n1", "n2", "n3")
	// Six new units all preferring n2: with c = 1.25 the bound after k
	// placements is ceil(1.25k/3), so n2 takes units while its load is
	// below it and the rest spill to the ring.
	var egs []Egress
	for i := range 6 {
		e := eg(fmt.Sprintf("e%d", i), i, "p", fmt.Sprintf("10.0.0.%d", i+1), "")
		e.Preferred = "n2"
		egs = append(egs, e)
	}
	out := run(t, Input{Pools: []Pool{p}, Nodes: nodes, Egresses: egs})
	onN2 := 0
	for _, pl := range out.Placements {
		if pl.Node == "n2" {
			onN2++
		}
	}
	// Bounds ceil(1.25k/3) for k = 1..6 are 1,1,2,2,3,3: n2 gets units 1,
	// 3 and 5 (each time its load is below the bound).
	if onN2 != 3 {
		t.Fatalf("want 3 units on the preferred Node (the balance bound), got %d: %+v", onN2, out.Placements)
	}
	if pl := placementOf(t, out, "e0"); pl.Node != "n2" {
		t.Fatalf("the first unit must take its preferred Node, got %+v", pl)
	}

	// A preference for an ineligible, full or unknown Node is ignored.
	for _, pref := range []string{"n9", "n1"} {
		ns := nodesCap(10, "n1", "n2", "n3")
		ns[0].Eligible, ns[0].Reason = false, "NotReady"
		e := eg("x", 0, "p", "10.0.0.9", "")
		e.Preferred = pref
		out := run(t, Input{Pools: []Pool{p}, Nodes: ns, Egresses: []Egress{e}})
		base := run(t, Input{Pools: []Pool{p}, Nodes: ns, Egresses: []Egress{eg("x", 0, "p", "10.0.0.9", "")}})
		if placementOf(t, out, "x") != placementOf(t, base, "x") {
			t.Fatalf("preference %q changed the placement: %+v vs %+v", pref, out.Placements, base.Placements)
		}
	}

	// Kept units stay put whatever they prefer.
	e := eg("k", 0, "p", "10.0.0.1", "n1")
	e.Preferred = "n3"
	if pl := placementOf(t, run(t, Input{Pools: []Pool{p}, Nodes: nodes, Egresses: []Egress{e}}), "k"); pl.Node != "n1" {
		t.Fatalf("a kept unit moved to its preference: %+v", pl)
	}
}

// The cached load bound equals the formula ceil(c·k/n), capped at k, for
// every k of a pass, whatever c and n.
func TestBoundCache(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := rapid.SampledFrom([]float64{1, 1.25, 1.5, 3, 1.0000001, 7.3, 1e300, math.Inf(1)}).Draw(t, "c")
		if rapid.Bool().Draw(t, "randomC") {
			c = 1 + rapid.Float64Range(0, 20).Draw(t, "c")
		}
		n := int32(rapid.IntRange(1, 5000).Draw(t, "n"))
		s := &state{c: c}
		pl := &poolRec{off: 3, end: 3 + n}
		for k := int32(1); k <= 3*n+50; k++ {
			pl.placed = k
			want := k
			if b := math.Ceil(c * float64(k) / float64(n)); b < float64(k) {
				want = int32(b)
			}
			if got := s.bound(pl); got != want {
				t.Fatalf("c=%v n=%d k=%d: bound %d, want %d", c, n, k, got, want)
			}
		}
	})
}
