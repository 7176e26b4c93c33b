package agent

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent/bind"
)

func eg(name, pool, ip, node string) v1alpha1.Egress {
	return v1alpha1.Egress{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       v1alpha1.EgressSpec{ExternalIPPool: pool},
		Status:     v1alpha1.EgressStatus{EgressIP: ip, EgressNode: node},
	}
}

func pool(name, gw string, plen, vlan int32, ranges ...string) v1alpha1.ExternalIPPool {
	p := v1alpha1.ExternalIPPool{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if gw != "" {
		p.Spec.SubnetInfo = &v1alpha1.SubnetInfo{Gateway: gw, PrefixLength: plen, VLAN: vlan}
	}
	for _, r := range ranges {
		p.Spec.IPRanges = append(p.Spec.IPRanges, v1alpha1.IPRange{CIDR: r})
	}
	return p
}

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, 0, len(s))
	for _, x := range s {
		out = append(out, netip.MustParseAddr(x))
	}
	return out
}

func TestComputeDesired(t *testing.T) {
	pools := []v1alpha1.ExternalIPPool{
		pool("v4", "192.0.2.1", 24, 0, "192.0.2.0/24"),
		pool("v4vlan", "198.51.100.1", 25, 20, "198.51.100.0/25"),
		pool("v6", "2001:db8::1", 64, 0, "2001:db8::/64"),
		pool("plain", "", 0, 0, "10.0.0.0/24", "192.0.2.0/24", "198.51.100.0/24"),
		pool("badgw", "not-an-ip", 24, 0, "192.0.2.0/24"),
		func() v1alpha1.ExternalIPPool {
			p := pool("cloud", "", 0, 0)
			p.Spec.Cloud = &v1alpha1.CloudPool{Provider: v1alpha1.CloudProviderAWS, AWS: &v1alpha1.AWSPool{SubnetID: "subnet-01234567"}}
			return p
		}(),
	}
	tests := []struct {
		name    string
		egs     []v1alpha1.Egress
		want    []netip.Addr
		hints   map[netip.Addr]bind.Hint
		skipped []string
		refused map[string][]string // IP -> Egresses
	}{
		{
			name: "cloud address: the interface MAC from the status, with the pool's subnet",
			egs: func() []v1alpha1.Egress {
				e := eg("cloud", "v4", "192.0.2.30", "n1")
				e.Status.InterfaceMAC = "0a:1b:2c:3d:4e:5f"
				f := eg("cloud2", "plain", "10.0.0.30", "n1")
				f.Status.InterfaceMAC = "0a:1b:2c:3d:4e:60"
				return []v1alpha1.Egress{e, f}
			}(),
			want: addrs("10.0.0.30", "192.0.2.30"),
			hints: map[netip.Addr]bind.Hint{
				netip.MustParseAddr("192.0.2.30"): {MAC: "0a:1b:2c:3d:4e:5f", Subnet: netip.MustParsePrefix("192.0.2.0/24")},
				netip.MustParseAddr("10.0.0.30"):  {MAC: "0a:1b:2c:3d:4e:60"},
			},
		},
		{name: "nothing assigned", egs: nil, want: nil, hints: map[netip.Addr]bind.Hint{}},
		{
			name: "only this node, unassigned and other nodes ignored",
			egs: []v1alpha1.Egress{
				eg("a", "v4", "192.0.2.10", "n1"),
				eg("b", "v4", "192.0.2.11", "n2"),
				eg("c", "v4", "192.0.2.12", ""),
				eg("d", "v4", "", "n1"),
			},
			want:  addrs("192.0.2.10"),
			hints: map[netip.Addr]bind.Hint{netip.MustParseAddr("192.0.2.10"): {Subnet: netip.MustParsePrefix("192.0.2.0/24")}},
		},
		{
			name: "shared IP bound once, sorted, both families",
			egs: []v1alpha1.Egress{
				eg("z", "v6", "2001:db8::5", "n1"),
				eg("y", "v4", "192.0.2.20", "n1"),
				eg("x", "v4", "192.0.2.20", "n1"),
				eg("w", "plain", "192.0.2.3", "n1"),
			},
			want: addrs("192.0.2.3", "192.0.2.20", "2001:db8::5"),
			hints: map[netip.Addr]bind.Hint{
				netip.MustParseAddr("192.0.2.20"):  {Subnet: netip.MustParsePrefix("192.0.2.0/24")},
				netip.MustParseAddr("2001:db8::5"): {Subnet: netip.MustParsePrefix("2001:db8::/64")},
			},
		},
		{
			name: "VLAN and masked subnet from the gateway",
			egs:  []v1alpha1.Egress{eg("a", "v4vlan", "198.51.100.9", "n1")},
			want: addrs("198.51.100.9"),
			hints: map[netip.Addr]bind.Hint{
				netip.MustParseAddr("198.51.100.9"): {Subnet: netip.MustParsePrefix("198.51.100.0/25"), VLAN: 20},
			},
		},
		{
			name: "unknown pool, invalid pool and family mismatch are refused",
			egs: []v1alpha1.Egress{
				eg("a", "gone", "192.0.2.30", "n1"),
				eg("b", "badgw", "192.0.2.31", "n1"),
				eg("c", "v6", "192.0.2.32", "n1"),
			},
			want:    nil,
			hints:   map[netip.Addr]bind.Hint{},
			skipped: []string{"a", "b", "c"},
			refused: map[string][]string{"192.0.2.30": {"a"}, "192.0.2.31": {"b"}, "192.0.2.32": {"c"}},
		},
		{
			name: "shared IP takes the hint of the first Egress by name that has one",
			egs: []v1alpha1.Egress{
				eg("b", "v4vlan", "198.51.100.9", "n1"),
				eg("a", "plain", "198.51.100.9", "n1"),
				eg("c", "v4vlan", "198.51.100.9", "n1"),
			},
			want:  addrs("198.51.100.9"),
			hints: map[netip.Addr]bind.Hint{netip.MustParseAddr("198.51.100.9"): {Subnet: netip.MustParsePrefix("198.51.100.0/25"), VLAN: 20}},
		},
		{
			// issue 15 fault 3: a status written by hand outside the pool,
			// a status that is not the named address, a reserved address
			// and an unattached cloud address are not bound but reported.
			name: "status outside the allocation is refused, one valid asker is enough",
			egs: func() []v1alpha1.Egress {
				named := eg("named", "v4", "192.0.2.60", "n1")
				named.Spec.EgressIP = "192.0.2.61"
				share := eg("share-bad", "v6", "192.0.2.70", "n1") // other family: invalid
				cloudOK := eg("cloud-ok", "cloud", "10.1.0.5", "n1")
				cloudOK.Status.InterfaceMAC = "0a:1b:2c:3d:4e:5f"
				return []v1alpha1.Egress{
					eg("outside", "v4", "8.8.8.8", "n1"), named, eg("network", "v4", "192.0.2.0", "n1"),
					eg("cloud-unattached", "cloud", "10.1.0.6", "n1"), cloudOK,
					share, eg("share-ok", "v4", "192.0.2.70", "n1"),
				}
			}(),
			want: addrs("10.1.0.5", "192.0.2.70"),
			hints: map[netip.Addr]bind.Hint{
				netip.MustParseAddr("10.1.0.5"):   {MAC: "0a:1b:2c:3d:4e:5f"},
				netip.MustParseAddr("192.0.2.70"): {Subnet: netip.MustParsePrefix("192.0.2.0/24")},
			},
			skipped: []string{"cloud-unattached", "named", "network", "outside", "share-bad"},
			refused: map[string][]string{"8.8.8.8": {"outside"}, "192.0.2.60": {"named"}, "192.0.2.0": {"network"}, "10.1.0.6": {"cloud-unattached"}},
		},
		{
			name:    "unparsable status.egressIP is skipped and explained",
			egs:     []v1alpha1.Egress{eg("bad", "v4", "192.0.2.300", "n1"), eg("zone", "v6", "fe80::1%eth0", "n1"), eg("ok", "v4", "192.0.2.40", "n1")},
			want:    addrs("192.0.2.40"),
			hints:   map[netip.Addr]bind.Hint{netip.MustParseAddr("192.0.2.40"): {Subnet: netip.MustParsePrefix("192.0.2.0/24")}},
			skipped: []string{"bad", "zone"},
		},
		{
			name:  "IPv4-mapped IPv6 is unmapped",
			egs:   []v1alpha1.Egress{eg("m", "plain", "::ffff:192.0.2.50", "n1")},
			want:  addrs("192.0.2.50"),
			hints: map[netip.Addr]bind.Hint{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := computeDesired("n1", tc.egs, pools)
			if !slices.Equal(d.ips, tc.want) {
				t.Errorf("ips = %v, want %v", d.ips, tc.want)
			}
			if len(d.want) != len(tc.want) {
				t.Errorf("want set has %d entries, want %d", len(d.want), len(tc.want))
			}
			for _, ip := range tc.want {
				if !d.want[ip] {
					t.Errorf("want set misses %s", ip)
				}
			}
			if len(d.hints) != len(tc.hints) {
				t.Errorf("hints = %v, want %v", d.hints, tc.hints)
			}
			for ip, h := range tc.hints {
				if d.hints[ip] != h {
					t.Errorf("hint for %s = %+v, want %+v", ip, d.hints[ip], h)
				}
			}
			var skipped []string
			for _, s := range d.skipped {
				skipped = append(skipped, s.name)
				if s.reason == "" {
					t.Errorf("skipped %s without a reason", s.name)
				}
			}
			if !slices.Equal(skipped, tc.skipped) {
				t.Errorf("skipped = %v, want %v", skipped, tc.skipped)
			}
			refused := map[string][]string{}
			for i, r := range d.refused {
				refused[r.IP.String()] = r.Egresses
				if r.Message == "" {
					t.Errorf("refused %s without a message", r.IP)
				}
				if i > 0 && d.refused[i-1].IP.Compare(r.IP) >= 0 {
					t.Errorf("refused not sorted: %v", d.refused)
				}
			}
			if len(refused) != len(tc.refused) {
				t.Errorf("refused = %v, want %v", refused, tc.refused)
			}
			for ip, names := range tc.refused {
				if !slices.Equal(refused[ip], names) {
					t.Errorf("refused[%s] = %v, want %v", ip, refused[ip], names)
				}
			}

			// The result does not depend on the order of the Egresses.
			rev := slices.Clone(tc.egs)
			slices.Reverse(rev)
			d2 := computeDesired("n1", rev, pools)
			if !slices.Equal(d2.ips, d.ips) || len(d2.hints) != len(d.hints) {
				t.Fatalf("reversed input: ips %v hints %v, want %v %v", d2.ips, d2.hints, d.ips, d.hints)
			}
			for ip, h := range d.hints {
				if d2.hints[ip] != h {
					t.Errorf("reversed input: hint for %s = %+v, want %+v", ip, d2.hints[ip], h)
				}
			}
		})
	}
}

