package agent_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent"
	"github.com/egressip/egressip/internal/agent/bind"
	"github.com/egressip/egressip/internal/testenv"
	"github.com/egressip/egressip/internal/testutil/netnstest"
	"github.com/egressip/egressip/internal/testutil/poll"
)

var ctx = context.Background()

func ip(s string) netip.Addr { return netip.MustParseAddr(s) }

// TestAgentBindsOnlyItsOwnEgresses: the agent's cache holds only the
// Egresses assigned to its Node; it binds and announces exactly their IPs
// (a shared IP once), reports them as announced, and keeps an IP while an
// Egress being deleted still names the Node.
func TestAgentBindsOnlyItsOwnEgresses(t *testing.T) {
	env := apiServer(t)
	c := env.Client
	n := newTestNode(t)
	other := uniq("other-node")
	p4 := createPool(t, c, "192.0.2.0/24", "192.0.2.1", 24)
	p6 := createPool(t, c, "2001:db8::/64", "2001:db8::1", 64)

	mine4 := createEgress(t, c, "mine4", p4, "192.0.2.10", n.name)
	mine6 := createEgress(t, c, "mine6", p6, "2001:db8::10", n.name)
	shareA := createEgress(t, c, "share-a", p4, "192.0.2.11", n.name)
	shareB := createEgress(t, c, "share-b", p4, "192.0.2.11", n.name)
	createEgress(t, c, "theirs", p4, "192.0.2.12", other)
	createEgress(t, c, "unassigned", p4, "192.0.2.13", "")

	v4 := map[string]string{"family": "ipv4"}
	v6 := map[string]string{"family": "ipv6"}
	ann4, ann6 := metricValue(t, "egressip_agent_announcements_total", v4), metricValue(t, "egressip_agent_announcements_total", v6)

	r := startAgent(t, env.Config, n.name, newAgent(t, n.config()))
	want := []netip.Addr{ip("192.0.2.10"), ip("192.0.2.11"), ip("2001:db8::10")}
	poll.Until(t, 15*time.Second, "report lists our IPs as announced", func() error {
		rep, err := r.report(ctx)
		if err != nil {
			return err
		}
		if rep.Node != n.name || rep.Instance == "" || rep.Instance != r.agent.Instance() {
			return fmt.Errorf("report node %q instance %q", rep.Node, rep.Instance)
		}
		return wantReport(rep, n.NodeIf, true, want...)
	})
	if _, err := n.capture.waitAnnouncements(5*time.Second, want...); err != nil {
		t.Fatalf("peer: %v", err)
	}

	owned := n.owned(t)
	if len(owned) != len(want) {
		t.Errorf("owned addresses %v, want %v", owned, want)
	}
	for _, w := range want {
		if owned[w] != n.NodeIf {
			t.Errorf("%s owned on %q, want %q", w, owned[w], n.NodeIf)
		}
	}
	for _, s := range []string{"192.0.2.12", "192.0.2.13"} {
		if n.present(t, ip(s)) {
			t.Errorf("%s (not assigned to this node) is on the node", s)
		}
	}

	// The holder index of the cache lists only our Egresses.
	var cached v1alpha1.EgressList
	if err := r.mgr.GetCache().List(ctx, &cached, client.MatchingFields{agent.HolderIndex: n.name}); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range cached.Items {
		names = append(names, e.Name)
	}
	slices.Sort(names)
	wantNames := []string{mine4, mine6, shareA, shareB}
	slices.Sort(wantNames)
	if !slices.Equal(names, wantNames) {
		t.Errorf("cached Egresses %v, want only %v", names, wantNames)
	}
	var all v1alpha1.EgressList
	if err := c.List(ctx, &all); err != nil {
		t.Fatal(err)
	}
	if len(all.Items) < len(wantNames)+2 {
		t.Fatalf("API server holds %d Egresses, want at least %d", len(all.Items), len(wantNames)+2)
	}

	if got := metricValue(t, "egressip_agent_bound_ips", v4); got != 2 {
		t.Errorf("bound_ips{ipv4} = %v, want 2", got)
	}
	if got := metricValue(t, "egressip_agent_bound_ips", v6); got != 1 {
		t.Errorf("bound_ips{ipv6} = %v, want 1", got)
	}
	if d := metricValue(t, "egressip_agent_announcements_total", v4) - ann4; d < 2 {
		t.Errorf("announcements_total{ipv4} grew by %v, want >= 2", d)
	}
	if d := metricValue(t, "egressip_agent_announcements_total", v6) - ann6; d < 1 {
		t.Errorf("announcements_total{ipv6} grew by %v, want >= 1", d)
	}

	// A shared IP stays while one of its Egresses remains.
	if err := c.Delete(ctx, &v1alpha1.Egress{ObjectMeta: metaName(shareA)}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "share-a leaves the agent's cache", func() error {
		err := r.mgr.GetCache().Get(ctx, client.ObjectKey{Name: shareA}, &v1alpha1.Egress{})
		if err == nil {
			return errors.New("still cached")
		}
		if !apierrors.IsNotFound(err) {
			return err
		}
		return nil
	})
	waitReconcile(t)
	if !n.present(t, ip("192.0.2.11")) {
		t.Fatal("192.0.2.11 removed although Egress share-b still uses it")
	}

	// An Egress being deleted (held by a finalizer) that still names this
	// Node stays bound until its status changes or it is gone.
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var e v1alpha1.Egress
		if err := c.Get(ctx, client.ObjectKey{Name: shareB}, &e); err != nil {
			return err
		}
		e.Finalizers = append(e.Finalizers, "test.egressip.io/hold")
		return c.Update(ctx, &e)
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, &v1alpha1.Egress{ObjectMeta: metaName(shareB)}); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "the agent's cache sees share-b being deleted", func() error {
		var e v1alpha1.Egress
		if err := r.mgr.GetCache().Get(ctx, client.ObjectKey{Name: shareB}, &e); err != nil {
			return err
		}
		if e.DeletionTimestamp == nil {
			return errors.New("no deletionTimestamp yet")
		}
		return nil
	})
	waitReconcile(t)
	if !n.present(t, ip("192.0.2.11")) {
		t.Fatal("192.0.2.11 removed while its Egress, being deleted, still names this node")
	}
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var e v1alpha1.Egress
		if err := c.Get(ctx, client.ObjectKey{Name: shareB}, &e); err != nil {
			return err
		}
		e.Finalizers = nil
		return c.Update(ctx, &e)
	})
	if err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 10*time.Second, "192.0.2.11 released once no Egress uses it", func() error {
		if n.present(t, ip("192.0.2.11")) {
			return errors.New("still bound")
		}
		rep, err := r.report(ctx)
		if err != nil {
			return err
		}
		return wantReport(rep, n.NodeIf, true, ip("192.0.2.10"), ip("2001:db8::10"))
	})
}

