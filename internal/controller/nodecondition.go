package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/report"
)

// NodeDatapathReconciler mirrors the findings of each agent's report
// (polled by Liveness) into Node conditions: the datapath finding into
// EgressDatapathSupported, the ownership status into
// EgressIPOwnershipKnown, the kernel finding into EgressKernelFeatures,
// the fence into EgressSelfFenced and the VLAN sub-interfaces into
// EgressVLANLinksReady, with an Event on each change of a condition's
// status. Agents cannot write Nodes (docs/security.md), hence this relay. A
// Node whose agent is unknown, dead, or serves no finding keeps its
// conditions as they are.
type NodeDatapathReconciler struct {
	Client   client.Client
	Recorder recorder.EventRecorder
	Liveness *Liveness
}

// desiredCondition is the condition for a finding (times left zero).
func desiredCondition(st *report.DatapathStatus) corev1.NodeCondition {
	c := corev1.NodeCondition{Type: v1.NodeConditionDatapath, Status: corev1.ConditionTrue, Reason: st.Reason, Message: st.Message}
	if !st.Supported {
		c.Status = corev1.ConditionFalse
	}
	if c.Reason == "" {
		c.Reason = v1.ReasonHostStack
		if !st.Supported {
			c.Reason = v1.ReasonHostStackBypass
		}
	}
	return c
}

// ownershipCondition is the condition for an ownership status (times left
// zero).
func ownershipCondition(st *report.OwnershipStatus) corev1.NodeCondition {
	c := corev1.NodeCondition{Type: v1.NodeConditionOwnership, Status: corev1.ConditionTrue, Reason: st.Reason,
		Message: "mode " + st.Mode + ": " + st.Message}
	if !st.Healthy {
		c.Status = corev1.ConditionFalse
	}
	if c.Reason == "" {
		c.Reason = "Unknown"
	}
	return c
}

// desiredKernelCondition is the condition for a kernel finding (times left
// zero): False exactly when a feature is missing.
func desiredKernelCondition(st *report.KernelStatus) corev1.NodeCondition {
	c := corev1.NodeCondition{Type: v1.NodeConditionKernel, Status: corev1.ConditionTrue, Reason: st.Reason, Message: st.Message}
	if len(st.Missing) > 0 {
		c.Status = corev1.ConditionFalse
	}
	if c.Reason == "" {
		c.Reason = v1.ReasonKernelFeaturesPresent
		if len(st.Missing) > 0 {
			c.Reason = v1.ReasonKernelFeatureMissing
		}
	}
	return c
}

// reachableCondition is the agent-reachability condition of st (times
// left zero).
func reachableCondition(st AgentState, deadAfter time.Duration) corev1.NodeCondition {
	if st.Dead {
		return corev1.NodeCondition{Type: v1.NodeConditionAgentReachable, Status: corev1.ConditionFalse, Reason: v1.ReasonAgentUnreachable,
			Message: fmt.Sprintf("the egressip agent of this Node has not answered the controller's polls since %s (more than %v): its egress IPs were moved to other Nodes",
				st.LastSeen.UTC().Format(time.RFC3339), deadAfter)}
	}
	return corev1.NodeCondition{Type: v1.NodeConditionAgentReachable, Status: corev1.ConditionTrue, Reason: v1.ReasonAgentAnswers,
		Message: "the egressip agent of this Node answers the controller's polls"}
}

// vlanCondition is the condition for an agent's VLAN sub-interface status
// (times left zero): False with the first problem's reason and every
// problem named (IP, VLAN ID, parent, foreign link, the agent's error),
// True naming the links in place.
func vlanCondition(st *report.VLANStatus) corev1.NodeCondition {
	if len(st.Problems) == 0 {
		msg := "no egress IP assigned to this Node needs a VLAN sub-interface"
		if len(st.Links) > 0 {
			msg = "the VLAN sub-interfaces the egress IPs of this Node need are in place: " + strings.Join(st.Links, ", ")
		}
		return corev1.NodeCondition{Type: v1.NodeConditionVLANs, Status: corev1.ConditionTrue, Reason: v1.ReasonVLANLinksReady, Message: msg}
	}
	parts := make([]string, 0, len(st.Problems)+1)
	for _, p := range st.Problems {
		what := fmt.Sprintf("egress IP %s, VLAN %d", p.IP, p.VLAN)
		if p.Parent != "" {
			what += ", parent " + p.Parent
		}
		if p.Link != "" {
			what += ", held by link " + p.Link
		}
		parts = append(parts, what+" ("+p.Reason+"): "+p.Message)
	}
	if st.More > 0 {
		parts = append(parts, fmt.Sprintf("and %d more", st.More))
	}
	n := len(st.Problems) + st.More
	msg := fmt.Sprintf("%d egress IP(s) of this Node are not bound because their VLAN sub-interface cannot be had: %s",
		n, strings.Join(parts, "; "))
	if len(msg) > maxNodeConditionMessage {
		msg = msg[:maxNodeConditionMessage-3] + "..."
	}
	return corev1.NodeCondition{Type: v1.NodeConditionVLANs, Status: corev1.ConditionFalse, Reason: st.Problems[0].Reason, Message: msg}
}

