package ipam

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"

	"pgregory.net/rapid"
)

// genPool is a small random pool with everything needed to check it against
// bruteAllocatable.
type genPool struct {
	ranges  []Range
	sub     *SubnetInfo
	base    netip.Addr // start of a 1024-address block holding every range
	block   []netip.Addr
	pool    *Pool
	allowed []netip.Addr // bruteAllocatable, sorted
}

// addrAt returns base+off.
func addrAt(base netip.Addr, off int) netip.Addr {
	a := base
	for range off {
		a = a.Next()
	}
	return a
}

// drawPool draws 1..5 disjoint ranges (CIDRs up to /26-sized and start/end
// ranges) inside a 1024-address block, in random order, an optional gateway
// and an optional subnet equal to the block. IPv6 blocks sometimes straddle
// the 64-bit boundary of the address to exercise carries.
func drawPool(t *rapid.T) *genPool {
	g := &genPool{}
	is6 := rapid.Bool().Draw(t, "ipv6")
	if is6 {
		bases := []string{"2001:db8::", "2001:db8:0:0:ffff:ffff:ffff:fe00", "2001:db8:ffff:ffff:ffff:ffff:ffff:fc00", "fd00::400"}
		g.base = netip.MustParseAddr(rapid.SampledFrom(bases).Draw(t, "base"))
	} else {
		bases := []string{"10.0.0.0", "192.0.2.0", "198.51.100.0", "255.255.252.0", "0.0.0.0"}
		g.base = netip.MustParseAddr(rapid.SampledFrom(bases).Draw(t, "base"))
	}
	g.block = make([]netip.Addr, 1024)
	for i, a := 0, g.base; i < 1024; i, a = i+1, a.Next() {
		g.block[i] = a
	}
	cursor := 0
	n := rapid.IntRange(1, 5).Draw(t, "ranges")
	for i := 0; i < n && cursor < 1024; i++ {
		cursor += rapid.IntRange(0, 8).Draw(t, "gap")
		if rapid.Bool().Draw(t, "cidr") {
			hostBits := rapid.IntRange(0, 6).Draw(t, "hostBits")
			size := 1 << hostBits
			cursor = (cursor + size - 1) / size * size
			if cursor+size > 1024 {
				break
			}
			g.ranges = append(g.ranges, Range{CIDR: netip.PrefixFrom(g.block[cursor], g.base.BitLen()-hostBits).String()})
			cursor += size
			continue
		}
		size := rapid.IntRange(1, 70).Draw(t, "size")
		if cursor+size > 1024 {
			break
		}
		g.ranges = append(g.ranges, Range{Start: g.block[cursor].String(), End: g.block[cursor+size-1].String()})
		cursor += size
	}
	if len(g.ranges) == 0 {
		g.ranges = []Range{{Start: g.block[0].String(), End: g.block[0].String()}}
	}
	g.ranges = rapid.Permutation(g.ranges).Draw(t, "order")

	var gw netip.Addr
	if rapid.Bool().Draw(t, "subnetInfo") {
		g.sub = &SubnetInfo{}
		if rapid.Bool().Draw(t, "gateway") {
			gw = g.block[rapid.IntRange(0, cursor+1).Draw(t, "gatewayOffset")%1024]
			g.sub.Gateway = gw.String()
		}
		if rapid.Bool().Draw(t, "prefixLength") {
			g.sub.PrefixLength = g.base.BitLen() - 10
		}
	}
	p, err := NewPool(g.ranges, g.sub)
	if err != nil {
		t.Fatalf("NewPool(%+v, %+v): %v", g.ranges, g.sub, err)
	}
	g.pool = p
	g.allowed = bruteAllocatable(p.Ranges(), gw, p.Subnet())
	// Sometimes exclude a few addresses of the block (as the controller
	// excludes Node addresses); the model drops them too.
	if n := rapid.IntRange(0, 4).Draw(t, "exclusions"); n > 0 {
		var ex []Exclusion
		drop := map[netip.Addr]bool{}
		for range n {
			a := g.block[rapid.IntRange(0, 1023).Draw(t, "excludedOffset")]
			ex = append(ex, Exclusion{Addr: a, Reason: "is excluded by the test"})
			drop[a] = true
		}
		g.pool = p.WithExclusions(ex)
		g.allowed = slices.DeleteFunc(g.allowed, func(a netip.Addr) bool { return drop[a] })
	}
	return g
}

