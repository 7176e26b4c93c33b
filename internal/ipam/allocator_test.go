package ipam

import (
	"errors"
	"math"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
)

func TestAllocateExhaustion(t *testing.T) {
	a := NewAllocator(mustPool(t, &SubnetInfo{Gateway: "192.0.2.1"}, cidr("192.0.2.0/30")))
	if ip, err := a.Allocate(); err != nil || ip != netip.MustParseAddr("192.0.2.2") {
		t.Fatalf("Allocate() = %v, %v; want 192.0.2.2", ip, err)
	}
	for range 3 {
		if ip, err := a.Allocate(); !errors.Is(err, ErrExhausted) || ip.IsValid() {
			t.Fatalf("Allocate() on a full pool = %v, %v; want ErrExhausted", ip, err)
		}
	}
	if a.Used() != 1 || a.Free() != 0 || a.Total() != 1 {
		t.Errorf("Used/Free/Total = %d/%d/%d, want 1/0/1", a.Used(), a.Free(), a.Total())
	}
}

func TestReserve(t *testing.T) {
	p := mustPool(t, &SubnetInfo{Gateway: "192.0.2.1"}, cidr("192.0.2.0/28"))
	tests := []struct {
		name string
		ip   netip.Addr
		want error
	}{
		{"inside", netip.MustParseAddr("192.0.2.7"), nil},
		{"outside the pool", netip.MustParseAddr("192.0.2.16"), ErrOutsidePool},
		{"far outside the pool", netip.MustParseAddr("198.51.100.7"), ErrOutsidePool},
		{"other family", netip.MustParseAddr("2001:db8::7"), ErrOutsidePool},
		{"gateway", netip.MustParseAddr("192.0.2.1"), ErrReservedAddress},
		{"network", netip.MustParseAddr("192.0.2.0"), ErrReservedAddress},
		{"broadcast", netip.MustParseAddr("192.0.2.15"), ErrReservedAddress},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := NewAllocator(p)
			err := a.Reserve(tt.ip)
			if !errors.Is(err, tt.want) || (err == nil) != (tt.want == nil) {
				t.Fatalf("Reserve(%s) = %v, want %v", tt.ip, err, tt.want)
			}
			if err != nil && !strings.Contains(err.Error(), tt.ip.String()) {
				t.Errorf("error %q does not name the IP", err)
			}
			wantUsed := uint64(0)
			if tt.want == nil {
				wantUsed = 1
			}
			if a.Used() != wantUsed || a.IsAllocated(tt.ip) != (wantUsed == 1) {
				t.Errorf("after Reserve: Used() = %d, IsAllocated = %v", a.Used(), a.IsAllocated(tt.ip))
			}
		})
	}
}

func TestSharedIPCountedOnce(t *testing.T) {
	a := NewAllocator(mustPool(t, nil, cidr("192.0.2.0/29")))
	ip := netip.MustParseAddr("192.0.2.3")
	// Three Egresses name the same IP: one allocation.
	for i := range 3 {
		if err := a.Reserve(ip); err != nil {
			t.Fatalf("Reserve #%d: %v", i, err)
		}
	}
	if a.Used() != 1 {
		t.Errorf("Used() = %d, want 1", a.Used())
	}
	if err := a.ReserveAll(addrs("192.0.2.3", "192.0.2.3")); err != nil || a.Used() != 1 {
		t.Errorf("ReserveAll of the shared IP: err %v, Used() = %d, want 1", err, a.Used())
	}
	// Allocate never hands the shared IP to a fourth Egress.
	got := drain(t, a, 6)
	if slices.Contains(got, ip) || len(got) != 5 {
		t.Errorf("allocated %v; want the other 5 addresses", got)
	}
}

func TestReleaseThenAllocateLowest(t *testing.T) {
	tests := []struct {
		name     string
		pool     *Pool
		release  []string
		reserve  []string // reserved before draining
		wantNext []string // allocations after the releases, lowest first
	}{
		{
			name:     "ipv4 released addresses come back lowest first",
			pool:     mustPool(t, nil, cidr("192.0.2.0/28")),
			release:  []string{"192.0.2.9", "192.0.2.3", "192.0.2.14"},
			wantNext: []string{"192.0.2.3", "192.0.2.9", "192.0.2.14"},
		},
		{
			name:     "release splits a run",
			pool:     mustPool(t, nil, between("192.0.2.1", "192.0.2.5")),
			release:  []string{"192.0.2.3"},
			wantNext: []string{"192.0.2.3"},
		},
		{
			name:     "release at the ends of runs",
			pool:     mustPool(t, nil, between("192.0.2.1", "192.0.2.5")),
			release:  []string{"192.0.2.1", "192.0.2.5", "192.0.2.4"},
			wantNext: []string{"192.0.2.1", "192.0.2.4", "192.0.2.5"},
		},
		{
			name:     "ipv6 across the 64-bit boundary",
			pool:     mustPool(t, nil, between("2001:db8::ffff:ffff:ffff:fffe", "2001:db8:0:1::1")),
			release:  []string{"2001:db8:0:1::", "2001:db8::ffff:ffff:ffff:ffff"},
			wantNext: []string{"2001:db8::ffff:ffff:ffff:ffff", "2001:db8:0:1::"},
		},
		{
			name:     "across ranges and the gateway",
			pool:     mustPool(t, &SubnetInfo{Gateway: "192.0.2.3"}, between("192.0.2.2", "192.0.2.4"), cidr("192.0.2.8/31")),
			release:  []string{"192.0.2.9", "192.0.2.2"},
			wantNext: []string{"192.0.2.2", "192.0.2.9"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := NewAllocator(tt.pool)
			all := drain(t, a, 100)
			if uint64(len(all)) != a.Total() || a.Used() != a.Total() {
				t.Fatalf("drained %d, Used %d, Total %d", len(all), a.Used(), a.Total())
			}
			for _, s := range tt.release {
				if !a.Release(netip.MustParseAddr(s)) {
					t.Fatalf("Release(%s) = false", s)
				}
			}
			if a.Used() != a.Total()-uint64(len(tt.release)) {
				t.Errorf("Used() = %d after %d releases from %d", a.Used(), len(tt.release), a.Total())
			}
			got := drain(t, a, len(tt.wantNext))
			if !slices.Equal(got, addrs(tt.wantNext...)) {
				t.Errorf("re-allocated %v, want %v", got, tt.wantNext)
			}
		})
	}
}

