// Package multi runs the end-to-end tests of Egresses with several IPs
// (issue 20) on a cluster of its own: five Nodes, six selected Pods on
// each, the real controller and agents (see package harness). It needs
// root; `make test` runs it.
package multi

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/test/e2e/harness"
)

// nodes and podsPerNode size the cluster: the 5 Nodes and 30
// selected Pods spread over them.
const nodes, podsPerNode = 5, 6

// podNamespace holds the selected Pods; Egresses select it by its team
// label.
const podNamespace = "e2m-multi"

var c *harness.Cluster

func TestMain(m *testing.M) {
	os.Exit(harness.Main(m, harness.MainOptions{
		PrefixEnv: "EGRESSIP_E2E_MULTI_PREFIX", Stem: "e2m",
		Config: func(prefix, bin, logDir string) harness.Config {
			var pods []harness.PodTemplate
			for i := 1; i <= podsPerNode; i++ {
				pods = append(pods, harness.PodTemplate{Namespace: podNamespace, NamespaceLabels: map[string]string{"team": podNamespace},
					Name: fmt.Sprintf("m%d", i), Labels: map[string]string{"app": "multi"}})
			}
			return harness.Config{Prefix: prefix, Nodes: nodes, BinDir: bin, LogDir: logDir, Datapath: true, Pods: pods}
		},
		Samples: []string{"testdata/pools.yaml"},
		Started: func(cl *harness.Cluster) { c = cl },
	}))
}

// multiEgress creates Egress name with spec.ips = ips, selecting every Pod
// of podNamespace, and deletes it when the test ends.
func multiEgress(t *testing.T, name string, ips ...v1.EgressIPSource) {
	t.Helper()
	e := &v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.EgressSpec{
		AppliedTo: v1.AppliedTo{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": podNamespace}}},
		IPs:       ips}}
	if err := c.Client.Create(context.Background(), e); err != nil {
		t.Fatalf("create Egress %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		_ = c.Client.Delete(ctx, &v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: name}})
		harness.WaitFor(ctx, 10*time.Second, func() bool {
			return c.Client.Get(ctx, client.ObjectKey{Name: name}, &v1.Egress{}) != nil
		})
	})
}

// describeIPs is one line per status.ips entry, for failure messages.
func describeIPs(e *v1.Egress) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s readyIPs=%q", e.Name, e.Status.ReadyIPs)
	for _, s := range e.Status.IPs {
		fmt.Fprintf(&b, "; %s pool=%s node=%q zone=%q ready=%v reason=%s", s.IP, s.Pool, s.Node, s.Zone, s.Ready, s.Reason)
	}
	for _, cond := range e.Status.Conditions {
		fmt.Fprintf(&b, "; %s=%s %s: %s", cond.Type, cond.Status, cond.Reason, cond.Message)
	}
	return b.String()
}

// waitIPs waits up to timeout until Egress name's status satisfies ok, and
// returns it.
func waitIPs(t *testing.T, name string, timeout time.Duration, what string, ok func(*v1.Egress) bool) *v1.Egress {
	t.Helper()
	ctx := context.Background()
	var e *v1.Egress
	if !harness.WaitFor(ctx, timeout, func() bool {
		got, err := c.Egress(ctx, name)
		if err != nil {
			return false
		}
		e = got
		return ok(e)
	}) {
		if e == nil {
			t.Fatalf("%s: Egress %s not found", what, name)
		}
		t.Fatalf("%s: not within %v: %s", what, timeout, describeIPs(e))
	}
	return e
}

// allReady reports whether all n IPs of e have a Node and are Ready.
func allReady(e *v1.Egress, n int) bool {
	if len(e.Status.IPs) != n || e.Status.ReadyIPs != fmt.Sprintf("%d/%d", n, n) {
		return false
	}
	for _, s := range e.Status.IPs {
		if s.IP == "" || s.Node == "" || !s.Ready {
			return false
		}
	}
	return true
}

// holders maps every IP of e's status to its Node.
func holders(t *testing.T, e *v1.Egress) map[netip.Addr]string {
	t.Helper()
	h := map[netip.Addr]string{}
	for _, s := range e.Status.IPs {
		ip, err := netip.ParseAddr(s.IP)
		if err != nil {
			t.Fatalf("status.ips entry %+v: %v", s, err)
		}
		h[ip] = s.Node
	}
	return h
}

