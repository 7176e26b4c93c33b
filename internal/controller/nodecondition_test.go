package controller

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/report"
)

// TestNodeDatapathCondition: an agent's host stack finding becomes the
// Node condition EgressDatapathSupported (False with the evidence and a
// Warning Event; True again with a Normal Event when it clears), the
// kubelet's Ready condition is left alone, and a Node whose agent serves
// no finding gets no condition.
func TestNodeDatapathCondition(t *testing.T) {
	cl := newCluster(t, "dpc", 2, 4)
	bypassed, silent := "dpc-n1", "dpc-n2"
	cond := func(node string) (corev1.NodeCondition, bool, *corev1.Node) {
		var n corev1.Node
		if err := cl.c.Get(cl.ctx, client.ObjectKey{Name: node}, &n); err != nil {
			t.Fatal(err)
		}
		for _, c := range n.Status.Conditions {
			if c.Type == v1.NodeConditionDatapath {
				return c, true, &n
			}
		}
		return corev1.NodeCondition{}, false, &n
	}
	event := func(node, reason string) (bool, string) {
		var evs eventsv1.EventList
		if err := cl.c.List(cl.ctx, &evs); err != nil {
			return false, err.Error()
		}
		for _, ev := range evs.Items {
			if ev.Regarding.Name == node && ev.Reason == reason {
				return true, ev.Note
			}
		}
		return false, fmt.Sprintf("%d events, none %s for %s", len(evs.Items), reason, node)
	}

	evidence := `tc BPF program "cil_from_container" in direct-action mode on the ingress of lxc1 (route to Pod 10.0.1.5)`
	cl.agents[bypassed].setDatapath(&report.DatapathStatus{Supported: false, Reason: v1.ReasonHostStackBypass, Message: evidence})
	cl.eventually("condition False with the evidence", func() (bool, string) {
		c, ok, _ := cond(bypassed)
		return ok && c.Status == corev1.ConditionFalse && c.Reason == v1.ReasonHostStackBypass && c.Message == evidence, fmt.Sprintf("%+v", c)
	})
	cl.eventually("Warning Event", func() (bool, string) {
		ok, note := event(bypassed, v1.ReasonHostStackBypass)
		return ok && strings.Contains(note, "lxc1"), note
	})
	_, _, n := cond(bypassed)
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady && c.Status != corev1.ConditionTrue {
			t.Errorf("Ready condition changed: %+v", c)
		}
	}
	first, _, _ := cond(bypassed)

	cl.agents[bypassed].setDatapath(&report.DatapathStatus{Supported: true, Reason: v1.ReasonHostStack, Message: "no eBPF bypass of the host stack found (1 Pod devices examined)"})
	cl.eventually("condition True again", func() (bool, string) {
		c, ok, _ := cond(bypassed)
		return ok && c.Status == corev1.ConditionTrue && c.Reason == v1.ReasonHostStack, fmt.Sprintf("%+v", c)
	})
	cl.eventually("Normal Event", func() (bool, string) { return event(bypassed, v1.EventDatapathSupported) })
	if c, _, _ := cond(bypassed); c.LastTransitionTime.Before(&first.LastTransitionTime) {
		t.Errorf("transition time went back: %v then %v", first.LastTransitionTime, c.LastTransitionTime)
	}

	// Someone removes the condition by hand: it is written again.
	_, _, n = cond(bypassed)
	orig := n.DeepCopy()
	var kept []corev1.NodeCondition
	for _, c := range n.Status.Conditions {
		if c.Type != v1.NodeConditionDatapath {
			kept = append(kept, c)
		}
	}
	n.Status.Conditions = kept
	if err := cl.c.Status().Patch(cl.ctx, n, client.MergeFrom(orig)); err != nil {
		t.Fatal(err)
	}
	cl.eventually("condition restored", func() (bool, string) {
		c, ok, _ := cond(bypassed)
		return ok && c.Status == corev1.ConditionTrue, fmt.Sprintf("%+v", c)
	})

	if c, ok, _ := cond(silent); ok {
		t.Errorf("Node whose agent serves no finding got a condition: %+v", c)
	}
}

