package scheduler

import (
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strings"
	"time"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// This file is an independent statement of the scheduling rules: given an
// Input and the Result of Schedule, checkResult reports the first rule the
// Result breaks. It recomputes what it needs with plain maps and loops and
// shares no code with the scheduler beyond the exported names.

type checkNode struct {
	eligible bool
	reason   string
	capacity int
}

type unitID struct {
	pool string
	ip   netip.Addr
}

// String is "pool/IP", for the checker's messages.
func (u unitID) String() string { return u.pool + "/" + u.ip.String() }

type checkUnit struct {
	id      unitID
	members []int // indexes into Input.Egresses, oldest first
	node    string
	cand    string // Node to keep: the oldest member's fit current Node
	kept    bool
	reason  string
}

// older reports whether Egress a has priority over Egress b.
func older(a, b *Egress) bool {
	if !a.Created.Equal(b.Created) {
		return a.Created.Before(b.Created)
	}
	return a.Name < b.Name
}

type checker struct {
	in        Input
	out       Result
	nodes     map[string]checkNode
	poolCount map[string]int
	pools     map[string]Pool
	fit       map[string]map[string]bool // pool -> fit Nodes
	nameCount map[string]int
	place     map[string]Placement
	units     []*checkUnit
	unitOf    map[int]*checkUnit // Egress index -> unit
	load      map[string]int     // Node -> units held
	c         float64
	// grpOf is, for a flattened multi-IP input (see checkMulti), the
	// index of the multi-IP Egress each entry is a slot of, -1 for the
	// others; nil for an input without multi-IP Egresses.
	grpOf []int
}

func newChecker(in Input, out Result) *checker {
	ck := &checker{
		in: in, out: out,
		nodes:     map[string]checkNode{},
		poolCount: map[string]int{},
		pools:     map[string]Pool{},
		fit:       map[string]map[string]bool{},
		nameCount: map[string]int{},
		place:     map[string]Placement{},
		unitOf:    map[int]*checkUnit{},
		load:      map[string]int{},
		c:         in.BalanceFactor,
	}
	if math.IsNaN(ck.c) || ck.c < 1 {
		ck.c = DefaultBalanceFactor
	}
	for _, n := range in.Nodes {
		cn, seen := ck.nodes[n.Name]
		if !seen {
			cn = checkNode{eligible: true, capacity: n.Capacity}
		}
		cn.capacity = min(cn.capacity, n.Capacity)
		if !n.Eligible {
			if cn.eligible || n.Reason < cn.reason {
				cn.reason = n.Reason
			}
			cn.eligible = false
		}
		ck.nodes[n.Name] = cn
	}
	for _, p := range in.Pools {
		ck.poolCount[p.Name]++
		if _, ok := ck.pools[p.Name]; !ok {
			ck.pools[p.Name] = p
		}
	}
	for name, p := range ck.pools {
		set := map[string]bool{}
		if ck.poolCount[name] == 1 && (p.Family == IPv4 || p.Family == IPv6) {
			for _, n := range p.EligibleNodes {
				if cn, ok := ck.nodes[n]; ok && cn.eligible && cn.capacity > 0 {
					set[n] = true
				}
			}
		}
		ck.fit[name] = set
	}
	for _, e := range in.Egresses {
		ck.nameCount[e.Name]++
	}
	return ck
}

// staticReason is the reason an Egress cannot be scheduled whatever the
// Nodes, or "".
func (ck *checker) staticReason(e *Egress) string {
	switch {
	case ck.nameCount[e.Name] > 1:
		return v1.ReasonDuplicateEgress
	case ck.poolCount[e.Pool] == 0:
		return v1.ReasonPoolNotFound
	case ck.poolCount[e.Pool] > 1:
		return v1.ReasonPoolInvalid
	}
	f := ck.pools[e.Pool].Family
	switch {
	case f != IPv4 && f != IPv6:
		return v1.ReasonPoolInvalid
	case !e.IP.IsValid():
		return v1.ReasonIPNotAllocated
	case e.IP.Zone() != "" || (f == IPv4 && !e.IP.Is4()) || (f == IPv6 && !e.IP.Is6()):
		return v1.ReasonIPInvalid
	}
	return ""
}

// fitFor reports whether Node name may hold IPs of pool.
func (ck *checker) fitFor(name, pool string) bool { return ck.fit[pool][name] }

func checkResult(in Input, out Result) error {
	for _, e := range in.Egresses {
		if len(e.Slots) > 0 {
			return checkMulti(in, out)
		}
	}
	return newChecker(in, out).run()
}

// siblingNodes is the set of Nodes that hold, in the Result, other units of
// the multi-IP Egresses that u's members are slots of; if only is not nil,
// only the units for which it is true count.
func (ck *checker) siblingNodes(u *checkUnit, only func(*checkUnit) bool) map[string]bool {
	set := map[string]bool{}
	if ck.grpOf == nil {
		return set
	}
	for _, i := range u.members {
		if ck.grpOf[i] < 0 {
			continue
		}
		for j, g := range ck.grpOf {
			w := ck.unitOf[j]
			if g == ck.grpOf[i] && w != nil && w != u && w.node != "" && (only == nil || only(w)) {
				set[w.node] = true
			}
		}
	}
	return set
}

func (ck *checker) run() error {
	for _, step := range []func() error{
		ck.checkPlacements, ck.checkUnits, ck.checkCapacity, ck.checkMaximal,
		ck.checkMoves, ck.checkKeep, ck.checkPriority, ck.checkBalance,
	} {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

func (ck *checker) checkPlacements() error {
	for i, p := range ck.out.Placements {
		if i > 0 && ck.out.Placements[i-1].Egress >= p.Egress {
			return fmt.Errorf("placements not strictly sorted at %d: %q then %q", i, ck.out.Placements[i-1].Egress, p.Egress)
		}
		ck.place[p.Egress] = p
	}
	if len(ck.place) != len(ck.nameCount) {
		return fmt.Errorf("%d placements for %d distinct Egress names", len(ck.place), len(ck.nameCount))
	}
	for i := range ck.in.Egresses {
		e := &ck.in.Egresses[i]
		p, ok := ck.place[e.Name]
		if !ok {
			return fmt.Errorf("Egress %q has no placement", e.Name)
		}
		if r := ck.staticReason(e); r != "" {
			if p.Node != "" || p.Reason != r || p.Message == "" {
				return fmt.Errorf("Egress %q: want unplaced with %s and a message, got %+v", e.Name, r, p)
			}
			continue
		}
		if p.Node != "" {
			if !ck.fitFor(p.Node, e.Pool) {
				return fmt.Errorf("Egress %q placed on %q, which is not fit for pool %q", e.Name, p.Node, e.Pool)
			}
			if p.Reason != "" || p.Message != "" {
				return fmt.Errorf("Egress %q placed with a reason: %+v", e.Name, p)
			}
			continue
		}
		want := v1.ReasonCapacityExhausted
		if len(ck.fit[e.Pool]) == 0 {
			want = v1.ReasonNoEligibleNode
		}
		if ck.grpOf != nil && ck.grpOf[i] >= 0 && p.Reason == v1.ReasonFewerNodesThanIPs && want != v1.ReasonNoEligibleNode {
			want = p.Reason // checked against the Nodes in checkMaximal
		}
		if p.Reason != want || p.Message == "" {
			return fmt.Errorf("Egress %q: want unplaced with %s and a message, got %+v", e.Name, want, p)
		}
	}
	return nil
}

// checkUnits groups the schedulable Egresses by (pool, IP) and checks that
// each group shares one fate.
func (ck *checker) checkUnits() error {
	byID := map[unitID]*checkUnit{}
	var order []int
	for i := range ck.in.Egresses {
		if ck.staticReason(&ck.in.Egresses[i]) == "" {
			order = append(order, i)
		}
	}
	slices.SortFunc(order, func(a, b int) int {
		if older(&ck.in.Egresses[a], &ck.in.Egresses[b]) {
			return -1
		}
		return 1
	})
	for _, i := range order {
		e := &ck.in.Egresses[i]
		id := unitID{e.Pool, e.IP}
		u := byID[id]
		if u == nil {
			u = &checkUnit{id: id, node: ck.place[e.Name].Node, reason: ck.place[e.Name].Reason}
			byID[id] = u
			ck.units = append(ck.units, u) // oldest member first: priority order
		}
		u.members = append(u.members, i)
		ck.unitOf[i] = u
		if p := ck.place[e.Name]; p.Node != u.node {
			return fmt.Errorf("Egresses sharing %v split: %q on %q, %q on %q",
				id, ck.in.Egresses[u.members[0]].Name, u.node, e.Name, p.Node)
		}
		if u.cand == "" && e.CurrentNode != "" && ck.fitFor(e.CurrentNode, e.Pool) {
			u.cand = e.CurrentNode
		}
	}
	for _, u := range ck.units {
		u.kept = u.cand != "" && u.node == u.cand
		if u.node != "" {
			ck.load[u.node]++
		}
	}
	return nil
}

func (ck *checker) checkCapacity() error {
	for n, l := range ck.load {
		if c := ck.nodes[n].capacity; l > c {
			return fmt.Errorf("Node %q holds %d IPs, capacity %d", n, l, c)
		}
	}
	return nil
}

func (ck *checker) checkMaximal() error {
	for _, u := range ck.units {
		if u.node != "" {
			continue
		}
		sib := ck.siblingNodes(u, nil)
		if u.reason == v1.ReasonFewerNodesThanIPs && len(sib) == 0 {
			return fmt.Errorf("unit %v unplaced with %s, but no other IP of its Egress has a Node", u.id, u.reason)
		}
		for n := range ck.fit[u.id.pool] {
			if ck.load[n] < ck.nodes[n].capacity && !sib[n] {
				return fmt.Errorf("unit %v unplaced (%s) while Node %q of its pool has room (%d of %d)",
					u.id, u.reason, n, ck.load[n], ck.nodes[n].capacity)
			}
		}
	}
	return nil
}

func (ck *checker) checkMoves() error {
	want := map[string]bool{}
	for i := range ck.in.Egresses {
		e := &ck.in.Egresses[i]
		if ck.nameCount[e.Name] == 1 && e.CurrentNode != "" && ck.place[e.Name].Node != e.CurrentNode {
			want[e.Name] = true
		}
	}
	if len(ck.out.Moves) != len(want) {
		return fmt.Errorf("%d moves, want %d", len(ck.out.Moves), len(want))
	}
	if len(want) == 0 && ck.out.Moves != nil {
		return fmt.Errorf("no move, but Moves is not nil")
	}
	idx := map[string]int{}
	for i := range ck.in.Egresses {
		idx[ck.in.Egresses[i].Name] = i
	}
	for k, m := range ck.out.Moves {
		if k > 0 && ck.out.Moves[k-1].Egress >= m.Egress {
			return fmt.Errorf("moves not strictly sorted at %d", k)
		}
		if !want[m.Egress] {
			return fmt.Errorf("unexpected move %+v", m)
		}
		i := idx[m.Egress]
		e := &ck.in.Egresses[i]
		if m.From != e.CurrentNode || m.To != ck.place[e.Name].Node {
			return fmt.Errorf("move %+v does not match Egress %+v and placement %+v", m, *e, ck.place[e.Name])
		}
		if r := ck.moveReason(i); m.Reason != r {
			return fmt.Errorf("move %+v: want reason %q", m, r)
		}
	}
	return nil
}

func (ck *checker) moveReason(i int) string {
	e := &ck.in.Egresses[i]
	if r := ck.staticReason(e); r != "" {
		return r
	}
	n, ok := ck.nodes[e.CurrentNode]
	switch {
	case !ok:
		return v1.MoveNodeRemoved
	case !n.eligible && n.reason == "":
		return v1.MoveNodeIneligible
	case !n.eligible:
		return v1.MoveNodeIneligible + "/" + n.reason
	case n.capacity <= 0:
		return v1.MoveCapacityReduced
	case !ck.fitFor(e.CurrentNode, e.Pool):
		return v1.MoveNodeNotInPool
	case ck.unitOf[i].cand == e.CurrentNode && ck.siblingNodes(ck.unitOf[i], func(w *checkUnit) bool { return w.kept })[e.CurrentNode]:
		return v1.MoveDistinctNodes
	case ck.unitOf[i].cand == e.CurrentNode:
		return v1.MoveCapacityReduced
	}
	return v1.MoveSharedIP
}

// checkKeep: a unit whose fit current Node did not keep it lost its place to
// older units that are kept there, and that Node is full.
func (ck *checker) checkKeep() error {
	for _, u := range ck.units {
		if u.cand == "" || u.kept {
			continue
		}
		me0 := &ck.in.Egresses[u.members[0]]
		if ck.siblingNodes(u, func(w *checkUnit) bool { return w.kept && older(&ck.in.Egresses[w.members[0]], me0) })[u.cand] {
			continue // an older IP of its Egress keeps that Node
		}
		if ck.load[u.cand] != ck.nodes[u.cand].capacity {
			return fmt.Errorf("unit %v left its Node %q, which is not full (%d of %d)",
				u.id, u.cand, ck.load[u.cand], ck.nodes[u.cand].capacity)
		}
		me := &ck.in.Egresses[u.members[0]]
		for _, w := range ck.units {
			if w.node != u.cand {
				continue
			}
			if !w.kept || !older(&ck.in.Egresses[w.members[0]], me) {
				return fmt.Errorf("unit %v left Node %q, where unit %v (kept %v) is not an older kept unit", u.id, u.cand, w.id, w.kept)
			}
		}
	}
	return nil
}

// checkPriority: a unit left without a Node lost only to older units (or to
// units keeping their Node).
func (ck *checker) checkPriority() error {
	for _, u := range ck.units {
		if u.node != "" {
			continue
		}
		me := &ck.in.Egresses[u.members[0]]
		sib := ck.siblingNodes(u, nil)
		for _, w := range ck.units {
			if w.node == "" || w.kept || !ck.fitFor(w.node, u.id.pool) || sib[w.node] {
				continue
			}
			if !older(&ck.in.Egresses[w.members[0]], me) {
				return fmt.Errorf("unit %v (%s) is unplaced, but newer unit %v got Node %q of its pool",
					u.id, me.Name, w.id, w.node)
			}
		}
	}
	return nil
}

// checkBalance replays the new placements in priority order on top of the
// kept units and checks the bounded-loads rule at each step: the receiving
// Node has room, and it is below ceil(c·k/n) units of the pool, or else no
// Node of the pool with room has fewer units of the pool than it.
func (ck *checker) checkBalance() error {
	load := map[string]int{}
	type poolNode struct{ pool, node string }
	poolLoad := map[poolNode]int{}
	key := func(pool, node string) poolNode { return poolNode{pool, node} }
	placed := map[string]int{}
	replayed := map[*checkUnit]bool{}
	for _, u := range ck.units {
		if u.kept {
			load[u.node]++
			poolLoad[key(u.id.pool, u.node)]++
			placed[u.id.pool]++
			replayed[u] = true
		}
	}
	for _, u := range ck.units {
		if u.kept || u.node == "" {
			continue
		}
		p := u.id.pool
		if load[u.node] >= ck.nodes[u.node].capacity {
			return fmt.Errorf("replay: unit %v placed on full Node %q", u.id, u.node)
		}
		k := placed[p] + 1
		bound := k
		if b := math.Ceil(ck.c * float64(k) / float64(len(ck.fit[p]))); b < float64(k) {
			bound = int(b)
		}
		// Nodes that hold another IP of the unit's Egress so far are not
		// candidates (multi-IP Egresses).
		sib := ck.siblingNodes(u, func(w *checkUnit) bool { return replayed[w] })
		if sib[u.node] {
			return fmt.Errorf("replay: unit %v placed on %q, which holds another IP of its Egress", u.id, u.node)
		}
		replayed[u] = true
		if at := poolLoad[key(p, u.node)]; at >= bound {
			// Past the bound: only onto a Node with the fewest units of
			// the pool among those with room (so none of them is below
			// the bound).
			for n := range ck.fit[p] {
				if load[n] < ck.nodes[n].capacity && !sib[n] && poolLoad[key(p, n)] < at {
					return fmt.Errorf("replay: unit %v went to %q at %d units of pool %q (bound %d) while %q had %d and room",
						u.id, u.node, at, p, bound, n, poolLoad[key(p, n)])
				}
			}
		}
		load[u.node]++
		poolLoad[key(p, u.node)]++
		placed[p]++
	}
	return nil
}

// checkOrderIndependent reports whether schedule gives byte-identical
// results for in and for in with every slice reordered (reversed, then
// rotated by 0 to 3 places; see reorder): a Result must depend only on the
// input values, never on their order.
func checkOrderIndependent(schedule func(Input) Result, in Input) error {
	want := dump(schedule(in))
	for k := range 4 {
		if got := dump(schedule(reorder(in, k))); got != want {
			return fmt.Errorf("input reversed and rotated by %d gives a different result:\n got %s\nwant %s", k, got, want)
		}
	}
	return nil
}

// cloneInput deep-copies in, so tests can check that Schedule leaves its
// input alone.
func cloneInput(in Input) Input {
	out := in
	out.Pools = slices.Clone(in.Pools)
	for i := range out.Pools {
		out.Pools[i].EligibleNodes = slices.Clone(in.Pools[i].EligibleNodes)
	}
	out.Nodes = slices.Clone(in.Nodes)
	out.Egresses = slices.Clone(in.Egresses)
	for i := range out.Egresses {
		out.Egresses[i].Slots = slices.Clone(in.Egresses[i].Slots)
	}
	return out
}

// applyResult returns a copy of in whose Egresses' CurrentNode is the Node
// of their placement: the cluster after the controller wrote the Result.
func applyResult(in Input, r Result) Input {
	out := cloneInput(in)
	node := map[string]string{}
	slots := r.Slots
	for _, p := range r.Placements {
		node[p.Egress] = p.Node
	}
	for i := range out.Egresses {
		e := &out.Egresses[i]
		e.CurrentNode = node[e.Name]
		for k := range e.Slots {
			e.Slots[k].CurrentNode = ""
			if sp := slots[e.Name]; k < len(sp) {
				e.Slots[k].CurrentNode = sp[k].Node
			}
		}
	}
	return out
}

// nodesOf maps each Egress name to its placed Node ("" when unplaced).
func nodesOf(r Result) map[string]string {
	m := make(map[string]string, len(r.Placements))
	for _, p := range r.Placements {
		m[p.Egress] = p.Node
	}
	return m
}

// dump is a byte-exact rendering of a Result, for determinism checks.
func dump(r Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%#v", r)
	return b.String()
}

var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
