package datapathsync

import (
	"net/netip"

	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent/datapath"
)

// TestMultiIPComputeState: an Egress with spec.ips gets its IPs from
// status.ips on every Node (not the repeated status.egressIP): the holder
// of one is RoleEgress with the other Nodes' members as remote, a Node
// with members is RoleSource over the usable IPs, those of its own zone
// while one is Ready there, every Ready one otherwise, and RoleFailed when
// none is Ready.
func TestMultiIPComputeState(t *testing.T) {
	nss := []corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "pay", Labels: map[string]string{"team": "pay"}}}}
	eg := dpEgress("multi", 0, "192.0.2.201", "n1", "", "pay")
	eg.Spec.IPs = []v1alpha1.EgressIPSource{{Pool: "pa", Zone: "a"}, {Pool: "pb", Zone: "b"}}
	eg.Status.IPs = []v1alpha1.EgressIPStatus{
		{IP: "192.0.2.201", Pool: "pa", Node: "n1", Zone: "a", Ready: true},
		{IP: "192.0.2.202", Pool: "pb", Node: "n2", Zone: "b", Ready: true},
		{IP: "192.0.2.203", Pool: "pb", Node: "n4", Zone: "b", Ready: false},
	}
	zoned := func(n corev1.Node, z string) corev1.Node { n.Labels = map[string]string{ZoneLabel: z}; return n }
	nodes := []corev1.Node{
		zoned(dpNode("n1", "10.0.0.1", "10.244.1.0/24"), "a"), zoned(dpNode("n2", "10.0.0.2", "10.244.2.0/24"), "b"),
		zoned(dpNode("n3", "10.0.0.3", "10.244.3.0/24"), "a"), dpNode("n5", "10.0.0.5", "10.244.5.0/24"),
	}
	pods := []corev1.Pod{dpPod("pay", "p3", "n3", "10.0.0.3", "10.244.3.5"), dpPod("pay", "p5", "n5", "10.0.0.5", "10.244.5.5")}
	slices := []v1alpha1.EgressMemberSlice{{ObjectMeta: metav1.ObjectMeta{Name: "multi-1"}, Egress: "multi",
		Members: []v1alpha1.EgressMember{{PodIP: "10.244.3.5", HostIP: "10.0.0.3"}, {PodIP: "10.244.5.5", HostIP: "10.0.0.5"}}}}
	ips := func(usable ...bool) []datapath.EgressIP {
		out := []datapath.EgressIP{{IP: a("192.0.2.201")}, {IP: a("192.0.2.202")}, {IP: a("192.0.2.203")}}
		for i := range out {
			out[i].Usable = usable[i]
		}
		return out
	}
	state := func(node string, eg v1alpha1.Egress) *datapath.Egress {
		var local []corev1.Pod
		for _, p := range pods {
			if p.Spec.NodeName == node {
				local = append(local, p)
			}
		}
		st := computeState(stateInput{Node: node, Egresses: []v1alpha1.Egress{eg}, Namespaces: nss, Pods: local, Slices: slices, Nodes: nodes})
		if len(st.Egresses) == 0 {
			return nil
		}
		return &st.Egresses[0]
	}

	// n3, zone a: only the zone-a IP while it is Ready.
	got := state("n3", eg)
	want := &datapath.Egress{Name: "multi", Role: datapath.RoleSource, FailurePolicy: datapath.FailurePolicyFail,
		Local: []netip.Addr{a("10.244.3.5")}, IPs: ips(true, false, false)}
	if d := cmp.Diff(want, got, addrCmp); d != "" {
		t.Errorf("n3 (zone a) (-want +got):\n%s", d)
	}
	// n5, no zone: every Ready IP.
	if got := state("n5", eg); got == nil || !cmp.Equal(got.IPs, ips(true, true, false), addrCmp) || got.Role != datapath.RoleSource {
		t.Errorf("n5 (no zone): %+v, want RoleSource over the two Ready IPs", got)
	}
	// n2 (zone b) holds .202: RoleEgress for it, both members remote; its
	// own members would use the zone-b Ready IP alone.
	h := state("n2", eg)
	wantIPs := ips(false, true, false)
	wantIPs[1].Held = true
	if h == nil || h.Role != datapath.RoleEgress || h.IP != a("192.0.2.202") || !cmp.Equal(h.IPs, wantIPs, addrCmp) || len(h.Remote) != 2 {
		t.Errorf("n2 (holder): %+v, want RoleEgress with IP 192.0.2.202 and 2 remote members", h)
	}
	// The zone-a IP not Ready: n3 falls back to every Ready one (zone b).
	eg2 := eg.DeepCopy()
	eg2.Status.IPs[0].Ready = false
	if got := state("n3", *eg2); got == nil || !cmp.Equal(got.IPs, ips(false, true, false), addrCmp) {
		t.Errorf("n3 with zone a not Ready: %+v, want the zone-b Ready IP alone", got)
	}
	// None Ready: failurePolicy.
	for i := range eg2.Status.IPs {
		eg2.Status.IPs[i].Ready = false
	}
	if got := state("n3", *eg2); got == nil || got.Role != datapath.RoleFailed || got.Assigning {
		t.Errorf("n3 with no IP Ready: %+v, want RoleFailed (not Assigning)", got)
	}
}

var addrCmp = cmpopts.EquateComparable(netip.Addr{})
