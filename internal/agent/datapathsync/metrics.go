package datapathsync

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// The datapath reconciler's metrics, registered with controller-runtime's
// registry (served on the agent's --metrics-bind-address beside package
// agent's). Labels are bounded: result has three values, egress one per
// Egress this Node programs, family is ipv6 only.
var (
	datapathApplies = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "egressip_agent_datapath_applies_total",
		Help: "Datapath programming runs (a changed State, or the periodic re-apply), by result (ok; partial: some Egresses refused by the kernel, the others programmed; error).",
	}, []string{"result"})
	rejectedDesc = prometheus.NewDesc("egressip_agent_packets_rejected_total",
		"Packets of an Egress's Pods rejected on this Node because the Egress has no egress Node and failurePolicy Fail, by Egress.",
		[]string{"egress"}, nil)
	// sourceGuardDesc is served from the table's eip-source counter at
	// scrape time, like rejectedDesc.
	sourceGuardDesc = prometheus.NewDesc("egressip_agent_source_guard_dropped_total",
		"Packets the datapath's source guard stopped on this Node (rejected in output, dropped in postrouting after srcnat): "+
			"packets about to leave with an egress IP held here as their source that are neither flows SNATed to it for its Egress, "+
			"replies, Neighbor Discovery nor tunnel packets. Non-zero while the Node's own IPv6 address is tentative (DAD) is the "+
			"source change the guard prevented (docs/agent.md). By IP family (ipv6 only: IPv4 egress IPs are bound with scope host).",
		[]string{"family"}, nil)
)

// familyIPv6 is the value of the source guard's family label (the agent's
// "family" label values are ipv4 and ipv6).
const familyIPv6 = "ipv6"

// sourceGuardKey is the key of the source guard's drop counter in
// Datapath.Counters (package datapath's counter eip-source).
const sourceGuardKey = "@eip-source"

// rejectedCollector serves egressip_agent_packets_rejected_total and
// egressip_agent_source_guard_dropped_total from the newest Reconciler's
// engine at scrape time.
type rejectedCollector struct {
	mu sync.Mutex
	r  *Reconciler
}

func (c *rejectedCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- rejectedDesc
	ch <- sourceGuardDesc
}

func (c *rejectedCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	r := c.r
	c.mu.Unlock()
	if r == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	counts, err := r.DP.Counters(ctx)
	if err != nil {
		r.log.Error(err, "read the datapath's rejected-packet counters")
		return
	}
	// Every Egress this Node programs gets a series (0 until a packet is
	// rejected), so a dashboard sees the Egress before its first reject.
	names := map[string]bool{}
	for _, n := range r.lastNames() {
		names[n] = true
	}
	for n := range counts {
		if len(n) > 0 && n[0] != '@' {
			names[n] = true
		}
	}
	for n := range names {
		ch <- prometheus.MustNewConstMetric(rejectedDesc, prometheus.CounterValue, float64(counts[n]), n)
	}
	ch <- prometheus.MustNewConstMetric(sourceGuardDesc, prometheus.CounterValue, float64(counts[sourceGuardKey]), familyIPv6)
}

var rejected = &rejectedCollector{}

func init() {
	metrics.Registry.MustRegister(datapathApplies, rejected)
	for _, r := range []string{"ok", "partial", "error"} {
		datapathApplies.WithLabelValues(r)
	}
}
