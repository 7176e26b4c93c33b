package datapath_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	dp "github.com/egressip/egressip/test/datapath"
)

// reusedPort is the fixed local UDP port of the reused-IP test, so that
// the flow after the membership change has the same 5-tuple as before.
const reusedPort = 40123

// udpWhoFrom is dp.UDPWho from a fixed local port: it sends datagrams from
// ns (source port lport) to dst until one is answered and returns the
// source address the server saw.
func udpWhoFrom(ctx context.Context, ns *dp.NS, dst netip.Addr, lport int) (netip.Addr, error) {
	var c net.Conn
	if err := ns.Do(func() (err error) {
		d := net.Dialer{LocalAddr: &net.UDPAddr{Port: lport}}
		c, err = d.DialContext(ctx, "udp", netip.AddrPortFrom(dst, dp.ServerPort).String())
		return err
	}); err != nil {
		return netip.Addr{}, err
	}
	defer func() { _ = c.Close() }()
	buf := make([]byte, 100)
	for range 5 {
		if _, err := c.Write([]byte("who")); err != nil {
			return netip.Addr{}, err
		}
		_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		if n, err := c.Read(buf); err == nil {
			return netip.ParseAddr(string(buf[:n]))
		}
		if ctx.Err() != nil {
			return netip.Addr{}, ctx.Err()
		}
	}
	return netip.Addr{}, errors.New("no UDP reply")
}

// entriesFrom counts a Node's conntrack entries whose original source is
// src and whose connection mark carries Egress ID id (0: any mark).
func entriesFrom(t *testing.T, n *dp.Node, src netip.Addr, id uint32) int {
	t.Helper()
	h, err := n.OpenNetlink()
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	count := 0
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		flows, err := h.ConntrackTableList(netlink.ConntrackTable, fam)
		if err != nil {
			t.Fatal(err)
		}
		for _, fl := range flows {
			a, ok := netip.AddrFromSlice(fl.Forward.SrcIP)
			if !ok || a.Unmap() != src {
				continue
			}
			if id == 0 || (fl.Mark&0x0fff0000)>>16 == id {
				count++
			}
		}
	}
	return count
}

// TestReusedPodIP (test plan case 11): when a member's IP stops being a
// member of an Egress on a Node (the Pod went away and another Pod got
// its IP), the Node deletes the conntrack entries that IP opened under
// that Egress's mark, so a new flow with the very same 5-tuple is
// classified by the new State: unselected (Node IP) or another Egress
// (its egress IP). The Nodes that run the Pods know it is another Pod
// (State.Pods: another UID); the egress Node of a remote member does not
// and drains its entries (TestMoveBetweenEgresses). The Egress's role on the Node does not change (another
// member stays), so only the member-based cleanup can do this; the
// entries of the member that stays are kept.
func TestReusedPodIP(t *testing.T) {
	for _, fm := range families {
		t.Run(fm.name, func(t *testing.T) {
			f := newFixture(t)
			n1, n2, n3 := f.c.Nodes[0], f.c.Nodes[1], f.c.Nodes[2]
			// a: remote member of e1 on n1 that becomes unselected;
			// c: local member of e1 on its egress Node n2 that becomes
			// e2's (tunnelled to n3); b: stays in e1 so that e1 keeps its
			// role on n1 and n2.
			a, b, c := n1.Pods[0], n1.Pods[1], n2.Pods[0]
			ctx := ctxT(t, 60*time.Second)
			f.apply([]spec{
				{name: "e1", ip: fm.eip, node: n2, members: []*dp.Pod{a, b, c}},
				{name: "e2", ip: fm.eip2, node: n3},
			})
			for _, p := range []*dp.Pod{a, b, c} {
				if got, err := udpWhoFrom(ctx, &p.NS, fm.ext, reusedPort); err != nil || got != fm.eip {
					t.Fatalf("before: %s seen as %v (err %v), want %s", p.Name, got, err, fm.eip)
				}
			}
			id1n1, id1n2 := uint32(f.dps[n1].IDs()["e1"]), uint32(f.dps[n2].IDs()["e1"])
			aIP, bIP, cIP := a.IP(fm.v6), b.IP(fm.v6), c.IP(fm.v6)
			n1a, n2c, n2a := entriesFrom(t, n1, aIP, id1n1), entriesFrom(t, n2, cIP, id1n2), entriesFrom(t, n2, aIP, id1n2)
			if n1a == 0 || n2c == 0 || n2a == 0 {
				t.Fatalf("no e1 conntrack entries before the change: n1 a=%d, n2 c=%d, n2 a=%d", n1a, n2c, n2a)
			}
			keptB := entriesFrom(t, n1, bIP, id1n1)

			// a's and c's IPs now belong to other Pods (new UIDs).
			f.uids[a], f.uids[c] = "reused-a", "reused-c"
			f.apply([]spec{
				{name: "e1", ip: fm.eip, node: n2, members: []*dp.Pod{b}},
				{name: "e2", ip: fm.eip2, node: n3, members: []*dp.Pod{c}},
			})
			if r := f.dps[n1].IDs()["e1"]; uint32(r) != id1n1 {
				t.Fatalf("e1's ID on n1 changed (%d -> %d): the test would not isolate member cleanup", id1n1, r)
			}
			for _, tc := range []struct {
				node *dp.Node
				ip   netip.Addr
				id   uint32
			}{{n1, aIP, id1n1}, {n2, cIP, id1n2}} {
				if n := entriesFrom(t, tc.node, tc.ip, tc.id); n != 0 {
					t.Errorf("%s still holds %d conntrack entries from %s with e1's ID %d", tc.node.Name, n, tc.ip, tc.id)
				}
			}
			// The egress Node cannot tell a remote Pod that went away from
			// one that moved to another Egress (the member slice only
			// drops it): it drains a's entries (their replies go back to
			// n1, which has deleted its own and drops them), bounded.
			if n := entriesFrom(t, n2, aIP, id1n2); n == 0 {
				t.Errorf("n2 deleted the entries of the remote member a that left e1: they drain")
			}
			if n := entriesFrom(t, n1, bIP, id1n1); n != keptB {
				t.Errorf("entries of the member that stayed changed on n1: %d -> %d", keptB, n)
			}

			for _, tc := range []struct {
				pod  *dp.Pod
				want netip.Addr
			}{
				{a, n1.NodeIP(fm.v6)}, // unselected now
				{c, fm.eip2},          // e2's member now
				{b, fm.eip},           // unchanged
			} {
				got, err := udpWhoFrom(ctx, &tc.pod.NS, fm.ext, reusedPort)
				if err != nil || got != tc.want {
					t.Errorf("after: same 5-tuple from %s seen as %v (err %v), want %s", tc.pod.Name, got, err, tc.want)
				}
			}
		})
	}
}
