package scheduler

import (
	"cmp"
	"slices"
	"sort"
	"testing"

	"pgregory.net/rapid"
)

// The ring's pieces against plain reference code: sortPoints (including
// crowded buckets, as crafted names would give), lowerBound, and the segment
// tree search after arbitrary updates.
func TestRingPieces(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		members := rapid.IntRange(1, 80).Draw(t, "members")
		n := members * pointsPerNode
		crowded := rapid.Bool().Draw(t, "crowded")
		pts := make([]point, n)
		for i := range pts {
			h := rapid.Uint64().Draw(t, "h")
			if crowded {
				h = uint64(rapid.IntRange(0, 3).Draw(t, "few")) << 62 >> uint(rapid.IntRange(0, 3).Draw(t, "shift"))
			}
			pts[i] = point{h: h, slot: int32(i / pointsPerNode), v: int32(i % pointsPerNode)}
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
		sorted, shift, start := sortPoints(pts, compare)
		if !slices.Equal(sorted, want) {
			t.Fatalf("sortPoints:\n got %v\nwant %v", sorted, want)
		}

		size := 1
		for size < n {
			size <<= 1
		}
		r := &ring{pts: sorted, shift: shift, start: start, pos: make([]int32, n), size: size, tree: make([]int32, 2*size)}
		for i := range r.tree {
			r.tree[i] = full
		}
		vals := make([]int32, n) // value of each point by index in sorted
		for i := range vals {
			vals[i] = full
		}
		for i, p := range sorted {
			r.pos[int(p.slot)*pointsPerNode+int(p.v)] = int32(i)
		}
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
			if crowded {
				h = sorted[rapid.IntRange(0, n-1).Draw(t, "at")].h + uint64(rapid.IntRange(0, 1).Draw(t, "off"))
			}
			lb := r.lowerBound(h)
			if want := sort.Search(n, func(i int) bool { return sorted[i].h >= h }); lb != want {
				t.Fatalf("lowerBound(%x) = %d, want %d", h, lb, want)
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
