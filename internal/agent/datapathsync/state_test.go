package datapathsync

import (
	"net/netip"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent/datapath"
)

func dpEgress(name string, age int, ip, node string, policy v1alpha1.FailurePolicy, nsLabel string) v1alpha1.Egress {
	return v1alpha1.Egress{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(time.Unix(int64(1000+age), 0))},
		Spec: v1alpha1.EgressSpec{
			AppliedTo:     v1alpha1.AppliedTo{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": nsLabel}}},
			FailurePolicy: policy,
		},
		Status: v1alpha1.EgressStatus{EgressIP: ip, EgressNode: node},
	}
}

func dpPod(ns, name, node, hostIP string, ips ...string) corev1.Pod {
	p := corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID("uid-" + name)}, Spec: corev1.PodSpec{NodeName: node}}
	p.Status.Phase = corev1.PodRunning
	p.Status.HostIPs = []corev1.HostIP{{IP: hostIP}}
	for _, ip := range ips {
		p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip})
	}
	return p
}

func dpNode(name, ip string, podCIDRs ...string) corev1.Node {
	return corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.NodeSpec{PodCIDRs: podCIDRs},
		Status:     corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}, {Type: corev1.NodeHostName, Address: name}}},
	}
}

var (
	a = netip.MustParseAddr
	p = netip.MustParsePrefix
)

