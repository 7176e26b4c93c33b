package bind_test

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/egressip/egressip/internal/agent/bind"
	"github.com/egressip/egressip/internal/testutil/netnstest"
	"github.com/vishvananda/netlink"
)

// TestSelectInterface runs interface selection against a real namespace:
//
//	node0 (veth)  192.0.2.2/24, 2001:db8::2/64
//	br0 (bridge)  198.51.100.2/24, plus 203.0.113.7/32 noprefixroute
//	uplink (veth) 203.0.113.2/30, default routes for both families
func TestSelectInterface(t *testing.T) {
	p := nodeWithSubnets(t)
	n := p.Node
	n.MustIP(t, "link", "add", "br0", "type", "bridge")
	n.MustIP(t, "link", "set", "br0", "up")
	n.MustIP(t, "addr", "add", "198.51.100.2/24", "dev", "br0")
	n.MustIP(t, "addr", "add", "203.0.113.7/32", "dev", "br0", "noprefixroute")
	n.MustIP(t, "link", "add", "uplink", "type", "veth", "peer", "name", "uplink-peer")
	n.MustIP(t, "link", "set", "uplink", "up")
	n.MustIP(t, "link", "set", "uplink-peer", "up")
	n.MustIP(t, "addr", "add", "203.0.113.2/30", "dev", "uplink")
	n.MustIP(t, "addr", "add", "2001:db8:ff::2/64", "dev", "uplink")
	n.MustIP(t, "route", "add", "default", "via", "203.0.113.1", "dev", "uplink")
	n.MustIP(t, "-6", "route", "add", "default", "via", "2001:db8:ff::1", "dev", "uplink")
	h := n.Netlink(t)

	cases := []struct {
		name string
		ip   string
		hint bind.Hint
		want string
	}{
		{"explicit wins over connected subnet", "192.0.2.10", bind.Hint{Interface: "br0"}, "br0"},
		{"connected subnet IPv4 on veth", "192.0.2.10", bind.Hint{}, "node0"},
		{"connected subnet IPv4 on bridge", "198.51.100.10", bind.Hint{}, "br0"},
		{"connected subnet IPv6", "2001:db8::10", bind.Hint{}, "node0"},
		{"pool subnet hint for an IP outside every prefix", "192.0.2.200", bind.Hint{Subnet: netip.MustParsePrefix("198.51.100.0/24")}, "br0"},
		// 203.0.113.7/32 noprefixroute on br0 is not a connected subnet.
		{"default route fallback IPv4", "203.0.113.100", bind.Hint{}, "uplink"},
		{"default route fallback IPv6", "2001:db8:1234::10", bind.Hint{}, "uplink"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, err := bind.SelectInterface(h, netip.MustParseAddr(c.ip), c.hint)
			if err != nil {
				t.Fatalf("SelectInterface(%s, %+v): %v", c.ip, c.hint, err)
			}
			if got := l.Attrs().Name; got != c.want {
				t.Errorf("SelectInterface(%s, %+v) = %s; want %s", c.ip, c.hint, got, c.want)
			}
		})
	}

	// Binder uses the same selection, including Config.Interface.
	b := newBinder(t, n, bind.Config{})
	if got, err := b.Interface(netip.MustParseAddr("198.51.100.10")); err != nil || got != "br0" {
		t.Errorf("Binder.Interface = %q, %v; want br0", got, err)
	}
	bExplicit := newBinder(t, n, bind.Config{Interface: "uplink"})
	if got, err := bExplicit.Interface(netip.MustParseAddr("198.51.100.10")); err != nil || got != "uplink" {
		t.Errorf("Binder.Interface with Config.Interface = %q, %v; want uplink", got, err)
	}

	t.Run("errors", func(t *testing.T) {
		_, err := bind.SelectInterface(h, netip.MustParseAddr("192.0.2.10"), bind.Hint{Interface: "nope0"})
		if !errors.Is(err, bind.ErrNoInterface) || !strings.Contains(err.Error(), "find interface for 192.0.2.10") {
			t.Errorf("missing explicit interface: %v", err)
		}
		n.MustIP(t, "route", "del", "default")
		n.MustIP(t, "-6", "route", "del", "default")
		for _, ip := range []string{"203.0.113.100", "2001:db8:1234::10"} {
			_, err := bind.SelectInterface(h, netip.MustParseAddr(ip), bind.Hint{})
			if !errors.Is(err, bind.ErrNoInterface) || !strings.Contains(err.Error(), "find interface for "+ip) {
				t.Errorf("no route for %s: err = %v; want wrapped ErrNoInterface", ip, err)
			}
			if _, err := b.Bind(netip.MustParseAddr(ip)); !errors.Is(err, bind.ErrNoInterface) {
				t.Errorf("Bind(%s) without any interface = %v; want ErrNoInterface", ip, err)
			}
		}
	})
}

// TestSelectInterfaceNoneInEmptyNamespace: only lo, no routes.
func TestSelectInterfaceNoneInEmptyNamespace(t *testing.T) {
	ns := netnstest.NewNS(t, "empty")
	_, err := bind.SelectInterface(ns.Netlink(t), netip.MustParseAddr("192.0.2.10"), bind.Hint{})
	if !errors.Is(err, bind.ErrNoInterface) {
		t.Fatalf("err = %v; want ErrNoInterface", err)
	}
}

// fakeLinks is a LinkSource double: this kernel has no 8021q module, so VLAN
// sub-interfaces are exercised without netlink.
type fakeLinks struct {
	links  []netlink.Link
	addrs  []netlink.Addr
	routes []netlink.Route
}

