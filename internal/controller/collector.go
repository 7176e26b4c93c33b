package controller

import (
	"context"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/scheduler"
)

// Egress states reported by egressip_controller_egresses.
const (
	stateReady      = "Ready"
	stateAssigned   = "Assigned"   // on a Node, not yet reported announced
	stateUnassigned = "Unassigned" // IP allocated, no Node
	stateNoIP       = "NoIP"
)

var (
	descEgresses = prometheus.NewDesc("egressip_controller_egresses",
		"Egresses by state: Ready (bound and announced), Assigned (on a Node, not yet announced), Unassigned (IP but no Node), NoIP.",
		[]string{"state"}, nil)
	descPoolTotal = prometheus.NewDesc("egressip_controller_pool_ips_allocatable",
		"Allocatable IPs of an ExternalIPPool (status.usage.total).", []string{labelPool}, nil)
	descPoolUsed = prometheus.NewDesc("egressip_controller_pool_ips_used",
		"IPs of an ExternalIPPool allocated to Egresses (status.usage.used).", []string{labelPool}, nil)
	descNodeCapacity = prometheus.NewDesc("egressip_controller_node_capacity_ips",
		"Egress IPs a Node may hold (annotation egressip.io/max-egress-ips, else --max-egress-ips-per-node).", []string{"node"}, nil)
	descNodeAssigned = prometheus.NewDesc("egressip_controller_node_assigned_ips",
		"Distinct egress IPs assigned to a Node.", []string{"node"}, nil)
)

// stateCollector reports per-object state at scrape time from the cache,
// so nothing is kept up to date between scrapes.
type stateCollector struct {
	mu              sync.Mutex
	reader          client.Reader
	defaultCapacity int
}

func (c *stateCollector) set(r client.Reader, defaultCapacity int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reader, c.defaultCapacity = r, defaultCapacity
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descEgresses, descPoolTotal, descPoolUsed, descNodeCapacity, descNodeAssigned} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	reader, defaultCapacity := c.reader, c.defaultCapacity
	c.mu.Unlock()
	if reader == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var (
		egs   v1.EgressList
		pools v1.ExternalIPPoolList
		nodes corev1.NodeList
	)
	if reader.List(ctx, &egs) == nil {
		counts := map[string]int{stateReady: 0, stateAssigned: 0, stateUnassigned: 0, stateNoIP: 0}
		perNode := map[string]map[netip.Addr]bool{}
		for i := range egs.Items {
			e := &egs.Items[i]
			switch {
			case e.Status.EgressIP == "":
				counts[stateNoIP]++
			case e.Status.EgressNode == "":
				counts[stateUnassigned]++
			case meta.IsStatusConditionTrue(e.Status.Conditions, v1.ConditionReady):
				counts[stateReady]++
			default:
				counts[stateAssigned]++
			}
			// A multi-IP Egress holds every IP of status.ips on its own
			// Node; egressIP/egressNode repeat only the first of them.
			held := []v1.EgressIPStatus{{IP: e.Status.EgressIP, Node: e.Status.EgressNode}}
			if len(e.Status.IPs) > 0 {
				held = e.Status.IPs
			}
			for _, h := range held {
				if ip, err := netip.ParseAddr(h.IP); err == nil && h.Node != "" {
					if perNode[h.Node] == nil {
						perNode[h.Node] = map[netip.Addr]bool{}
					}
					perNode[h.Node][ip] = true
				}
			}
		}
		for s, n := range counts {
			ch <- prometheus.MustNewConstMetric(descEgresses, prometheus.GaugeValue, float64(n), s)
		}
		if reader.List(ctx, &nodes) == nil {
			for i := range nodes.Items {
				n := &nodes.Items[i]
				capacity := defaultCapacity
				if v, ok := n.Annotations[scheduler.CapacityAnnotation]; ok {
					if parsed, err := scheduler.ParseCapacity(v, defaultCapacity); err == nil {
						capacity = parsed
					}
				}
				ch <- prometheus.MustNewConstMetric(descNodeCapacity, prometheus.GaugeValue, float64(capacity), n.Name)
				ch <- prometheus.MustNewConstMetric(descNodeAssigned, prometheus.GaugeValue, float64(len(perNode[n.Name])), n.Name)
			}
		}
	}
	if reader.List(ctx, &pools) == nil {
		for _, p := range pools.Items {
			ch <- prometheus.MustNewConstMetric(descPoolTotal, prometheus.GaugeValue, float64(p.Status.Usage.Total), p.Name)
			ch <- prometheus.MustNewConstMetric(descPoolUsed, prometheus.GaugeValue, float64(p.Status.Usage.Used), p.Name)
		}
	}
}
