package scheduler

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
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
// tree search after arbitrary load updates.
func TestRingPieces(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		members := rapid.IntRange(1, 80).Draw(t, "members")
		in := Input{Pools: []Pool{{Name: rapid.StringN(0, 6, -1).Draw(t, "pool"), Family: IPv4}}}
		for j := 0; j < members; j++ {
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
		for k := rapid.IntRange(0, 50).Draw(t, "updates"); k > 0; k-- {
			j := int32(rapid.IntRange(0, members-1).Draw(t, "member"))
			val := int32(rapid.IntRange(0, 5).Draw(t, "val"))
			if rapid.IntRange(0, 4).Draw(t, "full") == 0 {
				val = full
			}
			r.set(j, val)
			for v := 0; v < pointsPerNode; v++ {
				vals[r.pos[int(j)*pointsPerNode+v]] = val
			}
		}
		for q := 0; q < 20; q++ {
			h := rapid.Uint64().Draw(t, "query")
			if rapid.Bool().Draw(t, "onPoint") {
				h = r.pts[rapid.IntRange(0, n-1).Draw(t, "at")].h
			}
			if got, want := r.lowerBound(h), sort.Search(n, func(i int) bool { return r.pts[i].h >= h }); got != want {
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
