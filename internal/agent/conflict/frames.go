// Package conflict checks on the wire whether anything besides this Node
// answers for the egress IPs the Node holds (issue 16 item 3): an ARP
// probe for IPv4, a duplicate-address-detection style Neighbor
// Solicitation for IPv6. Any answer that does not carry one of the Node's
// own MAC addresses is a conflict: another Node still holding the address,
// or a host that is not ours. The agent keeps the address (it does not
// flap) and reports the conflict until a probe round sees no foreign
// answer.
//
// # IPv4: ARP probe (RFC 5227 section 2.1.1)
//
// An ARP request broadcast to ff:ff:ff:ff:ff:ff with sender IP 0.0.0.0,
// sender hardware address the interface's MAC, target hardware address
// zero and target IP the egress IP. Because the sender IP is unspecified
// no neighbour updates its cache from it. Linux answers such a request
// for an address it holds (net/ipv4/arp.c, arp_process: the sip == 0
// case) with a unicast reply to the sender's MAC, whose sender IP is the
// egress IP and sender hardware address the holder's MAC. Any ARP packet
// seen meanwhile whose sender IP is the egress IP counts, as RFC 5227
// section 2.1.1 says for probes.
//
// # IPv6: DAD-style Neighbor Solicitation (RFC 4862 section 5.4)
//
// A Neighbor Solicitation from the unspecified address :: to the
// solicited-node multicast address of the egress IP (RFC 4291 section
// 2.7.1), hop limit 255, target the egress IP and, as RFC 4861 section
// 4.3 requires for an unspecified source, no source link-layer address
// option. A node holding the address answers with a Neighbor
// Advertisement to the all-nodes address ff02::1 (RFC 4861 section 7.2.4)
// carrying its MAC in the target link-layer address option. The packet is
// built whole (Ethernet, IPv6 header, ICMPv6 by mdlayher/ndp) and sent on
// a packet socket, since a raw ICMPv6 socket cannot send from ::.
//
// Frames this Node sent itself are seen on the packet socket too (its own
// announcements); they carry its own MACs and are ignored.
package conflict

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
)

// Answer is one packet seen during a probe round that claims IP for the
// hardware address MAC.
type Answer struct {
	IP  netip.Addr
	MAC net.HardwareAddr
}

// etherTypeIPv6 is the EtherType of IPv6 (RFC 2464).
const etherTypeIPv6 ethernet.EtherType = 0x86dd

// ipv6HeaderLen is the length of the fixed IPv6 header (RFC 8200).
const ipv6HeaderLen = 40

// ARPProbe returns the Ethernet frame of an RFC 5227 ARP probe for ip sent
// from the interface with hardware address src. It fails when ip is not
// IPv4 or src is not a 6-byte MAC.
func ARPProbe(src net.HardwareAddr, ip netip.Addr) ([]byte, error) {
	if !ip.Is4() {
		return nil, fmt.Errorf("ARP probe for %v: not an IPv4 address", ip)
	}
	if len(src) != 6 {
		return nil, fmt.Errorf("ARP probe for %v: interface has no Ethernet address (%q)", ip, src)
	}
	p, err := arp.NewPacket(arp.OperationRequest, src, netip.IPv4Unspecified(), make(net.HardwareAddr, 6), ip)
	if err != nil {
		return nil, fmt.Errorf("ARP probe for %v: %w", ip, err)
	}
	payload, err := p.MarshalBinary()
	if err != nil {
		return nil, fmt.Errorf("ARP probe for %v: %w", ip, err)
	}
	return (&ethernet.Frame{Destination: ethernet.Broadcast, Source: src, EtherType: ethernet.EtherTypeARP, Payload: payload}).MarshalBinary()
}

// ParseARP returns the claim an Ethernet frame carrying ARP makes: its
// sender IP and sender hardware address. It reports false for anything
// else and for packets without a sender IP (probes, including ours).
func ParseARP(frame []byte) (Answer, bool) {
	var f ethernet.Frame
	if err := f.UnmarshalBinary(frame); err != nil || f.EtherType != ethernet.EtherTypeARP {
		return Answer{}, false
	}
	var p arp.Packet
	if err := p.UnmarshalBinary(f.Payload); err != nil {
		return Answer{}, false
	}
	if !p.SenderIP.Is4() || p.SenderIP.IsUnspecified() || len(p.SenderHardwareAddr) != 6 {
		return Answer{}, false
	}
	return Answer{IP: p.SenderIP, MAC: slices.Clone(p.SenderHardwareAddr)}, true
}

// solicitedNodeMAC is the Ethernet multicast address of an IPv6 multicast
// group (RFC 2464 section 7): 33:33 and the group's last four bytes.
func solicitedNodeMAC(group netip.Addr) net.HardwareAddr {
	b := group.As16()
	return net.HardwareAddr{0x33, 0x33, b[12], b[13], b[14], b[15]}
}

