package ipam

import (
	"errors"
	"math"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestParseRangesValid(t *testing.T) {
	tests := []struct {
		name        string
		in          Range
		first, last string
		str         string
		size        uint64
	}{
		{"ipv4 /28", cidr("192.0.2.0/28"), "192.0.2.0", "192.0.2.15", "192.0.2.0/28", 16},
		{"ipv4 /32", cidr("192.0.2.7/32"), "192.0.2.7", "192.0.2.7", "192.0.2.7/32", 1},
		{"ipv4 /0", cidr("0.0.0.0/0"), "0.0.0.0", "255.255.255.255", "0.0.0.0/0", 1 << 32},
		{"ipv4 start-end", between("192.0.2.100", "192.0.2.120"), "192.0.2.100", "192.0.2.120", "192.0.2.100-192.0.2.120", 21},
		{"ipv4 single start-end", between("192.0.2.9", "192.0.2.9"), "192.0.2.9", "192.0.2.9", "192.0.2.9-192.0.2.9", 1},
		{"ipv6 /64", cidr("2001:db8::/64"), "2001:db8::", "2001:db8::ffff:ffff:ffff:ffff", "2001:db8::/64", math.MaxUint64},
		{"ipv6 /65", cidr("2001:db8::/65"), "2001:db8::", "2001:db8::7fff:ffff:ffff:ffff", "2001:db8::/65", 1 << 63},
		{"ipv6 /0", cidr("::/0"), "::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "::/0", math.MaxUint64},
		{"ipv6 upper case", cidr("2001:DB8::/126"), "2001:db8::", "2001:db8::3", "2001:db8::/126", 4},
		{"ipv6 start-end across 64-bit boundary", between("2001:db8::ffff:ffff:ffff:fffe", "2001:db8:0:1::1"),
			"2001:db8::ffff:ffff:ffff:fffe", "2001:db8:0:1::1", "2001:db8::ffff:ffff:ffff:fffe-2001:db8:0:1::1", 4},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRanges([]Range{tt.in})
			if err != nil {
				t.Fatalf("ParseRanges: %v", err)
			}
			r := got[0]
			if r.First != netip.MustParseAddr(tt.first) || r.Last != netip.MustParseAddr(tt.last) {
				t.Errorf("got %s..%s, want %s..%s", r.First, r.Last, tt.first, tt.last)
			}
			if r.String() != tt.str {
				t.Errorf("String() = %q, want %q", r.String(), tt.str)
			}
			if r.Size() != tt.size {
				t.Errorf("Size() = %d, want %d", r.Size(), tt.size)
			}
			if r.Prefix.IsValid() != (tt.in.CIDR != "") {
				t.Errorf("Prefix = %v for input %+v", r.Prefix, tt.in)
			}
		})
	}
}

