package v1alpha1_test

import (
	"context"
	"encoding/json"
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// setStatus writes an Egress's status through the status subresource.
func setStatus(t *testing.T, eg *v1.Egress, ip, node string, ready metav1.ConditionStatus) {
	t.Helper()
	eg.Status.EgressIP = ip
	eg.Status.EgressNode = node
	meta.SetStatusCondition(&eg.Status.Conditions, metav1.Condition{
		Type: v1.ConditionReady, Status: ready, Reason: "Test", Message: "set by test", ObservedGeneration: eg.Generation,
	})
	if err := env.Client.Status().Update(context.Background(), eg); err != nil {
		t.Fatalf("update status of %s: %v", eg.Name, err)
	}
}

// TestEgressNodeFieldSelector lists Egresses with a field selector on
// status.egressNode, as an agent does to see only its own Node's Egresses.
func TestEgressNodeFieldSelector(t *testing.T) {
	ctx := context.Background()
	nodes := map[string]string{"fs-a": "node-1", "fs-b": "node-2", "fs-c": "node-1", "fs-d": ""}
	for name, node := range nodes {
		eg := egress(name, "office-egress", "")
		if err := env.Client.Create(ctx, eg); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = env.Client.Delete(context.Background(), eg) })
		if node != "" {
			setStatus(t, eg, "192.0.2.7", node, metav1.ConditionTrue)
		}
	}
	for node, want := range map[string][]string{"node-1": {"fs-a", "fs-c"}, "node-2": {"fs-b"}, "node-3": nil} {
		var list v1.EgressList
		sel := fields.OneTermEqualSelector(v1.EgressNodeField, node)
		if err := env.Client.List(ctx, &list, client.MatchingFieldsSelector{Selector: sel}); err != nil {
			t.Fatalf("list with %s: %v", sel, err)
		}
		var got []string
		for _, eg := range list.Items {
			got = append(got, eg.Name)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("field selector %s (-want +got):\n%s", sel, diff)
		}
	}
}

// table asks the API server for the server-side printed table of a
// resource, which is what kubectl get shows.
func table(t *testing.T, resource string, wide bool) *metav1.Table {
	t.Helper()
	cfg := rest.CopyConfig(env.Config)
	cfg.GroupVersion = &v1.GroupVersion
	cfg.APIPath = "/apis"
	cfg.NegotiatedSerializer = serializerFor()
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	req := rc.Get().Resource(resource).SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	if wide {
		req = req.Param("includeObject", "None")
	}
	raw, err := req.DoRaw(context.Background())
	if err != nil {
		t.Fatalf("get %s as table: %v", resource, err)
	}
	var tb metav1.Table
	if err := json.Unmarshal(raw, &tb); err != nil {
		t.Fatal(err)
	}
	return &tb
}

