package ipam

import "slices"

// maxBlock is the most runs a block of a runSet holds by default. Inserting
// into or deleting from a block moves at most this many runs (32 bytes
// each).
const maxBlock = 256

// runSet is a set of addresses stored as maximal runs of consecutive
// addresses (sorted, disjoint, non-adjacent spans), kept in blocks of at most
// maxBlock runs so that an insertion or deletion copies one small block
// rather than every run after it. No block is empty.
type runSet struct {
	blocks [][]span
	max    int    // most runs per block; 0 means maxBlock (tests set it low)
	spare  []span // storage of the last emptied block, reused by insertAt
}

func (s *runSet) limit() int {
	if s.max > 0 {
		return s.max
	}
	return maxBlock
}

// pos is the position of a run: block b, index i.
type pos struct{ b, i int }

// floor returns the position of the last run starting at or before u, and
// false if every run starts after u.
func (s *runSet) floor(u u128) (pos, bool) {
	// b is the first block whose first run starts after u.
	lo, hi := 0, len(s.blocks)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if u.less(s.blocks[m][0].first) {
			hi = m
		} else {
			lo = m + 1
		}
	}
	if lo == 0 {
		return pos{}, false
	}
	b := lo - 1
	return pos{b, upperBound(s.blocks[b], u) - 1}, true
}

func (s *runSet) at(p pos) *span { return &s.blocks[p.b][p.i] }

// next returns the position after p, and false if p is the last run.
func (s *runSet) next(p pos) (pos, bool) {
	if p.i+1 < len(s.blocks[p.b]) {
		return pos{p.b, p.i + 1}, true
	}
	if p.b+1 < len(s.blocks) {
		return pos{p.b + 1, 0}, true
	}
	return pos{}, false
}

// find returns the position of the run holding u.
func (s *runSet) find(u u128) (pos, bool) {
	p, ok := s.floor(u)
	if !ok || s.at(p).last.less(u) {
		return pos{}, false
	}
	return p, true
}

func (s *runSet) contains(u u128) bool {
	_, ok := s.find(u)
	return ok
}

// insertAt inserts r at index i of block b (i may be the block's length),
// splitting the block in two when it grows past the limit.
func (s *runSet) insertAt(b, i int, r span) {
	if len(s.blocks) == 0 {
		s.blocks = append(s.blocks, append(s.spare[:0], r))
		s.spare = nil
		return
	}
	blk := slices.Insert(s.blocks[b], i, r)
	if len(blk) <= s.limit() {
		s.blocks[b] = blk
		return
	}
	// The first half is capped at its length, so appending to it reallocates
	// and the second half can keep the rest of the backing array.
	half := len(blk) / 2
	s.blocks[b] = blk[:half:half]
	s.blocks = slices.Insert(s.blocks, b+1, blk[half:])
}

// deleteAt removes the run at p, dropping its block if it empties and
// merging it with the next block when both are small.
func (s *runSet) deleteAt(p pos) {
	blk := slices.Delete(s.blocks[p.b], p.i, p.i+1)
	switch {
	case len(blk) == 0:
		s.spare = blk
		s.blocks = slices.Delete(s.blocks, p.b, p.b+1)
	case p.b+1 < len(s.blocks) && len(blk)+len(s.blocks[p.b+1]) <= s.limit()/2:
		s.blocks[p.b] = append(blk, s.blocks[p.b+1]...)
		s.blocks = slices.Delete(s.blocks, p.b+1, p.b+2)
	default:
		s.blocks[p.b] = blk
	}
}

// insert adds u and reports whether it was absent.
func (s *runSet) insert(u u128) bool {
	prev, hasPrev := s.floor(u)
	var next pos
	var hasNext bool
	if hasPrev {
		if !s.at(prev).last.less(u) {
			return false
		}
		next, hasNext = s.next(prev)
	} else if len(s.blocks) > 0 {
		next, hasNext = pos{0, 0}, true
	}
	// Neither add1 can wrap: a run ending at the top of the address space
	// would hold u, and no run starts after the top address.
	joinPrev := hasPrev && s.at(prev).last.add1() == u
	joinNext := hasNext && u.add1() == s.at(next).first
	switch {
	case joinPrev && joinNext:
		s.at(prev).last = s.at(next).last
		s.deleteAt(next)
	case joinPrev:
		s.at(prev).last = u
	case joinNext:
		s.at(next).first = u
	case hasPrev:
		s.insertAt(prev.b, prev.i+1, span{u, u})
	default:
		s.insertAt(0, 0, span{u, u})
	}
	return true
}

// remove deletes u and reports whether it was present.
func (s *runSet) remove(u u128) bool {
	p, ok := s.find(u)
	if !ok {
		return false
	}
	r := s.at(p)
	switch {
	case r.first == r.last:
		s.deleteAt(p)
	case r.first == u:
		r.first = u.add1()
	case r.last == u:
		r.last = u.sub1()
	default:
		tail := span{u.add1(), r.last}
		r.last = u.sub1()
		s.insertAt(p.b, p.i+1, tail)
	}
	return true
}

// firstFree returns the lowest address of seg not in the set, and false if
// seg is entirely in the set.
func (s *runSet) firstFree(seg span) (u128, bool) {
	p, ok := s.find(seg.first)
	if !ok {
		return seg.first, true
	}
	// Runs are maximal, so the address after a run is not in the set.
	if last := s.at(p).last; last.less(seg.last) {
		return last.add1(), true
	}
	return u128{}, false
}

// union adds the sorted, duplicate-free points and returns how many were
// absent. It rebuilds the blocks in O(runs + len(points)).
func (s *runSet) union(points []u128) (added uint64) {
	var old []span
	for _, blk := range s.blocks {
		old = append(old, blk...)
	}
	merged := make([]span, 0, len(old)+len(points))
	push := func(r span) {
		if n := len(merged); n > 0 && merged[n-1].touches(r) {
			if merged[n-1].last.less(r.last) {
				merged[n-1].last = r.last
			}
			return
		}
		merged = append(merged, r)
	}
	i := 0
	for _, u := range points {
		for i < len(old) && old[i].first.less(u) {
			push(old[i])
			i++
		}
		// Every old run starting before u is pushed; u is already present
		// if the last of them, or the next one, holds it.
		present := i > 0 && old[i-1].contains(u) || i < len(old) && old[i].first == u
		if !present {
			added++
		}
		push(span{u, u})
	}
	for ; i < len(old); i++ {
		push(old[i])
	}
	// Half-full blocks leave room to insert without splitting at once.
	s.blocks = s.blocks[:0]
	for len(merged) > 0 {
		n := min(len(merged), max(s.limit()/2, 1))
		s.blocks = append(s.blocks, merged[:n:n])
		merged = merged[n:]
	}
	return added
}

// spans returns every run in order (for tests).
func (s *runSet) spans() []span {
	var out []span
	for _, blk := range s.blocks {
		out = append(out, blk...)
	}
	return out
}
