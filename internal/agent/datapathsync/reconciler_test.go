package datapathsync_test

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent"
	"github.com/egressip/egressip/internal/agent/datapath"
	"github.com/egressip/egressip/internal/agent/datapathsync"
	"github.com/egressip/egressip/internal/testutil/poll"
)

// recordingDP stands in for the datapath engine: it records every State
// applied and serves fixed rejected-packet counters.
type recordingDP struct {
	mu       sync.Mutex
	applied  []datapath.State
	rejected map[string]uint64
}

func (r *recordingDP) Apply(_ context.Context, st datapath.State) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.applied = append(r.applied, st)
	return nil
}

func (r *recordingDP) Counters(context.Context) (map[string]uint64, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]uint64{"@unknown-source": 3}
	maps.Copy(out, r.rejected)
	return out, nil
}

func (r *recordingDP) last() (datapath.State, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.applied) == 0 {
		return datapath.State{}, 0
	}
	return r.applied[len(r.applied)-1], len(r.applied)
}

// egressOf returns the Egress name of st, if present.
func egressOf(st datapath.State, name string) (datapath.Egress, bool) {
	for _, e := range st.Egresses {
		if e.Name == name {
			return e, true
		}
	}
	return datapath.Egress{}, false
}

// startDatapathAgent runs a manager built like Run builds it with a
// datapath, with only the datapath reconciler (the bindings are tested
// elsewhere), against the recording engine dp.
func startDatapathAgent(t *testing.T, node string, dp datapathsync.Datapath, cidrs datapathsync.CIDRs) manager.Manager {
	t.Helper()
	env := apiServer(t)
	mgr, err := agent.NewDatapathManager(env.Config, node, manager.Options{Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	r := &datapathsync.Reconciler{NodeName: node, DP: dp, CIDRs: cidrs, ResyncPeriod: time.Hour}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	return mgr
}

func mkNode(t *testing.T, c client.Client, name, ip, podCIDR string) {
	t.Helper()
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDR: podCIDR, PodCIDRs: []string{podCIDR}}}
	if err := c.Create(context.Background(), n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), n) })
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip}}
	if err := c.Status().Update(context.Background(), n); err != nil {
		t.Fatal(err)
	}
}

// mkTeamNamespace creates a namespace named after prefix, labelled
// team=<a unique team name>, and returns both names.
func mkTeamNamespace(t *testing.T, c client.Client, prefix string) (ns, team string) {
	t.Helper()
	team, ns = uniq("team"), uniq(prefix)
	if err := c.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"team": team}}}); err != nil {
		t.Fatal(err)
	}
	return ns, team
}

func mkPod(t *testing.T, c client.Client, ns, name, node, hostIP, ip string, lbl map[string]string) {
	t.Helper()
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: lbl},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/c"}}}}
	if err := c.Create(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}, HostIP: hostIP, HostIPs: []corev1.HostIP{{IP: hostIP}}}
	if err := c.Status().Update(context.Background(), p); err != nil {
		t.Fatal(err)
	}
}

