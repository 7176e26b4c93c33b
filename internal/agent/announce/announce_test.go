package announce_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/egressip/egressip/internal/agent/announce"
	"github.com/egressip/egressip/internal/agent/bind"
	"github.com/egressip/egressip/internal/testutil/netnstest"
	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// setup is a node namespace with its own addresses (global IPv6 first) and a
// peer namespace capturing on the other end of the veth.
type setup struct {
	p       *netnstest.Pair
	nodeMAC net.HardwareAddr
	cap     *capture
}

func newSetup(t *testing.T) *setup {
	t.Helper()
	p := netnstest.NewPair(t)
	p.Node.MustIP(t, "addr", "add", "192.0.2.2/24", "dev", p.NodeIf)
	p.Node.MustIP(t, "addr", "add", "2001:db8::2/64", "dev", p.NodeIf)
	p.Peer.MustIP(t, "addr", "add", "192.0.2.1/24", "dev", p.PeerIf)
	p.Peer.MustIP(t, "addr", "add", "2001:db8::1/64", "dev", p.PeerIf)
	s := &setup{p: p, nodeMAC: p.Node.Interface(t, p.NodeIf).HardwareAddr}
	s.cap = startCapture(t, p.Peer, p.PeerIf)
	return s
}

func newAnnouncer(t testing.TB, ns netns.NsHandle, cfg announce.Config) *announce.Announcer {
	t.Helper()
	a, err := announce.New(ns, cfg)
	if err != nil {
		t.Fatalf("announce.New: %v", err)
	}
	t.Cleanup(func() { _ = a.Close() })
	return a
}

func newBinder(t testing.TB, ns netns.NsHandle) *bind.Binder {
	t.Helper()
	b, err := bind.New(ns, bind.Config{})
	if err != nil {
		t.Fatalf("bind.New: %v", err)
	}
	t.Cleanup(b.Close)
	return b
}

func checkGARP(t *testing.T, g garp, ip netip.Addr, mac net.HardwareAddr) {
	t.Helper()
	if !bytes.Equal(g.eth.Destination, ethernet.Broadcast) || !bytes.Equal(g.eth.Source, mac) {
		t.Errorf("GARP Ethernet %s -> %s; want %s -> broadcast", g.eth.Source, g.eth.Destination, mac)
	}
	p := g.arp
	if p.Operation != arp.OperationRequest || !bytes.Equal(p.SenderHardwareAddr, mac) ||
		p.SenderIP != ip || p.TargetIP != ip || !bytes.Equal(p.TargetHardwareAddr, make(net.HardwareAddr, 6)) {
		t.Errorf("GARP = op %v sender %s/%s target %s/%s; want request sender %s/%s target 00:00:00:00:00:00/%s",
			p.Operation, p.SenderHardwareAddr, p.SenderIP, p.TargetHardwareAddr, p.TargetIP, mac, ip, ip)
	}
}

func checkNA(t *testing.T, n na, ip netip.Addr, mac net.HardwareAddr) {
	t.Helper()
	allNodesMAC := net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}
	if !bytes.Equal(n.eth.Destination, allNodesMAC) || !bytes.Equal(n.eth.Source, mac) {
		t.Errorf("NA Ethernet %s -> %s; want %s -> %s", n.eth.Source, n.eth.Destination, mac, allNodesMAC)
	}
	src, _ := netip.AddrFromSlice(n.ip6.Src)
	dst, _ := netip.AddrFromSlice(n.ip6.Dst)
	if !src.IsLinkLocalUnicast() || dst != netip.IPv6LinkLocalAllNodes() || n.ip6.HopLimit != 255 {
		t.Errorf("NA IPv6 %s -> %s hop limit %d; want link-local -> ff02::1 hop limit 255", src, dst, n.ip6.HopLimit)
	}
	if !n.na.Override || n.na.Solicited || n.na.Router || n.na.TargetAddress != ip {
		t.Errorf("NA = %+v; want Override, not Solicited, not Router, target %s", n.na, ip)
	}
	var tlla net.HardwareAddr
	for _, o := range n.na.Options {
		if l, ok := o.(*ndp.LinkLayerAddress); ok && l.Direction == ndp.Target {
			tlla = l.Addr
		}
	}
	if !bytes.Equal(tlla, mac) {
		t.Errorf("NA target link-layer address = %s; want %s", tlla, mac)
	}
}

