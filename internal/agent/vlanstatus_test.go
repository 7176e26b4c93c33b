package agent_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/report"
	"github.com/egressip/egressip/internal/testutil/poll"
)

// TestVLANOwnershipNodeStatus runs a whole agent with --create-vlans on a
// real namespace (the API server is envtest) and reads its report as the
// controller does. Two Egresses on pools with subnetInfo.vlan 100 and 200:
// a foreign link (a veth) holds the sub-interface name egressip would give
// VLAN 100 on the uplink, and this kernel refuses to create VLAN 200 (no
// 8021q). The report names both in its VLAN status (parent, VLAN ID, the
// foreign link, reasons VLANForeignLink and VLANLinkFailed) and refuses
// both IPs (the Egress condition BindRefused comes from that); the
// foreign link is left as it was; the untagged Egress beside them is
// bound.
func TestVLANOwnershipNodeStatus(t *testing.T) {
	env := apiServer(t)
	c := env.Client
	n := newTestNode(t)
	idx := linkIndex(t, n.Node.MustIP(t, "-o", "link", "show", n.NodeIf))
	foreign := fmt.Sprintf("egv%d.100", idx)
	n.Node.MustIP(t, "link", "add", foreign, "type", "veth", "peer", "name", "vlstpeer")
	before := n.Node.MustIP(t, "-d", "-o", "link", "show", foreign)

	p100 := createVLANPool(t, c, "198.51.100.48/28", "198.51.100.1", 24, 100)
	p200 := createVLANPool(t, c, "203.0.113.48/28", "203.0.113.1", 24, 200)
	plain := createPool(t, c, "192.0.2.48/28", "192.0.2.1", 24)
	createEgress(t, c, "vl100", p100, "198.51.100.50", n.name)
	createEgress(t, c, "vl200", p200, "203.0.113.50", n.name)
	createEgress(t, c, "plain", plain, "192.0.2.50", n.name)

	cfg := n.config()
	cfg.CreateVLANs = true
	r := startAgent(t, env.Config, n.name, newAgent(t, cfg))
	var rep report.Report
	poll.Until(t, 20*time.Second, "report names both VLAN problems", func() error {
		var err error
		if rep, err = r.report(ctx); err != nil {
			return err
		}
		if rep.VLANs == nil || len(rep.VLANs.Problems) != 2 {
			return fmt.Errorf("VLAN status %+v", rep.VLANs)
		}
		if _, ok := rep.Lookup(ip("192.0.2.50")); !ok {
			return fmt.Errorf("untagged IP not bound yet: %+v", rep.Bound)
		}
		return nil
	})
	p := rep.VLANs.Problems
	if p[0].IP != ip("198.51.100.50") || p[0].VLAN != 100 || p[0].Parent != n.NodeIf || p[0].Link != foreign ||
		p[0].Reason != v1alpha1.ReasonVLANForeignLink || !strings.Contains(p[0].Message, foreign) {
		t.Errorf("VLAN 100: %+v, want VLANForeignLink on %s naming %s", p[0], n.NodeIf, foreign)
	}
	if p[1].IP != ip("203.0.113.50") || p[1].VLAN != 200 || p[1].Parent != n.NodeIf || p[1].Link != "" ||
		p[1].Reason != v1alpha1.ReasonVLANLinkFailed || !strings.Contains(p[1].Message, fmt.Sprintf("create egv%d.200", idx)) {
		t.Errorf("VLAN 200: %+v, want VLANLinkFailed naming the sub-interface it tried to create", p[1])
	}
	t.Logf("VLAN status: %+v", rep.VLANs)
	for _, want := range []netip.Addr{ip("198.51.100.50"), ip("203.0.113.50")} {
		if rf, ok := rep.LookupRefused(want); !ok || !strings.Contains(rf.Message, "VLAN") {
			t.Errorf("%s: refused %v %q, want refused with the VLAN error", want, ok, rf.Message)
		}
	}
	if len(rep.Bound) != 1 || rep.Bound[0].Interface != n.NodeIf {
		t.Errorf("bound %+v, want only the untagged IP, on %s", rep.Bound, n.NodeIf)
	}
	if len(rep.VLANs.Links) != 0 {
		t.Errorf("links in place %v, want none", rep.VLANs.Links)
	}
	if err := wantReport(rep, n.NodeIf, rep.Bound[0].Announced, ip("192.0.2.50")); err != nil {
		t.Errorf("untagged Egress: %v", err)
	}
	if after := n.Node.MustIP(t, "-d", "-o", "link", "show", foreign); after != before {
		t.Errorf("foreign link changed:\nbefore: %s\nafter:  %s", before, after)
	}
}

// linkIndex parses the index of `ip -o link show` output ("7: eth0@...").
func linkIndex(t *testing.T, out string) int {
	t.Helper()
	var i int
	if _, err := fmt.Sscanf(out, "%d:", &i); err != nil {
		t.Fatalf("link index of %q: %v", out, err)
	}
	return i
}

// createVLANPool is createPool with subnetInfo.vlan.
func createVLANPool(t *testing.T, c client.Client, cidr, gateway string, prefixLen, vlan int32) string {
	t.Helper()
	p := &v1alpha1.ExternalIPPool{
		ObjectMeta: metav1.ObjectMeta{Name: uniq("pool")},
		Spec: v1alpha1.ExternalIPPoolSpec{
			IPRanges:   []v1alpha1.IPRange{{CIDR: cidr}},
			SubnetInfo: &v1alpha1.SubnetInfo{Gateway: gateway, PrefixLength: prefixLen, VLAN: vlan},
		},
	}
	if err := c.Create(context.Background(), p); err != nil {
		t.Fatalf("create pool: %v", err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), p) })
	return p.Name
}
