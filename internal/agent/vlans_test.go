package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/go-logr/logr"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent/bind"
	"github.com/egressip/egressip/internal/agent/poolroute"
	"github.com/egressip/egressip/internal/testutil/netnstest"
)

// TestVLANOwnershipAgentRefusal runs the agent's VLAN step for real in a
// network namespace. This kernel has no 8021q, so creating the
// sub-interface fails: the IP is refused with the kernel's error in
// bind's wording (so the report names it), nothing is left behind, and
// IPs without a VLAN are not affected. A --vlan-parent that does not
// exist is refused naming it.
func TestVLANOwnershipAgentRefusal(t *testing.T) {
	ns := netnstest.NewNS(t, "vlanag")
	ns.MustIP(t, "link", "add", "eth0", "type", "veth", "peer", "name", "eth9")
	ns.MustIP(t, "addr", "add", "192.0.2.11/24", "dev", "eth0")
	ns.MustIP(t, "link", "set", "eth0", "up")
	ns.MustIP(t, "route", "add", "default", "via", "192.0.2.1")
	tagged, plain := netip.MustParseAddr("198.51.100.50"), netip.MustParseAddr("192.0.2.50")
	hints := map[netip.Addr]bind.Hint{tagged: {Subnet: netip.MustParsePrefix("198.51.100.0/24"), VLAN: 100}}

	k, err := newVLANKeeper(ns.Handle, Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	before := ns.MustIP(t, "-o", "link")
	failed, st := k.ensure(logr.Discard(), []netip.Addr{tagged, plain}, hints)
	if len(st.Problems) != 1 || st.Problems[0].IP != tagged || st.Problems[0].Reason != v1.ReasonVLANLinkFailed ||
		st.Problems[0].Parent != "eth0" || st.Problems[0].VLAN != 100 || len(st.Links) != 0 {
		t.Errorf("status %+v, want one VLANLinkFailed problem for %s, VLAN 100 on eth0", st, tagged)
	}
	if failed[plain] != nil {
		t.Errorf("IP without a VLAN refused: %v", failed[plain])
	}
	e := failed[tagged]
	if e == nil || !strings.Contains(e.Error(), "bind "+tagged.String()+":") || !strings.Contains(e.Error(), "VLAN 100 on eth0") || errorFor(e, tagged) == nil {
		t.Errorf("tagged IP: %v, want bind's wording naming VLAN 100 on eth0 (the default-route link, parent of the untagged subnet)", e)
	}
	t.Logf("refusal on this kernel: %v", e)
	if after := ns.MustIP(t, "-o", "link"); after != before {
		t.Errorf("links changed:\nbefore:\n%s\nafter:\n%s", before, after)
	}

	k2, err := newVLANKeeper(ns.Handle, Config{VLANParent: "bond7"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k2.Close)
	failed, st = k2.ensure(logr.Discard(), []netip.Addr{tagged}, hints)
	e = failed[tagged]
	if !errors.Is(e, poolroute.ErrNoParent) || !strings.Contains(e.Error(), `"bond7"`) {
		t.Errorf("missing parent: %v, want ErrNoParent naming bond7", e)
	}
	if len(st.Problems) != 1 || st.Problems[0].Reason != v1.ReasonVLANParentMissing || st.Problems[0].Parent != "bond7" {
		t.Errorf("missing parent: status %+v, want VLANParentMissing naming bond7", st)
	}
}

// TestVLANOwnershipNodeStatusReasons runs the agent's VLAN step on real
// links for the refusals the Node condition EgressVLANLinksReady names:
// two pools wanting VLAN 300 on different parents (each pool's untagged
// subnet is on another veth; the first by name keeps it: its creation is
// then refused by this kernel, the other is VLANConflict naming both
// parents), no link carrying a pool's untagged subnet nor a default route
// (VLANParentMissing), and a foreign link holding egressip's
// sub-interface name (VLANForeignLink naming it, left alone). The
// status's problems come sorted by IP; the messages are the rules' own,
// without bind's "sync: bind <ip>:" prefix.
func TestVLANOwnershipNodeStatusReasons(t *testing.T) {
	ns := netnstest.NewNS(t, "vlanst")
	ns.MustIP(t, "link", "add", "eth0", "type", "veth", "peer", "name", "eth8")
	ns.MustIP(t, "link", "add", "eth1", "type", "veth", "peer", "name", "eth9")
	ns.MustIP(t, "addr", "add", "192.0.2.11/24", "dev", "eth0")
	ns.MustIP(t, "addr", "add", "203.0.113.11/24", "dev", "eth1")
	ns.MustIP(t, "link", "set", "eth0", "up")
	ns.MustIP(t, "link", "set", "eth1", "up")
	a, b := netip.MustParseAddr("192.0.2.60"), netip.MustParseAddr("203.0.113.60")
	orphan := netip.MustParseAddr("198.51.100.60")
	hints := map[netip.Addr]bind.Hint{
		a:      {Subnet: netip.MustParsePrefix("192.0.2.0/24"), VLAN: 300},
		b:      {Subnet: netip.MustParsePrefix("203.0.113.0/24"), VLAN: 300},
		orphan: {Subnet: netip.MustParsePrefix("198.51.100.0/24"), VLAN: 301},
	}
	k, err := newVLANKeeper(ns.Handle, Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	failed, st := k.ensure(logr.Discard(), []netip.Addr{b, orphan, a}, hints)
	t.Logf("status: %+v", st)
	if len(st.Problems) != 3 || len(failed) != 3 {
		t.Fatalf("status %+v, failed %v: want three problems", st, failed)
	}
	pa, po, pb := st.Problems[0], st.Problems[1], st.Problems[2] // by IP
	if pa.IP != a || pa.Parent != "eth0" || pa.Reason != v1.ReasonVLANLinkFailed {
		t.Errorf("first pool: %+v, want VLAN 300 kept on eth0 (creation refused by this kernel)", pa)
	}
	if pb.IP != b || pb.Parent != "eth1" || pb.Reason != v1.ReasonVLANConflict || !errors.Is(failed[b], poolroute.ErrVLANConflict) ||
		!strings.Contains(pb.Message, "on eth1") || !strings.Contains(pb.Message, "has it on eth0") {
		t.Errorf("second pool: %+v, want VLANConflict naming eth1 and eth0", pb)
	}
	if po.IP != orphan || po.Reason != v1.ReasonVLANParentMissing || po.VLAN != 301 || !errors.Is(failed[orphan], poolroute.ErrNoParent) ||
		!strings.HasPrefix(po.Message, "VLAN 301: ") {
		t.Errorf("no parent: %+v, want VLANParentMissing", po)
	}

	eth0 := linkIndexOf(t, ns.MustIP(t, "-o", "link", "show", "eth0"))
	name := poolroute.VLANName(eth0, 300)
	ns.MustIP(t, "link", "add", name, "type", "veth", "peer", "name", "eth7")
	before := ns.MustIP(t, "-d", "-o", "link", "show", name)
	failed, st = k.ensure(logr.Discard(), []netip.Addr{a}, hints)
	if len(st.Problems) != 1 || st.Problems[0].Reason != v1.ReasonVLANForeignLink || st.Problems[0].Link != name ||
		!errors.Is(failed[a], poolroute.ErrForeignVLAN) {
		t.Errorf("foreign link: status %+v, want VLANForeignLink naming %s", st, name)
	}
	if after := ns.MustIP(t, "-d", "-o", "link", "show", name); after != before {
		t.Errorf("foreign link changed:\nbefore: %s\nafter:  %s", before, after)
	}
}

// linkIndexOf parses the index of `ip -o link show` output ("7: eth0@...").
func linkIndexOf(t *testing.T, out string) int {
	t.Helper()
	var i int
	if _, err := fmt.Sscanf(out, "%d:", &i); err != nil {
		t.Fatalf("link index of %q: %v", out, err)
	}
	return i
}
