package controller

import (
	"net/netip"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/ipam"
	"github.com/egressip/egressip/internal/nodeaddr"
	"github.com/egressip/egressip/internal/scheduler"
)

// plan runs allocation and scheduling over in. It is a pure function of its
// input: the reconciler gathers the input and writes what changed.
//
// The pass runs in phases, in this order, each reading what the ones
// before it decided (the pass struct carries it):
//
//  1. pools (pass_pools.go): parse every ExternalIPPool, find overlaps,
//     take the Nodes' own addresses out of the ranges.
//  2. allocation (pass_alloc.go): every Egress keeps its named or status
//     address where it may, then the rest get a new one, oldest first.
//  3. scheduling (pass_schedule.go): the scheduler's input (Nodes, pools,
//     Egresses) and scheduler.Schedule.
//  4. Egress statuses (pass_egress.go): conditions, Events and the waits
//     for releases, per Egress.
//  5. cloud operations (pass_cloud.go): the attaches, warm plans, Elastic
//     IPs and interface calls the cloud runnable performs; nothing without
//     a provider.
//  6. pool statuses (pass_poolstatus.go): usage, conditions and deletion
//     protection of every pool.
//
// What differs between pools on a shared L2 segment and cloud-backed pools
// lies behind poolKind (l2Pool, cloudKind); what the cloud adds across
// pools lies in cloudPass, whose methods do nothing without a provider.
func plan(in passInput) passOutput {
	p := newPass(&in)
	p.buildPools()
	p.allocate()
	p.schedule()
	p.egressStatuses()
	p.cloudOps()
	p.poolStatuses()
	return *p.out
}

// pass is the working state of one plan call.
type pass struct {
	in  *passInput
	out *passOutput
	// egs point into in.Egresses, oldest first (olderFirst): the order of
	// allocation. Every per-Egress slice of the pass is indexed like egs.
	// The pass reads the Egresses through them and never writes them.
	egs []*v1.Egress
	// pools are the pools of in.Pools by name.
	pools map[string]*poolState
	// cloud is the cloud side of the pass; nil without a provider (its
	// methods then do nothing).
	cloud *cloudPass
	// nodeIdx maps every Node address to its Node (issue 14).
	nodeIdx nodeaddr.Index

	// alloc is the allocation phase's outcome per Egress.
	alloc []egressAlloc
	// pending lists the Egresses (indexes in egs) that get a new address.
	pending []int
	// keeps reports whether Egress i may keep the address ip its status
	// holds, when other statuses hold it too (statusKeepers).
	keeps func(i int, ip netip.Addr) bool
	// conflictHeld are the Node addresses an Egress status already keeps
	// (statusIPKept).
	conflictHeld map[netip.Addr]bool
	// slots are the IPs of each multi-IP Egress (nil for a single-IP
	// one), indexed like egs (pass_multi.go).
	slots [][]ipSlot
	// multiOwner names the multi-IP Egress that holds each address given
	// to one: such addresses are never shared.
	multiOwner map[netip.Addr]string

	// sched is the scheduling phase's input and outcome.
	sched schedState
}

// egressAlloc is what the allocation phase decides for one Egress.
type egressAlloc struct {
	// ip is the Egress's address; invalid when it has none.
	ip netip.Addr
	// cond is its IPAllocated condition (no ObservedGeneration yet).
	cond metav1.Condition
	// conflict is set when ip is a Node's address: the Egress keeps ip in
	// its status but is not scheduled (the Node wins).
	conflict *nodeaddr.Owner
	// rejected is the Warning Event note (v1.ReasonStatusIPRejected) when
	// the status held an address its pool cannot give (written by hand,
	// or left from an older spec); another one is allocated.
	rejected string
	// preferred is the Node holding the address (cloud pools: a warm
	// address or one the cloud has attached), or "".
	preferred string
	// heldNote is the Warning Event note (v1.ReasonAddressHeld) when an
	// interface that is not ours holds the Egress's address.
	heldNote string
}

