package scheduler

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// genMulti draws a cluster with multi-IP Egresses: one or two IPv4 pools
// over n Nodes (all eligible, capacity ample unless tight), Egresses of
// 1 to maxK slots (distinct IPs, slots of a pool or of both), some
// single-IP Egresses among them. With spread, n > (maxK-1)·c/(c-1), so a
// slot's siblings never leave every Node of its pool at the load bound.
func genMulti(t *rapid.T, minN, maxN, maxK int, tight bool) Input {
	n := rapid.IntRange(minN, maxN).Draw(t, "nodes")
	pools := rapid.IntRange(1, 2).Draw(t, "pools")
	in := Input{}
	for p := range pools {
		in.Pools = append(in.Pools, Pool{Name: fmt.Sprintf("pool-%d", p), Family: IPv4})
	}
	capacity := 1000
	if tight {
		capacity = rapid.IntRange(1, 4).Draw(t, "capacity")
	}
	for i := range n {
		name := fmt.Sprintf("node-%02d", i)
		in.Nodes = append(in.Nodes, Node{Name: name, Eligible: true, Capacity: capacity})
		for p := range in.Pools {
			in.Pools[p].EligibleNodes = append(in.Pools[p].EligibleNodes, name)
		}
	}
	egresses := rapid.IntRange(1, 12).Draw(t, "egresses")
	ip := uint32(10 << 24)
	for e := range egresses {
		eg := Egress{Name: fmt.Sprintf("eg-%02d", e), Created: epoch.Add(time.Duration(rapid.IntRange(0, 5).Draw(t, "age")) * time.Second)}
		k := rapid.IntRange(1, maxK).Draw(t, "k")
		single := k == 1 && rapid.Bool().Draw(t, "single")
		for range k {
			ip++
			a := netip.AddrFrom4([4]byte{byte(ip >> 24), byte(ip >> 16), byte(ip >> 8), byte(ip)})
			pool := in.Pools[rapid.IntRange(0, pools-1).Draw(t, "slotPool")].Name
			if single {
				eg.Pool, eg.IP = pool, a
			} else {
				eg.Slots = append(eg.Slots, Slot{Pool: pool, IP: a})
			}
		}
		in.Egresses = append(in.Egresses, eg)
	}
	return in
}

// slotNodes maps "egress/slot" to the slot's Node, for multi-IP and
// single-IP (slot 0) Egresses alike.
func slotNodes(r Result) map[string]string {
	m := map[string]string{}
	for _, p := range r.Placements {
		if _, ok := r.Slots[p.Egress]; !ok {
			m[p.Egress+"/0"] = p.Node
		}
	}
	for name, ss := range r.Slots {
		for k, s := range ss {
			m[fmt.Sprintf("%s/%d", name, k)] = s.Node
		}
	}
	return m
}

func checked(t *rapid.T, in Input) Result {
	out := schedule(t, in)
	if err := checkResult(in, out); err != nil {
		t.Fatalf("%v\ninput %+v\nresult %+v", err, in, out)
	}
	if d := diffReference(in); d != "" {
		t.Fatalf("Schedule and the reference differ: %s", d)
	}
	return out
}

// An Egress of k IPs over n >= k eligible Nodes with room has its IPs on k
// distinct Nodes; the checker and the reference agree with every Result.
func TestPropertyMultiIPDistinctNodes(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := genMulti(t, 1, 12, 5, false)
		out := checked(t, in)
		checked(t, applyResult(in, out)) // warm
		for name, ss := range out.Slots {
			want := min(len(ss), len(in.Nodes))
			nodes := map[string]bool{}
			for _, s := range ss {
				if s.Node != "" {
					nodes[s.Node] = true
				} else if s.Reason != v1.ReasonFewerNodesThanIPs {
					t.Fatalf("%s: slot unplaced with %s while capacity is ample", name, s.Reason)
				}
			}
			if len(nodes) < want {
				t.Fatalf("%s: %d IPs on %d distinct Nodes of %d: %+v", name, len(ss), len(nodes), len(in.Nodes), ss)
			}
		}
	})
}