// TestNodeOwnershipCondition: an agent's ownership status becomes the Node
// condition EgressIPOwnershipKnown: True naming the mechanism, False with
// the agent's message (what to do) and a Warning Event while its record is
// unreadable, True again with a Normal Event; the datapath condition beside
// it is kept.
func TestNodeOwnershipCondition(t *testing.T) {
	cl := newCluster(t, "own", 1, 4)
	node := "own-n1"
	cond := func(typ corev1.NodeConditionType) (corev1.NodeCondition, bool) {
		return nodeCondition(t, cl, node, typ)
	}
	event := func(reason string) (bool, string) {
		var evs eventsv1.EventList
		if err := cl.c.List(cl.ctx, &evs); err != nil {
			return false, err.Error()
		}
		for _, ev := range evs.Items {
			if ev.Regarding.Name == node && ev.Reason == reason {
				return true, ev.Note
			}
		}
		return false, fmt.Sprintf("%d events, none %s for %s", len(evs.Items), reason, node)
	}

	a := cl.agents[node]
	a.setDatapath(&report.DatapathStatus{Supported: true, Reason: v1.ReasonHostStack, Message: "no bypass"})
	a.setOwnership(&report.OwnershipStatus{Mode: "record", Healthy: true, Reason: v1.ReasonOwnershipRecord,
		Message: "ownership record /run/egressip/ownership.json (forced: IFA_PROTO not used)"})
	cl.eventually("condition True naming the record", func() (bool, string) {
		c, ok := cond(v1.NodeConditionOwnership)
		return ok && c.Status == corev1.ConditionTrue && c.Reason == v1.ReasonOwnershipRecord &&
			strings.Contains(c.Message, "mode record") && strings.Contains(c.Message, "ownership.json"), fmt.Sprintf("%+v", c)
	})

	msg := "ownership record unreadable: /run/egressip/ownership.json is corrupt: unexpected EOF; egressip binds and unbinds nothing on this Node until it is fixed, " +
		"and removes no address because of it: check which /32 and /128 addresses on the Node are egress IPs, then fix or delete the file"
	a.setOwnership(&report.OwnershipStatus{Mode: "record", Healthy: false, Reason: v1.ReasonRecordUnreadable, Message: msg})
	cl.eventually("condition False with what to do", func() (bool, string) {
		c, ok := cond(v1.NodeConditionOwnership)
		return ok && c.Status == corev1.ConditionFalse && c.Reason == v1.ReasonRecordUnreadable &&
			strings.Contains(c.Message, "fix or delete the file"), fmt.Sprintf("%+v", c)
	})
	cl.eventually("Warning Event", func() (bool, string) {
		ok, note := event(v1.EventOwnershipRecordProblem)
		return ok && strings.Contains(note, "ownership.json is corrupt"), note
	})
	if c, ok := cond(v1.NodeConditionDatapath); !ok || c.Status != corev1.ConditionTrue {
		t.Errorf("datapath condition beside it = %+v, %v; want True", c, ok)
	}

	a.setOwnership(&report.OwnershipStatus{Mode: "record", Healthy: true, Reason: v1.ReasonOwnershipRecord, Message: "ownership record /run/egressip/ownership.json"})
	cl.eventually("condition True again", func() (bool, string) {
		c, ok := cond(v1.NodeConditionOwnership)
		return ok && c.Status == corev1.ConditionTrue, fmt.Sprintf("%+v", c)
	})
	cl.eventually("Normal Event", func() (bool, string) { return event(v1.EventOwnershipKnown) })
}

