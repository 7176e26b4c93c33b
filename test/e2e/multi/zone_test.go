package multi

import (
	"context"
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/test/e2e/harness"
)

// zoneAGateway is the label the zone-a pool selects (testdata/pools.yaml).
const zoneAGateway = "egress.example/zone-a-gateway"

// labelNode sets (value non-empty) or removes label key on Node name.
func labelNode(t *testing.T, name, key, value string) {
	t.Helper()
	ctx := context.Background()
	var n corev1.Node
	if err := c.Client.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
		t.Fatal(err)
	}
	p := client.MergeFrom(n.DeepCopy())
	if value == "" {
		delete(n.Labels, key)
	} else {
		n.Labels[key] = value
	}
	if err := c.Client.Patch(ctx, &n, p); err != nil {
		t.Fatalf("label Node %s %s=%q: %v", name, key, value, err)
	}
}

// sources makes k new connections from pods (round robin), each with a
// 500 ms budget, and counts them by source; failed ones count under the
// zero address.
func sources(pods []*harness.Pod, k int) map[netip.Addr]int {
	n := map[netip.Addr]int{}
	for i := range k {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		ip, err := c.Who(ctx, pods[i%len(pods)], false)
		cancel()
		if err != nil {
			ip = netip.Addr{}
		}
		n[ip]++
	}
	return n
}

// TestZonePreference: Nodes n1 and n2 in zone a, n3-n5 in zone b; pool
// zone-a may use n2 only, pool zone-b every Node; one Egress takes an IP
// from each, the zone-a one kept to zone a and the zone-b one to zone b.
//   - The Pods of n1 (zone a, holding no IP) leave with the zone-a IP: 20
//     of 20 new connections; those of a zone-b Node with the zone-b IP.
//   - Crash n2: zone a has no eligible Node, and n1's Pods leave with the
//     zone-b IP (the time from the crash is logged).
//   - Revive n2: once the zone-a IP is Ready again, new connections leave
//     with it (20 of 20), and the connections opened meanwhile on the
//     zone-b IP stay open on it.
func TestZonePreference(t *testing.T) {
	ctx := context.Background()
	n := c.Nodes
	for i, node := range n {
		zone := "b"
		if i < 2 {
			zone = "a"
		}
		labelNode(t, node.Name, corev1.LabelTopologyZone, zone)
		t.Cleanup(func() { labelNode(t, node.Name, corev1.LabelTopologyZone, "") })
	}
	labelNode(t, n[1].Name, zoneAGateway, "true")
	t.Cleanup(func() { labelNode(t, n[1].Name, zoneAGateway, "") })

	multiEgress(t, "zoned",
		v1.EgressIPSource{Pool: "zone-a", Zone: "a"},
		v1.EgressIPSource{Pool: "zone-b", Zone: "b", Count: ptr.To[int32](1)})
	e := waitIPs(t, "zoned", 30*time.Second, "both IPs Ready", func(e *v1.Egress) bool { return allReady(e, 2) })
	st := e.Status.IPs
	ipA, ipB := netip.MustParseAddr(st[0].IP), netip.MustParseAddr(st[1].IP)
	if st[0].Node != n[1].Name || st[0].Zone != "a" || st[1].Zone != "b" {
		t.Fatalf("want the zone-a IP on %s (zone a) and the zone-b IP in zone b: %s", n[1].Name, describeIPs(e))
	}
	podsA, podsB := podsOn(true, n[0].Name), podsOn(true, n[2].Name)

	// Source Nodes learn the zones and the Ready IPs from their watch.
	harness.WaitFor(ctx, 5*time.Second, func() bool { return sources(podsA, 1)[ipA] == 1 })
	if got := sources(podsA, 20); got[ipA] != 20 {
		t.Errorf("zone a, both IPs Ready: %s's Pods left with %v, want %s 20 of 20", n[0].Name, got, ipA)
	}
	if got := sources(podsB, 20); got[ipB] != 20 {
		t.Errorf("zone b: %s's Pods left with %v, want %s 20 of 20", n[2].Name, got, ipB)
	}

	crashed := time.Now()
	if err := c.CrashNode(n[1]); err != nil {
		t.Fatal(err)
	}
	revived := false
	t.Cleanup(func() {
		if !revived {
			_ = c.ReviveNode(n[1])
		}
	})
	if !harness.WaitFor(ctx, 20*time.Second, func() bool { return sources(podsA, 1)[ipB] == 1 }) {
		t.Fatalf("zone a without a Node: %s's Pods never left with %s: %v", n[0].Name, ipB, sources(podsA, 5))
	}
	tookFallback := time.Since(crashed)
	if got := sources(podsA, 20); got[ipB] != 20 {
		t.Errorf("zone a without a Node: %s's Pods left with %v, want %s 20 of 20", n[0].Name, got, ipB)
	}
	e = waitIPs(t, "zoned", 10*time.Second, "zone-a IP without a Node", func(e *v1.Egress) bool {
		return e.Status.ReadyIPs == "1/2" && e.Status.IPs[0].Node == ""
	})
	t.Logf("zone a without a Node: %s", describeIPs(e))
	during := openFlows(t, podsA, 1)
	for _, f := range during {
		if f.Source != ipB {
			t.Errorf("a connection opened while zone a has no Node left with %s, want %s", f.Source, ipB)
		}
	}

	if err := c.ReviveNode(n[1]); err != nil {
		t.Fatal(err)
	}
	revived = true
	back := time.Now()
	waitIPs(t, "zoned", 30*time.Second, "the zone-a IP Ready again", func(e *v1.Egress) bool { return allReady(e, 2) })
	harness.WaitFor(ctx, 5*time.Second, func() bool { return sources(podsA, 1)[ipA] == 1 })
	tookReturn := time.Since(back)
	if got := sources(podsA, 20); got[ipA] != 20 {
		t.Errorf("zone-a IP Ready again: %s's Pods left with %v, want %s 20 of 20", n[0].Name, got, ipA)
	}
	for _, f := range during {
		if err := f.Err(); err != nil {
			t.Errorf("a connection on the zone-b IP broke when the zone-a IP returned: %v", err)
		}
		if f.Echoes(back) == 0 {
			t.Errorf("a connection on the zone-b IP went silent when the zone-a IP returned: %s", f.Pod)
		}
	}
	t.Logf("zone a: crash of %s to %s's Pods leaving with the zone-b IP %s: %v; revival to new connections back on %s: %v; %d connections opened meanwhile stayed on %s",
		n[1].Name, n[0].Name, ipB, tookFallback, ipA, tookReturn, len(during), ipB)
}
