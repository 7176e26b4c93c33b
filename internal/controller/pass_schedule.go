package controller

import (
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/egressip/egressip/internal/scheduler"
)

// schedState is the scheduling phase's input and outcome, and what the
// Egress status phase reads of the agents.
type schedState struct {
	nodes []scheduler.Node
	// flagCapacity is each Node's capacity from its annotation or the
	// flag, before the cloud lowers it.
	flagCapacity map[string]int
	pools        []scheduler.Pool
	// poolNodes keeps, per valid pool, the Nodes that match it, so that a
	// NoEligibleNode condition can say why none can hold an IP
	// (noNodeDetail, computed only for such conditions).
	poolNodes map[string]poolMatch
	// nodeByName indexes nodes; built for the first NoEligibleNode
	// message.
	nodeByName map[string]*scheduler.Node
	placed     map[string]scheduler.Placement
	moveReason map[string]string
	// slots are the scheduler's per-IP answers for multi-IP Egresses, and
	// slotMove the reason each of their IPs leaves its Node, by Egress
	// and slot.
	slots    map[string][]scheduler.SlotPlacement
	slotMove map[string]map[int]string
	// zones maps each Node to its topology.kubernetes.io/zone label
	// (pass.zoneOf builds it on first use).
	zones map[string]string
	// holders lists the Nodes whose alive agents report each IP bound.
	holders map[netip.Addr][]string
	refused map[string][]nodeRefusal
	owners  map[string]string
}

// schedule is the scheduling phase: the scheduler's Nodes, pools and
// Egresses from what the pass decided so far, and scheduler.Schedule over
// them.
func (p *pass) schedule() {
	s := &p.sched
	s.nodes, s.flagCapacity = p.schedNodes()
	s.pools, s.poolNodes = p.schedPools()
	p.zonePools()
	res := scheduler.Schedule(scheduler.Input{Pools: s.pools, Nodes: s.nodes, Egresses: p.schedEgresses(), BalanceFactor: p.in.Config.BalanceFactor})
	s.placed = make(map[string]scheduler.Placement, len(res.Placements))
	for _, pl := range res.Placements {
		s.placed[pl.Egress] = pl
	}
	s.moveReason = make(map[string]string, len(res.Moves))
	s.slots = res.Slots
	for _, m := range res.Moves {
		if _, multi := res.Slots[m.Egress]; multi {
			if s.slotMove == nil {
				s.slotMove = map[string]map[int]string{}
			}
			if s.slotMove[m.Egress] == nil {
				s.slotMove[m.Egress] = map[int]string{}
			}
			s.slotMove[m.Egress][m.Slot] = m.Reason
			continue
		}
		s.moveReason[m.Egress] = m.Reason
	}
	s.holders = holdersOf(p.in.Nodes, p.in.Agents)
	s.refused = refusalsOf(p.in.Nodes, p.in.Agents)
	s.owners = macOwners(p.in.Nodes, p.in.Agents)
}

// schedNodes are the scheduler's Nodes: capacity from the annotation
// (an invalid one is reported, the flag's value used), lowered by the
// cloud, and eligibility (ineligibleReason). flag is the capacity before
// the cloud lowers it.
func (p *pass) schedNodes() (nodes []scheduler.Node, flag map[string]int) {
	nodes = make([]scheduler.Node, 0, len(p.in.Nodes))
	flag = make(map[string]int, len(p.in.Nodes))
	for i := range p.in.Nodes {
		n := &p.in.Nodes[i]
		sn := scheduler.Node{Name: n.Name, Capacity: p.in.Config.DefaultCapacity}
		if v, ok := n.Annotations[scheduler.CapacityAnnotation]; ok {
			c, err := scheduler.ParseCapacity(v, p.in.Config.DefaultCapacity)
			if err != nil {
				p.out.InvalidCapacity[n.Name] = err
			} else {
				sn.Capacity = c
			}
		}
		flag[n.Name] = sn.Capacity
		sn.Capacity = p.cloud.nodeCapacity(n.Name, sn.Capacity)
		sn.Reason = ineligibleReason(n, p.in.Agents(n.Name))
		sn.Eligible = sn.Reason == ""
		nodes = append(nodes, sn)
	}
	return nodes, flag
}

// schedPools are the scheduler's pools, in the order of in.Pools: family,
// and the Nodes that match a valid pool (nodeSelector and poolKind.fits).
func (p *pass) schedPools() ([]scheduler.Pool, map[string]poolMatch) {
	matches := map[string]poolMatch{}
	out := make([]scheduler.Pool, 0, len(p.in.Pools))
	for _, pl := range p.in.Pools {
		ps := p.pools[pl.Name]
		sp := scheduler.Pool{Name: pl.Name, Family: scheduler.IPv4}
		if ps.err != nil {
			sp.Family = 0
		} else if ps.pool != nil && ps.pool.Is6() {
			sp.Family = scheduler.IPv6
		}
		if ps.err == nil {
			for i := range p.in.Nodes {
				if ps.sel.Matches(labels.Set(p.in.Nodes[i].Labels)) && ps.kind.fits(p, p.in.Nodes[i].Name) {
					sp.EligibleNodes = append(sp.EligibleNodes, p.in.Nodes[i].Name)
				}
			}
			matches[pl.Name] = poolMatch{what: ps.kind.matchWhat(), matching: sp.EligibleNodes}
		}
		out = append(out, sp)
	}
	return out, matches
}

// schedEgresses are the scheduler's Egresses, in allocation order: an
// Egress without an address, or whose address is a Node's, is scheduled
// nowhere.
func (p *pass) schedEgresses() []scheduler.Egress {
	out := make([]scheduler.Egress, len(p.egs))
	for i := range p.egs {
		e := p.egs[i]
		if p.isMulti(i) {
			out[i] = scheduler.Egress{Name: e.Name, Created: e.CreationTimestamp.Time, Slots: p.schedSlots(i)}
			continue
		}
		out[i] = scheduler.Egress{Name: e.Name, Created: e.CreationTimestamp.Time, Pool: e.Spec.ExternalIPPool, IP: p.alloc[i].ip, CurrentNode: e.Status.EgressNode}
		if p.alloc[i].conflict != nil {
			out[i].IP = netip.Addr{} // the Node wins: scheduled nowhere
		}
		if !out[i].IP.IsValid() {
			out[i].CurrentNode = ""
		}
		if ps := p.pools[e.Spec.ExternalIPPool]; ps != nil {
			ps.kind.schedEgress(p, i, &out[i])
		}
	}
	return out
}

// holdersOf lists, per address, the Nodes (in the order of nodes) whose
// known, alive agents report it bound. An address held by one Node (the
// common case) gets a slice of one shared backing array, capped so that
// appending to it copies: one allocation per pass instead of one per
// address.
func holdersOf(nodes []corev1.Node, agents func(string) AgentState) map[netip.Addr][]string {
	reports := make([]AgentState, len(nodes))
	n := 0
	for i := range nodes {
		reports[i] = agents(nodes[i].Name)
		if st := &reports[i]; st.Known && !st.Dead {
			n += len(st.Report.Bound)
		}
	}
	holders := make(map[netip.Addr][]string, n)
	names := make([]string, 0, n)
	for i := range nodes {
		st := &reports[i]
		if !st.Known || st.Dead {
			continue
		}
		for _, b := range st.Report.Bound {
			if h, ok := holders[b.IP]; ok {
				holders[b.IP] = append(h, nodes[i].Name)
				continue
			}
			names = append(names, nodes[i].Name)
			holders[b.IP] = names[len(names)-1 : len(names) : len(names)]
		}
	}
	return holders
}
