package controller

import (
	"errors"
	"fmt"
	"net/netip"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/ipam"
	"github.com/egressip/egressip/internal/scheduler"
)

// l2Pool is the poolKind of a pool whose addresses any matching Node may
// announce on its shared L2 segment (ARP/NDP): the controller allocates
// them from the pool's ranges itself. It is also the kind of a pool that
// is invalid before its cloud side could be looked at, and of a pool that
// does not exist.
type l2Pool struct{}

var _ poolKind = l2Pool{}

// excludeNodes takes the Nodes' addresses out of a valid pool's ranges
// and keeps which ones it took (nodeIPs) for the status.
func (l2Pool) excludeNodes(p *pass, ps *poolState) {
	if ps.err == nil && ps.pool != nil {
		ps.pool, ps.nodeIPs = withNodeExclusions(ps.pool, p.nodeIdx)
		ps.alloc = ipam.NewAllocator(ps.pool)
	}
}

// keep reserves the address spec.egressIP names (an Egress naming a
// Node's address keeps it, in conflict), else the address the status
// holds if the pool can still give it and no Egress in use claims it.
func (l2Pool) keep(p *pass, ps *poolState, i int) bool {
	e := p.egs[i]
	if e.Spec.EgressIP != "" {
		ip, err := netip.ParseAddr(e.Spec.EgressIP)
		if o := p.multiOwner[ip]; err == nil && o != "" {
			// Addresses of multi-IP Egresses are never shared.
			p.alloc[i].cond = allocatedCond(false, v1.ReasonNamedIPConflict, fmt.Sprintf("spec.egressIP %s is held by Egress %s (spec.ips), which is older; addresses of an Egress with spec.ips are not shared", ip, o))
			return true
		}
		if err == nil {
			err = ps.alloc.Reserve(ip)
		}
		named := fmt.Sprintf("%s (named in spec) from ExternalIPPool %q", ip, e.Spec.ExternalIPPool)
		if o, ok := p.nodeIdx[ip]; ok && errors.Is(err, ipam.ErrExcludedAddress) {
			p.allocated(i, ip, named)
			p.alloc[i].conflict = &o
			return true
		}
		if err != nil {
			p.alloc[i].cond = allocatedCond(false, v1.ReasonIPOutsidePool, fmt.Sprintf("spec.egressIP %s cannot be used from ExternalIPPool %q: %v", e.Spec.EgressIP, e.Spec.ExternalIPPool, err))
			return true
		}
		p.allocated(i, ip, named)
		return true
	}
	if ip, err := netip.ParseAddr(e.Status.EgressIP); err == nil && ps.pool.Contains(ip) && !ps.alloc.IsAllocated(ip) && p.keeps(i, ip) {
		if err := ps.alloc.Reserve(ip); err == nil {
			p.allocated(i, ip, allocatedMsg(ip, e.Spec.ExternalIPPool))
			return true
		}
	}
	ip, kept, o, note := statusIPKept(e, ps.pool, p.nodeIdx, p.conflictHeld)
	if kept {
		p.conflictHeld[ip] = true
		p.allocated(i, ip, allocatedMsg(ip, e.Spec.ExternalIPPool))
		p.alloc[i].conflict = o
		return true
	}
	p.alloc[i].rejected = note
	return false
}

func (l2Pool) ready(*pass, *poolState) {}

// allocateNew gives Egress i the lowest free address, or PoolExhausted.
func (l2Pool) allocateNew(p *pass, ps *poolState, i int) {
	e := p.egs[i]
	ip, err := ps.alloc.Allocate()
	if err != nil {
		p.alloc[i].cond = allocatedCond(false, v1.ReasonPoolExhausted, fmt.Sprintf("ExternalIPPool %q has no free IP (%d of %d used); add a range or delete an Egress", e.Spec.ExternalIPPool, ps.alloc.Used(), ps.alloc.Total()))
		return
	}
	p.allocated(i, ip, allocatedMsg(ip, e.Spec.ExternalIPPool))
}

func (l2Pool) fits(*pass, string) bool { return true }

func (l2Pool) matchWhat() string { return "the nodeSelector" }

func (l2Pool) schedEgress(*pass, int, *scheduler.Egress) {}

// assign: the agent of the target Node binds the address; the status
// names that Node at once.
func (l2Pool) assign(_ *pass, _ int, target string, _ *egressStatus) string { return target }

// poolStatus sets the usage of the allocator and the excluded addresses.
func (l2Pool) poolStatus(p *pass, ps *poolState, st *v1.ExternalIPPoolStatus) string {
	st.Usage = v1.IPPoolUsage{Total: saturate(ps.alloc.Total()), TotalText: ps.alloc.TotalText(), Used: saturate(ps.alloc.Used())}
	if ps.pool != nil {
		st.Excluded = excludedStatus(ps.pool, p.nodeIdx, ps.nodeIPs)
	}
	return ""
}

// deletingStatus keeps the usage of a valid pool.
func (l2Pool) deletingStatus(_ *pass, ps *poolState, st *v1.ExternalIPPoolStatus) {
	if ps.err == nil && ps.alloc != nil {
		st.Usage = v1.IPPoolUsage{Total: saturate(ps.alloc.Total()), TotalText: ps.alloc.TotalText(), Used: saturate(ps.alloc.Used())}
	}
}