// TestInvalidSelectorIsReported: an appliedTo selector the schema admits
// (no webhook here) but that cannot be parsed gets SelectorValid=False
// with the parse error and a Warning Event; fixing it removes the
// condition. The Egress is still allocated and placed.
func TestInvalidSelectorIsReported(t *testing.T) {
	cl := newCluster(t, "badsel", 1, 10)
	cl.pool("badsel", nil)
	e := cl.egress("badsel-a", "badsel", "")
	patch := client.MergeFrom(e.DeepCopy())
	e.Spec.AppliedTo.PodSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"app": "pay/ments"}}
	if err := cl.c.Patch(cl.ctx, e, patch); err != nil {
		t.Fatalf("the schema should admit a bad label value (only the webhook rejects it): %v", err)
	}
	cl.eventually("SelectorValid=False", func() (bool, string) {
		e := cl.get("badsel-a")
		c := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionSelectorValid)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == v1.ReasonInvalidSelector && strings.Contains(c.Message, "pay/ments") &&
			c.ObservedGeneration == e.Generation, describe(e)
	})
	cl.eventually("InvalidSelector Event", func() (bool, string) {
		var evs eventsv1.EventList
		if err := cl.c.List(cl.ctx, &evs); err != nil {
			return false, err.Error()
		}
		for _, ev := range evs.Items {
			if ev.Regarding.Name == "badsel-a" && ev.Reason == v1.ReasonInvalidSelector {
				return strings.Contains(ev.Note, "podSelector"), ev.Note
			}
		}
		return false, fmt.Sprintf("%d events, none InvalidSelector", len(evs.Items))
	})
	cl.waitReady("badsel-a")

	e = cl.get("badsel-a")
	patch = client.MergeFrom(e.DeepCopy())
	e.Spec.AppliedTo.PodSelector.MatchLabels = map[string]string{"app": "payments"}
	if err := cl.c.Patch(cl.ctx, e, patch); err != nil {
		t.Fatal(err)
	}
	cl.eventually("SelectorValid condition removed", func() (bool, string) {
		e := cl.get("badsel-a")
		return meta.FindStatusCondition(e.Status.Conditions, v1.ConditionSelectorValid) == nil, describe(e)
	})
}

// TestKernelProbeNodeCondition: an agent's kernel finding becomes the Node
// condition EgressKernelFeatures: False with the message naming the
// feature and the kernel release, and a Warning Event; True again when the
// feature is found (after a kernel upgrade). The datapath condition of the
// same Node is kept beside it.
func TestKernelProbeNodeCondition(t *testing.T) {
	cl := newCluster(t, "kpc", 1, 4)
	node := "kpc-n1"
	cond := func(typ corev1.NodeConditionType) (corev1.NodeCondition, bool) {
		return nodeCondition(t, cl, node, typ)
	}
	msg := "kernel 4.18.0-553.el8_10.x86_64: datapath not started, missing nft-inet-nat (nftables rejected it: operation not supported)"
	cl.agents[node].setDatapath(&report.DatapathStatus{Supported: true, Reason: v1.ReasonHostStack, Message: "no eBPF bypass"})
	cl.agents[node].setKernel(&report.KernelStatus{Release: "4.18.0-553.el8_10.x86_64", Missing: []string{"nft-inet-nat"},
		Reason: v1.ReasonKernelFeatureMissing, Message: msg})
	cl.eventually("kernel condition False naming the feature and release", func() (bool, string) {
		c, ok := cond(v1.NodeConditionKernel)
		return ok && c.Status == corev1.ConditionFalse && c.Reason == v1.ReasonKernelFeatureMissing && c.Message == msg, fmt.Sprintf("%+v", c)
	})
	cl.eventually("Warning Event", func() (bool, string) {
		for _, ev := range nodeWarnings(t, cl, node, v1.ReasonKernelFeatureMissing) {
			return strings.Contains(ev.Note, "nft-inet-nat") && strings.Contains(ev.Note, "4.18.0"), ev.Note
		}
		return false, "no event"
	})
	if c, ok := cond(v1.NodeConditionDatapath); !ok || c.Status != corev1.ConditionTrue {
		t.Errorf("datapath condition beside the kernel one: %+v (present %v)", c, ok)
	}

	cl.agents[node].setKernel(&report.KernelStatus{Release: "6.18.44", Reason: v1.ReasonKernelFeaturesPresent,
		Message: "kernel 6.18.44 has every feature probed (11)"})
	cl.eventually("kernel condition True after the upgrade", func() (bool, string) {
		c, ok := cond(v1.NodeConditionKernel)
		return ok && c.Status == corev1.ConditionTrue && c.Reason == v1.ReasonKernelFeaturesPresent && strings.Contains(c.Message, "6.18.44"), fmt.Sprintf("%+v", c)
	})
}

