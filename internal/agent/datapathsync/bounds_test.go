package datapathsync

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent/datapath"
	"github.com/egressip/egressip/internal/testutil/netnstest"
)

// boundName returns a valid Kubernetes object name (DNS-1123 subdomain,
// labels of at most 63 bytes) of exactly n bytes (1 <= n <= 253), distinct
// for distinct i.
func boundName(i, n int) string {
	// The hex ID ends at the first 'z' (no hex digit), so names of one
	// length are distinct whenever they hold the whole ID.
	id := fmt.Sprintf("%xz", i)
	if n < len(id) {
		id = id[len(id)-n:]
	}
	b := []byte(id)
	for len(b) < n {
		if len(b)%63 == 62 && len(b) < n-1 {
			b = append(b, '.')
			continue
		}
		b = append(b, 'a'+byte(len(b)%26))
	}
	return string(b)
}

// boundKey is a label key at the API's bounds: a 253-byte DNS prefix, '/',
// and a 63-byte name.
var boundKey = boundName(0xbeef, 253) + "/" + strings.Repeat("k", 63)

// boundsInput generates the objects of one Node ("n1") at the API's
// bounds: egresses Egresses whose names have the lengths nameLen gives,
// each selecting one local Pod by a 63-byte label value (a 253+1+63-byte
// key) in a namespace matched by such a key too, roles cycling held here /
// held elsewhere / unassigned, families alternating; pools of 32 ranges;
// remote members of the held ones in full EgressMemberSlices (100 each,
// slicesPer per Egress); and cidrs /32 and /128 exclusions that do not merge.
func boundsInput(t *testing.T, egresses int, nameLen func(i int) int, slicesPer, cidrs int) stateInput {
	t.Helper()
	val := func(i int) string { return fmt.Sprintf("v%062d", i) }
	in := stateInput{Node: "n1"}
	in.Namespaces = []corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: boundName(1, 63), Labels: map[string]string{boundKey: val(0)}}}}
	for f, fam := range []string{"v4", "v6"} {
		pool := v1alpha1.ExternalIPPool{ObjectMeta: metav1.ObjectMeta{Name: boundName(2+f, 253)}}
		for r := range 32 {
			if fam == "v4" {
				pool.Spec.IPRanges = append(pool.Spec.IPRanges, v1alpha1.IPRange{CIDR: fmt.Sprintf("198.51.100.%d/32", r)})
			} else {
				pool.Spec.IPRanges = append(pool.Spec.IPRanges, v1alpha1.IPRange{Start: fmt.Sprintf("2001:db8:1::%x", 2*r), End: fmt.Sprintf("2001:db8:1::%x", 2*r+1)})
			}
		}
		in.Pools = append(in.Pools, pool)
	}
	in.Nodes = []corev1.Node{dpNode("n1", "192.0.2.11", "10.128.0.0/24"), dpNode("n2", "192.0.2.12", "10.128.1.0/24"), dpNode("n3", "2001:db8::13")}
	for i := range egresses {
		name := boundName(i, nameLen(i))
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			t.Fatalf("generated name %q is not valid: %v", name, errs)
		}
		v6 := i%2 == 1
		e := v1alpha1.Egress{
			ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(time.Unix(int64(1000+i), 0))},
			Spec: v1alpha1.EgressSpec{
				ExternalIPPool: in.Pools[i%2].Name,
				AppliedTo: v1alpha1.AppliedTo{
					NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{boundKey: val(0)}},
					PodSelector:       &metav1.LabelSelector{MatchLabels: map[string]string{boundKey: val(i + 1)}},
				},
			},
		}
		ip := netip.AddrFrom4([4]byte{198, 51, 100, byte(i % 32)})
		podIP := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		if v6 {
			ip = netip.MustParseAddr(fmt.Sprintf("2001:db8:1::%x", i%64))
			podIP = netip.MustParseAddr(fmt.Sprintf("fd00:10:244::%x", i))
		}
		switch i % 3 {
		case 0:
			e.Status.EgressIP, e.Status.EgressNode = ip.String(), "n1"
		case 1:
			e.Status.EgressIP, e.Status.EgressNode = ip.String(), "n2"
		}
		in.Egresses = append(in.Egresses, e)
		host := "192.0.2.11"
		if v6 {
			host = "2001:db8::11"
		}
		pod := dpPod(in.Namespaces[0].Name, boundName(i, 253), "n1", host, podIP.String())
		pod.Labels = map[string]string{boundKey: val(i + 1)}
		in.Pods = append(in.Pods, pod)
		if i%3 != 0 {
			continue
		}
		for s := range slicesPer {
			sl := v1alpha1.EgressMemberSlice{ObjectMeta: metav1.ObjectMeta{Name: boundName(i*1000+s, 253)}, Egress: name}
			for m := range 100 {
				n := (i*slicesPer+s)*100 + m
				if v6 {
					sl.Members = append(sl.Members, v1alpha1.EgressMember{PodIP: fmt.Sprintf("fd00:20::%x:%x", n>>16, n&0xffff), HostIP: "2001:db8::13"})
				} else {
					sl.Members = append(sl.Members, v1alpha1.EgressMember{PodIP: netip.AddrFrom4([4]byte{100, 64 + byte(n>>16), byte(n >> 8), byte(n)}).String(), HostIP: "192.0.2.12"})
				}
			}
			in.Slices = append(in.Slices, sl)
		}
	}
	for c := range cidrs {
		// Every other address, so that no two exclusions merge.
		in.CIDRs.ExcludeCIDRs = append(in.CIDRs.ExcludeCIDRs,
			netip.PrefixFrom(netip.AddrFrom4([4]byte{172, 16 + byte(c>>15), byte(c >> 7), byte(c<<1) & 0xfe}), 32),
			netip.MustParsePrefix(fmt.Sprintf("fd00:30::%x/128", 2*c)))
	}
	return in
}