func TestParseRangesErrors(t *testing.T) {
	tests := []struct {
		name   string
		in     []Range
		field  string // of the first error
		reason string // substring of the first error's reason
		count  int    // number of errors
	}{
		{"empty", nil, "ipRanges", "at least one", 1},
		{"both cidr and range", []Range{{CIDR: "192.0.2.0/24", Start: "192.0.2.1", End: "192.0.2.2"}}, "ipRanges[0]", "not both", 1},
		{"cidr and start only", []Range{{CIDR: "192.0.2.0/24", Start: "192.0.2.1"}}, "ipRanges[0]", "not both", 1},
		{"neither", []Range{{}}, "ipRanges[0]", "set either cidr or start and end", 1},
		{"start only", []Range{{Start: "192.0.2.1"}}, "ipRanges[0].end", "required", 1},
		{"end only", []Range{{End: "192.0.2.1"}}, "ipRanges[0].start", "required", 1},
		{"bad cidr", []Range{cidr("192.0.2.0")}, "ipRanges[0].cidr", "not a CIDR", 1},
		{"bad prefix length", []Range{cidr("192.0.2.0/33")}, "ipRanges[0].cidr", "not a CIDR", 1},
		{"cidr garbage", []Range{cidr("office")}, "ipRanges[0].cidr", "not a CIDR", 1},
		{"cidr with zone", []Range{cidr("fe80::%eth0/64")}, "ipRanges[0].cidr", "not a CIDR", 1},
		{"host bits set", []Range{cidr("192.0.2.5/24")}, "ipRanges[0].cidr", "the network is 192.0.2.0/24", 1},
		{"ipv6 host bits set", []Range{cidr("2001:db8::1/64")}, "ipRanges[0].cidr", "the network is 2001:db8::/64", 1},
		{"ipv4-mapped cidr", []Range{cidr("::ffff:192.0.2.0/120")}, "ipRanges[0].cidr", "IPv4-mapped", 1},
		{"bad start", []Range{between("192.0.2.300", "192.0.2.4")}, "ipRanges[0].start", "not an IP address", 1},
		{"bad start and end", []Range{between("x", "y")}, "ipRanges[0].start", "not an IP address", 2},
		{"leading zero", []Range{between("192.0.2.01", "192.0.2.4")}, "ipRanges[0].start", "not an IP address", 1},
		{"zone", []Range{between("fe80::1%eth0", "fe80::2")}, "ipRanges[0].start", "zone", 1},
		{"ipv4-mapped start", []Range{between("::ffff:192.0.2.1", "::ffff:192.0.2.9")}, "ipRanges[0].start", "write 192.0.2.1", 2},
		{"start after end", []Range{between("192.0.2.9", "192.0.2.1")}, "ipRanges[0]", "start is after end", 1},
		{"mixed family in range", []Range{between("192.0.2.1", "2001:db8::1")}, "ipRanges[0]", "start is IPv4 but end is IPv6", 1},
		{"mixed family across ranges", []Range{cidr("192.0.2.0/24"), cidr("2001:db8::/64")}, "ipRanges[1]", "is IPv6 but ipRanges[0] is IPv4", 1},
		{"family of the majority wins", []Range{cidr("2001:db8::/64"), cidr("192.0.2.0/24"), cidr("198.51.100.0/24")}, "ipRanges[0]", "is IPv6 but ipRanges[1] is IPv4", 1},
		{"family ignores invalid entries", []Range{cidr("192.0.2.1/24"), cidr("2001:db8::/64"), cidr("192.0.3.0/24")}, "ipRanges[0].cidr", "host bits", 2},
		{"overlap cidr and range", []Range{cidr("192.0.2.0/24"), between("192.0.2.255", "192.0.3.4")}, "ipRanges[1]", "overlaps ipRanges[0] (192.0.2.0/24)", 1},
		{"overlap reported on later entry", []Range{between("192.0.2.10", "192.0.2.20"), cidr("192.0.2.0/28")}, "ipRanges[1]", "overlaps ipRanges[0] (192.0.2.10-192.0.2.20)", 1},
		{"overlap nested", []Range{cidr("10.0.0.0/8"), cidr("10.1.0.0/16"), cidr("10.2.0.0/16")}, "ipRanges[1]", "overlaps ipRanges[0]", 2},
		{"duplicate", []Range{cidr("2001:db8::/64"), cidr("2001:db8::/64")}, "ipRanges[1]", "overlaps ipRanges[0]", 1},
		{"errors in several entries", []Range{cidr("bad"), {}, between("1.1.1.1", "1.1.1.0")}, "ipRanges[0].cidr", "not a CIDR", 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRanges(tt.in)
			if err == nil {
				t.Fatalf("ParseRanges(%+v) = %v, want an error", tt.in, got)
			}
			var list FieldErrors
			if !errors.As(err, &list) {
				t.Fatalf("error %T is not FieldErrors: %v", err, err)
			}
			if len(list) != tt.count {
				t.Errorf("got %d errors, want %d: %v", len(list), tt.count, err)
			}
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("errors.As(*FieldError) failed on %v", err)
			}
			if fe.Field != tt.field || !strings.Contains(fe.Reason, tt.reason) {
				t.Errorf("first error = %q (field %q), want field %q reason containing %q", fe, fe.Field, tt.field, tt.reason)
			}
		})
	}
}

