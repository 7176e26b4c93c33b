package datapathsync

import (
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent/datapath"
	"github.com/egressip/egressip/internal/agent/poolroute"
)

// TestPoolEgresses: only Egresses held here with an ID are routed; a
// shared egress IP carries every Egress's mark; the gateway comes from the
// pool's subnetInfo and is dropped when of the other family.
func TestPoolEgresses(t *testing.T) {
	cfg := datapath.DefaultConfig()
	ip4, ip6 := netip.MustParseAddr("198.51.100.50"), netip.MustParseAddr("2001:db8:100::50")
	st := datapath.State{Egresses: []datapath.Egress{
		{Name: "a", IP: ip4, Role: datapath.RoleEgress},
		{Name: "b", IP: ip4, Role: datapath.RoleEgress},
		{Name: "c", IP: ip6, Role: datapath.RoleEgress},
		{Name: "d", IP: netip.MustParseAddr("198.51.100.60"), Role: datapath.RoleSource},
		{Name: "noid", IP: netip.MustParseAddr("198.51.100.70"), Role: datapath.RoleEgress},
	}}
	ids := datapath.IDs{"a": 1, "b": 2, "c": 3, "d": 4}
	eg := func(name, pool string) v1alpha1.Egress {
		return v1alpha1.Egress{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.EgressSpec{ExternalIPPool: pool}}
	}
	pools := []v1alpha1.ExternalIPPool{
		{ObjectMeta: metav1.ObjectMeta{Name: "p4"}, Spec: v1alpha1.ExternalIPPoolSpec{SubnetInfo: &v1alpha1.SubnetInfo{Gateway: "198.51.100.1", PrefixLength: 24}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "p6"}, Spec: v1alpha1.ExternalIPPoolSpec{SubnetInfo: &v1alpha1.SubnetInfo{Gateway: "198.51.100.1", PrefixLength: 24}}},
	}
	got := poolEgresses(heldEIPs(st), ids, cfg, []v1alpha1.Egress{eg("a", "p4"), eg("b", "p4"), eg("c", "p6"), eg("d", "p4")}, pools)
	want := []poolroute.Egress{
		{IP: ip4, Marks: []uint32{cfg.Mark(1), cfg.Mark(2)}, Gateway: netip.MustParseAddr("198.51.100.1"), PrefixLen: 24},
		{IP: ip6, Marks: []uint32{cfg.Mark(3)}},
	}
	if d := cmp.Diff(want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); d != "" {
		t.Errorf("poolEgresses (-want +got):\n%s", d)
	}
}