// neighMAC reads the peer's neighbour entry for ip.
func neighMAC(t *testing.T, ns *netnstest.NS, ifname string, ip netip.Addr) net.HardwareAddr {
	t.Helper()
	h := ns.Netlink(t)
	l, err := h.LinkByName(ifname)
	if err != nil {
		t.Fatal(err)
	}
	fam := netlink.FAMILY_V4
	if ip.Is6() {
		fam = netlink.FAMILY_V6
	}
	neighs, err := h.NeighList(l.Attrs().Index, fam)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range neighs {
		if a, ok := netip.AddrFromSlice(n.IP); ok && a.Unmap() == ip {
			return n.HardwareAddr
		}
	}
	return nil
}

// TestBindAnnounceAndPing is the agent's path end to end: bind an IPv4 and
// an IPv6 egress IP, announce them, and check what the peer sees: the GARP
// and the unsolicited NA, its neighbour cache moved from a stale MAC (the
// "previous Node") to ours, and echo replies from both IPs.
func TestBindAnnounceAndPing(t *testing.T) {
	s := newSetup(t)
	v4, v6 := netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::10")
	oldMAC := "02:00:5e:00:53:01"
	for _, ip := range []netip.Addr{v4, v6} {
		s.p.Peer.MustIP(t, "neigh", "add", ip.String(), "lladdr", oldMAC, "dev", s.p.PeerIf, "nud", "stale")
	}

	b := newBinder(t, s.p.Node.Handle)
	var mu sync.Mutex
	var events []announce.Event
	a := newAnnouncer(t, s.p.Node.Handle, announce.Config{OnEvent: func(e announce.Event) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}})
	for _, ip := range []netip.Addr{v4, v6} {
		if _, err := b.Bind(ip); err != nil {
			t.Fatalf("Bind(%s): %v", ip, err)
		}
		ifname, err := b.Interface(ip)
		if err != nil || ifname != s.p.NodeIf {
			t.Fatalf("Interface(%s) = %q, %v", ip, ifname, err)
		}
		a.Start(ip, ifname)
	}

	g, ok := s.cap.garpFor(v4, 3*time.Second)
	if !ok {
		t.Fatal("peer saw no GARP")
	}
	checkGARP(t, g, v4, s.nodeMAC)
	n, ok := s.cap.naFor(v6, 3*time.Second)
	if !ok {
		t.Fatal("peer saw no unsolicited NA")
	}
	checkNA(t, n, v6, s.nodeMAC)

	for _, ip := range []netip.Addr{v4, v6} {
		if got := neighMAC(t, s.p.Peer, s.p.PeerIf, ip); !bytes.Equal(got, s.nodeMAC) {
			t.Errorf("peer neighbour entry for %s = %s; want %s (was %s)", ip, got, s.nodeMAC, oldMAC)
		}
		if err := ping(t, s.p.Peer, ip); err != nil {
			t.Errorf("ping %s from peer: %v", ip, err)
		}
	}

	for _, ip := range []netip.Addr{v4, v6} {
		a.Stop(ip)
	}
	st := a.Stats()
	if st.ARPSent < 1 || st.NASent < 1 || st.ARPErrors != 0 || st.NAErrors != 0 {
		t.Errorf("Stats = %+v; want >=1 sent per family, no errors", st)
	}
	mu.Lock()
	defer mu.Unlock()
	if uint64(len(events)) != st.ARPSent+st.NASent {
		t.Errorf("%d events for %+v", len(events), st)
	}
	for _, e := range events {
		if e.Err != nil || e.Interface != s.p.NodeIf || (e.Family == announce.IPv4) != e.IP.Is4() {
			t.Errorf("event %+v", e)
		}
	}
}

