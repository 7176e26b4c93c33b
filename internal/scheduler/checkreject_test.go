package scheduler

import (
	"math"
	"slices"
	"strings"
	"testing"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// The checker of check_test.go is only worth its passes if it can fail.
// Each case below takes a small input, checks that the checker accepts
// Schedule's Result for it, breaks that Result the way a faulty scheduler
// would, and checks that the checker rejects it for the rule broken.

// placeOn sets Egress name's placement to node (unplaced with reason when
// node is "").
func placeOn(r *Result, name, node, reason string) {
	for i := range r.Placements {
		if r.Placements[i].Egress == name {
			r.Placements[i] = Placement{Egress: name, Node: node, Reason: reason}
			if reason != "" {
				r.Placements[i].Message = "broken on purpose"
			}
		}
	}
}

// cloneResult deep-copies r.
func cloneResult(r Result) Result {
	return Result{Placements: slices.Clone(r.Placements), Moves: slices.Clone(r.Moves)}
}

func TestCheckerRejectsBrokenResults(t *testing.T) {
	cases := []struct {
		name    string
		in      Input
		corrupt func(t *testing.T, r *Result)
		want    string // in the checker's error
	}{{
		// n1 and n2 hold one IP each; c waits. Putting c on a's Node
		// gives that Node two.
		name: "capacity exceeded",
		in: Input{
			Pools:    []Pool{pool4("p", "n1", "n2")},
			Nodes:    nodesCap(1, "n1", "n2"),
			Egresses: []Egress{eg("a", 0, "p", "192.0.2.1", ""), eg("b", 1, "p", "192.0.2.2", ""), eg("c", 2, "p", "192.0.2.3", "")},
		},
		corrupt: func(t *testing.T, r *Result) { placeOn(r, "c", placementOf(t, *r, "a").Node, "") },
		want:    "holds 2 IPs, capacity 1",
	}, {
		// a and b share an IP: one unit, one Node. Sending b elsewhere
		// puts the IP on two Nodes.
		name: "same IP on two Nodes",
		in: Input{
			Pools:    []Pool{pool4("p", "n1", "n2")},
			Nodes:    nodesCap(5, "n1", "n2"),
			Egresses: []Egress{eg("a", 0, "p", "192.0.2.1", "n1"), eg("b", 1, "p", "192.0.2.1", "n1")},
		},
		corrupt: func(t *testing.T, r *Result) {
			placeOn(r, "b", "n2", "")
			r.Moves = []Move{{Egress: "b", From: "n1", To: "n2", Reason: v1.MoveSharedIP}}
		},
		want: "split",
	}, {
		// a is on n1, which has room: it stays. Moving it (with a
		// consistent Move) breaks stickiness.
		name: "sticky placement moved",
		in: Input{
			Pools:    []Pool{pool4("p", "n1", "n2")},
			Nodes:    nodesCap(5, "n1", "n2"),
			Egresses: []Egress{eg("a", 0, "p", "192.0.2.1", "n1")},
		},
		corrupt: func(t *testing.T, r *Result) {
			placeOn(r, "a", "n2", "")
			r.Moves = []Move{{Egress: "a", From: "n1", To: "n2", Reason: v1.MoveCapacityReduced}}
		},
		want: "which is not full",
	}, {
		// With c = 1 over three Nodes the bound is ceil(k/3): three new
		// units go one per Node. Stacking them on one Node passes the
		// bound while others hold none.
		name: "load over the bound",
		in: Input{
			Pools:         []Pool{pool4("p", "n1", "n2", "n3")},
			Nodes:         nodesCap(10, "n1", "n2", "n3"),
			Egresses:      []Egress{eg("a", 0, "p", "192.0.2.1", ""), eg("b", 1, "p", "192.0.2.2", ""), eg("c", 2, "p", "192.0.2.3", "")},
			BalanceFactor: 1,
		},
		corrupt: func(t *testing.T, r *Result) {
			for _, e := range []string{"a", "b", "c"} {
				placeOn(r, e, "n1", "")
			}
		},
		want: "(bound 1)",
	}, {
		// One place, two Egresses: the older one gets it. Giving it to
		// the younger one breaks priority.
		name: "younger placed before older",
		in: Input{
			Pools:    []Pool{pool4("p", "n1")},
			Nodes:    nodesCap(1, "n1"),
			Egresses: []Egress{eg("old", 0, "p", "192.0.2.1", ""), eg("young", 1, "p", "192.0.2.2", "")},
		},
		corrupt: func(t *testing.T, r *Result) {
			placeOn(r, "young", "n1", "")
			placeOn(r, "old", "", v1.ReasonCapacityExhausted)
		},
		want: "but newer unit",
	}, {
		// Same creation second: the name decides, so "a" gets the place.
		// A scheduler breaking the tie by input order could pick "b".
		name: "tie broken against the name order",
		in: Input{
			Pools:    []Pool{pool4("p", "n1")},
			Nodes:    nodesCap(1, "n1"),
			Egresses: []Egress{eg("b", 0, "p", "192.0.2.2", ""), eg("a", 0, "p", "192.0.2.1", "")},
		},
		corrupt: func(t *testing.T, r *Result) {
			placeOn(r, "b", "n1", "")
			placeOn(r, "a", "", v1.ReasonCapacityExhausted)
		},
		want: "but newer unit",
	}, {
		// Placements must come sorted by Egress name, whatever the input
		// order.
		name: "placements out of order",
		in: Input{
			Pools:    []Pool{pool4("p", "n1")},
			Nodes:    nodesCap(5, "n1"),
			Egresses: []Egress{eg("a", 0, "p", "192.0.2.1", ""), eg("b", 1, "p", "192.0.2.2", "")},
		},
		corrupt: func(t *testing.T, r *Result) { slices.Reverse(r.Placements) },
		want:    "placements not strictly sorted",
	}, {
		name: "moves out of order",
		in: Input{
			Pools:    []Pool{pool4("p", "n1")},
			Nodes:    nodesCap(5, "n1"),
			Egresses: []Egress{eg("a", 0, "p", "192.0.2.1", "gone"), eg("b", 1, "p", "192.0.2.2", "gone")},
		},
		corrupt: func(t *testing.T, r *Result) { slices.Reverse(r.Moves) },
		want:    "moves not strictly sorted",
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			good := Schedule(c.in)
			if err := checkResult(c.in, good); err != nil {
				t.Fatalf("the checker rejects Schedule's own result: %v", err)
			}
			bad := cloneResult(good)
			c.corrupt(t, &bad)
			err := checkResult(c.in, bad)
			switch {
			case err == nil:
				t.Fatalf("the checker accepts the broken result %+v", bad)
			case !strings.Contains(err.Error(), c.want):
				t.Fatalf("the checker rejects the broken result, but not for the broken rule: %v (want %q)", err, c.want)
			}
			t.Logf("rejected: %v", err)
		})
	}
}

