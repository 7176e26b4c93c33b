package datapath

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/google/nftables"

	"github.com/egressip/egressip/internal/testutil/netnstest"
)

// multiState is a source Node's State with one Egress of three IPs (the
// first held here when held is set) and nLocal local members, beside
// single-IP Egresses that must not change when the multi-IP one does.
func multiState(usable [3]bool, held bool) State {
	st := sampleState()
	ips := []EgressIP{{IP: ap("192.0.2.201")}, {IP: ap("192.0.2.202")}, {IP: ap("192.0.2.203")}}
	for i := range ips {
		ips[i].Usable = usable[i]
	}
	ips[0].Held = held
	e := Egress{Name: "multi", Role: RoleSource, Local: []netip.Addr{ap("10.244.1.20"), ap("10.244.1.21")}, IPs: ips}
	if held {
		e.Role, e.IP = RoleEgress, ips[0].IP
		e.Remote = []Member{{IP: ap("10.244.2.20"), HostIP: ap("192.0.2.12")}}
	}
	if !usable[0] && !usable[1] && !usable[2] && !held {
		e.Role = RoleFailed
	}
	st.Egresses = append(st.Egresses, e)
	return st
}

// TestMultiIPBuild: an Egress with three IPs gets a picker (its local
// members' ID) and one part per IP: the held one SNATs, the others route
// into the tunnel toward their IP; the pick map splits [0, 840) evenly
// over the usable parts, and only it changes when an IP's usability does.
func TestMultiIPBuild(t *testing.T) {
	cfg := Config{UplinkMTU: 1500}
	p, err := Build(cfg, multiState([3]bool{true, true, true}, true), nil)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := cfg.withDefaults()
	if p.Roles["multi"] != RolePick {
		t.Fatalf("role of multi %v, want RolePick", p.Roles["multi"])
	}
	held, a, b := SubName("multi", ap("192.0.2.201")), SubName("multi", ap("192.0.2.202")), SubName("multi", ap("192.0.2.203"))
	if p.Roles[held] != RoleEgress || p.Roles[a] != RoleSource || p.Roles[b] != RoleSource {
		t.Fatalf("roles %v", p.Roles)
	}
	if p.EIPs[held] != ap("192.0.2.201") {
		t.Errorf("EIPs %v, want %s -> 192.0.2.201", p.EIPs, held)
	}
	if got := p.Members[ap("10.244.1.20")]; got != c.Mark(p.IDs["multi"]) {
		t.Errorf("local member mark %#x, want the picker's %#x", got, c.Mark(p.IDs["multi"]))
	}
	if got := p.Members[ap("10.244.2.20")]; got != c.Mark(p.IDs[held])|c.FromTunnel {
		t.Errorf("remote member mark %#x, want the held part's with FromTunnel", got)
	}
	var routes []string
	for _, r := range p.Routes {
		if r.Table == c.SourceTable(p.IDs[a]) || r.Table == c.SourceTable(p.IDs[b]) {
			routes = append(routes, r.Outer.String())
		}
	}
	if strings.Join(routes, ",") != "192.0.2.202,192.0.2.203" {
		t.Errorf("source routes toward %v, want the two IPs held elsewhere", routes)
	}
	pick := findSet(p.NFT, mapPick+fmt.Sprint(p.IDs["multi"]))
	if pick == nil || len(pick.Elements) != 6 {
		t.Fatalf("pick map %+v, want 3 ranges (a start and an end each)", pick)
	}
	for i, want := range []uint32{0, 280, 280, 560, 560, 840} {
		k := pick.Elements[i].Key
		if got := uint32(k[0])<<24 | uint32(k[1])<<16 | uint32(k[2])<<8 | uint32(k[3]); got != want {
			t.Errorf("pick element %d starts at %d, want %d", i, got, want)
		}
	}

	// The second IP stops being usable: only the pick map changes.
	q, err := Build(cfg, multiState([3]bool{true, false, true}, true), p.IDs)
	if err != nil {
		t.Fatal(err)
	}
	changed, ok := picksOnly(p.NFT, q.NFT)
	if !ok || len(changed) != 1 || changed[0].Set.Name != pick.Set.Name || len(changed[0].Elements) != 4 {
		t.Fatalf("picksOnly = %v %+v, want the one pick map with 2 ranges", ok, changed)
	}
	if fmt.Sprint(q.Routes) != fmt.Sprint(p.Routes) || fmt.Sprint(q.Rules) != fmt.Sprint(p.Rules) {
		t.Error("routes or rules changed with an IP's usability")
	}
	// None usable, none held: the Egress's failurePolicy (Fail) applies.
	f, err := Build(cfg, multiState([3]bool{}, false), p.IDs)
	if err != nil {
		t.Fatal(err)
	}
	if f.Roles["multi"] != RoleFailed {
		t.Errorf("no usable IP: role %v, want RoleFailed", f.Roles["multi"])
	}
}

func findSet(r Ruleset, name string) *SetContent {
	for i := range r.Sets {
		if r.Sets[i].Set.Name == name {
			return &r.Sets[i]
		}
	}
	return nil
}

