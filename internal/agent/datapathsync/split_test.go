package datapathsync

import (
	"net/netip"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent/datapath"
	"github.com/egressip/egressip/internal/destinations"
)

// TestDestinationsState: the scenario as the agent of the Pod's
// Node n1 computes it. Pod P (namespace pay) is selected by A (newer,
// destinations 198.51.100.0/24, held by n2) and B (every destination but
// 203.0.113.0/25, held by n3): P is a local member of both, in one Split
// whose spans give 198.51.100.10 to A, 203.0.113.200 to B and
// 203.0.113.10 to nobody. On n2, which holds A and C, a remote member in
// both slices is a remote Split over A and C alone; a remote member in one
// slice is a plain remote member.
func TestDestinationsState(t *testing.T) {
	nss := []corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "pay", Labels: map[string]string{"team": "pay"}}}}
	egA := dpEgress("a", 5, "192.0.2.100", "n2", "", "pay")
	egA.Spec.DestinationCIDRs = []v1alpha1.DestinationCIDR{"198.51.100.0/24"}
	egB := dpEgress("b", 1, "192.0.2.101", "n3", "", "pay")
	egB.Spec.ExcludedCIDRs = []v1alpha1.DestinationCIDR{"203.0.113.0/25"}
	egC := dpEgress("c", 2, "192.0.2.102", "n2", "", "nobody")
	nodes := []corev1.Node{dpNode("n1", "192.0.2.11", "10.1.0.0/24"), dpNode("n2", "192.0.2.12", "10.2.0.0/24"), dpNode("n3", "192.0.2.13", "10.3.0.0/24")}
	pods := []corev1.Pod{dpPod("pay", "p", "n1", "192.0.2.11", "10.1.0.5")}

	st := computeState(stateInput{Node: "n1", Egresses: []v1alpha1.Egress{egA, egB, egC}, Namespaces: nss, Pods: pods, Nodes: nodes})
	for _, name := range []string{"a", "b"} {
		i := slices.IndexFunc(st.Egresses, func(e datapath.Egress) bool { return e.Name == name })
		if i < 0 || !slices.Contains(st.Egresses[i].Local, a("10.1.0.5")) || st.Egresses[i].Role != datapath.RoleSource {
			t.Fatalf("P is not a sourced local member of %s: %+v", name, st.Egresses)
		}
	}
	if len(st.Splits) != 1 || st.Splits[0].Remote || !slices.Equal(st.Splits[0].IPs, []netip.Addr{a("10.1.0.5")}) {
		t.Fatalf("splits %+v, want one local Split of 10.1.0.5", st.Splits)
	}
	for d, want := range map[string]string{"198.51.100.10": "a", "203.0.113.200": "b", "203.0.113.10": ""} {
		if got := destinations.Lookup(st.Splits[0].Spans, a(d)); got != want {
			t.Errorf("P -> %s uses %q, want %q", d, got, want)
		}
	}
	again := computeState(stateInput{Node: "n1", Egresses: []v1alpha1.Egress{egC, egB, egA}, Namespaces: nss, Pods: pods, Nodes: nodes})
	if !stateEqual(st, again) {
		t.Errorf("the order of the Egresses changes the State")
	}

	// n2 holds a and c; 10.1.0.5 is in both slices, 10.3.0.7 in a's only.
	egC.Spec.DestinationCIDRs = []v1alpha1.DestinationCIDR{"198.51.100.128/25"}
	memberSlices := []v1alpha1.EgressMemberSlice{
		{Egress: "a", Members: []v1alpha1.EgressMember{{PodIP: "10.1.0.5", HostIP: "192.0.2.11"}, {PodIP: "10.3.0.7", HostIP: "192.0.2.13"}}},
		{Egress: "c", Members: []v1alpha1.EgressMember{{PodIP: "10.1.0.5", HostIP: "192.0.2.11"}}},
	}
	st2 := computeState(stateInput{Node: "n2", Egresses: []v1alpha1.Egress{egA, egB, egC}, Namespaces: nss, Slices: memberSlices, Nodes: nodes})
	if len(st2.Splits) != 1 || !st2.Splits[0].Remote || !slices.Equal(st2.Splits[0].IPs, []netip.Addr{a("10.1.0.5")}) {
		t.Fatalf("n2 splits %+v, want one remote Split of 10.1.0.5", st2.Splits)
	}
	for d, want := range map[string]string{"198.51.100.10": "a", "198.51.100.200": "c", "203.0.113.10": ""} {
		if got := destinations.Lookup(st2.Splits[0].Spans, a(d)); got != want {
			t.Errorf("n2: remote P -> %s uses %q, want %q", d, got, want)
		}
	}
}
