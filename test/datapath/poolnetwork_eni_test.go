package datapath_test

import (
	"net/netip"
	"testing"

	"github.com/egressip/egressip/internal/agent/bind"
)

// TestPoolNetworkENIByMAC: the cloud path of issue 19 item 3. The egress
// IPs are bound by the agent's binder with the hint a cloud pool gives
// (status.interfaceMAC: n1's eth1 MAC, the "ENI"), and a subnet hint that
// would pick the uplink if the MAC did not win. They land on eth1 and get
// the same policy routing as a pool chosen by its subnet (the pool's
// subnetInfo gateway 198.51.100.1/24 and 2001:db8:100::1/64): selected
// Pods' flows to the server behind R2 and to the one behind the default
// router leave eth1 with the egress IP, from eth1's MAC to R2's MAC
// (counted at R2), none through br0, and the replies come back; the
// unselected Pod still leaves with n1's Node IP; both families.
func TestPoolNetworkENIByMAC(t *testing.T) {
	p := newPoolNet(t)
	c := p.f.c
	n1, n2 := c.Nodes[0], c.Nodes[1]
	eni := p.n1MAC.String()
	uplinkSubnets := map[bool]netip.Prefix{false: netip.MustParsePrefix("192.0.2.0/24"), true: netip.MustParsePrefix("2001:db8::/64")}
	hint := func(ip netip.Addr) bind.Hint { return bind.Hint{MAC: eni, Subnet: uplinkSubnets[ip.Is6()]} }
	// Without the MAC the subnet hint picks the uplink: the MAC decides.
	for _, eip := range []netip.Addr{poolEIPv4, poolEIPv6} {
		h := hint(eip)
		if l, err := bind.SelectInterface(p.nl, eip, bind.Hint{Subnet: h.Subnet}); err != nil || l.Attrs().Name != "eth0" {
			t.Fatalf("%s by subnet alone: %v %v, want eth0 (the test would not tell MAC from subnet)", eip, l, err)
		}
		if l, err := bind.SelectInterface(p.nl, eip, h); err != nil || l.Attrs().Name != "eth1" {
			t.Fatalf("%s by MAC %s: %v %v, want eth1", eip, eni, l, err)
		}
	}
	b, err := bind.New(n1.Handle, bind.Config{HintFor: hint})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	p.binder = b

	local, remote, unselected := n1.Pods[0], n2.Pods[0], n1.Pods[1]
	r, res := p.programOnSecondLink(t, local, remote)
	owned, err := b.Owned()
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range owned {
		if o.Interface != "eth1" {
			t.Errorf("%s bound on %s, want eth1 (the ENI's MAC)", o.Addr, o.Interface)
		}
	}
	if len(owned) != 2 {
		t.Errorf("bound %v, want both egress IPs", owned)
	}
	t.Logf("pool routing: %s\n%s%s", res, ipOut(t, &n1.NS, "rule"), ipOut(t, &n1.NS, "-6", "rule"))
	p.capture(t)

	p.checkTraffic(t, local, remote, unselected)

	for _, n := range c.Nodes {
		p.f.applyNode(n, nil)
	}
	if _, _, err := b.Sync(nil); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Sync(nil); err != nil {
		t.Fatal(err)
	}
	if got := ownedDump(t, &n1.NS, r.Config()); got != "" {
		t.Errorf("pool routing left after the Egresses went:\n%s", got)
	}
}
