package scheduler

import (
	"strings"
	"testing"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// multiEg is a multi-IP Egress created sec seconds after the epoch, one
// slot per IP of pool "p" (current Nodes from cur, "" for none).
func multiEg(name string, sec int, ips []string, cur ...string) Egress {
	const pool = "p"
	e := Egress{Name: name, Created: at(sec)}
	for k, ip := range ips {
		s := Slot{Pool: pool, IP: addr(ip)}
		if k < len(cur) {
			s.CurrentNode = cur[k]
		}
		e.Slots = append(e.Slots, s)
	}
	return e
}

// Three IPs over two Nodes: two are placed on distinct Nodes, the third
// is FewerNodesThanIPs, and the Placement sums that up.
func TestMultiIPFewerNodesThanIPs(t *testing.T) {
	in := Input{Pools: []Pool{pool4("p", "n1", "n2")}, Nodes: nodesCap(10, "n1", "n2"),
		Egresses: []Egress{multiEg("m", 0, []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"})}}
	out := run(t, in)
	checkReference(t, in)
	p, ss := out.Placements[0], out.Slots["m"]
	if len(ss) != 3 || ss[0].Node == "" || ss[1].Node == "" || ss[0].Node == ss[1].Node {
		t.Fatalf("want the first two IPs on n1 and n2, got %+v", ss)
	}
	if s := ss[2]; s.Node != "" || s.Reason != v1.ReasonFewerNodesThanIPs || !strings.Contains(s.Message, `pool "p"`) {
		t.Fatalf("third IP: %+v", s)
	}
	if p.Node != ss[0].Node || p.Reason != v1.ReasonFewerNodesThanIPs {
		t.Fatalf("placement summary %+v", p)
	}
	// A third Node places it, and moves nothing.
	in2 := applyResult(in, out)
	in2.Nodes = nodesCap(10, "n1", "n2", "n3")
	in2.Pools = []Pool{pool4("p", "n1", "n2", "n3")}
	out2 := run(t, in2)
	checkReference(t, in2)
	if out2.Moves != nil || out2.Slots["m"][2].Node != "n3" || out2.Placements[0].Reason != "" {
		t.Fatalf("after adding n3: %+v, moves %+v", out2.Placements[0], out2.Moves)
	}
}

// Two IPs of one Egress that both name n1 (a stale status): the first
// keeps it, the second moves with reason DistinctNodes.
func TestMultiIPSameCurrentNode(t *testing.T) {
	in := Input{Pools: []Pool{pool4("p", "n1", "n2")}, Nodes: nodesCap(10, "n1", "n2"),
		Egresses: []Egress{multiEg("m", 0, []string{"10.0.0.1", "10.0.0.2"}, "n1", "n1")}}
	out := run(t, in)
	checkReference(t, in)
	want := []Move{{Egress: "m", Slot: 1, From: "n1", To: "n2", Reason: v1.MoveDistinctNodes}}
	if len(out.Moves) != 1 || out.Moves[0] != want[0] {
		t.Fatalf("moves %+v, want %+v", out.Moves, want)
	}
}

// An IP that a single-IP Egress and a slot share is one unit: one Node,
// and that Node is not given to another slot of the multi-IP Egress.
func TestMultiIPSharedWithSingleIP(t *testing.T) {
	in := Input{Pools: []Pool{pool4("p", "n1", "n2", "n3")}, Nodes: nodesCap(10, "n1", "n2", "n3"),
		Egresses: []Egress{eg("single", 0, "p", "10.0.0.2", "n2"),
			multiEg("mx", 1, []string{"10.0.0.1", "10.0.0.2"}, "n2")}}
	out := run(t, in)
	checkReference(t, in)
	got := nodesOf(out)
	if ss := out.Slots["mx"]; ss[1].Node != "n2" || got["single"] != "n2" || ss[0].Node == "n2" {
		t.Fatalf("placements %+v, slots %+v", out.Placements, out.Slots)
	}
}

// A multi-IP Egress whose name is given twice is a duplicate like any.
func TestMultiIPDuplicateName(t *testing.T) {
	in := Input{Pools: []Pool{pool4("p", "n1")}, Nodes: nodesCap(10, "n1"),
		Egresses: []Egress{multiEg("m", 0, []string{"10.0.0.1"}), eg("m", 0, "p", "10.0.0.2", "")}}
	out := run(t, in)
	checkReference(t, in)
	if p := out.Placements[0]; p.Reason != v1.ReasonDuplicateEgress || len(out.Slots) != 0 {
		t.Fatalf("placement %+v, slots %+v", p, out.Slots)
	}
}

// The checker catches results that break the multi-IP rules.
func TestCheckerMultiIPRejects(t *testing.T) {
	in := Input{Pools: []Pool{pool4("p", "n1", "n2", "n3")}, Nodes: nodesCap(10, "n1", "n2", "n3"),
		Egresses: []Egress{multiEg("m", 0, []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"})}}
	good := Schedule(in)
	if err := checkResult(in, good); err != nil {
		t.Fatal(err)
	}
	tamper := func(f func(p *Placement, ss []SlotPlacement) []SlotPlacement) Result {
		r := Result{Placements: []Placement{good.Placements[0]}}
		r.Slots = map[string][]SlotPlacement{"m": f(&r.Placements[0], append([]SlotPlacement(nil), good.Slots["m"]...))}
		return r
	}
	for name, bad := range map[string]Result{
		"two IPs on one Node": tamper(func(_ *Placement, ss []SlotPlacement) []SlotPlacement { ss[1].Node = ss[0].Node; return ss }),
		"slot left out": tamper(func(p *Placement, ss []SlotPlacement) []SlotPlacement {
			ss[2] = SlotPlacement{Reason: v1.ReasonFewerNodesThanIPs, Message: "x"}
			p.Reason, p.Message = v1.ReasonFewerNodesThanIPs, "x"
			return ss
		}),
		"summary Node": tamper(func(p *Placement, ss []SlotPlacement) []SlotPlacement { p.Node = ss[1].Node; return ss }),
		"slot missing": tamper(func(_ *Placement, ss []SlotPlacement) []SlotPlacement { return ss[:2] }),
		"not in pool": tamper(func(p *Placement, ss []SlotPlacement) []SlotPlacement {
			ss[0].Node, p.Node = "n9", "n9"
			return ss
		}),
		"no slots":      {Placements: good.Placements},
		"spurious move": {Placements: good.Placements, Slots: good.Slots, Moves: []Move{{Egress: "m", Slot: 1, From: "n1", To: "n2"}}},
	} {
		if err := checkResult(in, bad); err == nil {
			t.Errorf("%s: the checker accepts %+v", name, bad)
		}
	}
}
