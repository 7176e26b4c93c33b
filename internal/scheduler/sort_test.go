package scheduler

import (
	"cmp"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// radixSort against a stable comparison sort, on keys that share most of
// their bytes (so passes are skipped), on keys that differ anywhere, and
// with lo bits outside the key (the payload) left out of the order; hi
// values in a narrow range take the dense pass.
func TestRadixSort(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 300).Draw(t, "n")
		mask := rapid.Uint64().Draw(t, "mask") // which key bits vary
		var loMask uint64                      // which lo bytes are key
		for b := range 8 {
			if rapid.Bool().Draw(t, "keyByte") {
				loMask |= 0xff << (8 * b)
			}
		}
		// Sometimes hi spans a narrow range (a dense counting pass), which
		// may straddle a byte boundary.
		narrow := rapid.IntRange(0, 2).Draw(t, "narrow")
		base := rapid.Uint64().Draw(t, "base")
		a := make([]keyed, n)
		for i := range a {
			a[i] = keyed{hi: rapid.Uint64().Draw(t, "hi") & mask, lo: rapid.Uint64().Draw(t, "lo") & ^mask}
			switch narrow {
			case 1:
				a[i].hi = base + uint64(rapid.IntRange(0, 2*n).Draw(t, "offset"))
			case 2:
				a[i].hi = 0xfff0 + uint64(rapid.IntRange(0, 40).Draw(t, "offset"))
			}
		}
		want := slices.Clone(a)
		slices.SortStableFunc(want, func(x, y keyed) int {
			if c := cmp.Compare(x.hi, y.hi); c != 0 {
				return c
			}
			return cmp.Compare(x.lo&loMask, y.lo&loMask)
		})
		var sc *radixScratch // fresh, or reused with stale counters
		if rapid.Bool().Draw(t, "reuse") {
			sc = &radixScratch{dense: make([]int32, 5)}
			for b := range sc.count {
				for d := range sc.count[b] {
					sc.count[b][d] = int32(b + d)
				}
			}
			for d := range sc.dense {
				sc.dense[d] = 7
			}
		}
		if got := radixSort(a, make([]keyed, n), loMask, sc); !slices.Equal(got, want) {
			t.Fatalf("got %v\nwant %v", got, want)
		}
	})
}

// sortNames orders names exactly as strings.Compare does, including names
// that tie on their 16-byte sort key, prefixes of each other, and names
// with zero bytes, and marks exactly the repeated names.
func TestSortNames(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		parts := []string{"", "a", "b", "team-", "egress-", "0000000000000000", "\x00", "\xff", "z"}
		names := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) string {
			var b strings.Builder
			for k := rapid.IntRange(0, 5).Draw(t, "parts"); k > 0; k-- {
				b.WriteString(rapid.SampledFrom(parts).Draw(t, "part"))
			}
			return b.String()
		}), 0, 60).Draw(t, "names")
		in := Input{}
		for _, n := range names {
			in.Egresses = append(in.Egresses, Egress{Name: n})
		}
		s := &state{in: &in}
		byName := s.sortNames()
		got := make([]string, len(byName))
		for k, i := range byName {
			got[k] = names[i]
		}
		want := slices.Clone(names)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("got %q\nwant %q", got, want)
		}
		count := map[string]int{}
		for _, n := range names {
			count[n]++
		}
		for i, n := range names {
			if dup := s.eg[i].reason == rDuplicate; dup != (count[n] > 1) {
				t.Fatalf("%q given %d times, marked duplicate: %v", n, count[n], dup)
			}
		}
	})
}