// TestNodeOwnershipProblemNamedInReady: an Egress placed on a Node whose
// agent reports an unreadable ownership record (so it binds nothing new)
// says so in its Ready message instead of only waiting; once the record
// is fixed the Egress becomes Ready.
func TestNodeOwnershipProblemNamedInReady(t *testing.T) {
	cl := newCluster(t, "ownrdy", 1, 4)
	a := cl.agents["ownrdy-n1"]
	msg := "ownership record unreadable: /run/egressip/ownership.json is corrupt: unexpected EOF; fix or delete the file"
	a.setOwnership(&report.OwnershipStatus{Mode: "record", Healthy: false, Reason: v1.ReasonRecordUnreadable, Message: msg})
	cl.pool("ownrdy", nil)
	cl.egress("ownrdy-e", "ownrdy", "")
	cl.eventually("Ready=False naming the ownership problem", func() (bool, string) {
		e := cl.get("ownrdy-e")
		c := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionReady)
		if c == nil {
			return false, "no Ready condition"
		}
		return c.Status == metav1.ConditionFalse && c.Reason == v1.ReasonBinding &&
			strings.Contains(c.Message, "EgressIPOwnershipKnown") && strings.Contains(c.Message, "fix or delete the file"), c.Message
	})
	a.setOwnership(&report.OwnershipStatus{Mode: "record", Healthy: true, Reason: v1.ReasonOwnershipRecord, Message: "ownership record /run/egressip/ownership.json"})
	cl.waitReady("ownrdy-e")
}

// nodeWarnings returns the Warning Events with reason recorded on Node
// node, failing the test when they cannot be listed.
func nodeWarnings(t *testing.T, cl *cluster, node, reason string) []eventsv1.Event {
	t.Helper()
	var out []eventsv1.Event
	for _, ev := range nodeEvents(t, cl, node, reason) {
		if ev.Type == corev1.EventTypeWarning {
			out = append(out, ev)
		}
	}
	return out
}

func nodeCondition(t *testing.T, cl *cluster, node string, typ corev1.NodeConditionType) (corev1.NodeCondition, bool) {
	t.Helper()
	var n corev1.Node
	if err := cl.c.Get(cl.ctx, client.ObjectKey{Name: node}, &n); err != nil {
		t.Fatal(err)
	}
	for _, c := range n.Status.Conditions {
		if c.Type == typ {
			return c, true
		}
	}
	return corev1.NodeCondition{}, false
}

