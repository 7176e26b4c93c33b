package scheduler

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"net/netip"
	"slices"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// This file is a plain reference implementation of the rules in doc.go,
// written for reading rather than speed: maps, sorts and linear scans, one
// step of the rules after the other. TestDifferential* compare it with
// Schedule on random and named inputs.
//
// The ring positions are the one thing it does not restate: it calls the
// scheduler's own hash functions (hashString, pointHash and unitHash in
// ring.go) and pointsPerNode, because the rules fix the shape of the ring
// (points per Node, positions ordered with ties broken by Node name, the
// first point at or after the unit's position) but not the hash function.
// Everything built on the positions (sorting the points, walking the ring,
// the bound, loads, capacity, Preferred Nodes, moves) is computed here.

// refNode is one Node name after merging its entries.
type refNode struct {
	eligible bool
	reason   string // the smallest Reason among the ineligible entries
	capacity int    // the smallest capacity given
	load     int    // units held, across pools
}

// refPool is one pool name.
type refPool struct {
	family  Family
	invalid string          // why the pool is invalid, "" if valid
	members map[string]bool // fit Nodes: listed, known, eligible, capacity > 0
	ring    []refPoint      // built when a unit is first placed
	load    map[string]int  // units of the pool per Node
	placed  int             // units of the pool placed so far (kept included)
}

type refPoint struct {
	h    uint64
	node string
	v    int
}

type refUnit struct {
	pool    string
	members []int  // Egress indexes, oldest first
	keep    string // current Node of the oldest member whose one is fit
	pref    string // fit Preferred Node of the oldest member naming one
	node    string // Node after the pass, "" if none
	reason  string // why node is "", when it is
	keepSib bool   // keep was not kept because a sibling holds it
}

// refPass is the state of one reference pass.
type refPass struct {
	in     Input
	c      float64             // the balance factor
	nodes  map[string]*refNode // by name
	pools  map[string]*refPool // by name
	count  map[string]int      // entries per Egress name
	units  []*refUnit          // in priority order
	unitOf map[int]*refUnit    // by Egress index; none if unschedulable
	grp    []int32             // Egress index -> its group (see expand), nil if none
}

// referenceSchedule is Schedule, restated plainly.
func referenceSchedule(in Input) Result {
	if hasSlots(in.Egresses) {
		ex, grp := expand(in)
		return collapse(in, refSchedule(ex, grp))
	}
	return refSchedule(in, nil)
}

// refSchedule is one reference pass over Egresses without Slots, grp
// giving their groups (nil when there is none).
func refSchedule(in Input, grp []int32) Result {
	r := &refPass{in: in, c: in.BalanceFactor, nodes: map[string]*refNode{}, pools: map[string]*refPool{},
		count: map[string]int{}, unitOf: map[int]*refUnit{}, grp: grp}
	if !(r.c >= 1) {
		r.c = DefaultBalanceFactor
	}
	r.index()
	r.group()
	r.keep()
	r.place()
	return r.result()
}

// index reads the Nodes, pools and Egress names.
func (r *refPass) index() {
	// Nodes: a repeated name is merged into the most restrictive view.
	for _, n := range r.in.Nodes {
		rn := r.nodes[n.Name]
		if rn == nil {
			rn = &refNode{eligible: true, capacity: n.Capacity}
			r.nodes[n.Name] = rn
		}
		rn.capacity = min(rn.capacity, n.Capacity)
		if !n.Eligible {
			if rn.eligible || n.Reason < rn.reason {
				rn.reason = n.Reason
			}
			rn.eligible = false
		}
	}
	// Pools: the first entry of a name counts; a repeated name is invalid.
	for _, p := range r.in.Pools {
		if rp := r.pools[p.Name]; rp != nil {
			rp.invalid = fmt.Sprintf("pool %q is given more than once", p.Name)
			rp.members = map[string]bool{}
			continue
		}
		rp := &refPool{family: p.Family, members: map[string]bool{}, load: map[string]int{}}
		if p.Family != IPv4 && p.Family != IPv6 {
			rp.invalid = fmt.Sprintf("pool %q has unknown IP family %d", p.Name, int(p.Family))
		} else {
			for _, name := range p.EligibleNodes {
				if n := r.nodes[name]; n != nil && n.eligible && n.capacity > 0 {
					rp.members[name] = true
				}
			}
		}
		r.pools[p.Name] = rp
	}
	for _, e := range r.in.Egresses {
		r.count[e.Name]++
	}
}

func (r *refPass) hasRoom(node string) bool { n := r.nodes[node]; return n.load < n.capacity }