// maxNodeConditionMessage bounds the message of EgressVLANLinksReady, in
// bytes (the Node object is read by every kubelet heartbeat's watchers).
const maxNodeConditionMessage = 4096

// fenceCondition is the condition for a fence status that has a fence
// behind it (st.FencedAt set; times left zero).
func fenceCondition(st *report.FenceStatus) corev1.NodeCondition {
	episode := fmt.Sprintf("the egressip agent unbound this Node's egress IPs at %s, fencing itself (%s): %s",
		st.FencedAt.UTC().Format(time.RFC3339Nano), st.FenceReason, st.FenceMessage)
	if st.Fenced {
		return corev1.NodeCondition{Type: v1.NodeConditionFenced, Status: corev1.ConditionTrue, Reason: v1.ReasonSelfFenced, Message: episode}
	}
	msg := episode + fenceLifted + st.Since.UTC().Format(time.RFC3339Nano)
	if st.Rejoining {
		msg += " (rejoining: it binds only what its cache and the API server both assign to it)"
	}
	return corev1.NodeCondition{Type: v1.NodeConditionFenced, Status: corev1.ConditionFalse, Reason: v1.ReasonFenceLifted, Message: msg}
}

// fenceLifted separates a fence condition's episode from its end.
const fenceLifted = "; the fence was lifted at "

// fenceEvent returns the Warning Event for a fence condition want
// replacing prev, when want names another fence than prev (a new episode,
// whether or not the controller ever saw it in force).
func fenceEvent(prev *corev1.NodeCondition, want corev1.NodeCondition) (conditionEvent, bool) {
	episode := func(msg string) string { e, _, _ := strings.Cut(msg, fenceLifted); return e }
	if prev != nil && episode(prev.Message) == episode(want.Message) {
		return conditionEvent{}, false
	}
	return conditionEvent{corev1.EventTypeWarning, v1.ReasonSelfFenced, "Fence", want.Message}, true
}

// conditionEvent is the Event for a condition's status change.
type conditionEvent struct {
	typ, reason, action, note string
}

// transitionEvent returns the Event for want replacing prev (nil: none
// before), if its status changed.
func transitionEvent(prev *corev1.NodeCondition, want corev1.NodeCondition) (conditionEvent, bool) {
	changed := prev == nil || prev.Status != want.Status
	switch {
	case !changed:
		return conditionEvent{}, false
	case want.Type == v1.NodeConditionDatapath && want.Status == corev1.ConditionFalse:
		return conditionEvent{corev1.EventTypeWarning, v1.ReasonHostStackBypass, "CheckDatapath",
			"Pod traffic on this Node bypasses the host's IP stack, so Egresses cannot carry it: " + want.Message}, true
	case want.Type == v1.NodeConditionDatapath && prev != nil:
		return conditionEvent{corev1.EventTypeNormal, v1.EventDatapathSupported, "CheckDatapath",
			"Pod traffic on this Node crosses the host's IP stack again: " + want.Message}, true
	case want.Type == v1.NodeConditionOwnership && want.Status == corev1.ConditionFalse:
		return conditionEvent{corev1.EventTypeWarning, v1.EventOwnershipRecordProblem, "CheckOwnership",
			"the egressip agent cannot tell which addresses on this Node are its own and changes none until this is fixed or cleared: " + want.Message}, true
	case want.Type == v1.NodeConditionKernel && want.Status == corev1.ConditionFalse:
		return conditionEvent{corev1.EventTypeWarning, v1.ReasonKernelFeatureMissing, "ProbeKernel",
			"The kernel of this Node lacks features egressip uses: " + want.Message}, true
	case want.Type == v1.NodeConditionAgentReachable && want.Status == corev1.ConditionFalse:
		return conditionEvent{corev1.EventTypeWarning, v1.ReasonAgentUnreachable, "PollAgent", want.Message}, true
	case want.Type == v1.NodeConditionAgentReachable && prev != nil:
		return conditionEvent{corev1.EventTypeNormal, v1.ReasonAgentAnswers, "PollAgent", "the egressip agent of this Node answers the controller's polls again"}, true
	case want.Type == v1.NodeConditionVLANs && want.Status == corev1.ConditionFalse:
		return conditionEvent{corev1.EventTypeWarning, want.Reason, "KeepVLANs", want.Message}, true
	case want.Type == v1.NodeConditionVLANs && prev != nil:
		return conditionEvent{corev1.EventTypeNormal, v1.ReasonVLANLinksReady, "KeepVLANs", want.Message}, true
	case want.Type == v1.NodeConditionOwnership && prev != nil:
		return conditionEvent{corev1.EventTypeNormal, v1.EventOwnershipKnown, "CheckOwnership",
			"the egressip agent knows its addresses on this Node again: " + want.Message}, true
	}
	return conditionEvent{}, false
}

