package warm

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

func warmOn(node string, addrs ...string) []IP {
	out := make([]IP, len(addrs))
	for i, a := range addrs {
		out[i] = IP{Addr: ip(a), Node: node}
	}
	return out
}

func nodes(room int, names ...string) []Node {
	out := make([]Node, len(names))
	for i, n := range names {
		out[i] = Node{Name: n, InterfaceID: "eni-" + n, Room: room}
	}
	return out
}

func TestCompute(t *testing.T) {
	cases := []struct {
		name string
		in   Input
		want Plan
	}{
		{
			name: "empty pool, warm 5: one AssignCount per ENI, spread",
			in:   Input{Now: t0, WarmTarget: 5, Nodes: nodes(10, "a", "b")},
			want: Plan{Short: 5, Attach: []Op{{Node: "a", InterfaceID: "eni-a", Count: 3}, {Node: "b", InterfaceID: "eni-b", Count: 2}}},
		},
		{
			name: "warm 0 attaches on demand for pending Egresses",
			in:   Input{Now: t0, Pending: 2, Nodes: nodes(10, "a")},
			want: Plan{Short: 2, Attach: []Op{{Node: "a", InterfaceID: "eni-a", Count: 2}}},
		},
		{
			name: "calls in flight count: no second request for the same addresses",
			in:   Input{Now: t0, WarmTarget: 10, Attaching: 6, Nodes: nodes(10, "a")},
			want: Plan{Short: 4, Attach: []Op{{Node: "a", InterfaceID: "eni-a", Count: 4}}},
		},
		{
			name: "calls in flight cover the whole shortfall",
			in:   Input{Now: t0, WarmTarget: 3, MinimumTarget: 5, Attaching: 5, Nodes: nodes(10, "a")},
			want: Plan{},
		},
		{
			name: "minimum above warm",
			in:   Input{Now: t0, WarmTarget: 1, MinimumTarget: 4, Allocated: 1, Nodes: nodes(10, "a")},
			want: Plan{Total: 1, Short: 3, Attach: []Op{{Node: "a", InterfaceID: "eni-a", Count: 3}}},
		},
		{
			name: "least-loaded Nodes first, room respected",
			in: Input{Now: t0, WarmTarget: 6, Nodes: []Node{
				{Name: "a", InterfaceID: "eni-a", Room: 10, Load: 4},
				{Name: "b", InterfaceID: "eni-b", Room: 2, Load: 0},
				{Name: "c", InterfaceID: "eni-c", Room: 10, Load: 1},
			}},
			want: Plan{Short: 6, Attach: []Op{{Node: "a", InterfaceID: "eni-a", Count: 1}, {Node: "b", InterfaceID: "eni-b", Count: 2}, {Node: "c", InterfaceID: "eni-c", Count: 3}}},
		},
		{
			name: "no room anywhere: short stays, nothing to call",
			in:   Input{Now: t0, WarmTarget: 2, Nodes: nodes(0, "a")},
			want: Plan{Short: 2},
		},
		{
			name: "cooldown addresses are not available: attach more, detach none",
			in: Input{Now: t0, WarmTarget: 2, Nodes: nodes(10, "a"), Warm: []IP{
				{Addr: ip("10.0.0.5"), Node: "a", CoolUntil: t0.Add(10 * time.Second)},
				{Addr: ip("10.0.0.6"), Node: "a", CoolUntil: t0.Add(20 * time.Second)},
			}},
			want: Plan{Total: 2, Short: 2, Attach: []Op{{Node: "a", InterfaceID: "eni-a", Count: 2}}, Recheck: 10 * time.Second},
		},
		{
			name: "warm addresses on an ineligible Node are not available",
			in:   Input{Now: t0, WarmTarget: 1, Nodes: nodes(10, "a"), Warm: warmOn("gone", "10.0.0.9")},
			want: Plan{Total: 1, Short: 1, Attach: []Op{{Node: "a", InterfaceID: "eni-a", Count: 1}}},
		},
		{
			name: "at target: nothing",
			in:   Input{Now: t0, WarmTarget: 2, Nodes: nodes(10, "a"), Warm: warmOn("a", "10.0.0.5", "10.0.0.6")},
			want: Plan{Available: 2, Total: 2},
		},
		{
			name: "over target: one Unassign per ENI, highest addresses from the fullest Node",
			in: Input{Now: t0, WarmTarget: 1, Nodes: nodes(10, "a", "b"),
				Warm: append(warmOn("a", "10.0.0.1", "10.0.0.2", "10.0.0.3"), warmOn("b", "10.0.0.4", "10.0.0.5")...)},
			want: Plan{Available: 5, Total: 5, Over: 4, Detach: []Op{
				{Node: "a", InterfaceID: "eni-a", IPs: []netip.Addr{ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3")}},
				{Node: "b", InterfaceID: "eni-b", IPs: []netip.Addr{ip("10.0.0.5")}},
			}},
		},
		{
			name: "over target but the minimum holds",
			in:   Input{Now: t0, WarmTarget: 0, MinimumTarget: 3, Allocated: 1, Nodes: nodes(10, "a"), Warm: warmOn("a", "10.0.0.1", "10.0.0.2", "10.0.0.3")},
			want: Plan{Available: 3, Total: 4, Over: 1, Detach: []Op{{Node: "a", InterfaceID: "eni-a", IPs: []netip.Addr{ip("10.0.0.3")}}}},
		},
		{
			name: "scale-down spacing: wait for the 30 s",
			in: Input{Now: t0, WarmTarget: 0, Nodes: nodes(10, "a"), Warm: warmOn("a", "10.0.0.1"),
				LastScaleDown: t0.Add(-10 * time.Second)},
			want: Plan{Available: 1, Total: 1, Over: 1, Recheck: 20 * time.Second},
		},
		{
			name: "scale-down spacing elapsed",
			in: Input{Now: t0, WarmTarget: 0, Nodes: nodes(10, "a"), Warm: warmOn("a", "10.0.0.1"),
				LastScaleDown: t0.Add(-30 * time.Second)},
			want: Plan{Available: 1, Total: 1, Over: 1, Detach: []Op{{Node: "a", InterfaceID: "eni-a", IPs: []netip.Addr{ip("10.0.0.1")}}}},
		},
		{
			name: "backoff: no attach until it ends",
			in:   Input{Now: t0, WarmTarget: 3, Nodes: nodes(10, "a"), BackoffUntil: t0.Add(4 * time.Second)},
			want: Plan{Short: 3, Recheck: 4 * time.Second},
		},
		{
			name: "ranged pool names the lowest free addresses, limited by them",
			in: Input{Now: t0, WarmTarget: 4, Nodes: nodes(10, "a", "b"), Ranged: true,
				Free: []netip.Addr{ip("10.0.1.4"), ip("10.0.1.5"), ip("10.0.1.6")}},
			want: Plan{Short: 4, Attach: []Op{
				{Node: "a", InterfaceID: "eni-a", IPs: []netip.Addr{ip("10.0.1.4"), ip("10.0.1.5")}},
				{Node: "b", InterfaceID: "eni-b", IPs: []netip.Addr{ip("10.0.1.6")}},
			}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := Compute(tc.in)
			if d := cmp.Diff(tc.want, got, cmp.Comparer(func(a, b netip.Addr) bool { return a == b })); d != "" {
				t.Fatalf("plan (-want +got):\n%s", d)
			}
		})
	}
}

// TestOneCallPerInterface checks the batching promise on a full instance: 8
// interfaces x 30 addresses is 8 attach calls, whatever the shortfall.
func TestOneCallPerInterface(t *testing.T) {
	in := Input{Now: t0, MinimumTarget: 240, Nodes: nodes(30, "n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8")}
	p := Compute(in)
	if len(p.Attach) != 8 {
		t.Fatalf("want 8 calls, got %d: %+v", len(p.Attach), p.Attach)
	}
	sum := 0
	for _, op := range p.Attach {
		if op.Count != 30 {
			t.Fatalf("want 30 per interface, got %+v", op)
		}
		sum += op.Count
	}
	if sum != 240 {
		t.Fatalf("want 240 addresses, got %d", sum)
	}
}
