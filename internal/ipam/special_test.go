package ipam

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

// TestReservedAddressSpecialBlocks: a range whose ends are unicast but that
// spans special-purpose blocks never hands those out, counts them, says
// why, and SpecialOverlaps names them for the webhook.
func TestReservedAddressSpecialBlocks(t *testing.T) {
	small := mustPool(t, nil, between("126.255.255.255", "128.0.0.0"))
	// 127.0.0.0 is never handed out (issue 15 fault 2).
	if got := drain(t, NewAllocator(small), 2); !slicesEqual(got, addrs("126.255.255.255", "128.0.0.0")) {
		t.Errorf("allocated %v, want 126.255.255.255 and 128.0.0.0", got)
	}
	p := mustPool(t, nil, between("126.0.0.1", "170.0.0.0"))
	for _, tc := range []struct{ ip, want string }{
		{"127.0.0.0", "IP 127.0.0.0 is a loopback address (127.0.0.0/8, RFC 1122), which is never allocated"},
		{"169.254.0.0", "IP 169.254.0.0 is a link-local address (169.254.0.0/16, RFC 3927), which is never allocated"},
	} {
		err := p.Check(netip.MustParseAddr(tc.ip))
		if !errors.Is(err, ErrReservedAddress) || err.Error() != tc.want {
			t.Errorf("Check(%s) = %v, want %q (ErrReservedAddress)", tc.ip, err, tc.want)
		}
	}
	if got, want := p.Excluded(), (Excluded{SpecialPurpose: 1<<24 + 1<<16}); got != want {
		t.Errorf("Excluded() = %+v, want %+v", got, want)
	}
	if got, want := p.Total(), uint64(170<<24-126<<24)-(1<<24+1<<16); got != want {
		t.Errorf("Total() = %d, want %d", got, want)
	}

	errs := SpecialOverlaps(p.Ranges())
	if len(errs) != 2 || errs[0].Field != "ipRanges[0]" || !strings.Contains(errs[0].Reason, "loopback addresses (127.0.0.0/8") ||
		!strings.Contains(errs[1].Reason, "link-local addresses (169.254.0.0/16") {
		t.Errorf("SpecialOverlaps = %v, want loopback and link-local on ipRanges[0]", errs)
	}
	v6, err := ParseRanges([]Range{cidr("8000::/1"), cidr("2001:db8::/64")})
	if err != nil {
		t.Fatal(err)
	}
	errs = SpecialOverlaps(v6)
	if len(errs) != 2 || !strings.Contains(errs[0].Reason, "fe80::/10") || !strings.Contains(errs[1].Reason, "ff00::/8") {
		t.Errorf("SpecialOverlaps(8000::/1) = %v, want link-local and multicast", errs)
	}
	clean, _ := ParseRanges([]Range{cidr("192.0.2.0/24"), between("203.0.113.1", "203.0.113.9")})
	if errs := SpecialOverlaps(clean); errs != nil {
		t.Errorf("SpecialOverlaps(documentation ranges) = %v, want none", errs)
	}
}

// TestWithExclusions: excluded addresses are never allocated, counted once,
// named by Check, and the original pool is unchanged.
func TestWithExclusions(t *testing.T) {
	p := mustPool(t, &SubnetInfo{Gateway: "192.0.2.1"}, cidr("192.0.2.0/29"))
	q := p.WithExclusions([]Exclusion{
		{netip.MustParseAddr("192.0.2.2"), "is the InternalIP of Node a"},
		{netip.MustParseAddr("192.0.2.2"), "is the ExternalIP of Node b"},  // duplicate: first reason kept
		{netip.MustParseAddr("192.0.2.1"), "is the InternalIP of Node gw"}, // the gateway already
		{netip.MustParseAddr("192.0.2.200"), "outside"},
		{netip.MustParseAddr("2001:db8::1"), "other family"},
	})
	if p.Total() != 5 || q.Total() != 4 {
		t.Errorf("Total: original %d, with exclusions %d; want 5 and 4", p.Total(), q.Total())
	}
	if got, want := q.Excluded(), (Excluded{Reserved: 3, Exclusions: 1}); got != want {
		t.Errorf("Excluded() = %+v, want %+v", got, want)
	}
	err := q.Check(netip.MustParseAddr("192.0.2.2"))
	if !errors.Is(err, ErrExcludedAddress) || err.Error() != "IP 192.0.2.2 is the InternalIP of Node a, which is never allocated" {
		t.Errorf("Check(192.0.2.2) = %v", err)
	}
	if !p.Contains(netip.MustParseAddr("192.0.2.2")) {
		t.Error("the original pool lost 192.0.2.2")
	}
	if got := drain(t, NewAllocator(q), 4); !slicesEqual(got, addrs("192.0.2.3", "192.0.2.4", "192.0.2.5", "192.0.2.6")) {
		t.Errorf("allocated %v", got)
	}
}

func slicesEqual(a, b []netip.Addr) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
