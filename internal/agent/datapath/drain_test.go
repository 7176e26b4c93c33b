package datapath

import (
	"net/netip"
	"reflect"
	"testing"
	"time"
)

// TestPlanDrains runs the drain decisions (planDrains) over the moves of
// one Pod between Egresses, on its own Node (source) and on the egress
// Node of the Egress it left, then builds the Plans that keep the old
// path (the kernel side is TestMoveBetweenEgresses in test/datapath).
func TestPlanDrains(t *testing.T) {
	cfg, err := Config{UplinkMTU: 1500}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	app, other := ap("10.244.1.5"), ap("10.244.1.6")
	eip1, eip2, host := ap("192.0.2.100"), ap("192.0.2.101"), ap("192.0.2.11")
	pods := []LocalPod{{IP: app, UID: "u-app"}, {IP: other, UID: "u-other"}}
	// Before: app is e1's member, sourced here (ID 1) toward eip1.
	srcPrev := drainInput{
		cfg: cfg, now: t0, timeout: time.Hour,
		prevMembers: map[netip.Addr]uint32{app: cfg.Mark(1)},
		prevIDs:     IDs{"e1": 1},
		prevRoles:   map[string]Role{"e1": RoleSource},
		prevUIDs:    map[netip.Addr]string{app: "u-app", other: "u-other"},
		prevRoutes:  []EncapRoute{{Table: cfg.SourceTable(1), Dst: netip.MustParsePrefix("0.0.0.0/0"), Outer: eip1}},
	}
	moved := State{Pods: pods, Egresses: []Egress{{Name: "e2", IP: eip2, Role: RoleSource, Local: []netip.Addr{app}}}}
	want := drain{Egress: "e1", IP: app, Mark: cfg.Mark(1), EIP: eip1, UID: "u-app", Since: t0}

	in := srcPrev
	in.st = moved
	keep, ended := planDrains(in)
	if !reflect.DeepEqual(keep, map[drainKey]drain{{"e1", app}: want}) || ended != nil {
		t.Fatalf("source, app moved to e2: keep %v, ended %v; want the drain %v", keep, ended, want)
	}
	p, err := buildPlan(cfg, moved, IDs{"e1": 1}, []drain{want})
	if err != nil {
		t.Fatal(err)
	}
	if p.IDs["e1"] != 1 || p.Roles["e1"] != RoleDrain || p.IDs["e2"] != 2 {
		t.Fatalf("drain-only e1: IDs %v roles %v, want e1 1 (RoleDrain), e2 2", p.IDs, p.Roles)
	}
	if got := routeOuter(p.Routes, cfg.SourceTable(1), netip.MustParsePrefix("0.0.0.0/0")); got != eip1 {
		t.Fatalf("drain-only e1's route leads to %v, want %s; routes %v", got, eip1, p.Routes)
	}
	if _, ok := p.Members[app]; !ok || p.Members[app] != cfg.Mark(2) {
		t.Fatalf("app's new flows: mark %#x, want e2's %#x", p.Members[app], cfg.Mark(2))
	}

	// Without an open flow under e1 there is nothing to drain.
	in.live = map[liveKey]int{{app, cfg.Mark(2)}: 1}
	if keep, _ := planDrains(in); len(keep) != 0 {
		t.Errorf("no live entry under e1: drains %v, want none", keep)
	}
	in.live = map[liveKey]int{{app, cfg.Mark(1)}: 1}
	if keep, _ := planDrains(in); len(keep) != 1 {
		t.Errorf("a live entry under e1: drains %v, want one", keep)
	}
	in.live = nil

	// Another Pod has app's IP now, or app went away: no drain.
	in.st.Pods = []LocalPod{{IP: app, UID: "u-new"}}
	if keep, _ := planDrains(in); len(keep) != 0 {
		t.Errorf("IP given to another Pod: drains %v, want none", keep)
	}
	in.st.Pods = nil
	if keep, _ := planDrains(in); len(keep) != 0 {
		t.Errorf("Pod gone: drains %v, want none", keep)
	}
	// After a restart (nothing applied yet) the old path is unknown.
	in = srcPrev
	in.st, in.prevRoutes = moved, nil
	if keep, _ := planDrains(in); len(keep) != 0 {
		t.Errorf("first Apply after a restart: drains %v, want none", keep)
	}

	// A drain in progress.
	running := srcPrev
	running.st, running.prevMembers = moved, map[netip.Addr]uint32{app: cfg.Mark(2)}
	running.drains = map[drainKey]drain{{"e1", app}: want}
	for _, tc := range []struct {
		name  string
		edit  func(*drainInput)
		ended bool
	}{
		{"entries live", func(in *drainInput) { in.live = map[liveKey]int{{app, cfg.Mark(1)}: 1} }, false},
		{"not counted yet", func(*drainInput) {}, false},
		{"no live entry", func(in *drainInput) { in.live = map[liveKey]int{{app, cfg.Mark(2)}: 3} }, true},
		{"timed out", func(in *drainInput) { in.now = t0.Add(time.Hour) }, true},
		{"Pod gone", func(in *drainInput) { in.st.Pods = pods[1:] }, true},
		{"e1 has another IP", func(in *drainInput) {
			in.st.Egresses = append(in.st.Egresses, Egress{Name: "e1", IP: eip2, Role: RoleSource, Local: []netip.Addr{other}})
		}, true},
		{"e1 failed", func(in *drainInput) {
			in.st.Egresses = append(in.st.Egresses, Egress{Name: "e1", Role: RoleFailed, FailurePolicy: FailurePolicyFail, Local: []netip.Addr{other}})
		}, true},
		{"e1 still sourced here with the same IP", func(in *drainInput) {
			in.st.Egresses = append(in.st.Egresses, Egress{Name: "e1", IP: eip1, Role: RoleSource, Local: []netip.Addr{other}})
		}, false},
	} {
		in := running
		in.st.Egresses = append([]Egress(nil), running.st.Egresses...)
		tc.edit(&in)
		keep, ended := planDrains(in)
		if gotEnded := len(ended) == 1 && len(keep) == 0; gotEnded != tc.ended || len(keep)+len(ended) != 1 {
			t.Errorf("%s: keep %v ended %v, want ended=%v", tc.name, keep, ended, tc.ended)
		}
	}
	// app rejoins e1: a member again, neither draining nor ended.
	in = running
	in.st = State{Pods: pods, Egresses: []Egress{{Name: "e1", IP: eip1, Role: RoleSource, Local: []netip.Addr{app}}}}
	if keep, ended := planDrains(in); len(keep) != 0 || len(ended) != 0 {
		t.Errorf("rejoined: keep %v ended %v, want neither", keep, ended)
	}

	// The egress Node of e1: app, a remote member, left e1's slice.
	remote := drainInput{
		cfg: cfg, now: t0, timeout: time.Hour,
		prevMembers: map[netip.Addr]uint32{app: cfg.Mark(3) | cfg.FromTunnel},
		prevIDs:     IDs{"e1": 3},
		prevRoles:   map[string]Role{"e1": RoleEgress},
		prevEIPs:    map[string]netip.Addr{"e1": eip1},
		prevRoutes:  []EncapRoute{{Table: cfg.ReturnTable(), Dst: netip.MustParsePrefix("10.244.1.5/32"), Outer: host}},
		st:          State{Egresses: []Egress{{Name: "e1", IP: eip1, Role: RoleEgress}}},
	}
	wantR := drain{Egress: "e1", IP: app, Mark: cfg.Mark(3) | cfg.FromTunnel, EIP: eip1, Host: host, Since: t0}
	keep, _ = planDrains(remote)
	if !reflect.DeepEqual(keep, map[drainKey]drain{{"e1", app}: wantR}) {
		t.Fatalf("egress Node, remote member left: keep %v, want %v", keep, wantR)
	}
	p, err = buildPlan(cfg, remote.st, IDs{"e1": 3}, []drain{wantR})
	if err != nil {
		t.Fatal(err)
	}
	if got := routeOuter(p.Routes, cfg.ReturnTable(), netip.MustParsePrefix("10.244.1.5/32")); got != host || p.Roles["e1"] != RoleEgress {
		t.Fatalf("return route of the draining member leads to %v (role %v), want %s; routes %v", got, p.Roles["e1"], host, p.Routes)
	}
	if _, ok := p.Members[app]; ok {
		t.Fatalf("the draining remote member is still classified: new flows from it would be SNATed")
	}
	// The egress IP leaves this Node: the drain ends.
	remote.drains, remote.prevMembers = keep, nil
	remote.st.Egresses[0].Role = RoleSource
	if keep, ended := planDrains(remote); len(keep) != 0 || len(ended) != 1 {
		t.Errorf("e1 no longer held here: keep %v ended %v, want the drain ended", keep, ended)
	}

	// Roles that keep entries.
	if !sameRole(RoleSource, RoleDrain) || !sameRole(RoleDrain, RoleSource) || sameRole(RoleDrain, RoleEgress) || sameRole(RoleSource, RoleFailed) {
		t.Error("sameRole: only source <-> drain keeps entries")
	}
}