func metaName(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name} }

// waitReconcile waits until a reconcile that started after the call has
// completed (the count grows by 2: one may have been under way).
func waitReconcile(t *testing.T) {
	t.Helper()
	rc := reconcileCount(t)
	poll.Until(t, 10*time.Second, "two more reconciles", func() error {
		if reconcileCount(t) < rc+2 {
			return errors.New("not yet")
		}
		return nil
	})
}

// TestAgentRestartAdoptsAndCleansUp: a new agent instance finds a stale
// owned address, a still-assigned owned address and foreign addresses inside
// the pool range. It reports what it found before its first reconcile, then
// removes only the stale one, re-announces the assigned one and leaves the
// foreign ones, the Node's own address and the routes alone.
func TestAgentRestartAdoptsAndCleansUp(t *testing.T) {
	env := apiServer(t)
	c := env.Client
	n := newTestNode(t)
	routes4 := n.Node.MustIP(t, "-4", "route", "show", "table", "main")
	routes6 := n.Node.MustIP(t, "-6", "route", "show", "table", "main")

	prev, err := bind.New(n.Node.Handle, bind.Config{})
	if err != nil {
		t.Fatal(err)
	}
	stale, kept := ip("192.0.2.50"), ip("192.0.2.51")
	foreign, foreignAssigned := ip("192.0.2.52"), ip("192.0.2.53")
	for _, a := range []netip.Addr{stale, kept} {
		if _, err := prev.Bind(a); err != nil {
			t.Fatalf("previous instance: bind %s: %v", a, err)
		}
	}
	prev.Close()
	n.Node.MustIP(t, "addr", "add", foreign.String()+"/32", "dev", n.NodeIf)
	n.Node.MustIP(t, "addr", "add", foreignAssigned.String()+"/32", "dev", n.NodeIf)

	pool := createPool(t, c, "192.0.2.48/28", "192.0.2.1", 24)
	createEgress(t, c, "kept", pool, kept.String(), n.name)
	createEgress(t, c, "clash", pool, foreignAssigned.String(), n.name)
	createEgress(t, c, "stale-now-elsewhere", pool, stale.String(), uniq("other-node"))

	a := newAgent(t, n.config())
	// Before any reconcile the report shows what the kernel holds, not yet
	// announced by this instance.
	if err := wantReport(a.Report(), n.NodeIf, false, stale, kept); err != nil {
		t.Fatalf("before the first reconcile: %v", err)
	}
	if err := a.ReadyCheck(nil); err == nil {
		t.Error("ready before the first reconcile")
	}
	bindErrs := metricValue(t, "egressip_agent_bind_errors_total", nil)

	n.capture.drop()
	r := startAgent(t, env.Config, n.name, a)
	poll.Until(t, 15*time.Second, "stale IP removed, kept IP re-announced", func() error {
		rep, err := r.report(ctx)
		if err != nil {
			return err
		}
		return wantReport(rep, n.NodeIf, true, kept)
	})
	if _, err := n.capture.waitAnnouncements(5*time.Second, kept); err != nil {
		t.Fatalf("peer: %v", err)
	}
	if err := a.ReadyCheck(nil); err != nil {
		t.Errorf("not ready after reconciling: %v", err)
	}
	if n.present(t, stale) {
		t.Errorf("stale %s still bound", stale)
	}
	for _, f := range []netip.Addr{foreign, foreignAssigned} {
		if !n.present(t, f) {
			t.Errorf("foreign address %s was removed", f)
		}
	}
	owned := n.owned(t)
	if len(owned) != 1 || owned[kept] != n.NodeIf {
		t.Errorf("owned = %v, want only %s on %s (foreign addresses must stay unmarked)", owned, kept, n.NodeIf)
	}
	if !n.present(t, ip("192.0.2.2")) {
		t.Error("the node's own address 192.0.2.2 is gone")
	}
	if got := n.Node.MustIP(t, "-4", "route", "show", "table", "main"); got != routes4 {
		t.Errorf("IPv4 main table changed:\nbefore:\n%s\nafter:\n%s", routes4, got)
	}
	if got := n.Node.MustIP(t, "-6", "route", "show", "table", "main"); got != routes6 {
		t.Errorf("IPv6 main table changed:\nbefore:\n%s\nafter:\n%s", routes6, got)
	}
	if d := metricValue(t, "egressip_agent_bind_errors_total", nil) - bindErrs; d < 1 {
		t.Errorf("bind_errors_total grew by %v, want >= 1 for the assigned IP held by a foreign address", d)
	}
}

