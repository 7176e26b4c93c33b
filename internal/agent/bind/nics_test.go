package bind_test

import (
	"net"
	"slices"
	"testing"

	"github.com/egressip/egressip/internal/agent/bind"
	"github.com/egressip/egressip/internal/testutil/netnstest"
	"github.com/vishvananda/netlink"
)

func mac(t *testing.T, s string) net.HardwareAddr {
	t.Helper()
	m, err := net.ParseMAC(s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestDeviceMACs is a table over links built in memory: this kernel has no
// NIC driver to create a link of type "device" other than loopback in a
// namespace, so the links a cloud instance has (ENA interfaces) are
// doubles here; TestBinderNICsLeavesVirtualLinksOut runs the real netlink
// path.
func TestDeviceMACs(t *testing.T) {
	nic := func(name, m string) netlink.Link {
		return &netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: name, HardwareAddr: mac(t, m)}}
	}
	links := []netlink.Link{
		nic("ens6", "0A:00:00:00:00:02"), // upper case in, lower case out
		nic("ens5", "0a:00:00:00:00:01"),
		&netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "lo", HardwareAddr: mac(t, "00:00:00:00:00:00"), Flags: net.FlagLoopback}},
		&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "eni1234", HardwareAddr: mac(t, "0a:00:00:00:00:10")}},
		&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "cni0", HardwareAddr: mac(t, "0a:00:00:00:00:11")}},
		&netlink.Macvlan{LinkAttrs: netlink.LinkAttrs{Name: "mv0", HardwareAddr: mac(t, "0a:00:00:00:00:12")}},
		&netlink.Device{LinkAttrs: netlink.LinkAttrs{Name: "ib0", HardwareAddr: make(net.HardwareAddr, 20)}}, // not Ethernet
		nic("bond-port", "0a:00:00:00:00:01"), // same MAC twice
	}
	if got, want := bind.DeviceMACs(links, 32), []string{"0a:00:00:00:00:01", "0a:00:00:00:00:02"}; !slices.Equal(got, want) {
		t.Errorf("DeviceMACs = %v, want %v", got, want)
	}
	if got, want := bind.DeviceMACs(links, 1), []string{"0a:00:00:00:00:01"}; !slices.Equal(got, want) {
		t.Errorf("DeviceMACs(max 1) = %v, want %v", got, want)
	}
}

// TestBinderNICsLeavesVirtualLinksOut: through real netlink in a
// namespace holding loopback, a veth and a macvlan on it (the links Pods
// and CNIs add), the Binder reports no NIC: none of them is a device.
func TestBinderNICsLeavesVirtualLinksOut(t *testing.T) {
	p := netnstest.NewPair(t)
	p.Node.MustIP(t, "link", "add", "mv0", "link", p.NodeIf, "type", "macvlan", "mode", "bridge")
	p.Node.MustIP(t, "link", "set", "mv0", "up")
	b := newBinder(t, p.Node, bind.Config{})
	got, err := b.NICs(32)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Errorf("NICs = %v, want none (loopback, veth and macvlan are not NICs)", got)
	}
	links, err := p.Node.Netlink(t).LinkList()
	if err != nil {
		t.Fatal(err)
	}
	if len(links) < 3 {
		t.Fatalf("namespace has %d links, want lo, %s and mv0", len(links), p.NodeIf)
	}
}
