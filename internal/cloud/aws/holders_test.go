package aws

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/egressip/egressip/internal/cloud"
	"github.com/egressip/egressip/internal/cloud/aws/ec2emu"
)

// TestNamedAddressHeldLookup: Holders finds, in one
// DescribeNetworkInterfaces call per 199 addresses, the interface that
// holds each address (a Pod IP on a Node's primary interface, a VPC CNI
// interface, a load balancer's interface, another instance's primary
// address), says nothing for free ones, and AssignFree refuses a held
// address (cloud.ErrInUse) without moving it.
func TestNamedAddressHeldLookup(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, ec2emu.Config{}, Options{})
	node := e.instance(t, "m5.large")
	other := e.instance(t, "m5.large")
	a := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	if err := e.emu.UseAddresses(node.PrimaryInterface, a("10.0.1.50")); err != nil {
		t.Fatal(err)
	}
	cni, err := e.emu.AddForeignInterface(ec2emu.ForeignInterface{SubnetID: e.subnet, InstanceID: node.ID, Description: "aws-K8S-" + node.ID, Addresses: []netip.Addr{a("10.0.1.51")}})
	if err != nil {
		t.Fatal(err)
	}
	lb, err := e.emu.AddForeignInterface(ec2emu.ForeignInterface{SubnetID: e.subnet, Type: ec2emu.TypeNetworkLoadBalancer,
		Description: "ELB net/web/0123456789abcdef", RequesterID: "amazon-elb", RequesterManaged: true, Addresses: []netip.Addr{a("10.0.1.52")}})
	if err != nil {
		t.Fatal(err)
	}
	// 250 addresses asked about: 5 held, the rest free; two calls.
	ips := []netip.Addr{a("10.0.1.50"), a("10.0.1.51"), a("10.0.1.52"), other.PrivateIP}
	for ip := a("10.0.2.0"); len(ips) < 250; ip = ip.Next() {
		ips = append(ips, ip)
	}
	e.emu.ResetCounts()
	got, err := e.p.Holders(ctx, e.subnet, ips)
	if err != nil {
		t.Fatal(err)
	}
	if n := e.emu.Calls("DescribeNetworkInterfaces"); n != 2 {
		t.Errorf("250 addresses took %d DescribeNetworkInterfaces calls, want 2", n)
	}
	want := map[netip.Addr][]string{
		a("10.0.1.50"):  {node.PrimaryInterface, "attached to instance " + node.ID},
		a("10.0.1.51"):  {cni, "attached to instance " + node.ID, `description "aws-K8S-` + node.ID + `"`, "a Pod IP of the AWS VPC CNI"},
		a("10.0.1.52"):  {lb, "attached to no instance", "type network_load_balancer", `description "ELB net/web/0123456789abcdef"`, "requester amazon-elb"},
		other.PrivateIP: {other.PrimaryInterface, "attached to instance " + other.ID, "as its primary address"},
	}
	if len(got) != len(want) {
		t.Errorf("holders of %d addresses, want %d: %v", len(got), len(want), got)
	}
	for ip, parts := range want {
		h, ok := got[ip]
		if !ok || h.InterfaceID != parts[0] {
			t.Errorf("%s: holder %+v, want %s", ip, h, parts[0])
			continue
		}
		for _, p := range parts[1:] {
			if !strings.Contains(h.String(), p) {
				t.Errorf("%s: %q does not say %q", ip, h.String(), p)
			}
		}
	}

	// AssignFree: a free address attaches; a held one is refused and
	// stays where it is, and nothing of the call is attached.
	if err := e.p.AssignFree(ctx, node.PrimaryInterface, []netip.Addr{a("10.0.2.7")}); err != nil {
		t.Fatal(err)
	}
	if o := e.emu.Owner(e.subnet, a("10.0.2.7")); o != node.PrimaryInterface {
		t.Fatalf("10.0.2.7 on %q after AssignFree", o)
	}
	err = e.p.AssignFree(ctx, node.PrimaryInterface, []netip.Addr{a("10.0.2.8"), a("10.0.1.52")})
	if !errors.Is(err, cloud.ErrInUse) {
		t.Fatalf("AssignFree of the load balancer's address: %v, want cloud.ErrInUse", err)
	}
	if o := e.emu.Owner(e.subnet, a("10.0.1.52")); o != lb {
		t.Fatalf("10.0.1.52 moved to %q", o)
	}
	if o := e.emu.Owner(e.subnet, a("10.0.2.8")); o != "" {
		t.Fatalf("10.0.2.8 attached to %q by a refused call", o)
	}
}