// kernelSets reads every non-interval set of the datapath's table in ns as
// "key->value" lines, sorted, by set name.
func kernelSets(t *testing.T, ns *netnstest.NS) map[string][]string {
	t.Helper()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns.Handle)))
	if err != nil {
		t.Fatal(err)
	}
	tab := &nftables.Table{Family: nftables.TableFamilyINet, Name: datapath.DefaultConfig().TableName}
	sets, err := c.GetSets(tab)
	if err != nil {
		t.Fatalf("list sets: %v", err)
	}
	out := map[string][]string{}
	for _, s := range sets {
		if s.Interval {
			continue
		}
		els, err := c.GetSetElements(s)
		if err != nil {
			t.Fatalf("elements of %s: %v", s.Name, err)
		}
		lines := []string{}
		for _, e := range els {
			lines = append(lines, hex.EncodeToString(e.Key)+"->"+hex.EncodeToString(e.Val)+" "+e.Comment)
		}
		slices.Sort(lines)
		out[s.Name] = lines
	}
	return out
}

// planSets is kernelSets of a Plan.
func planSets(p datapath.Plan) map[string][]string {
	out := map[string][]string{}
	for _, sc := range p.NFT.Sets {
		if sc.Set.Interval {
			continue
		}
		lines := []string{}
		for _, e := range sc.Elements {
			lines = append(lines, hex.EncodeToString(e.Key)+"->"+hex.EncodeToString(e.Val)+" "+e.Comment)
		}
		slices.Sort(lines)
		out[sc.Set.Name] = lines
	}
	return out
}

