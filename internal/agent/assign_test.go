package agent

import (
	"net/netip"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
)

func TestArrivalTable(t *testing.T) {
	eg := func(rv, node, ip string) *v1alpha1.Egress {
		return &v1alpha1.Egress{ObjectMeta: metav1.ObjectMeta{Name: "e1", UID: "u1", ResourceVersion: rv},
			Status: v1alpha1.EgressStatus{EgressNode: node, EgressIP: ip}}
	}
	ip := netip.MustParseAddr("192.0.2.70")
	for _, tc := range []struct {
		name     string
		old, cur *v1alpha1.Egress
		gap      bool
		want     bool
	}{
		{"create assigned here (first list, back into the field selector, re-list)", nil, eg("1", "n1", "192.0.2.70"), false, true},
		{"create assigned elsewhere", nil, eg("1", "n2", "192.0.2.70"), false, false},
		{"create without IP", nil, eg("1", "n1", ""), false, false},
		{"create with a bad IP", nil, eg("1", "n1", "not-an-ip"), false, false},
		{"update moved here from another Node", eg("1", "n2", "192.0.2.70"), eg("2", "n1", "192.0.2.70"), false, true},
		{"update moved here from no Node", eg("1", "", "192.0.2.70"), eg("2", "n1", "192.0.2.70"), false, true},
		{"update changed the IP here", eg("1", "n1", "192.0.2.71"), eg("2", "n1", "192.0.2.70"), false, true},
		{"unrelated status write, no gap", eg("1", "n1", "192.0.2.70"), eg("2", "n1", "192.0.2.70"), false, false},
		{"changed version after a watch error", eg("1", "n1", "192.0.2.70"), eg("7", "n1", "192.0.2.70"), true, true},
		{"same version after a watch error (re-list of an unchanged object)", eg("1", "n1", "192.0.2.70"), eg("1", "n1", "192.0.2.70"), true, false},
		{"moved away", eg("1", "n1", "192.0.2.70"), eg("2", "n2", "192.0.2.70"), true, false},
		{"delete", eg("1", "n1", "192.0.2.70"), nil, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := arrival("n1", tc.old, tc.cur, tc.gap)
			if ok != tc.want || (ok && got != ip) {
				t.Fatalf("arrival = %v, %v; want %v (ip %v)", got, ok, tc.want, ip)
			}
		})
	}
}

// TestArrivalGenerations checks the bookkeeping around arrival: an
// unrelated write bumps nothing, a watch error makes the next changed
// version of each Egress (once) an arrival, a delete forgets the Egress.
func TestArrivalGenerations(t *testing.T) {
	a := &Agent{cfg: Config{NodeName: "n1"}, assignGen: map[netip.Addr]uint64{}, seenEpoch: map[types.UID]uint64{}}
	ip := netip.MustParseAddr("192.0.2.70")
	keep := map[netip.Addr]bool{ip: true}
	eg := func(rv, node string) *v1alpha1.Egress {
		return &v1alpha1.Egress{ObjectMeta: metav1.ObjectMeta{Name: "e1", UID: "u1", ResourceVersion: rv},
			Status: v1alpha1.EgressStatus{EgressNode: node, EgressIP: ip.String()}}
	}
	a.noteArrival(nil, eg("1", "n1"))
	g1 := a.arrivals(keep)[ip]
	if g1 == 0 {
		t.Fatal("create: no arrival")
	}
	a.noteArrival(eg("1", "n1"), eg("2", "n1"))
	if g := a.arrivals(keep)[ip]; g != g1 {
		t.Fatalf("unrelated write: generation %d, want %d", g, g1)
	}
	a.gapEpoch.Add(1)
	a.noteArrival(eg("2", "n1"), eg("9", "n1"))
	g2 := a.arrivals(keep)[ip]
	if g2 <= g1 {
		t.Fatalf("first changed version after a watch error: generation %d, want > %d", g2, g1)
	}
	a.noteArrival(eg("9", "n1"), eg("10", "n1"))
	if g := a.arrivals(keep)[ip]; g != g2 {
		t.Fatalf("second write after the same watch error: generation %d, want %d", g, g2)
	}
	if g := a.arrivals(map[netip.Addr]bool{})[ip]; g != 0 {
		t.Fatalf("not kept: generation %d", g)
	}
	if _, ok := a.arrivals(keep)[ip]; ok {
		t.Fatal("an IP no longer assigned keeps its generation")
	}
	a.noteArrival(eg("10", "n1"), nil)
	if _, ok := a.seenEpoch["u1"]; ok {
		t.Fatal("delete kept the Egress's epoch")
	}
}
