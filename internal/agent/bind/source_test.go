package bind_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/egressip/egressip/internal/agent/bind"
	"github.com/egressip/egressip/internal/testutil/netnstest"
)

// TestNodeSourceUnchanged (issue 23 fault 4): the Node has only a host
// address and an on-link default route (a common cloud and DHCP layout);
// binding an egress IP, then removing and re-adding the Node's own
// address (a DHCP renewal) in either order, never makes the egress IP the
// source of the Node's own traffic, in both families. The egress IP still
// answers ARP / Neighbor Solicitations and accepts connections from the
// peer (the path SNATed replies take).
func TestNodeSourceUnchanged(t *testing.T) {
	for _, tc := range []struct {
		name               string
		own, gw, peer, eip string
		ownBits, peerBits  string
		dst                string
		family             string
	}{
		{"ipv4", "192.0.2.11", "192.0.2.1", "192.0.2.1", "192.0.2.100", "/32", "/24", "203.0.113.5", "-4"},
		{"ipv6", "2001:db8::11", "2001:db8::1", "2001:db8::1", "2001:db8::100", "/128", "/64", "2001:db8:ff::5", "-6"},
	} {
		for _, order := range []string{"bind then renew", "renew then bind"} {
			t.Run(tc.name+"/"+order, func(t *testing.T) {
				p := netnstest.NewPair(t)
				own := []string{"addr", "add", tc.own + tc.ownBits, "dev", p.NodeIf}
				if tc.family == "-6" {
					// Without DAD: while a re-added IPv6 address is
					// tentative (about 1 s) the kernel has no other
					// global source and takes the deprecated egress IP,
					// a gap no binding closes; the datapath's source
					// guard stops those packets instead
					// (TestNodeSourceUnchangedDuringDAD in
					// test/datapath; docs/agent.md).
					own = append(own, "nodad")
					p.Peer.MustIP(t, "addr", "add", tc.peer+tc.peerBits, "dev", p.PeerIf, "nodad")
				} else {
					p.Peer.MustIP(t, "addr", "add", tc.peer+tc.peerBits, "dev", p.PeerIf)
				}
				p.Node.MustIP(t, own...)
				p.Node.MustIP(t, tc.family, "route", "add", "default", "via", tc.gw, "dev", p.NodeIf, "onlink")
				b := newBinder(t, p.Node, bind.Config{Interface: p.NodeIf})
				eip := netip.MustParseAddr(tc.eip)
				renew := func() {
					p.Node.MustIP(t, "addr", "del", tc.own+tc.ownBits, "dev", p.NodeIf)
					p.Node.MustIP(t, own...)
					p.Node.MustIP(t, tc.family, "route", "replace", "default", "via", tc.gw, "dev", p.NodeIf, "onlink")
				}
				if order == "renew then bind" {
					renew()
					mustBind(t, b, eip)
				} else {
					mustBind(t, b, eip)
					renew()
				}
				// The agent's resync binds again: it must not change it either.
				if _, err := b.Bind(eip); err != nil {
					t.Fatalf("resync Bind: %v", err)
				}
				// IPv4 selects by list order: check that the egress IP comes
				// first. IPv6 selects by RFC 6724 rules, whatever the order.
				list := p.Node.MustIP(t, tc.family, "addr", "show", "dev", p.NodeIf)
				if i, j := strings.Index(list, tc.eip+"/"), strings.Index(list, tc.own+"/"); tc.family == "-4" && order == "bind then renew" && (i < 0 || j < 0 || i > j) {
					t.Fatalf("the egress IP is not listed before the Node's own address, the case under test:\n%s", list)
				}
				for _, dst := range []string{tc.dst, tc.gw} {
					out := p.Node.MustIP(t, tc.family, "route", "get", dst)
					if !strings.Contains(out, "src "+tc.own+" ") {
						t.Errorf("route get %s: %s; want src %s (addresses:\n%s)", dst, strings.TrimSpace(out), tc.own, list)
					}
				}
				// The peer reaches the egress IP: ARP/NS answered, and a
				// TCP SYN to a closed port draws a reset from it.
				if err := reach(p.Peer, eip); err != nil {
					t.Errorf("peer to the egress IP %s: %v", eip, err)
				}
			})
		}
	}
}

