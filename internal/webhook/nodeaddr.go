package webhook

import (
	"context"
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/ipam"
	"github.com/egressip/egressip/internal/nodeaddr"
	"github.com/egressip/egressip/internal/poolspec"
)

// maxNamedNodeAddrs is how many Node addresses a pool warning names.
const maxNamedNodeAddrs = 5

// nodeAddresses returns the Nodes' own addresses (nodeaddr.Build), leaving
// out an address a Node lists because it holds it as an egress IP: an
// Egress's status assigns it to that Node, or a cloud pool keeps it warm
// there (cloud providers list such addresses as InternalIPs too). The
// controller's pass applies the same rule.
func nodeAddresses(ctx context.Context, r client.Reader) (nodeaddr.Index, error) {
	var nodes corev1.NodeList
	if err := r.List(ctx, &nodes); err != nil {
		return nil, fmt.Errorf("list Nodes: %w", err)
	}
	var egs v1.EgressList
	if err := r.List(ctx, &egs); err != nil {
		return nil, fmt.Errorf("list Egresses: %w", err)
	}
	var pools v1.ExternalIPPoolList
	if err := r.List(ctx, &pools); err != nil {
		return nil, fmt.Errorf("list ExternalIPPools: %w", err)
	}
	held := map[string]map[netip.Addr]bool{}
	mark := func(node, addr string) {
		ip, err := netip.ParseAddr(addr)
		if err != nil || node == "" {
			return
		}
		if held[node] == nil {
			held[node] = map[netip.Addr]bool{}
		}
		held[node][ip.Unmap()] = true
	}
	for i := range egs.Items {
		mark(egs.Items[i].Status.EgressNode, egs.Items[i].Status.EgressIP)
	}
	for i := range pools.Items {
		if c := pools.Items[i].Status.Cloud; c != nil {
			for _, w := range c.WarmIPs {
				mark(w.Node, w.IP)
			}
		}
	}
	return nodeaddr.Build(nodes.Items, func(node string, ip netip.Addr) bool { return held[node][ip] }), nil
}

// checkNodeAddress refuses a named spec.egressIP that is a Node's own
// address (issue 14): the Node would answer for it and the Egress could
// never be bound. The message names the Node.
func (v *EgressValidator) checkNodeAddress(ctx context.Context, e *v1.Egress) error {
	ip, err := netip.ParseAddr(e.Spec.EgressIP)
	if e.Spec.EgressIP == "" || err != nil {
		return nil // nothing named, or the schema rejects it
	}
	idx, err := nodeAddresses(ctx, v.Reader)
	if err != nil {
		return apierrors.NewInternalError(err)
	}
	if o, ok := idx[ip.Unmap()]; ok {
		return apierrors.NewInvalid(egressGK, e.Name, field.ErrorList{field.Invalid(field.NewPath("spec", "egressIP"), e.Spec.EgressIP,
			fmt.Sprintf("is %s: a Node's own address is never an egress IP; name another address of ExternalIPPool %q, or leave spec.egressIP empty to have one allocated", o, e.Spec.ExternalIPPool))})
	}
	return nil
}

// specialRangeErrors refuses ranges that contain special-purpose addresses
// (ipam.SpecialBlocks: loopback, link-local, multicast, ...), which CEL
// cannot find in a start/end range (issue 15 fault 2). A cidr entry is
// refused by CEL first; this catches the rest.
func specialRangeErrors(pool *ipam.Pool, rangesPath *field.Path) field.ErrorList {
	var errs field.ErrorList
	for i, r := range pool.Ranges() {
		for _, fe := range ipam.SpecialOverlaps([]ipam.IPRange{r}) {
			errs = append(errs, field.Invalid(rangesPath.Index(i), r.String(), fe.Reason))
		}
	}
	return errs
}

// nodeAddressWarnings warns, without refusing, when the pool's ranges hold
// Node addresses: they are never allocated, and status.excluded counts
// them.
func nodeAddressWarnings(ctx context.Context, r client.Reader, pool *ipam.Pool) admission.Warnings {
	idx, err := nodeAddresses(ctx, r)
	if err != nil {
		return nil // a warning is not worth failing the request
	}
	var named []string
	n := 0
	for _, ip := range idx.Sorted() {
		if pool.Contains(ip) {
			n++
			if len(named) < maxNamedNodeAddrs {
				named = append(named, fmt.Sprintf("%s (%s)", ip, idx[ip]))
			}
		}
	}
	if n == 0 {
		return nil
	}
	if n > len(named) {
		named = append(named, fmt.Sprintf("and %d more", n-len(named)))
	}
	what := fmt.Sprintf("%d Node addresses, which are", n)
	if n == 1 {
		what = "1 Node address, which is"
	}
	return admission.Warnings{fmt.Sprintf("ipRanges contain %s never allocated (status.excluded counts them): %s", what, strings.Join(named, ", "))}
}

// poolWarnings are the admission warnings of a pool whose ranges are new
// or changed (none otherwise, and none for a pool that does not parse: its
// error is the answer).
func (v *PoolValidator) poolWarnings(ctx context.Context, old, p *v1.ExternalIPPool) admission.Warnings {
	if len(p.Spec.IPRanges) == 0 || (old != nil && equality.Semantic.DeepEqual(old.Spec.IPRanges, p.Spec.IPRanges)) {
		return nil
	}
	pool, err := poolspec.Parse(p)
	if err != nil {
		return nil
	}
	return nodeAddressWarnings(ctx, v.Reader, pool)
}
