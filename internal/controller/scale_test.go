//go:build scale

package controller

// The scale run: go test -tags scale -run TestScale -v -timeout 30m ./internal/controller/
// (envtest; not part of make test). It creates 1000 Nodes and 5000
// Egresses, waits until every Egress is Ready, then deletes one Node, and
// reports time, status writes and heap.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/report"
	"github.com/egressip/egressip/internal/testutil/poll"
)

func TestScale(t *testing.T) {
	const nodes, egresses = 1000, 5000
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	port := freePort(t)

	// One report server for every Node: it listens on all addresses and
	// answers for the Node whose loopback address was dialled, listing the
	// IPs that Egress statuses assign to that Node.
	var mu sync.Mutex
	byNode := map[string][]report.BoundIP{}
	nodeOf := map[string]string{} // loopback address -> node
	srv := &http.Server{ReadHeaderTimeout: time.Second, Handler: report.Handler(func() report.Report { return report.Report{} })}
	srv.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		local := r.Context().Value(http.LocalAddrContextKey).(net.Addr).(*net.TCPAddr).IP.String()
		mu.Lock()
		node := nodeOf[local]
		rep := report.Report{Node: node, Instance: "scale", Bound: append([]report.BoundIP(nil), byNode[node]...)}
		mu.Unlock()
		report.Handler(func() report.Report { return rep }).ServeHTTP(w, r)
	})
	l, err := net.Listen("tcp", ":"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(l) }()
	defer func() { _ = srv.Close() }()
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		var list v1.EgressList
		if err := env.Client.List(ctx, &list); err == nil {
			m := map[string][]report.BoundIP{}
			for _, e := range list.Items {
				if ip, err := netip.ParseAddr(e.Status.EgressIP); err == nil && e.Status.EgressNode != "" {
					m[e.Status.EgressNode] = append(m[e.Status.EgressNode], report.BoundIP{IP: ip, Interface: "eth0", Announced: true})
				}
			}
			mu.Lock()
			byNode = m
			mu.Unlock()
		}
	}, 500*time.Millisecond)

	start := time.Now()
	workqueue.ParallelizeUntil(ctx, 32, nodes, func(i int) {
		name := fmt.Sprintf("scale-n%04d", i)
		addr := fmt.Sprintf("127.1.%d.%d", i/250, i%250+1)
		mu.Lock()
		nodeOf[addr] = name
		mu.Unlock()
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"egress": "true"}}}
		if err := env.Client.Create(ctx, n); err != nil {
			t.Error(err)
			return
		}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr}}
		if err := env.Client.Status().Update(ctx, n); err != nil {
			t.Error(err)
		}
	})
	p := &v1.ExternalIPPool{ObjectMeta: metav1.ObjectMeta{Name: "scale"}, Spec: v1.ExternalIPPoolSpec{IPRanges: []v1.IPRange{{CIDR: "198.18.0.0/16"}}}}
	if err := env.Client.Create(ctx, p); err != nil {
		t.Fatal(err)
	}
	workqueue.ParallelizeUntil(ctx, 32, egresses, func(i int) {
		e := &v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("scale-e%05d", i)}, Spec: v1.EgressSpec{
			AppliedTo: v1.AppliedTo{PodSelector: &metav1.LabelSelector{}}, ExternalIPPool: "scale"}}
		if err := env.Client.Create(ctx, e); err != nil {
			t.Error(err)
		}
	})
	t.Logf("created %d Nodes and %d Egresses in %v", nodes, egresses, time.Since(start))

	writes := func() float64 { return testutil.ToFloat64(statusWrites.WithLabelValues("Egress", "ok")) }
	w0 := writes()
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = 50, 100 // egressip-controller's defaults
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{Scheme: env.Scheme, Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0",
		Controller: config.Controller{SkipNameValidation: ptr.To(true)}})
	if err != nil {
		t.Fatal(err)
	}
	if err := Setup(mgr, Options{Pass: PassConfig{DefaultCapacity: 10}, Liveness: LivenessConfig{Port: port}}); err != nil {
		t.Fatal(err)
	}
	go func() { _ = mgr.Start(ctx) }()
	start = time.Now()
	countReady := func() (assigned, ready int, byNode map[string]int) {
		var list v1.EgressList
		if err := env.Client.List(ctx, &list); err != nil {
			return 0, 0, nil
		}
		byNode = map[string]int{}
		for _, e := range list.Items {
			if e.Status.EgressNode != "" {
				assigned++
				byNode[e.Status.EgressNode]++
			}
			if meta.IsStatusConditionTrue(e.Status.Conditions, v1.ConditionReady) {
				ready++
			}
		}
		return assigned, ready, byNode
	}
	var assignedAt time.Duration
	var perNode map[string]int
	if err := poll.Wait(ctx, 200*time.Millisecond, 10*time.Minute, func() error {
		a, r, bn := countReady()
		if a == egresses && assignedAt == 0 {
			assignedAt = time.Since(start)
		}
		if r != egresses {
			return fmt.Errorf("%d assigned, %d ready", a, r)
		}
		perNode = bn
		return nil
	}); err != nil {
		t.Fatalf("not all Ready after 10 minutes: %v", err)
	}
	readyAt := time.Since(start)
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	t.Logf("all %d Egresses assigned after %v, Ready after %v; Egress status writes: %.0f; heap in use %.1f MiB (test process: envtest client, fake agents and controller; %.1f MiB before the controller started)",
		egresses, assignedAt, readyAt, writes()-w0, float64(after.HeapInuse)/(1<<20), float64(before.HeapInuse)/(1<<20))
	maxLoad := 0
	for _, n := range perNode {
		maxLoad = max(maxLoad, n)
	}
	t.Logf("max Egresses on one Node: %d (average %.1f)", maxLoad, float64(egresses)/float64(nodes))

	// Delete one Node: only its Egresses should be rewritten.
	victim := "scale-n0007"
	held := perNode[victim]
	w1 := writes()
	start = time.Now()
	if err := env.Client.Delete(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: victim}}); err != nil {
		t.Fatal(err)
	}
	if err := poll.Wait(ctx, 200*time.Millisecond, 5*time.Minute, func() error {
		if a, r, bn := countReady(); bn[victim] != 0 || a != egresses || r != egresses {
			return fmt.Errorf("%d still on %s, %d assigned, %d ready", bn[victim], victim, a, r)
		}
		return nil
	}); err != nil {
		t.Fatalf("Egresses of %s not moved after 5 minutes: %v", victim, err)
	}
	time.Sleep(3 * time.Second) // let any stray writes land
	t.Logf("deleted %s holding %d Egresses: all Ready elsewhere after %v; Egress status writes issued: %.0f", victim, held, time.Since(start), writes()-w1)
}