// poolState is one ExternalIPPool in a pass.
type poolState struct {
	obj   *v1.ExternalIPPool
	pool  *ipam.Pool // nil for a cloud pool without ipRanges
	alloc *ipam.Allocator
	// err says why the pool is invalid (its Egresses get no address).
	err error
	sel labels.Selector
	// kind holds what differs between L2 and cloud pools.
	kind poolKind
	// nodeIPs are the Node addresses in the pool's ranges, never
	// allocated (L2 pools only: the cloud assigns each address to one
	// interface).
	nodeIPs []netip.Addr
}

// poolKind is what a pass does differently for pools on a shared L2
// segment (l2Pool) and cloud-backed pools (cloudKind). Each method is one
// step of a phase for one pool, or one Egress of the pool (i indexes
// pass.egs).
type poolKind interface {
	// excludeNodes takes the Nodes' own addresses out of the pool's
	// ranges (pools phase).
	excludeNodes(p *pass, ps *poolState)
	// keep gives Egress i the address its spec names or its status
	// holds, if it may have it; it returns false when the Egress needs a
	// new address (allocation phase).
	keep(p *pass, ps *poolState, i int) bool
	// ready runs between keeping and allocating new addresses.
	ready(p *pass, ps *poolState)
	// allocateNew gives Egress i a new address, or a condition saying why
	// there is none.
	allocateNew(p *pass, ps *poolState, i int)
	// fits reports whether the pool may use Node beyond its nodeSelector,
	// and matchWhat says what the pool asks of Nodes (for messages).
	fits(p *pass, node string) bool
	matchWhat() string
	// schedEgress adjusts Egress i's scheduler input (scheduling phase).
	schedEgress(p *pass, i int, se *scheduler.Egress)
	// assign turns the scheduler's target Node for Egress i into the
	// status: it returns the Node the status names ("" while the address
	// is not there yet, the Assigned condition then saying why), and may
	// set the status's interface MAC and an Event (Egress status phase).
	assign(p *pass, i int, target string, es *egressStatus) string
	// poolStatus fills the usage and the kind's own parts of a valid
	// pool's status, returning what the Ready message adds after the
	// usage; deletingStatus does it for a pool being deleted (pool status
	// phase).
	poolStatus(p *pass, ps *poolState, st *v1.ExternalIPPoolStatus) string
	deletingStatus(p *pass, ps *poolState, st *v1.ExternalIPPoolStatus)
}

// newPass prepares the pass over in: the output maps, the Egresses in
// allocation order and the cloud side.
func newPass(in *passInput) *pass {
	p := &pass{
		in: in,
		out: &passOutput{
			Egresses:        make(map[string]egressChange, len(in.Egresses)),
			Pools:           make(map[string]v1.ExternalIPPoolStatus, len(in.Pools)),
			InvalidCapacity: map[string]error{},
			Unplaced:        map[string]int{},
		},
		egs:   olderFirstOrder(in.Egresses),
		pools: make(map[string]*poolState, len(in.Pools)),
	}
	p.alloc = make([]egressAlloc, len(p.egs))
	p.cloud = newCloudPass(in.Cloud)
	if p.cloud != nil {
		p.out.Cloud = p.cloud.out
	}
	return p
}

// olderFirstOrder points at the Egresses of egs, oldest first (olderFirst, a
// total order). It sorts pointers: copying every Egress into that order
// (as the pass did before) was a tenth of a warm pass over 5,000 Egresses,
// and sorting the Egresses themselves moved whole objects at every swap
// (BenchmarkPass).
func olderFirstOrder(egs []v1.Egress) []*v1.Egress {
	out := make([]*v1.Egress, len(egs))
	for i := range egs {
		out[i] = &egs[i]
	}
	slices.SortFunc(out, func(a, b *v1.Egress) int { return olderFirst(&a.ObjectMeta, &b.ObjectMeta) })
	return out
}

// agentOK reports whether node's agent is not dead.
func (p *pass) agentOK(node string) bool { return !p.in.Agents(node).Dead }
