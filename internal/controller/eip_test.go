package controller

import (
	"net/netip"
	"strings"
	"testing"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/cloud"
)

// TestElasticIPPlan: the pure decisions of planElasticIPs.
func TestElasticIPPlan(t *testing.T) {
	a := netip.MustParseAddr
	ours := func(ip netip.Addr) bool { return ip.As4()[2] == 0 } // 10.0.0.x is ours, 10.0.9.x someone else's
	never := func(string) bool { return false }
	free := func(id, pub string) cloud.ElasticIP { return cloud.ElasticIP{AllocationID: id, PublicIP: a(pub)} }
	assoc := func(id, pub, priv, eni string) cloud.ElasticIP {
		return cloud.ElasticIP{AllocationID: id, PublicIP: a(pub), AssociationID: "eipassoc-" + id, PrivateIP: a(priv), InterfaceID: eni}
	}
	t.Run("keeps, associates the lowest free, releases what no Egress uses", func(t *testing.T) {
		view := eipView{IPs: []cloud.ElasticIP{assoc("eipalloc-1", "203.0.113.1", "10.0.0.5", "eni-a"), free("eipalloc-2", "203.0.113.2"),
			free("eipalloc-3", "203.0.113.3"), assoc("eipalloc-4", "203.0.113.4", "10.0.0.7", "eni-b")}}
		wants := []eipWant{{Egress: "kept", IP: a("10.0.0.5"), Interface: "eni-b"}, // moved: the association followed
			{Egress: "new", IP: a("10.0.0.6"), Interface: "eni-a"},
			{Egress: "attaching", IP: a("10.0.0.8")}}
		p := planElasticIPs(view, wants, ours, never)
		if p.Public["kept"] != a("203.0.113.1") || len(p.Public) != 1 {
			t.Errorf("public %v", p.Public)
		}
		want := []eipOp{{AllocationID: "eipalloc-4", AssociationID: "eipassoc-eipalloc-4"}, {AllocationID: "eipalloc-2", Associate: true, InterfaceID: "eni-a", Private: a("10.0.0.6")}}
		if len(p.Ops) != 2 || p.Ops[0] != want[0] || p.Ops[1] != want[1] {
			t.Errorf("ops %+v, want %+v", p.Ops, want)
		}
		if p.Cond.Status != "True" || p.Cond.Reason != v1.ReasonElasticIPsAssociated {
			t.Errorf("condition %+v", p.Cond)
		}
	})
	t.Run("unknown and foreign allocations are reported and never touched", func(t *testing.T) {
		view := eipView{IPs: []cloud.ElasticIP{assoc("eipalloc-9", "203.0.113.9", "10.0.9.9", "eni-x")}, Missing: []string{"eipalloc-0"}}
		p := planElasticIPs(view, []eipWant{{Egress: "e", IP: a("10.0.0.5"), Interface: "eni-a"}}, ours, never)
		if len(p.Ops) != 0 || len(p.Public) != 0 {
			t.Errorf("ops %+v public %v", p.Ops, p.Public)
		}
		for _, s := range []string{"eipalloc-0 does not exist", "eipalloc-9 (203.0.113.9) is associated with 10.0.9.9 on eni-x", "1 assigned Egresses have no Elastic IP"} {
			if !strings.Contains(p.Cond.Message, s) {
				t.Errorf("message %q lacks %q", p.Cond.Message, s)
			}
		}
		if p.Cond.Reason != v1.ReasonElasticIPUnusable {
			t.Errorf("reason %s", p.Cond.Reason)
		}
	})
	t.Run("too few allocations; one in flight is not used twice", func(t *testing.T) {
		view := eipView{IPs: []cloud.ElasticIP{free("eipalloc-1", "203.0.113.1"), free("eipalloc-2", "203.0.113.2")}}
		wants := []eipWant{{Egress: "a", IP: a("10.0.0.5"), Interface: "eni-a"}, {Egress: "b", IP: a("10.0.0.6"), Interface: "eni-a"}}
		p := planElasticIPs(view, wants, ours, func(id string) bool { return id == "eipalloc-1" })
		if len(p.Ops) != 1 || p.Ops[0].AllocationID != "eipalloc-2" || p.Cond.Reason != v1.ReasonElasticIPsExhausted {
			t.Errorf("ops %+v condition %+v", p.Ops, p.Cond)
		}
	})
	t.Run("an unreadable view changes nothing", func(t *testing.T) {
		p := planElasticIPs(eipView{Err: "UnauthorizedOperation: ec2:DescribeAddresses"}, []eipWant{{Egress: "a", IP: a("10.0.0.5"), Interface: "eni-a"}}, ours, never)
		if len(p.Ops) != 0 || p.Cond.Reason != v1.ReasonElasticIPsUnreadable || !strings.Contains(p.Cond.Message, "ec2:DescribeAddresses") {
			t.Errorf("ops %+v condition %+v", p.Ops, p.Cond)
		}
	})
}
