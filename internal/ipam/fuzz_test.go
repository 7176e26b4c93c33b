package ipam

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// FuzzParseRanges feeds arbitrary strings to ParseRanges and NewPool. It
// must never panic; an error must be a non-empty FieldErrors naming a spec
// field; a success must give ranges that are ordered, of one family,
// disjoint, that re-parse to themselves, and a pool whose first allocation
// it Contains and whose gateway it never allocates.
func FuzzParseRanges(f *testing.F) {
	seeds := [][8]string{
		{"192.0.2.0/28", "", "", "", "192.0.2.100", "192.0.2.120", "192.0.2.1", "24"},
		{"2001:db8::/64", "", "", "2001:db8:0:1::/127", "", "", "2001:db8::1", "64"},
		{"192.0.2.0/31", "", "", "192.0.2.2/32", "", "", "", "0"},
		{"192.0.2.5/24", "", "", "", "192.0.2.9", "192.0.2.1", "x", "99"},
		{"", "192.0.2.1", "2001:db8::1", "", "", "", "", ""},
		{"0.0.0.0/0", "", "", "::/0", "", "", "", ""},
		{"", "fe80::1%eth0", "fe80::2", "", "::ffff:1.2.3.4", "::ffff:1.2.3.5", "", ""},
		{"", "", "", "", "", "", "", ""},
		{"192.0.2.0/24", "192.0.2.1", "192.0.2.2", "192.0.2.0/24", "", "", "192.0.2.0", "31"},
		{"", "255.255.255.254", "255.255.255.255", "", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:fffe", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "", ""},
	}
	for _, s := range seeds {
		f.Add(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7])
	}
	f.Fuzz(func(t *testing.T, cidr1, start1, end1, cidr2, start2, end2, gateway, plen string) {
		in := []Range{{CIDR: cidr1, Start: start1, End: end1}, {CIDR: cidr2, Start: start2, End: end2}}
		rs, err := ParseRanges(in)
		if err != nil {
			var list FieldErrors
			if !errors.As(err, &list) || len(list) == 0 {
				t.Fatalf("error %T %v is not a non-empty FieldErrors", err, err)
			}
			for _, fe := range list {
				if !strings.HasPrefix(fe.Field, "ipRanges") || fe.Reason == "" {
					t.Fatalf("bad FieldError %+v", fe)
				}
			}
			return
		}
		if len(rs) != len(in) {
			t.Fatalf("%d ranges for %d entries", len(rs), len(in))
		}
		for i, r := range rs {
			if r.Last.Less(r.First) || r.First.Is4() != rs[0].First.Is4() || r.First.Is4() != r.Last.Is4() {
				t.Fatalf("ipRanges[%d] = %s..%s", i, r.First, r.Last)
			}
			if r.Prefix.IsValid() && (r.Prefix != r.Prefix.Masked() || r.Prefix.Addr() != r.First) {
				t.Fatalf("ipRanges[%d] prefix %s, first %s", i, r.Prefix, r.First)
			}
			again := Range{CIDR: r.String()}
			if !r.Prefix.IsValid() {
				again = Range{Start: r.First.String(), End: r.Last.String()}
			}
			if rr, err := ParseRanges([]Range{again}); err != nil || rr[0] != r {
				t.Fatalf("re-parsing %s gave %v, %v", r, rr, err)
			}
		}
		if rs[0].Overlaps(rs[1]) {
			t.Fatalf("accepted overlapping %s and %s", rs[0], rs[1])
		}

		pl := 0
		for _, c := range plen {
			if c < '0' || c > '9' || pl > 1000 {
				break
			}
			pl = pl*10 + int(c-'0')
		}
		p, err := NewPool(in, &SubnetInfo{Gateway: gateway, PrefixLength: pl})
		if err != nil {
			return
		}
		if p.Total() > satAdd(rs[0].Size(), rs[1].Size()) {
			t.Fatalf("Total() = %d exceeds the ranges' sizes", p.Total())
		}
		a := NewAllocator(p)
		ip, err := a.Allocate()
		switch {
		case p.Total() == 0 && !errors.Is(err, ErrExhausted):
			t.Fatalf("empty pool: Allocate() = %v, %v", ip, err)
		case p.Total() > 0 && (err != nil || !p.Contains(ip) || ip == p.Gateway()):
			t.Fatalf("Allocate() = %v, %v; Contains %v, gateway %v", ip, err, p.Contains(ip), p.Gateway())
		}
		if p.Gateway().IsValid() && a.Reserve(p.Gateway()) == nil {
			t.Fatalf("Reserve(gateway %s) succeeded", p.Gateway())
		}
	})
}

// byteChooser makes choices from fuzz bytes: one byte per choice of up to
// 256 values, two (big endian) for wider ones, taken modulo the number of
// values; past the end every choice is its lowest value. Each byte is one
// choice, so a mutation changes one decision of the pool or one operation.
type byteChooser struct{ b []byte }

func (c *byteChooser) next() int {
	if len(c.b) == 0 {
		return 0
	}
	v := c.b[0]
	c.b = c.b[1:]
	return int(v)
}

func (c *byteChooser) intRange(lo, hi int, _ string) int {
	n := hi - lo + 1
	v := c.next()
	if n > 256 {
		v = v<<8 | c.next()
	}
	return lo + v%n
}