// TestPropertyPoolMatchesBruteForce: Total and Contains agree with a
// brute-force walk of every address of the block.
func TestPropertyPoolMatchesBruteForce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		g := drawPool(t)
		if g.pool.Total() != uint64(len(g.allowed)) {
			t.Fatalf("Total() = %d, brute force %d", g.pool.Total(), len(g.allowed))
		}
		// Every address of the ranges is either allocatable or counted
		// once in Excluded.
		var size uint64
		for _, r := range g.pool.Ranges() {
			size += r.Size()
		}
		if ex := g.pool.Excluded(); g.pool.Total()+ex.SpecialPurpose+ex.Reserved+ex.Exclusions != size {
			t.Fatalf("Total %d + Excluded %+v != %d addresses in the ranges", g.pool.Total(), ex, size)
		}
		for _, a := range g.block {
			_, want := slices.BinarySearchFunc(g.allowed, a, netip.Addr.Compare)
			if got := g.pool.Contains(a); got != want {
				t.Fatalf("Contains(%s) = %v, brute force %v (err %v)", a, got, want, g.pool.Check(a))
			}
		}
		for _, a := range []netip.Addr{g.base.Prev(), g.block[1023].Next()} {
			if a.IsValid() && g.pool.Contains(a) {
				t.Fatalf("Contains(%s) = true outside the block", a)
			}
		}
	})
}

// allocatorMachine drives an Allocator with random operations and compares
// it with a model (a set of allocated addresses over the brute-force list).
func allocatorMachine(t *rapid.T) {
	g := drawPool(t)
	a := NewAllocator(g.pool)
	used := map[netip.Addr]bool{}
	gw := g.pool.Gateway()
	allowed := func(ip netip.Addr) bool {
		_, ok := slices.BinarySearchFunc(g.allowed, ip, netip.Addr.Compare)
		return ok
	}
	pick := func(t *rapid.T) netip.Addr {
		if len(used) > 0 && rapid.Bool().Draw(t, "pickUsed") {
			var us []netip.Addr
			for ip := range used {
				us = append(us, ip)
			}
			slices.SortFunc(us, netip.Addr.Compare)
			return rapid.SampledFrom(us).Draw(t, "used")
		}
		off := rapid.IntRange(-2, 1025).Draw(t, "offset")
		switch {
		case off < 0:
			if p := g.base.Prev(); p.IsValid() {
				return p
			}
			return g.base
		case off > 1023:
			if n := g.block[1023].Next(); n.IsValid() {
				return n
			}
			return g.block[1023]
		}
		return g.block[off]
	}
	t.Repeat(map[string]func(*rapid.T){
		"allocate": func(t *rapid.T) {
			ip, err := a.Allocate()
			var want netip.Addr
			for _, c := range g.allowed {
				if !used[c] {
					want = c
					break
				}
			}
			if !want.IsValid() {
				if !errors.Is(err, ErrExhausted) {
					t.Fatalf("Allocate() = %v, %v on a full pool", ip, err)
				}
				return
			}
			switch {
			case err != nil:
				t.Fatalf("Allocate() error %v with %s free", err, want)
			case !g.pool.Contains(ip):
				t.Fatalf("Allocate() = %s, not Contained", ip)
			case gw.IsValid() && ip == gw:
				t.Fatalf("Allocate() handed out the gateway %s", ip)
			case used[ip]:
				t.Fatalf("Allocate() = %s, already allocated", ip)
			case ip != want:
				t.Fatalf("Allocate() = %s, lowest free is %s", ip, want)
			}
			used[ip] = true
		},
		"reserve": func(t *rapid.T) {
			ip := pick(t)
			err := a.Reserve(ip)
			if (err == nil) != allowed(ip) {
				t.Fatalf("Reserve(%s) = %v, brute force allows it: %v", ip, err, allowed(ip))
			}
			if err == nil {
				used[ip] = true
			}
		},
		"reserveAll": func(t *rapid.T) {
			n := rapid.IntRange(0, 6).Draw(t, "n")
			var ips []netip.Addr
			wantErr := false
			for range n {
				ip := pick(t)
				ips = append(ips, ip)
				if allowed(ip) {
					used[ip] = true
				} else {
					wantErr = true
				}
			}
			if err := a.ReserveAll(ips); (err != nil) != wantErr {
				t.Fatalf("ReserveAll(%v) = %v, want error: %v", ips, err, wantErr)
			}
		},
		"release": func(t *rapid.T) {
			ip := pick(t)
			if got := a.Release(ip); got != used[ip] {
				t.Fatalf("Release(%s) = %v, model says allocated: %v", ip, got, used[ip])
			}
			delete(used, ip)
		},
		"": func(t *rapid.T) {
			if a.Used() != uint64(len(used)) {
				t.Fatalf("Used() = %d, model %d", a.Used(), len(used))
			}
			if a.Used()+a.Free() != a.Total() || a.Total() != uint64(len(g.allowed)) {
				t.Fatalf("Used %d + Free %d != Total %d (brute force %d)", a.Used(), a.Free(), a.Total(), len(g.allowed))
			}
			for ip := range used {
				if !a.IsAllocated(ip) {
					t.Fatalf("IsAllocated(%s) = false", ip)
				}
			}
		},
	})
}