func TestComputeState(t *testing.T) {
	nss := []corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: "pay", Labels: map[string]string{"team": "pay"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "web", Labels: map[string]string{"team": "web"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "ops", Labels: map[string]string{"team": "ops"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "idle", Labels: map[string]string{"team": "idle"}}},
	}
	egs := []v1alpha1.Egress{
		dpEgress("held", 0, "203.0.113.1", "n1", "", "pay"),                         // n1 holds it
		dpEgress("remote", 1, "203.0.113.2", "n2", "", "web"),                       // n2 holds it; members on n1
		dpEgress("down", 2, "203.0.113.3", "", v1alpha1.FailurePolicyIgnore, "ops"), // no Node
		dpEgress("noip", 3, "", "", "", "pay-never"),                                // no members here: left out
		dpEgress("idle", 4, "203.0.113.4", "n2", "", "idle"),                        // no members here: left out
	}
	pods := []corev1.Pod{
		dpPod("pay", "p1", "n1", "192.0.2.11", "10.1.0.5"),
		dpPod("web", "w1", "n1", "192.0.2.11", "10.1.0.7"),
		dpPod("ops", "o1", "n1", "192.0.2.11", "10.1.0.9"),
		dpPod("pay", "elsewhere", "n2", "192.0.2.12", "10.2.0.5"),  // not this Node's: ignored even if cached
		dpPod("idle", "done", "n1", "192.0.2.11", "10.1.0.13"),     // finished: not a running Pod
		dpPod("idle", "hostnet", "n1", "192.0.2.11", "192.0.2.11"), // host network: not a Pod IP
	}
	pods[4].Status.Phase = corev1.PodSucceeded
	pods[5].Spec.HostNetwork = true
	slices := []v1alpha1.EgressMemberSlice{
		{Egress: "held", Members: []v1alpha1.EgressMember{
			{PodIP: "10.2.0.5", HostIP: "192.0.2.12"},
			{PodIP: "10.1.0.5", HostIP: "192.0.2.11"}, // local: not remote
			{PodIP: "10.3.0.5", HostIP: "192.0.2.13"},
		}},
		{Egress: "held", Members: []v1alpha1.EgressMember{
			{PodIP: "10.3.0.5", HostIP: "192.0.2.13"},  // duplicate across slices
			{PodIP: "fd00::5", HostIP: "2001:db8::13"}, // wrong family
		}},
		{Egress: "remote", Members: []v1alpha1.EgressMember{{PodIP: "10.1.0.7", HostIP: "192.0.2.11"}}}, // not held here
	}
	nodes := []corev1.Node{dpNode("n2", "192.0.2.12", "10.2.0.0/24"), dpNode("n1", "192.0.2.11", "10.1.0.0/24"), dpNode("n3", "192.0.2.13", "10.3.0.0/24", "fd00:3::/64")}
	in := stateInput{Node: "n1", Egresses: egs, Namespaces: nss, Pods: pods, Slices: slices, Nodes: nodes,
		CIDRs: CIDRs{ServiceCIDRs: []netip.Prefix{p("10.96.0.0/12")}, ExcludeCIDRs: []netip.Prefix{p("172.16.0.0/12"), p("10.96.0.0/12")}}}

	want := datapath.State{
		Egresses: []datapath.Egress{
			{Name: "down", IP: a("203.0.113.3"), Role: datapath.RoleFailed, FailurePolicy: datapath.FailurePolicyIgnore, Local: []netip.Addr{a("10.1.0.9")}},
			{Name: "held", IP: a("203.0.113.1"), Role: datapath.RoleEgress, FailurePolicy: datapath.FailurePolicyFail, Local: []netip.Addr{a("10.1.0.5")},
				Remote: []datapath.Member{{IP: a("10.2.0.5"), HostIP: a("192.0.2.12")}, {IP: a("10.3.0.5"), HostIP: a("192.0.2.13")}}},
			{Name: "remote", IP: a("203.0.113.2"), Role: datapath.RoleSource, FailurePolicy: datapath.FailurePolicyFail, Local: []netip.Addr{a("10.1.0.7")}},
		},
		NodeIPs:      []netip.Addr{a("192.0.2.11"), a("192.0.2.12"), a("192.0.2.13")},
		ClusterCIDRs: []netip.Prefix{p("10.1.0.0/24"), p("10.2.0.0/24"), p("10.3.0.0/24"), p("10.96.0.0/12"), p("172.16.0.0/12"), p("fd00:3::/64")},
		Peers: []datapath.Peer{
			{IP: a("192.0.2.12"), PodCIDRs: []netip.Prefix{p("10.2.0.0/24")}},
			{IP: a("192.0.2.13"), PodCIDRs: []netip.Prefix{p("10.3.0.0/24"), p("fd00:3::/64")}},
		},
		Pods: []datapath.LocalPod{{IP: a("10.1.0.5"), UID: "uid-p1"}, {IP: a("10.1.0.7"), UID: "uid-w1"}, {IP: a("10.1.0.9"), UID: "uid-o1"}},
	}
	got := computeState(in)
	if diff := cmp.Diff(want, got, cmpopts.EquateComparable(netip.Addr{}, netip.Prefix{})); diff != "" {
		t.Errorf("State (-want +got):\n%s", diff)
	}
	if !stateEqual(got, computeState(in)) {
		t.Error("stateEqual: the same input gives unequal States")
	}

	// Another Pod with the same IP (a new UID) is another State: the
	// datapath must not drain the old Pod's flows for it.
	reused := in
	reused.Pods = append([]corev1.Pod(nil), in.Pods...)
	reused.Pods[0].UID = "uid-p1-again"
	if stateEqual(got, computeState(reused)) {
		t.Error("stateEqual: an IP given to another Pod went unnoticed")
	}

	// Flags given: the Nodes' podCIDRs are not used.
	in.CIDRs.ClusterCIDRs = []netip.Prefix{p("10.0.0.0/8")}
	got = computeState(in)
	wantCIDRs := []netip.Prefix{p("10.0.0.0/8"), p("10.96.0.0/12"), p("172.16.0.0/12")}
	if diff := cmp.Diff(wantCIDRs, got.ClusterCIDRs, cmpopts.EquateComparable(netip.Prefix{})); diff != "" {
		t.Errorf("ClusterCIDRs with --cluster-cidrs (-want +got):\n%s", diff)
	}

	// The IP moves to n1's peer: the Egress becomes a source here, and a
	// change of role makes the States differ.
	before := got
	in.Egresses[0].Status.EgressNode = "n3"
	got = computeState(in)
	if got.Egresses[1].Role != datapath.RoleSource || got.Egresses[1].Remote != nil {
		t.Errorf("after the move: %+v, want RoleSource without remote members", got.Egresses[1])
	}
	if stateEqual(before, got) {
		t.Error("stateEqual: a role change went unnoticed")
	}

	// A new Egress selecting p1's namespace before the controller has
	// written anything is being assigned; once the controller says it
	// cannot assign it, it is failed for good (issue 23 fault 3).
	in.Egresses = append(in.Egresses, dpEgress("fresh", 5, "", "", "", "new"))
	in.Namespaces = append(in.Namespaces, corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "new", Labels: map[string]string{"team": "new"}}})
	in.Pods = append(in.Pods, dpPod("new", "app", "n1", "192.0.2.11", "10.1.0.11"))
	fresh := func() datapath.Egress {
		for _, e := range computeState(in).Egresses {
			if e.Name == "fresh" {
				return e
			}
		}
		t.Fatal("fresh left out")
		return datapath.Egress{}
	}
	if e := fresh(); e.Role != datapath.RoleFailed || !e.Assigning {
		t.Errorf("new Egress: %+v, want RoleFailed and Assigning", e)
	}
	before = computeState(in)
	in.Egresses[len(in.Egresses)-1].Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionAssigned, Status: metav1.ConditionFalse, Reason: "NoEligibleNode"}}
	if e := fresh(); e.Role != datapath.RoleFailed || e.Assigning {
		t.Errorf("unassignable Egress: %+v, want RoleFailed, not Assigning", e)
	}
	if stateEqual(before, computeState(in)) {
		t.Error("stateEqual: the end of Assigning went unnoticed")
	}
}
