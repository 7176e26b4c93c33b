package scheduler

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
)

// nodeRec is one distinct Node.
type nodeRec struct {
	name     string
	reason   string // Node.Reason when not eligible
	hash     uint64 // hashString(name)
	eligible bool
	capacity int32 // clamped to [0, MaxInt32-1]
	load     int32 // units held so far in this pass
	// moveReason caches MoveNodeIneligible + "/" + reason.
	moveReason string
}

// poolRec is one distinct pool name.
type poolRec struct {
	name    string
	family  Family
	invalid string // why the pool is invalid, "" if valid
	salt    uint64
	// off and end delimit the pool's members (its eligible Nodes with
	// capacity > 0) in state.slotNode: global slots off..end-1.
	off, end int32
	placed   int32 // units of the pool placed so far (kept and new)
	room     int32 // members whose Node has room
	ring     *ring // built on the first unit that needs it
	msg      string
}

// egRec is what the pass knows about Input.Egresses[i].
type egRec struct {
	unit   int32 // unit index, or -1 when the Egress is not scheduled
	cur    int32 // node index of CurrentNode, -1 when unknown or ""
	reason uint8 // placement reason code when unit < 0
	curSt  uint8 // state of CurrentNode (cur* constants)
}

// States of an Egress's CurrentNode for its pool.
const (
	curNone       uint8 = iota // CurrentNode is ""
	curRemoved                 // not in Input.Nodes
	curIneligible              // Node.Eligible is false
	curNoCapacity              // Node.Capacity <= 0
	curNotInPool               // not in the pool's EligibleNodes
	curValid                   // may hold the pool's IPs
)

// unitRec is a set of Egresses sharing one IP of one pool.
type unitRec struct {
	hi, lo  uint64 // the IP as 16 bytes
	pool    int32
	cand    int32 // global slot of the Node to keep, or -1
	node    int32 // node index after the pass, or -1
	reason  uint8 // placement reason code when node < 0
	candOut bool  // cand had no room left
}

type unitKey struct {
	pool   int32
	hi, lo uint64
}

// Placement reason codes, indexing reasonNames.
const (
	rPlaced uint8 = iota
	rDuplicate
	rPoolNotFound
	rPoolInvalid
	rIPNotAllocated
	rIPInvalid
	rNoEligibleNode
	rCapacityExhausted
)

var reasonNames = [...]string{
	rPlaced:            "",
	rDuplicate:         ReasonDuplicateEgress,
	rPoolNotFound:      ReasonPoolNotFound,
	rPoolInvalid:       ReasonPoolInvalid,
	rIPNotAllocated:    ReasonIPNotAllocated,
	rIPInvalid:         ReasonIPInvalid,
	rNoEligibleNode:    ReasonNoEligibleNode,
	rCapacityExhausted: ReasonCapacityExhausted,
}

// state is the working memory of one pass.
type state struct {
	in *Input
	c  float64

	nodes   []nodeRec
	nodeIdx map[string]int32
	pools   []poolRec
	poolIdx map[string]int32

	// Pool members, flat: slot s is Node slotNode[s] in pool slotPool[s];
	// poolLoad[s] counts the pool's units on that Node.
	slotNode []int32
	slotPool []int32
	poolLoad []int32
	// nodeSlots[nodeSlotOff[n]:nodeSlotOff[n+1]] are Node n's slots, in
	// ascending pool index.
	nodeSlotOff []int32
	nodeSlots   []int32

	eg    []egRec
	units []unitRec
}

// Schedule runs one scheduling pass: it decides the Node of every Egress in
// in.Egresses and reports the Egresses that leave their current Node. The
// rules are in the package documentation. Schedule does not modify in, keeps
// no state between calls and is safe for concurrent use; its result depends
// only on the values in in, not on the order of its slices.
func Schedule(in Input) Result {
	s := &state{in: &in, c: in.BalanceFactor}
	if !(s.c >= 1) { // 0, NaN, below 1
		s.c = DefaultBalanceFactor
	}
	s.indexNodes()
	s.indexPools()
	byName := s.sortNames()
	s.buildUnits(byName)
	s.keep()
	s.place()
	return s.result(byName)
}

