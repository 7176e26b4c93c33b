package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
)

func TestAssignIDs(t *testing.T) {
	ids, left := AssignIDs([]string{"c", "a", "b"}, nil, 4095)
	if want := (IDs{"a": 1, "b": 2, "c": 3}); !reflect.DeepEqual(ids, want) || left != nil {
		t.Fatalf("fresh: got %v left %v, want %v", ids, left, want)
	}
	// "b" leaves, "d" and "e" arrive: survivors keep theirs, "d" takes the
	// freed 2 (lowest first), "e" the next free.
	ids, _ = AssignIDs([]string{"e", "d", "c", "a"}, ids, 4095)
	if want := (IDs{"a": 1, "c": 3, "d": 2, "e": 4}); !reflect.DeepEqual(ids, want) {
		t.Fatalf("reuse: got %v, want %v", ids, want)
	}
	// Out-of-range or duplicated previous IDs are reassigned.
	ids, _ = AssignIDs([]string{"x", "y"}, IDs{"x": 9, "y": 9}, 8)
	if ids["x"] == ids["y"] || ids["x"] > 8 || ids["y"] > 8 || ids["x"] == 0 {
		t.Fatalf("bad previous IDs not repaired: %v", ids)
	}
	// Running out: the names left over are reported, in name order.
	ids, left = AssignIDs([]string{"a", "b", "c", "d"}, IDs{"d": 1}, 2)
	if want := (IDs{"d": 1, "a": 2}); !reflect.DeepEqual(ids, want) || !slices.Equal(left, []string{"b", "c"}) {
		t.Fatalf("overflow: got %v left %v", ids, left)
	}
}

func shuffled(st State, r *rand.Rand) State {
	out := st
	out.Egresses = slices.Clone(st.Egresses)
	r.Shuffle(len(out.Egresses), func(i, j int) { out.Egresses[i], out.Egresses[j] = out.Egresses[j], out.Egresses[i] })
	for i := range out.Egresses {
		e := &out.Egresses[i]
		e.Local = slices.Clone(e.Local)
		e.Remote = slices.Clone(e.Remote)
		r.Shuffle(len(e.Local), func(i, j int) { e.Local[i], e.Local[j] = e.Local[j], e.Local[i] })
		r.Shuffle(len(e.Remote), func(i, j int) { e.Remote[i], e.Remote[j] = e.Remote[j], e.Remote[i] })
	}
	out.NodeIPs = slices.Clone(st.NodeIPs)
	r.Shuffle(len(out.NodeIPs), func(i, j int) { out.NodeIPs[i], out.NodeIPs[j] = out.NodeIPs[j], out.NodeIPs[i] })
	out.ClusterCIDRs = slices.Clone(st.ClusterCIDRs)
	r.Shuffle(len(out.ClusterCIDRs), func(i, j int) {
		out.ClusterCIDRs[i], out.ClusterCIDRs[j] = out.ClusterCIDRs[j], out.ClusterCIDRs[i]
	})
	return out
}

func TestBuildDeterministic(t *testing.T) {
	cfg := Config{UplinkMTU: 1500}
	st := bigState(50, 500)
	want, err := Build(cfg, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 20 {
		got, err := Build(cfg, shuffled(st, r), nil)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("permutation %d changed the plan", i)
		}
	}
	// Feeding the IDs back changes nothing.
	again, _ := Build(cfg, st, want.IDs)
	if !reflect.DeepEqual(again, want) {
		t.Fatal("rebuilding with the plan's own IDs changed it")
	}
}

