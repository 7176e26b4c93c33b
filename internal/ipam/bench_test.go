package ipam

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
)

// randomHosts returns n distinct allocatable addresses of p drawn with pick
// from a fixed-seed PCG, in the order drawn.
func randomHosts(b *testing.B, p *Pool, n int, pick func(r *rand.Rand) netip.Addr) []netip.Addr {
	b.Helper()
	r := rand.New(rand.NewPCG(42, 42))
	seen := make(map[netip.Addr]bool, n)
	out := make([]netip.Addr, 0, n)
	for len(out) < n {
		ip := pick(r)
		if !seen[ip] && p.Contains(ip) {
			seen[ip] = true
			out = append(out, ip)
		}
	}
	return out
}

func v4Host(base netip.Addr, max uint32) func(*rand.Rand) netip.Addr {
	b := base.As4()
	start := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	return func(r *rand.Rand) netip.Addr {
		v := start + r.Uint32N(max)
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
}

func v6Host(prefix netip.Prefix) func(*rand.Rand) netip.Addr {
	return func(r *rand.Rand) netip.Addr {
		b := prefix.Addr().As16()
		lo := r.Uint64()
		for i := range 8 {
			b[15-i] = byte(lo >> (8 * i))
		}
		return netip.AddrFrom16(b)
	}
}

// lowest allocates the n lowest free addresses of a.
func lowest(b *testing.B, a *Allocator, n int) {
	b.Helper()
	for range n {
		if _, err := a.Allocate(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAllocate measures one Allocate (the lowest free address) followed
// by the Release of that address, so the state is the same at every
// iteration.
func BenchmarkAllocate(b *testing.B) {
	v4 := netip.MustParseAddr("10.0.0.0")
	v6 := netip.MustParsePrefix("2001:db8::/64")
	many := make([]Range, 256)
	for i := range many {
		many[i] = Range{CIDR: fmt.Sprintf("10.0.%d.7/32", i)}
	}
	cases := []struct {
		name  string
		pool  *Pool
		setup func(b *testing.B, a *Allocator)
	}{
		{"ipv4-16/empty", mustPool(b, nil, cidr("10.0.0.0/16")), func(*testing.B, *Allocator) {}},
		{"ipv4-16/60k-used-lowest", mustPool(b, nil, cidr("10.0.0.0/16")), func(b *testing.B, a *Allocator) { lowest(b, a, 60000) }},
		{"ipv4-16/60k-used-random", mustPool(b, nil, cidr("10.0.0.0/16")), func(b *testing.B, a *Allocator) {
			if err := a.ReserveAll(randomHosts(b, a.Pool(), 60000, v4Host(v4, 1<<16))); err != nil {
				b.Fatal(err)
			}
		}},
		{"ipv4-16/65533-used-last-free", mustPool(b, nil, cidr("10.0.0.0/16")), func(b *testing.B, a *Allocator) {
			lowest(b, a, 65534)
			a.Release(netip.MustParseAddr("10.0.255.254"))
		}},
		{"ipv4-256x32/255-used", mustPool(b, nil, many...), func(b *testing.B, a *Allocator) { lowest(b, a, 255) }},
		{"ipv6-64/empty", mustPool(b, nil, Range{CIDR: v6.String()}), func(*testing.B, *Allocator) {}},
		{"ipv6-64/10k-used-lowest", mustPool(b, nil, Range{CIDR: v6.String()}), func(b *testing.B, a *Allocator) { lowest(b, a, 10000) }},
		{"ipv6-64/10k-used-random", mustPool(b, nil, Range{CIDR: v6.String()}), func(b *testing.B, a *Allocator) {
			if err := a.ReserveAll(randomHosts(b, a.Pool(), 10000, v6Host(v6))); err != nil {
				b.Fatal(err)
			}
		}},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			a := NewAllocator(c.pool)
			c.setup(b, a)
			used := a.Used()
			b.ReportAllocs()
			for b.Loop() {
				ip, err := a.Allocate()
				if err != nil {
					b.Fatal(err)
				}
				a.Release(ip)
			}
			if a.Used() != used {
				b.Fatalf("Used() = %d, want %d", a.Used(), used)
			}
		})
	}
}

// BenchmarkRebuild measures rebuilding the state of a /16 from 60000 status
// IPs in random order, as at controller start-up: all at once with
// ReserveAll, and one Reserve per Egress.
func BenchmarkRebuild(b *testing.B) {
	p := mustPool(b, nil, cidr("10.0.0.0/16"))
	ips := randomHosts(b, p, 60000, v4Host(netip.MustParseAddr("10.0.0.0"), 1<<16))
	b.Run("ReserveAll/ipv4-16/60k-random", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			a := NewAllocator(p)
			if err := a.ReserveAll(ips); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Reserve-each/ipv4-16/60k-random", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			a := NewAllocator(p)
			for _, ip := range ips {
				if err := a.Reserve(ip); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}

// BenchmarkCheck measures Pool.Check of an allocatable and a reserved
// address, as the webhook does for a user-named IP.
func BenchmarkCheck(b *testing.B) {
	p := mustPool(b, &SubnetInfo{Gateway: "10.0.0.1", PrefixLength: 16}, cidr("10.0.0.0/17"), between("10.0.128.10", "10.0.128.20"))
	for _, ip := range addrs("10.0.77.7", "10.0.0.1") {
		b.Run(ip.String(), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = p.Check(ip)
			}
		})
	}
}
