package scheduler

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strings"
	"sync"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// nodeRec is one distinct Node. It holds no pointers (names are read
// from Input.Nodes), so the garbage collector never scans it.
type nodeRec struct {
	hash     uint64 // hashString(name)
	src      int32  // index in Input.Nodes of the first entry: its Name
	why      int32  // index in Input.Nodes whose Reason applies, -1 if eligible
	capacity int32  // clamped to [0, MaxInt32-1]
	load     int32  // units held so far in this pass
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
	// bnd is the load bound for every placed count from the last one it
	// was computed at up to bndNext-1 (see bound); bndNext 0 means none
	// is known yet.
	bnd, bndNext int32
}

// egRec is what the pass knows about Input.Egresses[i].
type egRec struct {
	unit   int32 // unit index, or -1 when the Egress is not scheduled
	cur    int32 // node index of CurrentNode, -1 when unknown or ""
	slot   int32 // global slot of cur in the Egress's pool, -1 if none
	pref   int32 // global slot of the fit Preferred Node, -1 if none
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
	unitKey
	cand    int32 // global slot of the Node to keep, or -1
	pref    int32 // global slot of the preferred Node, or -1
	node    int32 // node index after the pass, or -1
	reason  uint8 // placement reason code when node < 0
	candOut bool  // cand had no room left
	candSib bool  // cand was taken by a sibling (multi-IP Egresses)
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
	rFewerNodes
)

var reasonNames = [...]string{
	rPlaced:            "",
	rDuplicate:         v1.ReasonDuplicateEgress,
	rPoolNotFound:      v1.ReasonPoolNotFound,
	rPoolInvalid:       v1.ReasonPoolInvalid,
	rIPNotAllocated:    v1.ReasonIPNotAllocated,
	rIPInvalid:         v1.ReasonIPInvalid,
	rNoEligibleNode:    v1.ReasonNoEligibleNode,
	rCapacityExhausted: v1.ReasonCapacityExhausted,
	rFewerNodes:        v1.ReasonFewerNodesThanIPs,
}

// state is the working memory of one pass.
type state struct {
	in *Input
	c  float64

	nodes []nodeRec
	// nodeTab finds a Node by name: open addressing with linear probing
	// on the top bits of nodeRec.hash; entries are node index + 1, 0 is
	// free.
	nodeTab   []int32
	nodeShift uint
	// moveReasons caches v1.MoveNodeIneligible + "/" + Node.Reason by node.
	moveReasons map[int32]string
	pools       []poolRec
	poolIdx     map[string]int32

	// Pool members, flat: slot s is Node slotNode[s] in pool slotPool[s];
	// poolLoad[s] counts the pool's units on that Node.
	slotNode []int32
	slotPool []int32
	poolLoad []int32
	// nodeSlots[nodeSlotOff[n]:nodeSlotOff[n+1]] are Node n's slots, in
	// ascending pool index. slotPool, nodeSlotOff and nodeSlots are built
	// on first use (slotsByNode), when nodeSlotsOK is false: a cold pass
	// where no Egress names a Node and no Node fills up never needs them.
	nodeSlotOff []int32
	nodeSlots   []int32
	nodeSlotsOK bool

	eg    []egRec
	units []unitRec
	// repeats counts the Egresses whose name an earlier one in name order
	// has (so len(Egresses)-repeats Placements); withCur counts the
	// Egresses that name a CurrentNode (no Moves when it is 0).
	repeats, withCur int

	// Scratch memory kept with the state between passes (see statePool):
	// sort buffers, unit keys and table, the pools' rings.
	radix   radixScratch
	keyBuf  []keyed
	byName  []int32
	keys    []unitKey
	unitTab []int32
	seen    []int32
	done    []bool
	rings   []*ring
	// ringHashes, ringVals and ringCrowded hold a ring's point positions,
	// its members' leaf values and its buckets of more than one point while
	// it is built.
	ringHashes  []uint64
	ringVals    []int32
	ringCrowded []int32
	// ringsBuilt counts the rings of rings in use by this pass.
	ringsBuilt int

	// Multi-IP Egresses (multi.go), nil in a pass without them: grp[i] is
	// the first entry of Egress i's group or -1; a unit u's groups are
	// unitGrp[unitGrpOff[u]:unitGrpOff[u+1]]; excl and exclSlots are
	// scratch for the Nodes and pool slots a unit's siblings hold.
	grp        []int32
	unitGrpOff []int32
	unitGrp    []int32
	excl       []int32
	exclSlots  []int32
}

