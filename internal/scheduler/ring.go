package scheduler

import (
	"cmp"
	"math"
	"math/bits"
	"slices"
	"strings"
)

// pointsPerNode is how many points each eligible Node has on a pool's ring.
// More points even out the arcs (and so the share of new units each Node
// is offered first, and how a leaving Node's units spread) at the cost of
// a bigger ring; the load bound, not the points, is what caps the load.
const pointsPerNode = 2

// hashString hashes s for the ring and for Node lookups: 8 bytes at a
// time (little endian, the last word zero-padded), each word xored into the
// state and mixed with mix64, starting from the length so that padding
// cannot collide with real zero bytes. It is fixed, with no per-process
// seed, so hashes are the same in every process.
func hashString(s string) uint64 {
	h := uint64(len(s)) * golden
	all := s
	for len(s) >= 8 {
		h = mix64(h ^ load64(s))
		s = s[8:]
	}
	var w uint64
	switch {
	case len(s) == 0:
	case len(all) >= 8:
		// The last word, read as the 8 bytes that end the string with
		// the bytes already hashed shifted out.
		w = load64(all[len(all)-8:]) >> (8 * (8 - len(s)))
	default:
		for i := len(s) - 1; i >= 0; i-- {
			w = w<<8 | uint64(s[i])
		}
	}
	return mix64(h ^ w)
}

// load64 returns the first 8 bytes of s (which has at least 8) as a
// little-endian word.
func load64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// golden is 2^64 divided by the golden ratio, used to spread small integers.
const golden = 0x9e3779b97f4a7c15

