package e2e

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/test/e2e/harness"
)

// conflictBound is the bound for the Conflict condition to appear
// after a rogue binds the IP, and to clear after it leaves: at most one
// probe interval (10 s, the agent's default) plus a probe round (0.7 s),
// a poll (1 s) and the pass.
const conflictBound = 15 * time.Second

// TestDuplicateIPRogueHost (issue 16 item 3): a namespace on the bridge
// that is not a Node binds an Egress's IP. The Conflict condition appears
// within 15 s, naming the rogue's MAC, with a Warning Event and the
// metrics; the Egress keeps its Node throughout (the agent keeps the
// address); the condition turns False within 15 s after the rogue leaves.
// Both families, agents with default flags.
func TestDuplicateIPRogueHost(t *testing.T) {
	for _, tc := range []struct{ fam, pool, ip string }{
		{"ipv4", "office-egress", "192.0.2.117"},
		{"ipv6", "office-egress-v6", "2001:db8::1a0"},
	} {
		t.Run(tc.fam, func(t *testing.T) {
			ctx := context.Background()
			name := "dupip-" + tc.fam
			newEgress(t, name, tc.pool, tc.ip)
			e := waitReady(t, name)[name]
			node := e.Status.EgressNode
			ip := netip.MustParseAddr(tc.ip)
			detected0 := agentMetric(t, c.Node(node), "egressip_agent_ip_conflicts_detected_total", tc.fam)

			rogue, err := c.AddRogue(ip)
			if err != nil {
				t.Fatal(err)
			}
			defer rogue.Remove()
			added := time.Now()
			mac := rogue.MAC.String()
			var cond *metav1.Condition
			keepsNode := func(e *v1.Egress) {
				if e.Status.EgressNode != node {
					t.Fatalf("the Egress left Node %s: %s", node, harness.Describe(e))
				}
			}
			ok := harness.WaitFor(ctx, 30*time.Second, func() bool {
				e, err := c.Egress(ctx, name)
				if err != nil {
					return false
				}
				keepsNode(e)
				cond = meta.FindStatusCondition(e.Status.Conditions, v1.ConditionConflict)
				return cond != nil && cond.Status == metav1.ConditionTrue
			})
			appeared := time.Since(added)
			if !ok {
				t.Fatalf("no Conflict condition within 30 s of the rogue binding %s", ip)
			}
			if cond.Reason != v1.ReasonDuplicateIP || !strings.Contains(cond.Message, mac) || !strings.Contains(cond.Message, "not a Node of this cluster") {
				t.Fatalf("Conflict condition %+v does not name the rogue's MAC %s", cond, mac)
			}
			t.Logf("Conflict=True %v after the rogue bound %s: %s", appeared.Round(time.Millisecond), ip, cond.Message)
			if appeared > conflictBound {
				t.Errorf("Conflict appeared after %v, bound %v", appeared, conflictBound)
			}
			if !harness.WaitFor(ctx, 10*time.Second, func() bool { return hasEvent(ctx, name, v1.ReasonDuplicateIP, mac) }) {
				t.Errorf("no %s Warning Event naming %s", v1.ReasonDuplicateIP, mac)
			}
			if d := agentMetric(t, c.Node(node), "egressip_agent_ip_conflicts_detected_total", tc.fam); d < detected0+1 {
				t.Errorf("egressip_agent_ip_conflicts_detected_total{family=%s} = %v, was %v", tc.fam, d, detected0)
			}
			if g := agentMetric(t, c.Node(node), "egressip_agent_ip_conflicts", tc.fam); g < 1 {
				t.Errorf("egressip_agent_ip_conflicts{family=%s} = %v during the conflict", tc.fam, g)
			}
			if g := controllerMetric(t, "egressip_controller_ip_conflicts"); g < 1 {
				t.Errorf("egressip_controller_ip_conflicts = %v during the conflict", g)
			}

			rogue.Remove()
			left := time.Now()
			ok = harness.WaitFor(ctx, 30*time.Second, func() bool {
				e, err := c.Egress(ctx, name)
				if err != nil {
					return false
				}
				keepsNode(e)
				cond = meta.FindStatusCondition(e.Status.Conditions, v1.ConditionConflict)
				return cond != nil && cond.Status == metav1.ConditionFalse
			})
			cleared := time.Since(left)
			if !ok {
				t.Fatalf("Conflict did not clear within 30 s of the rogue leaving: %+v", cond)
			}
			t.Logf("Conflict=False %v after the rogue left (%s)", cleared.Round(time.Millisecond), cond.Reason)
			if cleared > conflictBound {
				t.Errorf("Conflict cleared after %v, bound %v", cleared, conflictBound)
			}
			e = waitReady(t, name)[name]
			keepsNode(e)
			checkReachable(t, e)
		})
	}
}

// hasEvent reports whether an Event of reason whose note contains sub
// regards the Egress name.
func hasEvent(ctx context.Context, name, reason, sub string) bool {
	var evs eventsv1.EventList
	if err := c.Client.List(ctx, &evs); err != nil {
		return false
	}
	for _, ev := range evs.Items {
		if ev.Regarding.Name == name && ev.Reason == reason && strings.Contains(ev.Note, sub) {
			return true
		}
	}
	return false
}

// scrapeMetric returns the sum of the samples of name{family="fam"}
// (fam empty: every sample of name) served at url, 0 when absent.
func scrapeMetric(t *testing.T, url, name, fam string) float64 {
	t.Helper()
	var want map[string]string
	if fam != "" {
		want = map[string]string{"family": fam}
	}
	v, _, err := harness.ScrapeMetric(context.Background(), url, name, want, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func agentMetric(t *testing.T, n *harness.Node, name, fam string) float64 {
	t.Helper()
	return scrapeMetric(t, fmt.Sprintf("http://%s:%d/metrics", n.IPv4, harness.AgentMetricsPort), name, fam)
}

func controllerMetric(t *testing.T, name string) float64 {
	t.Helper()
	return scrapeMetric(t, "http://"+harness.ControllerMetricsAddr+"/metrics", name, "")
}