// TestPrinterColumns checks what `kubectl get egress` and `kubectl get eip`
// print, from the API server's table rendering.
func TestPrinterColumns(t *testing.T) {
	ctx := context.Background()
	eg := egress("columns", "office-egress", "")
	eg.Spec.DestinationCIDRs = []v1.DestinationCIDR{"198.51.100.0/24", "2001:db8:1::/48"}
	if err := env.Client.Create(ctx, eg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), eg) })
	eg.Status.SelectedPods = new(int32(7))
	eg.Status.PublicIP = "203.0.113.7"
	setStatus(t, eg, "192.0.2.5", "worker-3", metav1.ConditionTrue)

	p := pool("columns", nil, cidr("192.0.2.0/28"))
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), p) })
	p.Status.Usage = v1.IPPoolUsage{Total: 14, TotalText: "14", Used: 2}
	p.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue, Reason: "Valid", Message: "ok", LastTransitionTime: metav1.Now()}}
	if err := env.Client.Status().Update(ctx, p); err != nil {
		t.Fatal(err)
	}

	// A /64: Total saturates, TOTAL shows the readable figure.
	v6 := pool("columns-v6", nil, cidr("2001:db8:0:64::/64"))
	if err := env.Client.Create(ctx, v6); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), v6) })
	v6.Status.Usage = v1.IPPoolUsage{Total: math.MaxInt64, TotalText: "~2^64", Used: 1}
	if err := env.Client.Status().Update(ctx, v6); err != nil {
		t.Fatal(err)
	}

	check := func(resource, name string, wantCols []string, wantCells map[string]any, wideCols []string) {
		tb := table(t, resource, false)
		var cols, wide []string
		for _, c := range tb.ColumnDefinitions {
			if c.Priority == 0 {
				cols = append(cols, c.Name)
			} else {
				wide = append(wide, c.Name)
			}
		}
		if diff := cmp.Diff(wantCols, cols); diff != "" {
			t.Errorf("%s default columns (-want +got):\n%s", resource, diff)
		}
		if diff := cmp.Diff(wideCols, wide); diff != "" {
			t.Errorf("%s -o wide extra columns (-want +got):\n%s", resource, diff)
		}
		found := false
		for _, row := range tb.Rows {
			if row.Cells[0] != name {
				continue
			}
			found = true
			for i, c := range tb.ColumnDefinitions {
				if want, ok := wantCells[c.Name]; ok && row.Cells[i] != want {
					t.Errorf("%s %s column %s = %v, want %v", resource, name, c.Name, row.Cells[i], want)
				}
			}
		}
		if !found {
			t.Errorf("%s: no row for %s", resource, name)
		}
	}
	// A multi-IP Egress: EGRESS-IP and NODE show its first IP that has a
	// Node, READY-IPS how many of its IPs are Ready. (The API server's table
	// prints only the first match of a JSONPath like .status.ips[*].ip, so
	// no column lists them all; kubectl get -o yaml does.)
	m := &v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: "columns-multi"}, Spec: v1.EgressSpec{
		AppliedTo: eg.Spec.AppliedTo, IPs: []v1.EgressIPSource{{Pool: "office-egress", Count: new(int32(3))}}}}
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), m) })
	m.Status.IPs = []v1.EgressIPStatus{
		{IP: "192.0.2.5", Pool: "office-egress", Node: "worker-1", Zone: "a", Ready: true},
		{IP: "192.0.2.6", Pool: "office-egress", Node: "worker-2", Zone: "b", Ready: true},
		{IP: "192.0.2.7", Pool: "office-egress", Reason: v1.ReasonFewerNodesThanIPs},
	}
	m.Status.ReadyIPs = "2/3"
	setStatus(t, m, "192.0.2.5", "worker-1", metav1.ConditionTrue)

	egressCols := []string{"Name", "Egress-IP", "Node", "Ready", "Ready-IPs", "Age"}
	egressWide := []string{"Pool", "Failure-Policy", "Pods", "Destinations", "Public-IP"}
	check("egresses", "columns-multi", egressCols, map[string]any{"Egress-IP": "192.0.2.5", "Node": "worker-1",
		"Ready": "True", "Ready-IPs": "2/3", "Pool": nil}, egressWide)
	check("egresses", "columns", egressCols,
		map[string]any{"Egress-IP": "192.0.2.5", "Node": "worker-3", "Ready": "True", "Pool": "office-egress", "Failure-Policy": "Fail", "Pods": float64(7), "Public-IP": "203.0.113.7",
			"Destinations": `["198.51.100.0/24","2001:db8:1::/48"]`, "Ready-IPs": nil}, egressWide)
	check("externalippools", "columns", []string{"Name", "Total", "Used", "Ready", "Age"},
		map[string]any{"Total": "14", "Used": float64(2), "Ready": "True"}, nil)
	check("externalippools", "columns-v6", []string{"Name", "Total", "Used", "Ready", "Age"},
		map[string]any{"Total": "~2^64", "Used": float64(1)}, nil)
}

func serializerFor() runtime.NegotiatedSerializer {
	return serializer.NewCodecFactory(env.Scheme).WithoutConversion()
}