// TestPropertyAllocator: allocated IPs are always Contained, never the
// gateway, never handed out twice, always the lowest free, and Used+Free
// equals Total, over random sequences of operations on small pools.
func TestPropertyAllocator(t *testing.T) {
	rapid.Check(t, allocatorMachine)
}

// TestPropertyParseRangesOverlap: ParseRanges accepts a set of ranges
// exactly when no two share an address (checked address by address), and
// Overlaps agrees with the same brute force across two sets.
func TestPropertyParseRangesOverlap(t *testing.T) {
	base := netip.MustParseAddr("192.0.2.0")
	drawRanges := func(t *rapid.T, label string) ([]Range, [][]int) {
		n := rapid.IntRange(1, 4).Draw(t, label+"Count")
		var rs []Range
		var offs [][]int
		for range n {
			if rapid.Bool().Draw(t, label+"IsCIDR") {
				bits := rapid.IntRange(28, 32).Draw(t, label+"Bits")
				size := 1 << (32 - bits)
				start := rapid.IntRange(0, 64/size-1).Draw(t, label+"Block") * size
				rs = append(rs, Range{CIDR: fmt.Sprintf("%s/%d", addrAt(base, start), bits)})
				offs = append(offs, []int{start, start + size - 1})
				continue
			}
			s := rapid.IntRange(0, 63).Draw(t, label+"Start")
			e := rapid.IntRange(s, 63).Draw(t, label+"End")
			rs = append(rs, Range{Start: addrAt(base, s).String(), End: addrAt(base, e).String()})
			offs = append(offs, []int{s, e})
		}
		return rs, offs
	}
	overlap := func(x, y []int) bool { return x[0] <= y[1] && y[0] <= x[1] }
	rapid.Check(t, func(t *rapid.T) {
		rs, offs := drawRanges(t, "a")
		want := false
		for i := range offs {
			for j := i + 1; j < len(offs); j++ {
				want = want || overlap(offs[i], offs[j])
			}
		}
		parsed, err := ParseRanges(rs)
		if (err != nil) != want {
			t.Fatalf("ParseRanges(%v) error = %v, brute-force overlap = %v", rs, err, want)
		}
		for i, p := range parsed {
			if p.First != addrAt(base, offs[i][0]) || p.Last != addrAt(base, offs[i][1]) {
				t.Fatalf("ipRanges[%d] %v parsed as %s..%s", i, rs[i], p.First, p.Last)
			}
		}

		// Overlaps across two single-range-valid sets.
		bs, boffs := drawRanges(t, "b")
		a1, e1 := ParseRanges(rs[:1])
		b1, e2 := ParseRanges(bs)
		if e1 != nil || e2 != nil {
			return
		}
		wi, wj, wok := -1, -1, false
		for j := range boffs {
			if overlap(offs[0], boffs[j]) {
				wi, wj, wok = 0, j, true
				break
			}
		}
		if i, j, ok := Overlaps(a1, b1); i != wi || j != wj || ok != wok {
			t.Fatalf("Overlaps(%v, %v) = %d, %d, %v; brute force %d, %d, %v", rs[:1], bs, i, j, ok, wi, wj, wok)
		}
	})
}

// TestPropertyAddrRoundTrip: the 128-bit integer form round-trips every
// address and orders addresses as netip does.
func TestPropertyAddrRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var a, b netip.Addr
		if rapid.Bool().Draw(t, "ipv6") {
			a = netip.AddrFrom16([16]byte(rapid.SliceOfN(rapid.Byte(), 16, 16).Draw(t, "a")))
			b = netip.AddrFrom16([16]byte(rapid.SliceOfN(rapid.Byte(), 16, 16).Draw(t, "b")))
		} else {
			a = netip.AddrFrom4([4]byte(rapid.SliceOfN(rapid.Byte(), 4, 4).Draw(t, "a")))
			b = netip.AddrFrom4([4]byte(rapid.SliceOfN(rapid.Byte(), 4, 4).Draw(t, "b")))
		}
		ua, ub := fromAddr(a), fromAddr(b)
		if got := ua.addr(a.Is6()); got != a {
			t.Fatalf("round trip of %s gave %s", a, got)
		}
		if ua.cmp(ub) != a.Compare(b) {
			t.Fatalf("cmp(%s, %s) = %d, netip says %d", a, b, ua.cmp(ub), a.Compare(b))
		}
		if n := a.Next(); n.IsValid() && ua.add1().addr(a.Is6()) != n {
			t.Fatalf("add1(%s) = %s, want %s", a, ua.add1().addr(a.Is6()), n)
		}
		if p := a.Prev(); p.IsValid() && ua.sub1().addr(a.Is6()) != p {
			t.Fatalf("sub1(%s) = %s, want %s", a, ua.sub1().addr(a.Is6()), p)
		}
	})
}