func TestReleaseNeverGoesNegative(t *testing.T) {
	a := NewAllocator(mustPool(t, nil, cidr("192.0.2.0/29")))
	ip, _ := a.Allocate()
	if !a.Release(ip) {
		t.Fatalf("Release(%s) = false", ip)
	}
	for _, s := range []string{ip.String(), "192.0.2.2", "192.0.2.0", "10.0.0.1", "2001:db8::1"} {
		if a.Release(netip.MustParseAddr(s)) {
			t.Errorf("Release(%s) of a free or foreign IP = true", s)
		}
	}
	if a.Release(netip.Addr{}) {
		t.Error("Release(zero Addr) = true")
	}
	if a.Used() != 0 || a.Free() != a.Total() {
		t.Errorf("Used() = %d, Free() = %d, Total() = %d", a.Used(), a.Free(), a.Total())
	}
}

// TestRebuildFromStatuses models a controller restart: the IPs in the
// Egress statuses (with duplicates for shared IPs, in any order) rebuild an
// Allocator that reports the same Used and makes the same next choices.
func TestRebuildFromStatuses(t *testing.T) {
	pools := map[string]*Pool{
		"ipv4": mustPool(t, &SubnetInfo{Gateway: "192.0.2.1", PrefixLength: 24}, cidr("192.0.2.0/26"), between("192.0.2.200", "192.0.2.255")),
		"ipv6": mustPool(t, nil, cidr("2001:db8::/64")),
	}
	for name, p := range pools {
		t.Run(name, func(t *testing.T) {
			orig := NewAllocator(p)
			var statuses []netip.Addr
			for range 40 {
				ip, err := orig.Allocate()
				if err != nil {
					t.Fatal(err)
				}
				statuses = append(statuses, ip)
			}
			// Some Egresses were deleted, some share an IP.
			for _, i := range []int{3, 4, 17, 30} {
				orig.Release(statuses[i])
			}
			statuses = slices.Delete(statuses, 30, 31)
			statuses = slices.Delete(statuses, 17, 18)
			statuses = slices.Delete(statuses, 3, 5)
			statuses = append(statuses, statuses[0], statuses[10], statuses[10])
			slices.Reverse(statuses)

			for _, rebuild := range []struct {
				name string
				fn   func(*Allocator) error
			}{
				{"ReserveAll", func(a *Allocator) error { return a.ReserveAll(statuses) }},
				{"Reserve one by one", func(a *Allocator) error {
					for _, ip := range statuses {
						if err := a.Reserve(ip); err != nil {
							return err
						}
					}
					return nil
				}},
			} {
				got := NewAllocator(p)
				if err := rebuild.fn(got); err != nil {
					t.Fatalf("%s: %v", rebuild.name, err)
				}
				if got.Used() != orig.Used() || got.Used() != 36 {
					t.Errorf("%s: Used() = %d, original %d, want 36", rebuild.name, got.Used(), orig.Used())
				}
				// The same next six choices; then undo them on the original
				// for the next rebuild.
				var next []netip.Addr
				for i := range 6 {
					want, err1 := orig.Allocate()
					have, err2 := got.Allocate()
					if want != have || err1 != nil || err2 != nil {
						t.Errorf("%s: allocation %d: rebuilt %v (%v), original %v (%v)", rebuild.name, i, have, err2, want, err1)
					}
					next = append(next, want)
				}
				for _, ip := range next {
					orig.Release(ip)
				}
			}
		})
	}
}

