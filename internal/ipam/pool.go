package ipam

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
)

// SubnetInfo is an ExternalIPPool's optional spec.subnetInfo: the layer-2
// subnet the pool's IPs live in.
type SubnetInfo struct {
	// Gateway is the subnet's router, e.g. "192.0.2.1"; it is never
	// allocated. Empty means not set.
	Gateway string
	// PrefixLength is the subnet's prefix length in bits: 1..32 for IPv4,
	// 1..128 for IPv6. 0 means not set.
	PrefixLength int
	// VLAN is the IEEE 802.1Q VLAN ID, 0..4094; 0 means untagged.
	VLAN int
}

// reservedAddr is an address inside a pool's ranges that is never allocated,
// with the reason shown to users.
type reservedAddr struct {
	at     u128
	reason string
	// excluded: given to WithExclusions (else reserved by the spec).
	excluded bool
}

// Pool is a validated ExternalIPPool specification: its ranges, the subnet
// they live in, and the resulting set of allocatable addresses. A Pool is
// immutable and safe for concurrent use.
type Pool struct {
	ranges   []IPRange // input order
	is6      bool
	gateway  netip.Addr   // zero if not set
	subnet   netip.Prefix // zero if prefixLength not set
	vlan     int
	raw      []span         // the ranges as written, sorted, disjoint
	segs     []span         // allocatable addresses: sorted, disjoint, non-adjacent
	reserved []reservedAddr // sorted by address, unique, each inside raw and outside special
	special  []specialSpan  // the SpecialBlocks that share addresses with raw, sorted
	total    uint64
	excluded Excluded
}

// NewPool validates an ExternalIPPool spec (ipRanges and the optional
// subnetInfo, nil when absent) and returns the pool. On invalid input it
// returns a FieldErrors listing every problem: those of ParseRanges, and
//   - subnetInfo.gateway: not an IP address, or of the other family;
//   - subnetInfo.prefixLength: outside 1..32 (IPv4) or 1..128 (IPv6);
//   - subnetInfo.vlan: outside 0..4094 (IEEE 802.1Q reserves 4095);
//   - ipRanges[i]: not inside the subnet given by prefixLength (the subnet
//     is the gateway's, or ipRanges[0]'s when no gateway is set).
//
// Which addresses of the ranges are allocatable is described in the package
// documentation.
func NewPool(ranges []Range, subnet *SubnetInfo) (*Pool, error) {
	var errs FieldErrors
	parsed, err := ParseRanges(ranges)
	if err != nil {
		errs = append(errs, err.(FieldErrors)...)
	}
	p := &Pool{ranges: parsed}
	if parsed != nil {
		p.is6 = parsed[0].First.Is6()
	}
	if subnet != nil {
		errs = append(errs, p.setSubnet(subnet)...)
	}
	if errs != nil {
		return nil, errs
	}
	p.build(nil)
	return p, nil
}

func (p *Pool) setSubnet(s *SubnetInfo) FieldErrors {
	var errs FieldErrors
	rangesOK := p.ranges != nil
	if s.Gateway != "" {
		gw, fe := parseIP("subnetInfo.gateway", s.Gateway)
		switch {
		case fe != nil:
			errs = append(errs, fe)
		case rangesOK && gw.Is6() != p.is6:
			errs = append(errs, &FieldError{Field: "subnetInfo.gateway", Value: s.Gateway,
				Reason: fmt.Sprintf("is %s but the pool's ipRanges are %s", familyName(gw), familyName(p.ranges[0].First))})
		default:
			p.gateway = gw
		}
	}
	if s.VLAN < 0 || s.VLAN > 4094 {
		errs = append(errs, &FieldError{Field: "subnetInfo.vlan", Value: strconv.Itoa(s.VLAN),
			Reason: "must be between 0 and 4094 (IEEE 802.1Q; 0 means untagged)"})
	}
	p.vlan = s.VLAN
	if s.PrefixLength == 0 || !rangesOK {
		return errs
	}
	bitLen := p.ranges[0].First.BitLen()
	if s.PrefixLength < 1 || s.PrefixLength > bitLen {
		return append(errs, &FieldError{Field: "subnetInfo.prefixLength", Value: strconv.Itoa(s.PrefixLength),
			Reason: fmt.Sprintf("must be between 1 and %d for an %s pool", bitLen, familyName(p.ranges[0].First))})
	}
	anchor := p.ranges[0].First
	if p.gateway.IsValid() {
		anchor = p.gateway
	}
	p.subnet = netip.PrefixFrom(anchor, s.PrefixLength).Masked()
	for i, r := range p.ranges {
		if !p.subnet.Contains(r.First) || !p.subnet.Contains(r.Last) {
			errs = append(errs, &FieldError{Field: fmt.Sprintf("ipRanges[%d]", i), Value: r.String(),
				Reason: fmt.Sprintf("is not inside the subnet %s given by subnetInfo", p.subnet)})
		}
	}
	return errs
}

