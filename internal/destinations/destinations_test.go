package destinations

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func pfx(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func span(first, last, eg string) Span { return Span{First: ip(first), Last: ip(last), Egress: eg} }

// claim is an Egress created age minutes after t0 with destinations dst
// (nil: every destination) and exclusions exc.
func claim(name string, age int, dst, exc []netip.Prefix) Claim {
	return Claim{Egress: name, Created: t0.Add(time.Duration(age) * time.Minute), Destinations: dst, Some: len(dst) > 0, Excluded: exc}
}

// addrs lets go-cmp compare netip values.
var addrs = cmp.Options{cmp.Comparer(func(a, b netip.Addr) bool { return a == b }), cmp.Comparer(func(a, b netip.Prefix) bool { return a == b })}

const (
	top4 = "255.255.255.255"
	top6 = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"
)

// TestDestinationsResolve: the rule on the cases the issue names and their
// neighbours, both families.
func TestDestinationsResolve(t *testing.T) {
	for _, tc := range []struct {
		name   string
		v6     bool
		claims []Claim
		want   []Span
	}{
		{"no claim", false, nil, nil},
		{"one default Egress takes everything", false, []Claim{claim("b", 0, nil, nil)},
			[]Span{span("0.0.0.0", top4, "b")}},
		{"issue scenario: override, default with an exclusion", false, []Claim{
			claim("a", 5, pfx("198.51.100.0/24"), nil),
			claim("b", 0, nil, pfx("203.0.113.0/25")),
		}, []Span{
			span("0.0.0.0", "198.51.99.255", "b"),
			span("198.51.100.0", "198.51.100.255", "a"),
			span("198.51.101.0", "203.0.112.255", "b"),
			span("203.0.113.128", top4, "b"),
		}},
		{"issue scenario, IPv6", true, []Claim{
			claim("a", 5, pfx("2001:db8:1::/48"), nil),
			claim("b", 0, nil, pfx("2001:db8:2::/49")),
		}, []Span{
			span("::", "2001:db8:0:ffff:ffff:ffff:ffff:ffff", "b"),
			span("2001:db8:1::", "2001:db8:1:ffff:ffff:ffff:ffff:ffff", "a"),
			span("2001:db8:2:8000::", top6, "b"),
		}},
		{"tie: the oldest wins", false, []Claim{
			claim("young", 9, pfx("198.51.100.0/24"), nil),
			claim("old", 1, pfx("198.51.100.0/24"), nil),
		}, []Span{span("198.51.100.0", "198.51.100.255", "old")}},
		{"tie on time: the lowest name wins", false, []Claim{
			claim("b", 1, nil, nil),
			claim("a", 1, nil, nil),
		}, []Span{span("0.0.0.0", top4, "a")}},
		{"two defaults: the older takes all, the younger nothing", false, []Claim{
			claim("young", 9, nil, nil),
			claim("old", 1, nil, nil),
		}, []Span{span("0.0.0.0", top4, "old")}},
		{"an exclusion hands over to the next default", false, []Claim{
			claim("young", 9, nil, nil),
			claim("old", 1, nil, pfx("203.0.113.0/25")),
		}, []Span{
			span("0.0.0.0", "203.0.112.255", "old"),
			span("203.0.113.0", "203.0.113.127", "young"),
			span("203.0.113.128", top4, "old"),
		}},
		{"longest prefix beats age", false, []Claim{
			claim("wide", 1, pfx("198.51.0.0/16"), nil),
			claim("narrow", 9, pfx("198.51.100.0/24"), nil),
		}, []Span{
			span("198.51.0.0", "198.51.99.255", "wide"),
			span("198.51.100.0", "198.51.100.255", "narrow"),
			span("198.51.101.0", "198.51.255.255", "wide"),
		}},
		{"an excluded longer prefix falls back to the shorter", false, []Claim{
			claim("wide", 1, pfx("198.51.0.0/16"), nil),
			claim("narrow", 9, pfx("198.51.100.0/24"), pfx("198.51.100.128/25")),
		}, []Span{
			span("198.51.0.0", "198.51.99.255", "wide"),
			span("198.51.100.0", "198.51.100.127", "narrow"),
			span("198.51.100.128", "198.51.255.255", "wide"),
		}},
		{"destinations of the other family only: covers nothing here", false, []Claim{
			claim("v6only", 1, pfx("2001:db8::/32"), nil),
		}, nil},
		{"other family's CIDRs are ignored, own ones count", true, []Claim{
			claim("mixed", 1, pfx("198.51.100.0/24", "2001:db8::/32"), pfx("203.0.113.0/24")),
		}, []Span{span("2001:db8::", "2001:db8:ffff:ffff:ffff:ffff:ffff:ffff", "mixed")}},
		{"a default that excludes everything gives all to the Node IP", false, []Claim{
			claim("b", 1, nil, pfx("0.0.0.0/0")),
		}, nil},
		{"an explicit /0 ties with a default: the oldest wins", false, []Claim{
			claim("explicit", 9, pfx("0.0.0.0/0"), nil),
			claim("default", 1, nil, nil),
		}, []Span{span("0.0.0.0", top4, "default")}},
		{"adjacent CIDRs of one Egress merge", false, []Claim{
			claim("a", 1, pfx("198.51.100.0/25", "198.51.100.128/25"), nil),
		}, []Span{span("198.51.100.0", "198.51.100.255", "a")}},
		{"host route at the top of the space", false, []Claim{
			claim("a", 1, pfx("255.255.255.255/32"), nil),
			claim("b", 2, nil, nil),
		}, []Span{span("0.0.0.0", "255.255.255.254", "b"), span(top4, top4, "a")}},
		{"a duplicate name counts once, the older", false, []Claim{
			claim("a", 1, nil, nil),
			claim("a", 2, pfx("198.51.100.0/24"), nil),
		}, []Span{span("0.0.0.0", top4, "a")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Resolve(tc.v6, tc.claims), addrs); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// naive is the rule evaluated for one destination, straight from its
// statement: the longest matching prefix, the oldest on a tie, exclusions
// only for their own Egress.
func naive(v6 bool, claims []Claim, d netip.Addr) string {
	best, bits := "", -1
	cs := slices.Clone(claims)
	slices.SortStableFunc(cs, Older)
	for _, c := range cs {
		b := -1
		if !c.Some {
			b = 0
		}
		for _, p := range c.Destinations {
			if p.Addr().Is6() == v6 && p.Contains(d) {
				b = max(b, p.Bits())
			}
		}
		for _, p := range c.Excluded {
			if p.Addr().Is6() == v6 && p.Contains(d) {
				b = -1
			}
		}
		if b > bits {
			best, bits = c.Egress, b
		}
	}
	return best
}

// randomClaims draws up to 6 claims whose CIDRs lie in a small corner of
// the address space (so that they overlap often), with equal creation
// times now and then (ties by name).
func randomClaims(r *rand.Rand, v6 bool) []Claim {
	base := ip("198.51.0.0")
	width := 32
	if v6 {
		base, width = ip("2001:db8::"), 128
	}
	randPrefix := func() netip.Prefix {
		bits := width - 16 + r.IntN(17) // /16../32 inside a /16 (IPv4), /112../128 (IPv6)
		b := base.AsSlice()
		lo := r.Uint32() & 0xffff
		b[len(b)-2], b[len(b)-1] = byte(lo>>8), byte(lo)
		a, _ := netip.AddrFromSlice(b)
		return netip.PrefixFrom(a, bits).Masked()
	}
	n := 1 + r.IntN(6)
	out := make([]Claim, n)
	for i := range out {
		c := Claim{Egress: fmt.Sprintf("e%d", i), Created: t0.Add(time.Duration(r.IntN(3)) * time.Minute)}
		if r.IntN(3) > 0 {
			for range 1 + r.IntN(4) {
				c.Destinations = append(c.Destinations, randPrefix())
			}
			c.Some = true
		}
		for range r.IntN(3) {
			c.Excluded = append(c.Excluded, randPrefix())
		}
		out[i] = c
	}
	return out
}

// TestDestinationsProperties checks Resolve against the rule evaluated
// destination by destination (at every boundary of every CIDR, one
// address either side, and random addresses), that the spans are sorted,
// disjoint and merged, and that shuffling the claims changes nothing.
// Deterministic: a fixed seed.
func TestDestinationsProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 2026))
	for iter := range 2000 {
		v6 := iter%2 == 1
		claims := randomClaims(r, v6)
		got := Resolve(v6, claims)
		for i := 1; i < len(got); i++ {
			if got[i-1].Last.Compare(got[i].First) >= 0 {
				t.Fatalf("%v: spans %v and %v overlap or are unsorted", claims, got[i-1], got[i])
			}
			if got[i-1].Egress == got[i].Egress && got[i-1].Last.Next() == got[i].First {
				t.Fatalf("%v: adjacent spans %v and %v of one Egress not merged", claims, got[i-1], got[i])
			}
		}
		var probes []netip.Addr
		for _, c := range claims {
			for _, p := range slices.Concat(c.Destinations, c.Excluded) {
				l := lastOf(p)
				probes = append(probes, p.Addr(), p.Addr().Prev(), l, l.Next())
			}
		}
		for range 16 {
			b := ip("198.51.0.0").AsSlice()
			if v6 {
				b = ip("2001:db8::").AsSlice()
			}
			x := r.Uint32() & 0xffff
			b[len(b)-2], b[len(b)-1] = byte(x>>8), byte(x)
			a, _ := netip.AddrFromSlice(b)
			probes = append(probes, a)
		}
		for _, d := range probes {
			if !d.IsValid() {
				continue
			}
			if want, have := naive(v6, claims, d), Lookup(got, d); want != have {
				t.Fatalf("%v: destination %s: Resolve gives %q, the rule %q (spans %v)", claims, d, have, want, got)
			}
		}
		shuffled := slices.Clone(claims)
		r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if diff := cmp.Diff(got, Resolve(v6, shuffled), addrs); diff != "" {
			t.Fatalf("%v: order changes the result (-first +shuffled):\n%s", claims, diff)
		}
	}
}

// TestDestinationsEverything: Everything recognises a single Egress for
// the whole family and nothing else.
func TestDestinationsEverything(t *testing.T) {
	if n, ok := Everything(false, Resolve(false, []Claim{claim("b", 0, nil, nil)})); !ok || n != "b" {
		t.Errorf("default Egress: Everything = %q, %v; want b, true", n, ok)
	}
	if n, ok := Everything(true, Resolve(true, []Claim{claim("b", 0, nil, nil)})); !ok || n != "b" {
		t.Errorf("default Egress, IPv6: Everything = %q, %v; want b, true", n, ok)
	}
	if _, ok := Everything(false, Resolve(false, []Claim{claim("b", 0, nil, pfx("203.0.113.0/25"))})); ok {
		t.Error("default Egress with an exclusion counted as everything")
	}
	if got := Egresses(Resolve(false, []Claim{claim("a", 5, pfx("198.51.100.0/24"), nil), claim("b", 0, nil, nil), claim("c", 9, nil, nil)})); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("Egresses = %v, want [a b]", got)
	}
}

// TestDestinationsParse skips what does not parse and masks host bits.
func TestDestinationsParse(t *testing.T) {
	got := Parse([]string{"198.51.100.0/24", "bad", "2001:db8::1/64", "::ffff:198.51.100.0/120"})
	if diff := cmp.Diff(pfx("198.51.100.0/24", "2001:db8::/64"), got, addrs); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
