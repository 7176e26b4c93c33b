package scheduler

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// goldenCases are small inputs with their whole expected Result written
// out. All but the last follow from the rules by hand (the comments say
// how); the last depends on the ring positions, so it pins the hash
// functions. Broad coverage is TestDifferential*'s job; these show the
// rules at work.
var goldenCases = []struct {
	name string
	in   Input
	want Result
}{{
	// n1 has room for one: the older Egress keeps it and the newer one
	// leaves for n2, the only other Node; an Egress on a Node that is gone
	// goes to n2 too.
	name: "sticky in priority order",
	in: Input{
		Pools: []Pool{pool4("p", "n1", "n2")},
		Nodes: []Node{{Name: "n1", Eligible: true, Capacity: 1}, {Name: "n2", Eligible: true, Capacity: 5}},
		Egresses: []Egress{
			eg("new", 2, "p", "192.0.2.2", "n1"),
			eg("old", 1, "p", "192.0.2.1", "n1"),
			eg("orphan", 3, "p", "192.0.2.3", "gone"),
		},
	},
	want: Result{
		Placements: []Placement{{Egress: "new", Node: "n2"}, {Egress: "old", Node: "n1"}, {Egress: "orphan", Node: "n2"}},
		Moves: []Move{
			{Egress: "new", From: "n1", To: "n2", Reason: v1.MoveCapacityReduced},
			{Egress: "orphan", From: "gone", To: "n2", Reason: v1.MoveNodeRemoved},
		},
	},
}, {
	// a and b share an IP: one unit, whose oldest member (a) decides the
	// Node to keep; b follows it. c's Node is cordoned.
	name: "shared IP follows its oldest member",
	in: Input{
		Pools: []Pool{pool4("p", "n1", "n2")},
		Nodes: []Node{{Name: "n1", Eligible: true, Capacity: 5}, {Name: "n2", Eligible: false, Reason: "Cordoned", Capacity: 5},
			{Name: "n3", Eligible: true, Capacity: 5}},
		Egresses: []Egress{
			eg("a", 0, "p", "192.0.2.1", "n1"),
			eg("b", 1, "p", "192.0.2.1", "n3"),
			eg("c", 2, "p", "192.0.2.2", "n2"),
		},
	},
	want: Result{
		Placements: []Placement{{Egress: "a", Node: "n1"}, {Egress: "b", Node: "n1"}, {Egress: "c", Node: "n1"}},
		Moves: []Move{
			{Egress: "b", From: "n3", To: "n1", Reason: v1.MoveNodeNotInPool},
			{Egress: "c", From: "n2", To: "n1", Reason: v1.MoveNodeIneligible + "/Cordoned"},
		},
	},
}, {
	// With c = 1 over two Nodes the bound is ceil(k/2): the preferred n2
	// takes units 1 and 3, and units 2 and 4 spill to n1, the only Node
	// below the bound then.
	name: "preferred Node within the bound",
	in: Input{
		Pools: []Pool{pool4("p", "n1", "n2")},
		Nodes: nodesCap(10, "n1", "n2"),
		Egresses: []Egress{
			{Name: "u1", Created: at(1), Pool: "p", IP: addr("192.0.2.1"), Preferred: "n2"},
			{Name: "u2", Created: at(2), Pool: "p", IP: addr("192.0.2.2"), Preferred: "n2"},
			{Name: "u3", Created: at(3), Pool: "p", IP: addr("192.0.2.3"), Preferred: "n2"},
			{Name: "u4", Created: at(4), Pool: "p", IP: addr("192.0.2.4"), Preferred: "n2"},
		},
		BalanceFactor: 1,
	},
	want: Result{
		Placements: []Placement{{Egress: "u1", Node: "n2"}, {Egress: "u2", Node: "n1"}, {Egress: "u3", Node: "n2"}, {Egress: "u4", Node: "n1"}},
	},
}, {
	// Pool q's unit keeps n1 (full); p's two kept units fill n2. Then p's
	// new units: the 3rd (bound ceil(3/3) = 1) and 4th (bound 2) go to n3
	// below the bound, the 5th goes past the bound to n3, the only Node
	// with room, and the 6th finds no room.
	name: "past the bound, then capacity exhausted",
	in: Input{
		Pools: []Pool{pool4("p", "n1", "n2", "n3"), pool4("q", "n1")},
		Nodes: []Node{{Name: "n1", Eligible: true, Capacity: 1}, {Name: "n2", Eligible: true, Capacity: 2},
			{Name: "n3", Eligible: true, Capacity: 3}},
		Egresses: []Egress{
			eg("q1", 0, "q", "198.51.100.1", "n1"),
			eg("p1", 0, "p", "192.0.2.1", "n2"),
			eg("p2", 0, "p", "192.0.2.2", "n2"),
			eg("p3", 1, "p", "192.0.2.3", ""),
			eg("p4", 2, "p", "192.0.2.4", ""),
			eg("p5", 3, "p", "192.0.2.5", ""),
			eg("p6", 4, "p", "192.0.2.6", ""),
		},
		BalanceFactor: 1,
	},
	want: Result{
		Placements: []Placement{
			{Egress: "p1", Node: "n2"}, {Egress: "p2", Node: "n2"}, {Egress: "p3", Node: "n3"}, {Egress: "p4", Node: "n3"},
			{Egress: "p5", Node: "n3"},
			{Egress: "p6", Reason: v1.ReasonCapacityExhausted, Message: `all 3 eligible Nodes of pool "p" are at capacity`},
			{Egress: "q1", Node: "n1"},
		},
	},
}, {
	name: "invalid inputs",
	in: Input{
		Pools: []Pool{pool4("p", "n1"), pool4("twice"), pool4("twice"), {Name: "v6", Family: IPv6}},
		Nodes: nodesCap(1, "n1"),
		Egresses: []Egress{
			eg("dup", 0, "p", "192.0.2.1", "n1"),
			eg("dup", 1, "p", "192.0.2.2", ""),
			eg("lost", 0, "nowhere", "192.0.2.3", "n1"),
			eg("pending", 0, "p", "", ""),
			eg("wrong", 0, "p", "2001:db8::1", ""),
			eg("zoned", 0, "v6", "fe80::1%eth0", ""),
			eg("repeated", 0, "twice", "192.0.2.4", ""),
			eg("nobody", 0, "v6", "2001:db8::2", ""),
		},
	},
	want: Result{
		Placements: []Placement{
			{Egress: "dup", Reason: v1.ReasonDuplicateEgress, Message: `Egress name "dup" is given 2 times`},
			{Egress: "lost", Reason: v1.ReasonPoolNotFound, Message: `pool "nowhere" not found`},
			{Egress: "nobody", Reason: v1.ReasonNoEligibleNode, Message: `no Node of pool "v6" is eligible with a capacity above 0`},
			{Egress: "pending", Reason: v1.ReasonIPNotAllocated, Message: "no IP has been allocated to the Egress yet"},
			{Egress: "repeated", Reason: v1.ReasonPoolInvalid, Message: `pool "twice" is given more than once`},
			{Egress: "wrong", Reason: v1.ReasonIPInvalid, Message: `IP 2001:db8::1 is not IPv4 like its pool "p"`},
			{Egress: "zoned", Reason: v1.ReasonIPInvalid, Message: "IP fe80::1%eth0 has an IPv6 zone"},
		},
		Moves: []Move{{Egress: "lost", From: "n1", Reason: v1.ReasonPoolNotFound}},
	},
}, {
	// Plain consistent hashing (c = +Inf): where each new unit lands is
	// up to the ring. These placements were taken from Schedule when this
	// test was written; a change here means new units land elsewhere
	// than before (hashString, pointHash, unitHash or pointsPerNode
	// changed), which is a change of behaviour to note in the release.
	name: "ring positions",
	in: Input{
		Pools: []Pool{pool4("p", "node-a", "node-b", "node-c")},
		Nodes: nodesCap(10, "node-a", "node-b", "node-c"),
		Egresses: []Egress{
			eg("e1", 0, "p", "192.0.2.1", ""),
			eg("e2", 0, "p", "192.0.2.2", ""),
			eg("e3", 0, "p", "192.0.2.3", ""),
			eg("e4", 0, "p", "192.0.2.4", ""),
			eg("e5", 0, "p", "192.0.2.5", ""),
		},
		BalanceFactor: math.Inf(1),
	},
	want: Result{
		Placements: []Placement{
			{Egress: "e1", Node: "node-c"}, {Egress: "e2", Node: "node-a"}, {Egress: "e3", Node: "node-a"},
			{Egress: "e4", Node: "node-a"}, {Egress: "e5", Node: "node-c"},
		},
	},
}}

// TestGoldenPlacements schedules each golden case (through run: the checker
// and the reference see it too) and compares the whole Result.
func TestGoldenPlacements(t *testing.T) {
	for _, c := range goldenCases {
		t.Run(c.name, func(t *testing.T) {
			if d := cmp.Diff(c.want, run(t, c.in)); d != "" {
				t.Errorf("Result differs (-want +got):\n%s", d)
			}
		})
	}
}
