package scheduler

import (
	"fmt"
	"strings"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// Multi-IP Egresses (Egress.Slots) are scheduled by flattening: expand
// replaces each one by one entry per slot, named after the Egress with a
// NUL byte and the slot number appended, so that the entries of one Egress
// sort right after its name and, having its creation time, keep its
// priority, in slot order. The pass then schedules the entries like
// single-IP Egresses with one more rule, that two entries of one group (one
// multi-IP Egress) never share a Node (state.siblingOn in Schedule,
// refPass.siblingNodes in the reference), and collapse folds the entries'
// Placements and Moves back into one Placement per Egress. An input
// without Slots skips both, so single-IP passes are what they were.

// maxSlots is the most slots of one Egress that are scheduled: the slot
// number is one byte of the entry's name.
const maxSlots = 255

// hasSlots reports whether some Egress is a multi-IP one.
func hasSlots(eg []Egress) bool {
	for i := range eg {
		if len(eg[i].Slots) > 0 {
			return true
		}
	}
	return false
}

// expand returns in with each multi-IP Egress replaced by its slot
// entries, and for each entry of the result the index of the first entry
// of its group (the entries of a group are contiguous), or -1 for a
// single-IP Egress. A multi-IP Egress whose name is given more than once
// becomes one entry of that name, so the pass reports it as a duplicate
// like any other.
func expand(in Input) (Input, []int32) {
	count := make(map[string]int, len(in.Egresses))
	n := 0
	for i := range in.Egresses {
		count[in.Egresses[i].Name]++
		n += max(1, min(len(in.Egresses[i].Slots), maxSlots))
	}
	out := in
	out.Egresses = make([]Egress, 0, n)
	grp := make([]int32, 0, n)
	for i := range in.Egresses {
		e := &in.Egresses[i]
		if len(e.Slots) == 0 || count[e.Name] > 1 {
			d := *e
			if len(e.Slots) > 0 {
				s := e.Slots[0]
				d.Pool, d.IP, d.CurrentNode, d.Preferred = s.Pool, s.IP, s.CurrentNode, s.Preferred
			}
			d.Slots = nil
			out.Egresses = append(out.Egresses, d)
			grp = append(grp, -1)
			continue
		}
		first := int32(len(out.Egresses))
		for k, s := range e.Slots[:min(len(e.Slots), maxSlots)] {
			out.Egresses = append(out.Egresses, Egress{
				Name:        slotName(e.Name, k),
				Created:     e.Created,
				Pool:        s.Pool,
				IP:          s.IP,
				CurrentNode: s.CurrentNode,
				Preferred:   s.Preferred,
			})
			grp = append(grp, first)
		}
	}
	return out, grp
}

// slotName is the name of slot k's entry of the Egress called name.
func slotName(name string, k int) string {
	return name + string([]byte{0, byte(k)})
}

// collapse folds the Result of the expanded input back into one Placement
// per Egress of in, sorted by name (an Egress's entries sort between its
// name and every name after it, so the order is kept), and its Moves into
// Moves with their slot numbers.
func collapse(in Input, res Result) Result {
	slots := map[string]int{}
	for i := range in.Egresses {
		if k := len(in.Egresses[i].Slots); k > 0 {
			slots[in.Egresses[i].Name] = k
		}
	}
	out := Result{Placements: make([]Placement, 0, len(res.Placements)), Slots: map[string][]SlotPlacement{}}
	for _, p := range res.Placements {
		name, k, ok := splitSlotName(p.Egress)
		if !ok {
			out.Placements = append(out.Placements, p)
			continue
		}
		if k == 0 {
			out.Placements = append(out.Placements, Placement{Egress: name})
			out.Slots[name] = make([]SlotPlacement, 0, slots[name])
		}
		ss := append(out.Slots[name], SlotPlacement{Node: p.Node, Reason: p.Reason, Message: p.Message})
		if k+1 == min(slots[name], maxSlots) {
			for j := maxSlots; j < slots[name]; j++ {
				ss = append(ss, SlotPlacement{Reason: v1.ReasonIPInvalid,
					Message: fmt.Sprintf("slot %d is past the %d slots an Egress may have", j, maxSlots)})
			}
			summarize(&out.Placements[len(out.Placements)-1], ss)
		}
		out.Slots[name] = ss
	}
	for _, m := range res.Moves {
		if name, k, ok := splitSlotName(m.Egress); ok {
			m.Egress, m.Slot = name, k
		}
		out.Moves = append(out.Moves, m)
	}
	return out
}

// summarize sets a multi-IP Placement's Node (its first slot's that has
// one) and Reason and Message (its first slot's that has no Node).
func summarize(p *Placement, slots []SlotPlacement) {
	for _, s := range slots {
		if s.Node != "" && p.Node == "" {
			p.Node = s.Node
		}
		if s.Node == "" && p.Reason == "" {
			p.Reason, p.Message = s.Reason, s.Message
		}
	}
}

// splitSlotName returns the Egress name and slot number of an entry that
// expand made, and false for any other name.
func splitSlotName(s string) (string, int, bool) {
	if len(s) < 2 || s[len(s)-2] != 0 || strings.IndexByte(s[:len(s)-2], 0) >= 0 {
		return s, 0, false
	}
	return s[:len(s)-2], int(s[len(s)-1]), true
}

// fewerNodesMessage is the message of ReasonFewerNodesThanIPs for a slot
// of pool.
func fewerNodesMessage(pool string) string {
	return fmt.Sprintf("every eligible Node of pool %q with room holds another IP of this Egress "+
		"(a Node holds at most one IP of an Egress)", pool)
}