// threeIPs creates Egress name with 3 IPs of pool multi and waits until
// all are Ready; it returns the Egress and its holders by IP.
func threeIPs(t *testing.T, name string) (*v1.Egress, map[netip.Addr]string) {
	t.Helper()
	multiEgress(t, name, v1.EgressIPSource{Pool: "multi", Count: ptr.To[int32](3)})
	e := waitIPs(t, name, 30*time.Second, "3 IPs Ready", func(e *v1.Egress) bool { return allReady(e, 3) })
	return e, holders(t, e)
}

// ownSources counts fs by source and fails the test when one left with an
// address that is not an IP of e (holders h).
func ownSources(t *testing.T, fs []*harness.Flow, h map[netip.Addr]string, e *v1.Egress) map[netip.Addr]int {
	t.Helper()
	seen := bySource(fs)
	for ip, n := range seen {
		if h[ip] == "" {
			t.Fatalf("%d connections left with %s, which is not an IP of the Egress (%s)", n, ip, describeIPs(e))
		}
	}
	return seen
}

// awaitSpread waits up to 5 s until a new connection from every Pod of
// pods leaves with one of the IPs of h: a source Node programs the
// Egress's IPs when its watch shows them Ready, a moment after the
// status does. The checks that follow count every connection.
func awaitSpread(t *testing.T, pods []*harness.Pod, h map[netip.Addr]string) {
	t.Helper()
	start := time.Now()
	var misses []string
	if !harness.WaitFor(context.Background(), 5*time.Second, func() bool {
		for _, p := range pods {
			t0 := time.Now()
			if ip, err := c.Who(context.Background(), p, false); err != nil || h[ip] == "" {
				misses = append(misses, fmt.Sprintf("%s at +%v: %v (%v) after %v", p, t0.Sub(start).Round(time.Millisecond), ip, err, time.Since(t0).Round(time.Millisecond)))
				return false
			}
		}
		return true
	}) {
		t.Logf("not every Pod's new connection left with an IP of %v within 5s: %s", h, strings.Join(misses, "; "))
		return
	}
	if len(misses) > 0 {
		t.Logf("misses before: %s", strings.Join(misses, "; "))
	}
	t.Logf("every Pod's new connection leaves with an IP of the Egress %v after the status showed them Ready", time.Since(start).Round(time.Millisecond))
}

// podsOn returns the selected Pods whose Node is (on true) or is not (on
// false) one of names.
func podsOn(on bool, names ...string) []*harness.Pod {
	return slices.DeleteFunc(c.PodsIn(podNamespace), func(p *harness.Pod) bool { return slices.Contains(names, p.Node.Name) != on })
}