func TestResolveNodeName(t *testing.T) {
	env := func(v string) func(string) string {
		return func(k string) string {
			if k == NodeNameEnv {
				return v
			}
			return ""
		}
	}
	if got, err := ResolveNodeName("flag-node", env("env-node")); err != nil || got != "flag-node" {
		t.Errorf("flag and env: got %q, %v; want the flag", got, err)
	}
	if got, err := ResolveNodeName("", env("env-node")); err != nil || got != "env-node" {
		t.Errorf("env only: got %q, %v; want the env", got, err)
	}
	got, err := ResolveNodeName("", env(""))
	if err == nil {
		t.Fatalf("neither set: got %q, want an error", got)
	}
	for _, want := range []string{"--node-name", NodeNameEnv} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %s", err, want)
		}
	}
}

// TestCacheOptionsEveryEgress: the binding agent caches every Egress
// (the holders of a multi-IP Egress are in status.ips, which no field
// selector selects; the holder index picks this Node's), the Nodes
// stripped, managedFields dropped everywhere.
func TestCacheOptionsEveryEgress(t *testing.T) {
	o := CacheOptions("worker-3")
	if len(o.ByObject) != 1 {
		t.Fatalf("ByObject has %d entries, want 1 (Node)", len(o.ByObject))
	}
	for obj, by := range o.ByObject {
		if _, ok := obj.(*corev1.Node); !ok {
			t.Fatalf("ByObject restricts %T, want only *Node", obj)
		}
		if by.Transform == nil || by.Field != nil || by.Label != nil {
			t.Errorf("Node cache entry %+v, want a transform and no selector", by)
		}
	}
	if o.DefaultTransform == nil {
		t.Error("no default transform: managedFields would be cached")
	}
	if !o.ReaderFailOnMissingInformer {
		t.Error("reads of uncached types must fail, not start a cluster-wide informer")
	}
}

