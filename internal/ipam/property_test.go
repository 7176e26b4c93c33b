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

// chooser makes the choices of a random pool and of the operations on it:
// rapid draws in the property tests (rapidChooser), fuzz bytes in
// FuzzAllocate (byteChooser, fuzz_test.go), so both explore the same space.
type chooser interface {
	// intRange returns a choice in [lo, hi]; label names it in rapid's log.
	intRange(lo, hi int, label string) int
}

// rapidChooser draws each choice with rapid.
type rapidChooser struct{ t *rapid.T }

func (c rapidChooser) intRange(lo, hi int, label string) int {
	return rapid.IntRange(lo, hi).Draw(c.t, label)
}

func choose(c chooser, label string) bool { return c.intRange(0, 1, label) == 1 }

func chooseFrom[T any](c chooser, xs []T, label string) T { return xs[c.intRange(0, len(xs)-1, label)] }

// permute shuffles xs in place (Fisher-Yates) with c's choices.
func permute[T any](c chooser, xs []T, label string) {
	for i := len(xs) - 1; i > 0; i-- {
		j := c.intRange(0, i, label)
		xs[i], xs[j] = xs[j], xs[i]
	}
}

// failer is what drawPool and allocModel need of a test: *rapid.T or
// *testing.T.
type failer interface {
	Fatalf(format string, args ...any)
}

// drawPool draws 1..5 disjoint ranges (CIDRs up to /26-sized and start/end
// ranges) inside a 1024-address block, in random order, an optional gateway
// and an optional subnet equal to the block (where the block is aligned to
// one). IPv6 blocks sometimes straddle
// the 64-bit boundary of the address to exercise carries.
func drawPool(t *rapid.T) *genPool { return choosePool(rapidChooser{t}, t) }

