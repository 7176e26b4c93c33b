package datapathsync_test

import (
	"context"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent"
	"github.com/egressip/egressip/internal/agent/datapathsync"
	"github.com/egressip/egressip/internal/testutil/poll"
)

// drainingDP is the recording engine reporting drains in progress (a
// double of package datapath's Draining; the drains themselves are
// tested against the kernel in test/datapath, TestMoveBetweenEgresses).
type drainingDP struct {
	recordingDP
	draining atomic.Int32
}

func (d *drainingDP) Draining() int { return int(d.draining.Load()) }

// TestDrainingReappliesUnchangedState: while the engine drains flows of
// members that left an Egress, the datapath reconciler applies its State
// again every few seconds although nothing changed (so that drains whose
// flows have ended are released), with a resync period of an hour.
func TestDrainingReappliesUnchangedState(t *testing.T) {
	env := apiServer(t)
	c := env.Client
	ctx := context.Background()
	node := uniq("drn")
	mkNode(t, c, node, "192.0.2.32", "10.32.0.0/24")
	ns, team := mkTeamNamespace(t, c, "drns")
	mkPod(t, c, ns, "a", node, "192.0.2.32", "10.32.0.5", map[string]string{"app": "a"})
	e := &v1alpha1.Egress{ObjectMeta: metav1.ObjectMeta{Name: uniq("e")}, Spec: v1alpha1.EgressSpec{
		AppliedTo:      v1alpha1.AppliedTo{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": team}}},
		ExternalIPPool: "none",
	}}
	if err := c.Create(ctx, e); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), e) })
	setStatus(t, c, e.Name, "203.0.113.32", "elsewhere")

	dp := &drainingDP{}
	mgr, err := agent.NewDatapathManager(env.Config, node, manager.Options{Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	r := &datapathsync.Reconciler{NodeName: node, DP: dp, CIDRs: datapathsync.CIDRs{ServiceCIDRs: []netip.Prefix{}}, ResyncPeriod: time.Hour}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	var first int
	poll.Until(t, 30*time.Second, "the State applied", func() error {
		st, n := dp.last()
		if _, ok := egressOf(st, e.Name); !ok {
			return fmt.Errorf("not applied yet: %+v", st)
		}
		first = n
		return nil
	})
	dp.draining.Store(1)
	// A change starts the faster period (as the Apply that starts a drain
	// would), then unchanged States keep being applied.
	mkPod(t, c, ns, "b", node, "192.0.2.32", "10.32.0.6", map[string]string{"app": "b"})
	poll.Until(t, 40*time.Second, "unchanged State applied again while draining", func() error {
		if _, n := dp.last(); n < first+3 {
			return fmt.Errorf("%d applies (first at %d)", n, first)
		}
		return nil
	})
	st0, _ := dp.last()
	if _, ok := egressOf(st0, e.Name); !ok {
		t.Errorf("re-applied State lost the Egress: %+v", st0)
	}
}
