package ipam

import (
	"fmt"
	"net/netip"
	"slices"
)

// Range is one entry of an ExternalIPPool's spec.ipRanges as written by the
// user: either CIDR (e.g. "192.0.2.0/28", "2001:db8::/64") or Start and End
// (e.g. "192.0.2.100" and "192.0.2.120", both inclusive). It is a plain
// struct so that this package needs no Kubernetes types.
type Range struct {
	CIDR  string
	Start string
	End   string
}

// IPRange is a parsed, valid Range: the inclusive interval First..Last of
// one IP family. Prefix is the CIDR for a cidr entry and the zero Prefix
// (IsValid false) for a start/end entry. An IPRange describes the range as
// written; which of its addresses can be allocated is decided by Pool (see
// the package documentation).
type IPRange struct {
	First  netip.Addr
	Last   netip.Addr
	Prefix netip.Prefix
}

// String returns the CIDR for a cidr entry and "first-last" otherwise.
func (r IPRange) String() string {
	if r.Prefix.IsValid() {
		return r.Prefix.String()
	}
	return r.First.String() + "-" + r.Last.String()
}

// Contains reports whether ip lies between First and Last inclusive. It
// ignores the rules about reserved addresses; use Pool.Contains for those.
func (r IPRange) Contains(ip netip.Addr) bool {
	return ip.IsValid() && ip.Zone() == "" && ip.Is4() == r.First.Is4() &&
		r.First.Compare(ip) <= 0 && ip.Compare(r.Last) <= 0
}

// Overlaps reports whether r and o share at least one address. Ranges of
// different IP families never overlap.
func (r IPRange) Overlaps(o IPRange) bool {
	return r.First.Is4() == o.First.Is4() && r.First.Compare(o.Last) <= 0 && o.First.Compare(r.Last) <= 0
}

// Size returns the number of addresses from First to Last inclusive,
// saturated at math.MaxUint64 (an IPv6 /64 alone holds 2^64 addresses).
func (r IPRange) Size() uint64 { return r.span().size() }

func (r IPRange) span() span { return span{fromAddr(r.First), fromAddr(r.Last)} }

