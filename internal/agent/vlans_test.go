package agent

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/go-logr/logr"

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
	failed := k.ensure(logr.Discard(), []netip.Addr{tagged, plain}, hints)
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
	e = k2.ensure(logr.Discard(), []netip.Addr{tagged}, hints)[tagged]
	if !errors.Is(e, poolroute.ErrNoParent) || !strings.Contains(e.Error(), `"bond7"`) {
		t.Errorf("missing parent: %v, want ErrNoParent naming bond7", e)
	}
}