// statePool recycles the working memory of passes: a pass allocates only
// its Result. Pooled states hold no reference to an Input between passes.
var statePool = sync.Pool{New: func() any { return new(state) }}

// grow returns b resliced to n elements, allocating only when its capacity
// is short; the elements are not cleared, so the caller overwrites them all.
func grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}

// reuse returns b resliced to n zeroed elements, allocating only when its
// capacity is short.
func reuse[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	b = b[:n]
	clear(b)
	return b
}

// Schedule runs one scheduling pass: it decides the Node of every Egress in
// in.Egresses and reports the Egresses that leave their current Node. The
// rules are in the package documentation. Schedule does not modify in and is
// safe for concurrent use; its result depends only on the values in in, not
// on the order of its slices. Between calls it keeps nothing but recycled
// working memory (a sync.Pool), so a pass allocates about its Result only:
// two allocations, whatever the cluster's size.
func Schedule(in Input) Result {
	if hasSlots(in.Egresses) {
		ex, grp := expand(in)
		return collapse(in, schedulePass(ex, grp))
	}
	return schedulePass(in, nil)
}

// schedulePass is one pass over in, whose Egresses carry no Slots; grp is nil,
// or gives each Egress's group (see expand).
func schedulePass(in Input, grp []int32) Result {
	s := statePool.Get().(*state)
	s.in, s.c, s.ringsBuilt, s.grp = &in, in.BalanceFactor, 0, grp
	if !(s.c >= 1) { // 0, NaN, below 1
		s.c = DefaultBalanceFactor
	}
	s.indexNodes()
	s.indexPools()
	byName := s.sortNames()
	s.buildUnits(byName)
	s.keep()
	s.place()
	res := s.result(byName)
	s.release()
	return res
}

// release drops the state's references to the pass's input (names, the
// Input itself) and returns it to statePool.
func (s *state) release() {
	s.in, s.grp = nil, nil
	clear(s.moveReasons)
	clear(s.poolIdx)
	clear(s.pools[:cap(s.pools)]) // names and rings
	statePool.Put(s)
}

func (s *state) indexNodes() {
	in := s.in
	s.nodes = grow(s.nodes, len(in.Nodes))[:0]
	tabBits := bits.Len(uint(2 * len(in.Nodes)))
	s.nodeTab = reuse(s.nodeTab, 1<<tabBits)
	s.nodeShift = uint(64 - tabBits)
	for i := range in.Nodes {
		n := &in.Nodes[i]
		c := int32(min(max(n.Capacity, 0), full-1))
		why := int32(-1)
		if !n.Eligible {
			why = int32(i)
		}
		h := hashString(n.Name)
		j, at := s.lookupNode(n.Name, h)
		if j >= 0 {
			// Repeated name: keep the most restrictive view, which does
			// not depend on the order of the entries: ineligible if any
			// entry is (with the smallest Reason), the smallest capacity.
			r := &s.nodes[j]
			r.capacity = min(r.capacity, c)
			if why >= 0 && (r.why < 0 || n.Reason < in.Nodes[r.why].Reason) {
				r.why = why
			}
			continue
		}
		s.nodes = append(s.nodes, nodeRec{hash: h, src: int32(i), why: why, capacity: c})
		s.nodeTab[at] = int32(len(s.nodes))
	}
}

// lookupNode returns the index of the Node called name (whose hashString
// is h), or -1 and the free table entry where it would go.
func (s *state) lookupNode(name string, h uint64) (n int32, at uint64) {
	mask := uint64(len(s.nodeTab) - 1)
	for j := h >> s.nodeShift & mask; ; j = (j + 1) & mask {
		v := s.nodeTab[j]
		if v == 0 {
			return -1, j
		}
		if s.nodes[v-1].hash == h && s.nodeName(v-1) == name {
			return v - 1, j
		}
	}
}

// findNode returns the index of the Node called name, or -1.
func (s *state) findNode(name string) int32 {
	n, _ := s.lookupNode(name, hashString(name))
	return n
}

func (s *state) nodeName(n int32) string { return s.in.Nodes[s.nodes[n].src].Name }