// TestAgentReleasesEgressMovedAway: when status.egressNode names another
// Node the IP is unbound here, its announcements stop, and the report drops
// it; other IPs are not disturbed.
func TestAgentReleasesEgressMovedAway(t *testing.T) {
	env := apiServer(t)
	c := env.Client
	n := newTestNode(t)
	pool := createPool(t, c, "192.0.2.0/24", "192.0.2.1", 24)
	moving := createEgress(t, c, "moving", pool, "192.0.2.20", n.name)
	createEgress(t, c, "staying", pool, "192.0.2.21", n.name)

	r := startAgent(t, env.Config, n.name, newAgent(t, n.config()))
	poll.Until(t, 15*time.Second, "both bound and announced", func() error {
		rep, err := r.report(ctx)
		if err != nil {
			return err
		}
		return wantReport(rep, n.NodeIf, true, ip("192.0.2.20"), ip("192.0.2.21"))
	})

	// Move while the burst (0, 1, 2, 4 s) is still running.
	setStatus(t, c, moving, "192.0.2.20", uniq("other-node"))
	poll.Until(t, 10*time.Second, "moved IP released and dropped from the report", func() error {
		if n.present(t, ip("192.0.2.20")) {
			return errors.New("192.0.2.20 still bound")
		}
		rep, err := r.report(ctx)
		if err != nil {
			return err
		}
		return wantReport(rep, n.NodeIf, true, ip("192.0.2.21"))
	})
	time.Sleep(100 * time.Millisecond)
	n.capture.drop()
	if got := n.capture.countAnnouncements(4500*time.Millisecond, ip("192.0.2.20")); got[ip("192.0.2.20")] != 0 {
		t.Errorf("%d announcements for 192.0.2.20 after it was released", got[ip("192.0.2.20")])
	}
	if owned := n.owned(t); len(owned) != 1 || owned[ip("192.0.2.21")] == "" {
		t.Errorf("owned = %v, want only 192.0.2.21", owned)
	}
}

