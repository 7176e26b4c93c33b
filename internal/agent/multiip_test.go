package agent

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent/bind"
)

// multiEg is an Egress with spec.ips (one entry per pool given) and the
// status.ips entries given.
func multiEg(name string, pools []string, entries ...v1alpha1.EgressIPStatus) v1alpha1.Egress {
	e := v1alpha1.Egress{ObjectMeta: metav1.ObjectMeta{Name: name}}
	for _, p := range pools {
		e.Spec.IPs = append(e.Spec.IPs, v1alpha1.EgressIPSource{Pool: p})
	}
	e.Status.IPs = entries
	// As the controller writes it: the first held entry repeated.
	for _, x := range entries {
		if x.Node != "" {
			e.Status.EgressIP, e.Status.EgressNode = x.IP, x.Node
			break
		}
	}
	return e
}

func ipEntry(ip, pool, node string, ready bool) v1alpha1.EgressIPStatus {
	return v1alpha1.EgressIPStatus{IP: ip, Pool: pool, Node: node, Ready: ready}
}

// TestMultiIPComputeDesired: a Node binds exactly the status.ips entries
// that name it, each checked against its own entry's pool; the repeated
// status.egressIP/egressNode of a multi-IP Egress is not read.
func TestMultiIPComputeDesired(t *testing.T) {
	pools := []v1alpha1.ExternalIPPool{
		pool("a", "192.0.2.1", 24, 0, "192.0.2.0/25"),
		pool("b", "192.0.2.1", 24, 7, "192.0.2.128/25"),
		func() v1alpha1.ExternalIPPool {
			p := pool("cloud", "", 0, 0)
			p.Spec.Cloud = &v1alpha1.CloudPool{Provider: v1alpha1.CloudProviderAWS, AWS: &v1alpha1.AWSPool{SubnetID: "subnet-01234567"}}
			return p
		}(),
	}
	three := multiEg("three", []string{"a", "b"},
		ipEntry("192.0.2.10", "a", "n1", true), ipEntry("192.0.2.11", "a", "n2", true), ipEntry("192.0.2.130", "b", "n3", false))
	// n1 holds the first IP: status.egressNode names it too (repeated).
	if three.Status.EgressNode != "n1" {
		t.Fatalf("fixture: egressNode %q", three.Status.EgressNode)
	}
	cloud := multiEg("cloudy", []string{"cloud"}, ipEntry("10.1.0.5", "cloud", "n2", true), ipEntry("10.1.0.6", "cloud", "n3", false))
	cloud.Status.IPs[0].InterfaceMAC = "0a:1b:2c:3d:4e:5f"
	// An entry whose IP lies in another pool than its own, one naming a pool
	// spec.ips does not list, and one that is not an address.
	wrongPool := multiEg("wrong-pool", []string{"a", "b"}, ipEntry("192.0.2.131", "a", "n4", true))
	unlisted := multiEg("unlisted", []string{"a"}, ipEntry("192.0.2.132", "b", "n4", true))
	garbage := multiEg("garbage", []string{"a"}, ipEntry("not-an-ip", "a", "n4", true))

	egs := []v1alpha1.Egress{three, cloud, wrongPool, unlisted, garbage, eg("single", "a", "192.0.2.20", "n2")}
	for _, tc := range []struct {
		node    string
		want    []netip.Addr
		hints   map[netip.Addr]bind.Hint
		skipped []string // substrings of the reasons, in Egress name order
	}{
		{node: "n1", want: addrs("192.0.2.10"), hints: map[netip.Addr]bind.Hint{addrs("192.0.2.10")[0]: {Subnet: netip.MustParsePrefix("192.0.2.0/24")}}},
		{node: "n2", want: addrs("10.1.0.5", "192.0.2.11", "192.0.2.20"), hints: map[netip.Addr]bind.Hint{
			addrs("192.0.2.11")[0]: {Subnet: netip.MustParsePrefix("192.0.2.0/24")},
			addrs("192.0.2.20")[0]: {Subnet: netip.MustParsePrefix("192.0.2.0/24")},
			addrs("10.1.0.5")[0]:   {MAC: "0a:1b:2c:3d:4e:5f"},
		}},
		// Not Ready yet is still bound: readiness is what the report makes.
		// The cloud IP without an interfaceMAC is refused.
		{node: "n3", want: addrs("192.0.2.130"), hints: map[netip.Addr]bind.Hint{addrs("192.0.2.130")[0]: {Subnet: netip.MustParsePrefix("192.0.2.0/24"), VLAN: 7}},
			skipped: []string{"has no interfaceMAC"}},
		{node: "n4", want: nil, hints: map[netip.Addr]bind.Hint{},
			skipped: []string{`status.ips[0].ip "not-an-ip" is not an IP address`, "names ExternalIPPool \"b\", which spec.ips does not list", `cannot come from ExternalIPPool "a"`}},
	} {
		t.Run(tc.node, func(t *testing.T) {
			d := computeDesired(tc.node, egs, pools)
			if !slices.Equal(d.ips, tc.want) {
				t.Errorf("ips %v, want %v", d.ips, tc.want)
			}
			if len(d.hints) != len(tc.hints) {
				t.Errorf("hints %v, want %v", d.hints, tc.hints)
			}
			for ip, h := range tc.hints {
				if d.hints[ip] != h {
					t.Errorf("hint of %s: %+v, want %+v", ip, d.hints[ip], h)
				}
			}
			if len(d.skipped) != len(tc.skipped) {
				t.Fatalf("skipped %+v, want %d", d.skipped, len(tc.skipped))
			}
			for i, s := range d.skipped {
				if !strings.Contains(s.reason, tc.skipped[i]) {
					t.Errorf("skipped[%d] %q, want it to say %q", i, s.reason, tc.skipped[i])
				}
			}
		})
	}
}

// TestMultiIPHolderIndexAndArrival: the holder index names every Node of
// status.ips once (and status.egressNode), and an arrival of a multi-IP
// entry on a Node bumps that Node's IP.
func TestMultiIPHolderIndexAndArrival(t *testing.T) {
	e := multiEg("m", []string{"a"}, ipEntry("192.0.2.10", "a", "n1", true), ipEntry("192.0.2.11", "a", "n2", false), ipEntry("", "a", "", false))
	if got := holderIndexFunc(&e); !slices.Equal(got, []string{"n1", "n2"}) {
		t.Errorf("holder index %v, want [n1 n2]", got)
	}
	if ip, ok := assignedIP("n2", &e); !ok || ip != netip.MustParseAddr("192.0.2.11") {
		t.Errorf("assignedIP(n2) = %v %v, want 192.0.2.11", ip, ok)
	}
	moved := e.DeepCopy()
	moved.Status.IPs[1].Node, moved.Status.IPs[1].IP = "n3", "192.0.2.11"
	if ip, ok := arrival("n3", &e, moved, false); !ok || ip != netip.MustParseAddr("192.0.2.11") {
		t.Errorf("arrival on n3 = %v %v, want 192.0.2.11", ip, ok)
	}
	if _, ok := arrival("n1", &e, moved, false); ok {
		t.Error("an entry of another Node moving is an arrival on n1")
	}
}
