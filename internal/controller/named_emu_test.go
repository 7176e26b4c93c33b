package controller

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/cloud/aws/ec2emu"
)

// cniHoldsEmu is the emulator set-up of the named-address tests: two
// m5.large Nodes on the subnet <net>.0/24 with reads lagging writes by
// 200 ms, and on the instance of the Node at index node the VPC CNI's
// Pod IP <net>.50 on the primary interface and its aws-K8S- interface
// holding <net>.51. It returns that instance and the CNI's interface.
func cniHoldsEmu(t *testing.T, prefix, net string, node int) (*emuCloud, *cluster, ec2emu.InstanceInfo, string) {
	t.Helper()
	ec := newEmuCloud(t, ec2emu.Config{ConsistencyDelay: 200 * time.Millisecond}, net+".0/24")
	cl := newEmuCluster(t, prefix, 2, 10, ec, "m5.large")
	in := ec.instances[node]
	if err := ec.emu.UseAddresses(in.PrimaryInterface, netip.MustParseAddr(net+".50")); err != nil {
		t.Fatal(err)
	}
	cni, err := ec.emu.AddForeignInterface(ec2emu.ForeignInterface{SubnetID: ec.subnet, InstanceID: in.ID, Description: "aws-K8S-" + in.ID,
		Addresses: []netip.Addr{netip.MustParseAddr(net + ".51")}})
	if err != nil {
		t.Fatal(err)
	}
	return ec, cl, in, cni
}

// TestNamedAddressHeldEmu (issue 17 item 4): an Egress naming an address
// that an interface not egressip's holds (a Pod IP on a Node's primary
// interface, an interface of the VPC CNI, a load balancer's interface,
// another instance's interface) is refused with a condition and a Warning
// Event naming the holder, and the address is not taken; a free named
// address is attached without reassignment.
func TestNamedAddressHeldEmu(t *testing.T) {
	ec, cl, n2, cni := cniHoldsEmu(t, "nheld", "10.8.0", 1)
	a := netip.MustParseAddr
	lb, err := ec.emu.AddForeignInterface(ec2emu.ForeignInterface{SubnetID: ec.subnet, Type: ec2emu.TypeNetworkLoadBalancer,
		Description: "ELB net/web/0123456789abcdef", RequesterID: "amazon-elb", RequesterManaged: true, Addresses: []netip.Addr{a("10.8.0.52")}})
	if err != nil {
		t.Fatal(err)
	}
	other, err := ec.emu.AddInstance(ec2emu.Instance{Type: "m5.large", SubnetID: ec.subnet})
	if err != nil {
		t.Fatal(err)
	}
	if err := ec.emu.UseAddresses(other.PrimaryInterface, a("10.8.0.53")); err != nil {
		t.Fatal(err)
	}
	cl.pool("nheld", emuPool(ec, 0, 0))
	ec.emu.ResetCounts()
	cases := []struct {
		egress, ip, holder string
		says               []string
	}{
		{"nheld-pod", "10.8.0.50", n2.PrimaryInterface, []string{"attached to instance " + n2.ID}},
		{"nheld-cni", "10.8.0.51", cni, []string{"attached to instance " + n2.ID, "aws-K8S-" + n2.ID, "a Pod IP of the AWS VPC CNI"}},
		{"nheld-lb", "10.8.0.52", lb, []string{"network_load_balancer", "ELB net/web/0123456789abcdef", "requester amazon-elb", "attached to no instance"}},
		{"nheld-other", "10.8.0.53", other.PrimaryInterface, []string{"attached to instance " + other.ID}},
	}
	for _, tc := range cases {
		cl.egress(tc.egress, "nheld", tc.ip)
	}
	cl.egress("nheld-free", "nheld", "10.8.0.60")
	for _, tc := range cases {
		cl.eventually(tc.egress+" refused", func() (bool, string) {
			e := cl.get(tc.egress)
			c := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionIPAllocated)
			if c == nil || c.Status != "False" || c.Reason != v1.ReasonAddressHeld || !strings.Contains(c.Message, tc.holder) {
				return false, describe(e)
			}
			for _, s := range tc.says {
				if !strings.Contains(c.Message, s) {
					return false, fmt.Sprintf("message %q does not say %q", c.Message, s)
				}
			}
			return e.Status.EgressNode == "" && !ready(e), describe(e)
		})
		cl.warningEvent(tc.egress, v1.ReasonAddressHeld, tc.ip, tc.holder, "not egressip's")
	}
	free := cl.waitReady("nheld-free")["nheld-free"]
	// Several refresh periods later nothing was taken.
	time.Sleep(3 * time.Second)
	for _, tc := range cases {
		if o := ec.emu.Owner(ec.subnet, a(tc.ip)); o != tc.holder {
			t.Errorf("%s moved from %s to %q", tc.ip, tc.holder, o)
		}
		if e := cl.get(tc.egress); e.Status.EgressIP != "" || e.Status.EgressNode != "" {
			t.Errorf("%s: %s", tc.egress, describe(e))
		}
	}
	if o := ec.emu.Owner(ec.subnet, a("10.8.0.60")); o == "" || o == lb || o == cni || o == other.PrimaryInterface {
		t.Errorf("the free named address is on %q (Egress on %s)", o, free.Status.EgressNode)
	}
	if n := ec.emu.Calls("AssignPrivateIpAddresses"); n != 1 {
		t.Errorf("%d AssignPrivateIpAddresses calls, want 1 (the free named address; none for the held ones): %v", n, ec.emu.Counts())
	}
}

// TestNamedAddressHeldTakenAway: an address the controller attached for an
// Egress, taken by a load balancer's interface behind its back, is not
// taken back: the Egress gets a Warning Event naming the holder and
// another address.
func TestNamedAddressHeldTakenAway(t *testing.T) {
	ec := newEmuCloud(t, ec2emu.Config{}, "10.9.0.0/24")
	cl := newEmuCluster(t, "ntaken", 1, 10, ec, "m5.large")
	// The emulator is consistent: trust a re-read after 1 s, so the
	// controller sees the address gone at its next refresh.
	cl.stopController()
	cl.opts.Cloud.Overlay = time.Second
	cl.startController()
	lb, err := ec.emu.AddForeignInterface(ec2emu.ForeignInterface{SubnetID: ec.subnet, Type: ec2emu.TypeNetworkLoadBalancer,
		Description: "ELB net/api/fedcba9876543210", RequesterID: "amazon-elb", RequesterManaged: true})
	if err != nil {
		t.Fatal(err)
	}
	cl.pool("ntaken", emuPool(ec, 1, 0))
	cl.egress("ntaken-a", "ntaken", "")
	e := cl.waitReady("ntaken-a")["ntaken-a"]
	first := netip.MustParseAddr(e.Status.EgressIP)
	if err := ec.emu.TakeAddress(lb, first); err != nil {
		t.Fatal(err)
	}
	cl.warningEvent("ntaken-a", v1.ReasonAddressHeld, first.String(), lb, "another address")
	cl.eventually("ntaken-a Ready on another address", func() (bool, string) {
		e := cl.get("ntaken-a")
		return ready(e) && e.Status.EgressIP != "" && e.Status.EgressIP != first.String(), describe(e)
	})
	if o := ec.emu.Owner(ec.subnet, first); o != lb {
		t.Fatalf("%s taken back from the load balancer: now on %q", first, o)
	}
	cl.noLeakEmu(ec, "ntaken", nil)
}