func TestBuildRolesRoutesRules(t *testing.T) {
	cfg := Config{UplinkMTU: 1500}
	p, err := Build(cfg, sampleState(), nil)
	if err != nil {
		t.Fatal(err)
	}
	// "ign" (Failed+Ignore) needs nothing; names sorted: egr egr6 fail src src6.
	wantIDs := IDs{"egr": 1, "egr6": 2, "fail": 3, "src": 4, "src6": 5}
	if !reflect.DeepEqual(p.IDs, wantIDs) {
		t.Fatalf("IDs %v, want %v", p.IDs, wantIDs)
	}
	wantRoles := map[string]Role{"egr": RoleEgress, "egr6": RoleEgress, "fail": RoleFailed, "src": RoleSource, "src6": RoleSource}
	if !reflect.DeepEqual(p.Roles, wantRoles) {
		t.Fatalf("roles %v, want %v", p.Roles, wantRoles)
	}
	wantRoutes := []EncapRoute{
		{Table: 49999, Dst: netip.MustParsePrefix("10.244.2.2/32"), Outer: ap("192.0.2.12")},
		{Table: 49999, Dst: netip.MustParsePrefix("fd00:10:244:2::2/128"), Outer: ap("2001:db8::12"), MTU: 1444},
		{Table: 50004, Dst: netip.MustParsePrefix("0.0.0.0/0"), Outer: ap("192.0.2.100")},
		{Table: 50005, Dst: netip.MustParsePrefix("::/0"), Outer: ap("2001:db8::100"), MTU: 1444},
	}
	if !reflect.DeepEqual(p.Routes, wantRoutes) {
		t.Fatalf("routes\n%v\nwant\n%v", p.Routes, wantRoutes)
	}
	wantRules := []PolicyRule{
		{Family: afInet, Priority: 1100, Mask: 0x1fff0000, Goto: 1102},
		{Family: afInet, Priority: 1101, Mark: 0x00040000, Mask: 0x0fff0000, Table: 50004},
		{Family: afInet, Priority: 1101, Mark: 0x10000000, Mask: 0x10000000, Table: 49999},
		{Family: afInet, Priority: 1102, Nop: true},
		{Family: afInet6, Priority: 1100, Mask: 0x1fff0000, Goto: 1102},
		{Family: afInet6, Priority: 1101, Mark: 0x00050000, Mask: 0x0fff0000, Table: 50005},
		{Family: afInet6, Priority: 1101, Mark: 0x10000000, Mask: 0x10000000, Table: 49999},
		{Family: afInet6, Priority: 1102, Nop: true},
	}
	if !reflect.DeepEqual(p.Rules, wantRules) {
		t.Fatalf("rules\n%v\nwant\n%v", p.Rules, wantRules)
	}
	// A Source without an egress IP falls back to its failure policy.
	st := State{Egresses: []Egress{{Name: "x", Role: RoleSource, FailurePolicy: FailurePolicyFail, Local: []netip.Addr{ap("10.0.0.1")}}}}
	if p, _ := Build(cfg, st, nil); p.Roles["x"] != RoleFailed {
		t.Fatalf("source without IP: role %v, want RoleFailed", p.Roles["x"])
	}
	// Duplicate names are refused.
	st.Egresses = append(st.Egresses, st.Egresses[0])
	if _, err := Build(cfg, st, nil); err == nil {
		t.Fatal("duplicate Egress names accepted")
	}
}

func TestBuildTooManyEgresses(t *testing.T) {
	cfg := Config{UplinkMTU: 1500, IDMask: 0x00070000} // 7 IDs
	p, err := Build(cfg, bigState(10, 10), nil)
	if !errors.Is(err, ErrTooManyEgresses) {
		t.Fatalf("err %v, want ErrTooManyEgresses", err)
	}
	if len(p.IDs) != 7 {
		t.Fatalf("%d IDs assigned, want 7", len(p.IDs))
	}
}

func TestConfigValidation(t *testing.T) {
	for _, c := range []Config{
		{IDMask: 0x0f0f0000},
		{FromTunnel: 0x00010000},
		{FromTunnel: 0x30000000},
		{TunnelDevice: "a-very-long-device"},
		{TunnelAddr: ap("10.0.0.1")},
		{UplinkMTU: 1000},
		{RejectQueue: -2},
		{RejectQueue: 65536},
	} {
		if _, err := c.withDefaults(); err == nil {
			t.Errorf("config %+v accepted", c)
		}
	}
}

func TestIntervalElements(t *testing.T) {
	ps := []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/16"), netip.MustParsePrefix("10.0.1.0/24"), // contained
		netip.MustParsePrefix("10.1.0.0/16"), // adjacent: merges
		netip.MustParsePrefix("255.255.255.255/32"),
	}
	got := intervalElements(families[0], ps)
	var s []string
	for _, e := range got {
		s = append(s, fmt.Sprintf("%v/%v", netip.AddrFrom4([4]byte(e.Key)), e.IntervalEnd))
	}
	want := []string{"10.0.0.0/false", "10.2.0.0/true", "255.255.255.255/false"}
	if !slices.Equal(s, want) {
		t.Fatalf("got %v, want %v", s, want)
	}
}

// bigState has n Egresses and pods Pods: a third of the Egresses held
// here (with remote members), a third sourced here, a third failed.
func bigState(n, pods int) State {
	st := State{ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12")}}
	for i := range 100 {
		st.NodeIPs = append(st.NodeIPs, netip.AddrFrom4([4]byte{192, 168, byte(i / 250), byte(i%250 + 1)}))
	}
	perEgress := max(pods/n, 1)
	pod := 0
	podIP := func() netip.Addr {
		pod++
		return netip.AddrFrom4([4]byte{10, byte(pod >> 16), byte(pod >> 8), byte(pod)})
	}
	for i := range n {
		e := Egress{Name: fmt.Sprintf("egress-%04d", i), IP: netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)}), FailurePolicy: FailurePolicyFail}
		switch i % 3 {
		case 0:
			e.Role = RoleEgress
			for j := range perEgress {
				e.Remote = append(e.Remote, Member{IP: podIP(), HostIP: st.NodeIPs[j%len(st.NodeIPs)]})
			}
		case 1:
			e.Role = RoleSource
			for range perEgress {
				e.Local = append(e.Local, podIP())
			}
		default:
			e.Role, e.IP = RoleFailed, netip.Addr{}
			for range perEgress {
				e.Local = append(e.Local, podIP())
			}
		}
		st.Egresses = append(st.Egresses, e)
	}
	return st
}