// TestMultiIPApplyRewritesOnlyThePickMap: in the kernel, a change of an
// IP's usability is written as the pick map alone (one transaction), and
// the map then holds exactly the usable IPs' marks.
func TestMultiIPApplyRewritesOnlyThePickMap(t *testing.T) {
	netnstest.RequireRoot(t)
	ns := kernelNS(t)
	cfg, d := newKernelDatapath(t, ns)
	ctx := context.Background()
	if err := d.Apply(ctx, multiState([3]bool{true, true, true}, false)); err != nil {
		t.Fatal(err)
	}
	if w := d.LastWrite(); !w.Table {
		t.Fatalf("first Apply wrote %+v, want the table", w)
	}
	if err := d.Apply(ctx, multiState([3]bool{true, false, true}, false)); err != nil {
		t.Fatal(err)
	}
	if w := d.LastWrite(); w.Table || w.Maps != 1 || w.Elements != 4 {
		t.Fatalf("usability change wrote %+v, want one pick map of 4 elements (2 ranges)", w)
	}
	ids := d.IDs()
	c, _ := cfg.withDefaults()
	conn, err := nftables.New(nftables.WithNetNSFd(int(ns.Handle)))
	if err != nil {
		t.Fatal(err)
	}
	s, err := conn.GetSetByName(d.table(), mapPick+fmt.Sprint(ids["multi"]))
	if err != nil {
		t.Fatal(err)
	}
	els, err := conn.GetSetElements(s)
	if err != nil {
		t.Fatal(err)
	}
	var marks []uint32
	for _, e := range els {
		if !e.IntervalEnd && len(e.Val) == 4 {
			m, _ := markOf(e.Val)
			marks = append(marks, m)
		}
	}
	want := map[uint32]bool{c.Mark(ids[SubName("multi", ap("192.0.2.201"))]): true, c.Mark(ids[SubName("multi", ap("192.0.2.203"))]): true}
	if len(marks) != 2 || !want[marks[0]] || !want[marks[1]] || marks[0] == marks[1] {
		t.Fatalf("kernel pick map marks %#x, want those of .201 and .203 (%v)", marks, want)
	}
	// Applying the same State again writes nothing.
	if err := d.Apply(ctx, multiState([3]bool{true, false, true}, false)); err != nil {
		t.Fatal(err)
	}
	if w := d.LastWrite(); w != (PickWrite{}) {
		t.Errorf("same State wrote %+v", w)
	}
}

// BenchmarkMultiIPReprogram measures the reprogramming of a source Node
// when one IP of a 3-IP Egress changes state (Ready <-> not Ready), with
// 100 single-IP Egresses (20 local members each) and 10 multi-IP ones on
// the Node: time per Apply, and the nftables work it does (pick maps
// rewritten, elements and netlink messages written) as custom metrics.
// Sub-benchmark table is the comparison: a change that replaces the whole
// table (one single-IP Egress gains or loses a local member), as every
// change did before; unchanged is an Apply of the same State (what every
// Apply costs besides writing: Build, the device, route and rule dumps). The figure is in docs/datapath.md, "Several IPs".
func BenchmarkMultiIPReprogram(b *testing.B) {
	netnstest.RequireRoot(b)
	st := func(usable bool, extra bool) State {
		s := State{NodeIPs: []netip.Addr{ap("192.0.2.11"), ap("192.0.2.12")}, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}}
		for i := range 100 {
			e := Egress{Name: fmt.Sprintf("single-%03d", i), IP: netip.AddrFrom4([4]byte{198, 51, 100, byte(i)}), Role: RoleSource}
			for j := range 20 {
				e.Local = append(e.Local, netip.AddrFrom4([4]byte{10, 244, byte(1 + i), byte(1 + j)}))
			}
			if i == 0 && extra {
				e.Local = append(e.Local, ap("10.244.1.99"))
			}
			s.Egresses = append(s.Egresses, e)
		}
		for i := range 10 {
			e := Egress{Name: fmt.Sprintf("multi-%02d", i), Role: RoleSource, Local: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, 200, byte(1 + i)})}}
			for j := range 3 {
				e.IPs = append(e.IPs, EgressIP{IP: netip.AddrFrom4([4]byte{203, 0, 113, byte(3*i + j)}), Usable: i != 0 || j != 1 || usable})
			}
			s.Egresses = append(s.Egresses, e)
		}
		return s
	}
	for _, tc := range []struct {
		name  string
		state func(i int) State
		table bool
	}{
		{"unchanged", func(int) State { return st(true, false) }, false},
		{"pick-map", func(i int) State { return st(i%2 == 1, false) }, false},
		{"table", func(i int) State { return st(true, i%2 == 0) }, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			pair := netnstest.NewPair(b)
			pair.Node.MustIP(b, "addr", "add", "192.0.2.11/24", "dev", pair.NodeIf)
			d, err := New(Config{Uplink: "node0"}, pair.Node.Handle)
			if err != nil {
				b.Fatal(err)
			}
			defer func() { _ = d.Close() }()
			ctx := context.Background()
			if err := d.Apply(ctx, st(true, false)); err != nil {
				b.Fatal(err)
			}
			var maps, elements, messages int
			b.ResetTimer()
			for i := range b.N {
				if err := d.Apply(ctx, tc.state(i)); err != nil {
					b.Fatal(err)
				}
				w := d.LastWrite()
				if w.Table != tc.table {
					b.Fatalf("change %d wrote %+v, want table=%v", i, w, tc.table)
				}
				maps, elements, messages = maps+w.Maps, elements+w.Elements, messages+w.Messages
			}
			b.ReportMetric(float64(maps)/float64(b.N), "maps/op")
			b.ReportMetric(float64(elements)/float64(b.N), "elements/op")
			b.ReportMetric(float64(messages)/float64(b.N), "msgs/op")
		})
	}
}
