package ipam

import (
	"math"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// universe maps 0..399 onto three bands of consecutive addresses: 0..199,
// the 100 addresses around 2^64 (where the low half carries into the high
// half), and the 100 highest addresses of the 128-bit space.
func universe(i int) u128 {
	switch {
	case i < 200:
		return u128{lo: uint64(i)}
	case i < 250:
		return u128{lo: math.MaxUint64 - uint64(249-i)}
	case i < 300:
		return u128{hi: 1, lo: uint64(i - 250)}
	}
	return u128{hi: math.MaxUint64, lo: math.MaxUint64 - uint64(399-i)}
}

// TestPropertyRunSet drives a runSet with tiny blocks (so that blocks split,
// empty and merge) against a map, over addresses that include both sides of
// the 64-bit carry and the top of the 128-bit space, and checks its
// structure after every step.
func TestPropertyRunSet(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := &runSet{max: rapid.IntRange(2, 6).Draw(t, "blockMax")}
		model := map[u128]bool{}
		idx := rapid.IntRange(0, 399)
		t.Repeat(map[string]func(*rapid.T){
			"insert": func(t *rapid.T) {
				u := universe(idx.Draw(t, "i"))
				if got := s.insert(u); got == model[u] {
					t.Fatalf("insert(%v) = %v, model had it: %v", u, got, model[u])
				}
				model[u] = true
			},
			"insertRange": func(t *rapid.T) {
				i := idx.Draw(t, "i")
				for j := i; j < min(i+rapid.IntRange(1, 30).Draw(t, "n"), 400); j++ {
					u := universe(j)
					s.insert(u)
					model[u] = true
				}
			},
			"remove": func(t *rapid.T) {
				u := universe(idx.Draw(t, "i"))
				if got := s.remove(u); got != model[u] {
					t.Fatalf("remove(%v) = %v, model had it: %v", u, got, model[u])
				}
				delete(model, u)
			},
			"union": func(t *rapid.T) {
				var pts []u128
				want := uint64(0)
				for _, i := range rapid.SliceOfNDistinct(idx, 0, 40, rapid.ID).Draw(t, "pts") {
					u := universe(i)
					pts = append(pts, u)
					if !model[u] {
						want++
					}
					model[u] = true
				}
				slices.SortFunc(pts, u128.cmp)
				if got := s.union(pts); got != want {
					t.Fatalf("union added %d, want %d", got, want)
				}
			},
			"firstFree": func(t *rapid.T) {
				a, b := idx.Draw(t, "a"), idx.Draw(t, "b")
				a, b = min(a, b), max(a, b)
				seg := span{universe(a), universe(b)}
				got, ok := s.firstFree(seg)
				// Within one band the universe is contiguous; across bands the
				// gap addresses are never in the set, so the answer is the
				// first non-member at or after seg.first.
				want, wantOK := seg.first, true
				for model[want] && want != seg.last {
					want = want.add1()
				}
				if model[want] {
					wantOK = false
				}
				if ok != wantOK || (ok && got != want) {
					t.Fatalf("firstFree(%v) = %v, %v; want %v, %v", seg, got, ok, want, wantOK)
				}
			},
			"": func(t *rapid.T) {
				var count uint64
				for bi, blk := range s.blocks {
					if len(blk) == 0 || len(blk) > s.limit() {
						t.Fatalf("block %d has %d runs (limit %d)", bi, len(blk), s.limit())
					}
				}
				runs := s.spans()
				for k, r := range runs {
					if r.last.less(r.first) {
						t.Fatalf("run %v reversed", r)
					}
					if k > 0 && runs[k-1].touches(r) {
						t.Fatalf("runs %v and %v overlap or touch", runs[k-1], r)
					}
					count += r.size()
				}
				if count != uint64(len(model)) {
					t.Fatalf("runs hold %d addresses, model %d: %v", count, len(model), runs)
				}
				for u := range model {
					if !s.contains(u) {
						t.Fatalf("contains(%v) = false", u)
					}
				}
			},
		})
	})
}
