package ipam

import (
	"errors"
	"math/rand/v2"
	"strings"
	"testing"

	"pgregory.net/rapid"
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

// FuzzAllocate runs the allocator state machine of TestPropertyAllocator on
// fuzzer-chosen bytes (rapid turns them into pool shapes and operations).
func FuzzAllocate(f *testing.F) {
	// rapid reads the input as a stream of uint64 choices and discards (skips)
	// a run whose input ends early, so the seeds are 4 KiB pseudo-random
	// streams; these PCG seeds each draw a pool and 10 to 60 operations and
	// run to completion. (Much longer inputs make the fuzzer's minimization
	// crawl.)
	for _, seed := range []uint64{1, 2, 4, 5, 7, 8, 11, 12, 15, 19} {
		f.Add(pcgBytes(seed, 4<<10))
	}
	f.Fuzz(rapid.MakeFuzz(allocatorMachine))
}

func pcgBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}
