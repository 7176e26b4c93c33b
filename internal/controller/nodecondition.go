package controller

import (
	"context"
	"fmt"

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

	"github.com/egressip/egressip/internal/report"
)

// NodeConditionDatapath is the Node condition the controller keeps from
// each agent's host stack check: True when the Node's Pod traffic crosses
// the host's IP stack (the datapath works), False with reason
// report.ReasonHostStackBypass and the evidence when the CNI bypasses it.
const NodeConditionDatapath corev1.NodeConditionType = "EgressDatapathSupported"

// Event reasons of the Node condition's transitions.
const (
	// EventHostStackBypass (Warning): the condition turned False.
	EventHostStackBypass = report.ReasonHostStackBypass
	// EventDatapathSupported (Normal): the condition turned True again.
	EventDatapathSupported = "DatapathSupported"
)

// NodeDatapathReconciler mirrors the datapath finding of each agent's
// report (polled by Liveness) into the Node condition
// EgressDatapathSupported, with an Event on each change of its status.
// Agents cannot write Nodes (docs/security.md), hence this relay. A Node
// whose agent is unknown, dead, or serves no finding keeps its condition
// as it is.
type NodeDatapathReconciler struct {
	Client   client.Client
	Recorder recorder.EventRecorder
	Liveness *Liveness
}

// desiredCondition is the condition for a finding (times left zero).
func desiredCondition(st *report.DatapathStatus) corev1.NodeCondition {
	c := corev1.NodeCondition{Type: NodeConditionDatapath, Status: corev1.ConditionTrue, Reason: st.Reason, Message: st.Message}
	if !st.Supported {
		c.Status = corev1.ConditionFalse
	}
	if c.Reason == "" {
		c.Reason = report.ReasonHostStack
		if !st.Supported {
			c.Reason = report.ReasonHostStackBypass
		}
	}
	return c
}

// Reconcile writes the condition of one Node when the agent's finding
// differs from it (one strategic-merge patch of that condition only, so
// the kubelet's conditions are never overwritten). It returns the patch's
// error, retried with backoff.
func (r *NodeDatapathReconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	st := r.Liveness.State(req.Name)
	if !st.Known || st.Dead || st.Report.Datapath == nil {
		return reconcile.Result{}, nil
	}
	var n corev1.Node
	if err := r.Client.Get(ctx, req.NamespacedName, &n); err != nil {
		return reconcile.Result{}, client.IgnoreNotFound(err)
	}
	want := desiredCondition(st.Report.Datapath)
	idx := -1
	for i, c := range n.Status.Conditions {
		if c.Type == NodeConditionDatapath {
			idx = i
		}
	}
	var prev *corev1.NodeCondition
	if idx >= 0 {
		prev = &n.Status.Conditions[idx]
		if prev.Status == want.Status && prev.Reason == want.Reason && prev.Message == want.Message {
			return reconcile.Result{}, nil
		}
	}
	orig := n.DeepCopy()
	now := metav1.Now()
	want.LastHeartbeatTime, want.LastTransitionTime = now, now
	statusChanged := prev == nil || prev.Status != want.Status
	if !statusChanged {
		want.LastTransitionTime = prev.LastTransitionTime
	}
	if idx >= 0 {
		n.Status.Conditions[idx] = want
	} else {
		n.Status.Conditions = append(n.Status.Conditions, want)
	}
	if err := r.Client.Status().Patch(ctx, &n, client.StrategicMergeFrom(orig)); err != nil {
		return reconcile.Result{}, fmt.Errorf("patch condition %s of Node %s: %w", NodeConditionDatapath, n.Name, err)
	}
	log.FromContext(ctx).Info("Node datapath condition set", "node", klog.KObj(&n), "status", want.Status, "reason", want.Reason, "message", want.Message)
	switch {
	case statusChanged && want.Status == corev1.ConditionFalse:
		r.Recorder.Eventf(&n, nil, corev1.EventTypeWarning, EventHostStackBypass, "CheckDatapath",
			"Pod traffic on this Node bypasses the host's IP stack, so Egresses cannot carry it: %s", want.Message)
	case statusChanged && prev != nil:
		r.Recorder.Eventf(&n, nil, corev1.EventTypeNormal, EventDatapathSupported, "CheckDatapath",
			"Pod traffic on this Node crosses the host's IP stack again: %s", want.Message)
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
				return !ok1 || !ok2 || datapathCondition(o) != datapathCondition(n)
			},
			DeleteFunc: func(event.DeleteEvent) bool { return false },
		})).
		WatchesRawSource(findings).
		Complete(r)
}

// datapathCondition is the Node's EgressDatapathSupported condition without
// its times, for change detection.
func datapathCondition(n *corev1.Node) corev1.NodeCondition {
	for _, c := range n.Status.Conditions {
		if c.Type == NodeConditionDatapath {
			return corev1.NodeCondition{Type: c.Type, Status: c.Status, Reason: c.Reason, Message: c.Message}
		}
	}
	return corev1.NodeCondition{}
}
