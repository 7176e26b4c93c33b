package controller

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// referenceSharedWith is the plain statement of status.sharedWith: for
// each Egress with an address, the other Egresses with that address,
// sorted, the first maxSharedWith of them; nil when there are none.
func referenceSharedWith(ips map[string]string) map[string][]string {
	out := map[string][]string{}
	for name, ip := range ips {
		var others []string
		for n, other := range ips {
			if n != name && ip != "" && other == ip {
				others = append(others, n)
			}
		}
		slices.Sort(others)
		if len(others) > maxSharedWith {
			others = others[:maxSharedWith]
		}
		out[name] = others
	}
	return out
}

// TestSetSharedWithDifferential compares setSharedWith with
// referenceSharedWith on random assignments: many Egresses on few
// addresses (lists longer than maxSharedWith), addresses held once, and
// Egresses without an address.
func TestSetSharedWithDifferential(t *testing.T) {
	rng := rand.New(rand.NewPCG(22, 4))
	for round := range 300 {
		n, addrs := 1+rng.IntN(40), 1+rng.IntN(30)
		ips := map[string]string{}
		chs := map[string]egressChange{}
		for i := range n {
			name := fmt.Sprintf("e%02d", i)
			ip := ""
			if rng.IntN(5) > 0 {
				ip = fmt.Sprintf("192.0.2.%d", rng.IntN(addrs))
			}
			ips[name] = ip
			var ch egressChange
			ch.Status.EgressIP = ip
			chs[name] = ch
		}
		setSharedWith(chs)
		want := referenceSharedWith(ips)
		for name, ch := range chs {
			if diff := cmp.Diff(want[name], ch.Status.SharedWith); diff != "" {
				t.Fatalf("round %d, %s (%q): sharedWith (-want +got):\n%s", round, name, ips[name], diff)
			}
		}
	}
}