func (s *state) indexNodes() {
	in := s.in
	s.nodes = make([]nodeRec, 0, len(in.Nodes))
	s.nodeIdx = make(map[string]int32, len(in.Nodes))
	for i := range in.Nodes {
		n := &in.Nodes[i]
		c := int32(min(max(n.Capacity, 0), full-1))
		if j, ok := s.nodeIdx[n.Name]; ok {
			// Repeated name: keep the most restrictive view, which does
			// not depend on the order of the entries.
			r := &s.nodes[j]
			r.capacity = min(r.capacity, c)
			if !n.Eligible {
				if r.eligible || n.Reason < r.reason {
					r.reason = n.Reason
				}
				r.eligible = false
			}
			continue
		}
		r := nodeRec{name: n.Name, hash: hashString(n.Name), eligible: n.Eligible, capacity: c}
		if !n.Eligible {
			r.reason = n.Reason
		}
		s.nodeIdx[n.Name] = int32(len(s.nodes))
		s.nodes = append(s.nodes, r)
	}
}

func (s *state) indexPools() {
	in := s.in
	s.pools = make([]poolRec, 0, len(in.Pools))
	s.poolIdx = make(map[string]int32, len(in.Pools))
	for i := range in.Pools {
		p := &in.Pools[i]
		if j, ok := s.poolIdx[p.Name]; ok {
			s.pools[j].invalid = fmt.Sprintf("pool %q is given more than once", p.Name)
			continue
		}
		r := poolRec{name: p.Name, family: p.Family, salt: mix64(hashString(p.Name))}
		if p.Family != IPv4 && p.Family != IPv6 {
			r.invalid = fmt.Sprintf("pool %q has unknown IP family %d", p.Name, int(p.Family))
		}
		s.poolIdx[p.Name] = int32(len(s.pools))
		s.pools = append(s.pools, r)
	}
	// Members: each distinct, known Node of the pool's EligibleNodes that
	// is eligible with capacity > 0. The pool's first entry in in.Pools
	// gives the list; a repeated pool is invalid anyway.
	total := 0
	for i := range in.Pools {
		total += len(in.Pools[i].EligibleNodes)
	}
	s.slotNode = make([]int32, 0, total)
	seen := make([]int32, len(s.nodes)) // pool index + 1 that last took the Node
	done := make([]bool, len(s.pools))
	for i := range in.Pools {
		p := &in.Pools[i]
		pi := s.poolIdx[p.Name]
		if done[pi] {
			continue
		}
		done[pi] = true
		pl := &s.pools[pi]
		pl.off = int32(len(s.slotNode))
		if pl.invalid == "" {
			for _, name := range p.EligibleNodes {
				n, ok := s.nodeIdx[name]
				if !ok || seen[n] == pi+1 {
					continue
				}
				seen[n] = pi + 1
				if nr := &s.nodes[n]; nr.eligible && nr.capacity > 0 {
					s.slotNode = append(s.slotNode, n)
				}
			}
		}
		pl.end = int32(len(s.slotNode))
	}
	nslots := len(s.slotNode)
	s.slotPool = make([]int32, nslots)
	s.poolLoad = make([]int32, nslots)
	for pi := range s.pools {
		for sl := s.pools[pi].off; sl < s.pools[pi].end; sl++ {
			s.slotPool[sl] = int32(pi)
		}
	}
	// Node -> slots, by counting sort over the slots.
	s.nodeSlotOff = make([]int32, len(s.nodes)+1)
	for _, n := range s.slotNode {
		s.nodeSlotOff[n+1]++
	}
	for n := range s.nodes {
		s.nodeSlotOff[n+1] += s.nodeSlotOff[n]
	}
	s.nodeSlots = make([]int32, nslots)
	fill := seen // reuse: next free index per Node
	copy(fill, s.nodeSlotOff[:len(s.nodes)])
	// Slots are visited in pool order, but pools were laid out in
	// in.Pools order, which is also ascending pool index, so each Node's
	// slots come out sorted by pool index.
	for sl, n := range s.slotNode {
		s.nodeSlots[fill[n]] = int32(sl)
		fill[n]++
	}
}