// TestDatapathReconciler runs two Nodes' datapath reconcilers on a real API
// server with a recording engine: the egress Node gets RoleEgress with the
// remote member from the slice, the other Node RoleSource for its own Pod,
// an Egress without a Node RoleFailed with its policy; each agent caches
// only its own Node's Pods; an unchanged cluster is not re-applied; a Pod
// change is; the rejected counters reach the metric.
func TestDatapathReconciler(t *testing.T) {
	env := apiServer(t)
	c := env.Client
	ctx := context.Background()
	n1, n2 := uniq("dpn"), uniq("dpn")
	mkNode(t, c, n1, "192.0.2.21", "10.21.0.0/24")
	mkNode(t, c, n2, "192.0.2.22", "10.22.0.0/24")
	ns, team := mkTeamNamespace(t, c, "dpns")
	mkPod(t, c, ns, "a", n1, "192.0.2.21", "10.21.0.5", map[string]string{"app": "pay"})
	mkPod(t, c, ns, "b", n2, "192.0.2.22", "10.22.0.5", map[string]string{"app": "pay"})
	mkPod(t, c, ns, "c", n2, "192.0.2.22", "10.22.0.6", map[string]string{"app": "ops"})

	mkEgress := func(prefix string, app string, policy v1alpha1.FailurePolicy, ip, node string) string {
		e := &v1alpha1.Egress{ObjectMeta: metav1.ObjectMeta{Name: uniq(prefix)}, Spec: v1alpha1.EgressSpec{
			AppliedTo:      v1alpha1.AppliedTo{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": team}}, PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}},
			ExternalIPPool: "none", FailurePolicy: policy,
		}}
		if err := c.Create(ctx, e); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), e) })
		setStatus(t, c, e.Name, ip, node)
		return e.Name
	}
	pay := mkEgress("pay", "pay", "", "203.0.113.21", n1)
	ops := mkEgress("ops", "ops", v1alpha1.FailurePolicyFail, "", "")
	// The controller's slice for pay, written by hand here.
	sl := &v1alpha1.EgressMemberSlice{ObjectMeta: metav1.ObjectMeta{Name: pay + "-0"}, Egress: pay, Members: []v1alpha1.EgressMember{
		{PodIP: "10.21.0.5", HostIP: "192.0.2.21"}, {PodIP: "10.22.0.5", HostIP: "192.0.2.22"},
	}}
	if err := c.Create(ctx, sl); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), sl) })

	dp1, dp2 := &recordingDP{}, &recordingDP{rejected: map[string]uint64{ops: 42, "@eip-source": 7}}
	svc := []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}
	startDatapathAgent(t, n1, dp1, datapathsync.CIDRs{ServiceCIDRs: svc})
	mgr2 := startDatapathAgent(t, n2, dp2, datapathsync.CIDRs{ServiceCIDRs: svc})

	ip := netip.MustParseAddr
	poll.Until(t, 30*time.Second, "n1: pay held with the remote member", func() error {
		st, _ := dp1.last()
		e, ok := egressOf(st, pay)
		want := []datapath.Member{{IP: ip("10.22.0.5"), HostIP: ip("192.0.2.22")}}
		if !ok || e.Role != datapath.RoleEgress || !slices.Equal(e.Remote, want) || !slices.Equal(e.Local, []netip.Addr{ip("10.21.0.5")}) {
			return fmt.Errorf("pay on n1: %+v", e)
		}
		if _, ok := egressOf(st, ops); ok {
			return fmt.Errorf("ops has no member on n1 but is in its State")
		}
		if !slices.Contains(st.NodeIPs, ip("192.0.2.22")) || !slices.Contains(st.ClusterCIDRs, netip.MustParsePrefix("10.22.0.0/24")) || !slices.Contains(st.ClusterCIDRs, svc[0]) {
			return fmt.Errorf("NodeIPs %v ClusterCIDRs %v", st.NodeIPs, st.ClusterCIDRs)
		}
		return nil
	})
	poll.Until(t, 30*time.Second, "n2: pay as source, ops failed", func() error {
		st, _ := dp2.last()
		p, ok1 := egressOf(st, pay)
		o, ok2 := egressOf(st, ops)
		if !ok1 || p.Role != datapath.RoleSource || !slices.Equal(p.Local, []netip.Addr{ip("10.22.0.5")}) || p.Remote != nil {
			return fmt.Errorf("pay on n2: %+v", p)
		}
		if !ok2 || o.Role != datapath.RoleFailed || o.FailurePolicy != datapath.FailurePolicyFail || !slices.Equal(o.Local, []netip.Addr{ip("10.22.0.6")}) {
			return fmt.Errorf("ops on n2: %+v", o)
		}
		return nil
	})

	// n2's cache holds n2's Pods only.
	var pods corev1.PodList
	if err := mgr2.GetCache().List(ctx, &pods, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, p := range pods.Items {
		if p.Spec.NodeName != n2 {
			t.Errorf("n2's cache holds Pod %s of Node %s", p.Name, p.Spec.NodeName)
		}
		if len(p.Spec.Containers) != 0 {
			t.Errorf("cached Pod %s not stripped: %d containers", p.Name, len(p.Spec.Containers))
		}
	}
	if len(pods.Items) != 2 {
		t.Errorf("n2 caches %d Pods of %s, want 2", len(pods.Items), ns)
	}

	// Nothing changes: no new Apply (the resync period is an hour).
	_, before := dp2.last()
	time.Sleep(2 * time.Second)
	if _, after := dp2.last(); after != before {
		t.Errorf("%d applies of an unchanged State", after-before)
	}

	// Pod c turns into a pay Pod: n2 applies once more, ops leaves.
	var pc corev1.Pod
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "c"}, &pc); err != nil {
		t.Fatal(err)
	}
	pc.Labels = map[string]string{"app": "pay"}
	if err := c.Update(ctx, &pc); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "n2: c joins pay", func() error {
		st, _ := dp2.last()
		p, _ := egressOf(st, pay)
		if _, ok := egressOf(st, ops); ok || !slices.Equal(p.Local, []netip.Addr{ip("10.22.0.5"), ip("10.22.0.6")}) {
			return fmt.Errorf("pay %+v, ops present %v", p, ok)
		}
		return nil
	})

	// The rejected counters of the last reconciler set up (n2's) are
	// served per Egress; "@" counters are not.
	if v := metricValue(t, "egressip_agent_packets_rejected_total", map[string]string{"egress": ops}); v != 42 {
		t.Errorf("egressip_agent_packets_rejected_total{egress=%q} = %v, want 42", ops, v)
	}
	if v := metricValue(t, "egressip_agent_packets_rejected_total", map[string]string{"egress": "@unknown-source"}); v != 0 {
		t.Errorf("an internal counter is served as an Egress: %v", v)
	}
	// The source guard's drops have their own series.
	if v := metricValue(t, "egressip_agent_source_guard_dropped_total", map[string]string{"family": "ipv6"}); v != 7 {
		t.Errorf("egressip_agent_source_guard_dropped_total{family=ipv6} = %v, want 7", v)
	}
	if v := metricValue(t, "egressip_agent_packets_rejected_total", map[string]string{"egress": "@eip-source"}); v != 0 {
		t.Errorf("the source guard's counter is served as an Egress: %v", v)
	}
}