// BenchmarkBuild: the ruleset builder at 1,000 Egresses and 10,000 Pods.
func BenchmarkBuild(b *testing.B) {
	cfg := Config{UplinkMTU: 1500}
	st := bigState(1000, 10000)
	prev, err := Build(cfg, st, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, err := Build(cfg, st, prev.IDs); err != nil {
			b.Fatal(err)
		}
	}
}

// TestBuildRejectQueue: the reject-queue chain queues in the configured
// form and to the configured number, and is empty with RejectQueue -1.
func TestBuildRejectQueue(t *testing.T) {
	rules := func(cfg Config) []Rule {
		t.Helper()
		p, err := Build(cfg, sampleState(), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, ch := range p.NFT.Chains {
			if ch.Chain.Name == chainRejectQueue {
				return ch.Rules
			}
		}
		t.Fatalf("no chain %s", chainRejectQueue)
		return nil
	}
	last := func(rs []Rule) expr.Any {
		if len(rs) != 1 {
			t.Fatalf("%d rules in %s, want 1", len(rs), chainRejectQueue)
		}
		return rs[0][len(rs[0])-1]
	}
	if q, ok := last(rules(Config{UplinkMTU: 1500, RejectQueue: 7})).(*expr.Queue); !ok || q.Num != 7 || q.Flag != expr.QueueFlagBypass {
		t.Errorf("native form: last expression %#v, want queue 7 with bypass", q)
	}
	tg, ok := last(rules(Config{UplinkMTU: 1500, RejectQueue: 7, queueForm: queueCompat})).(*expr.Target)
	if !ok || tg.Name != "NFQUEUE" || tg.Rev != 3 {
		t.Fatalf("compat form: last expression %#v, want the NFQUEUE target rev 3", tg)
	}
	if info := *tg.Info.(*xt.Unknown); binary.NativeEndian.Uint16(info[0:]) != 7 || binary.NativeEndian.Uint16(info[4:]) != xtNFQFlagBypass {
		t.Errorf("compat form: info %v, want queue 7 with bypass", info)
	}
	if rs := rules(Config{UplinkMTU: 1500, RejectQueue: -1}); len(rs) != 0 {
		t.Errorf("RejectQueue -1: %d rules, want none", len(rs))
	}
}

// TestBuildSourceGuard: the source guard's exception set holds one
// element per IPv6 Egress held here (ID mark . egress IP, Egresses
// sharing an address each with their own mark), nothing of IPv4 or of
// Egresses sourced here; its base chains hook output and postrouting
// after srcnat (100), where the NAT hooks have already rewritten the
// source.
func TestBuildSourceGuard(t *testing.T) {
	st := sampleState()
	st.Egresses = append(st.Egresses, Egress{Name: "egr6b", IP: ap("2001:db8::101"), Role: RoleEgress})
	cfg := Config{UplinkMTU: 1500}
	p, err := Build(cfg, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := cfg.withDefaults()
	var got []string
	for _, s := range p.NFT.Sets {
		if s.Set.Name != setSNATSrc6 {
			continue
		}
		for _, e := range s.Elements {
			mark, _ := markOf(e.Key[:4])
			ip, _ := netip.AddrFromSlice(e.Key[4:])
			got = append(got, fmt.Sprintf("%#x . %s", mark, ip))
		}
	}
	want := []string{
		fmt.Sprintf("%#x . 2001:db8::101", c.Mark(p.IDs["egr6"])),
		fmt.Sprintf("%#x . 2001:db8::101", c.Mark(p.IDs["egr6b"])),
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("%s = %v, want %v", setSNATSrc6, got, want)
	}
	hooks := map[string]string{}
	for _, ch := range p.NFT.Chains {
		if ch.Chain.Hooknum != nil && ch.Chain.Priority != nil {
			hooks[ch.Chain.Name] = fmt.Sprintf("%d/%d", *ch.Chain.Hooknum, *ch.Chain.Priority)
		}
	}
	if h := hooks[chainSourceOut]; h != fmt.Sprintf("%d/-10", *nftables.ChainHookOutput) {
		t.Errorf("%s hooks %s, want output at -10", chainSourceOut, h)
	}
	if h := hooks[chainSourcePost]; h != fmt.Sprintf("%d/110", *nftables.ChainHookPostrouting) {
		t.Errorf("%s hooks %s, want postrouting at 110 (after srcnat)", chainSourcePost, h)
	}
	if !slices.Contains(p.NFT.Counters, counterEIPSource) {
		t.Errorf("counters %v lack %s", p.NFT.Counters, counterEIPSource)
	}
}
