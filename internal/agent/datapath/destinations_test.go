package datapath

import (
	"context"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/nftables"

	"github.com/egressip/egressip/internal/destinations"
)

func dspan(first, last, eg string) destinations.Span {
	return destinations.Span{First: ap(first), Last: ap(last), Egress: eg}
}

// destState: local Pod 10.244.1.2 (and fd00:10:244:1::2) is selected by
// "a" (destinations 198.51.100.0/24, sourced here), "b" (every destination
// but 203.0.113.0/25, sourced here) and, for IPv6, "f" (failurePolicy
// Fail, no Node, destinations 2001:db8:f::/48); remote member 10.244.2.2
// is in the slices of "h1" and "h2", both held here.
func destState() State {
	p4, p6, r4 := ap("10.244.1.2"), ap("fd00:10:244:1::2"), ap("10.244.2.2")
	return State{
		NodeIPs:      []netip.Addr{ap("192.0.2.11"), ap("192.0.2.12"), ap("2001:db8::11")},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/56")},
		Egresses: []Egress{
			{Name: "a", IP: ap("192.0.2.100"), Role: RoleSource, Local: []netip.Addr{p4}},
			{Name: "a6", IP: ap("2001:db8::100"), Role: RoleSource, Local: []netip.Addr{p6}},
			{Name: "b", IP: ap("192.0.2.101"), Role: RoleSource, Local: []netip.Addr{p4, ap("10.244.1.9")}},
			{Name: "f", Role: RoleFailed, FailurePolicy: FailurePolicyFail, Local: []netip.Addr{p6}},
			{Name: "h1", IP: ap("192.0.2.110"), Role: RoleEgress, Remote: []Member{{IP: r4, HostIP: ap("192.0.2.12")}}},
			{Name: "h2", IP: ap("192.0.2.111"), Role: RoleEgress, Remote: []Member{{IP: r4, HostIP: ap("192.0.2.12")}}},
		},
		Splits: []Split{
			{IPs: []netip.Addr{p4}, Spans: []destinations.Span{
				dspan("0.0.0.0", "198.51.99.255", "b"),
				dspan("198.51.100.0", "198.51.100.255", "a"),
				dspan("198.51.101.0", "203.0.112.255", "b"),
				dspan("203.0.113.128", "255.255.255.255", "b"),
			}},
			{IPs: []netip.Addr{p6}, Spans: []destinations.Span{
				dspan("::", "2001:db8:e:ffff:ffff:ffff:ffff:ffff", "a6"),
				dspan("2001:db8:f::", "2001:db8:f:ffff:ffff:ffff:ffff:ffff", "f"),
				dspan("2001:db8:10::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "a6"),
			}},
			{IPs: []netip.Addr{r4}, Remote: true, Spans: []destinations.Span{
				dspan("0.0.0.0", "198.51.99.255", "h1"),
				dspan("198.51.100.0", "198.51.100.255", "h2"),
				dspan("198.51.101.0", "255.255.255.255", "h1"),
			}},
		},
	}
}

func setOf(p Plan, name string) *SetContent {
	for i := range p.NFT.Sets {
		if p.NFT.Sets[i].Set.Name == name {
			return &p.NFT.Sets[i]
		}
	}
	return nil
}

// lookupInterval finds the value of destination a in interval-map
// elements as the kernel's interval lookup does: the greatest element at
// or below a, a match when it is not an interval end.
func lookupInterval(els []nftables.SetElement, f famSpec, a netip.Addr) ([]byte, bool) {
	key := f.addr(a)
	var best *nftables.SetElement
	for i := range els {
		e := &els[i]
		if c := slices.Compare(e.Key, key); c <= 0 && (best == nil || slices.Compare(e.Key, best.Key) > 0 || (slices.Equal(e.Key, best.Key) && !e.IntervalEnd)) {
			best = e
		}
	}
	if best == nil || best.IntervalEnd {
		return nil, false
	}
	return best.Val, true
}

// TestDestinationsBuild: split members leave the plain maps, jump to their
// Split's chain through the localsplit/remotesplit verdict maps, and each
// chain's interval map gives every destination the mark of its Egress (a
// remote Split's with FromTunnel; none for a gap); Plan.Splits lists every
// mark such a member can get; Build does not depend on the order of the
// Splits.
func TestDestinationsBuild(t *testing.T) {
	cfg := Config{UplinkMTU: 1500}
	p, err := Build(cfg, destState(), nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg, _ = cfg.withDefaults()
	mark := func(n string) []byte { return native(cfg.Mark(p.IDs[n])) }
	for ip := range p.Members {
		if ip == ap("10.244.1.2") || ip == ap("fd00:10:244:1::2") || ip == ap("10.244.2.2") {
			t.Errorf("split member %s is in a plain member map", ip)
		}
	}
	if p.Members[ap("10.244.1.9")] != cfg.Mark(p.IDs["b"]) {
		t.Errorf("b's plain member 10.244.1.9: mark %#x, want b's", p.Members[ap("10.244.1.9")])
	}
	for _, tc := range []struct {
		set  string
		f    famSpec
		dst  string
		want []byte // nil: no element (no Egress)
	}{
		{"dst4-0", families[0], "198.51.100.10", mark("a")},
		{"dst4-0", families[0], "203.0.113.200", mark("b")},
		{"dst4-0", families[0], "203.0.113.10", nil},
		{"dst4-0", families[0], "8.8.8.8", mark("b")},
		{"dst4-0", families[0], "255.255.255.255", mark("b")},
		{"dst6-0", families[1], "2001:db8:f::1", mark("f")},
		{"dst6-0", families[1], "2001:db8:1::1", mark("a6")},
		{"dstr4-0", families[0], "198.51.100.10", native(cfg.Mark(p.IDs["h2"]) | cfg.FromTunnel)},
		{"dstr4-0", families[0], "192.0.2.55", native(cfg.Mark(p.IDs["h1"]) | cfg.FromTunnel)},
	} {
		s := setOf(p, tc.set)
		if s == nil || !s.Set.Interval || !s.Set.IsMap {
			t.Fatalf("no interval map %s: %+v", tc.set, s)
		}
		got, ok := lookupInterval(s.Elements, tc.f, ap(tc.dst))
		if (tc.want == nil) != !ok || !slices.Equal(got, tc.want) {
			t.Errorf("%s: %s -> %x (found %v), want %x", tc.set, tc.dst, got, ok, tc.want)
		}
	}
	if s := setOf(p, mapLocalSplit+"4"); s == nil || len(s.Elements) != 1 || s.Elements[0].VerdictData == nil || s.Elements[0].VerdictData.Chain != chainDst+"4-0" {
		t.Errorf("localsplit4: %+v, want 10.244.1.2 -> jump dst4-0", s)
	}
	if s := setOf(p, mapRemoteSplit+"4"); s == nil || len(s.Elements) != 1 || s.Elements[0].VerdictData.Chain != chainDst+"r4-0" {
		t.Errorf("remotesplit4: %+v, want 10.244.2.2 -> jump dstr4-0", s)
	}
	wantSplits := map[netip.Addr][]uint32{
		ap("10.244.1.2"):       {cfg.Mark(p.IDs["a"]), cfg.Mark(p.IDs["b"])},
		ap("fd00:10:244:1::2"): {cfg.Mark(p.IDs["a6"]), cfg.Mark(p.IDs["f"])},
		ap("10.244.2.2"):       {cfg.Mark(p.IDs["h1"]) | cfg.FromTunnel, cfg.Mark(p.IDs["h2"]) | cfg.FromTunnel},
	}
	for _, ms := range wantSplits {
		slices.Sort(ms)
	}
	if diff := cmp.Diff(wantSplits, p.Splits, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("Plan.Splits (-want +got):\n%s", diff)
	}
	// f is rejected here: its ID is in failed, so only its destinations
	// (its span) are rejected; a6 carries the rest.
	if s := setOf(p, setFailed); s == nil || len(s.Elements) != 1 || !slices.Equal(s.Elements[0].Key, mark("f")) {
		t.Errorf("failed set %+v, want f's mark only", s)
	}
	st := destState()
	slices.Reverse(st.Splits)
	slices.Reverse(st.Egresses)
	p2, err := Build(Config{UplinkMTU: 1500}, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(p.NFT, p2.NFT) {
		t.Errorf("reversed input changes the ruleset")
	}
}

// TestDestinationsKernel applies the Splits to a real kernel: the table is
// accepted (adjacent spans of different Egresses included), and a
// restarted Datapath reads every split member's marks back.
func TestDestinationsKernel(t *testing.T) {
	ns := kernelNS(t)
	ctx := context.Background()
	cfg, d := newKernelDatapath(t, ns)
	if err := d.Apply(ctx, destState()); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	dump, err := d.Dump(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"dst4-0", "dstr4-0", "dst6-0", "localsplit4", "remotesplit4"} {
		if !strings.Contains(dump, want) {
			t.Errorf("table lacks %s:\n%s", want, dump)
		}
	}
	want := d.applied.Splits
	_ = d.Close()
	d2, err := New(cfg, ns.Handle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d2.Close() })
	if diff := cmp.Diff(want, d2.splits, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); diff != "" {
		t.Errorf("split marks read back (-applied +read):\n%s", diff)
	}
	if err := d2.Apply(ctx, destState()); err != nil {
		t.Fatalf("Apply after restart: %v", err)
	}
	if dump2, _ := d2.Dump(ctx); dump2 != dump {
		t.Errorf("ruleset after restart differs:\n--- before\n%s\n--- after\n%s", dump, dump2)
	}
}

// destBigState is bigState with 10 destination CIDRs per Egress (ten
// /24s of 198.18.0.0/15 apart from the egress IPs' range): every member's
// destinations are divided (its Egress carries those ten, the rest leaves
// with the Node IP), one Split per Egress, as the agent builds them.
func destBigState(n, pods int) State {
	st := bigState(n, pods)
	for i, e := range st.Egresses {
		if len(e.Local) == 0 {
			continue
		}
		var dst []netip.Prefix
		for j := range 10 {
			dst = append(dst, netip.PrefixFrom(netip.AddrFrom4([4]byte{100, byte(64 + i%64), byte(i/64*10 + j), 0}), 24))
		}
		spans := destinations.Resolve(false, []destinations.Claim{{Egress: e.Name, Destinations: dst, Some: true}})
		st.Splits = append(st.Splits, Split{IPs: e.Local, Spans: spans})
	}
	return st
}

// BenchmarkBuildDestinations: BenchmarkBuild's 1,000 Egresses and 10,000
// Pods, each Egress with 10 destination CIDRs (issue 21: at most twice
// BenchmarkBuild's time on main).
func BenchmarkBuildDestinations(b *testing.B) {
	cfg := Config{UplinkMTU: 1500}
	st := destBigState(1000, 10000)
	prev, err := Build(cfg, st, nil)
	if err != nil {
		b.Fatal(err)
	}
	if len(prev.Splits) == 0 {
		b.Fatal("no split members")
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := Build(cfg, st, prev.IDs); err != nil {
			b.Fatal(err)
		}
	}
}