// slotOf returns Node n's slot in pool p, or -1 if n is not a member.
func (s *state) slotOf(n, p int32) int32 {
	sl := s.nodeSlots[s.nodeSlotOff[n]:s.nodeSlotOff[n+1]]
	i, ok := slices.BinarySearchFunc(sl, p, func(sl, p int32) int { return cmp.Compare(s.slotPool[sl], p) })
	if !ok {
		return -1
	}
	return sl[i]
}

// named is an Egress's name and its index in Input.Egresses.
type named struct {
	name string
	i    int32
}

// sortNames returns the Egresses ordered by name, marking duplicated names.
func (s *state) sortNames() []named {
	eg := s.in.Egresses
	byName := make([]named, len(eg))
	for i := range eg {
		byName[i] = named{eg[i].Name, int32(i)}
	}
	slices.SortFunc(byName, func(a, b named) int {
		if c := strings.Compare(a.name, b.name); c != 0 {
			return c
		}
		return cmp.Compare(a.i, b.i)
	})
	s.eg = make([]egRec, len(eg))
	for k := 0; k < len(byName); {
		j := k + 1
		for j < len(byName) && byName[j].name == byName[k].name {
			j++
		}
		if j-k > 1 {
			for _, e := range byName[k:j] {
				s.eg[e.i] = egRec{unit: -1, cur: -1, reason: rDuplicate}
			}
		}
		k = j
	}
	return byName
}

// prio orders Egresses: older first, then by name (rank in byName).
type prio struct {
	sec  int64
	nsec int32
	rank int32
}

func (s *state) buildUnits(byName []named) {
	eg := s.in.Egresses
	order := make([]prio, 0, len(eg))
	for rank, e := range byName {
		if s.eg[e.i].reason == rDuplicate {
			continue
		}
		t := eg[e.i].Created
		order = append(order, prio{t.Unix(), int32(t.Nanosecond()), int32(rank)})
	}
	slices.SortFunc(order, func(a, b prio) int {
		if a.sec != b.sec {
			return cmp.Compare(a.sec, b.sec)
		}
		if a.nsec != b.nsec {
			return cmp.Compare(a.nsec, b.nsec)
		}
		return cmp.Compare(a.rank, b.rank)
	})
	s.units = make([]unitRec, 0, len(order))
	ids := make(map[unitKey]int32, len(order))
	lastPool, lastIdx := "", int32(-1)
	for _, o := range order {
		i := byName[o.rank].i
		e := &eg[i]
		r := &s.eg[i]
		*r = egRec{unit: -1, cur: -1}
		// Validate the Egress against its pool.
		pi := lastIdx
		if pi < 0 || e.Pool != lastPool {
			var ok bool
			if pi, ok = s.poolIdx[e.Pool]; !ok {
				pi = -1
			}
			lastPool, lastIdx = e.Pool, pi
		}
		switch {
		case pi < 0:
			r.reason = rPoolNotFound
		case s.pools[pi].invalid != "":
			r.reason = rPoolInvalid
		case !e.IP.IsValid():
			r.reason = rIPNotAllocated
		case e.IP.Zone() != "" || (s.pools[pi].family == IPv4) != e.IP.Is4():
			r.reason = rIPInvalid
		}
		if e.CurrentNode != "" {
			if n, ok := s.nodeIdx[e.CurrentNode]; ok {
				r.cur = n
			}
		}
		if r.reason != rPlaced {
			continue
		}
		b := e.IP.As16()
		k := unitKey{pool: pi, hi: binary.BigEndian.Uint64(b[:8]), lo: binary.BigEndian.Uint64(b[8:])}
		u, ok := ids[k]
		if !ok {
			u = int32(len(s.units))
			ids[k] = u
			s.units = append(s.units, unitRec{hi: k.hi, lo: k.lo, pool: pi, cand: -1, node: -1})
		}
		r.unit = u
		// The current Node's fitness for the pool.
		switch {
		case e.CurrentNode == "":
			r.curSt = curNone
		case r.cur < 0:
			r.curSt = curRemoved
		case !s.nodes[r.cur].eligible:
			r.curSt = curIneligible
		case s.nodes[r.cur].capacity <= 0:
			r.curSt = curNoCapacity
		default:
			sl := s.slotOf(r.cur, pi)
			if sl < 0 {
				r.curSt = curNotInPool
				break
			}
			r.curSt = curValid
			// Members come in priority order, so the first fit current
			// Node is the oldest member's.
			if ur := &s.units[u]; ur.cand < 0 {
				ur.cand = sl
			}
		}
	}
}