func (s *state) indexPools() {
	in := s.in
	s.pools = grow(s.pools, len(in.Pools))[:0]
	if s.poolIdx == nil {
		s.poolIdx = make(map[string]int32, len(in.Pools))
	}
	for i := range in.Pools {
		p := &in.Pools[i]
		if j, ok := s.poolIdx[p.Name]; ok {
			s.pools[j].invalid = fmt.Sprintf("pool %q is given more than once", p.Name)
			continue
		}
		r := poolRec{name: p.Name, family: p.Family, salt: hashString(p.Name)}
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
	s.slotNode = grow(s.slotNode, total)[:0]
	s.seen = reuse(s.seen, len(s.nodes)) // pool index + 1 that last took the Node
	s.done = reuse(s.done, len(s.pools))
	seen, done := s.seen, s.done
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
				n := s.findNode(name)
				if n < 0 || seen[n] == pi+1 {
					continue
				}
				seen[n] = pi + 1
				if nr := &s.nodes[n]; nr.why < 0 && nr.capacity > 0 {
					s.slotNode = append(s.slotNode, n)
				}
			}
		}
		pl.end = int32(len(s.slotNode))
	}
	s.poolLoad = reuse(s.poolLoad, len(s.slotNode))
	s.nodeSlotsOK = false
}

