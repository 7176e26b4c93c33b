package controller

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/util/validation"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/scheduler"
)

func mem(i int) v1.EgressMember {
	return v1.EgressMember{PodIP: fmt.Sprintf("10.0.%d.%d", i/250, i%250+1), HostIP: "192.0.2.11"}
}

func memRange(from, to int) []v1.EgressMember {
	var out []v1.EgressMember
	for i := from; i < to; i++ {
		out = append(out, mem(i))
	}
	return out
}

// apply returns the slices after ch is applied to existing.
func apply(existing []sliceContent, ch sliceChanges) map[string][]v1.EgressMember {
	out := map[string][]v1.EgressMember{}
	for _, s := range existing {
		out[s.Name] = s.Members
	}
	for _, s := range append(ch.Create, ch.Update...) {
		out[s.Name] = s.Members
	}
	for _, n := range ch.Delete {
		delete(out, n)
	}
	return out
}

func TestPackSlices(t *testing.T) {
	moved := mem(1)
	moved.HostIP = "192.0.2.12"
	cases := []struct {
		name     string
		existing []sliceContent
		want     []v1.EgressMember
		max      int
		writes   []string // names of the slices written, created or deleted, in order create, update, delete
	}{
		{"first publication fills slices in IP order", nil, memRange(0, 5), 2, []string{"c:e-0", "c:e-1", "c:e-2"}},
		{"nothing changed, nothing written", []sliceContent{{"e-0", memRange(0, 2)}, {"e-1", memRange(2, 4)}}, memRange(0, 4), 2, nil},
		{"one Pod gone rewrites its slice only", []sliceContent{{"e-0", memRange(0, 2)}, {"e-1", memRange(2, 4)}}, append(memRange(0, 2), mem(3)), 2, []string{"u:e-1"}},
		{"a new Pod fills the slice with room", []sliceContent{{"e-0", memRange(0, 2)}, {"e-1", memRange(2, 3)}}, memRange(0, 4), 2, []string{"u:e-1"}},
		{"a new Pod with no room creates the lowest free name", []sliceContent{{"e-1", memRange(0, 2)}}, memRange(0, 3), 2, []string{"c:e-0"}},
		{"a host IP change updates in place", []sliceContent{{"e-0", memRange(0, 2)}, {"e-1", memRange(2, 4)}}, []v1.EgressMember{mem(0), moved, mem(2), mem(3)}, 2, []string{"u:e-0"}},
		{"an emptied slice is deleted", []sliceContent{{"e-0", memRange(0, 2)}, {"e-1", memRange(2, 4)}}, memRange(0, 2), 2, []string{"d:e-1"}},
		{"a duplicate across slices is kept once", []sliceContent{{"e-0", memRange(0, 2)}, {"e-1", memRange(1, 3)}}, memRange(0, 3), 2, []string{"u:e-1"}},
		{"an over-full slice is trimmed, the rest re-homed", []sliceContent{{"e-0", memRange(0, 3)}}, memRange(0, 3), 2, []string{"c:e-1", "u:e-0"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ch := packSlices("e", tc.existing, tc.want, tc.max)
			var got []string
			for _, s := range ch.Create {
				got = append(got, "c:"+s.Name)
			}
			for _, s := range ch.Update {
				got = append(got, "u:"+s.Name)
			}
			for _, n := range ch.Delete {
				got = append(got, "d:"+n)
			}
			if diff := cmp.Diff(tc.writes, got); diff != "" {
				t.Errorf("writes (-want +got):\n%s", diff)
			}
			checkPacked(t, apply(tc.existing, ch), tc.want, tc.max)
		})
	}
}

