package scheduler

import (
	"fmt"
)

// The checker's statement of the multi-IP rules (Egress.Slots). A slot is
// scheduled like a single-IP Egress that has the Egress's priority, slots
// of one Egress in slot order, and a Node holds at most one slot of an
// Egress. checkMulti checks the shape of the multi-IP Placements and Moves,
// then writes the input and Result out flat (one entry per slot, named so
// that name order is priority order: the Egress's name, a NUL byte and the
// slot number) and runs the single-IP rules on them, relaxed where a slot's
// siblings take Nodes away (checker.siblingNodes), plus the distinct-Node
// rule. It shares no code with multi.go.

func checkMulti(in Input, out Result) error {
	count := map[string]int{}
	for _, e := range in.Egresses {
		count[e.Name]++
	}
	byName := map[string]Placement{}
	for _, p := range out.Placements {
		byName[p.Egress] = p
	}
	for name := range out.Slots {
		if _, ok := byName[name]; !ok {
			return fmt.Errorf("slot placements for %q, which has no placement", name)
		}
	}
	flat := in
	flat.Egresses = nil
	var grpOf []int
	flatPl := Result{}
	for i, e := range in.Egresses {
		p := byName[e.Name]
		slots, hasSlots := out.Slots[e.Name]
		if len(e.Slots) == 0 || count[e.Name] > 1 {
			if hasSlots {
				return fmt.Errorf("Egress %q (single-IP or duplicated) has slot placements %+v", e.Name, slots)
			}
			d := e
			if len(e.Slots) > 0 {
				s := e.Slots[0]
				d.Pool, d.IP, d.CurrentNode, d.Preferred, d.Slots = s.Pool, s.IP, s.CurrentNode, s.Preferred, nil
			}
			flat.Egresses = append(flat.Egresses, d)
			grpOf = append(grpOf, -1)
			continue
		}
		if len(slots) != len(e.Slots) {
			return fmt.Errorf("Egress %q has %d slots but %d slot placements", e.Name, len(e.Slots), len(slots))
		}
		seen := map[string]int{}
		wantNode, wantReason := "", ""
		for k, sp := range slots {
			if sp.Node != "" {
				if j, dup := seen[sp.Node]; dup {
					return fmt.Errorf("Egress %q has slots %d and %d on one Node %q", e.Name, j, k, sp.Node)
				}
				seen[sp.Node] = k
				if wantNode == "" {
					wantNode = sp.Node
				}
			} else if wantReason == "" {
				wantReason = sp.Reason
			}
		}
		if p.Node != wantNode || p.Reason != wantReason {
			return fmt.Errorf("Egress %q: Node %q Reason %q, want the first placed slot's Node %q and the first unplaced one's reason %q",
				e.Name, p.Node, p.Reason, wantNode, wantReason)
		}
		for k, s := range e.Slots {
			name := e.Name + string([]byte{0, byte(k)})
			flat.Egresses = append(flat.Egresses, Egress{Name: name, Created: e.Created, Pool: s.Pool, IP: s.IP,
				CurrentNode: s.CurrentNode, Preferred: s.Preferred})
			grpOf = append(grpOf, i)
			sp := slots[k]
			flatPl.Placements = append(flatPl.Placements, Placement{Egress: name, Node: sp.Node, Reason: sp.Reason, Message: sp.Message})
		}
	}
	for _, p := range out.Placements {
		if _, ok := out.Slots[p.Egress]; !ok {
			flatPl.Placements = append(flatPl.Placements, p)
		}
	}
	sortPlacements(flatPl.Placements)
	for k, m := range out.Moves {
		if k > 0 {
			prev := out.Moves[k-1]
			if prev.Egress > m.Egress || (prev.Egress == m.Egress && prev.Slot >= m.Slot) {
				return fmt.Errorf("moves not sorted by Egress and slot at %d", k)
			}
		}
		if _, ok := out.Slots[m.Egress]; ok {
			m.Egress += string([]byte{0, byte(m.Slot)})
		} else if m.Slot != 0 {
			return fmt.Errorf("move %+v of a single-IP Egress has a slot", m)
		}
		m.Slot = 0
		flatPl.Moves = append(flatPl.Moves, m)
	}
	ck := newChecker(flat, flatPl)
	ck.grpOf = grpOf
	return ck.run()
}

// sortPlacements sorts placements by Egress name (insertion sort: the
// checker's inputs are small).
func sortPlacements(ps []Placement) {
	for i := 1; i < len(ps); i++ {
		for j := i; j > 0 && ps[j-1].Egress > ps[j].Egress; j-- {
			ps[j-1], ps[j] = ps[j], ps[j-1]
		}
	}
}
