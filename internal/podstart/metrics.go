package podstart

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	requests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "egressip_agent_podstart_requests_total",
		Help: "Requests of the egressip-cni plugin, by operation (add, del) and result (ok, error).",
	}, []string{"op", "result"})
	waits = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "egressip_agent_podstart_wait_seconds",
		Help:    "Time from a plugin's ADD to the answer (the Pod classified by the datapath), in seconds, by result.",
		Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
	}, []string{"result"})
	conflistChanges = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "egressip_agent_cni_conflist_changes_total",
		Help: "Changes the agent made to the Node's CNI configuration list, by action (install, uninstall).",
	}, []string{"action"})
)

func init() {
	metrics.Registry.MustRegister(requests, waits, conflistChanges)
	// Every label value exists from the start (at 0), so the series are
	// served, and documented, whether or not the plugin is enabled.
	for _, r := range []string{"ok", "error"} {
		for _, op := range []string{"add", "del"} {
			requests.WithLabelValues(op, r)
		}
		waits.WithLabelValues(r)
	}
	for _, a := range []string{"install", "uninstall"} {
		conflistChanges.WithLabelValues(a)
	}
}