// TestFenceShownOnNode: an agent that fenced itself while cut off reports
// the fence once it is polled again; the Node gets the condition
// EgressSelfFenced (False, FenceLifted, naming when and why it fenced and
// when the fence was lifted) and one Warning Event SelfFenced, not one per
// poll or per rejoin step. A second fence is a second Event, and True while
// the controller sees it in force.
func TestFenceShownOnNode(t *testing.T) {
	cl := newCluster(t, "fsn", 1, 4)
	node := "fsn-n1"
	cond := func() (corev1.NodeCondition, bool) { return nodeCondition(t, cl, node, v1.NodeConditionFenced) }
	events := func() []eventsv1.Event { return nodeWarnings(t, cl, node, v1.ReasonSelfFenced) }
	// Never fenced: no condition.
	cl.agents[node].setFence(&report.FenceStatus{Reason: "Polled", Since: time.Now()})
	cl.agents[node].setKernel(&report.KernelStatus{Release: "6.18.44", Reason: v1.ReasonKernelFeaturesPresent, Message: "all"})
	cl.eventually("kernel condition written (the Node was reconciled)", func() (bool, string) {
		_, ok := nodeCondition(t, cl, node, v1.NodeConditionKernel)
		return ok, ""
	})
	if c, ok := cond(); ok {
		t.Fatalf("a Node that never fenced has the fence condition: %+v", c)
	}

	fencedAt := time.Now().Add(-10 * time.Second).Truncate(time.Millisecond)
	lifted := fencedAt.Add(6 * time.Second)
	st := report.FenceStatus{Rejoining: true, Reason: "Polled", Since: lifted, FencedAt: fencedAt,
		FenceReason: "ControllerPollsOthers", FenceMessage: "2 of 2 peers were polled after this Node"}
	cl.agents[node].setFence(&st)
	cl.eventually("condition False FenceLifted naming the fence", func() (bool, string) {
		c, ok := cond()
		return ok && c.Status == corev1.ConditionFalse && c.Reason == v1.ReasonFenceLifted &&
			strings.Contains(c.Message, "ControllerPollsOthers") && strings.Contains(c.Message, fencedAt.UTC().Format(time.RFC3339Nano)) &&
			strings.Contains(c.Message, lifted.UTC().Format(time.RFC3339Nano)), fmt.Sprintf("%+v", c)
	})
	cl.eventually("one Warning Event", func() (bool, string) {
		evs := events()
		return len(evs) == 1 && strings.Contains(evs[0].Note, "2 of 2 peers"), fmt.Sprintf("%d events", len(evs))
	})
	// The rejoin ends: the condition's message changes, no new Event.
	st2 := st
	st2.Rejoining, st2.Since = false, lifted.Add(time.Second)
	cl.agents[node].setFence(&st2)
	cl.eventually("rejoin done in the message", func() (bool, string) {
		c, _ := cond()
		return !strings.Contains(c.Message, "rejoining") && strings.Contains(c.Message, st2.Since.UTC().Format(time.RFC3339Nano)), c.Message
	})
	// A second fence, seen in force: True, and a second Event.
	second := time.Now().Truncate(time.Millisecond)
	cl.agents[node].setFence(&report.FenceStatus{Fenced: true, Reason: "PeersLost", Since: second, FencedAt: second,
		FenceReason: "PeersLost", FenceMessage: "3 of 4 peers unreachable"})
	cl.eventually("condition True SelfFenced", func() (bool, string) {
		c, ok := cond()
		return ok && c.Status == corev1.ConditionTrue && c.Reason == v1.ReasonSelfFenced && strings.Contains(c.Message, "PeersLost"), fmt.Sprintf("%+v", c)
	})
	cl.eventually("two Warning Events", func() (bool, string) {
		evs := events()
		return len(evs) == 2, fmt.Sprintf("%d events", len(evs))
	})
}

// TestAgentReachableCondition: a Node whose agent answers gets the
// condition EgressAgentReachable True (AgentAnswers); once the controller
// declares the agent dead it turns False (AgentUnreachable) with a Warning
// Event naming when the agent last answered, and the conditions relayed
// from the agent's report are left as they were (they are stale, not
// false). A Node whose agent never answered gets no condition.
func TestAgentReachableCondition(t *testing.T) {
	cl := newNodes(t, env, "arc", 2, 4)
	node, never := "arc-n1", "arc-n2"
	cl.crash(never) // before the controller starts: it never answers
	cl.startController()
	cond := func(n string, typ corev1.NodeConditionType) (corev1.NodeCondition, bool) {
		return nodeCondition(t, cl, n, typ)
	}
	cl.agents[node].setKernel(&report.KernelStatus{Release: "6.18.44", Reason: v1.ReasonKernelFeaturesPresent, Message: "all"})
	cl.eventually("reachable True", func() (bool, string) {
		c, ok := cond(node, v1.NodeConditionAgentReachable)
		return ok && c.Status == corev1.ConditionTrue && c.Reason == v1.ReasonAgentAnswers, fmt.Sprintf("%+v", c)
	})
	kernel, _ := cond(node, v1.NodeConditionKernel)
	cl.crash(node)
	cl.eventually("reachable False with a Warning Event", func() (bool, string) {
		c, ok := cond(node, v1.NodeConditionAgentReachable)
		if !ok || c.Status != corev1.ConditionFalse || c.Reason != v1.ReasonAgentUnreachable || !strings.Contains(c.Message, "has not answered") {
			return false, fmt.Sprintf("%+v", c)
		}
		if len(nodeWarnings(t, cl, node, v1.ReasonAgentUnreachable)) == 0 {
			return false, "no Warning Event"
		}
		return true, ""
	})
	if k, _ := cond(node, v1.NodeConditionKernel); k.Status != kernel.Status || k.Reason != kernel.Reason || k.Message != kernel.Message {
		t.Errorf("kernel condition changed when the agent died: %+v, was %+v", k, kernel)
	}
	if c, ok := cond(never, v1.NodeConditionAgentReachable); ok {
		t.Errorf("Node %s, whose agent never answered, has %+v", never, c)
	}
}