func TestNewPoolSubnetErrors(t *testing.T) {
	v4 := []Range{cidr("192.0.2.0/28")}
	tests := []struct {
		name   string
		rs     []Range
		sub    SubnetInfo
		field  string
		reason string
	}{
		{"bad gateway", v4, SubnetInfo{Gateway: "192.0.2"}, "subnetInfo.gateway", "not an IP address"},
		{"gateway other family", v4, SubnetInfo{Gateway: "2001:db8::1"}, "subnetInfo.gateway", "is IPv6 but the pool's ipRanges are IPv4"},
		{"prefix too long v4", v4, SubnetInfo{PrefixLength: 33}, "subnetInfo.prefixLength", "between 1 and 32"},
		{"prefix negative", v4, SubnetInfo{PrefixLength: -1}, "subnetInfo.prefixLength", "between 1 and 32"},
		{"prefix too long v6", []Range{cidr("2001:db8::/64")}, SubnetInfo{PrefixLength: 129}, "subnetInfo.prefixLength", "between 1 and 128"},
		{"vlan 4095", v4, SubnetInfo{VLAN: 4095}, "subnetInfo.vlan", "between 0 and 4094"},
		{"vlan negative", v4, SubnetInfo{VLAN: -1}, "subnetInfo.vlan", "between 0 and 4094"},
		{"range outside subnet", []Range{cidr("192.0.2.0/28"), between("192.0.3.1", "192.0.3.2")},
			SubnetInfo{Gateway: "192.0.2.1", PrefixLength: 24}, "ipRanges[1]", "not inside the subnet 192.0.2.0/24"},
		{"range wider than subnet", v4, SubnetInfo{Gateway: "192.0.2.1", PrefixLength: 29}, "ipRanges[0]", "not inside the subnet 192.0.2.0/29"},
		{"range errors and subnet errors together", []Range{cidr("192.0.2.1/24")}, SubnetInfo{VLAN: 5000}, "ipRanges[0].cidr", "host bits"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NewPool(tt.rs, &tt.sub)
			if err == nil {
				t.Fatalf("NewPool = %v, want an error", p)
			}
			var fe *FieldError
			if !errors.As(err, &fe) {
				t.Fatalf("errors.As(*FieldError) failed on %v", err)
			}
			if fe.Field != tt.field || !strings.Contains(fe.Reason, tt.reason) {
				t.Errorf("first error = %q, want field %q reason containing %q", fe, tt.field, tt.reason)
			}
		})
	}
	// Both the range error and the VLAN error are reported.
	_, err := NewPool([]Range{cidr("192.0.2.1/24")}, &SubnetInfo{VLAN: 5000})
	if list := err.(FieldErrors); len(list) != 2 || list[1].Field != "subnetInfo.vlan" {
		t.Errorf("want the cidr and vlan errors, got %v", err)
	}
}

