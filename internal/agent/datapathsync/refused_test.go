package datapathsync_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent"
	"github.com/egressip/egressip/internal/agent/datapath"
	"github.com/egressip/egressip/internal/agent/datapathsync"
	"github.com/egressip/egressip/internal/report"
	"github.com/egressip/egressip/internal/testutil/poll"
)

// refusingDP is the recording engine with one Egress the "kernel" refuses:
// a double of package datapath's Apply contract (the real refusal is
// tested against the kernel in package datapath), which programs the rest
// and returns a *datapath.RefusedError naming that Egress while it is in
// the State.
type refusingDP struct {
	recordingDP
	refuse string
}

func (r *refusingDP) Apply(ctx context.Context, st datapath.State) error {
	var kept []datapath.Egress
	var refused bool
	for _, e := range st.Egresses {
		if e.Name == r.refuse {
			refused = true
			continue
		}
		kept = append(kept, e)
	}
	st.Egresses = kept
	_ = r.recordingDP.Apply(ctx, st)
	if refused {
		return &datapath.RefusedError{Egresses: map[string]error{r.refuse: errors.New("netlink receive: numerical result out of range")}}
	}
	return nil
}

// TestOneEgressFailsAgentReportsAndKeepsApplying: the datapath reconciler
// treats an Apply that refused one Egress as applied, hands the refusal to
// OnRefused (the report), keeps applying later changes of the other
// Egresses, and clears the refusal once the Egress is gone.
func TestOneEgressFailsAgentReportsAndKeepsApplying(t *testing.T) {
	env := apiServer(t)
	c := env.Client
	ctx := context.Background()
	node := uniq("rfn")
	mkNode(t, c, node, "192.0.2.31", "10.31.0.0/24")
	ns, team := mkTeamNamespace(t, c, "rfns")
	mkPod(t, c, ns, "a", node, "192.0.2.31", "10.31.0.5", map[string]string{"app": "bad"})
	mkPod(t, c, ns, "b", node, "192.0.2.31", "10.31.0.6", map[string]string{"app": "good"})
	mk := func(app string) *v1alpha1.Egress {
		e := &v1alpha1.Egress{ObjectMeta: metav1.ObjectMeta{Name: uniq(app)}, Spec: v1alpha1.EgressSpec{
			AppliedTo:      v1alpha1.AppliedTo{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": team}}, PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": app}}},
			ExternalIPPool: "none",
		}}
		if err := c.Create(ctx, e); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), e) })
		setStatus(t, c, e.Name, "203.0.113.31", "elsewhere")
		return e
	}
	bad, good := mk("bad"), mk("good")

	dp := &refusingDP{refuse: bad.Name}
	var mu sync.Mutex
	var published [][]report.RefusedEgress
	mgr, err := agent.NewDatapathManager(env.Config, node, manager.Options{Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	r := &datapathsync.Reconciler{NodeName: node, DP: dp, CIDRs: datapathsync.CIDRs{ServiceCIDRs: []netip.Prefix{}}, ResyncPeriod: time.Hour,
		OnRefused: func(rs []report.RefusedEgress) { mu.Lock(); published = append(published, rs); mu.Unlock() }}
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
	last := func() []report.RefusedEgress {
		mu.Lock()
		defer mu.Unlock()
		if len(published) == 0 {
			return nil
		}
		return published[len(published)-1]
	}

	poll.Until(t, 30*time.Second, "the refusal published and the other Egress applied", func() error {
		if rs := last(); len(rs) != 1 || rs[0].Egress != bad.Name || rs[0].Message == "" {
			return fmt.Errorf("published %v", rs)
		}
		st, _ := dp.last()
		if e, ok := egressOf(st, good.Name); !ok || !slices.Equal(e.Local, []netip.Addr{netip.MustParseAddr("10.31.0.6")}) {
			return fmt.Errorf("good not applied: %+v", st)
		}
		if _, ok := r.Applied(); !ok {
			return errors.New("the reconciler does not count the partial apply as applied")
		}
		return nil
	})
	// The others keep changing and keep being applied.
	for i := range 3 {
		ip := fmt.Sprintf("10.31.0.%d", 10+i)
		mkPod(t, c, ns, fmt.Sprintf("g%d", i), node, "192.0.2.31", ip, map[string]string{"app": "good"})
		poll.Until(t, 30*time.Second, "new member "+ip+" applied", func() error {
			st, _ := dp.last()
			if e, _ := egressOf(st, good.Name); !slices.Contains(e.Local, netip.MustParseAddr(ip)) {
				return fmt.Errorf("good: %+v", e)
			}
			return nil
		})
	}
	if err := c.Delete(ctx, bad); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "the refusal cleared", func() error {
		if rs := last(); len(rs) != 0 {
			return fmt.Errorf("published %v", rs)
		}
		return nil
	})
}