func (f *fakeLinks) LinkList() ([]netlink.Link, error) { return f.links, nil }
func (f *fakeLinks) AddrList(_ netlink.Link, family int) ([]netlink.Addr, error) {
	var out []netlink.Addr
	for _, a := range f.addrs {
		if (a.IP.To4() != nil) == (family == netlink.FAMILY_V4) {
			out = append(out, a)
		}
	}
	return out, nil
}
func (f *fakeLinks) RouteListFiltered(family int, _ *netlink.Route, _ uint64) ([]netlink.Route, error) {
	var out []netlink.Route
	for _, r := range f.routes {
		if r.Family == family {
			out = append(out, r)
		}
	}
	return out, nil
}

func upAttrs(index int, name string, parent int) netlink.LinkAttrs {
	return netlink.LinkAttrs{Index: index, Name: name, ParentIndex: parent, Flags: net.FlagUp}
}

func addrOn(index int, cidr string) netlink.Addr {
	ip, ipn, err := net.ParseCIDR(cidr)
	if err != nil {
		panic(err)
	}
	ipn.IP = ip
	return netlink.Addr{IPNet: ipn, LinkIndex: index}
}

func TestSelectInterfaceVLAN(t *testing.T) {
	f := &fakeLinks{
		links: []netlink.Link{
			&netlink.Device{LinkAttrs: upAttrs(2, "eth0", 0)},
			&netlink.Device{LinkAttrs: upAttrs(3, "eth1", 0)},
			&netlink.Vlan{LinkAttrs: upAttrs(10, "eth0.100", 2), VlanId: 100},
			&netlink.Vlan{LinkAttrs: upAttrs(11, "eth0.200", 2), VlanId: 200},
			&netlink.Vlan{LinkAttrs: upAttrs(12, "eth1.100", 3), VlanId: 100},
		},
		addrs: []netlink.Addr{
			addrOn(2, "192.0.2.2/24"),
			addrOn(11, "198.51.100.2/24"),
			addrOn(3, "203.0.113.2/25"),
		},
		routes: []netlink.Route{
			{Family: netlink.FAMILY_V4, LinkIndex: 3, Priority: 100},
			{Family: netlink.FAMILY_V4, LinkIndex: 2, Priority: 50}, // lower metric wins
		},
	}
	cases := []struct {
		name string
		ip   string
		hint bind.Hint
		want string
	}{
		{"vlan child of the connected interface", "192.0.2.10", bind.Hint{VLAN: 100}, "eth0.100"},
		{"connected interface already is the vlan", "198.51.100.10", bind.Hint{VLAN: 200}, "eth0.200"},
		{"vlan child of the explicit interface", "192.0.2.10", bind.Hint{Interface: "eth1", VLAN: 100}, "eth1.100"},
		{"vlan child of the default route interface", "203.0.113.200", bind.Hint{VLAN: 200}, "eth0.200"},
		{"no vlan: default route with lowest metric", "203.0.113.200", bind.Hint{}, "eth0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			l, err := bind.SelectInterface(f, netip.MustParseAddr(c.ip), c.hint)
			if err != nil {
				t.Fatalf("SelectInterface: %v", err)
			}
			if l.Attrs().Name != c.want {
				t.Errorf("got %s; want %s", l.Attrs().Name, c.want)
			}
		})
	}
	_, err := bind.SelectInterface(f, netip.MustParseAddr("203.0.113.10"), bind.Hint{VLAN: 200})
	if !errors.Is(err, bind.ErrNoInterface) || !strings.Contains(err.Error(), "no VLAN 200 sub-interface of eth1") {
		t.Errorf("missing VLAN: err = %v", err)
	}
}

// TestSelectInterfaceByMAC: a cloud address goes on the link with the
// interface's hardware address (a second ENI here), even when another link
// has the connected subnet or is configured.
func TestSelectInterfaceByMAC(t *testing.T) {
	p := nodeWithSubnets(t)
	n := p.Node
	n.MustIP(t, "link", "add", "eni1", "address", "0a:1b:2c:3d:4e:5f", "type", "veth", "peer", "name", "eni1-peer")
	n.MustIP(t, "link", "set", "eni1", "up")
	h := n.Netlink(t)
	for _, hint := range []bind.Hint{{MAC: "0a:1b:2c:3d:4e:5f"}, {MAC: "0a:1b:2c:3d:4e:5f", Interface: p.NodeIf}} {
		l, err := bind.SelectInterface(h, netip.MustParseAddr("192.0.2.77"), hint)
		if err != nil || l.Attrs().Name != "eni1" {
			t.Fatalf("SelectInterface(MAC %+v) = %v, %v; want eni1", hint, l, err)
		}
	}
	_, err := bind.SelectInterface(h, netip.MustParseAddr("192.0.2.77"), bind.Hint{MAC: "0a:00:00:00:00:99"})
	if !errors.Is(err, bind.ErrNoInterface) {
		t.Fatalf("unknown MAC: %v, want ErrNoInterface", err)
	}
	// Binding with the hint puts the address on eni1.
	b := newBinder(t, n, bind.Config{HintFor: func(netip.Addr) bind.Hint { return bind.Hint{MAC: "0a:1b:2c:3d:4e:5f"} }})
	if _, err := b.Bind(netip.MustParseAddr("192.0.2.77")); err != nil {
		t.Fatal(err)
	}
	if a := mustAddr(t, n, netip.MustParseAddr("192.0.2.77")); a.LinkIndex != n.Interface(t, "eni1").Index {
		t.Fatalf("address on link %d, want eni1", a.LinkIndex)
	}
}
