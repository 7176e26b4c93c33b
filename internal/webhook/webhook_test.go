package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/controller"
	"github.com/egressip/egressip/internal/testenv"
	"github.com/egressip/egressip/internal/testutil/poll"
	egwebhook "github.com/egressip/egressip/internal/webhook"
)

var env *testenv.Env

// TestMain starts envtest with the webhook configuration installed and a
// manager that serves the webhook and runs the controller (for the pool
// deletion finalizer).
func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	var err error
	env, err = testenv.Start(testenv.WithWebhooks())
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{
		Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		WebhookServer: webhook.NewServer(env.WebhookOptions()),
	})
	if err == nil {
		err = egwebhook.Setup(mgr)
	}
	if err == nil {
		err = controller.Setup(mgr, controller.Options{Pass: controller.PassConfig{DefaultCapacity: 10}})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		_ = env.Stop()
		os.Exit(1)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := mgr.Start(ctx); err != nil {
			fmt.Fprintln(os.Stderr, "manager:", err)
		}
	}()
	code := m.Run()
	cancel()
	<-done
	_ = env.Stop()
	os.Exit(code)
}

func pool(name string, ranges ...v1.IPRange) *v1.ExternalIPPool {
	return &v1.ExternalIPPool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.ExternalIPPoolSpec{IPRanges: ranges}}
}

func egress(name, poolName, ip string) *v1.Egress {
	return &v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.EgressSpec{
		AppliedTo: v1.AppliedTo{PodSelector: &metav1.LabelSelector{}}, ExternalIPPool: poolName, EgressIP: ip}}
}

// create retries while the webhook server or the cache is still starting
// (the webhook then sees no pools yet); wantErr is matched on the last try.
func create(t *testing.T, obj client.Object, wantErr string) {
	t.Helper()
	ctx := context.Background()
	var err error
	// 50 tries 200 ms apart, as before; the outcome is judged below.
	if poll.Wait(ctx, 200*time.Millisecond, 10*time.Second, func() error {
		err = env.Client.Create(ctx, obj.DeepCopyObject().(client.Object))
		if err == nil && wantErr == "" {
			t.Cleanup(func() { _ = env.Client.Delete(context.Background(), obj) })
			return nil
		}
		if err != nil && wantErr != "" && strings.Contains(err.Error(), wantErr) {
			return nil
		}
		if err == nil {
			_ = env.Client.Delete(ctx, obj)
			return errors.New("accepted")
		}
		return err
	}) == nil {
		return
	}
	if wantErr == "" {
		t.Fatalf("create %s: want accepted, got %v", obj.GetName(), err)
	}
	t.Fatalf("create %s: want error containing %q, got %v", obj.GetName(), wantErr, err)
}

func TestPoolOverlapRejected(t *testing.T) {
	create(t, pool("ov-a", v1.IPRange{CIDR: "198.51.100.0/28"}), "")
	create(t, pool("ov-b", v1.IPRange{Start: "198.51.100.10", End: "198.51.100.20"}), `overlaps ExternalIPPool "ov-a"`)
	create(t, pool("ov-c", v1.IPRange{CIDR: "198.51.100.16/28"}), "")
}

// Two ranges of one pool that share addresses: the message names the
// entry, its value and the entry it overlaps (it once read `Invalid
// value: ""`).
func TestPoolWithinOverlapNamesRanges(t *testing.T) {
	create(t, pool("ov-self", v1.IPRange{CIDR: "203.0.113.0/28"}, v1.IPRange{CIDR: "203.0.113.8/29"}),
		`spec.ipRanges[1]: Invalid value: "203.0.113.8/29": overlaps ipRanges[0] (203.0.113.0/28)`)
	create(t, pool("ov-self2", v1.IPRange{Start: "203.0.113.100", End: "203.0.113.120"}, v1.IPRange{Start: "203.0.113.120", End: "203.0.113.130"}),
		`spec.ipRanges[1]: Invalid value: "203.0.113.120-203.0.113.130": overlaps ipRanges[0] (203.0.113.100-203.0.113.120)`)
}

func TestEgressIPMustLieInItsPool(t *testing.T) {
	create(t, pool("eip-in", v1.IPRange{CIDR: "203.0.113.0/28"}), "")
	create(t, egress("eip-outside", "eip-in", "203.0.113.100"), `not usable from ExternalIPPool "eip-in"`)
	create(t, egress("eip-family", "eip-in", "2001:db8::5"), `not usable from ExternalIPPool "eip-in"`)
	create(t, egress("eip-network", "eip-in", "203.0.113.0"), `not usable from ExternalIPPool "eip-in"`)
	create(t, egress("eip-ok", "eip-in", "203.0.113.5"), "")
}

