package agent

import (
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The "family" label and its values.
const (
	labelFamily = "family"
	familyIPv4  = "ipv4"
	familyIPv6  = "ipv6"
)

func familyOf(ip netip.Addr) string {
	if ip.Unmap().Is4() {
		return familyIPv4
	}
	return familyIPv6
}

// The agent's metrics, registered with controller-runtime's registry (served
// on --metrics-bind-address). Labels are bounded: family is ipv4 or ipv6.
var (
	boundIPs = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "egressip_agent_bound_ips",
		Help: "Egress IPs bound on this Node and owned by egressip, by IP family, as of the last reconcile.",
	}, []string{labelFamily})

	announcements = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "egressip_agent_announcements_total",
		Help: "Announcements sent (gratuitous ARP for ipv4, unsolicited Neighbor Advertisement for ipv6), by IP family.",
	}, []string{labelFamily})

	announceErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "egressip_agent_announce_errors_total",
		Help: "Announcements that could not be sent, by IP family.",
	}, []string{labelFamily})

	bindErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "egressip_agent_bind_errors_total",
		Help: "Egress IPs assigned to this Node that a reconcile could not bind, counted once per IP per reconcile.",
	})

	unbindErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "egressip_agent_unbind_errors_total",
		Help: "Owned egress IPs no longer assigned to this Node that a reconcile could not remove, counted once per IP per reconcile.",
	})

	renewErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "egressip_agent_address_renew_errors_total",
		Help: "Renewals of the owned egress addresses' lifetime (every --address-renew-interval) that failed for at least one address; the kernel removes an address not renewed within --address-lifetime.",
	})

	refusedIPs = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "egressip_agent_refused_ips",
		Help: "Egress IPs assigned to this Node that the last reconcile did not bind, by cause: status (status.egressIP is not an address the Egress's pool and spec allow) or bind (binding failed, e.g. the address is already on the Node and not egressip's). The report and the Egress's Ready condition say why.",
	}, []string{"cause"})
	kernelFeature = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "egressip_agent_kernel_feature",
		Help: "Kernel features probed at start: 1 present, 0 missing (docs/agent.md lists them and what happens without each). The feature label is one of package kernel's Feature names.",
	}, []string{"feature"})

	conflictIPs = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "egressip_agent_ip_conflicts",
		Help: "Egress IPs bound on this Node that another host answered for in the last duplicate-IP probe round (ARP probe / DAD-style Neighbor Solicitation), by IP family.",
	}, []string{labelFamily})

	conflictsDetected = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "egressip_agent_ip_conflicts_detected_total",
		Help: "Duplicate-IP conflicts that started (a probe round saw another host answer for an egress IP bound here that had no conflict), by IP family.",
	}, []string{labelFamily})

	conflictProbeErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "egressip_agent_conflict_probe_errors_total",
		Help: "Duplicate-IP probe rounds of one interface that failed (interface gone, socket error); its IPs keep their previous conflict state.",
	})

	takeoverHolds = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "egressip_agent_takeover_guard_total",
		Help: "Egress IPs about to be bound here that the takeover guard's probe found still answered by another host, by outcome: held (binding waits, counted per probe round) or expired (bound anyway after --takeover-guard).",
	}, []string{"outcome"})

	reconcileDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "egressip_agent_reconcile_duration_seconds",
		Help: "Duration of one agent reconcile (read the cache, sync the bindings, start announcements), in seconds.",
		// 0.5 ms to about 4 s.
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
	})
)

func init() {
	metrics.Registry.MustRegister(boundIPs, announcements, announceErrors, bindErrors, unbindErrors, renewErrors, refusedIPs, kernelFeature, reconcileDuration,
		conflictIPs, conflictsDetected, conflictProbeErrors, takeoverHolds)
	for _, o := range []string{guardHeld, guardExpired} {
		takeoverHolds.WithLabelValues(o)
	}
	for _, c := range []string{refusedStatus, refusedBind} {
		refusedIPs.WithLabelValues(c)
	}
	// Export both families from the start, so dashboards see 0, not nothing.
	for _, f := range []string{familyIPv4, familyIPv6} {
		boundIPs.WithLabelValues(f)
		announcements.WithLabelValues(f)
		announceErrors.WithLabelValues(f)
		conflictIPs.WithLabelValues(f)
		conflictsDetected.WithLabelValues(f)
	}
}
