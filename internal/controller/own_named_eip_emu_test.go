package controller

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/cloud/aws/ec2emu"
)

// ourENIOf returns the ID of the interface of ours (tagged for the cluster,
// no_manage) holding ip and the Node its tag names, or "" when ip is on no
// interface of ours.
func (ec *emuCloud) ourENIOf(ip netip.Addr) (string, string) {
	for _, st := range ec.ourENIs() {
		if slices.Contains(st.Secondary, ip) {
			return st.ID, st.Tags[TagNode]
		}
	}
	return "", ""
}

// TestNamedAddressOwnInterfaces (issue 17 items 1 and 4 together): in
// interface mode OwnInterfaces a named address that the VPC CNI holds, as
// a Pod IP on the Node's primary interface or on one of its aws-K8S-
// interfaces, is refused with AddressHeld and never taken; a free named
// address goes on an interface of ours, and at a failover it moves, with
// reassignment, from our interface on the failed Node to ours on the other.
func TestNamedAddressOwnInterfaces(t *testing.T) {
	ec, cl, n1, cni := cniHoldsEmu(t, "nown", "10.31.0", 0)
	a := netip.MustParseAddr
	cl.ownPool("nown", ownPool(ec, 0, nil))
	cases := []struct{ egress, ip, holder string }{
		{"nown-pod", "10.31.0.50", n1.PrimaryInterface},
		{"nown-cni", "10.31.0.51", cni},
	}
	for _, tc := range cases {
		cl.egress(tc.egress, "nown", tc.ip)
	}
	cl.egress("nown-free", "nown", "10.31.0.60")
	for _, tc := range cases {
		cl.eventually(tc.egress+" refused", func() (bool, string) {
			e := cl.get(tc.egress)
			c := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionIPAllocated)
			ok := c != nil && c.Status == "False" && c.Reason == v1.ReasonAddressHeld && strings.Contains(c.Message, tc.holder)
			return ok && e.Status.EgressNode == "", describe(e)
		})
		cl.warningEvent(tc.egress, v1.ReasonAddressHeld, tc.ip, tc.holder, "not egressip's")
	}
	e := cl.waitReady("nown-free")["nown-free"]
	first, node := ec.ourENIOf(a("10.31.0.60"))
	if first == "" || node != e.Status.EgressNode {
		t.Fatalf("10.31.0.60 on %q (an interface of ours for Node %q), want one of ours on %s", ec.emu.Owner(ec.subnet, a("10.31.0.60")), node, e.Status.EgressNode)
	}

	// Failover: the address moves from our interface on the failed Node to
	// ours on the other one; the held addresses stay where they are.
	from := e.Status.EgressNode
	cl.crash(from)
	cl.eventually("nown-free Ready elsewhere", func() (bool, string) {
		e = cl.get("nown-free")
		return ready(e) && e.Status.EgressNode != from && e.Status.EgressNode != "", describe(e)
	})
	second, node := ec.ourENIOf(a("10.31.0.60"))
	if second == "" || second == first || node != e.Status.EgressNode {
		t.Fatalf("after the failover 10.31.0.60 is on %q (ours for Node %q), want an interface of ours on %s other than %s",
			ec.emu.Owner(ec.subnet, a("10.31.0.60")), node, e.Status.EgressNode, first)
	}
	for _, tc := range cases {
		if o := ec.emu.Owner(ec.subnet, a(tc.ip)); o != tc.holder {
			t.Errorf("%s moved from %s to %q", tc.ip, tc.holder, o)
		}
	}
}

// TestElasticIPOwnInterfaces (issue 17 items 1 and 7 together): in interface
// mode OwnInterfaces the Elastic IP is associated with the interface of
// ours that holds the private address (the emulator refuses an association
// naming an interface without that address), in one AssociateAddress call.
func TestElasticIPOwnInterfaces(t *testing.T) {
	ec := newEmuCloud(t, ec2emu.Config{}, "10.32.0.0/24")
	cl := newEmuCluster(t, "eown", 1, 10, ec, "m5.large")
	alloc, pub, err := ec.emu.AddElasticIP(ec2emu.ElasticIP{})
	if err != nil {
		t.Fatal(err)
	}
	cl.ownPool("eown", ownPool(ec, 0, func(p *v1.AWSPool) { p.ElasticIPs = &v1.ElasticIPs{AllocationIDs: []string{alloc}} }))
	ec.emu.ResetCounts()
	cl.egress("eown-a", "eown", "")
	var e *v1.Egress
	cl.eventually("eown-a Ready with a public IP", func() (bool, string) {
		e = cl.get("eown-a")
		return ready(e) && e.Status.PublicIP != "", describe(e) + " public=" + e.Status.PublicIP
	})
	private := netip.MustParseAddr(e.Status.EgressIP)
	if eni, _ := ec.ourENIOf(private); eni == "" {
		t.Fatalf("%s is on %q, not on an interface of ours", private, ec.emu.Owner(ec.subnet, private))
	}
	if e.Status.PublicIP != pub.String() || ec.emu.NAT()[private] != pub {
		t.Fatalf("public IP %s, NAT %v, want %s -> %s", e.Status.PublicIP, ec.emu.NAT(), private, pub)
	}
	if n := ec.emu.Calls("AssociateAddress"); n != 1 {
		t.Fatalf("%d AssociateAddress calls, want 1 (a refused one means the wrong interface was named): %v", n, ec.emu.Counts())
	}
	cl.eventually("pool ElasticIPs=True", func() (bool, string) {
		c := meta.FindStatusCondition(cl.poolStatus("eown").Conditions, v1.ConditionElasticIPs)
		return c != nil && c.Status == "True", fmt.Sprintf("%+v", c)
	})
}