// openFlows opens perPod flows (a line every 20 ms) from every Pod of
// pods, and closes them when the test ends.
func openFlows(t *testing.T, pods []*harness.Pod, perPod int) []*harness.Flow {
	t.Helper()
	var fs []*harness.Flow
	for _, p := range pods {
		for range perPod {
			f, err := c.OpenFlow(context.Background(), p, false, 20*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			fs = append(fs, f)
		}
	}
	t.Cleanup(func() {
		for _, f := range fs {
			_ = f.Close()
		}
	})
	return fs
}

// bySource counts flows per source address.
func bySource(fs []*harness.Flow) map[netip.Addr]int {
	n := map[netip.Addr]int{}
	for _, f := range fs {
		n[f.Source]++
	}
	return n
}

// gapBound is the largest silence an undisturbed flow may show across a
// failover or a move: the 200 ms, or, when the machine itself
// stalled the flows by more in a quiet window of the same length just
// before, that stall plus 100 ms (so that a loaded CI machine's
// scheduling delays are not counted against the datapath; the test logs
// which bound applied).
func gapBound(t *testing.T, quiet time.Duration) time.Duration {
	t.Helper()
	b := max(200*time.Millisecond, quiet+100*time.Millisecond)
	if b > 200*time.Millisecond {
		t.Logf("the flows stalled %v in the quiet window before: the gap bound is %v instead of 200ms", quiet, b)
	}
	return b
}

// maxGap is the largest MaxGap(since) over fs, and the flow that had it.
func maxGap(fs []*harness.Flow, since time.Time) (time.Duration, *harness.Flow) {
	var g time.Duration
	var worst *harness.Flow
	for _, f := range fs {
		if d := f.MaxGap(since); d > g || worst == nil {
			g, worst = d, f
		}
	}
	return g, worst
}

// TestMultiIPSpread: an Egress with 3 IPs from one pool over 5 Nodes. Its
// IPs land on 3 distinct Nodes, and 60 connections from the 30 selected
// Pods (2 each) leave with exactly those 3 IPs, every IP used; each
// connection keeps its one source for its life (it echoes for 3 s without
// a reset: a source that changed midway would break it).
func TestMultiIPSpread(t *testing.T) {
	e, h := threeIPs(t, "spread")
	nodesUsed := map[string]bool{}
	for _, n := range h {
		nodesUsed[n] = true
	}
	if len(h) != 3 || len(nodesUsed) != 3 {
		t.Fatalf("want 3 IPs on 3 distinct Nodes: %s", describeIPs(e))
	}
	pods := c.PodsIn(podNamespace)
	if len(pods) != nodes*podsPerNode {
		t.Fatalf("%d selected Pods, want %d", len(pods), nodes*podsPerNode)
	}
	awaitSpread(t, pods, h)
	start := time.Now()
	fs := openFlows(t, pods, 2)
	seen := ownSources(t, fs, h, e)
	if len(seen) != 3 {
		t.Errorf("the external server saw %d sources over %d connections, want the 3 IPs: %v", len(seen), len(fs), seen)
	}
	time.Sleep(3 * time.Second)
	broken := 0
	for _, f := range fs {
		if err := f.Err(); err != nil {
			broken++
			t.Errorf("connection broke: %v", err)
		}
	}
	g, _ := maxGap(fs, start)
	t.Logf("60 connections from 30 Pods on %d Nodes: sources %v (held by %v); %d broken; largest echo gap %v", nodes, seen, h, broken, g)
}

// TestMultiIPCrash: crash the holder of one of an Egress's 3 IPs while 48
// connections from the Pods of the 4 other Nodes are open. The
// connections on the other two IPs see no reset and no gap over 200 ms;
// the third IP answers ARP from, and is Ready on, a Node that held none
// of the Egress's IPs; new connections use all 3 IPs again.
func TestMultiIPCrash(t *testing.T) {
	ctx := context.Background()
	e, h := threeIPs(t, "crash")
	victimIP := netip.MustParseAddr(e.Status.IPs[0].IP)
	victim := c.Node(h[victimIP])
	if victim == nil {
		t.Fatalf("unknown holder Node: %s", describeIPs(e))
	}
	awaitSpread(t, c.PodsIn(podNamespace), h)
	fs := openFlows(t, podsOn(false, victim.Name), 2)
	seen := ownSources(t, fs, h, e)
	t.Logf("before the crash: %d connections by source %v; %s holds %s", len(fs), seen, victim.Name, victimIP)

	quietStart := time.Now()
	time.Sleep(3 * time.Second)
	quiet, _ := maxGap(fs, quietStart)

	w, err := c.WatchARP(victimIP, 20*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	crashed := time.Now()
	if err := c.CrashNode(victim); err != nil {
		w.Stop()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.ReviveNode(victim); err != nil {
			t.Errorf("revive %s: %v", victim.Name, err)
		}
		time.Sleep(2 * time.Second) // seen alive again before the next test
	})
	var newMAC string
	arpOK := harness.WaitFor(ctx, 20*time.Second, func() bool {
		for _, r := range w.Replies() {
			if r.At.After(crashed) && r.MAC != victim.MAC.String() {
				newMAC = r.MAC
				return true
			}
		}
		return false
	})
	tookARP := time.Since(crashed)
	w.Stop()
	if !arpOK {
		t.Fatalf("%s never answered ARP from another Node within 20s of the crash of %s", victimIP, victim.Name)
	}
	after := waitIPs(t, "crash", 20*time.Second, "3 IPs Ready again", func(e *v1.Egress) bool { return allReady(e, 3) })
	tookReady := time.Since(crashed)
	h2 := holders(t, after)
	newHolder := c.Node(h2[victimIP])
	switch {
	case newHolder == nil || newHolder == victim:
		t.Fatalf("%s not moved off %s: %s", victimIP, victim.Name, describeIPs(after))
	case slices.Contains(slices.Collect(maps.Values(h)), newHolder.Name):
		t.Fatalf("%s moved to %s, which holds another IP of the Egress: %s", victimIP, newHolder.Name, describeIPs(after))
	case newHolder.MAC.String() != newMAC:
		t.Fatalf("ARP answered by %s, but the status says %s", newMAC, describeIPs(after))
	}
	for ip, n := range h {
		if ip != victimIP && h2[ip] != n {
			t.Errorf("%s moved from %s to %s, though its Node did not fail", ip, n, h2[ip])
		}
	}

	time.Sleep(time.Second) // the flows run on after the failover
	bound := gapBound(t, quiet)
	var others, own []*harness.Flow
	for _, f := range fs {
		if f.Source == victimIP {
			own = append(own, f)
		} else {
			others = append(others, f)
		}
	}
	for _, f := range others {
		if err := f.Err(); err != nil {
			t.Errorf("a connection on a surviving IP broke: %v", err)
		}
	}
	g, worst := maxGap(others, crashed)
	if g > bound {
		t.Errorf("a connection on a surviving IP stalled %v (over %v): %s from %s", g, bound, worst.Pod, worst.Source)
	}
	ownBroken := 0
	for _, f := range own {
		if f.Err() != nil {
			ownBroken++
		}
	}
	og, _ := maxGap(own, crashed)
	t.Logf("crash of %s: %s answered ARP from %s after %v, all 3 IPs Ready after %v; %d connections on the other IPs: 0 broken, largest gap %v (quiet window before: %v); %d on %s: %d broken, largest gap %v",
		victim.Name, victimIP, newHolder.Name, tookARP, tookReady, len(others), g, quiet, len(own), victimIP, ownBroken, og)

	// New connections use all three IPs again, the moved one included.
	fresh := openFlows(t, podsOn(false, victim.Name), 2)
	if got := bySource(fresh); len(got) != 3 || got[victimIP] == 0 {
		t.Errorf("new connections after the failover left with %v, want all 3 IPs of %v", got, h2)
	}
}

// TestMultiIPPlannedMove: cordon the holder of one of an Egress's 3 IPs.
// That IP moves to a Node holding none of the others; the connections on
// the other two IPs see no reset and no gap over 200 ms, and the other
// two IPs stay where they are.
func TestMultiIPPlannedMove(t *testing.T) {
	ctx := context.Background()
	e, h := threeIPs(t, "move")
	movedIP := netip.MustParseAddr(e.Status.IPs[1].IP)
	from := h[movedIP]
	awaitSpread(t, c.PodsIn(podNamespace), h)
	fs := openFlows(t, c.PodsIn(podNamespace), 2)
	ownSources(t, fs, h, e)
	quietStart := time.Now()
	time.Sleep(3 * time.Second)
	quiet, _ := maxGap(fs, quietStart)

	start := time.Now()
	if err := c.Cordon(ctx, from, true); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Cordon(context.Background(), from, false) })
	after := waitIPs(t, "move", 20*time.Second, movedIP.String()+" moved off cordoned "+from, func(e *v1.Egress) bool {
		return allReady(e, 3) && holders(t, e)[movedIP] != from
	})
	took := time.Since(start)
	h2 := holders(t, after)
	for ip, n := range h {
		if ip != movedIP && h2[ip] != n {
			t.Errorf("%s moved from %s to %s, though only %s's Node was cordoned", ip, n, h2[ip], movedIP)
		}
	}
	time.Sleep(time.Second)
	bound := gapBound(t, quiet)
	var others []*harness.Flow
	ownBroken, own := 0, 0
	for _, f := range fs {
		if f.Source == movedIP {
			own++
			if f.Err() != nil {
				ownBroken++
			}
			continue
		}
		others = append(others, f)
		if err := f.Err(); err != nil {
			t.Errorf("a connection on an IP that did not move broke: %v", err)
		}
	}
	g, worst := maxGap(others, start)
	if g > bound {
		t.Errorf("a connection on an IP that did not move stalled %v (over %v): %s from %s", g, bound, worst.Pod, worst.Source)
	}
	t.Logf("planned move of %s from %s to %s: Ready after %v; %d connections on the other IPs: 0 broken, largest gap %v (quiet window before: %v); %d on %s: %d broken",
		movedIP, from, h2[movedIP], took, len(others), g, quiet, own, movedIP, ownBroken)
}