// TestAgentKeepsIPsWhileAPIServerIsDown: with the API server stopped for
// 30 s the agent keeps reconciling from its cache: nothing is removed, the
// report keeps listing the IPs, and an address removed by hand is restored.
func TestAgentKeepsIPsWhileAPIServerIsDown(t *testing.T) {
	netnstest.RequireRoot(t)
	env, err := testenv.Start()
	if err != nil {
		t.Fatalf("start a dedicated envtest: %v", err)
	}
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = env.Stop()
		}
	})
	c := env.Client
	n := newTestNode(t)
	p4 := createPool(t, c, "192.0.2.0/24", "192.0.2.1", 24)
	p6 := createPool(t, c, "2001:db8::/64", "2001:db8::1", 64)
	createEgress(t, c, "v4", p4, "192.0.2.30", n.name)
	createEgress(t, c, "v6", p6, "2001:db8::30", n.name)
	want := []netip.Addr{ip("192.0.2.30"), ip("2001:db8::30")}

	cfg := n.config()
	cfg.ResyncPeriod = time.Second
	r := startAgent(t, env.Config, n.name, newAgent(t, cfg))
	poll.Until(t, 15*time.Second, "bound and announced", func() error {
		rep, err := r.report(ctx)
		if err != nil {
			return err
		}
		return wantReport(rep, n.NodeIf, true, want...)
	})

	// Stop the control plane. envtest sends SIGTERM and, if kube-apiserver
	// has not exited after its stop timeout (it keeps draining the agent's
	// watches), SIGKILL; the agent is watched during the stop as well.
	stopDone := make(chan error, 1)
	stopping := time.Now()
	go func() { stopDone <- env.Stop() }()
	stopped = true
	var down time.Time // when Stop returned
	rc := reconcileCount(t)
	removedByHand := false
	var restoredAfter time.Duration
	reportFailures := 0
	for down.IsZero() || time.Since(down) < 30*time.Second {
		select {
		case err := <-stopDone:
			down = time.Now()
			if err != nil {
				t.Logf("stopping the control plane took %s: %v", down.Sub(stopping).Round(time.Millisecond), err)
			}
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			err = c.Get(cctx, client.ObjectKey{Name: "any"}, &v1alpha1.Egress{})
			cancel()
			if err == nil || apierrors.IsNotFound(err) {
				t.Fatalf("API server still answers after Stop: %v", err)
			}
		default:
		}
		owned := n.owned(t)
		for _, w := range want {
			if owned[w] != "" {
				continue
			}
			if w == want[0] && removedByHand && restoredAfter == 0 {
				continue // removed by the test below, not yet restored
			}
			t.Fatalf("%s unbound %s after stopping the API server", w, time.Since(stopping).Round(time.Millisecond))
		}
		if removedByHand && restoredAfter == 0 && owned[want[0]] != "" {
			restoredAfter = time.Since(down)
		}
		rep, err := r.report(ctx)
		if err != nil {
			// One answer slower than the client's 2 s on a loaded
			// machine (seen once at load 18) is not the property; three
			// in a row are.
			if reportFailures++; reportFailures >= 3 {
				t.Fatalf("report during the outage, %d failures in a row: %v", reportFailures, err)
			}
			t.Logf("report during the outage failed (%d in a row): %v", reportFailures, err)
			continue
		}
		reportFailures = 0
		if (!removedByHand || restoredAfter != 0) && len(rep.Bound) != len(want) {
			t.Fatalf("report during the outage lists %v, want %v", rep.Bound, want)
		}
		if !removedByHand && !down.IsZero() && time.Since(down) > 10*time.Second {
			n.Node.MustIP(t, "addr", "del", want[0].String()+"/32", "dev", n.NodeIf)
			removedByHand = true
		}
		time.Sleep(250 * time.Millisecond)
	}
	if restoredAfter == 0 {
		t.Errorf("%s removed by hand during the outage was not restored", want[0])
	}
	reconciles := reconcileCount(t) - rc
	if reconciles < 10 {
		t.Errorf("only %v reconciles during 30 s of outage with a 1 s resync", reconciles)
	}
	t.Logf("control plane stopping for %s, then down for %s: %v reconciles, nothing removed; address removed by hand 10 s into the outage restored at %s",
		down.Sub(stopping).Round(time.Second), time.Since(down).Round(time.Second), reconciles, restoredAfter.Round(time.Millisecond))
}

