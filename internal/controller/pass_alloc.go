package controller

import (
	"fmt"
	"net/netip"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// allocate is the allocation phase: every Egress keeps what its spec and
// status already say where it may (poolKind.keep), then the rest get a
// new address, oldest Egress first (poolKind.allocateNew). An Egress of a
// missing or invalid pool gets none, and a condition saying why. A
// multi-IP Egress (spec.ips) takes the same two steps per IP (multiKeep,
// multiAllocate), each IP from its entry's pool.
func (p *pass) allocate() {
	keeper := statusKeepers(p.egs)
	p.keeps = func(i int, ip netip.Addr) bool { k, ok := keeper[ip]; return !ok || k == i }
	p.conflictHeld = map[netip.Addr]bool{}
	p.slots = make([][]ipSlot, len(p.egs))
	p.multiOwner = map[netip.Addr]string{}
	for i := range p.egs {
		e := p.egs[i]
		ps := p.pools[e.Spec.ExternalIPPool]
		switch {
		case len(e.Spec.IPs) > 0:
			// Several IPs (pass_multi.go): named and status addresses now,
			// new ones below, in the same age order.
			if p.multiKeep(i) {
				p.pending = append(p.pending, i)
			}
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
		if p.isMulti(i) {
			p.multiAllocate(i)
			continue
		}
		ps := p.pools[p.egs[i].Spec.ExternalIPPool]
		ps.kind.allocateNew(p, ps, i)
	}
	for i := range p.egs {
		if p.isMulti(i) {
			c, _ := multiAllocCond(p.slots[i])
			p.alloc[i].cond = allocatedCond(c.ok, c.reason, c.msg)
		}
	}
}

// allocated records that Egress i gets ip, msg being the IPAllocated
// condition's message.
func (p *pass) allocated(i int, ip netip.Addr, msg string) {
	p.alloc[i].ip = ip
	p.alloc[i].cond = allocatedCond(true, v1.ReasonAllocated, msg)
}
