package datapath

import (
	"context"
	"maps"
	"net/netip"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"

	"github.com/egressip/egressip/internal/testutil/netnstest"
)

func ap(s string) netip.Addr { return netip.MustParseAddr(s) }

// sampleState has one Egress of each role and both families.
func sampleState() State {
	return State{
		NodeIPs:      []netip.Addr{ap("192.0.2.11"), ap("192.0.2.12"), ap("2001:db8::11"), ap("2001:db8::12")},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd00:10:244::/56")},
		Egresses: []Egress{
			{Name: "src", IP: ap("192.0.2.100"), Role: RoleSource, Local: []netip.Addr{ap("10.244.1.2")}},
			{Name: "egr", IP: ap("192.0.2.101"), Role: RoleEgress, Local: []netip.Addr{ap("10.244.1.3")},
				Remote: []Member{{IP: ap("10.244.2.2"), HostIP: ap("192.0.2.12")}}},
			{Name: "egr6", IP: ap("2001:db8::101"), Role: RoleEgress, Local: []netip.Addr{ap("fd00:10:244:1::3")},
				Remote: []Member{{IP: ap("fd00:10:244:2::2"), HostIP: ap("2001:db8::12")}}},
			{Name: "src6", IP: ap("2001:db8::100"), Role: RoleSource, Local: []netip.Addr{ap("fd00:10:244:1::2")}},
			{Name: "fail", Role: RoleFailed, FailurePolicy: FailurePolicyFail, Local: []netip.Addr{ap("10.244.1.4")}},
			{Name: "ign", Role: RoleFailed, FailurePolicy: FailurePolicyIgnore, Local: []netip.Addr{ap("10.244.1.5")}},
		},
	}
}

// kernelNS is a namespace with an uplink veth (MTU 1500).
// newKernelDatapath opens a Datapath on ns's uplink node0, closed when the
// test ends, and returns it with its Config.
func newKernelDatapath(t *testing.T, ns *netnstest.NS) (Config, *Datapath) {
	t.Helper()
	cfg := Config{Uplink: "node0"}
	d, err := New(cfg, ns.Handle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	return cfg, d
}

func kernelNS(t *testing.T) *netnstest.NS {
	p := netnstest.NewPair(t)
	p.Node.MustIP(t, "addr", "add", "192.0.2.11/24", "dev", p.NodeIf)
	return p.Node
}

func routingText(t *testing.T, ns *netnstest.NS) string {
	t.Helper()
	var b strings.Builder
	for _, args := range [][]string{{"-4", "rule"}, {"-6", "rule"}, {"-4", "route", "show", "table", "all"}, {"-6", "route", "show", "table", "all"}} {
		out := ns.MustIP(t, args...)
		for l := range strings.SplitSeq(out, "\n") {
			if strings.Contains(l, "egx") || strings.Contains(l, "110") {
				b.WriteString(l + "\n")
			}
		}
	}
	return b.String()
}

func TestApplyIdempotentRestartTeardown(t *testing.T) {
	netnstest.RequireRoot(t)
	ns := kernelNS(t)
	ctx := context.Background()
	cfg := Config{Uplink: "node0"}

	// A foreign table that must survive everything.
	foreign, err := nftables.New(nftables.WithNetNSFd(int(ns.Handle)))
	if err != nil {
		t.Fatal(err)
	}
	ft := foreign.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: "cni"})
	fc := foreign.AddChain(&nftables.Chain{Name: "post", Table: ft, Type: nftables.ChainTypeNAT, Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	foreign.AddRule(&nftables.Rule{Table: ft, Chain: fc, Exprs: []expr.Any{&expr.Masq{}}})
	if err := foreign.Flush(); err != nil {
		t.Fatal(err)
	}

	d, err := New(cfg, ns.Handle)
	if err != nil {
		t.Fatal(err)
	}
	st := sampleState()
	if err := d.Apply(ctx, st); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	dump1, err := d.Dump(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rt1 := routingText(t, ns)
	t.Logf("ruleset:\n%s\nrouting:\n%s", dump1, rt1)
	if err := d.Apply(ctx, st); err != nil {
		t.Fatalf("second Apply: %v", err)
	}
	ids1 := d.IDs()
	_ = d.Close()

	// A new process on the same namespace: same IDs, same ruleset.
	d2, err := New(cfg, ns.Handle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d2.Close() })
	if got := d2.IDs(); len(got) != len(ids1) {
		t.Fatalf("read-back IDs %v, want %v", got, ids1)
	}
	for k, v := range ids1 {
		if d2.IDs()[k] != v {
			t.Fatalf("read-back ID of %s = %d, want %d", k, d2.IDs()[k], v)
		}
	}
	// The member classification is read back too: a member that leaves
	// while the agent is down still gets its entries cleaned.
	if want := d.applied.Members; len(want) != 7 || !maps.Equal(d2.members, want) {
		t.Fatalf("read-back members %v, want %v (7 entries)", d2.members, want)
	}
	// Shuffle the Egress order: the result must not depend on it.
	st2 := sampleState()
	for i, j := 0, len(st2.Egresses)-1; i < j; i, j = i+1, j-1 {
		st2.Egresses[i], st2.Egresses[j] = st2.Egresses[j], st2.Egresses[i]
	}
	if err := d2.Apply(ctx, st2); err != nil {
		t.Fatalf("Apply after restart: %v", err)
	}
	dump2, _ := d2.Dump(ctx)
	if dump1 != dump2 {
		t.Errorf("ruleset after restart differs:\n--- before\n%s\n--- after\n%s", dump1, dump2)
	}
	if rt2 := routingText(t, ns); rt1 != rt2 {
		t.Errorf("routing after restart differs:\n--- before\n%s\n--- after\n%s", rt1, rt2)
	}
	if _, err := foreign.ListTableOfFamily("cni", nftables.TableFamilyIPv4); err != nil {
		t.Errorf("foreign table gone: %v", err)
	}
	// A restarted process that is given less removes what it no longer
	// needs (it learns the routes from the kernel, not from memory).
	_ = d2.Close()
	d3, err := New(cfg, ns.Handle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d3.Close() })
	if err := d3.Apply(ctx, State{NodeIPs: st.NodeIPs}); err != nil {
		t.Fatal(err)
	}
	rt3 := routingText(t, ns)
	if strings.Contains(rt3, "encap") || strings.Contains(rt3, "lookup 5") || strings.Count(rt3, "\n") != 8 {
		t.Errorf("after an empty State, routing still has Egress entries:\n%s", rt3)
	}
	d2 = d3
	if err := d2.Teardown(ctx); err != nil {
		t.Fatalf("Teardown: %v", err)
	}
	if out, _ := d2.Dump(ctx); out != "" {
		t.Errorf("table left after Teardown:\n%s", out)
	}
	if rt := routingText(t, ns); rt != "" {
		t.Errorf("routing left after Teardown:\n%s", rt)
	}
	if out, _ := exec.Command("ip", "-n", ns.Name, "link", "show", "egx").CombinedOutput(); !strings.Contains(string(out), "does not exist") {
		t.Errorf("egx left after Teardown: %s", out)
	}
	rules, err := foreign.GetRules(ft, fc)
	if err != nil || len(rules) != 1 {
		t.Errorf("foreign rules after Teardown: %d, %v", len(rules), err)
	}
}