// TestAgentStartsWhileAPIServerIsUnreachable: an agent that cannot reach the
// API server at start-up never reconciles, so it removes nothing; it
// reports what the kernel holds and is not ready.
func TestAgentStartsWhileAPIServerIsUnreachable(t *testing.T) {
	n := newTestNode(t)
	prev, err := bind.New(n.Node.Handle, bind.Config{})
	if err != nil {
		t.Fatal(err)
	}
	held := ip("192.0.2.40")
	if _, err := prev.Bind(held); err != nil {
		t.Fatal(err)
	}
	prev.Close()

	a := newAgent(t, n.config())
	unreachable := &rest.Config{Host: "https://127.0.0.1:1", Timeout: time.Second}
	r := startAgent(t, unreachable, n.name, a)
	time.Sleep(5 * time.Second)
	if n.owned(t)[held] == "" {
		t.Fatalf("%s removed although the desired state was never read", held)
	}
	rep, err := r.report(ctx)
	if err != nil {
		t.Fatalf("report: %v", err)
	}
	if err := wantReport(rep, n.NodeIf, false, held); err != nil {
		t.Fatal(err)
	}
	if err := a.ReadyCheck(nil); err == nil {
		t.Error("ready without ever reading the Egresses")
	}
	r.stop(t)
	if n.owned(t)[held] == "" {
		t.Fatalf("%s removed on shutdown", held)
	}
}

// TestRunCancelLeavesAddressesBound: Run returns nil when its context is
// cancelled (what SIGTERM does in egressip-agent) and unbinds nothing.
func TestRunCancelLeavesAddressesBound(t *testing.T) {
	env := apiServer(t)
	c := env.Client
	n := newTestNode(t)
	pool := createPool(t, c, "192.0.2.0/24", "192.0.2.1", 24)
	createEgress(t, c, "held", pool, "192.0.2.60", n.name)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- agent.Run(runCtx, agent.RunOptions{Config: n.config(), REST: env.Config, ReportListener: ln})
	}()
	poll.Until(t, 15*time.Second, "bound and announced", func() error {
		rep, err := getReport(ctx, port)
		if err != nil {
			return err
		}
		return wantReport(rep, n.NodeIf, true, ip("192.0.2.60"))
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after cancel: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Run did not return within 60 s of cancel")
	}
	if n.owned(t)[ip("192.0.2.60")] != n.NodeIf {
		t.Fatal("192.0.2.60 was unbound on shutdown")
	}
	if _, err := getReport(ctx, port); err == nil {
		t.Error("report still served after Run returned")
	}
}