// Reconcile writes the conditions of one Node that differ from the agent's
// findings (one strategic-merge patch of those conditions only, so the
// kubelet's conditions are never overwritten). It returns the patch's
// error, retried with backoff.
func (r *NodeDatapathReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	st := r.Liveness.State(req.Name)
	if !st.Known {
		return reconcile.Result{}, nil
	}
	// A dead agent's findings are stale: only its reachability changes.
	wants := []corev1.NodeCondition{reachableCondition(st, r.Liveness.cfg.DeadAfter)}
	if st.Dead {
		return r.write(ctx, req, wants)
	}
	if st.Report.Datapath != nil {
		wants = append(wants, desiredCondition(st.Report.Datapath))
	}
	if st.Report.Ownership != nil {
		wants = append(wants, ownershipCondition(st.Report.Ownership))
	}
	if st.Report.Kernel != nil {
		wants = append(wants, desiredKernelCondition(st.Report.Kernel))
	}
	if f := st.Report.Fence; f != nil && !f.FencedAt.IsZero() {
		wants = append(wants, fenceCondition(f))
	}
	if st.Report.VLANs != nil {
		wants = append(wants, vlanCondition(st.Report.VLANs))
	}
	return r.write(ctx, req, wants)
}

// write patches the conditions of wants that differ on the Node req (one
// strategic-merge patch of those conditions only), then records the
// Events of their transitions. It returns the patch's error.
func (r *NodeDatapathReconciler) write(ctx context.Context, req reconcile.Request, wants []corev1.NodeCondition) (reconcile.Result, error) {
	var n corev1.Node
	if err := r.Client.Get(ctx, req.NamespacedName, &n); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	orig := n.DeepCopy()
	now := metav1.Now()
	var events []conditionEvent
	var written []corev1.NodeCondition
	for _, want := range wants {
		idx := slices.IndexFunc(n.Status.Conditions, func(c corev1.NodeCondition) bool { return c.Type == want.Type })
		var prev *corev1.NodeCondition
		if idx >= 0 {
			prev = orig.Status.Conditions[idx].DeepCopy()
			if prev.Status == want.Status && prev.Reason == want.Reason && prev.Message == want.Message {
				continue
			}
		}
		want.LastHeartbeatTime, want.LastTransitionTime = now, now
		if prev != nil && prev.Status == want.Status {
			want.LastTransitionTime = prev.LastTransitionTime
		}
		if idx >= 0 {
			n.Status.Conditions[idx] = want
		} else {
			n.Status.Conditions = append(n.Status.Conditions, want)
		}
		transition := transitionEvent
		if want.Type == v1.NodeConditionFenced {
			transition = fenceEvent
		}
		if ev, ok := transition(prev, want); ok {
			events = append(events, ev)
		}
		written = append(written, want)
	}
	if len(written) == 0 {
		return reconcile.Result{}, nil
	}
	if err := r.Client.Status().Patch(ctx, &n, client.StrategicMergeFrom(orig)); err != nil {
		return reconcile.Result{}, fmt.Errorf("patch conditions of Node %s: %w", n.Name, err)
	}
	for _, c := range written {
		log.FromContext(ctx).Info("Node condition set", "node", klog.KObj(&n), "type", c.Type, "status", c.Status, "reason", c.Reason, "message", c.Message)
	}
	for _, ev := range events {
		r.Recorder.Eventf(&n, nil, ev.typ, ev.reason, ev.action, "%s", ev.note)
	}
	return reconcile.Result{}, nil
}

// SetupWithManager registers the reconciler: a Node is reconciled when
// its agent's finding changes (Liveness), when it is created, and when
// someone else changes the condition.
func (r *NodeDatapathReconciler) SetupWithManager(mgr ctrl.Manager) error {
	findings := source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		r.Liveness.onDatapathChange(func(node string) {
			q.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: node}})
		})
		return nil
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("egressip-node-datapath").
		For(&corev1.Node{}, builder.WithPredicates(predicate.Funcs{
			UpdateFunc: func(e event.UpdateEvent) bool {
				o, ok1 := e.ObjectOld.(*corev1.Node)
				n, ok2 := e.ObjectNew.(*corev1.Node)
				return !ok1 || !ok2 || mirrored(o) != mirrored(n)
			},
			DeleteFunc: func(event.DeleteEvent) bool { return false },
		})).
		WatchesRawSource(findings).
		Complete(r)
}

// mirrored is the Node's conditions this reconciler keeps, without their
// times, for change detection.
func mirrored(n *corev1.Node) [6]corev1.NodeCondition {
	var out [6]corev1.NodeCondition
	for _, c := range n.Status.Conditions {
		c := corev1.NodeCondition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message}
		switch c.Type {
		case v1.NodeConditionDatapath:
			out[0] = c
		case v1.NodeConditionOwnership:
			out[1] = c
		case v1.NodeConditionKernel:
			out[2] = c
		case v1.NodeConditionFenced:
			out[3] = c
		case v1.NodeConditionAgentReachable:
			out[4] = c
		case v1.NodeConditionVLANs:
			out[5] = c
		}
	}
	return out
}