// TestBuildPeerPods: an egress Node gets, per family and Pod CIDR length,
// a set of (peer IP . Pod network) pairs and a return route to each
// peer's Pod CIDR; a Node that holds no egress IP gets neither.
func TestBuildPeerPods(t *testing.T) {
	cfg := Config{UplinkMTU: 1500}
	st := State{
		Egresses: []Egress{{Name: "e1", IP: ap("192.0.2.100"), Role: RoleEgress}},
		Peers: []Peer{
			{IP: ap("192.0.2.11"), PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:1::/64")}},
			{IP: ap("2001:db8::11"), PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:1::/64")}},
			{IP: ap("192.0.2.12"), PodCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/26")}},
		},
	}
	p, err := Build(cfg, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	sets := map[string]SetContent{}
	for _, s := range p.NFT.Sets {
		sets[s.Set.Name] = s
	}
	for name, want := range map[string][]byte{
		"peerpods4-24": {192, 0, 2, 11, 10, 244, 1, 0},
		"peerpods4-26": {192, 0, 2, 12, 10, 244, 2, 0},
	} {
		if s, ok := sets[name]; !ok || len(s.Elements) != 1 || !reflect.DeepEqual(s.Elements[0].Key, want) {
			t.Errorf("set %s: %+v, want one element %v", name, s.Elements, want)
		}
	}
	if s, ok := sets["peerpods6-64"]; !ok || len(s.Elements) != 1 {
		t.Errorf("set peerpods6-64: %+v, want one element", s.Elements)
	}
	if s := sets["eipid4"]; len(s.Elements) != 1 || !reflect.DeepEqual(s.Elements[0].Val, native(cfg.withDefaultsMust().Mark(1))) {
		t.Errorf("eipid4: %+v, want 192.0.2.100 -> e1's mark", s.Elements)
	}
	for dst, outer := range map[string]string{"10.244.1.0/24": "192.0.2.11", "10.244.2.0/26": "192.0.2.12", "fd00:1::/64": "2001:db8::11"} {
		if got := routeOuter(p.Routes, 49999, netip.MustParsePrefix(dst)); got != ap(outer) {
			t.Errorf("return route to %s via %v, want %s (routes %v)", dst, got, outer, p.Routes)
		}
	}
	// A source Node: no peer sets, no peer routes.
	st.Egresses[0].Role, st.Egresses[0].Local = RoleSource, []netip.Addr{ap("10.244.0.5")}
	p, err = Build(cfg, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range p.NFT.Sets {
		if len(s.Set.Name) > len(setPeerPods) && s.Set.Name[:len(setPeerPods)] == setPeerPods {
			t.Errorf("source Node has set %s", s.Set.Name)
		}
	}
	for _, r := range p.Routes {
		if r.Table == 49999 {
			t.Errorf("source Node has return route %+v", r)
		}
	}
}

// withDefaultsMust is withDefaults for configurations known to be valid
// (tests); it panics otherwise.
func (c Config) withDefaultsMust() Config {
	c, err := c.withDefaults()
	if err != nil {
		panic(err)
	}
	return c
}