// slotsByNode builds slotPool, nodeSlotOff and nodeSlots, once per pass.
func (s *state) slotsByNode() {
	if s.nodeSlotsOK {
		return
	}
	s.nodeSlotsOK = true
	nslots := len(s.slotNode)
	s.slotPool = grow(s.slotPool, nslots)
	for pi := range s.pools {
		for sl := s.pools[pi].off; sl < s.pools[pi].end; sl++ {
			s.slotPool[sl] = int32(pi)
		}
	}
	// Node -> slots, by counting sort over the slots.
	s.nodeSlotOff = reuse(s.nodeSlotOff, len(s.nodes)+1)
	for _, n := range s.slotNode {
		s.nodeSlotOff[n+1]++
	}
	for n := range s.nodes {
		s.nodeSlotOff[n+1] += s.nodeSlotOff[n]
	}
	s.nodeSlots = grow(s.nodeSlots, nslots)
	fill := s.seen // free after indexPools: next free index per Node
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
	s.slotsByNode()
	sl := s.nodeSlots[s.nodeSlotOff[n]:s.nodeSlotOff[n+1]]
	lo, hi := 0, len(sl) // binary search: slots ascend by pool
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if s.slotPool[sl[mid]] < p {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo < len(sl) && s.slotPool[sl[lo]] == p {
		return sl[lo]
	}
	return -1
}

// sortNames returns the indexes of the Egresses ordered by name (then
// input index, which only orders entries of the same name), marking
// duplicated names.
//
// The sort key of a name is the 12 bytes that follow the prefix all names
// share, big endian and zero-padded. Key order never contradicts name order,
// so a radix sort on the keys does most of the work; names whose keys tie
// are then put in order by comparing them.
func (s *state) sortNames() []int32 {
	eg := s.in.Egresses
	common := 0
	if len(eg) > 0 {
		first := eg[0].Name
		common = len(first)
		for i := range eg {
			n := eg[i].Name
			if strings.HasPrefix(n, first[:common]) {
				continue
			}
			c := 0
			for c < common && c < len(n) && n[c] == first[c] {
				c++
			}
			common = c
		}
	}
	s.keyBuf = grow(s.keyBuf, 2*len(eg))
	buf := s.keyBuf
	recs := buf[:len(eg)]
	const keyBits = 0xffffffff_00000000 // lo: 4 key bytes, then the index
	for i := range eg {
		hi, lo := nameKey(eg[i].Name[common:])
		recs[i] = keyed{hi: hi, lo: lo | uint64(i)}
	}
	recs = radixSort(recs, buf[len(eg):], keyBits, &s.radix)
	// Names with different keys differ, so only runs of equal keys need
	// comparing: their names are put in order, and equal names among them
	// marked duplicates.
	s.byName = grow(s.byName, len(eg))
	byName := s.byName
	s.eg = reuse(s.eg, len(eg))
	s.repeats = 0
	for k := 0; k < len(recs); {
		j := k + 1
		for j < len(recs) && recs[j].hi == recs[k].hi && recs[j].lo&keyBits == recs[k].lo&keyBits {
			j++
		}
		if j-k == 1 {
			byName[k] = recs[k].index()
			k = j
			continue
		}
		run := recs[k:j]
		slices.SortFunc(run, func(a, b keyed) int {
			if c := strings.Compare(eg[a.index()].Name, eg[b.index()].Name); c != 0 {
				return c
			}
			return cmp.Compare(a.index(), b.index())
		})
		for x, r := range run {
			byName[k+x] = r.index()
		}
		for x := 0; x < len(run); {
			y := x + 1
			for y < len(run) && eg[run[y].index()].Name == eg[run[x].index()].Name {
				y++
			}
			if y-x > 1 {
				for _, r := range run[x:y] {
					s.eg[r.index()] = egRec{unit: -1, cur: -1, reason: rDuplicate}
				}
				s.repeats += y - x - 1
			}
			x = y
		}
		k = j
	}
	return byName
}

// nameKey returns the sort key of a name whose common prefix is cut off:
// its first 12 bytes, big endian and zero-padded, as hi (bytes 0-7) and the
// top half of lo (bytes 8-11).
func nameKey(rest string) (hi, lo uint64) {
	if len(rest) >= 12 {
		_ = rest[11]
		hi = uint64(rest[0])<<56 | uint64(rest[1])<<48 | uint64(rest[2])<<40 | uint64(rest[3])<<32 |
			uint64(rest[4])<<24 | uint64(rest[5])<<16 | uint64(rest[6])<<8 | uint64(rest[7])
		lo = uint64(rest[8])<<56 | uint64(rest[9])<<48 | uint64(rest[10])<<40 | uint64(rest[11])<<32
		return hi, lo
	}
	var k [16]byte
	copy(k[:12], rest)
	return binary.BigEndian.Uint64(k[:8]), binary.BigEndian.Uint64(k[8:])
}

// sameName reports whether byName[k] repeats the name of byName[k-1].
func (s *state) sameName(byName []int32, k int) bool {
	return k > 0 && s.eg[byName[k]].reason == rDuplicate &&
		s.in.Egresses[byName[k-1]].Name == s.in.Egresses[byName[k]].Name
}

// buildUnits validates the Egresses and groups them into units.
//
// A first loop, in input order (so memory is read sequentially), checks each
// Egress against its pool, looks up its current Node and hashes its IP. A
// second loop, in priority order, creates the units: older first (creation
// time in whole seconds, then nanoseconds), then by name: the keys are
// listed in name order (byName) and radix-sorted, stably, on the time.
func (s *state) buildUnits(byName []int32) {
	eg := s.in.Egresses
	s.keys = grow(s.keys, len(eg))
	keys := s.keys
	lastPool, lastIdx := "", int32(-1)
	s.withCur = 0
	for i := range eg {
		e := &eg[i]
		r := &s.eg[i]
		if r.reason == rDuplicate {
			continue
		}
		*r = egRec{unit: -1, cur: -1, slot: -1, pref: -1}
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
			r.cur = s.findNode(e.CurrentNode)
			s.withCur++
		}
		if r.reason != rPlaced {
			continue
		}
		b := e.IP.As16()
		hi, lo := binary.BigEndian.Uint64(b[:8]), binary.BigEndian.Uint64(b[8:])
		keys[i] = unitKey{hash: unitHash(s.pools[pi].salt, hi, lo), hi: hi, lo: lo, pool: pi}
		if e.Preferred != "" {
			if n := s.findNode(e.Preferred); n >= 0 && s.nodes[n].why < 0 && s.nodes[n].capacity > 0 {
				r.pref = s.slotOf(n, pi)
			}
		}
		// The current Node's fitness for the pool.
		switch {
		case e.CurrentNode == "":
			r.curSt = curNone
		case r.cur < 0:
			r.curSt = curRemoved
		case s.nodes[r.cur].why >= 0:
			r.curSt = curIneligible
		case s.nodes[r.cur].capacity <= 0:
			r.curSt = curNoCapacity
		default:
			if r.slot = s.slotOf(r.cur, pi); r.slot < 0 {
				r.curSt = curNotInPool
			} else {
				r.curSt = curValid
			}
		}
	}

	s.keyBuf = grow(s.keyBuf, 2*len(eg))
	buf := s.keyBuf
	order := priorityKeys(eg, s.eg, byName, buf[:0])
	// order is in rank order already and the sort is stable, so sorting
	// on the creation time alone leaves equal times in rank order.
	order = radixSort(order, buf[len(eg):len(eg)+len(order)], 0xffffffff_00000000, &s.radix)
	// Units by (pool, IP): open addressing with linear probing on the
	// unit's ring hash, which place() needs anyway. The table holds
	// unit+1, 0 is free; it is at least twice the number of units.
	tblBits := bits.Len(uint(2 * len(order)))
	s.unitTab = reuse(s.unitTab, 1<<tblBits)
	s.units = groupUnits(order, keys, s.eg, s.unitTab, uint(tblBits), grow(s.units, len(order))[:0])
	if s.grp != nil {
		s.indexGroups()
	}
}

