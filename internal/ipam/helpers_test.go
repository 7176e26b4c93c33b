package ipam

import (
	"net/netip"
	"slices"
	"testing"
)

func cidr(s string) Range       { return Range{CIDR: s} }
func between(a, b string) Range { return Range{Start: a, End: b} }

func mustPool(tb testing.TB, sub *SubnetInfo, rs ...Range) *Pool {
	tb.Helper()
	p, err := NewPool(rs, sub)
	if err != nil {
		tb.Fatalf("NewPool(%v, %+v): %v", rs, sub, err)
	}
	return p
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// drain allocates until the pool is exhausted and returns the addresses in
// allocation order. It fails the test if more than limit come out.
func drain(tb testing.TB, a *Allocator, limit int) []netip.Addr {
	tb.Helper()
	var out []netip.Addr
	for {
		ip, err := a.Allocate()
		if err == ErrExhausted {
			return out
		}
		if err != nil {
			tb.Fatalf("Allocate: %v", err)
		}
		out = append(out, ip)
		if len(out) > limit {
			tb.Fatalf("more than %d addresses allocated", limit)
		}
	}
}

// bruteAllocatable lists the allocatable addresses of a small pool by
// walking every address with netip, independently of the u128 arithmetic
// and interval code under test, applying the rules of the package
// documentation.
func bruteAllocatable(rs []IPRange, gateway netip.Addr, subnet netip.Prefix) []netip.Addr {
	reserved := map[netip.Addr]bool{}
	if gateway.IsValid() {
		reserved[gateway] = true
	}
	markNet := func(p netip.Prefix) {
		if !p.IsValid() {
			return
		}
		first := p.Masked().Addr()
		switch {
		case first.Is4() && p.Bits() < 31:
			reserved[first] = true
			last := first
			for n := last.Next(); n.IsValid() && p.Contains(n); n = n.Next() {
				last = n
			}
			reserved[last] = true
		case first.Is6() && p.Bits() < 127:
			reserved[first] = true
		}
	}
	markNet(subnet)
	for _, r := range rs {
		markNet(r.Prefix)
	}
	var out []netip.Addr
	for _, r := range rs {
		for a := r.First; a.IsValid() && a.Compare(r.Last) <= 0; a = a.Next() {
			if !reserved[a] && !inSpecialBlock(a) {
				out = append(out, a)
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// inSpecialBlock reports whether a lies in one of SpecialBlocks.
func inSpecialBlock(a netip.Addr) bool {
	for _, b := range SpecialBlocks {
		if b.Prefix.Contains(a) {
			return true
		}
	}
	return false
}