// mix64 is a bijective 64-bit finalizer (xor-shift and multiply by odd
// constants, as in MurmurHash3's fmix64): every input bit affects every
// output bit.
func mix64(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// pointHash is the ring position of point v of a Node (nodeHash =
// hashString(name)) in the pool with the given salt. Salting by pool gives
// each pool independent arcs, so a Node that is lucky in one pool is not
// lucky in all of them.
func pointHash(nodeHash, salt uint64, v int) uint64 {
	return mix64(nodeHash ^ salt ^ uint64(v+1)*golden)
}

// unitHash is the ring position of a unit: its IP (as 16 bytes, big
// endian, hi and lo halves) in the pool with the given salt.
func unitHash(salt, hi, lo uint64) uint64 {
	return mix64(mix64(lo^salt) ^ hi)
}

// full is the leaf value of a point whose Node has no room.
const full = math.MaxInt32

// ring is one pool's consistent-hashing ring with a min segment tree over
// its points. The value of a point is the pool load of its Node (units of
// this pool on it), or full when the Node has no room at all; searching the
// tree for the first value below a threshold finds the first Node clockwise
// that is under the load bound, or that has room, in O(log points).
type ring struct {
	pts []point // ascending position
	// The points of bucket b (positions whose top bits are b, that is
	// h>>shift == b) are pts[start[b]:start[b+1]]. Positions are uniform,
	// so a bucket holds one or two points and finding a unit's place on the
	// ring is O(1) expected.
	shift uint
	start []int32
	// pos[j*pointsPerNode+v] is the index in pts of point v of the pool's
	// j-th member.
	pos  []int32
	size int     // leaves in tree: a power of two >= len(pts)
	tree []int32 // tree[1] is the root, tree[size+i] is point i
	// leaves is tree[size:size+len(pts)]: leaves[i] is the value of point i.
	leaves []int32
	// treeOK is true when the inner nodes tree[1:size] hold the minimum of
	// their leaves. The leaves are always up to date; the inner nodes are
	// computed by ensureTree the first time pick needs them, since most
	// picks find a point under the bound among the few leaves after the
	// unit's position and never look at the tree.
	treeOK bool
}

// probeLimit is how many points clockwise from a unit's position pick reads
// directly (a sequential scan of the leaves, 4 cache lines) before it falls
// back to the segment tree. Points at the load bound or full come in runs
// that stay short while a good share of the Nodes is below the bound (in
// BenchmarkSchedule's 1,000 Egresses on 1,000 Nodes, the longest scan is 36
// points and the tree is never built); when most points are blocked (Nodes
// filling up), the scan adds at most probeLimit leaf reads to a pick that
// needs the tree.
const probeLimit = 64

// point is one point of a ring: its position, the global pool slot (see
// state.slotNode) of its Node, and which of the Node's points it is.
type point struct {
	h    uint64
	slot int32
	v    int32
}

// buildRing builds the ring of pool p from the current loads.
func (s *state) buildRing(p int32) *ring {
	pl := &s.pools[p]
	m := int(pl.end - pl.off)
	n := m * pointsPerNode
	size := 1
	for size < n {
		size <<= 1
	}
	// Bucket sort by position (see ring) into n to 2n buckets: count,
	// then place each point at the end of its bucket's range.
	shift := uint(64 - bits.Len(uint(n)))
	// Rings are reused from earlier passes: the k-th ring built in a pass
	// takes the memory of the k-th ring of the pass before.
	var r *ring
	if k := s.ringsBuilt; k < len(s.rings) {
		r = s.rings[k]
	} else {
		r = new(ring)
		s.rings = append(s.rings, r)
	}
	s.ringsBuilt++
	r.pts = grow(r.pts, n)
	r.shift = shift
	r.start = reuse(r.start, 1<<(64-shift)+1)
	r.pos = grow(r.pos, n)
	r.size = size
	r.tree = grow(r.tree, 2*size)
	// The positions, hs[j*pointsPerNode+v] for point v of member j, and
	// the members' leaf values, vals[j]. A bucket that receives a second
	// point is noted in crowded (by its index b+1 in start).
	hs := grow(s.ringHashes, n)
	vals := grow(s.ringVals, m)
	start := r.start
	ringValues(s.nodes, s.slotNode[pl.off:pl.end], s.poolLoad[pl.off:pl.end], vals)
	// At most n/2 buckets get a second point.
	s.ringCrowded = grow(s.ringCrowded, n/2+1)
	crowded := s.ringCrowded[:ringPositions(s.nodes, s.slotNode[pl.off:pl.end], pl.salt, shift, hs, start, s.ringCrowded)]
	s.ringHashes, s.ringVals = hs, vals
	prefixSum(start)
	pts := r.pts
	ringScatter(hs, start, pts, shift, pl.off)
	// Each bucket's range is now start[b+1] up to start[b+2]: shift the
	// starts down by one bucket.
	copy(start, start[1:])
	start[len(start)-1] = int32(n)
	// Equal positions are ordered by Node name, then point, so the ring
	// does not depend on input order.
	tie := func(a, b point) int {
		if a.h != b.h {
			return cmp.Compare(a.h, b.h)
		}
		if c := strings.Compare(s.nodeName(s.slotNode[a.slot]), s.nodeName(s.slotNode[b.slot])); c != 0 {
			return c
		}
		return cmp.Compare(a.v, b.v)
	}
	// Only buckets with two points or more need ordering; bucket b is
	// pts[start[b]:start[b+1]].
	for _, b := range crowded {
		lo, hi := start[b-1], start[b]
		switch {
		case hi-lo == 2 && pts[lo].h < pts[lo+1].h:
		case hi-lo == 2 && pts[lo].h > pts[lo+1].h:
			pts[lo], pts[lo+1] = pts[lo+1], pts[lo]
		default:
			sortBucket(pts[lo:hi], tie)
		}
	}
	r.leaves = r.tree[size : size+n]
	ringLeaves(pts, r.pos, r.leaves, vals, pl.off)
	for i := size + n; i < 2*size; i++ {
		r.tree[i] = full
	}
	r.treeOK = false
	return r
}

// The loops of buildRing, in functions of their own (not inlined) so that
// each keeps its values in registers instead of spilling them to the stack.

// ringValues gives each member (whose Node is slotNode[j], with pool load
// poolLoad[j]) its leaf value vals[j].
//
//go:noinline
func ringValues(nodes []nodeRec, slotNode, poolLoad, vals []int32) {
	for j, n := range slotNode {
		nr := &nodes[n]
		if nr.load >= nr.capacity {
			vals[j] = full
		} else {
			vals[j] = poolLoad[j]
		}
	}
}

// ringPositions computes the ring positions hs of the members whose Nodes
// are slotNode, counts the points of each bucket (h>>shift) in
// start[bucket+1], writes the start index of every bucket that gets a
// second point to crowded and returns how many it wrote.
//
//go:noinline
func ringPositions(nodes []nodeRec, slotNode []int32, salt uint64, shift uint,
	hs []uint64, start, crowded []int32) int {
	shift &= 63
	nc := 0
	for j, n := range slotNode {
		nh := nodes[n].hash
		for v := range pointsPerNode {
			h := pointHash(nh, salt, v)
			hs[j*pointsPerNode+v] = h
			b := h>>shift + 1
			start[b]++
			if start[b] == 2 {
				crowded[nc] = int32(b)
				nc++
			}
		}
	}
	return nc
}

// prefixSum replaces each count in c by the sum of the counts up to it.
//
//go:noinline
func prefixSum(c []int32) {
	var sum int32
	for b, x := range c {
		sum += x
		c[b] = sum
	}
}

// ringScatter places point k of the ring (position hs[k], of member
// k/pointsPerNode, whose global slot is off plus that) at the end of its
// bucket's range, given by the running ends in start[bucket+1].
//
//go:noinline
func ringScatter(hs []uint64, start []int32, pts []point, shift uint, off int32) {
	shift &= 63
	for k, h := range hs {
		b := h>>shift + 1
		start[b]--
		pts[start[b]] = point{h: h, slot: off + int32(k/pointsPerNode), v: int32(k % pointsPerNode)}
	}
}

// ringLeaves records where each point of pts went (pos) and gives it its
// member's leaf value.
//
//go:noinline
func ringLeaves(pts []point, pos, leaves, vals []int32, off int32) {
	for i, pt := range pts {
		j := int(pt.slot - off)
		pos[j*pointsPerNode+int(pt.v)] = int32(i)
		leaves[i] = vals[j]
	}
}

// ensureTree computes the inner nodes of the segment tree from the leaves,
// once per ring; set keeps them up to date from then on.
func (r *ring) ensureTree() {
	if r.treeOK {
		return
	}
	for i := r.size - 1; i >= 1; i-- {
		r.tree[i] = min(r.tree[2*i], r.tree[2*i+1])
	}
	r.treeOK = true
}

// sortBucket sorts the points of one bucket with compare. A bucket holds
// about two points: they are put in position order by insertion, and
// compare (which also breaks ties) runs only on runs of equal positions. A
// crowded bucket (crafted names) goes to slices.SortFunc, so the worst case
// stays O(n log n).
func sortBucket(pts []point, compare func(a, b point) int) {
	if len(pts) > 16 {
		slices.SortFunc(pts, compare)
		return
	}
	tied := false
	for i := 1; i < len(pts); i++ {
		p := pts[i]
		j := i
		for ; j > 0 && pts[j-1].h >= p.h; j-- {
			tied = tied || pts[j-1].h == p.h
			if pts[j-1].h == p.h {
				break
			}
			pts[j] = pts[j-1]
		}
		pts[j] = p
	}
	if tied {
		slices.SortStableFunc(pts, compare)
	}
}

// lowerBound returns the index of the first point at or after position h,
// len(pts) if there is none.
func (r *ring) lowerBound(h uint64) int {
	b := h >> r.shift
	lo, hi := int(r.start[b]), int(r.start[b+1])
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if r.pts[mid].h < h {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// set gives every point of local member j the value val.
func (r *ring) set(j int32, val int32) {
	pos := r.pos[int(j)*pointsPerNode : int(j+1)*pointsPerNode]
	for _, i := range pos {
		r.leaves[i] = val
	}
	if r.treeOK {
		r.update(pos)
	}
}

// update recomputes the inner nodes above the leaves of points pos.
func (r *ring) update(pos []int32) {
	for _, i := range pos {
		k := r.size + int(i)
		for k > 1 {
			k >>= 1
			m := min(r.tree[2*k], r.tree[2*k+1])
			if r.tree[k] == m {
				break // the minimum above does not change either
			}
			r.tree[k] = m
		}
	}
}

// firstBelow returns the index of the first point at or after from whose
// value is below thr, or -1 if there is none up to the end of the ring. The
// tree must be complete (ensureTree).
func (r *ring) firstBelow(from int, thr int32) int {
	if from >= len(r.pts) {
		return -1
	}
	k := r.size + from
	for {
		if r.tree[k] < thr {
			for k < r.size {
				k <<= 1
				if r.tree[k] >= thr {
					k++
				}
			}
			return k - r.size
		}
		// Climb out of right children; past the root, nothing is left.
		for k&1 == 1 {
			k >>= 1
		}
		if k == 0 {
			return -1
		}
		k++
	}
}

// pick returns the global slot of the Node that receives a unit hashing to
// h: the first Node clockwise whose pool load is below bound if there is
// one, else the first Node clockwise with the smallest pool load among the
// Nodes with room (the root of the tree holds that minimum). The caller
// guarantees that some Node of the ring has room.
func (r *ring) pick(h uint64, bound int32) int32 {
	start := r.lowerBound(h)
	// The first point clockwise under the bound, if it is near: the same
	// answer the tree gives when some point is under the bound, and none
	// is found here when none is.
	leaves := r.leaves
	for i, k := start, min(probeLimit, len(leaves)); k > 0; k-- {
		if i == len(leaves) {
			i = 0
		}
		if leaves[i] < bound {
			return r.pts[i].slot
		}
		i++
	}
	r.ensureTree()
	thr := bound
	if least := r.tree[1]; least >= thr {
		thr = least + 1
	}
	i := r.firstBelow(start, thr)
	if i < 0 {
		i = r.firstBelow(0, thr)
	}
	return r.pts[i].slot
}