func TestRESTMapperNeedsNoAPIServer(t *testing.T) {
	m := RESTMapper()
	for kind, resource := range map[string]string{"Egress": "egresses", "ExternalIPPool": "externalippools"} {
		gvk := v1alpha1.GroupVersion.WithKind(kind)
		mp, err := m.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if mp.Resource.Resource != resource || mp.Resource.Group != "egressip.io" {
			t.Errorf("%s maps to %v, want egressip.io/%s", kind, mp.Resource, resource)
		}
		if mp.Scope.Name() != "root" {
			t.Errorf("%s scope %q, want root (cluster-scoped)", kind, mp.Scope.Name())
		}
	}
	if _, err := m.RESTMapping(v1alpha1.GroupVersion.WithKind("Pod").GroupKind(), "v1alpha1"); err == nil {
		t.Error("a kind the agent does not read is mapped")
	}
}

func TestDatapathCacheOptionsSelectOnlyThisNodesPods(t *testing.T) {
	o := DatapathCacheOptions("worker-3")
	var sawPod bool
	for obj, by := range o.ByObject {
		switch obj.(type) {
		case *corev1.Pod:
			sawPod = true
			if by.Field == nil || by.Field.String() != "spec.nodeName=worker-3" {
				t.Errorf("Pod field selector = %v, want spec.nodeName=worker-3", by.Field)
			}
			if by.Transform == nil {
				t.Error("Pods are cached unstripped")
			}
		case *v1alpha1.Egress:
			t.Error("with the datapath every Egress is needed; the Egress informer must not be restricted")
		}
	}
	if !sawPod {
		t.Fatal("Pods are not restricted to this Node")
	}
	if !o.ReaderFailOnMissingInformer {
		t.Error("reads of uncached types must fail, not start a cluster-wide informer")
	}
	m := DatapathRESTMapper()
	for _, gvk := range []schema.GroupVersionKind{
		v1alpha1.GroupVersion.WithKind("EgressMemberSlice"), corev1.SchemeGroupVersion.WithKind("Pod"),
		corev1.SchemeGroupVersion.WithKind("Node"), corev1.SchemeGroupVersion.WithKind("Namespace"),
	} {
		if _, err := m.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
			t.Errorf("%s: %v", gvk.Kind, err)
		}
	}
	if _, err := RESTMapper().RESTMapping(corev1.SchemeGroupVersion.WithKind("Pod").GroupKind(), "v1"); err == nil {
		t.Error("without the datapath, Pods are mapped")
	}
}
