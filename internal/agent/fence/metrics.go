package fence

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// Values of the result label.
const (
	resultOK    = "ok"
	resultError = "error"
)

// The fencing metrics, registered with controller-runtime's registry (the
// agent's --metrics-bind-address). Labels are bounded.
var (
	fencedGauge = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "egressip_agent_fenced",
		Help: "1 while this agent is fenced (holds no egress IP because it lost the controller, the API server and its peers' support), else 0.",
	})
	fenceEvents = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "egressip_agent_fence_events_total",
		Help: "Fencing transitions of this agent, by reason (PeersLost or ControllerPollsOthers when fenced; the reason that ended it when unfenced) and action (fence, unfence).",
	}, []string{"action", "reason"})
	peerProbes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "egressip_agent_peer_probes_total",
		Help: "Probes of peer agents (GET /peer), made only while the controller's polls are late, by result (ok, error).",
	}, []string{"result"})
	apiProbes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "egressip_agent_apiserver_probes_total",
		Help: "Probes of the API server (GET /readyz; any HTTP answer counts as reached), made only while the controller's polls are late, by result (ok, error).",
	}, []string{"result"})
)

func init() {
	metrics.Registry.MustRegister(fencedGauge, fenceEvents, peerProbes, apiProbes)
	// Served at 0 from the start, so dashboards see 0, not nothing.
	for _, r := range []string{resultOK, resultError} {
		peerProbes.WithLabelValues(r)
		apiProbes.WithLabelValues(r)
	}
	for _, r := range []string{v1.ReasonPeersLost, v1.ReasonControllerPollsOthers} {
		fenceEvents.WithLabelValues("fence", r)
	}
}