// TestStatusChangeToGARPLatency measures, 10 times, the time from the
// status update that assigns an Egress to this Node (when the update call
// returns) to its gratuitous ARP arriving at the peer, and logs the median.
// It asserts that every GARP arrives within 10 s and that the median is
// under 5 s: a bound far from the expected value (a watch event and a
// reconcile, about 100 ms), so that only a stalled path fails, never a
// loaded machine. The speed itself is for benchmarks
// (BenchmarkBindToGARP in internal/agent/announce).
func TestStatusChangeToGARPLatency(t *testing.T) {
	env := apiServer(t)
	c := env.Client
	n := newTestNode(t)
	pool := createPool(t, c, "192.0.2.0/24", "192.0.2.1", 24)
	elsewhere := uniq("other-node")
	const runs = 10
	names := make([]string, runs)
	for i := range runs {
		names[i] = createEgress(t, c, "lat", pool, fmt.Sprintf("192.0.2.%d", 100+i), elsewhere)
	}
	a := newAgent(t, n.config())
	startAgent(t, env.Config, n.name, a)
	poll.Until(t, 15*time.Second, "first reconcile", func() error { return a.ReadyCheck(nil) })

	var ds []time.Duration
	for i := range runs {
		target := ip(fmt.Sprintf("192.0.2.%d", 100+i))
		n.capture.drop()
		setStatus(t, c, names[i], target.String(), n.name)
		t0 := time.Now()
		seen, err := n.capture.waitAnnouncements(10*time.Second, target)
		if err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		ds = append(ds, seen[target].Sub(t0))
	}
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	median := (sorted[runs/2-1] + sorted[runs/2]) / 2
	t.Logf("status update returned -> GARP at peer, %d runs: median %s, min %s, max %s (all %v)",
		runs, median, sorted[0], sorted[runs-1], ds)
	if bound := 5 * time.Second; median > bound { // expected ~100 ms: 50 times that
		t.Errorf("median status update -> GARP %v, want under %v", median, bound)
	}
}

// TestAgentOwnershipRecordUnreadable: an agent in record mode whose
// ownership record is corrupt starts, reports the problem (report and
// log) and changes no address until the file is dealt with; once the
// operator deletes it, the assigned IP is bound and the address the lost
// record listed is left alone.
func TestAgentOwnershipRecordUnreadable(t *testing.T) {
	env := apiServer(t)
	c := env.Client
	n := newTestNode(t)
	path := filepath.Join(t.TempDir(), "ownership.json")
	prev, err := bind.New(n.Node.Handle, bind.Config{Ownership: bind.OwnershipRecord, RecordPath: path})
	if err != nil {
		t.Fatal(err)
	}
	earlier, assigned := ip("192.0.2.51"), ip("192.0.2.52")
	if _, err := prev.Bind(earlier); err != nil {
		t.Fatal(err)
	}
	prev.Close()
	if err := os.WriteFile(path, []byte("{\"version\":1,"), 0o600); err != nil {
		t.Fatal(err)
	}
	pool := createPool(t, c, "192.0.2.48/28", "192.0.2.1", 24)
	createEgress(t, c, "rec", pool, assigned.String(), n.name)

	cfg := n.config()
	cfg.Ownership, cfg.RecordPath = bind.OwnershipRecord, path
	a := newAgent(t, cfg)
	if o := a.Report().Ownership; o == nil || o.Healthy || o.Reason != v1alpha1.ReasonRecordUnreadable || !strings.Contains(o.Message, "fix or delete the file") {
		t.Fatalf("report ownership before the first reconcile = %+v; want unhealthy, %s, saying what to do", o, v1alpha1.ReasonRecordUnreadable)
	}
	rc := reconcileCount(t)
	r := startAgent(t, env.Config, n.name, a)
	poll.Until(t, 15*time.Second, "two reconciles", func() error {
		if reconcileCount(t) < rc+2 {
			return errors.New("not yet")
		}
		return nil
	})
	if !n.present(t, earlier) || n.present(t, assigned) {
		t.Fatalf("with a corrupt record: %s present %v (want true), %s present %v (want false)", earlier, n.present(t, earlier), assigned, n.present(t, assigned))
	}
	if rep, err := r.report(ctx); err != nil || rep.Ownership == nil || rep.Ownership.Healthy {
		t.Fatalf("served report = %+v, %v; want an unhealthy ownership status", rep.Ownership, err)
	}

	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 15*time.Second, "assigned IP bound once the record is gone", func() error {
		rep, err := r.report(ctx)
		if err != nil {
			return err
		}
		if rep.Ownership == nil || !rep.Ownership.Healthy {
			return fmt.Errorf("ownership %+v", rep.Ownership)
		}
		return wantReport(rep, n.NodeIf, true, assigned)
	})
	if !n.present(t, earlier) {
		t.Errorf("%s, listed by the corrupt record, was removed; want it left alone", earlier)
	}
}
