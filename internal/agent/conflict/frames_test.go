package conflict

import (
	"encoding/binary"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
)

var (
	ourMAC   = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
	rogueMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x99}
	ip4      = netip.MustParseAddr("192.0.2.70")
	ip6      = netip.MustParseAddr("2001:db8::70")
)

func TestARPProbeFrame(t *testing.T) {
	b, err := ARPProbe(ourMAC, ip4)
	if err != nil {
		t.Fatal(err)
	}
	var f ethernet.Frame
	if err := f.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	var p arp.Packet
	if err := p.UnmarshalBinary(f.Payload); err != nil {
		t.Fatal(err)
	}
	// RFC 5227 section 2.1.1: a request, sender IP all zeroes, target
	// hardware address zero, broadcast.
	if f.Destination.String() != ethernet.Broadcast.String() || f.Source.String() != ourMAC.String() || p.Operation != arp.OperationRequest ||
		!p.SenderIP.IsUnspecified() || p.SenderHardwareAddr.String() != ourMAC.String() || p.TargetIP != ip4 || !isZeroMAC(p.TargetHardwareAddr) {
		t.Fatalf("probe = %+v / %+v", f, p)
	}
	if _, ok := ParseARP(b); ok {
		t.Fatal("a probe (sender IP 0.0.0.0) parsed as a claim")
	}
	for _, bad := range []struct {
		mac net.HardwareAddr
		ip  netip.Addr
	}{{ourMAC, ip6}, {nil, ip4}, {net.HardwareAddr{1, 2, 3}, ip4}} {
		if _, err := ARPProbe(bad.mac, bad.ip); err == nil {
			t.Errorf("ARPProbe(%v, %v) did not fail", bad.mac, bad.ip)
		}
	}
}

