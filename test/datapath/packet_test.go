package datapath_test

import (
	"encoding/binary"
	"net/netip"
)

// csum is the Internet checksum (RFC 1071) of b, starting from sum.
func csum(sum uint32, b []byte) uint16 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// udpPacket builds an IP packet (v4 or v6 by the addresses) carrying one
// UDP datagram, checksums included.
func udpPacket(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	udp := make([]byte, 8+len(payload))
	binary.BigEndian.PutUint16(udp[0:], sport)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(len(udp)))
	copy(udp[8:], payload)
	// Pseudo-header sum (RFC 768, RFC 8200 section 8.1).
	var ps []byte
	ps = append(ps, src.AsSlice()...)
	ps = append(ps, dst.AsSlice()...)
	ps = append(ps, 0, 17)
	ps = binary.BigEndian.AppendUint16(ps, uint16(len(udp)))
	var sum uint32
	for i := 0; i < len(ps); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ps[i:]))
	}
	c := csum(sum, udp)
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(udp[6:], c)
	if src.Is4() {
		ip := make([]byte, 20)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(udp)))
		ip[8], ip[9] = 64, 17
		copy(ip[12:], src.AsSlice())
		copy(ip[16:], dst.AsSlice())
		binary.BigEndian.PutUint16(ip[10:], csum(0, ip))
		return append(ip, udp...)
	}
	ip := make([]byte, 40)
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(len(udp)))
	ip[6], ip[7] = 17, 64
	copy(ip[8:], src.AsSlice())
	copy(ip[24:], dst.AsSlice())
	return append(ip, udp...)
}

// gpe wraps an inner IP packet in a VXLAN-GPE header
// (draft-ietf-nvo3-vxlan-gpe: flags I and P, next protocol 1 = IPv4,
// 2 = IPv6, VNI 1).
func gpe(inner []byte) []byte {
	h := []byte{0x0c, 0, 0, 1, 0, 0, 1, 0}
	if inner[0]>>4 == 6 {
		h[3] = 2
	}
	return append(h, inner...)
}