// TestFamiliesDoNotMix: IPv4 gets ARP only, IPv6 gets NA only, and the NA
// comes from the link-local address although the global one is listed first.
func TestFamiliesDoNotMix(t *testing.T) {
	s := newSetup(t)
	a := newAnnouncer(t, s.p.Node.Handle, announce.Config{})
	b := newBinder(t, s.p.Node.Handle)
	v4, v6 := netip.MustParseAddr("192.0.2.11"), netip.MustParseAddr("2001:db8::11")
	for _, ip := range []netip.Addr{v4, v6} {
		if _, err := b.Bind(ip); err != nil {
			t.Fatal(err)
		}
	}
	// The first IPv6 address the node lists is global, not link-local.
	h := s.p.Node.Netlink(t)
	l, _ := h.LinkByName(s.p.NodeIf)
	list, err := h.AddrList(l, netlink.FAMILY_V6)
	if err != nil || len(list) == 0 || list[0].IP.IsLinkLocalUnicast() {
		t.Fatalf("want a global IPv6 address listed first, got %v (%v)", list, err)
	}
	var linkLocal netip.Addr
	for _, ad := range list {
		if ad.IP.IsLinkLocalUnicast() {
			linkLocal, _ = netip.AddrFromSlice(ad.IP)
		}
	}

	if err := a.Send(v4, s.p.NodeIf); err != nil {
		t.Fatal(err)
	}
	if arps, nas := s.cap.drain(s.nodeMAC, 300*time.Millisecond); arps != 1 || nas != 0 {
		t.Errorf("IPv4 announcement: peer saw %d ARP, %d NA; want 1, 0", arps, nas)
	}
	if err := a.Send(v6, s.p.NodeIf); err != nil {
		t.Fatal(err)
	}
	n, ok := s.cap.naFor(v6, time.Second)
	if !ok {
		t.Fatal("no NA")
	}
	checkNA(t, n, v6, s.nodeMAC)
	if src, _ := netip.AddrFromSlice(n.ip6.Src); src != linkLocal {
		t.Errorf("NA source %s; want the link-local %s", src, linkLocal)
	}
	if arps, nas := s.cap.drain(s.nodeMAC, 300*time.Millisecond); arps != 0 || nas != 0 {
		t.Errorf("after the IPv6 announcement: %d more ARP, %d more NA; want none", arps, nas)
	}
	if st := a.Stats(); st != (announce.Stats{ARPSent: 1, NASent: 1}) {
		t.Errorf("Stats = %+v; want 1 ARP, 1 NA", st)
	}
}

// TestNAWithoutLinkLocal: with no link-local address the NA is sourced from
// the egress IP itself.
func TestNAWithoutLinkLocal(t *testing.T) {
	s := newSetup(t)
	s.p.Node.MustIP(t, "-6", "addr", "flush", "dev", s.p.NodeIf, "scope", "link")
	b := newBinder(t, s.p.Node.Handle)
	ip := netip.MustParseAddr("2001:db8::12")
	if _, err := b.Bind(ip); err != nil {
		t.Fatal(err)
	}
	a := newAnnouncer(t, s.p.Node.Handle, announce.Config{})
	if err := a.Send(ip, s.p.NodeIf); err != nil {
		t.Fatal(err)
	}
	n, ok := s.cap.naFor(ip, time.Second)
	if !ok {
		t.Fatal("no NA")
	}
	if src, _ := netip.AddrFromSlice(n.ip6.Src); src != ip || n.ip6.HopLimit != 255 || !n.na.Override {
		t.Errorf("NA from %s hop limit %d override %v; want from %s, 255, true", src, n.ip6.HopLimit, n.na.Override, ip)
	}
}