// TestAtBoundsGeneratedStatesApply builds States from objects generated at
// every bound of the API (names of every length up to 253 bytes, label
// keys and values at their limits, pools of 32 ranges, full member slices,
// as many Egresses as Node-local IDs and more, thousands of exclusion
// CIDRs) and applies each to a real kernel: every one must program, the
// kernel's sets must equal the Plan's, a restarted process must reproduce
// the IDs, and a State past the ID bound must program every Egress that
// got an ID.
func TestAtBoundsGeneratedStatesApply(t *testing.T) {
	netnstest.RequireRoot(t)
	pair := netnstest.NewPair(t)
	pair.Node.MustIP(t, "addr", "add", "192.0.2.11/24", "dev", pair.NodeIf)
	ctx := context.Background()
	cfg := datapath.Config{Uplink: pair.NodeIf}
	d, err := datapath.New(cfg, pair.Node.Handle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	maxID := int(datapath.DefaultConfig().IDMask >> 16)

	cases := []struct {
		name     string
		in       stateInput
		tooMany  bool
		wantEgrs int
	}{
		{name: "every name length 1..253", in: boundsInput(t, 253, func(i int) int { return i + 1 }, 1, 16), wantEgrs: 253},
		{name: "longest names, most members", in: boundsInput(t, 30, func(int) int { return 253 }, 20, 16), wantEgrs: 30},
		{name: "most exclusion CIDRs", in: boundsInput(t, 6, func(int) int { return 253 }, 1, 20000), wantEgrs: 6},
		{name: "every Node-local ID", in: boundsInput(t, maxID, func(i int) int { return 200 + i%54 }, 0, 16), wantEgrs: maxID},
		{name: "past the ID bound", in: boundsInput(t, maxID+3, func(i int) int { return 253 - i%3 }, 0, 16), tooMany: true, wantEgrs: maxID + 3},
	}
	for _, c := range cases {
		st := computeState(c.in)
		if len(st.Egresses) != c.wantEgrs {
			t.Fatalf("%s: generated %d datapath Egresses, want %d", c.name, len(st.Egresses), c.wantEgrs)
		}
		start := time.Now()
		err := d.Apply(ctx, st)
		if c.tooMany != errors.Is(err, datapath.ErrTooManyEgresses) || (err != nil && !c.tooMany) {
			t.Fatalf("%s: Apply: %v", c.name, err)
		}
		took := time.Since(start)
		t.Logf("%s: %d Egresses, %d exclusions applied in %v", c.name, len(st.Egresses), len(c.in.CIDRs.ExcludeCIDRs), took)
		// One nftables transaction, expected well under a second: 60 s
		// fails only an Apply that stalls or grows out of all proportion.
		if bound := time.Minute; took > bound {
			t.Errorf("%s: Apply took %v, want under %v", c.name, took, bound)
		}
		ids := d.IDs()
		if len(ids) != min(c.wantEgrs, maxID) {
			t.Fatalf("%s: %d Egresses have an ID, want %d", c.name, len(ids), min(c.wantEgrs, maxID))
		}
		plan, _ := datapath.Build(d.Config(), st, ids)
		got, want := kernelSets(t, pair.Node), planSets(plan)
		for name, w := range want {
			if !slices.Equal(got[name], w) {
				t.Fatalf("%s: kernel set %s has %d elements, the Plan %d (first differing: %v)", c.name, name, len(got[name]), len(w), firstDiff(got[name], w))
			}
		}
		// A new process reads every ID back.
		d2, err := datapath.New(cfg, pair.Node.Handle)
		if err != nil {
			t.Fatal(err)
		}
		if err := d2.Apply(ctx, st); c.tooMany != errors.Is(err, datapath.ErrTooManyEgresses) {
			t.Fatalf("%s: Apply after restart: %v", c.name, err)
		}
		for n, id := range ids {
			if d2.IDs()[n] != id {
				t.Fatalf("%s: ID of %.30s... after restart = %d, want %d", c.name, n, d2.IDs()[n], id)
			}
		}
		_ = d2.Close()
	}
}

func firstDiff(a, b []string) string {
	for i := range max(len(a), len(b)) {
		if i >= len(a) || i >= len(b) || a[i] != b[i] {
			return fmt.Sprintf("index %d", i)
		}
	}
	return "none"
}