// TestAllocatableAddresses checks, rule by rule, exactly which addresses a
// pool hands out and in which order, and its Total.
func TestAllocatableAddresses(t *testing.T) {
	tests := []struct {
		name  string
		rs    []Range
		sub   *SubnetInfo
		want  []string // every address, in allocation order; nil when only first/last are checked
		first string
		last  string
		total uint64
	}{
		{name: "ipv4 /30 skips network and broadcast", rs: []Range{cidr("192.0.2.0/30")},
			want: []string{"192.0.2.1", "192.0.2.2"}, total: 2},
		{name: "ipv4 /31 gives both (RFC 3021)", rs: []Range{cidr("192.0.2.0/31")},
			want: []string{"192.0.2.0", "192.0.2.1"}, total: 2},
		{name: "ipv4 /32 gives its address", rs: []Range{cidr("192.0.2.9/32")},
			want: []string{"192.0.2.9"}, total: 1},
		{name: "ipv4 /24 skips .0 and .255", rs: []Range{cidr("192.0.2.0/24")},
			first: "192.0.2.1", last: "192.0.2.254", total: 254},
		{name: "ipv4 /29 gateway skipped", rs: []Range{cidr("192.0.2.0/29")}, sub: &SubnetInfo{Gateway: "192.0.2.1"},
			want: []string{"192.0.2.2", "192.0.2.3", "192.0.2.4", "192.0.2.5", "192.0.2.6"}, total: 5},
		{name: "gateway in the middle of a range", rs: []Range{between("192.0.2.10", "192.0.2.12")}, sub: &SubnetInfo{Gateway: "192.0.2.11"},
			want: []string{"192.0.2.10", "192.0.2.12"}, total: 2},
		{name: "gateway outside the ranges changes nothing", rs: []Range{between("192.0.2.10", "192.0.2.11")}, sub: &SubnetInfo{Gateway: "192.0.2.1"},
			want: []string{"192.0.2.10", "192.0.2.11"}, total: 2},
		{name: "gateway is the only address", rs: []Range{cidr("192.0.2.1/32")}, sub: &SubnetInfo{Gateway: "192.0.2.1"},
			want: []string{}, total: 0},
		{name: "start-end gives network and broadcast-looking addresses", rs: []Range{between("192.0.2.255", "192.0.3.0")},
			want: []string{"192.0.2.255", "192.0.3.0"}, total: 2},
		{name: "subnet network and broadcast skipped in start-end", rs: []Range{between("192.0.2.0", "192.0.2.2"), between("192.0.2.254", "192.0.2.255")},
			sub: &SubnetInfo{PrefixLength: 24}, want: []string{"192.0.2.1", "192.0.2.2", "192.0.2.254"}, total: 3},
		{name: "subnet /31 reserves nothing", rs: []Range{between("192.0.2.0", "192.0.2.1")},
			sub: &SubnetInfo{Gateway: "192.0.2.0", PrefixLength: 31}, want: []string{"192.0.2.1"}, total: 1},
		{name: "several ranges, lowest first regardless of order", rs: []Range{cidr("192.0.2.8/30"), between("192.0.2.1", "192.0.2.2")},
			want: []string{"192.0.2.1", "192.0.2.2", "192.0.2.9", "192.0.2.10"}, total: 4},
		{name: "adjacent ranges merge", rs: []Range{between("192.0.2.3", "192.0.2.4"), between("192.0.2.1", "192.0.2.2")},
			want: []string{"192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4"}, total: 4},
		// 0/8, 127/8, 169.254/16, 224/4 and 255.255.255.255 are special.
		{name: "ipv4 /0", rs: []Range{cidr("0.0.0.0/0")}, first: "1.0.0.0", last: "255.255.255.254", total: 1<<32 - 2<<24 - 1<<16 - 1<<28 - 1},
		{name: "top of ipv4 space", rs: []Range{between("255.255.255.254", "255.255.255.255")},
			want: []string{"255.255.255.254"}, total: 1},
		{name: "start-end across loopback skips 127/8", rs: []Range{between("126.255.255.254", "128.0.0.1")},
			want: []string{"126.255.255.254", "126.255.255.255", "128.0.0.0", "128.0.0.1"}, total: 4},
		{name: "start-end across link-local skips 169.254/16", rs: []Range{between("169.253.255.255", "169.255.0.0")},
			want: []string{"169.253.255.255", "169.255.0.0"}, total: 2},
		{name: "ipv6 start-end across fe80::/10", rs: []Range{between("fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "fec0::")},
			want: []string{"fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "fec0::"}, total: 2},
		{name: "ipv6 /126 skips Subnet-Router anycast", rs: []Range{cidr("2001:db8::/126")},
			want: []string{"2001:db8::1", "2001:db8::2", "2001:db8::3"}, total: 3},
		{name: "ipv6 /127 gives both (RFC 6164)", rs: []Range{cidr("2001:db8::/127")},
			want: []string{"2001:db8::", "2001:db8::1"}, total: 2},
		{name: "ipv6 /128", rs: []Range{cidr("2001:db8::5/128")}, want: []string{"2001:db8::5"}, total: 1},
		{name: "ipv6 start-end gives the all-zero address", rs: []Range{between("2001:db8::", "2001:db8::1")},
			want: []string{"2001:db8::", "2001:db8::1"}, total: 2},
		{name: "ipv6 subnet anycast skipped in start-end", rs: []Range{between("2001:db8::", "2001:db8::2")},
			sub: &SubnetInfo{Gateway: "2001:db8::1", PrefixLength: 64}, want: []string{"2001:db8::2"}, total: 1},
		{name: "ipv6 /64 is 2^64-1", rs: []Range{cidr("2001:db8::/64")},
			first: "2001:db8::1", last: "2001:db8::ffff:ffff:ffff:ffff", total: math.MaxUint64},
		{name: "ipv6 /64 with gateway", rs: []Range{cidr("2001:db8::/64")}, sub: &SubnetInfo{Gateway: "2001:db8::1", PrefixLength: 64},
			first: "2001:db8::2", last: "2001:db8::ffff:ffff:ffff:ffff", total: math.MaxUint64 - 1},
		{name: "ipv6 two /64 saturate", rs: []Range{cidr("2001:db8::/64"), cidr("2001:db8:0:1::/64")},
			first: "2001:db8::1", last: "2001:db8:0:1:ffff:ffff:ffff:ffff", total: math.MaxUint64},
		{name: "ipv6 /0 saturates", rs: []Range{cidr("::/0")}, first: "::2", last: "feff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", total: math.MaxUint64},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustPool(t, tt.sub, tt.rs...)
			if p.Total() != tt.total {
				t.Errorf("Total() = %d, want %d", p.Total(), tt.total)
			}
			if tt.want != nil {
				got := drain(t, NewAllocator(p), len(tt.want))
				if !slices.Equal(got, addrs(tt.want...)) {
					t.Errorf("allocated %v, want %v", got, tt.want)
				}
				for _, ip := range got {
					if !p.Contains(ip) {
						t.Errorf("Contains(%s) = false for an allocated address", ip)
					}
				}
				return
			}
			a := NewAllocator(p)
			if ip, err := a.Allocate(); err != nil || ip != netip.MustParseAddr(tt.first) {
				t.Errorf("first Allocate() = %v, %v; want %s", ip, err, tt.first)
			}
			// Reserving the last allocatable address must succeed; the one
			// after it (if any) must not be allocatable.
			last := netip.MustParseAddr(tt.last)
			if err := a.Reserve(last); err != nil {
				t.Errorf("Reserve(last %s): %v", last, err)
			}
			if n := last.Next(); n.IsValid() && p.Contains(n) {
				t.Errorf("Contains(%s) = true past the last address", n)
			}
		})
	}
}

func TestCheck(t *testing.T) {
	p := mustPool(t, &SubnetInfo{Gateway: "192.0.2.1", PrefixLength: 24},
		cidr("192.0.2.0/28"), between("192.0.2.250", "192.0.2.255"))
	p6 := mustPool(t, nil, cidr("2001:db8::/120"))
	tests := []struct {
		name   string
		pool   *Pool
		ip     netip.Addr
		want   error // nil, ErrOutsidePool or ErrReservedAddress
		reason string
	}{
		{"allocatable", p, netip.MustParseAddr("192.0.2.2"), nil, ""},
		{"start-end address", p, netip.MustParseAddr("192.0.2.254"), nil, ""},
		{"gateway", p, netip.MustParseAddr("192.0.2.1"), ErrReservedAddress, "gateway"},
		{"cidr network", p, netip.MustParseAddr("192.0.2.0"), ErrReservedAddress, "network address"},
		{"cidr broadcast", p, netip.MustParseAddr("192.0.2.15"), ErrReservedAddress, "broadcast address of ipRanges[0] (192.0.2.0/28)"},
		{"subnet broadcast", p, netip.MustParseAddr("192.0.2.255"), ErrReservedAddress, "broadcast address of the subnet 192.0.2.0/24"},
		{"between ranges", p, netip.MustParseAddr("192.0.2.16"), ErrOutsidePool, "none of the pool's ipRanges"},
		{"other family", p, netip.MustParseAddr("2001:db8::1"), ErrOutsidePool, "is IPv6 but the pool is IPv4"},
		{"ipv4-mapped", p, netip.MustParseAddr("::ffff:192.0.2.2"), ErrOutsidePool, "write 192.0.2.2"},
		{"zero Addr", p, netip.Addr{}, ErrOutsidePool, "not a valid IP"},
		{"ipv6 anycast", p6, netip.MustParseAddr("2001:db8::"), ErrReservedAddress, "Subnet-Router anycast"},
		{"ipv6 allocatable", p6, netip.MustParseAddr("2001:db8::ff"), nil, ""},
		{"ipv6 zone", p6, netip.MustParseAddr("2001:db8::2%eth0"), ErrOutsidePool, "zone"},
		{"ipv6 outside", p6, netip.MustParseAddr("2001:db8::100"), ErrOutsidePool, "none of the pool's ipRanges"},
		{"ipv4 in ipv6 pool", p6, netip.MustParseAddr("192.0.2.2"), ErrOutsidePool, "is IPv4 but the pool is IPv6"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.pool.Check(tt.ip)
			if got := tt.pool.Contains(tt.ip); got != (tt.want == nil) {
				t.Errorf("Contains(%s) = %v", tt.ip, got)
			}
			if tt.want == nil {
				if err != nil {
					t.Errorf("Check(%s) = %v, want nil", tt.ip, err)
				}
				return
			}
			var ae *AddrError
			if !errors.Is(err, tt.want) || !errors.As(err, &ae) || !strings.Contains(ae.Reason, tt.reason) {
				t.Errorf("Check(%s) = %v, want %v with reason containing %q", tt.ip, err, tt.want, tt.reason)
			}
		})
	}
}

func TestAddrErrorMessages(t *testing.T) {
	p := mustPool(t, &SubnetInfo{Gateway: "192.0.2.1"}, cidr("192.0.2.0/28"))
	tests := []struct {
		ip   netip.Addr
		want string
	}{
		{netip.MustParseAddr("192.0.2.1"), "IP 192.0.2.1 is the gateway (subnetInfo.gateway), which is never allocated"},
		{netip.MustParseAddr("192.0.2.0"), "IP 192.0.2.0 is the network address of ipRanges[0] (192.0.2.0/28), which is never allocated"},
		{netip.MustParseAddr("192.0.2.99"), "IP 192.0.2.99 is in none of the pool's ipRanges"},
		{netip.MustParseAddr("::ffff:192.0.2.3"), "IP ::ffff:192.0.2.3 is IPv4-mapped IPv6 (write 192.0.2.3)"},
		{netip.Addr{}, "no valid IP address given"},
	}
	for _, tt := range tests {
		if got := p.Check(tt.ip); got == nil || got.Error() != tt.want {
			t.Errorf("Check(%v) = %v, want %q", tt.ip, got, tt.want)
		}
	}
}

func TestPoolAccessors(t *testing.T) {
	rs := []Range{cidr("192.0.2.16/28"), between("192.0.2.2", "192.0.2.5")}
	p := mustPool(t, &SubnetInfo{Gateway: "192.0.2.1", PrefixLength: 24, VLAN: 7}, rs...)
	if p.Is6() || p.VLAN() != 7 || p.Gateway() != netip.MustParseAddr("192.0.2.1") ||
		p.Subnet() != netip.MustParsePrefix("192.0.2.0/24") {
		t.Errorf("accessors: is6=%v vlan=%d gw=%s subnet=%s", p.Is6(), p.VLAN(), p.Gateway(), p.Subnet())
	}
	got := p.Ranges()
	if len(got) != 2 || got[0].String() != "192.0.2.16/28" || got[1].String() != "192.0.2.2-192.0.2.5" {
		t.Errorf("Ranges() = %v, want spec order", got)
	}
	got[0] = IPRange{}
	if p.Ranges()[0].String() != "192.0.2.16/28" {
		t.Error("Ranges() returned the pool's own slice")
	}
	q := mustPool(t, nil, cidr("2001:db8::/64"))
	if !q.Is6() || q.Gateway().IsValid() || q.Subnet().IsValid() || q.VLAN() != 0 {
		t.Errorf("pool without subnetInfo: is6=%v gw=%v subnet=%v vlan=%d", q.Is6(), q.Gateway(), q.Subnet(), q.VLAN())
	}
}

func TestOverlaps(t *testing.T) {
	parse := func(rs ...Range) []IPRange {
		out, err := ParseRanges(rs)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	tests := []struct {
		name   string
		a, b   []IPRange
		ai, bi int
		ok     bool
	}{
		{"disjoint", parse(cidr("192.0.2.0/25")), parse(cidr("192.0.2.128/25")), -1, -1, false},
		{"touching is not overlapping", parse(between("192.0.2.1", "192.0.2.9")), parse(between("192.0.2.10", "192.0.2.20")), -1, -1, false},
		{"share one address", parse(between("192.0.2.1", "192.0.2.10")), parse(between("192.0.2.10", "192.0.2.20")), 0, 0, true},
		{"share a broadcast address", parse(cidr("192.0.2.0/24")), parse(cidr("192.0.2.255/32")), 0, 0, true},
		{"first pair in order", parse(cidr("10.0.0.0/24"), cidr("10.0.1.0/24")), parse(cidr("10.0.2.0/24"), cidr("10.0.1.128/25"), cidr("10.0.1.0/30")), 1, 1, true},
		{"different families", parse(cidr("::/0")), parse(cidr("0.0.0.0/0")), -1, -1, false},
		{"ipv6", parse(cidr("2001:db8::/48")), parse(cidr("2001:db8:0:5::/64")), 0, 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ai, bi, ok := Overlaps(tt.a, tt.b)
			if ai != tt.ai || bi != tt.bi || ok != tt.ok {
				t.Errorf("Overlaps = %d, %d, %v; want %d, %d, %v", ai, bi, ok, tt.ai, tt.bi, tt.ok)
			}
			if bi2, ai2, ok2 := Overlaps(tt.b, tt.a); ok2 != tt.ok || (ok2 && !tt.a[ai2].Overlaps(tt.b[bi2])) {
				t.Errorf("Overlaps is not symmetric: %d, %d, %v", ai2, bi2, ok2)
			}
		})
	}
}

func TestUncovered(t *testing.T) {
	allocated := addrs("192.0.2.2", "192.0.2.20", "192.0.2.2", "192.0.2.100", "192.0.2.9")
	tests := []struct {
		name string
		rs   []Range
		sub  *SubnetInfo
		want []string
	}{
		{"same pool", []Range{cidr("192.0.2.0/27"), between("192.0.2.100", "192.0.2.100")}, nil, nil},
		{"grown", []Range{cidr("192.0.2.0/24")}, nil, nil},
		{"range removed", []Range{cidr("192.0.2.0/27")}, nil, []string{"192.0.2.100"}},
		{"range shrunk", []Range{cidr("192.0.2.0/28"), between("192.0.2.100", "192.0.2.100")}, nil, []string{"192.0.2.20"}},
		{"new gateway on an allocated IP", []Range{cidr("192.0.2.0/24")}, &SubnetInfo{Gateway: "192.0.2.9"}, []string{"192.0.2.9"}},
		{"family changed, sorted and deduplicated", []Range{cidr("2001:db8::/64")}, nil,
			[]string{"192.0.2.2", "192.0.2.9", "192.0.2.20", "192.0.2.100"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := mustPool(t, tt.sub, tt.rs...).Uncovered(allocated)
			if !slices.Equal(got, addrs(tt.want...)) {
				t.Errorf("Uncovered = %v, want %v", got, tt.want)
			}
		})
	}
}