// build computes raw (unless set), special, reserved, segs, total and
// excluded from the validated fields and the exclusions ex.
func (p *Pool) build(ex []Exclusion) {
	if p.raw == nil {
		for _, r := range p.ranges {
			p.raw = append(p.raw, r.span())
		}
		slices.SortFunc(p.raw, func(a, b span) int { return a.first.cmp(b.first) })
	}
	for _, ss := range specialSpans(p.is6) {
		in := false
		for _, s := range p.raw {
			if x, ok := s.intersect(ss.span); ok {
				in = true
				p.excluded.SpecialPurpose = satAdd(p.excluded.SpecialPurpose, x.size())
			}
		}
		if in {
			p.special = append(p.special, ss)
		}
	}

	var res []reservedAddr
	if p.gateway.IsValid() {
		res = append(res, reservedAddr{at: fromAddr(p.gateway), reason: "is the gateway (subnetInfo.gateway)"})
	}
	res = append(res, networkReserved(p.subnet, "of the subnet "+p.subnet.String()+" (subnetInfo)")...)
	for i, r := range p.ranges {
		res = append(res, networkReserved(r.Prefix, fmt.Sprintf("of ipRanges[%d] (%s)", i, r.Prefix))...)
	}
	for _, e := range ex {
		if e.Addr.IsValid() && e.Addr.Zone() == "" && e.Addr.Is6() == p.is6 {
			res = append(res, reservedAddr{at: fromAddr(e.Addr), reason: e.Reason, excluded: true})
		}
	}

	// Keep the reserved addresses that lie in a range and in no special
	// block; on duplicates keep the first reason given (the gateway's, then
	// the subnet's, then the ranges', then the exclusions').
	slices.SortStableFunc(res, func(a, b reservedAddr) int { return a.at.cmp(b.at) })
	res = slices.CompactFunc(res, func(a, b reservedAddr) bool { return a.at == b.at })
	for _, r := range res {
		if p.rawIndex(r.at) >= 0 && p.specialAt(r.at) < 0 {
			p.reserved = append(p.reserved, r)
			if r.excluded {
				p.excluded.Exclusions++
			} else {
				p.excluded.Reserved++
			}
		}
	}

	// segs = raw minus the special blocks and the reserved addresses.
	holes := make([]span, 0, len(p.special)+len(p.reserved))
	for _, ss := range p.special {
		holes = append(holes, ss.span)
	}
	for _, r := range p.reserved {
		holes = append(holes, span{r.at, r.at})
	}
	slices.SortFunc(holes, func(a, b span) int { return a.first.cmp(b.first) })
	p.segs = subtract(p.raw, holes)
	for _, s := range p.segs {
		p.total = satAdd(p.total, s.size())
	}
}

// subtract returns the addresses of raw (sorted, disjoint) that lie in no
// span of holes (sorted by first; may overlap), as sorted, disjoint,
// non-adjacent spans.
func subtract(raw, holes []span) []span {
	var out []span
	add := func(s span) {
		if n := len(out); n > 0 && out[n-1].touches(s) {
			out[n-1].last = s.last
			return
		}
		out = append(out, s)
	}
	k := 0
	for _, s := range raw {
		for k < len(holes) && holes[k].last.less(s.first) {
			k++
		}
		cur, open := s.first, true
		for j := k; j < len(holes) && !s.last.less(holes[j].first); j++ {
			h := holes[j]
			if h.last.less(cur) {
				continue
			}
			if cur.less(h.first) {
				add(span{cur, h.first.sub1()})
			}
			if !h.last.less(s.last) {
				open = false
				break
			}
			cur = h.last.add1()
		}
		if open {
			add(span{cur, s.last})
		}
	}
	return out
}

// specialAt returns the index in p.special of the block holding u, or -1.
func (p *Pool) specialAt(u u128) int {
	for i, ss := range p.special {
		if ss.contains(u) {
			return i
		}
	}
	return -1
}

// networkReserved returns the addresses of prefix that are never allocated:
// for IPv4 shorter than /31 the network and broadcast addresses (a /31 and
// a /32 have neither, RFC 3021); for IPv6 shorter than /127 the
// Subnet-Router anycast address (RFC 4291 section 2.6.1; a /127 has none,
// RFC 6164). The zero Prefix gives none.
func networkReserved(prefix netip.Prefix, of string) []reservedAddr {
	if !prefix.IsValid() {
		return nil
	}
	first := fromAddr(prefix.Masked().Addr())
	last := first.or(hostMask(prefix.Addr().BitLen(), prefix.Bits()))
	switch {
	case prefix.Addr().Is4() && prefix.Bits() < 31:
		return []reservedAddr{
			{at: first, reason: "is the network address " + of},
			{at: last, reason: "is the broadcast address " + of},
		}
	case prefix.Addr().Is6() && prefix.Bits() < 127:
		return []reservedAddr{{at: first, reason: "is the Subnet-Router anycast address (RFC 4291 2.6.1) " + of}}
	}
	return nil
}