// indexGroups lists each unit's groups (unitGrpOff, unitGrp): a counting
// sort of the (unit, group) pairs of the Egresses in groups.
func (s *state) indexGroups() {
	s.unitGrpOff = reuse(s.unitGrpOff, len(s.units)+1)
	for i, g := range s.grp {
		if u := s.eg[i].unit; g >= 0 && u >= 0 {
			s.unitGrpOff[u+1]++
		}
	}
	prefixSum(s.unitGrpOff)
	s.unitGrp = grow(s.unitGrp, int(s.unitGrpOff[len(s.units)]))
	next := append(s.excl[:0], s.unitGrpOff...)
	for i, g := range s.grp {
		if u := s.eg[i].unit; g >= 0 && u >= 0 {
			s.unitGrp[next[u]] = g
			next[u]++
		}
	}
	s.excl = next[:0]
}

// siblingNodes sets s.excl to the Nodes that hold units of unit u's groups
// other than u (repeats removed).
func (s *state) siblingNodes(u int32) {
	s.excl = s.excl[:0]
	for _, g := range s.unitGrp[s.unitGrpOff[u]:s.unitGrpOff[u+1]] {
		for j := g; int(j) < len(s.grp) && s.grp[j] == g; j++ {
			uj := s.eg[j].unit
			if uj < 0 || uj == u {
				continue
			}
			if n := s.units[uj].node; n >= 0 && !slices.Contains(s.excl, n) {
				s.excl = append(s.excl, n)
			}
		}
	}
}

// priorityKeys appends to order, for each scheduled Egress in name order
// (byName), its priority sort key: creation time in whole seconds (sign
// bit flipped, so that the order of uint64 is that of int64) as hi,
// nanoseconds in lo's top half and the Egress's index as payload. The
// name order of equal times is kept by the order of appending (the sort is
// stable), not by the payload, which the sort ignores.
//
//go:noinline
func priorityKeys(eg []Egress, recs []egRec, byName []int32, order []keyed) []keyed {
	for _, i := range byName {
		if recs[i].reason != rPlaced {
			continue
		}
		t := &eg[i].Created
		order = append(order, keyed{
			hi: uint64(t.Unix()) ^ 1<<63,
			lo: uint64(t.Nanosecond())<<32 | uint64(uint32(i)),
		})
	}
	return order
}

// groupUnits creates the units of the Egresses in priority order (order,
// whose payloads are Egress indexes), appending them to units, which it
// returns: Egresses with equal keys (pool and IP) share one unit, found
// through tbl (zeroed, 1<<tblBits entries). It sets each Egress's unit and
// each unit's Node to keep and preferred Node, from its oldest member that
// has one.
//
//go:noinline
func groupUnits(order []keyed, keys []unitKey, recs []egRec, tbl []int32, tblBits uint, units []unitRec) []unitRec {
	mask := uint64(len(tbl) - 1)
	for _, o := range order {
		i := o.index()
		k := &keys[i]
		var u int32
		for j := k.hash >> (64 - tblBits&63); ; j = (j + 1) & mask {
			if v := tbl[j]; v == 0 {
				u = int32(len(units))
				tbl[j] = u + 1
				units = append(units, unitRec{unitKey: *k, cand: -1, pref: -1, node: -1})
				break
			} else if ur := &units[v-1]; ur.unitKey == *k {
				u = v - 1
				break
			}
		}
		r := &recs[i]
		r.unit = u
		// Members come in priority order, so the first fit current Node
		// is the oldest member's.
		ur := &units[u]
		if ur.cand < 0 && r.curSt == curValid {
			ur.cand = r.slot
		}
		if ur.pref < 0 {
			ur.pref = r.pref
		}
	}
	return units
}