// checkPacked: every wanted member exactly once, nothing else, no slice
// over max or empty, members sorted in each written slice.
func checkPacked(t *testing.T, after map[string][]v1.EgressMember, want []v1.EgressMember, max int) {
	t.Helper()
	wantBy := map[string]v1.EgressMember{}
	for _, m := range want {
		wantBy[m.PodIP] = m
	}
	seen := map[string]bool{}
	for name, ms := range after {
		if len(ms) == 0 || len(ms) > max {
			t.Errorf("slice %s has %d members (max %d)", name, len(ms), max)
		}
		for _, m := range ms {
			if seen[m.PodIP] {
				t.Errorf("member %s twice", m.PodIP)
			}
			seen[m.PodIP] = true
			if wantBy[m.PodIP] != m {
				t.Errorf("slice %s holds %+v, want %+v", name, m, wantBy[m.PodIP])
			}
		}
	}
	if len(seen) != len(wantBy) {
		t.Errorf("%d members published, want %d", len(seen), len(wantBy))
	}
}

// TestPackSlicesProperties: random sequences of membership changes keep
// the packing exact, and a single member added or removed writes at most
// one slice.
func TestPackSlicesProperties(t *testing.T) {
	for seed := range uint64(100) {
		r := rand.New(rand.NewPCG(seed, 1))
		max := 1 + r.IntN(10)
		cur := map[int]bool{}
		var existing []sliceContent
		for step := range 40 {
			single := r.IntN(2) == 0
			if single {
				i := r.IntN(200)
				cur[i] = !cur[i]
			} else {
				for range r.IntN(30) {
					i := r.IntN(200)
					cur[i] = !cur[i]
				}
			}
			var want []v1.EgressMember
			for i, in := range cur {
				if in {
					want = append(want, mem(i))
				}
			}
			ch := packSlices("e", existing, want, max)
			if single && len(ch.Create)+len(ch.Update)+len(ch.Delete) > 1 {
				t.Fatalf("seed %d step %d: one member changed, %d slices written", seed, step, len(ch.Create)+len(ch.Update)+len(ch.Delete))
			}
			after := apply(existing, ch)
			checkPacked(t, after, want, max)
			existing = existing[:0]
			for n, ms := range after {
				existing = append(existing, sliceContent{n, ms})
			}
		}
	}
}

func TestSliceName(t *testing.T) {
	if got := sliceName("payments", 3); got != "payments-3" {
		t.Errorf("sliceName = %q", got)
	}
	long := strings.Repeat("a.", 126) + "b" // 253 characters
	n0, n1 := sliceName(long, 0), sliceName(long, 1)
	for _, n := range []string{n0, n1} {
		if errs := validation.IsDNS1123Subdomain(n); len(errs) > 0 {
			t.Errorf("sliceName of a 253-character Egress = %q: %v", n, errs)
		}
	}
	if n0 == n1 || n0 == sliceName(strings.Repeat("a.", 126)+"c", 0) {
		t.Errorf("slice names collide: %q %q", n0, n1)
	}
}

// TestNoNodeDetail: the NoEligibleNode explanation counts the Nodes that
// match the pool's nodeSelector by why they cannot hold an IP.
func TestNoNodeDetail(t *testing.T) {
	nodes := map[string]*scheduler.Node{
		"a": {Name: "a", Reason: v1.IneligibleCordoned},
		"b": {Name: "b", Reason: v1.IneligibleNotReady},
		"c": {Name: "c", Reason: v1.IneligibleCordoned},
		"d": {Name: "d", Eligible: true, Capacity: 0},
		"e": {Name: "e", Eligible: true, Capacity: 3},
	}
	for _, tc := range []struct {
		matching []string
		want     string
	}{
		{nil, `none of the 7 Nodes matches the nodeSelector of pool "p"`},
		{[]string{"a", "b", "c", "d"}, `4 of 7 Nodes match the nodeSelector of pool "p", none can hold an IP: 2 Cordoned, 1 NotReady, 1 capacity 0`},
		{[]string{"e"}, ""}, // eligible with room: nothing to explain here
	} {
		if got := noNodeDetail("p", "the nodeSelector", 7, tc.matching, nodes); got != tc.want {
			t.Errorf("noNodeDetail(%v) = %q, want %q", tc.matching, got, tc.want)
		}
	}
}