// rawIndex returns the index in p.raw of the range holding u, or -1.
func (p *Pool) rawIndex(u u128) int { return spanIndex(p.raw, u) }

// spanIndex returns the index of the span of sorted, disjoint spans that
// holds u, or -1.
func spanIndex(spans []span, u u128) int {
	if i := upperBound(spans, u); i > 0 && !spans[i-1].last.less(u) {
		return i - 1
	}
	return -1
}

// Is6 reports whether the pool holds IPv6 addresses (else IPv4).
func (p *Pool) Is6() bool { return p.is6 }

// Ranges returns the pool's ranges as parsed, in spec order.
func (p *Pool) Ranges() []IPRange { return slices.Clone(p.ranges) }

// Gateway returns subnetInfo.gateway, or the zero Addr when not set.
func (p *Pool) Gateway() netip.Addr { return p.gateway }

// Subnet returns the subnet given by subnetInfo.prefixLength (masked), or
// the zero Prefix when prefixLength is not set.
func (p *Pool) Subnet() netip.Prefix { return p.subnet }

// VLAN returns subnetInfo.vlan (0: untagged).
func (p *Pool) VLAN() int { return p.vlan }

// Total returns the number of allocatable addresses, saturated at
// math.MaxUint64 (an IPv6 /63 or larger reports math.MaxUint64).
func (p *Pool) Total() uint64 { return p.total }

// Contains reports whether ip is one of the pool's allocatable addresses:
// of the pool's family, without a zone, in one of its ranges and not
// reserved. Check says why not.
func (p *Pool) Contains(ip netip.Addr) bool { return p.Check(ip) == nil }

// Check returns nil if ip is one of the pool's allocatable addresses, else
// an *AddrError wrapping ErrOutsidePool (invalid, zoned, other family, or
// in no range), ErrReservedAddress (gateway, network, broadcast or
// Subnet-Router anycast address, or in one of SpecialBlocks) or
// ErrExcludedAddress (given to WithExclusions).
func (p *Pool) Check(ip netip.Addr) error {
	switch {
	case !ip.IsValid():
		return &AddrError{Addr: ip, Reason: "is not a valid IP address", Err: ErrOutsidePool}
	case ip.Zone() != "":
		return &AddrError{Addr: ip, Reason: "has an IPv6 zone", Err: ErrOutsidePool}
	case ip.Is4In6() && !p.is6:
		return &AddrError{Addr: ip, Reason: fmt.Sprintf("is IPv4-mapped IPv6 (write %s)", ip.Unmap()), Err: ErrOutsidePool}
	case ip.Is6() != p.is6:
		return &AddrError{Addr: ip, Reason: fmt.Sprintf("is %s but the pool is %s", familyName(ip), familyName(p.ranges[0].First)), Err: ErrOutsidePool}
	}
	u := fromAddr(ip)
	if spanIndex(p.segs, u) >= 0 {
		return nil
	}
	if i := p.specialAt(u); i >= 0 {
		b := p.special[i].block
		return &AddrError{Addr: ip, Reason: fmt.Sprintf("is a %s address (%s, %s)", b.What, b.Prefix, b.Source), Err: ErrReservedAddress}
	}
	if i, ok := slices.BinarySearchFunc(p.reserved, u, func(r reservedAddr, u u128) int { return r.at.cmp(u) }); ok {
		if p.reserved[i].excluded {
			return &AddrError{Addr: ip, Reason: p.reserved[i].reason, Err: ErrExcludedAddress}
		}
		return &AddrError{Addr: ip, Reason: p.reserved[i].reason, Err: ErrReservedAddress}
	}
	return &AddrError{Addr: ip, Reason: "is in none of the pool's ipRanges", Err: ErrOutsidePool}
}

// Uncovered returns, sorted and without duplicates, the addresses of
// allocated that the pool cannot hold (Contains is false). A webhook passes
// the updated pool and the IPs in the statuses of the pool's Egresses: a
// non-empty result means the update would remove or shrink a range, or
// reserve an address (e.g. a new gateway), that holds an allocated IP.
func (p *Pool) Uncovered(allocated []netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, ip := range allocated {
		if !p.Contains(ip) {
			out = append(out, ip)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}