// TestDatapathServiceCIDRs: without --service-cidrs the agent keeps the
// cluster's ServiceCIDR objects off egress paths (the API server's own
// "kubernetes" one and one created while it runs); with the flag, the
// flag's list is used and the objects are ignored.
func TestDatapathServiceCIDRs(t *testing.T) {
	env := apiServer(t)
	c := env.Client
	ctx := context.Background()
	n1, n2 := uniq("scn"), uniq("scn")
	mkNode(t, c, n1, "192.0.2.31", "10.31.0.0/24")
	mkNode(t, c, n2, "192.0.2.32", "10.32.0.0/24")
	auto, flagged := &recordingDP{}, &recordingDP{}
	startDatapathAgent(t, n1, auto, datapathsync.CIDRs{})
	flag := []netip.Prefix{netip.MustParsePrefix("10.200.0.0/16")}
	startDatapathAgent(t, n2, flagged, datapathsync.CIDRs{ServiceCIDRs: flag})

	var existing networkingv1.ServiceCIDRList
	if err := c.List(ctx, &existing); err != nil {
		t.Fatal(err)
	}
	t.Logf("ServiceCIDRs of the API server: %d", len(existing.Items))
	extra := &networkingv1.ServiceCIDR{ObjectMeta: metav1.ObjectMeta{Name: uniq("extra")},
		Spec: networkingv1.ServiceCIDRSpec{CIDRs: []string{"198.51.100.0/24", "2001:db8:5c::/112"}}}
	if err := c.Create(ctx, extra); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), extra) })
	want := []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("2001:db8:5c::/112")}
	for _, sc := range existing.Items {
		for _, s := range sc.Spec.CIDRs {
			want = append(want, netip.MustParsePrefix(s).Masked())
		}
	}
	poll.Until(t, 30*time.Second, "every ServiceCIDR in the State", func() error {
		st, _ := auto.last()
		for _, p := range want {
			if !slices.Contains(st.ClusterCIDRs, p) {
				return fmt.Errorf("ClusterCIDRs %v lack %s", st.ClusterCIDRs, p)
			}
		}
		return nil
	})
	poll.Until(t, 30*time.Second, "the flag's list only", func() error {
		st, n := flagged.last()
		if n == 0 || !slices.Contains(st.ClusterCIDRs, flag[0]) {
			return fmt.Errorf("ClusterCIDRs %v lack %s", st.ClusterCIDRs, flag[0])
		}
		for _, p := range want {
			if slices.Contains(st.ClusterCIDRs, p) {
				return fmt.Errorf("ClusterCIDRs %v hold the ServiceCIDR %s although --service-cidrs is set", st.ClusterCIDRs, p)
			}
		}
		return nil
	})
}
