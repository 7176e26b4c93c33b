package agent

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
)

// HolderIndex is the name of the agent cache's index of Egresses by holder
// Node: the Nodes named by status.egressNode and by every
// status.ips[*].node (holderNodes). The binding loop lists the Egresses of
// its own Node through it (docs/architecture.md, "How an agent finds its
// IPs"): a CRD selectable field is a scalar, so no field selector can pick
// "one of the Nodes of status.ips" on the API server.
const HolderIndex = "egressip.io/holder"

// holderNodes returns the Nodes that hold an IP of eg, each once: the
// Node of status.egressNode and those of status.ips (the index function of
// HolderIndex).
func holderNodes(eg *v1alpha1.Egress) []string {
	var out []string
	if n := eg.Status.EgressNode; n != "" {
		out = append(out, n)
	}
	for _, e := range eg.Status.IPs {
		if e.Node != "" && !slices.Contains(out, e.Node) {
			out = append(out, e.Node)
		}
	}
	return out
}

// holderIndexFunc is holderNodes as a client.IndexerFunc.
func holderIndexFunc(o client.Object) []string {
	eg, ok := o.(*v1alpha1.Egress)
	if !ok {
		return nil
	}
	return holderNodes(eg)
}

// listHeld lists the cached Egresses that hold an IP on this Node, through
// HolderIndex. The index is added to the informer on the first call, once
// the controller has started the Egress informer (adding it in
// SetupWithManager would register the informer before the manager starts;
// see SetupWithManager); client-go indexes the objects already cached when
// an index is added. Without an indexer (an Agent built by a test around a
// plain reader) it lists every Egress; computeDesired filters by Node
// either way. Errors are the cache's.
func (a *Agent) listHeld(ctx context.Context) ([]v1alpha1.Egress, error) {
	if a.indexer != nil && !a.indexed.Load() {
		a.indexMu.Lock()
		if !a.indexed.Load() {
			if err := a.indexer.IndexField(ctx, &v1alpha1.Egress{}, HolderIndex, holderIndexFunc); err != nil {
				a.indexMu.Unlock()
				return nil, fmt.Errorf("index Egresses by holder Node: %w", err)
			}
			a.indexed.Store(true)
		}
		a.indexMu.Unlock()
	}
	var egs v1alpha1.EgressList
	var opts []client.ListOption
	if a.indexed.Load() {
		opts = append(opts, client.MatchingFields{HolderIndex: a.cfg.NodeName})
	}
	if err := a.reader.List(ctx, &egs, opts...); err != nil {
		return nil, err
	}
	return egs.Items, nil
}

// heldEntries returns the status.ips entries of a multi-IP Egress (one
// with spec.ips) that name node and an IP, with their index. The scheduler
// puts at most one IP of an Egress on a Node; should a status name node
// twice, every such entry is returned (and each checked on its own).
func heldEntries(node string, eg *v1alpha1.Egress) []int {
	if len(eg.Spec.IPs) == 0 {
		return nil
	}
	var out []int
	for i, e := range eg.Status.IPs {
		if e.Node == node && e.IP != "" {
			out = append(out, i)
		}
	}
	return out
}

// multiEntryAllowed returns "" when entry i of eg's status.ips is an IP its
// spec allows, else why not (for the log and the report), each entry
// checked against its own pool: the entry's pool must be one of
// spec.ips[].pool and known to the agent, and the IP one of that pool's
// allocatable addresses (poolAllows; a named address is inside its pool
// too, the webhook's rule); an IP of a cloud-backed pool without ranges
// needs the entry's interfaceMAC (the cloud attached it here).
func multiEntryAllowed(eg *v1alpha1.Egress, i int, ip netip.Addr, byName map[string]*v1alpha1.ExternalIPPool, parsed map[string]parsedPool) string {
	e := eg.Status.IPs[i]
	if !slices.ContainsFunc(eg.Spec.IPs, func(src v1alpha1.EgressIPSource) bool { return src.Pool == e.Pool }) {
		return fmt.Sprintf("status.ips[%d] (%s) names ExternalIPPool %q, which spec.ips does not list", i, ip, e.Pool)
	}
	pool := byName[e.Pool]
	if pool == nil {
		return fmt.Sprintf("ExternalIPPool %q is not known to this agent, so status.ips[%d] (%s) cannot be checked against it", e.Pool, i, ip)
	}
	if why := poolAllows(pool, ip, e.InterfaceMAC, parsed); why != "" {
		return fmt.Sprintf("status.ips[%d]: %s", i, why)
	}
	return ""
}

// isCloudOnly reports whether pool is cloud-backed without ipRanges.
func isCloudOnly(pool *v1alpha1.ExternalIPPool) bool {
	return pool.Spec.Cloud != nil && len(pool.Spec.IPRanges) == 0
}
