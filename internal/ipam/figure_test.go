package ipam

import (
	"math/big"
	"testing"
)

func TestTotalText(t *testing.T) {
	for _, tc := range []struct {
		ranges []Range
		subnet *SubnetInfo
		want   string
	}{
		{[]Range{{CIDR: "192.0.2.0/28"}}, nil, "14"},
		{[]Range{{CIDR: "198.51.100.7/32"}}, nil, "1"},
		// A CIDR loses its Subnet-Router anycast address: 2^n - 1.
		{[]Range{{CIDR: "2001:db8::/96"}}, nil, "4294967295"},
		{[]Range{{Start: "2001:db8::1:0:0", End: "2001:db8::1:ffff:ffff"}}, nil, "4294967296"}, // 2^32: still exact
		{[]Range{{Start: "2001:db8::2:0:0", End: "2001:db8::3:ffff:ffff"}}, nil, "2^33"},
		{[]Range{{CIDR: "2001:db8::/64"}}, &SubnetInfo{Gateway: "2001:db8::1", PrefixLength: 64}, "~2^64"},
		{[]Range{{CIDR: "2001:db8::/64"}}, nil, "~2^64"},
		{[]Range{{Start: "2001:db8:0:1::", End: "2001:db8:0:1:ffff:ffff:ffff:ffff"}}, nil, "2^64"},
		{[]Range{{CIDR: "2001:db8::/48"}}, nil, "~2^80"},
		{[]Range{{CIDR: "2001:db8::/32"}, {CIDR: "2001:db9::/33"}}, nil, "~2^96.6"},
		{[]Range{{Start: "2001:db8::", End: "2001:db8::2:ffff:ffff"}}, nil, "~2^33.6"},
	} {
		p, err := NewPool(tc.ranges, tc.subnet)
		if err != nil {
			t.Fatalf("%v: %v", tc.ranges, err)
		}
		if got := p.TotalText(); got != tc.want {
			t.Errorf("%v subnet %v: TotalText %q, want %q", tc.ranges, tc.subnet, got, tc.want)
		}
	}
}

func TestFormatCountBoundaries(t *testing.T) {
	pow := func(e uint) *big.Int { return new(big.Int).Lsh(big.NewInt(1), e) }
	minus1 := func(n *big.Int) *big.Int { return n.Sub(n, big.NewInt(1)) }
	for _, tc := range []struct {
		n    *big.Int
		want string
	}{
		{big.NewInt(0), "0"},
		{pow(32), "4294967296"},
		{new(big.Int).Add(pow(32), big.NewInt(1)), "~2^32"},
		{minus1(pow(128)), "~2^128"},
		{pow(128), "2^128"},
	} {
		if got := formatCount(tc.n); got != tc.want {
			t.Errorf("formatCount(%s) = %q, want %q", tc.n, got, tc.want)
		}
	}
}