// scriptChooser makes the choices listed in script, in order (past its end,
// each choice's lowest value), and records the bytes with which
// byteChooser makes the same choices: it turns a readable list of choices
// into a fuzz seed.
type scriptChooser struct {
	script []int
	out    []byte
}

func (s *scriptChooser) intRange(lo, hi int, label string) int {
	v := lo
	if len(s.script) > 0 {
		v, s.script = s.script[0], s.script[1:]
	}
	if v < lo || v > hi {
		panic(fmt.Sprintf("seed script: %s = %d is outside [%d, %d]", label, v, lo, hi))
	}
	if hi-lo+1 > 256 {
		s.out = append(s.out, byte((v-lo)>>8))
	}
	s.out = append(s.out, byte(v-lo))
	return v
}

// maxFuzzBytes is the longest FuzzAllocate input run, in bytes: enough for
// a pool (about 20 choices) and some 40 operations. Longer inputs are
// skipped (they return at once), because the fuzzer minimizes every new
// input it keeps and minimizing costs a run per byte removed, so long
// inputs stall it: with no cap it made 23 runs in 45 s (issue 18).
const maxFuzzBytes = 128

// maxFuzzOps caps the operations of one FuzzAllocate input, so that a long
// input costs no more than a few hundred operations.
const maxFuzzOps = 256

// runOps runs operations chosen by c on m, checking the model after each,
// while more says there are choices left (at most maxFuzzOps).
func runOps(c chooser, m *allocModel, more func() bool) {
	m.check()
	for ops := 0; more() && ops < maxFuzzOps; ops++ {
		switch c.intRange(0, 3, "op") {
		case 0:
			m.allocate()
		case 1:
			m.reserve()
		case 2:
			m.reserveAll()
		case 3:
			m.release()
		}
		m.check()
	}
}

// Operation codes of FuzzAllocate's seed scripts.
const (
	opAllocate = iota
	opReserve
	opReserveAll
	opRelease
)

// FuzzAllocate runs the allocator model of TestPropertyAllocator (allocModel)
// on fuzz bytes, one byte per choice (byteChooser): the first bytes choose
// the pool (choosePool: family, block, ranges, their order, gateway,
// subnet, exclusions), each later byte an operation (allocate, reserve,
// reserveAll, release) followed by the bytes its choices need, with the
// model checked after each. The seeds are scripts of choices in the order
// choosePool and the operations make them.
func FuzzAllocate(f *testing.F) {
	const no, yes = 0, 1
	for _, script := range [][]int{
		// IPv4 10.0.0.0: one range (gap 0, a CIDR of 4 host bits: a /28);
		// no subnet info, no exclusions. 15 allocations: the 14 usable
		// addresses, then ErrExhausted.
		append([]int{no, 0, 1, 0, yes, 4, no, 0}, slices.Repeat([]int{opAllocate}, 15)...),
		// IPv6 across the 64-bit boundary: a /122 after a gap of 3 and 70
		// addresses after a gap of 8, listed in reverse (swap 1 with 0);
		// subnet info with the gateway at offset 5 and a prefix length.
		// Allocate; reserve offset 66; release the lowest allocated;
		// reserve offsets 70, 1025 (past the block) and the lowest
		// allocated at once; allocate.
		{yes, 1, 2, 3, yes, 6, 8, no, 70, 0, yes, yes, 5, yes, 0,
			opAllocate, opReserve, no, 66, opRelease, yes, 0,
			opReserveAll, 3, no, 70, no, 1025, yes, 0, opAllocate},
		// IPv4 0.0.0.0 ("this network": nothing is allocatable): three
		// ranges, reordered, two exclusions. Allocate (ErrExhausted),
		// reserve just below the block, release just above it.
		{no, 4, 3, 0, no, 10, 2, yes, 3, 5, no, 40, 1, 0, no, 2, 12, 30,
			opAllocate, opReserve, -1, opRelease, 1024},
		// IPv4 255.255.252.0, the top of the space: a /26 at the start of
		// the block, subnet info with the gateway at offset 1 and a /22
		// prefix. Allocate 3, release the lowest, allocate (it comes back).
		{no, 3, 1, 0, yes, 6, yes, yes, 1, yes, 0,
			opAllocate, opAllocate, opAllocate, opRelease, yes, 0, opAllocate},
		// IPv6 fd00::400: a /123 and 20 addresses, no subnet info, four
		// exclusions (offsets 10, 11, 40, 41). Reserve six at once
		// (below the block, past it, two excluded, two in range), then
		// release both of those and an address past the block.
		{yes, 3, 2, 0, yes, 5, 1, no, 20, 1, no, 4, 10, 11, 40, 41,
			opReserveAll, 6, -2, 1025, 10, 40, 2, no, 3,
			opRelease, yes, 0, opRelease, yes, 0, opRelease, 1025},
	} {
		sc := &scriptChooser{script: script}
		runOps(sc, newAllocModel(sc, f), func() bool { return len(sc.script) > 0 })
		f.Add(sc.out)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > maxFuzzBytes {
			return
		}
		c := &byteChooser{b: data}
		runOps(c, newAllocModel(c, t), func() bool { return len(c.b) > 0 })
	})
}
