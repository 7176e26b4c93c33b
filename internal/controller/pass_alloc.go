package controller

import (
	"fmt"
	"net/netip"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// allocate is the allocation phase: every Egress keeps what its spec and
// status already say where it may (poolKind.keep), then the rest get a
// new address, oldest Egress first (poolKind.allocateNew). An Egress of a
// missing or invalid pool gets none, and a condition saying why.
func (p *pass) allocate() {
	keeper := statusKeepers(p.egs)
	p.keeps = func(i int, ip netip.Addr) bool { k, ok := keeper[ip]; return !ok || k == i }
	p.conflictHeld = map[netip.Addr]bool{}
	for i := range p.egs {
		e := &p.egs[i]
		ps := p.pools[e.Spec.ExternalIPPool]
		switch {
		case len(e.Spec.IPs) > 0:
			// The scheduler places several IPs per Egress; allocating them,
			// the status list and the agents' part are not built yet.
			p.alloc[i].cond = allocatedCond(false, v1.ReasonMultiIPNotImplemented,
				"spec.ips (several IPs per Egress) is not implemented by this controller yet; give externalIPPool instead")
		case ps == nil:
			p.alloc[i].cond = allocatedCond(false, v1.ReasonPoolNotFound, fmt.Sprintf("ExternalIPPool %q does not exist; create it or fix spec.externalIPPool", e.Spec.ExternalIPPool))
		case ps.err != nil:
			p.alloc[i].cond = allocatedCond(false, v1.ReasonPoolInvalid, fmt.Sprintf("ExternalIPPool %q is invalid: %v", e.Spec.ExternalIPPool, ps.err))
		case !ps.kind.keep(p, ps, i):
			p.pending = append(p.pending, i)
		}
	}
	for i := range p.in.Pools {
		ps := p.pools[p.in.Pools[i].Name]
		ps.kind.ready(p, ps)
	}
	for _, i := range p.pending {
		ps := p.pools[p.egs[i].Spec.ExternalIPPool]
		ps.kind.allocateNew(p, ps, i)
	}
}

// allocated records that Egress i gets ip, msg being the IPAllocated
// condition's message.
func (p *pass) allocated(i int, ip netip.Addr, msg string) {
	p.alloc[i].ip = ip
	p.alloc[i].cond = allocatedCond(true, v1.ReasonAllocated, msg)
}
