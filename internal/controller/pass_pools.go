package controller

import (
	"fmt"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/ipam"
	"github.com/egressip/egressip/internal/poolspec"
)

// buildPools is the pools phase: it parses every pool (an invalid one
// gets err), makes the older of two overlapping pools keep the addresses,
// and takes the Nodes' own addresses out of the L2 pools' ranges.
func (p *pass) buildPools() {
	for i := range p.in.Pools {
		pl := &p.in.Pools[i]
		p.pools[pl.Name] = p.parsePool(pl)
	}
	p.cloud.collectPools(p.in.Pools, p.pools)
	p.rejectOverlaps()
	// A Node's own address is never an egress IP (issue 14): take them out
	// of every ranged pool before anything is reserved.
	p.nodeIdx = nodeAddressIndex(*p.in, p.cloud.attachedMap())
	for i := range p.in.Pools {
		ps := p.pools[p.in.Pools[i].Name]
		ps.kind.excludeNodes(p, ps)
	}
}

// parsePool is one pool's state: its ranges, its allocator, its Node
// selector and its kind, or the error that makes it invalid.
func (p *pass) parsePool(pl *v1.ExternalIPPool) *poolState {
	ps := &poolState{obj: pl, kind: l2Pool{}}
	switch {
	case pl.Spec.Cloud != nil && p.in.Cloud == nil:
		ps.err = fmt.Errorf("the pool is cloud-backed (spec.cloud) but the controller runs without a cloud provider; start it with --cloud-provider=aws")
	case pl.Spec.Cloud != nil && len(pl.Spec.IPRanges) == 0:
	default:
		ps.pool, ps.err = poolspec.Parse(pl)
	}
	if ps.err != nil {
		return ps
	}
	if pl.Spec.Cloud != nil {
		ps.kind = p.cloud.newKind(pl, p.in.Egresses)
	}
	if ps.pool != nil {
		ps.alloc = ipam.NewAllocator(ps.pool)
	}
	ps.sel = labels.Everything()
	if pl.Spec.NodeSelector != nil {
		ps.sel, ps.err = metav1.LabelSelectorAsSelector(pl.Spec.NodeSelector)
		if ps.err != nil {
			ps.err = fmt.Errorf("nodeSelector: %w", ps.err)
		}
	}
	return ps
}

// rejectOverlaps makes the newer of two pools that share addresses invalid
// until fixed; the older keeps them. The webhook rejects such a pool; this
// catches what raced past it.
func (p *pass) rejectOverlaps() {
	byAge := make([]*v1.ExternalIPPool, 0, len(p.in.Pools))
	for i := range p.in.Pools {
		byAge = append(byAge, &p.in.Pools[i])
	}
	slices.SortFunc(byAge, func(a, b *v1.ExternalIPPool) int { return olderFirst(&a.ObjectMeta, &b.ObjectMeta) })
	for i, pl := range byAge {
		ps := p.pools[pl.Name]
		for _, older := range byAge[:i] {
			o := p.pools[older.Name]
			if ps.err != nil || o.err != nil || ps.pool == nil || o.pool == nil {
				continue
			}
			if a, b, overlap := ipam.Overlaps(ps.pool.Ranges(), o.pool.Ranges()); overlap {
				ps.err = fmt.Errorf("ipRanges[%d] %s overlaps ExternalIPPool %q (ipRanges[%d] %s), which is older", a, ps.pool.Ranges()[a], older.Name, b, o.pool.Ranges()[b])
			}
		}
	}
}