// TestCheckerRejectsOrderDependence: checkOrderIndependent accepts
// Schedule and rejects firstFit, whose every result follows the per-input
// rules but whose Nodes depend on the order of Input.Nodes.
func TestCheckerRejectsOrderDependence(t *testing.T) {
	in := Input{
		Pools:         []Pool{pool4("p", "n1", "n2")},
		Nodes:         nodesCap(1, "n1", "n2"),
		Egresses:      []Egress{eg("a", 0, "p", "192.0.2.1", ""), eg("b", 1, "p", "192.0.2.2", "")},
		BalanceFactor: math.Inf(1), // capacity only: any one-per-Node result is right
	}
	// firstFit puts each Egress, oldest first, on the first Node in input
	// order with room (enough for this input: one pool over every Node,
	// distinct IPs, no current Nodes, room for all).
	firstFit := func(in Input) Result {
		byAge := slices.Clone(in.Egresses)
		slices.SortFunc(byAge, func(a, b Egress) int { return a.Created.Compare(b.Created) })
		load := map[string]int{}
		var out Result
		for _, e := range byAge {
			for _, n := range in.Nodes {
				if load[n.Name] < n.Capacity {
					load[n.Name]++
					out.Placements = append(out.Placements, Placement{Egress: e.Name, Node: n.Name})
					break
				}
			}
		}
		slices.SortFunc(out.Placements, func(a, b Placement) int { return strings.Compare(a.Egress, b.Egress) })
		return out
	}
	if err := checkOrderIndependent(Schedule, in); err != nil {
		t.Fatalf("Schedule: %v", err)
	}
	// Each of firstFit's results alone passes every per-input rule.
	for k := range 4 {
		r := reorder(in, k)
		if err := checkResult(r, firstFit(r)); err != nil {
			t.Fatalf("order %d: firstFit's result should pass the per-input checks: %v", k, err)
		}
	}
	err := checkOrderIndependent(firstFit, in)
	if err == nil {
		t.Fatal("checkOrderIndependent accepts firstFit, whose result depends on the order of the Nodes")
	}
	t.Logf("rejected: %v", err)
}