// keep is phase 1: units stay on their fit current Node, in priority order,
// while it has room.
func (s *state) keep() {
	for u := range s.units {
		ur := &s.units[u]
		if ur.cand < 0 {
			continue
		}
		n := s.slotNode[ur.cand]
		nr := &s.nodes[n]
		if nr.load >= nr.capacity {
			ur.candOut = true
			continue
		}
		nr.load++
		s.poolLoad[ur.cand]++
		s.pools[ur.pool].placed++
		ur.node = n
	}
}

// place is phase 2: the other units, in priority order, by consistent
// hashing with bounded loads.
func (s *state) place() {
	for pi := range s.pools {
		pl := &s.pools[pi]
		for sl := pl.off; sl < pl.end; sl++ {
			if nr := &s.nodes[s.slotNode[sl]]; nr.load < nr.capacity {
				pl.room++
			}
		}
	}
	for u := range s.units {
		ur := &s.units[u]
		if ur.node >= 0 {
			continue
		}
		pl := &s.pools[ur.pool]
		if pl.room == 0 {
			if pl.end == pl.off {
				ur.reason = rNoEligibleNode
			} else {
				ur.reason = rCapacityExhausted
			}
			continue
		}
		if pl.ring == nil {
			pl.ring = s.buildRing(ur.pool)
		}
		pl.placed++
		sl := pl.ring.pick(unitHash(pl.salt, ur.hi, ur.lo), s.bound(pl))
		n := s.slotNode[sl]
		ur.node = n
		nr := &s.nodes[n]
		nr.load++
		s.poolLoad[sl]++
		if nr.load < nr.capacity {
			pl.ring.set(sl-pl.off, s.poolLoad[sl])
			continue
		}
		// The Node is full: it leaves every pool it is in.
		for _, sl2 := range s.nodeSlots[s.nodeSlotOff[n]:s.nodeSlotOff[n+1]] {
			p2 := &s.pools[s.slotPool[sl2]]
			p2.room--
			if p2.ring != nil {
				p2.ring.set(sl2-p2.off, full)
			}
		}
	}
}

// bound is the most units of pool pl a Node may hold before the next
// placement spills past it: ceil(c·k/n) with k = pl.placed (counting the
// unit being placed) and n members, at least 1 and at most k.
func (s *state) bound(pl *poolRec) int32 {
	k := float64(pl.placed)
	b := math.Ceil(s.c * k / float64(pl.end-pl.off))
	if b >= k { // also +Inf
		return pl.placed
	}
	return int32(b)
}

// leafValue is the ring value of slot sl: its pool load, or full.
func (s *state) leafValue(sl int32) int32 {
	if nr := &s.nodes[s.slotNode[sl]]; nr.load >= nr.capacity {
		return full
	}
	return s.poolLoad[sl]
}