// TestEgressSelectorsMustParse: selectors the schema's CEL lets through
// but the controller and agents could not parse are rejected here.
func TestEgressSelectorsMustParse(t *testing.T) {
	create(t, pool("sel-pool", v1.IPRange{CIDR: "203.0.113.32/28"}), "")
	withPod := func(name string, s *metav1.LabelSelector) *v1.Egress {
		e := egress(name, "sel-pool", "")
		e.Spec.AppliedTo.PodSelector = s
		return e
	}
	create(t, withPod("sel-ok", &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "pay", "tier": ""},
		MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "env", Operator: metav1.LabelSelectorOpIn, Values: []string{"prod", "stage"}}}}), "")
	create(t, withPod("sel-val-slash", &metav1.LabelSelector{MatchLabels: map[string]string{"team": "pay/ments"}}), "spec.appliedTo.podSelector.matchLabels")
	create(t, withPod("sel-val-long", &metav1.LabelSelector{MatchLabels: map[string]string{"app": strings.Repeat("v", 64)}}), "must be no more than 63 bytes")
	create(t, withPod("sel-val-dash", &metav1.LabelSelector{MatchLabels: map[string]string{"app": "pay-"}}), "spec.appliedTo.podSelector.matchLabels")
	create(t, withPod("sel-expr-key", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "-app", Operator: metav1.LabelSelectorOpExists}}}), "spec.appliedTo.podSelector.matchExpressions[0].key")
	create(t, withPod("sel-expr-val", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn, Values: []string{"ok", "not ok"}}}}), "spec.appliedTo.podSelector.matchExpressions[0].values[1]")
	ns := egress("sel-ns-val", "sel-pool", "")
	ns.Spec.AppliedTo.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a b"}}
	create(t, ns, "spec.appliedTo.namespaceSelector.matchLabels")
}

// TestPoolNodeSelectorMustParse: label syntax in a pool's nodeSelector that
// CEL lets through but the controller could not parse is rejected here.
func TestPoolNodeSelectorMustParse(t *testing.T) {
	withNodes := func(name, cidr string, s *metav1.LabelSelector) *v1.ExternalIPPool {
		p := pool(name, v1.IPRange{CIDR: cidr})
		p.Spec.NodeSelector = s
		return p
	}
	create(t, withNodes("ns-ok", "203.0.113.48/28", &metav1.LabelSelector{MatchLabels: map[string]string{"egress.example/gateway": "true"},
		MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "zone", Operator: metav1.LabelSelectorOpIn, Values: []string{"a", "b"}}}}), "")
	create(t, withNodes("ns-bad-key", "203.0.113.64/28", &metav1.LabelSelector{MatchLabels: map[string]string{"bad key!": "x"}}), "spec.nodeSelector.matchLabels")
	create(t, withNodes("ns-bad-val", "203.0.113.80/28", &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "has space"}}), "spec.nodeSelector.matchLabels")
	create(t, withNodes("ns-bad-expr", "203.0.113.96/28", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "zone", Operator: metav1.LabelSelectorOpIn, Values: []string{"a b"}}}}), "spec.nodeSelector.matchExpressions[0].values[0]")
}

// TestPoolNodeSelectorCheckedWhenChanged: a pool admitted earlier with an
// unparsable nodeSelector (before this check, or with the webhook down) can
// still be updated without touching it (its finalizer taken off, so it
// can be deleted); changing it to another unparsable one is refused.
func TestPoolNodeSelectorCheckedWhenChanged(t *testing.T) {
	v := &egwebhook.PoolValidator{Reader: env.Client}
	old := pool("ns-old", v1.IPRange{CIDR: "198.51.100.128/28"})
	old.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "has space"}}
	old.Finalizers = []string{controller.PoolFinalizer}
	upd := old.DeepCopy()
	upd.Finalizers = nil
	now := metav1.Now()
	upd.DeletionTimestamp = &now
	if _, err := v.ValidateUpdate(context.Background(), old, upd); err != nil {
		t.Errorf("finalizer removal of a pool with an old bad nodeSelector refused: %v", err)
	}
	upd = old.DeepCopy()
	upd.Spec.NodeSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"zone": "still bad"}}
	if _, err := v.ValidateUpdate(context.Background(), old, upd); err == nil || !strings.Contains(err.Error(), "spec.nodeSelector.matchLabels") {
		t.Errorf("a changed, unparsable nodeSelector: error %v, want one naming spec.nodeSelector.matchLabels", err)
	}
}