// Removing a Node that holds IPs moves exactly those IPs (one per Egress
// at most); every other IP keeps its Node.
func TestPropertyMultiIPRemovingANodeMovesOnlyItsIPs(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := genMulti(t, 2, 12, 4, rapid.Bool().Draw(t, "tight"))
		cur := applyResult(in, checked(t, in))
		before := slotNodes(checked(t, cur))
		x := rapid.IntRange(0, len(cur.Nodes)-1).Draw(t, "node")
		name := cur.Nodes[x].Name
		after := cloneInput(cur)
		if rapid.Bool().Draw(t, "delete") {
			after.Nodes = slices.Delete(after.Nodes, x, x+1)
		} else {
			after.Nodes[x].Eligible, after.Nodes[x].Reason = false, "NotReady"
		}
		out := checked(t, after)
		for _, m := range out.Moves {
			if m.From != name {
				t.Fatalf("removing %s moved %+v", name, m)
			}
		}
		moved := 0
		for id, n := range slotNodes(out) {
			was := before[id]
			if was == name {
				moved++
				continue
			}
			if was != "" && n != was {
				t.Fatalf("removing %s moved %s from %s to %q", name, id, was, n)
			}
		}
		if len(out.Moves) != moved {
			t.Fatalf("removing %s: %d moves for the %d IPs it held", name, len(out.Moves), moved)
		}
	})
}

// Adding a Node moves nothing.
func TestPropertyMultiIPAddingANodeMovesNothing(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := genMulti(t, 1, 10, 4, rapid.Bool().Draw(t, "tight"))
		cur := applyResult(in, checked(t, in))
		after := cloneInput(cur)
		after.Nodes = append(after.Nodes, Node{Name: "node-new", Eligible: true, Capacity: 1000})
		for i := range after.Pools {
			after.Pools[i].EligibleNodes = append(after.Pools[i].EligibleNodes, "node-new")
		}
		before := slotNodes(checked(t, cur))
		out := checked(t, after)
		if out.Moves != nil {
			t.Fatalf("adding a Node moved %+v", out.Moves)
		}
		for id, n := range slotNodes(out) {
			if was := before[id]; was != "" && n != was {
				t.Fatalf("adding a Node moved %s from %s to %s", id, was, n)
			}
		}
	})
}

// The load bound holds per IP: in a cold pass, no Node holds more than
// ceil(c·K/n) of a pool's K IPs, n being the pool's Nodes, when n is large
// enough that an IP's siblings never leave every Node at the bound
// (n > (k-1)·c/(c-1), 5·(k-1) at the default c = 1.25).
func TestPropertyMultiIPLoadBound(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		in := genMulti(t, 11, 24, 3, false)
		out := checked(t, in)
		load := map[string]map[string]int{}
		units := map[string]int{}
		pool := map[string]map[int]string{}
		for _, e := range in.Egresses {
			pool[e.Name] = map[int]string{0: e.Pool}
			for k, s := range e.Slots {
				pool[e.Name][k] = s.Pool
			}
		}
		count := func(p, node string) {
			if load[p] == nil {
				load[p] = map[string]int{}
			}
			load[p][node]++
			units[p]++
		}
		for _, p := range out.Placements {
			if _, multi := out.Slots[p.Egress]; !multi && p.Node != "" {
				count(pool[p.Egress][0], p.Node)
			}
			for k, s := range out.Slots[p.Egress] {
				if s.Node == "" {
					t.Fatalf("%s slot %d unplaced: %+v", p.Egress, k, s)
				}
				count(pool[p.Egress][k], s.Node)
			}
		}
		for p, byNode := range load {
			bound := int(math.Ceil(DefaultBalanceFactor * float64(units[p]) / float64(len(in.Nodes))))
			for node, l := range byNode {
				if l > bound {
					t.Fatalf("pool %s: Node %s holds %d of %d IPs, bound %d", p, node, l, units[p], bound)
				}
			}
		}
	})
}