// reach connects from ns to ip:9 (nothing listens): ECONNREFUSED means the
// address was resolved on the link and answered.
func reach(ns *netnstest.NS, ip netip.Addr) error {
	return ns.Do(func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", netip.AddrPortFrom(ip, 9).String())
		if err == nil {
			_ = c.Close()
			return nil
		}
		if errors.Is(err, unix.ECONNREFUSED) {
			return nil
		}
		return err
	})
}

// TestNodeSourceUnchangedAfterUpgrade: an owned IPv4 egress IP that an
// older agent bound with scope universe is rebound with scope host by the
// next Bind, and the Node's source is its own address again.
func TestNodeSourceUnchangedAfterUpgrade(t *testing.T) {
	p := netnstest.NewPair(t)
	p.Node.MustIP(t, "addr", "add", "192.0.2.11/32", "dev", p.NodeIf)
	p.Node.MustIP(t, "route", "add", "default", "via", "192.0.2.1", "dev", p.NodeIf, "onlink")
	p.Peer.MustIP(t, "addr", "add", "192.0.2.1/24", "dev", p.PeerIf)
	idx := p.Node.Interface(t, p.NodeIf).Index
	eip := netip.MustParseAddr("192.0.2.100")
	// As the old agent did: scope universe, noprefixroute, our mark
	// (iproute2 6.1 cannot set the address protocol, so by hand).
	err := p.Node.Do(func() error {
		req := nl.NewNetlinkRequest(unix.RTM_NEWADDR, unix.NLM_F_CREATE|unix.NLM_F_EXCL|unix.NLM_F_ACK)
		msg := nl.NewIfAddrmsg(unix.AF_INET)
		msg.Prefixlen, msg.Scope, msg.Index = 32, unix.RT_SCOPE_UNIVERSE, uint32(idx)
		req.AddData(msg)
		req.AddData(nl.NewRtAttr(unix.IFA_LOCAL, eip.AsSlice()))
		req.AddData(nl.NewRtAttr(unix.IFA_ADDRESS, eip.AsSlice()))
		req.AddData(nl.NewRtAttr(unix.IFA_FLAGS, nl.Uint32Attr(unix.IFA_F_NOPREFIXROUTE)))
		req.AddData(nl.NewRtAttr(11 /* IFA_PROTO */, nl.Uint8Attr(bind.DefaultProto)))
		_, err := req.Execute(unix.NETLINK_ROUTE, 0)
		return err
	})
	if err != nil {
		t.Fatalf("add the old-style address: %v", err)
	}
	p.Node.MustIP(t, "addr", "del", "192.0.2.11/32", "dev", p.NodeIf)
	p.Node.MustIP(t, "addr", "add", "192.0.2.11/32", "dev", p.NodeIf)
	p.Node.MustIP(t, "route", "replace", "default", "via", "192.0.2.1", "dev", p.NodeIf, "onlink")
	if out := p.Node.MustIP(t, "route", "get", "203.0.113.5"); !strings.Contains(out, "src 192.0.2.100 ") {
		t.Fatalf("the old-style address should be the source before the upgrade (the fault): %s", out)
	}
	b := newBinder(t, p.Node, bind.Config{Interface: p.NodeIf})
	if changed, err := b.Bind(eip); err != nil || !changed {
		t.Fatalf("Bind = %v, %v; want changed (rebound with scope host)", changed, err)
	}
	if out := p.Node.MustIP(t, "-4", "addr", "show", "dev", p.NodeIf); !strings.Contains(out, "192.0.2.100/32 scope host") {
		t.Errorf("after Bind: %s; want 192.0.2.100/32 scope host", out)
	}
	if out := p.Node.MustIP(t, "route", "get", "203.0.113.5"); !strings.Contains(out, "src 192.0.2.11 ") {
		t.Errorf("after Bind: %s; want src 192.0.2.11", out)
	}
	if owned, err := b.Owned(); err != nil || len(owned) != 1 || owned[0].Addr != eip {
		t.Errorf("Owned = %v, %v; want only %s", owned, err, eip)
	}
	if changed, err := b.Bind(eip); err != nil || changed {
		t.Errorf("second Bind = %v, %v; want unchanged", changed, err)
	}
	if err := reach(p.Peer, eip); err != nil {
		t.Errorf("peer to the egress IP: %v", err)
	}
}
