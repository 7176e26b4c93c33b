package webhook_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/testutil/poll"
)

// multi is an Egress with spec.ips.
func multi(name string, srcs ...v1.EgressIPSource) *v1.Egress {
	e := egress(name, "", "")
	e.Spec.IPs = srcs
	return e
}

func ips(pool string, count int32, addrs ...string) v1.EgressIPSource {
	s := v1.EgressIPSource{Pool: pool, Count: &count}
	for _, a := range addrs {
		s.Addresses = append(s.Addresses, v1.EgressIPAddress(a))
	}
	return s
}

// TestMultiIPEgressChecks: what CEL cannot see in spec.ips is refused here
// with a message naming the entry: pools of both families, more IPs than a
// pool has addresses (summed over its zones), named addresses outside their
// pool, a cloud-backed pool naming Elastic IPs; valid multi-IP Egresses,
// one with a cloud-backed pool, are admitted.
func TestMultiIPEgressChecks(t *testing.T) {
	create(t, pool("mip-v4", v1.IPRange{CIDR: "198.51.100.128/30"}), "") // 2 usable addresses
	create(t, pool("mip-v4b", v1.IPRange{CIDR: "198.51.100.160/28"}), "")
	create(t, pool("mip-v6", v1.IPRange{CIDR: "2001:db8:20::/120"}), "")

	create(t, multi("mip-ok", ips("mip-v4", 2), ips("mip-v4b", 1, "198.51.100.165")), "")
	create(t, multi("mip-family", ips("mip-v4", 1), ips("mip-v6", 1)),
		`spec.ips[1].pool: Invalid value: "mip-v6": ExternalIPPool "mip-v6" is IPv6 but "mip-v4" is IPv4: the IPs of one Egress are of one family`)
	create(t, multi("mip-too-many", ips("mip-v4", 3)),
		`spec.ips[0].count: Invalid value: 3: ExternalIPPool "mip-v4" has 2 addresses in all, and this Egress asks for 3 of them`)
	zoneA, zoneB := ips("mip-v4", 1), ips("mip-v4", 2)
	zoneA.Zone, zoneB.Zone = "mip-a", "mip-b"
	create(t, multi("mip-too-many-zones", zoneA, zoneB),
		`spec.ips[1].count: Invalid value: 2: ExternalIPPool "mip-v4" has 2 addresses in all, and this Egress asks for 3 of them`)
	create(t, multi("mip-outside", ips("mip-v4b", 1, "198.51.100.200")),
		`spec.ips[0].addresses[0]: Invalid value: "198.51.100.200": not usable from ExternalIPPool "mip-v4b"`)
	cloud := pool("mip-cloud")
	cloud.Spec.Cloud = &v1.CloudPool{Provider: v1.CloudProviderAWS, AWS: &v1.AWSPool{SubnetID: "subnet-0123456789abcdef0", InterfaceMode: v1.AWSPrimaryInterface}}
	create(t, cloud, "")
	create(t, multi("mip-cloud", ips("mip-v4", 1), ips("mip-cloud", 1)), "")
	create(t, multi("mip-cloud-v6", ips("mip-cloud", 1), ips("mip-v6", 1)),
		`spec.ips[1].pool: Invalid value: "mip-v6": ExternalIPPool "mip-v6" is IPv6 but "mip-cloud" is IPv4`)
	eip := pool("mip-cloud-eip")
	eip.Spec.Cloud = &v1.CloudPool{Provider: v1.CloudProviderAWS, AWS: &v1.AWSPool{SubnetID: "subnet-0123456789abcdef1", InterfaceMode: v1.AWSPrimaryInterface,
		ElasticIPs: &v1.ElasticIPs{AllocationIDs: []string{"eipalloc-0123456789abcdef0"}}}}
	create(t, eip, "")
	create(t, multi("mip-cloud-eip", ips("mip-cloud", 1), ips("mip-cloud-eip", 1)),
		`spec.ips[1].pool: Invalid value: "mip-cloud-eip": ExternalIPPool "mip-cloud-eip" names Elastic IPs (spec.cloud.aws.elasticIPs), which are associated per Egress (status.publicIP), not per IP`)
}

// TestZoneWithoutNodesWarns: a zone no Node carries, and a zone with fewer
// Nodes than the IPs asked of it, are admitted with a warning.
func TestZoneWithoutNodesWarns(t *testing.T) {
	c, w := warningClient(t)
	ctx := context.Background()
	create(t, pool("zone-pool", v1.IPRange{CIDR: "198.51.100.192/28"}), "")
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "zone-w1", Labels: map[string]string{corev1.LabelTopologyZone: "zw-one"}}}
	if err := c.Create(ctx, n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), n) })
	for _, tc := range []struct{ zone, want string }{
		{"zw-none", "no Node has topology.kubernetes.io/zone=zw-none (spec.ips[0].zone): those IPs stay unplaced until one does"},
		{"zw-one", "spec.ips[0] asks for 2 IPs in zone zw-one, which has 1 Nodes"},
	} {
		s := ips("zone-pool", 2)
		s.Zone = tc.zone
		var ws []string
		// The webhook's cache may not have the Node yet: retried for up to
		// 20 s, 200 ms apart; the last warnings are judged below.
		_ = poll.Wait(ctx, 200*time.Millisecond, 20*time.Second, func() error {
			e := multi("zone-"+tc.zone, s)
			if err := c.Create(ctx, e); err != nil {
				t.Fatalf("create %s: %v", e.Name, err)
			}
			_ = c.Delete(ctx, e)
			if ws = w.take(); !containsWarning(ws, tc.want) {
				return fmt.Errorf("warnings %q", ws)
			}
			return nil
		})
		if !containsWarning(ws, tc.want) {
			t.Errorf("zone %s: warnings %q, want one containing %q", tc.zone, ws, tc.want)
		}
	}
}