func arpFrame(t *testing.T, op arp.Operation, sha net.HardwareAddr, sip netip.Addr, tip netip.Addr) []byte {
	t.Helper()
	p, err := arp.NewPacket(op, sha, sip, ourMAC, tip)
	if err != nil {
		t.Fatal(err)
	}
	pl, err := p.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	b, err := (&ethernet.Frame{Destination: ourMAC, Source: sha, EtherType: ethernet.EtherTypeARP, Payload: pl}).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseARP(t *testing.T) {
	for _, tc := range []struct {
		name  string
		frame []byte
		want  Answer
		ok    bool
	}{
		{"reply to a probe (Linux: target IP 0.0.0.0)", arpFrame(t, arp.OperationReply, rogueMAC, ip4, netip.IPv4Unspecified()), Answer{ip4, rogueMAC}, true},
		{"gratuitous request", arpFrame(t, arp.OperationRequest, rogueMAC, ip4, ip4), Answer{ip4, rogueMAC}, true},
		{"probe of someone else", arpFrame(t, arp.OperationRequest, rogueMAC, netip.IPv4Unspecified(), ip4), Answer{}, false},
		{"truncated", arpFrame(t, arp.OperationReply, rogueMAC, ip4, ip4)[:20], Answer{}, false},
		{"not ARP", func() []byte {
			b, _ := (&ethernet.Frame{Destination: ourMAC, Source: rogueMAC, EtherType: ethernet.EtherTypeIPv4, Payload: make([]byte, 46)}).MarshalBinary()
			return b
		}(), Answer{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ParseARP(tc.frame)
			if ok != tc.ok || (ok && (got.IP != tc.want.IP || got.MAC.String() != tc.want.MAC.String())) {
				t.Fatalf("ParseARP = %v %v, %v; want %v %v, %v", got.IP, got.MAC, ok, tc.want.IP, tc.want.MAC, tc.ok)
			}
		})
	}
}

func TestNSProbeFrame(t *testing.T) {
	b, err := NSProbe(ourMAC, ip6)
	if err != nil {
		t.Fatal(err)
	}
	var f ethernet.Frame
	if err := f.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	snm, _ := ndp.SolicitedNodeMulticast(ip6) // ff02::1:ff00:70
	h := f.Payload
	if f.Destination.String() != "33:33:ff:00:00:70" || f.EtherType != etherTypeIPv6 || h[0]>>4 != 6 || h[6] != 58 || h[7] != 255 {
		t.Fatalf("frame header: dst %v type %v ip %x", f.Destination, f.EtherType, h[:8])
	}
	src, _ := netip.AddrFromSlice(h[8:24])
	dst, _ := netip.AddrFromSlice(h[24:40])
	if !src.IsUnspecified() || dst != snm {
		t.Fatalf("src %v dst %v, want :: and %v", src, dst, snm)
	}
	n := int(binary.BigEndian.Uint16(h[4:6]))
	body := h[40 : 40+n]
	m, err := ndp.ParseMessage(body)
	if err != nil {
		t.Fatal(err)
	}
	ns, ok := m.(*ndp.NeighborSolicitation)
	if !ok || ns.TargetAddress != ip6 || len(ns.Options) != 0 {
		t.Fatalf("message %#v: want an NS for %v without options (RFC 4861 4.3: no SLLA from ::)", m, ip6)
	}
	if checksum(src, dst, body) != 0 {
		t.Fatal("ICMPv6 checksum does not verify")
	}
	if _, ok := ParseNA(b); ok {
		t.Fatal("an NS parsed as an NA")
	}
	for _, bad := range []netip.Addr{ip4, netip.IPv6Unspecified(), netip.MustParseAddr("ff02::1")} {
		if _, err := NSProbe(ourMAC, bad); err == nil {
			t.Errorf("NSProbe(%v) did not fail", bad)
		}
	}
}

// checksum is the ICMPv6 checksum over the pseudo-header (RFC 8200
// section 8.1) and body; 0 when body's checksum field is right.
func checksum(src, dst netip.Addr, body []byte) uint16 {
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(b[i])<<8 | uint32(b[i+1])
		}
		if len(b)%2 == 1 {
			sum += uint32(b[len(b)-1]) << 8
		}
	}
	s, d := src.As16(), dst.As16()
	add(s[:])
	add(d[:])
	var l [8]byte
	binary.BigEndian.PutUint32(l[:4], uint32(len(body)))
	l[7] = 58
	add(l[:])
	add(body)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

func naFrame(t *testing.T, src net.HardwareAddr, target netip.Addr, tlla net.HardwareAddr, hop byte) []byte {
	t.Helper()
	na := &ndp.NeighborAdvertisement{Override: true, TargetAddress: target}
	if tlla != nil {
		na.Options = []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: tlla}}
	}
	from := netip.MustParseAddr("fe80::99")
	icmp, err := ndp.MarshalMessageChecksum(na, from, netip.IPv6LinkLocalAllNodes())
	if err != nil {
		t.Fatal(err)
	}
	h := make([]byte, 40)
	h[0], h[6], h[7] = 6<<4, 58, hop
	binary.BigEndian.PutUint16(h[4:6], uint16(len(icmp)))
	s, d := from.As16(), netip.IPv6LinkLocalAllNodes().As16()
	copy(h[8:24], s[:])
	copy(h[24:40], d[:])
	b, err := (&ethernet.Frame{Destination: net.HardwareAddr{0x33, 0x33, 0, 0, 0, 1}, Source: src, EtherType: etherTypeIPv6, Payload: append(h, icmp...)}).MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseNA(t *testing.T) {
	other := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x55}
	for _, tc := range []struct {
		name  string
		frame []byte
		want  Answer
		ok    bool
	}{
		{"NA with target link-layer address", naFrame(t, rogueMAC, ip6, rogueMAC, 255), Answer{ip6, rogueMAC}, true},
		{"the option wins over the frame's source (a proxy or bridge)", naFrame(t, other, ip6, rogueMAC, 255), Answer{ip6, rogueMAC}, true},
		{"no option: the frame's source", naFrame(t, rogueMAC, ip6, nil, 255), Answer{ip6, rogueMAC}, true},
		{"hop limit below 255 (RFC 4861 7.1.2)", naFrame(t, rogueMAC, ip6, rogueMAC, 64), Answer{}, false},
		{"truncated", naFrame(t, rogueMAC, ip6, rogueMAC, 255)[:60], Answer{}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := ParseNA(tc.frame)
			if ok != tc.ok || (ok && (got.IP != tc.want.IP || got.MAC.String() != tc.want.MAC.String())) {
				t.Fatalf("ParseNA = %v %v, %v; want %v %v, %v", got.IP, got.MAC, ok, tc.want.IP, tc.want.MAC, tc.ok)
			}
		})
	}
}