// choosePool is drawPool with the choices made by c.
func choosePool(c chooser, t failer) *genPool {
	g := &genPool{}
	is6 := choose(c, "ipv6")
	if is6 {
		bases := []string{"2001:db8::", "2001:db8:0:0:ffff:ffff:ffff:fe00", "2001:db8:ffff:ffff:ffff:ffff:ffff:fc00", "fd00::400"}
		g.base = netip.MustParseAddr(chooseFrom(c, bases, "base"))
	} else {
		bases := []string{"10.0.0.0", "192.0.2.0", "198.51.100.0", "255.255.252.0", "0.0.0.0"}
		g.base = netip.MustParseAddr(chooseFrom(c, bases, "base"))
	}
	g.block = make([]netip.Addr, 1024)
	for i, a := 0, g.base; i < 1024; i, a = i+1, a.Next() {
		g.block[i] = a
	}
	cursor := 0
	n := c.intRange(1, 5, "ranges")
	for i := 0; i < n && cursor < 1024; i++ {
		cursor += c.intRange(0, 8, "gap")
		if choose(c, "cidr") {
			hostBits := c.intRange(0, 6, "hostBits")
			size := 1 << hostBits
			cursor = (cursor + size - 1) / size * size
			if cursor+size > 1024 {
				break
			}
			g.ranges = append(g.ranges, Range{CIDR: netip.PrefixFrom(g.block[cursor], g.base.BitLen()-hostBits).String()})
			cursor += size
			continue
		}
		size := c.intRange(1, 70, "size")
		if cursor+size > 1024 {
			break
		}
		g.ranges = append(g.ranges, Range{Start: g.block[cursor].String(), End: g.block[cursor+size-1].String()})
		cursor += size
	}
	if len(g.ranges) == 0 {
		g.ranges = []Range{{Start: g.block[0].String(), End: g.block[0].String()}}
	}
	permute(c, g.ranges, "order")

	var gw netip.Addr
	if choose(c, "subnetInfo") {
		g.sub = &SubnetInfo{}
		if choose(c, "gateway") {
			gw = g.block[c.intRange(0, cursor+1, "gatewayOffset")%1024]
			g.sub.Gateway = gw.String()
		}
		// The prefix is the block's (10 host bits) only where the block is
		// aligned to it; an unaligned block (the IPv6 base that straddles
		// the 64-bit boundary) has no such subnet, and a /118 from its
		// base would leave later ranges outside the subnet, which NewPool
		// rightly refuses. The choice is still made, so that each byte of
		// a fuzz input keeps its meaning.
		aligned := netip.PrefixFrom(g.base, g.base.BitLen()-10).Masked().Addr() == g.base
		if choose(c, "prefixLength") && aligned {
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
	if n := c.intRange(0, 4, "exclusions"); n > 0 {
		var ex []Exclusion
		drop := map[netip.Addr]bool{}
		for range n {
			a := g.block[c.intRange(0, 1023, "excludedOffset")]
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

// allocModel drives an Allocator and compares it with a model (a set of
// allocated addresses over the brute-force list). Its operations make
// their choices with c and report a mismatch with t.Fatalf.
type allocModel struct {
	c    chooser
	t    failer
	g    *genPool
	a    *Allocator
	used map[netip.Addr]bool
	gw   netip.Addr
}

func newAllocModel(c chooser, t failer) *allocModel {
	g := choosePool(c, t)
	return &allocModel{c: c, t: t, g: g, a: NewAllocator(g.pool), used: map[netip.Addr]bool{}, gw: g.pool.Gateway()}
}

func (m *allocModel) allowed(ip netip.Addr) bool {
	_, ok := slices.BinarySearchFunc(m.g.allowed, ip, netip.Addr.Compare)
	return ok
}

// pick chooses an address: one allocated now, or one of the block or just
// outside it.
func (m *allocModel) pick() netip.Addr {
	if len(m.used) > 0 && choose(m.c, "pickUsed") {
		var us []netip.Addr
		for ip := range m.used {
			us = append(us, ip)
		}
		slices.SortFunc(us, netip.Addr.Compare)
		return chooseFrom(m.c, us, "used")
	}
	off := m.c.intRange(-2, 1025, "offset")
	switch {
	case off < 0:
		if p := m.g.base.Prev(); p.IsValid() {
			return p
		}
		return m.g.base
	case off > 1023:
		if n := m.g.block[1023].Next(); n.IsValid() {
			return n
		}
		return m.g.block[1023]
	}
	return m.g.block[off]
}

func (m *allocModel) allocate() {
	ip, err := m.a.Allocate()
	var want netip.Addr
	for _, c := range m.g.allowed {
		if !m.used[c] {
			want = c
			break
		}
	}
	if !want.IsValid() {
		if !errors.Is(err, ErrExhausted) {
			m.t.Fatalf("Allocate() = %v, %v on a full pool", ip, err)
		}
		return
	}
	switch {
	case err != nil:
		m.t.Fatalf("Allocate() error %v with %s free", err, want)
	case !m.g.pool.Contains(ip):
		m.t.Fatalf("Allocate() = %s, not Contained", ip)
	case m.gw.IsValid() && ip == m.gw:
		m.t.Fatalf("Allocate() handed out the gateway %s", ip)
	case m.used[ip]:
		m.t.Fatalf("Allocate() = %s, already allocated", ip)
	case ip != want:
		m.t.Fatalf("Allocate() = %s, lowest free is %s", ip, want)
	}
	m.used[ip] = true
}

func (m *allocModel) reserve() {
	ip := m.pick()
	err := m.a.Reserve(ip)
	if (err == nil) != m.allowed(ip) {
		m.t.Fatalf("Reserve(%s) = %v, brute force allows it: %v", ip, err, m.allowed(ip))
	}
	if err == nil {
		m.used[ip] = true
	}
}

func (m *allocModel) reserveAll() {
	n := m.c.intRange(0, 6, "n")
	var ips []netip.Addr
	wantErr := false
	for range n {
		ip := m.pick()
		ips = append(ips, ip)
		if m.allowed(ip) {
			m.used[ip] = true
		} else {
			wantErr = true
		}
	}
	if err := m.a.ReserveAll(ips); (err != nil) != wantErr {
		m.t.Fatalf("ReserveAll(%v) = %v, want error: %v", ips, err, wantErr)
	}
}

func (m *allocModel) release() {
	ip := m.pick()
	if got := m.a.Release(ip); got != m.used[ip] {
		m.t.Fatalf("Release(%s) = %v, model says allocated: %v", ip, got, m.used[ip])
	}
	delete(m.used, ip)
}

// check compares the Allocator's counts and allocations with the model.
func (m *allocModel) check() {
	if m.a.Used() != uint64(len(m.used)) {
		m.t.Fatalf("Used() = %d, model %d", m.a.Used(), len(m.used))
	}
	if m.a.Used()+m.a.Free() != m.a.Total() || m.a.Total() != uint64(len(m.g.allowed)) {
		m.t.Fatalf("Used %d + Free %d != Total %d (brute force %d)", m.a.Used(), m.a.Free(), m.a.Total(), len(m.g.allowed))
	}
	for ip := range m.used {
		if !m.a.IsAllocated(ip) {
			m.t.Fatalf("IsAllocated(%s) = false", ip)
		}
	}
}

// allocatorMachine runs allocModel's operations in an order rapid draws,
// checking the model after each.
func allocatorMachine(t *rapid.T) {
	m := newAllocModel(rapidChooser{t}, t)
	t.Repeat(map[string]func(*rapid.T){
		"allocate":   func(*rapid.T) { m.allocate() },
		"reserve":    func(*rapid.T) { m.reserve() },
		"reserveAll": func(*rapid.T) { m.reserveAll() },
		"release":    func(*rapid.T) { m.release() },
		"":           func(*rapid.T) { m.check() },
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