func TestPoolUpdateMustKeepAllocatedIPs(t *testing.T) {
	ctx := context.Background()
	create(t, pool("upd", v1.IPRange{CIDR: "192.0.2.64/28"}), "")
	create(t, egress("upd-a", "upd", "192.0.2.70"), "")
	var e v1.Egress
	poll.Until(t, 20*time.Second, "upd-a allocated", poll.Cond(func() bool {
		_ = env.Client.Get(ctx, client.ObjectKey{Name: "upd-a"}, &e)
		return e.Status.EgressIP == "192.0.2.70"
	}))
	var p v1.ExternalIPPool
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "upd"}, &p); err != nil {
		t.Fatal(err)
	}
	// Merge patches (no resourceVersion): the controller writes the pool's
	// status meanwhile, and a stale update would fail on the conflict.
	shrunk := p.DeepCopy()
	shrunk.Spec.IPRanges = []v1.IPRange{{CIDR: "192.0.2.64/30"}}
	err := env.Client.Patch(ctx, shrunk, client.MergeFrom(&p))
	if err == nil || !strings.Contains(err.Error(), "would drop 192.0.2.70, allocated to Egress upd-a") {
		t.Fatalf("shrinking update: want rejection naming the IP and Egress, got %v", err)
	}
	grown := p.DeepCopy()
	grown.Spec.IPRanges = append(grown.Spec.IPRanges, v1.IPRange{Start: "192.0.2.90", End: "192.0.2.95"})
	if err := env.Client.Patch(ctx, grown, client.MergeFrom(&p)); err != nil {
		t.Fatalf("adding a separate range: %v", err)
	}
}

func TestPoolDeletionWaitsForItsEgresses(t *testing.T) {
	ctx := context.Background()
	create(t, pool("del", v1.IPRange{CIDR: "192.0.2.128/28"}), "")
	create(t, egress("del-a", "del", ""), "")
	var p v1.ExternalIPPool
	poll.Until(t, 20*time.Second, "finalizer added", poll.Cond(func() bool {
		_ = env.Client.Get(ctx, client.ObjectKey{Name: "del"}, &p)
		return len(p.Finalizers) == 1 && p.Finalizers[0] == controller.PoolFinalizer
	}))
	if err := env.Client.Delete(ctx, &p); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 20*time.Second, "InUse condition naming del-a", poll.Cond(func() bool {
		_ = env.Client.Get(ctx, client.ObjectKey{Name: "del"}, &p)
		c := meta.FindStatusCondition(p.Status.Conditions, v1.ConditionReady)
		return p.DeletionTimestamp != nil && c != nil && c.Reason == v1.ReasonInUse && strings.Contains(c.Message, "del-a")
	}))
	// A new Egress of the pool would only hold the deletion up.
	create(t, egress("del-b", "del", ""), `ExternalIPPool "del" is being deleted`)
	if err := env.Client.Delete(ctx, egress("del-a", "del", "")); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 20*time.Second, "pool gone", poll.Cond(func() bool {
		err := env.Client.Get(ctx, client.ObjectKey{Name: "del"}, &p)
		return err != nil && client.IgnoreNotFound(err) == nil
	}))
}

// Two overlapping pools can both be admitted when created at the same
// moment (each create's check ran before the other was stored). Updates
// that leave the ranges alone (the controller's finalizer, labels) must
// still pass, or the newer pool could never get its finalizer; an update
// that changes the ranges is checked again.
func TestPoolUpdateKeepingRangesSkipsOverlapCheck(t *testing.T) {
	create(t, pool("race-a", v1.IPRange{CIDR: "198.51.100.64/28"}), "")
	v := &egwebhook.PoolValidator{Reader: env.Client}
	raced := pool("race-b", v1.IPRange{CIDR: "198.51.100.64/28"})
	var err error
	// The pool may take a moment to be listed (50 tries 100 ms apart).
	_ = poll.Wait(context.Background(), 100*time.Millisecond, 5*time.Second, func() error {
		if _, err = v.ValidateCreate(context.Background(), raced); err == nil {
			return errors.New("admitted")
		}
		return nil
	})
	if err == nil || !strings.Contains(err.Error(), `overlaps ExternalIPPool "race-a"`) {
		t.Fatalf("create of an overlapping pool = %v; want the overlap error", err)
	}
	withFinalizer := raced.DeepCopy()
	withFinalizer.Finalizers = []string{"egressip.io/pool-in-use"}
	withFinalizer.Labels = map[string]string{"team": "x"}
	if _, err := v.ValidateUpdate(context.Background(), raced, withFinalizer); err != nil {
		t.Errorf("metadata-only update of a pool that raced past the overlap check = %v; want it allowed", err)
	}
	moved := withFinalizer.DeepCopy()
	moved.Spec.IPRanges = []v1.IPRange{{CIDR: "198.51.100.72/29"}}
	if _, err := v.ValidateUpdate(context.Background(), withFinalizer, moved); err == nil || !strings.Contains(err.Error(), "overlaps") {
		t.Errorf("range update that still overlaps = %v; want the overlap error", err)
	}
}