// unitKey identifies a unit: its pool and IP, with the IP's ring hash.
type unitKey struct {
	hash   uint64 // unitHash(pool salt, hi, lo): position on the pool's ring
	hi, lo uint64 // the IP as 16 bytes, big endian
	pool   int32
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
		if s.grp != nil {
			if s.siblingNodes(int32(u)); slices.Contains(s.excl, n) {
				ur.candSib = true
				continue
			}
		}
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
		s.exclSlots = s.exclSlots[:0]
		if s.grp != nil && !s.excludeSiblings(int32(u), pl) {
			ur.reason = rFewerNodes
			continue
		}
		if pl.ring == nil {
			pl.ring = s.buildRing(ur.pool)
		}
		pl.placed++
		b := s.bound(pl)
		var sl int32
		if p := ur.pref; p >= 0 && s.poolLoad[p] < b && s.nodes[s.slotNode[p]].load < s.nodes[s.slotNode[p]].capacity &&
			!slices.Contains(s.exclSlots, p) {
			sl = p
		} else {
			for _, x := range s.exclSlots {
				pl.ring.set(x-pl.off, full)
			}
			sl = pl.ring.pick(ur.hash, b)
			for _, x := range s.exclSlots {
				pl.ring.set(x-pl.off, s.poolLoad[x])
			}
		}
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
		s.slotsByNode()
		for _, sl2 := range s.nodeSlots[s.nodeSlotOff[n]:s.nodeSlotOff[n+1]] {
			p2 := &s.pools[s.slotPool[sl2]]
			p2.room--
			if p2.ring != nil {
				p2.ring.set(sl2-p2.off, full)
			}
		}
	}
}

// excludeSiblings sets s.exclSlots to the slots of pool pl, with room, of
// the Nodes that hold unit u's siblings, and reports whether pl has a
// member with room besides them.
func (s *state) excludeSiblings(u int32, pl *poolRec) bool {
	s.siblingNodes(u)
	if len(s.excl) == 0 {
		return true
	}
	pi := s.units[u].pool
	for _, n := range s.excl {
		if nr := &s.nodes[n]; nr.load < nr.capacity {
			if sl := s.slotOf(n, pi); sl >= 0 {
				s.exclSlots = append(s.exclSlots, sl)
			}
		}
	}
	return pl.room > int32(len(s.exclSlots))
}

// bound is the most units of pool pl a Node may hold before the next
// placement spills past it: ceil(c·k/n) with k = pl.placed (counting the
// unit being placed) and n members, at least 1 and at most k.
//
// k only grows during a pass and the bound, a composition of monotone
// floating-point steps, never decreases with k, so it changes at a few
// values of k only: bound caches it with the first k where it is larger
// (found by boundAt, so every value is exactly the formula's) and divides
// a few times per change instead of once per unit.
func (s *state) bound(pl *poolRec) int32 {
	if pl.placed < pl.bndNext {
		return pl.bnd
	}
	return s.nextBound(pl)
}

// nextBound computes the bound at k = pl.placed and the next k where it
// changes, and caches both in pl.
func (s *state) nextBound(pl *poolRec) int32 {
	k := pl.placed
	b := s.boundAt(pl, k)
	pl.bnd, pl.bndNext = b, k+1
	if b >= k {
		return b // capped at k: changes with every unit
	}
	// The formula passes b near k = b·n/c: take hi a little past that
	// (or past k), check it, then search (k, hi] for the first k above b.
	est := float64(b) * float64(pl.end-pl.off) / s.c
	lo, hi := int64(k), int64(math.MaxInt32)
	if est < float64(math.MaxInt32-2) {
		hi = max(int64(est)+2, lo+1)
	}
	if s.boundAt(pl, int32(hi)) == b {
		pl.bndNext = int32(min(hi+1, math.MaxInt32))
		return b
	}
	for hi-lo > 1 { // boundAt(lo) == b < boundAt(hi)
		mid := lo + (hi-lo)/2
		if s.boundAt(pl, int32(mid)) == b {
			lo = mid
		} else {
			hi = mid
		}
	}
	pl.bndNext = int32(hi)
	return b
}

