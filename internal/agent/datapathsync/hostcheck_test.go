package datapathsync_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "github.com/egressip/egressip/api/v1alpha1"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/egressip/egressip/internal/agent"
	"github.com/egressip/egressip/internal/agent/datapathsync"
	"github.com/egressip/egressip/internal/agent/hoststack"
	"github.com/egressip/egressip/internal/report"
	"github.com/egressip/egressip/internal/testutil/poll"
)

// scriptedCheck stands in for hoststack's Detector: it records the Pod IPs
// it is asked about and answers the finding set by the test.
type scriptedCheck struct {
	mu      sync.Mutex
	finding hoststack.Finding
	asked   [][]netip.Addr
}

func (s *scriptedCheck) Detect(ips []netip.Addr) (hoststack.Finding, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked = append(s.asked, slices.Clone(ips))
	return s.finding, nil
}

func (s *scriptedCheck) set(f hoststack.Finding) {
	s.mu.Lock()
	s.finding = f
	s.mu.Unlock()
}

func (s *scriptedCheck) lastAsked() []netip.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.asked) == 0 {
		return nil
	}
	return s.asked[len(s.asked)-1]
}

// TestDatapathHostCheck: the datapath reconciler runs the host stack check
// over its own Node's Pod IPs (not host-network Pods, not other Nodes'),
// hands each changed finding to OnFinding as the report's datapath status,
// and a cleared finding turns it back to supported.
func TestDatapathHostCheck(t *testing.T) {
	env := apiServer(t)
	c := env.Client
	ctx := context.Background()
	node, other := uniq("hcn"), uniq("hcn")
	mkNode(t, c, node, "192.0.2.31", "10.31.0.0/24")
	mkNode(t, c, other, "192.0.2.32", "10.32.0.0/24")
	ns := uniq("hcns")
	if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	mkPod(t, c, ns, "a", node, "192.0.2.31", "10.31.0.5", nil)
	mkPod(t, c, ns, "elsewhere", other, "192.0.2.32", "10.32.0.5", nil)
	hn := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "hostnet"},
		Spec: corev1.PodSpec{NodeName: node, HostNetwork: true, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/c"}}}}
	if err := c.Create(ctx, hn); err != nil {
		t.Fatal(err)
	}
	hn.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "192.0.2.31", PodIPs: []corev1.PodIP{{IP: "192.0.2.31"}}}
	if err := c.Status().Update(ctx, hn); err != nil {
		t.Fatal(err)
	}

	check := &scriptedCheck{finding: hoststack.Finding{Bypass: true, Devices: 1,
		Evidence: []string{`tc BPF program "cil_from_container" in direct-action mode on the ingress of lxc1 (route to Pod 10.31.0.5)`}}}
	var (
		mu       sync.Mutex
		findings []report.DatapathStatus
	)
	mgr, err := agent.NewDatapathManager(env.Config, node, manager.Options{Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	r := &datapathsync.Reconciler{NodeName: node, DP: &recordingDP{}, ResyncPeriod: time.Hour, HostCheck: check,
		OnFinding: func(s *report.DatapathStatus) {
			mu.Lock()
			findings = append(findings, *s)
			mu.Unlock()
		}}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(runCtx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	lastFinding := func() (report.DatapathStatus, int) {
		mu.Lock()
		defer mu.Unlock()
		if len(findings) == 0 {
			return report.DatapathStatus{}, 0
		}
		return findings[len(findings)-1], len(findings)
	}

	poll.Until(t, 30*time.Second, "a bypass finding", func() error {
		f, n := lastFinding()
		if n == 0 || f.Supported || f.Reason != v1.ReasonHostStackBypass || !strings.Contains(f.Message, "lxc1") {
			return fmt.Errorf("findings so far: %d, last %+v", n, f)
		}
		return nil
	})
	if got := check.lastAsked(); !slices.Equal(got, []netip.Addr{netip.MustParseAddr("10.31.0.5")}) {
		t.Errorf("check asked about %v, want only the local non-host-network Pod 10.31.0.5", got)
	}

	// The CNI changes; a Pod event brings the next reconcile.
	check.set(hoststack.Finding{Devices: 1})
	var pa corev1.Pod
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "a"}, &pa); err != nil {
		t.Fatal(err)
	}
	pa.Labels = map[string]string{"touched": "yes"}
	if err := c.Update(ctx, &pa); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "the finding clears", func() error {
		f, n := lastFinding()
		if !f.Supported || f.Reason != v1.ReasonHostStack {
			return fmt.Errorf("findings so far: %d, last %+v", n, f)
		}
		return nil
	})
	if _, n := lastFinding(); n != 2 {
		t.Errorf("OnFinding called %d times for two distinct findings", n)
	}
}