// static says why Egress e cannot be scheduled whatever the Nodes, with the
// message; "" when it can be.
func (r *refPass) static(e Egress) (reason, msg string) {
	p := r.pools[e.Pool]
	switch {
	case r.count[e.Name] > 1:
		return v1.ReasonDuplicateEgress, fmt.Sprintf("Egress name %q is given %d times", e.Name, r.count[e.Name])
	case p == nil:
		return v1.ReasonPoolNotFound, fmt.Sprintf("pool %q not found", e.Pool)
	case p.invalid != "":
		return v1.ReasonPoolInvalid, p.invalid
	case !e.IP.IsValid():
		return v1.ReasonIPNotAllocated, "no IP has been allocated to the Egress yet"
	case e.IP.Zone() != "":
		return v1.ReasonIPInvalid, fmt.Sprintf("IP %s has an IPv6 zone", e.IP)
	case e.IP.Is4() != (p.family == IPv4):
		return v1.ReasonIPInvalid, fmt.Sprintf("IP %s is not %s like its pool %q", e.IP, p.family, e.Pool)
	}
	return "", ""
}

// group makes the units, in priority order: the schedulable Egresses,
// oldest first (then by name), each joining the unit of its pool and IP or
// starting one.
func (r *refPass) group() {
	var order []int
	for i, e := range r.in.Egresses {
		if reason, _ := r.static(e); reason == "" {
			order = append(order, i)
		}
	}
	eg := r.in.Egresses
	slices.SortFunc(order, func(a, b int) int {
		return cmp.Or(eg[a].Created.Compare(eg[b].Created), cmp.Compare(eg[a].Name, eg[b].Name))
	})
	type key struct {
		pool string
		ip   netip.Addr
	}
	byKey := map[key]*refUnit{}
	for _, i := range order {
		e := eg[i]
		u := byKey[key{e.Pool, e.IP}]
		if u == nil {
			u = &refUnit{pool: e.Pool}
			byKey[key{e.Pool, e.IP}] = u
			r.units = append(r.units, u)
		}
		u.members = append(u.members, i)
		r.unitOf[i] = u
		if u.keep == "" && r.pools[e.Pool].members[e.CurrentNode] {
			u.keep = e.CurrentNode
		}
		if u.pref == "" && r.pools[e.Pool].members[e.Preferred] {
			u.pref = e.Preferred
		}
	}
}

// assign puts unit u on node.
func (r *refPass) assign(u *refUnit, node string) {
	u.node = node
	r.nodes[node].load++
	r.pools[u.pool].load[node]++
	r.pools[u.pool].placed++
}

// siblingNodes is the set of Nodes holding the other units of the groups
// of u's members: a Node holds at most one IP of a multi-IP Egress.
func (r *refPass) siblingNodes(u *refUnit) map[string]bool {
	sib := map[string]bool{}
	if r.grp == nil {
		return sib
	}
	for _, i := range u.members {
		for j, g := range r.grp {
			if g >= 0 && g == r.grp[i] && r.unitOf[j] != nil && r.unitOf[j] != u && r.unitOf[j].node != "" {
				sib[r.unitOf[j].node] = true
			}
		}
	}
	return sib
}

// keep is phase 1: in priority order, a unit stays on its fit current Node
// while that Node has room and holds no sibling of the unit.
func (r *refPass) keep() {
	for _, u := range r.units {
		if u.keep == "" {
			continue
		}
		if r.siblingNodes(u)[u.keep] {
			u.keepSib = true
			continue
		}
		if r.hasRoom(u.keep) {
			r.assign(u, u.keep)
		}
	}
}

// place is phase 2: the other units, in priority order, by consistent
// hashing with bounded loads.
func (r *refPass) place() {
	for _, u := range r.units {
		if u.node != "" {
			continue
		}
		p := r.pools[u.pool]
		sib := r.siblingNodes(u)
		room, free := false, false
		for name := range p.members {
			if r.hasRoom(name) {
				room = true
				free = free || !sib[name]
			}
		}
		if !room {
			u.reason = v1.ReasonCapacityExhausted
			if len(p.members) == 0 {
				u.reason = v1.ReasonNoEligibleNode
			}
			continue
		}
		if !free {
			u.reason = v1.ReasonFewerNodesThanIPs
			continue
		}
		// The bound ceil(c·k/n), k counting the kept units and this one.
		k := p.placed + 1
		bound := k
		if b := math.Ceil(r.c * float64(k) / float64(len(p.members))); b < float64(k) {
			bound = int(b)
		}
		below := func(name string) bool { return r.hasRoom(name) && !sib[name] && p.load[name] < bound }
		ip := r.in.Egresses[u.members[0]].IP
		node := ""
		if u.pref != "" && below(u.pref) {
			node = u.pref
		} else {
			node = refPick(p, u.pool, ip, below)
		}
		if node == "" {
			// Every member with room is at the bound: the first one
			// clockwise among those holding the fewest units of the pool.
			least := math.MaxInt
			for name := range p.members {
				if r.hasRoom(name) && !sib[name] {
					least = min(least, p.load[name])
				}
			}
			node = refPick(p, u.pool, ip, func(name string) bool {
				return r.hasRoom(name) && !sib[name] && p.load[name] == least
			})
		}
		r.assign(u, node)
	}
}

