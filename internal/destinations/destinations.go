// Package destinations decides, for one Pod IP that several Egresses
// select, which Egress carries each destination (issue 21). It is pure and
// imports no Kubernetes code: the controller (through internal/selection,
// to publish members) and the agent's datapath (to build its interval
// maps) call the same Resolve and get the same answer.
//
// The rule: a destination uses the Egress whose spec.destinationCIDRs
// contain it with the longest prefix; an Egress with no destinationCIDRs
// covers every destination as a /0 would. On a tie the oldest Egress wins,
// the lowest creationTimestamp then the lowest name (the order the
// scheduling pass and the member selection already use). An Egress's
// spec.excludedCIDRs take the destinations they contain away from that
// Egress alone, so the next Egress that covers them wins, or nobody, and
// the Pod's traffic to them leaves with its Node's IP. Longest-prefix
// matching is the rule of IP forwarding (RFC 1812 section 5.2.4.3), which
// is why a more specific Egress overrides a namespace-wide default.
package destinations

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"
	"time"
)

// Claim is one Egress that selects the Pod IP being resolved.
type Claim struct {
	// Egress is the Egress's name (cluster-scoped, unique).
	Egress string
	// Created is its metadata.creationTimestamp: the tie-breaker.
	Created time.Time
	// Destinations are its spec.destinationCIDRs; those of the other
	// family than the one resolved are ignored. Empty: every destination
	// (only when Some is false).
	Destinations []netip.Prefix
	// Some is set when spec.destinationCIDRs is not empty: the Egress
	// covers only Destinations, and in a family where it lists none it
	// covers nothing.
	Some bool
	// Excluded are its spec.excludedCIDRs.
	Excluded []netip.Prefix
}

// Span is an inclusive range of destination addresses, First to Last, of
// one family, that Egress carries.
type Span struct {
	First, Last netip.Addr
	Egress      string
}

// Contains reports whether a lies in s.
func (s Span) Contains(a netip.Addr) bool {
	return s.First.Compare(a) <= 0 && a.Compare(s.Last) <= 0
}

// Older orders claims by priority: the lowest Created first, then the
// lowest name.
func Older(a, b Claim) int {
	return cmp.Or(a.Created.Compare(b.Created), strings.Compare(a.Egress, b.Egress))
}

// Whole reports whether c takes every destination of its family without
// looking at the other claims' CIDRs: no destinationCIDRs, no exclusions.
// Only a claim with destinationCIDRs can take destinations from it.
func (c Claim) Whole() bool { return !c.Some && len(c.Excluded) == 0 }

// Resolve returns, for a Pod IP of family v6 (false: IPv4) selected by
// claims, which Egress carries each destination: sorted, non-overlapping
// spans, adjacent spans of the same Egress merged; destinations in no span
// use no Egress. The result depends only on the set of claims, not on
// their order; duplicate names count once (the first in priority order).
// Prefixes that are invalid or of the other family are ignored.
func Resolve(v6 bool, claims []Claim) []Span {
	cs := slices.Clone(claims)
	slices.SortStableFunc(cs, Older)
	cs = slices.CompactFunc(cs, func(a, b Claim) bool { return a.Egress == b.Egress })
	zero, top := netip.IPv4Unspecified(), netip.AddrFrom4([4]byte{255, 255, 255, 255})
	if v6 {
		zero, top = netip.IPv6Unspecified(), netip.AddrFrom16([16]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	}
	type claim struct {
		name          string
		all           bool
		dst, excluded []netip.Prefix
	}
	own := func(ps []netip.Prefix) []netip.Prefix {
		var out []netip.Prefix
		for _, p := range ps {
			if p.IsValid() && p.Addr().Is6() == v6 && !p.Addr().Is4In6() {
				out = append(out, p.Masked())
			}
		}
		return out
	}
	// Elementary intervals start at zero and at every prefix's first
	// address and the address after its last: inside one, every prefix
	// either contains all of it or none of it.
	starts := []netip.Addr{zero}
	mark := func(p netip.Prefix) {
		starts = append(starts, p.Addr())
		if next := lastOf(p).Next(); next.IsValid() {
			starts = append(starts, next)
		}
	}
	list := make([]claim, 0, len(cs))
	for _, c := range cs {
		k := claim{name: c.Egress, all: !c.Some, dst: own(c.Destinations), excluded: own(c.Excluded)}
		if !k.all && len(k.dst) == 0 {
			continue // destinations of the other family only
		}
		for _, p := range k.dst {
			mark(p)
		}
		for _, p := range k.excluded {
			mark(p)
		}
		list = append(list, k)
	}
	if len(list) == 0 {
		return nil
	}
	slices.SortFunc(starts, netip.Addr.Compare)
	starts = slices.Compact(starts)
	var out []Span
	for i, a := range starts {
		last := top
		if i+1 < len(starts) {
			last = starts[i+1].Prev()
		}
		best, bits := "", -1
		for _, k := range list {
			b := -1
			if k.all {
				b = 0
			}
			for _, p := range k.dst {
				if p.Bits() > b && p.Contains(a) {
					b = p.Bits()
				}
			}
			if b <= bits || slices.ContainsFunc(k.excluded, func(p netip.Prefix) bool { return p.Contains(a) }) {
				continue // older claims win ties: strictly longer only
			}
			best, bits = k.name, b
		}
		if best == "" {
			continue
		}
		if n := len(out); n > 0 && out[n-1].Egress == best && out[n-1].Last.Next() == a {
			out[n-1].Last = last
			continue
		}
		out = append(out, Span{First: a, Last: last, Egress: best})
	}
	return out
}

// Everything reports whether spans give every destination of family v6 to
// one Egress, and which.
func Everything(v6 bool, spans []Span) (string, bool) {
	if len(spans) != 1 {
		return "", false
	}
	s := spans[0]
	zero := netip.IPv4Unspecified()
	if v6 {
		zero = netip.IPv6Unspecified()
	}
	return s.Egress, s.First == zero && !s.Last.Next().IsValid()
}

// Egresses returns the names of the Egresses that carry some span, sorted.
func Egresses(spans []Span) []string {
	out := make([]string, 0, len(spans))
	for _, s := range spans {
		out = append(out, s.Egress)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Lookup returns the Egress that carries destination a; "" when none does.
func Lookup(spans []Span, a netip.Addr) string {
	i, found := slices.BinarySearchFunc(spans, a, func(s Span, a netip.Addr) int {
		switch {
		case s.Last.Compare(a) < 0:
			return -1
		case s.First.Compare(a) > 0:
			return 1
		}
		return 0
	})
	if !found {
		return ""
	}
	return spans[i].Egress
}

// lastOf returns the last address of p (p masked).
func lastOf(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// Parse turns CIDR strings (CEL-validated spec fields) into prefixes,
// skipping any that do not parse: an object admitted before validation
// existed loses only its bad entries.
func Parse[S ~string](ss []S) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ss))
	for _, s := range ss {
		if p, err := netip.ParsePrefix(string(s)); err == nil && p.Addr().Zone() == "" && !p.Addr().Is4In6() {
			out = append(out, p.Masked())
		}
	}
	return out
}