func TestReserveAllReportsRejected(t *testing.T) {
	a := NewAllocator(mustPool(t, &SubnetInfo{Gateway: "192.0.2.1"}, cidr("192.0.2.0/28")))
	if err := a.Reserve(netip.MustParseAddr("192.0.2.5")); err != nil {
		t.Fatal(err)
	}
	err := a.ReserveAll(addrs("192.0.2.4", "192.0.2.1", "192.0.2.5", "192.0.2.6", "198.51.100.1", "192.0.2.14", "192.0.2.3"))
	if !errors.Is(err, ErrReservedAddress) || !errors.Is(err, ErrOutsidePool) {
		t.Errorf("ReserveAll error %v should wrap both ErrReservedAddress and ErrOutsidePool", err)
	}
	var ae *AddrError
	if !errors.As(err, &ae) || ae.Addr != netip.MustParseAddr("192.0.2.1") {
		t.Errorf("first AddrError = %v, want the gateway", ae)
	}
	if a.Used() != 5 {
		t.Errorf("Used() = %d, want 5 (3,4,5,6,14)", a.Used())
	}
	// The runs were merged: 3..6 then 14; next is 2, then 7.
	if got := drain(t, a, 20); !slices.Equal(got[:2], addrs("192.0.2.2", "192.0.2.7")) || len(got) != 13-5 {
		t.Errorf("after ReserveAll allocated %v", got)
	}
}

func TestReserveAllMergesWithExistingRuns(t *testing.T) {
	a := NewAllocator(mustPool(t, nil, between("10.0.0.0", "10.0.0.99")))
	for _, s := range []string{"10.0.0.10", "10.0.0.11", "10.0.0.20", "10.0.0.30", "10.0.0.31", "10.0.0.32"} {
		if err := a.Reserve(netip.MustParseAddr(s)); err != nil {
			t.Fatal(err)
		}
	}
	// Points inside, before, after, bridging and duplicating existing runs.
	err := a.ReserveAll(addrs("10.0.0.31", "10.0.0.12", "10.0.0.9", "10.0.0.19", "10.0.0.21", "10.0.0.0", "10.0.0.99", "10.0.0.33", "10.0.0.11"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"10.0.0.0", "10.0.0.9", "10.0.0.10", "10.0.0.11", "10.0.0.12", "10.0.0.19", "10.0.0.20",
		"10.0.0.21", "10.0.0.30", "10.0.0.31", "10.0.0.32", "10.0.0.33", "10.0.0.99"}
	if a.Used() != uint64(len(want)) {
		t.Errorf("Used() = %d, want %d", a.Used(), len(want))
	}
	for _, s := range want {
		if !a.IsAllocated(netip.MustParseAddr(s)) {
			t.Errorf("%s not allocated", s)
		}
	}
	if got := drain(t, a, 100); uint64(len(got)) != 100-uint64(len(want)) || got[0] != netip.MustParseAddr("10.0.0.1") {
		t.Errorf("drained %d addresses starting %v", len(got), got[:1])
	}
}

func TestHugeIPv6Pool(t *testing.T) {
	a := NewAllocator(mustPool(t, nil, cidr("2001:db8::/32")))
	if a.Total() != math.MaxUint64 || a.Free() != math.MaxUint64 {
		t.Fatalf("Total() = %d, Free() = %d; want saturated", a.Total(), a.Free())
	}
	last := netip.MustParseAddr("2001:db8:ffff:ffff:ffff:ffff:ffff:ffff")
	if err := a.Reserve(last); err != nil {
		t.Fatal(err)
	}
	for _, want := range addrs("2001:db8::1", "2001:db8::2", "2001:db8::3") {
		if got, err := a.Allocate(); got != want || err != nil {
			t.Errorf("Allocate() = %v, %v; want %v", got, err, want)
		}
	}
	if a.Used() != 4 || a.Free() != math.MaxUint64-4 {
		t.Errorf("Used() = %d, Free() = %d", a.Used(), a.Free())
	}
}

func TestAllocatorConcurrent(t *testing.T) {
	a := NewAllocator(mustPool(t, nil, cidr("10.0.0.0/22")))
	const workers, each = 8, 100
	results := make([][]netip.Addr, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for range each {
				ip, err := a.Allocate()
				if err != nil {
					t.Error(err)
					return
				}
				results[w] = append(results[w], ip)
				if !a.IsAllocated(ip) || a.Used() == 0 || a.Free() == a.Total() {
					t.Errorf("%s allocated but not counted", ip)
				}
			}
		})
	}
	wg.Wait()
	seen := map[netip.Addr]bool{}
	for _, r := range results {
		for _, ip := range r {
			if seen[ip] {
				t.Errorf("%s handed out twice", ip)
			}
			seen[ip] = true
		}
	}
	if a.Used() != workers*each {
		t.Errorf("Used() = %d, want %d", a.Used(), workers*each)
	}
	// Lowest-first: exactly the first 800 addresses are in use.
	if got, _ := a.Allocate(); got != netip.MustParseAddr("10.0.3.33") {
		t.Errorf("next = %v, want 10.0.3.33", got)
	}
	// Concurrent releases of everything leave only that last one.
	for w := range workers {
		wg.Go(func() {
			for _, ip := range results[w] {
				if !a.Release(ip) {
					t.Errorf("Release(%s) = false", ip)
				}
			}
		})
	}
	wg.Wait()
	if a.Used() != 1 {
		t.Errorf("Used() = %d after releasing all but one, want 1", a.Used())
	}
}