// NSProbe returns the Ethernet frame of a DAD-style Neighbor Solicitation
// for ip (RFC 4862 section 5.4.2) sent from the interface with hardware
// address src. It fails when ip is not a unicast IPv6 address or src is not
// a 6-byte MAC.
func NSProbe(src net.HardwareAddr, ip netip.Addr) ([]byte, error) {
	if !ip.Is6() || ip.Is4In6() || ip.IsMulticast() || ip.IsUnspecified() {
		return nil, fmt.Errorf("neighbor solicitation for %v: not a unicast IPv6 address", ip)
	}
	if len(src) != 6 {
		return nil, fmt.Errorf("neighbor solicitation for %v: interface has no Ethernet address (%q)", ip, src)
	}
	dst, err := ndp.SolicitedNodeMulticast(ip)
	if err != nil {
		return nil, fmt.Errorf("neighbor solicitation for %v: %w", ip, err)
	}
	icmp, err := ndp.MarshalMessageChecksum(&ndp.NeighborSolicitation{TargetAddress: ip}, netip.IPv6Unspecified(), dst)
	if err != nil {
		return nil, fmt.Errorf("neighbor solicitation for %v: %w", ip, err)
	}
	pkt := make([]byte, ipv6HeaderLen, ipv6HeaderLen+len(icmp))
	pkt[0] = 6 << 4 // version 6, traffic class and flow label 0
	binary.BigEndian.PutUint16(pkt[4:6], uint16(len(icmp)))
	pkt[6] = 58  // next header: ICMPv6
	pkt[7] = 255 // hop limit: RFC 4861 section 7.1 drops anything else
	// Source :: (bytes 8..23 stay zero).
	d := dst.As16()
	copy(pkt[24:40], d[:])
	pkt = append(pkt, icmp...)
	return (&ethernet.Frame{Destination: solicitedNodeMAC(dst), Source: src, EtherType: etherTypeIPv6, Payload: pkt}).MarshalBinary()
}

// ParseNA returns the claim an Ethernet frame carrying a Neighbor
// Advertisement makes: its target address and the target link-layer
// address option, else the frame's source MAC. It reports false for
// anything else (other packets, NAs with extension headers or a hop limit
// other than 255, which RFC 4861 section 7.1.2 says to drop).
func ParseNA(frame []byte) (Answer, bool) {
	var f ethernet.Frame
	if err := f.UnmarshalBinary(frame); err != nil || f.EtherType != etherTypeIPv6 || len(f.Payload) < ipv6HeaderLen+4 {
		return Answer{}, false
	}
	h := f.Payload
	if h[0]>>4 != 6 || h[6] != 58 || h[7] != 255 {
		return Answer{}, false
	}
	n := int(binary.BigEndian.Uint16(h[4:6]))
	if ipv6HeaderLen+n > len(h) {
		return Answer{}, false
	}
	m, err := ndp.ParseMessage(h[ipv6HeaderLen : ipv6HeaderLen+n])
	if err != nil {
		return Answer{}, false
	}
	na, ok := m.(*ndp.NeighborAdvertisement)
	if !ok {
		return Answer{}, false
	}
	mac := slices.Clone(f.Source)
	for _, o := range na.Options {
		if lla, ok := o.(*ndp.LinkLayerAddress); ok && lla.Direction == ndp.Target && len(lla.Addr) == 6 {
			mac = slices.Clone(lla.Addr)
		}
	}
	return Answer{IP: na.TargetAddress.WithZone(""), MAC: mac}, true
}

// Foreign returns, for each of the probed IPs, the MACs (canonical form,
// sorted, without duplicates) of the answers claiming it that are not in
// own (canonical MAC strings of every interface of this Node). IPs without
// foreign answers are not in the map.
func Foreign(answers []Answer, probed []netip.Addr, own map[string]bool) map[netip.Addr][]string {
	want := make(map[netip.Addr]bool, len(probed))
	for _, ip := range probed {
		want[ip.Unmap()] = true
	}
	out := map[netip.Addr][]string{}
	for _, a := range answers {
		ip := a.IP.Unmap()
		mac := strings.ToLower(a.MAC.String())
		if !want[ip] || own[mac] || len(a.MAC) == 0 || isZeroMAC(a.MAC) {
			continue
		}
		if !slices.Contains(out[ip], mac) {
			out[ip] = append(out[ip], mac)
		}
	}
	for _, m := range out {
		slices.Sort(m)
	}
	return out
}

func isZeroMAC(m net.HardwareAddr) bool {
	for _, b := range m {
		if b != 0 {
			return false
		}
	}
	return true
}

// errNoEthernet is returned for an interface without a 6-byte MAC.
var errNoEthernet = errors.New("interface has no Ethernet address")