// TestScheduleRefreshAndCancel exercises the burst schedule, the periodic
// refresh and cancellation with short intervals. Counts are checked against
// what the peer captured, not against wall-clock timing.
func TestScheduleRefreshAndCancel(t *testing.T) {
	s := newSetup(t)
	ip := netip.MustParseAddr("192.0.2.13")
	b := newBinder(t, s.p.Node.Handle)
	if _, err := b.Bind(ip); err != nil {
		t.Fatal(err)
	}

	t.Run("burst", func(t *testing.T) {
		a := newAnnouncer(t, s.p.Node.Handle, announce.Config{
			Schedule: []time.Duration{100 * time.Millisecond, 0, 200 * time.Millisecond},
		})
		start := time.Now()
		if err := a.Announce(context.Background(), ip, s.p.NodeIf); err != nil {
			t.Fatalf("Announce: %v", err)
		}
		if el := time.Since(start); el < 200*time.Millisecond {
			t.Errorf("burst finished after %s, before its last offset", el)
		}
		arps, _ := s.cap.drain(s.nodeMAC, 400*time.Millisecond)
		if arps != 3 || a.Stats().ARPSent != 3 {
			t.Errorf("burst of 3: peer saw %d, Stats %+v", arps, a.Stats())
		}
	})

	t.Run("refresh until cancelled", func(t *testing.T) {
		a := newAnnouncer(t, s.p.Node.Handle, announce.Config{
			Schedule: []time.Duration{0},
			Refresh:  40 * time.Millisecond,
		})
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		if err := a.Announce(ctx, ip, s.p.NodeIf); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Announce with refresh = %v; want it to run until the deadline", err)
		}
		arps, _ := s.cap.drain(s.nodeMAC, 200*time.Millisecond)
		sent := a.Stats().ARPSent
		if sent < 3 || uint64(arps) != sent {
			t.Errorf("refresh: sent %d, peer saw %d; want the same count, >= 3", sent, arps)
		}
	})

	t.Run("cancel mid-burst", func(t *testing.T) {
		a := newAnnouncer(t, s.p.Node.Handle, announce.Config{
			Schedule: []time.Duration{0, 5 * time.Second},
		})
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- a.Announce(ctx, ip, s.p.NodeIf) }()
		if _, ok := s.cap.garpFor(ip, 2*time.Second); !ok {
			t.Fatal("no first GARP")
		}
		cancel()
		select {
		case err := <-errc:
			if !errors.Is(err, context.Canceled) {
				t.Errorf("Announce = %v; want context.Canceled", err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("Announce did not return after cancel")
		}
		if st := a.Stats(); st.ARPSent != 1 {
			t.Errorf("Stats = %+v; want exactly the first GARP", st)
		}
	})

	t.Run("start, restart and stop", func(t *testing.T) {
		a := newAnnouncer(t, s.p.Node.Handle, announce.Config{}) // default 0,1,2,4 s
		a.Start(ip, s.p.NodeIf)
		if _, ok := s.cap.garpFor(ip, 2*time.Second); !ok {
			t.Fatal("no GARP after Start")
		}
		a.Start(ip, s.p.NodeIf) // restarts the burst: another immediate GARP
		if _, ok := s.cap.garpFor(ip, 2*time.Second); !ok {
			t.Fatal("no GARP after restart")
		}
		if r := a.Running(); len(r) != 1 || r[0] != ip {
			t.Errorf("Running() = %v; want [%s]", r, ip)
		}
		a.Stop(ip)
		if r := a.Running(); len(r) != 0 {
			t.Errorf("Running() after Stop = %v", r)
		}
		sent := a.Stats().ARPSent
		if arps, _ := s.cap.drain(s.nodeMAC, 1300*time.Millisecond); arps != 0 || a.Stats().ARPSent != sent {
			t.Errorf("after Stop: %d more GARPs seen, Stats %d -> %d", arps, sent, a.Stats().ARPSent)
		}
		if err := a.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		a.Start(ip, s.p.NodeIf) // no-op after Close
		if len(a.Running()) != 0 {
			t.Error("Start after Close started a run")
		}
	})
}

// TestSendErrorsAreCounted needs no root: the interface does not exist.
func TestSendErrorsAreCounted(t *testing.T) {
	var got []announce.Event
	a := newAnnouncer(t, netns.None(), announce.Config{
		Schedule: []time.Duration{0, time.Millisecond},
		OnEvent:  func(e announce.Event) { got = append(got, e) },
	})
	missing := "egt-missing0"
	err := a.Announce(context.Background(), netip.MustParseAddr("192.0.2.50"), missing)
	if err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("Announce on a missing interface = %v; want an error naming it", err)
	}
	if err := a.Send(netip.MustParseAddr("2001:db8::50"), missing); err == nil {
		t.Error("Send on a missing interface succeeded")
	}
	if st := a.Stats(); st != (announce.Stats{ARPErrors: 2, NAErrors: 1}) {
		t.Errorf("Stats = %+v; want 2 ARP errors, 1 NA error", st)
	}
	if len(got) != 3 || got[0].Err == nil || got[0].Family != announce.IPv4 || got[2].Family != announce.IPv6 {
		t.Errorf("events = %+v", got)
	}
}

func TestConfigValidation(t *testing.T) {
	if _, err := announce.New(netns.None(), announce.Config{Schedule: []time.Duration{-time.Second}}); err == nil {
		t.Error("negative schedule offset accepted")
	}
	if _, err := announce.New(netns.None(), announce.Config{Refresh: -time.Second}); err == nil {
		t.Error("negative refresh accepted")
	}
}