func (s *state) result(byName []named) Result {
	eg := s.in.Egresses
	nPlace, nMove := 0, 0
	for k, e := range byName {
		if k > 0 && byName[k-1].name == e.name {
			continue
		}
		nPlace++
		r := &s.eg[e.i]
		if r.reason == rDuplicate || eg[e.i].CurrentNode == "" {
			continue
		}
		if r.unit < 0 || s.units[r.unit].node != r.cur || r.cur < 0 {
			nMove++
		}
	}
	res := Result{Placements: make([]Placement, 0, nPlace)}
	if nMove > 0 {
		res.Moves = make([]Move, 0, nMove)
	}
	var missing map[string]string // PoolNotFound messages by pool name
	for k, e := range byName {
		if k > 0 && byName[k-1].name == e.name {
			continue
		}
		r := &s.eg[e.i]
		in := &eg[e.i]
		p := Placement{Egress: e.name}
		code := r.reason
		node := int32(-1)
		if r.unit >= 0 {
			ur := &s.units[r.unit]
			node, code = ur.node, ur.reason
		}
		if node >= 0 {
			p.Node = s.nodes[node].name
		} else {
			p.Reason = reasonNames[code]
			switch code {
			case rDuplicate:
				n := 1
				for k+n < len(byName) && byName[k+n].name == e.name {
					n++
				}
				p.Message = fmt.Sprintf("Egress name %q is given %d times", e.name, n)
			case rPoolNotFound:
				if missing == nil {
					missing = map[string]string{}
				}
				m, ok := missing[in.Pool]
				if !ok {
					m = fmt.Sprintf("pool %q not found", in.Pool)
					missing[in.Pool] = m
				}
				p.Message = m
			case rIPNotAllocated:
				p.Message = "no IP has been allocated to the Egress yet"
			case rIPInvalid:
				p.Message = ipInvalidMessage(in, s.pools[s.poolIdx[in.Pool]].family)
			default:
				p.Message = s.poolMessage(in.Pool, code)
			}
		}
		res.Placements = append(res.Placements, p)

		if r.reason == rDuplicate || in.CurrentNode == "" || (node >= 0 && node == r.cur) {
			continue
		}
		res.Moves = append(res.Moves, Move{Egress: e.name, From: in.CurrentNode, To: p.Node, Reason: s.moveReason(r)})
	}
	return res
}

// poolMessage is the message of reason code (PoolInvalid, NoEligibleNode or
// CapacityExhausted) for pool name, built once per pool.
func (s *state) poolMessage(name string, code uint8) string {
	pl := &s.pools[s.poolIdx[name]]
	if pl.msg != "" {
		return pl.msg
	}
	switch code {
	case rPoolInvalid:
		pl.msg = pl.invalid
	case rNoEligibleNode:
		pl.msg = fmt.Sprintf("no Node of pool %q is eligible with a capacity above 0", name)
	default:
		pl.msg = fmt.Sprintf("all %d eligible Nodes of pool %q are at capacity", pl.end-pl.off, name)
	}
	return pl.msg
}

func ipInvalidMessage(e *Egress, f Family) string {
	if e.IP.Zone() != "" {
		return fmt.Sprintf("IP %s has an IPv6 zone", e.IP)
	}
	return fmt.Sprintf("IP %s is not %s like its pool %q", e.IP, f, e.Pool)
}

// moveReason says why the Egress of r leaves its current Node.
func (s *state) moveReason(r *egRec) string {
	if r.unit < 0 {
		return reasonNames[r.reason]
	}
	switch r.curSt {
	case curRemoved:
		return MoveNodeRemoved
	case curIneligible:
		nr := &s.nodes[r.cur]
		if nr.moveReason == "" {
			nr.moveReason = MoveNodeIneligible
			if nr.reason != "" {
				nr.moveReason += "/" + nr.reason
			}
		}
		return nr.moveReason
	case curNoCapacity:
		return MoveCapacityReduced
	case curNotInPool:
		return MoveNodeNotInPool
	}
	// curValid: the unit's kept Node was this one but had no room, or the
	// unit followed an older member to another Node.
	ur := &s.units[r.unit]
	if ur.candOut && s.slotNode[ur.cand] == r.cur {
		return MoveCapacityReduced
	}
	return MoveSharedIP
}
