package ipam

import (
	"fmt"
	"net/netip"
	"slices"
)

// SpecialBlock is a block of addresses that is never an egress IP whatever a
// pool's ranges say: a host cannot use it as the source address of traffic
// it sends to other hosts.
type SpecialBlock struct {
	Prefix netip.Prefix
	// What names the block as users know it, e.g. "loopback".
	What string
	// Source is the RFC that defines the block.
	Source string
}

// SpecialBlocks are the blocks the allocator never hands out, by family and
// address. They are the addresses Go's netip.Addr.IsGlobalUnicast (and so
// the API server's CEL isGlobalUnicast) refuses, plus IPv4 "this network"
// and IPv4-mapped IPv6, which Linux treats as martian sources:
//   - IPv4: 0.0.0.0/8 (RFC 1122 3.2.1.3), 127.0.0.0/8 (RFC 1122 3.2.1.3),
//     169.254.0.0/16 (RFC 3927), 224.0.0.0/4 (RFC 5771), 255.255.255.255
//     (RFC 919, limited broadcast);
//   - IPv6: :: and ::1 (RFC 4291 2.5.2, 2.5.3), ::ffff:0:0/96 (RFC 4291
//     2.5.5.2), fe80::/10 (RFC 4291 2.5.6), ff00::/8 (RFC 4291 2.7).
//
// 240.0.0.0/4 (RFC 1112 "reserved") is not listed: Linux and Go accept it
// as unicast and some networks use it. The blocks are disjoint.
var SpecialBlocks = []SpecialBlock{
	{netip.MustParsePrefix("0.0.0.0/8"), "\"this network\"", "RFC 1122"},
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback", "RFC 1122"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local", "RFC 3927"},
	{netip.MustParsePrefix("224.0.0.0/4"), "multicast", "RFC 5771"},
	{netip.MustParsePrefix("255.255.255.255/32"), "limited broadcast", "RFC 919"},
	{netip.MustParsePrefix("::/128"), "unspecified", rfc4291},
	{netip.MustParsePrefix("::1/128"), "loopback", rfc4291},
	{netip.MustParsePrefix("::ffff:0:0/96"), "IPv4-mapped", rfc4291},
	{netip.MustParsePrefix("fe80::/10"), "link-local", rfc4291},
	{netip.MustParsePrefix("ff00::/8"), "multicast", rfc4291},
}

// rfc4291 is the IPv6 addressing architecture, source of most IPv6 blocks.
const rfc4291 = "RFC 4291"

// specialSpan is a SpecialBlock as an interval of the pool's family.
type specialSpan struct {
	span
	block SpecialBlock
}

// specialSpans returns the SpecialBlocks of one family as spans, sorted.
func specialSpans(is6 bool) []specialSpan {
	var out []specialSpan
	for _, b := range SpecialBlocks {
		if b.Prefix.Addr().Is6() != is6 {
			continue
		}
		first := fromAddr(b.Prefix.Addr())
		last := first.or(hostMask(b.Prefix.Addr().BitLen(), b.Prefix.Bits()))
		out = append(out, specialSpan{span{first, last}, b})
	}
	slices.SortFunc(out, func(a, b specialSpan) int { return a.first.cmp(b.first) })
	return out
}

// intersect returns s ∩ t and whether it is non-empty.
func (s span) intersect(t span) (span, bool) {
	first, last := s.first, s.last
	if first.less(t.first) {
		first = t.first
	}
	if t.last.less(last) {
		last = t.last
	}
	if last.less(first) {
		return span{}, false
	}
	return span{first, last}, true
}

// SpecialOverlaps returns one FieldError for every pair of a parsed range
// and a SpecialBlock that share addresses, in range order: "ipRanges[i]"
// with the range as Value. A webhook uses it to refuse such ranges; NewPool
// itself accepts them and never allocates those addresses (so a pool
// admitted before this rule keeps working).
func SpecialOverlaps(ranges []IPRange) FieldErrors {
	var errs FieldErrors
	for i, r := range ranges {
		for _, ss := range specialSpans(r.First.Is6()) {
			if _, ok := r.span().intersect(ss.span); ok {
				errs = append(errs, &FieldError{Field: fmt.Sprintf("ipRanges[%d]", i), Value: r.String(),
					Reason: fmt.Sprintf("contains %s addresses (%s, %s), which are never egress IPs; split the range around them", ss.block.What, ss.block.Prefix, ss.block.Source)})
			}
		}
	}
	return errs
}

// Exclusion is an address a pool must not allocate for a reason the pool's
// spec does not show, such as being a Node's own address.
type Exclusion struct {
	Addr netip.Addr
	// Reason completes "IP <addr> ...", e.g. "is the InternalIP of Node n1".
	Reason string
}

// Excluded counts the addresses of a pool's ranges that are never
// allocated, by cause. Each address is counted once, under the first cause
// that applies in the order SpecialPurpose, Reserved, Exclusions. Counts
// saturate at math.MaxUint64.
type Excluded struct {
	// SpecialPurpose: in one of SpecialBlocks.
	SpecialPurpose uint64
	// Reserved: the gateway, or a network, broadcast or Subnet-Router
	// anycast address of a CIDR or of subnetInfo.
	Reserved uint64
	// Exclusions: given to WithExclusions (e.g. Node addresses).
	Exclusions uint64
}

// Excluded returns the counts of the pool's never-allocated addresses.
func (p *Pool) Excluded() Excluded { return p.excluded }

// WithExclusions returns a copy of p that also never allocates the
// addresses of ex that lie in its ranges and are otherwise allocatable.
// Addresses of the other family, outside the ranges or already reserved are
// ignored; on duplicates the first Reason is kept. p itself is unchanged.
func (p *Pool) WithExclusions(ex []Exclusion) *Pool {
	q := &Pool{ranges: p.ranges, is6: p.is6, gateway: p.gateway, subnet: p.subnet, vlan: p.vlan, raw: p.raw}
	q.build(ex)
	return q
}

// Specials returns the SpecialBlocks that share addresses with the
// pool's ranges, by address.
func (p *Pool) Specials() []SpecialBlock {
	out := make([]SpecialBlock, len(p.special))
	for i, ss := range p.special {
		out[i] = ss.block
	}
	return out
}
