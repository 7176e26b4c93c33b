package datapath

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/egressip/egressip/internal/testutil/netnstest"
)

// markedWithoutRoute reads the kernel as it is at this instant: the member
// classification of the table in place (read back as a restarted agent
// would) and the policy rules and routes. It returns one line per member
// whose connections the table marks for a tunnelled Egress while no rule
// sends that mark to a table with a default route of the member's family.
func markedWithoutRoute(d *Datapath) ([]string, error) {
	k := &Datapath{cfg: d.cfg, ns: d.ns, nl: d.nl}
	if err := k.readBack(); err != nil {
		return nil, err
	}
	byID := map[uint16]string{}
	for n, id := range k.ids {
		byID[id] = n
	}
	var bad []string
	for ip, mark := range k.members {
		if mark&d.cfg.FromTunnel != 0 {
			continue // a remote member on an egress Node: SNATed here
		}
		id := uint16((mark & d.cfg.IDMask) >> d.cfg.idShift())
		name := byID[id]
		if k.roles[name] != RoleSource {
			continue
		}
		fam := netlink.FAMILY_V4
		if ip.Is6() {
			fam = netlink.FAMILY_V6
		}
		rules, err := d.nl.RuleList(fam)
		if err != nil {
			return nil, err
		}
		ruled := false
		for _, r := range rules {
			if r.Priority == d.cfg.RulePriority+1 && r.Mark == d.cfg.Mark(id) && r.Mask != nil && *r.Mask == d.cfg.IDMask && r.Table == d.cfg.SourceTable(id) {
				ruled = true
			}
		}
		routes, err := d.nl.RouteListFiltered(fam, &netlink.Route{Table: d.cfg.SourceTable(id)}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return nil, err
		}
		routed := false
		for _, r := range routes {
			if r.Dst == nil || r.Dst.IP.IsUnspecified() {
				routed = true
			}
		}
		if !ruled || !routed {
			bad = append(bad, fmt.Sprintf("member %s of %s (ID %d): rule %v, default route %v", ip, name, id, ruled, routed))
		}
	}
	return bad, nil
}

// TestApplyOrderNeverMarksWithoutRoute observes the kernel between the
// phases of every Apply (issue 23, fault 2): at no instant may the table
// mark a member's connections for a tunnelled Egress whose route or rule
// is not in place, whether the Egress is new (its first member on this
// Node), gains a member, changes its egress IP, is replaced by another
// that reuses its ID, or goes away.
func TestApplyOrderNeverMarksWithoutRoute(t *testing.T) {
	netnstest.RequireRoot(t)
	ns := kernelNS(t)
	d, err := New(Config{Uplink: "node0"}, ns.Handle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	var checks int
	d.onStep = func(step string, _ Plan) {
		checks++
		bad, err := markedWithoutRoute(d)
		if err != nil {
			t.Errorf("%s: read the kernel: %v", step, err)
			return
		}
		for _, b := range bad {
			t.Errorf("after %q: the table marks without a route: %s", step, b)
		}
	}
	base := State{NodeIPs: []netip.Addr{ap("192.0.2.11"), ap("192.0.2.12"), ap("2001:db8::11")},
		ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/56")}}
	with := func(egs ...Egress) State { st := base; st.Egresses = egs; return st }
	steps := []struct {
		name string
		st   State
	}{
		{"nothing", with()},
		{"first member of e1 and e6", with(
			Egress{Name: "e1", IP: ap("192.0.2.100"), Role: RoleSource, Local: []netip.Addr{ap("10.244.1.2")}},
			Egress{Name: "e6", IP: ap("2001:db8::100"), Role: RoleSource, Local: []netip.Addr{ap("fd00:10:244:1::2")}})},
		{"a second member and a new Egress", with(
			Egress{Name: "e1", IP: ap("192.0.2.100"), Role: RoleSource, Local: []netip.Addr{ap("10.244.1.2"), ap("10.244.1.3")}},
			Egress{Name: "e2", IP: ap("192.0.2.102"), Role: RoleSource, Local: []netip.Addr{ap("10.244.1.4")}},
			Egress{Name: "e6", IP: ap("2001:db8::100"), Role: RoleSource, Local: []netip.Addr{ap("fd00:10:244:1::2")}})},
		{"e1 moves to another egress IP", with(
			Egress{Name: "e1", IP: ap("192.0.2.101"), Role: RoleSource, Local: []netip.Addr{ap("10.244.1.2"), ap("10.244.1.3")}},
			Egress{Name: "e2", IP: ap("192.0.2.102"), Role: RoleSource, Local: []netip.Addr{ap("10.244.1.4")}},
			Egress{Name: "e6", IP: ap("2001:db8::100"), Role: RoleSource, Local: []netip.Addr{ap("fd00:10:244:1::2")}})},
		{"e1 goes, e0 takes its ID and its members", with(
			Egress{Name: "e0", IP: ap("192.0.2.103"), Role: RoleSource, Local: []netip.Addr{ap("10.244.1.2")}},
			Egress{Name: "e2", IP: ap("192.0.2.102"), Role: RoleSource, Local: []netip.Addr{ap("10.244.1.4")}},
			Egress{Name: "e6", IP: ap("2001:db8::100"), Role: RoleSource, Local: []netip.Addr{ap("fd00:10:244:1::2")}})},
		{"e2 fails, e6 becomes this Node's", with(
			Egress{Name: "e0", IP: ap("192.0.2.103"), Role: RoleSource, Local: []netip.Addr{ap("10.244.1.2")}},
			Egress{Name: "e2", Role: RoleFailed, FailurePolicy: FailurePolicyFail, Local: []netip.Addr{ap("10.244.1.4")}},
			Egress{Name: "e6", IP: ap("2001:db8::100"), Role: RoleEgress, Local: []netip.Addr{ap("fd00:10:244:1::2")}})},
		{"e2 back", with(
			Egress{Name: "e0", IP: ap("192.0.2.103"), Role: RoleSource, Local: []netip.Addr{ap("10.244.1.2")}},
			Egress{Name: "e2", IP: ap("192.0.2.102"), Role: RoleSource, Local: []netip.Addr{ap("10.244.1.4")}},
			Egress{Name: "e6", IP: ap("2001:db8::100"), Role: RoleSource, Local: []netip.Addr{ap("fd00:10:244:1::2")}})},
		{"everything goes", with()},
	}
	for _, s := range steps {
		before := checks
		if err := d.Apply(context.Background(), s.st); err != nil {
			t.Fatalf("%s: Apply: %v", s.name, err)
		}
		if checks-before != 3 {
			t.Fatalf("%s: %d phases observed, want 3", s.name, checks-before)
		}
		if bad, err := markedWithoutRoute(d); err != nil || len(bad) > 0 {
			t.Fatalf("%s: after Apply: %v %v", s.name, bad, err)
		}
	}
	// The last step removed everything: no rule of ours beyond the three
	// base rules per family, no route in our tables.
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := d.nl.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rs {
			if d.ownsTable(r.Table) {
				t.Errorf("route left in table %d: %v", r.Table, r)
			}
		}
	}
	if _, raw, err := d.listRules(); err != nil || len(raw) != 6 {
		t.Errorf("rules after removing everything: %d (want the 6 base rules), %v", len(raw), err)
	}
}