// boundAt is the load bound of pool pl when k of its units are placed:
// ceil(c·k/n), at least 1 and at most k (with k >= 1).
func (s *state) boundAt(pl *poolRec, k int32) int32 {
	kf := float64(k)
	b := math.Ceil(s.c * kf / float64(pl.end-pl.off))
	if b >= kf { // also +Inf
		return k
	}
	return int32(b)
}

func (s *state) result(byName []int32) Result {
	eg := s.in.Egresses
	nPlace, nMove := len(eg)-s.repeats, 0
	if s.withCur > 0 {
		for i := range eg {
			if s.moves(int32(i)) {
				nMove++
			}
		}
	}
	res := Result{Placements: make([]Placement, nPlace)}
	if nMove > 0 {
		res.Moves = make([]Move, 0, nMove)
	}
	var missing map[string]string // PoolNotFound messages by pool name
	j := 0
	for k, i := range byName {
		if s.repeats > 0 && s.sameName(byName, k) {
			continue
		}
		r := &s.eg[i]
		in := &eg[i]
		// Fields are stored one by one into the zeroed slice: cheaper than
		// copying a whole Placement while the garbage collector runs.
		p := &res.Placements[j]
		j++
		p.Egress = in.Name
		n := int32(-1)
		if r.unit >= 0 {
			n = s.units[r.unit].node
		}
		if n >= 0 {
			p.Node = s.nodeName(n)
		} else {
			code := r.reason
			if r.unit >= 0 {
				code = s.units[r.unit].reason
			}
			p.Reason = reasonNames[code]
			switch code {
			case rDuplicate:
				n := 1
				for k+n < len(byName) && s.sameName(byName, k+n) {
					n++
				}
				p.Message = fmt.Sprintf("Egress name %q is given %d times", in.Name, n)
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
			case rFewerNodes:
				p.Message = fewerNodesMessage(in.Pool)
			default:
				p.Message = s.poolMessage(in.Pool, code)
			}
		}
		if nMove > 0 && in.CurrentNode != "" && s.moves(i) {
			res.Moves = append(res.Moves, Move{Egress: in.Name, From: in.CurrentNode, To: p.Node, Reason: s.moveReason(r)})
		}
	}
	return res
}

// nodeOf is the node index Egress i is placed on, or -1.
func (s *state) nodeOf(i int32) int32 {
	if u := s.eg[i].unit; u >= 0 {
		return s.units[u].node
	}
	return -1
}

// moves reports whether Egress i leaves its current Node. Egresses with a
// duplicated name never do: which entry is meant is unknown.
func (s *state) moves(i int32) bool {
	r := &s.eg[i]
	if r.reason == rDuplicate || s.in.Egresses[i].CurrentNode == "" {
		return false
	}
	n := s.nodeOf(i)
	return n < 0 || n != r.cur
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
		if n := pl.end - pl.off; n == 1 {
			pl.msg = fmt.Sprintf("the only eligible Node of pool %q is at capacity", name)
		} else {
			pl.msg = fmt.Sprintf("all %d eligible Nodes of pool %q are at capacity", n, name)
		}
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
		return v1.MoveNodeRemoved
	case curIneligible:
		m, ok := s.moveReasons[r.cur]
		if !ok {
			m = v1.MoveNodeIneligible
			if why := s.in.Nodes[s.nodes[r.cur].why].Reason; why != "" {
				m += "/" + why
			}
			if s.moveReasons == nil {
				s.moveReasons = map[int32]string{}
			}
			s.moveReasons[r.cur] = m
		}
		return m
	case curNoCapacity:
		return v1.MoveCapacityReduced
	case curNotInPool:
		return v1.MoveNodeNotInPool
	}
	// curValid: the unit's kept Node was this one but had no room, or the
	// unit followed an older member to another Node.
	ur := &s.units[r.unit]
	if ur.candSib && s.slotNode[ur.cand] == r.cur {
		return v1.MoveDistinctNodes
	}
	if ur.candOut && s.slotNode[ur.cand] == r.cur {
		return v1.MoveCapacityReduced
	}
	return v1.MoveSharedIP
}