// result is one Placement per name and a Move for each Egress that leaves
// its current Node, both sorted by name.
func (r *refPass) result() Result {
	res := Result{Placements: []Placement{}}
	done := map[string]bool{}
	for i, e := range r.in.Egresses {
		if done[e.Name] {
			continue
		}
		done[e.Name] = true
		pl := Placement{Egress: e.Name}
		pl.Reason, pl.Message = r.static(e)
		if u := r.unitOf[i]; u != nil {
			pl.Node, pl.Reason = u.node, u.reason
			pl.Message = refPoolMessage(u.reason, e.Pool, len(r.pools[e.Pool].members))
		}
		res.Placements = append(res.Placements, pl)
		if r.count[e.Name] == 1 && e.CurrentNode != "" && pl.Node != e.CurrentNode {
			res.Moves = append(res.Moves, Move{Egress: e.Name, From: e.CurrentNode, To: pl.Node, Reason: r.moveReason(i, pl)})
		}
	}
	slices.SortFunc(res.Placements, func(a, b Placement) int { return cmp.Compare(a.Egress, b.Egress) })
	slices.SortFunc(res.Moves, func(a, b Move) int { return cmp.Compare(a.Egress, b.Egress) })
	return res
}

// moveReason says why Egress i, placed as pl, leaves its current Node.
func (r *refPass) moveReason(i int, pl Placement) string {
	e := r.in.Egresses[i]
	n := r.nodes[e.CurrentNode]
	switch {
	case r.unitOf[i] == nil: // cannot be scheduled at all
		return pl.Reason
	case n == nil:
		return v1.MoveNodeRemoved
	case !n.eligible && n.reason == "":
		return v1.MoveNodeIneligible
	case !n.eligible:
		return v1.MoveNodeIneligible + "/" + n.reason
	case n.capacity <= 0:
		return v1.MoveCapacityReduced
	case !r.pools[e.Pool].members[e.CurrentNode]:
		return v1.MoveNodeNotInPool
	case r.unitOf[i].keep == e.CurrentNode && r.unitOf[i].keepSib: // a sibling holds it
		return v1.MoveDistinctNodes
	case r.unitOf[i].keep == e.CurrentNode: // the unit's Node to keep, full
		return v1.MoveCapacityReduced
	}
	return v1.MoveSharedIP // its unit keeps, or goes, where an older member is
}

// refPick returns the first Node clockwise on pool p's ring, from the
// position of ip, that takes the unit, or "" if none does.
func refPick(p *refPool, pool string, ip netip.Addr, takes func(node string) bool) string {
	salt := hashString(pool)
	if p.ring == nil {
		for name := range p.members {
			for v := range pointsPerNode {
				p.ring = append(p.ring, refPoint{pointHash(hashString(name), salt, v), name, v})
			}
		}
		slices.SortFunc(p.ring, func(a, b refPoint) int {
			return cmp.Or(cmp.Compare(a.h, b.h), cmp.Compare(a.node, b.node), cmp.Compare(a.v, b.v))
		})
	}
	b := ip.As16()
	h := unitHash(salt, binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:]))
	start, _ := slices.BinarySearchFunc(p.ring, h, func(pt refPoint, h uint64) int { return cmp.Compare(pt.h, h) })
	for j := range p.ring {
		if pt := p.ring[(start+j)%len(p.ring)]; takes(pt.node) {
			return pt.node
		}
	}
	return ""
}

// refPoolMessage is the message of an unplaced unit's reason.
func refPoolMessage(reason, pool string, members int) string {
	switch {
	case reason == v1.ReasonFewerNodesThanIPs:
		return fmt.Sprintf("every eligible Node of pool %q with room holds another IP of this Egress "+
			"(a Node holds at most one IP of an Egress)", pool)
	case reason == v1.ReasonNoEligibleNode:
		return fmt.Sprintf("no Node of pool %q is eligible with a capacity above 0", pool)
	case reason != v1.ReasonCapacityExhausted:
		return ""
	case members == 1:
		return fmt.Sprintf("the only eligible Node of pool %q is at capacity", pool)
	}
	return fmt.Sprintf("all %d eligible Nodes of pool %q are at capacity", members, pool)
}
