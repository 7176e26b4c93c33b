package poolroute

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

var (
	routedIPs = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "egressip_agent_pool_routed_ips",
		Help: "Egress IPs held on this Node by how their traffic is routed as of the last pool routing pass: table (a pool routing table of the link holding the address), main (the address is on the default-route link), unbound (not on any link yet), error (it needs a table and has none; see the agent's log).",
	}, []string{"route"})
	syncErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "egressip_agent_pool_routing_errors_total",
		Help: "Pool routing passes in which a kernel operation (route, rule) failed.",
	})
)

func init() {
	metrics.Registry.MustRegister(routedIPs, syncErrors)
	for _, r := range []string{"table", "main", "unbound", "error"} {
		routedIPs.WithLabelValues(r)
	}
}

// Observe records a Sync's outcome in the package's metrics.
func Observe(res Result, err error) {
	if err != nil {
		syncErrors.Inc()
	}
	n := map[string]float64{}
	for _, r := range res.Routes {
		switch {
		case r.Err != nil:
			n["error"]++
		case r.Link == "":
			n["unbound"]++
		case r.Table == 0:
			n["main"]++
		default:
			n["table"]++
		}
	}
	for _, k := range []string{"table", "main", "unbound", "error"} {
		routedIPs.WithLabelValues(k).Set(n[k])
	}
}