func familyName(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

// parseIP parses one IP address field. It rejects what netip.ParseAddr
// rejects (including leading zeros in IPv4 octets), IPv6 zones, and
// IPv4-mapped IPv6 addresses (which would silently change the family).
func parseIP(field, s string) (netip.Addr, *FieldError) {
	a, err := netip.ParseAddr(s)
	switch {
	case s == "":
		return netip.Addr{}, &FieldError{Field: field, Reason: "required"}
	case err != nil:
		return netip.Addr{}, &FieldError{Field: field, Value: s, Reason: "not an IP address"}
	case a.Zone() != "":
		return netip.Addr{}, &FieldError{Field: field, Value: s, Reason: "an IPv6 zone is not allowed"}
	case a.Is4In6():
		return netip.Addr{}, &FieldError{Field: field, Value: s,
			Reason: fmt.Sprintf("IPv4-mapped IPv6 address is not allowed; write %s", a.Unmap())}
	}
	return a, nil
}

// parseCIDR parses a cidr field. A CIDR with host bits set (e.g.
// "192.0.2.5/24") is rejected rather than silently masked, because the user
// may have meant a single address or a different network; the message names
// the masked network.
func parseCIDR(field, s string) (IPRange, *FieldError) {
	p, err := netip.ParsePrefix(s)
	switch {
	case err != nil:
		return IPRange{}, &FieldError{Field: field, Value: s,
			Reason: "not a CIDR; want address/prefix-length such as 192.0.2.0/24 or 2001:db8::/64"}
	case p.Addr().Is4In6():
		return IPRange{}, &FieldError{Field: field, Value: s,
			Reason: "IPv4-mapped IPv6 prefix is not allowed; write the IPv4 CIDR"}
	case p.Masked() != p:
		return IPRange{}, &FieldError{Field: field, Value: s,
			Reason: fmt.Sprintf("host bits are set; the network is %s (use start and end for a partial range)", p.Masked())}
	}
	first := fromAddr(p.Addr())
	last := first.or(hostMask(p.Addr().BitLen(), p.Bits()))
	return IPRange{First: p.Addr(), Last: last.addr(p.Addr().Is6()), Prefix: p}, nil
}

func parseRange(i int, r Range) (IPRange, FieldErrors) {
	base := fmt.Sprintf("ipRanges[%d]", i)
	switch {
	case r.CIDR != "" && (r.Start != "" || r.End != ""):
		return IPRange{}, FieldErrors{{Field: base, Reason: "set either cidr or start and end, not both"}}
	case r.CIDR == "" && r.Start == "" && r.End == "":
		return IPRange{}, FieldErrors{{Field: base, Reason: "set either cidr or start and end"}}
	case r.CIDR != "":
		ipr, fe := parseCIDR(base+".cidr", r.CIDR)
		if fe != nil {
			return IPRange{}, FieldErrors{fe}
		}
		return ipr, nil
	}
	var errs FieldErrors
	start, fe := parseIP(base+".start", r.Start)
	if fe != nil {
		errs = append(errs, fe)
	}
	end, fe := parseIP(base+".end", r.End)
	if fe != nil {
		errs = append(errs, fe)
	}
	if errs != nil {
		return IPRange{}, errs
	}
	if start.Is4() != end.Is4() {
		return IPRange{}, FieldErrors{{Field: base, Value: r.Start + "-" + r.End,
			Reason: fmt.Sprintf("start is %s but end is %s; a range holds one IP family", familyName(start), familyName(end))}}
	}
	if end.Less(start) {
		return IPRange{}, FieldErrors{{Field: base, Value: r.Start + "-" + r.End, Reason: "start is after end"}}
	}
	return IPRange{First: start, Last: end}, nil
}

// ParseRanges parses and validates a pool's ipRanges. It returns one IPRange
// per entry, in input order, or a FieldErrors listing every problem found:
//   - no entries;
//   - an entry with both cidr and start/end, or with neither, or with only
//     one of start and end;
//   - an unparsable IP address or CIDR, an IPv6 zone, an IPv4-mapped IPv6
//     address or prefix;
//   - a CIDR with host bits set (rejected, not masked: the message names the
//     network the user probably meant);
//   - start after end, or start and end of different families;
//   - entries of different IP families: a pool holds one family, that of
//     most valid entries (of the first on a tie), and each entry of the
//     other family is reported;
//   - entries that share any address (compared as written, before reserved
//     addresses are removed).
//
// Cross-entry checks (family, overlap) run on the entries that are valid on
// their own.
func ParseRanges(rs []Range) ([]IPRange, error) {
	if len(rs) == 0 {
		return nil, FieldErrors{{Field: "ipRanges", Reason: "at least one range is required"}}
	}
	out := make([]IPRange, len(rs))
	valid := make([]int, 0, len(rs))
	var errs FieldErrors
	for i, r := range rs {
		ipr, fe := parseRange(i, r)
		if fe != nil {
			errs = append(errs, fe...)
			continue
		}
		out[i] = ipr
		valid = append(valid, i)
	}

	// One family per pool: that of most valid entries (of the first valid
	// entry on a tie); ref is the first valid entry of that family. Entries
	// of the other family are the errors.
	n4 := 0
	for _, i := range valid {
		if out[i].First.Is4() {
			n4++
		}
	}
	want4 := 2*n4 > len(valid) || (2*n4 == len(valid) && len(valid) > 0 && out[valid[0]].First.Is4())
	ref := -1
	for _, i := range valid {
		if out[i].First.Is4() == want4 {
			ref = i
			break
		}
	}
	same := valid[:0:0]
	for _, i := range valid {
		if out[i].First.Is4() != want4 {
			errs = append(errs, &FieldError{Field: fmt.Sprintf("ipRanges[%d]", i), Value: out[i].String(),
				Reason: fmt.Sprintf("is %s but ipRanges[%d] is %s; a pool holds one IP family (use a second pool for the other)",
					familyName(out[i].First), ref, familyName(out[ref].First))})
			continue
		}
		same = append(same, i)
	}

	// No overlaps: sweep in address order, remembering the entry that reaches
	// furthest so far.
	slices.SortStableFunc(same, func(a, b int) int { return out[a].First.Compare(out[b].First) })
	if len(same) > 0 {
		reach := same[0]
		for _, j := range same[1:] {
			if out[j].First.Compare(out[reach].Last) <= 0 {
				a, b := min(reach, j), max(reach, j)
				errs = append(errs, &FieldError{Field: fmt.Sprintf("ipRanges[%d]", b), Value: out[b].String(),
					Reason: fmt.Sprintf("overlaps ipRanges[%d] (%s)", a, out[a])})
			}
			if out[reach].Last.Less(out[j].Last) {
				reach = j
			}
		}
	}
	if errs != nil {
		return nil, errs
	}
	return out, nil
}

// Overlaps reports the first pair of ranges, one from a and one from b, that
// share an address: the smallest index into a, then the smallest index into
// b. It is meant for checking a pool against each other pool (every range
// must belong to at most one pool). Ranges are compared as written, so two
// pools that share only a reserved address (say a broadcast address) still
// overlap. Cost is O(len(a)·len(b)).
func Overlaps(a, b []IPRange) (ai, bi int, ok bool) {
	for i := range a {
		for j := range b {
			if a[i].Overlaps(b[j]) {
				return i, j, true
			}
		}
	}
	return -1, -1, false
}
