package scheduler

import (
	"cmp"
	"fmt"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// sortBucket against slices.SortFunc, with crowded buckets as crafted names
// could give.
func TestSortBucket(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		pts := make([]point, rapid.IntRange(0, 100).Draw(t, "n"))
		for i := range pts {
			pts[i] = point{h: uint64(rapid.IntRange(0, 3).Draw(t, "h")), slot: int32(rapid.IntRange(0, 9).Draw(t, "slot")), v: int32(i)}
		}
		compare := func(a, b point) int {
			if c := cmp.Compare(a.h, b.h); c != 0 {
				return c
			}
			if c := cmp.Compare(a.slot, b.slot); c != 0 {
				return c
			}
			return cmp.Compare(a.v, b.v)
		}
		want := slices.Clone(pts)
		slices.SortFunc(want, compare)
		sortBucket(pts, compare)
		if !slices.Equal(pts, want) {
			t.Fatalf("got %v, want %v", pts, want)
		}
	})
}

// A pool's ring against plain reference code: points in order with a
// consistent bucket index and position map, lowerBound, and the segment
// tree search and pick after arbitrary load updates.
func TestRingPieces(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		members := rapid.IntRange(1, 80).Draw(t, "members")
		in := Input{Pools: []Pool{{Name: rapid.StringN(0, 6, -1).Draw(t, "pool"), Family: IPv4}}}
		for j := range members {
			name := fmt.Sprintf("%s-%d", rapid.StringN(0, 4, -1).Draw(t, "node"), j)
			in.Nodes = append(in.Nodes, Node{Name: name, Eligible: true, Capacity: 1})
			in.Pools[0].EligibleNodes = append(in.Pools[0].EligibleNodes, name)
		}
		s := &state{in: &in, c: DefaultBalanceFactor}
		s.indexNodes()
		s.indexPools()
		r := s.buildRing(0)
		n := members * pointsPerNode
		if len(r.pts) != n {
			t.Fatalf("%d points, want %d", len(r.pts), n)
		}
		for i, p := range r.pts {
			if i > 0 && r.pts[i-1].h > p.h {
				t.Fatalf("points out of order at %d", i)
			}
			if b := p.h >> r.shift; int(r.start[b]) > i || i >= int(r.start[b+1]) {
				t.Fatalf("point %d (bucket %d) outside its bucket [%d, %d)", i, b, r.start[b], r.start[b+1])
			}
			if r.pos[int(p.slot)*pointsPerNode+int(p.v)] != int32(i) {
				t.Fatalf("pos does not map point %d back", i)
			}
		}
		vals := make([]int32, n) // every Node empty, with room
		// The inner nodes of the tree are computed on demand: before the
		// updates (set then maintains them) or after (ensureTree computes
		// them from the leaves).
		early := rapid.Bool().Draw(t, "treeBeforeUpdates")
		if early {
			r.ensureTree()
		}
		for k := rapid.IntRange(0, 50).Draw(t, "updates"); k > 0; k-- {
			j := int32(rapid.IntRange(0, members-1).Draw(t, "member"))
			val := int32(rapid.IntRange(0, 5).Draw(t, "val"))
			if rapid.IntRange(0, 4).Draw(t, "full") == 0 {
				val = full
			}
			r.set(j, val)
			for v := range pointsPerNode {
				vals[r.pos[int(j)*pointsPerNode+v]] = val
			}
		}
		// pick, with or without the tree, against a scan of the values:
		// the first point clockwise under the bound, else the first one
		// clockwise of least value among those with room.
		for range 20 {
			h := rapid.Uint64().Draw(t, "pickAt")
			bound := int32(rapid.IntRange(1, 6).Draw(t, "bound"))
			start := lowerBoundRef(r.pts[:n], h)
			least := int32(full)
			for _, v := range vals {
				least = min(least, v)
			}
			if least == full {
				break // pick needs a point with room
			}
			thr := max(bound, least+1)
			want := -1
			for k := 0; k < n && want < 0; k++ {
				if i := (start + k) % n; vals[i] < thr {
					want = i
				}
			}
			if got := r.pick(h, bound); got != r.pts[want].slot {
				t.Fatalf("pick(%x, %d) = slot %d, want %d (point %d, values %v)", h, bound, got, r.pts[want].slot, want, vals)
			}
		}
		r.ensureTree()
		for range 20 {
			h := rapid.Uint64().Draw(t, "query")
			if rapid.Bool().Draw(t, "onPoint") {
				h = r.pts[rapid.IntRange(0, n-1).Draw(t, "at")].h
			}
			if got, want := r.lowerBound(h), lowerBoundRef(r.pts[:n], h); got != want {
				t.Fatalf("lowerBound(%x) = %d, want %d", h, got, want)
			}
			thr := int32(rapid.IntRange(1, 6).Draw(t, "thr"))
			if rapid.Bool().Draw(t, "room") {
				thr = full
			}
			from := rapid.IntRange(0, n).Draw(t, "from")
			want := -1
			for i := from; i < n; i++ {
				if vals[i] < thr {
					want = i
					break
				}
			}
			if got := r.firstBelow(from, thr); got != want {
				t.Fatalf("firstBelow(%d, %d) = %d, want %d (values %v)", from, thr, got, want, vals)
			}
		}
	})
}

// hashString against its definition, one byte at a time: words of 8 bytes
// little endian, the last one zero-padded, each xored into the state and
// mixed, starting from the length.
func TestHashStringDefinition(t *testing.T) {
	def := func(s string) uint64 {
		h := uint64(len(s)) * golden
		for i := 0; i < len(s); i += 8 {
			var w uint64
			for k := min(i+8, len(s)) - 1; k >= i; k-- {
				w = w<<8 | uint64(s[k])
			}
			h = mix64(h ^ w)
		}
		if len(s)%8 == 0 {
			h = mix64(h) // the empty last word
		}
		return h
	}
	rapid.Check(t, func(t *rapid.T) {
		s := rapid.StringN(0, 40, 40).Draw(t, "s")
		if got, want := hashString(s), def(s); got != want {
			t.Fatalf("hashString(%q) = %x, want %x", s, got, want)
		}
	})
	for n := 0; n <= 40; n++ {
		s := "node-0123456789.abcdefghijklmnopqrstuvwxyz"[:n]
		if got, want := hashString(s), def(s); got != want {
			t.Fatalf("hashString(%q) = %x, want %x", s, got, want)
		}
	}
}

// lowerBoundRef is the index of the first point whose hash is at least h
// (len(pts) if none), by the standard library's binary search.
func lowerBoundRef(pts []point, h uint64) int {
	i, _ := slices.BinarySearchFunc(pts, h, func(p point, h uint64) int { return cmp.Compare(p.h, h) })
	return i
}
