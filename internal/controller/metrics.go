package controller

// The metrics of the scheduling pass and the member publication. The
// cloud runnable's call metrics are in cloud.go, and the per-object gauges
// read at scrape time in collector.go (docs/metrics.md lists them all).

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// Label names and values several of the controller's metrics share.
const (
	labelResult    = "result"
	labelPool      = "pool"
	resultOK       = "ok"
	resultConflict = "conflict"
	resultError    = "error"

	kindEgress         = "Egress"
	kindExternalIPPool = "ExternalIPPool"
)

var (
	passDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "egressip_controller_schedule_pass_duration_seconds",
		Help:    "Duration of one scheduling pass (read cache, allocate, schedule, write changed statuses), in seconds.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
	})
	movesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "egressip_controller_moves_total",
		Help: "Egress IPs that left a Node, by reason (NodeRemoved, NodeIneligible/<why>, NodeNotInPool, CapacityReduced, ...).",
	}, []string{"reason"})
	unplacedEgresses = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "egressip_controller_unplaced_egresses",
		Help: "Egresses without an egress Node after the last pass, by reason.",
	}, []string{"reason"})
	statusWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "egressip_controller_status_writes_total",
		Help: "Status patches issued, by kind (Egress, ExternalIPPool) and result (ok, conflict, error).",
	}, []string{"kind", labelResult})
	invalidCapacity = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "egressip_controller_invalid_capacity_annotations",
		Help: "Nodes whose egressip.io/max-egress-ips annotation is invalid (the default capacity applies).",
	})
	conflictEgresses = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "egressip_controller_ip_conflicts",
		Help: "Egresses whose condition Conflict is True after the last pass: the agent of the egress Node sees another host answer for the egress IP.",
	})
	conflictEvents = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "egressip_controller_ip_conflict_events_total",
		Help: "DuplicateIP Warning Events recorded on Egresses (a conflict started, or the other MACs changed).",
	})
)

// sliceWrites counts the member publication's writes (MembersReconciler).
// deferredWrites counts the deferrable status patches a pass left for the
// next one (PassReconciler.DeferrableWrites).
var deferredWrites = prometheus.NewCounter(prometheus.CounterOpts{
	Name: "egressip_controller_status_writes_deferred_total",
	Help: "Deferrable status patches (new assignments, cosmetic changes, pool statuses) a pass left for the next pass because it had issued --kube-api-qps of them already; the patches a failover needs are never deferred.",
})

var sliceWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "egressip_controller_member_slice_writes_total",
	Help: "EgressMemberSlice writes, by operation (create, update, delete) and result (ok, conflict, error).",
}, []string{"op", labelResult})

func init() {
	metrics.Registry.MustRegister(passDuration, movesTotal, unplacedEgresses, statusWrites, invalidCapacity, conflictEgresses, conflictEvents, sliceWrites, deferredWrites)
	// Start the common series at zero so dashboards see them before the
	// first move or write.
	for _, r := range []string{v1.MoveNodeRemoved, v1.MoveNodeIneligible, v1.MoveNodeNotInPool, v1.MoveCapacityReduced} {
		movesTotal.WithLabelValues(r)
	}
	for _, k := range []string{kindEgress, kindExternalIPPool} {
		for _, res := range []string{resultOK, resultConflict, resultError} {
			statusWrites.WithLabelValues(k, res)
		}
	}
	for _, op := range []string{"create", "update", "delete"} {
		for _, res := range []string{resultOK, resultConflict, resultError} {
			sliceWrites.WithLabelValues(op, res)
		}
	}
}

// collector is registered once per process (the registry is global); each
// Setup points it at the newest manager's cache.
var (
	collectorOnce sync.Once
	collector     = &stateCollector{}
)
