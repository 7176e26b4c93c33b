package controller

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// TestCollectorCountsEveryIPOfMultiIPEgresses: the per-Node gauge
// egressip_controller_node_assigned_ips counts each IP of status.ips on
// the Node that holds it, not only the first IP that egressIP/egressNode
// repeat (the fresh-user trial saw 0 on the Node holding a second IP).
func TestCollectorCountsEveryIPOfMultiIPEgresses(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := v1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	node := func(name string) *corev1.Node { return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}} }
	multi := &v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: "multi"}, Status: v1.EgressStatus{
		EgressIP: "192.0.2.10", EgressNode: "n1",
		IPs: []v1.EgressIPStatus{{IP: "192.0.2.10", Pool: "p", Node: "n1"}, {IP: "192.0.2.11", Pool: "p", Node: "n2"}, {IP: "192.0.2.12", Pool: "p"}}}}
	single := &v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: "single"}, Status: v1.EgressStatus{EgressIP: "192.0.2.20", EgressNode: "n2"}}
	reader := fake.NewClientBuilder().WithScheme(scheme).WithObjects(node("n1"), node("n2"), node("n3"), multi, single).Build()
	c := &stateCollector{}
	c.set(reader, 10)
	want := `
# HELP egressip_controller_node_assigned_ips Distinct egress IPs assigned to a Node.
# TYPE egressip_controller_node_assigned_ips gauge
egressip_controller_node_assigned_ips{node="n1"} 1
egressip_controller_node_assigned_ips{node="n2"} 2
egressip_controller_node_assigned_ips{node="n3"} 0
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "egressip_controller_node_assigned_ips"); err != nil {
		t.Error(err)
	}
}