func TestForeign(t *testing.T) {
	own := map[string]bool{ourMAC.String(): true}
	other := netip.MustParseAddr("192.0.2.80")
	got := Foreign([]Answer{
		{ip4, ourMAC},   // our own announcement or a second interface of ours
		{ip4, rogueMAC}, // the rogue
		{ip4, rogueMAC}, // twice
		{ip4, net.HardwareAddr{0x02, 0, 0, 0, 0, 0x98}},
		{ip6, ourMAC},
		{other, rogueMAC}, // not probed
		{ip4, net.HardwareAddr{0, 0, 0, 0, 0, 0}}, // zero MAC
	}, []netip.Addr{ip4, ip6}, own)
	want := map[netip.Addr][]string{ip4: {"02:00:00:00:00:98", "02:00:00:00:00:99"}}
	if d := cmp.Diff(want, got); d != "" {
		t.Fatalf("Foreign (-want +got):\n%s", d)
	}
}

func TestTracker(t *testing.T) {
	var tr Tracker
	t0 := time.Unix(1000, 0)
	probed := []netip.Addr{ip4, ip6}
	st, en := tr.Observe(t0, "eth0", probed, map[netip.Addr][]string{ip4: {"02:00:00:00:00:99"}})
	if !slices.Equal(st, []netip.Addr{ip4}) || len(en) != 0 {
		t.Fatalf("round 1: started %v ended %v", st, en)
	}
	// Still there, another MAC now: Since is kept, not counted again.
	st, en = tr.Observe(t0.Add(10*time.Second), "eth0", probed, map[netip.Addr][]string{ip4: {"02:00:00:00:00:98"}})
	l := tr.List()
	if len(st) != 0 || len(en) != 0 || len(l) != 1 || !l[0].Since.Equal(t0) || l[0].MACs[0] != "02:00:00:00:00:98" {
		t.Fatalf("round 2: started %v ended %v list %+v", st, en, l)
	}
	// A round probing only ip6 leaves ip4's conflict alone.
	if st, en = tr.Observe(t0.Add(15*time.Second), "eth0", []netip.Addr{ip6}, nil); len(st)+len(en) != 0 || len(tr.List()) != 1 {
		t.Fatalf("round of another IP changed ip4: %v %v", st, en)
	}
	// One clean round ends it.
	if st, en = tr.Observe(t0.Add(20*time.Second), "eth0", probed, nil); len(st) != 0 || !slices.Equal(en, []netip.Addr{ip4}) || len(tr.List()) != 0 {
		t.Fatalf("round 3: started %v ended %v list %v", st, en, tr.List())
	}
	// Released: forgotten.
	tr.Observe(t0, "eth0", probed, map[netip.Addr][]string{ip6: {"02:00:00:00:00:99"}})
	if en := tr.Retain(map[netip.Addr]bool{ip4: true}); !slices.Equal(en, []netip.Addr{ip6}) || len(tr.List()) != 0 {
		t.Fatalf("Retain: ended %v, list %v", en, tr.List())
	}
}
