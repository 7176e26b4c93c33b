package controller

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/ipam"
	"github.com/egressip/egressip/internal/scheduler"
)

// Multi-IP Egresses (spec.ips, issue 20) go through the same phases as
// single-IP ones, one IP at a time: the allocation phase expands each such
// Egress into ipSlots (one per IP asked for, in status order) and gives
// each an address from its entry's pool (multiKeep, then multiAllocate);
// the scheduling phase hands the slots to the scheduler as Egress.Slots,
// an entry with a zone through a pool of its own that lists only the
// zone's Nodes (zonePools); the Egress status phase turns each slot into
// one status.ips entry and sums them up in the conditions
// (pass_multistatus.go). An IP from a cloud-backed pool takes the steps
// of a single-IP Egress of that pool (cloudKind.keepIP, claimIP, takeIP,
// place): a warm address, attached to its own Node's interface before the
// status names that Node. Single-IP Egresses never reach this code.

// ipSlot is one IP of a multi-IP Egress in a pass.
type ipSlot struct {
	// entry is the index of the spec.ips entry the IP is for; pool and
	// zone are that entry's.
	entry      int
	pool, zone string
	// named is the address spec.ips[entry].addresses names for this IP;
	// invalid for an IP the controller allocates.
	named netip.Addr
	// ip is the IP's address; invalid while it has none (reason and msg
	// then say why: an IPAllocated reason of reasons.go).
	ip          netip.Addr
	reason, msg string
	// prev is the status.ips entry that held ip before this pass (nil: a
	// new address); cur is its Node.
	prev *v1.EgressIPStatus
	cur  string
	// preferred is the Node of the warm address a cloud pool gave the IP
	// in this pass ("" otherwise); attachMsg says what the IP waits for
	// while its cloud pool attaches it to its Node (Attaching).
	preferred, attachMsg string
	// attachFailed: the last call on the interface the IP is being
	// attached to failed (attachMsg says how).
	attachFailed bool
}

// isMulti reports whether Egress i of the pass asks for several IPs.
func (p *pass) isMulti(i int) bool { return len(p.egs[i].Spec.IPs) > 0 }

// expandSlots is the list of IPs e's spec.ips asks for, in status order:
// each entry's count in a row, its named addresses first. An address that
// does not parse (the schema refuses it) gives an IP without an address.
func expandSlots(e *v1.Egress) []ipSlot {
	var out []ipSlot
	for k, src := range e.Spec.IPs {
		count := max(1, len(src.Addresses))
		if src.Count != nil {
			count = max(int(*src.Count), len(src.Addresses), 1)
		}
		for j := range count {
			s := ipSlot{entry: k, pool: src.Pool, zone: src.Zone}
			if j < len(src.Addresses) {
				ip, err := netip.ParseAddr(string(src.Addresses[j]))
				if err != nil {
					s.reason, s.msg = v1.ReasonIPOutsidePool, fmt.Sprintf("spec.ips[%d].addresses[%d] %q is not an IP address", k, j, src.Addresses[j])
				}
				s.named = ip
			}
			out = append(out, s)
		}
	}
	return out
}

// slotPool is the pool state of slot s, or "" and why the slot's IP gets
// no address from it (an IPAllocated reason and a message).
func (p *pass) slotPool(s *ipSlot) (*poolState, string, string) {
	ps := p.pools[s.pool]
	switch {
	case ps == nil:
		return nil, v1.ReasonPoolNotFound, fmt.Sprintf("ExternalIPPool %q does not exist; create it or fix spec.ips[%d].pool", s.pool, s.entry)
	case ps.err != nil:
		return nil, v1.ReasonPoolInvalid, fmt.Sprintf("ExternalIPPool %q is invalid: %v", s.pool, ps.err)
	case hasElasticIPs(ps.obj):
		return nil, v1.ReasonElasticIPsNotSupported, fmt.Sprintf("ExternalIPPool %q names Elastic IPs (spec.cloud.aws.elasticIPs), which are associated per Egress, not per IP; use externalIPPool for this pool, or a pool without elasticIPs in spec.ips", s.pool)
	}
	return ps, "", ""
}

// multiKeep is the keeping step of multi-IP Egress i (allocation phase,
// in the Egresses' age order like poolKind.keep): its named addresses
// first, then, for the other IPs of each pool, the addresses its
// status.ips holds from that pool, in status order, where the pool still
// allows them and no older Egress uses them. It returns whether some IP
// still needs a new address (multiAllocate).
func (p *pass) multiKeep(i int) bool {
	e := p.egs[i]
	slots := expandSlots(e)
	held := map[netip.Addr]*v1.EgressIPStatus{}
	byPool := map[string][]netip.Addr{}
	named := map[netip.Addr]bool{}
	for k := range slots {
		if slots[k].named.IsValid() {
			named[slots[k].named] = true
		}
	}
	for k := range e.Status.IPs {
		st := &e.Status.IPs[k]
		ip, err := netip.ParseAddr(st.IP)
		if err != nil || held[ip] != nil {
			continue
		}
		held[ip] = st
		if !named[ip] {
			byPool[st.Pool] = append(byPool[st.Pool], ip)
		}
	}
	for k := range slots {
		if s := &slots[k]; s.named.IsValid() && s.reason == "" {
			p.claimNamed(i, s)
		}
	}
	need := false
	for k := range slots {
		s := &slots[k]
		if s.named.IsValid() || s.reason != "" {
			continue
		}
		ps, reason, msg := p.slotPool(s)
		if ps == nil {
			s.reason, s.msg = reason, msg
			continue
		}
		for len(byPool[s.pool]) > 0 && !s.ip.IsValid() {
			ip := byPool[s.pool][0]
			byPool[s.pool] = byPool[s.pool][1:]
			if p.keepSlotIP(ps, ip) {
				s.ip = ip
				p.multiOwner[ip] = e.Name
			}
		}
		need = need || !s.ip.IsValid()
	}
	for k := range slots {
		if s := &slots[k]; s.ip.IsValid() {
			s.prev = held[s.ip]
			if s.prev != nil {
				s.cur = s.prev.Node
			}
		}
	}
	p.slots[i] = slots
	return need
}

// keepSlotIP reports whether an IP of pool ps may keep ip, an address the
// status holds, and reserves it: inside the pool and used by no older
// Egress (a cloud pool: cloudKind.keepIP).
func (p *pass) keepSlotIP(ps *poolState, ip netip.Addr) bool {
	if k, ok := ps.kind.(*cloudKind); ok {
		return k.keepIP(ps, ip)
	}
	return ps.pool.Contains(ip) && !ps.alloc.IsAllocated(ip) && ps.alloc.Reserve(ip) == nil
}

// hasElasticIPs reports whether pl is a cloud pool naming Elastic IPs.
func hasElasticIPs(pl *v1.ExternalIPPool) bool {
	return pl.Spec.Cloud != nil && pl.Spec.Cloud.AWS != nil && pl.Spec.Cloud.AWS.ElasticIPs != nil
}

// claimNamed gives slot s of Egress i its named address, unless an older
// Egress already uses it (NamedIPConflict: named addresses of multi-IP
// Egresses are exclusive) or its pool cannot give it.
func (p *pass) claimNamed(i int, s *ipSlot) {
	ps, reason, msg := p.slotPool(s)
	if ps == nil {
		s.reason, s.msg = reason, msg
		return
	}
	ip := s.named
	if k, ok := ps.kind.(*cloudKind); ok {
		if s.reason, s.msg = k.claimIP(ps, ip, p.ownerOf(i, ps, ip), fmt.Sprintf("spec.ips[%d].addresses", s.entry)); s.reason == "" {
			s.ip = ip
			p.multiOwner[ip] = p.egs[i].Name
		}
		return
	}
	if owner := p.ownerOf(i, ps, ip); owner != "" {
		s.reason, s.msg = v1.ReasonNamedIPConflict, fmt.Sprintf("%s (spec.ips[%d].addresses) is already used by Egress %s, which is older; named addresses are not shared", ip, s.entry, owner)
		return
	}
	if err := ps.alloc.Reserve(ip); err != nil {
		s.reason, s.msg = v1.ReasonIPOutsidePool, fmt.Sprintf("%s (spec.ips[%d].addresses) cannot be used from ExternalIPPool %q: %v", ip, s.entry, s.pool, err)
		if o, ok := p.nodeIdx[ip]; ok && errors.Is(err, ipam.ErrExcludedAddress) {
			s.reason, s.msg = v1.ReasonNodeAddressConflict, fmt.Sprintf("%s (spec.ips[%d].addresses) is %s: a Node's own address is never an egress IP", ip, s.entry, o)
		}
		return
	}
	s.ip = ip
	p.multiOwner[ip] = p.egs[i].Name
}

// ownerOf names the older Egress (before i in allocation order) that
// already uses ip of pool ps: a multi-IP one that holds it, or a
// single-IP one that was given it. "" when none does. Addresses are
// reserved in age order, so one that ps has reserved is an older
// Egress's; only then are the single-IP Egresses searched for its name.
func (p *pass) ownerOf(i int, ps *poolState, ip netip.Addr) string {
	if o := p.multiOwner[ip]; o != "" {
		return o
	}
	taken := ps.alloc != nil && ps.alloc.IsAllocated(ip)
	if k, ok := ps.kind.(*cloudKind); ok {
		taken = k.cp.used[ip]
	}
	if !taken {
		return ""
	}
	for j := range i {
		if !p.isMulti(j) && p.alloc[j].ip == ip {
			return p.egs[j].Name
		}
	}
	return ""
}

// multiAllocate gives every IP of multi-IP Egress i still without an
// address the lowest free one of its pool, or PoolExhausted; an IP of a
// cloud pool a warm address (its Node preferred), or WaitingForWarmIP.
func (p *pass) multiAllocate(i int) {
	for k := range p.slots[i] {
		s := &p.slots[i][k]
		if s.ip.IsValid() || s.reason != "" {
			continue
		}
		ps := p.pools[s.pool]
		if ck, ok := ps.kind.(*cloudKind); ok {
			s.ip, s.preferred, s.reason, s.msg = ck.takeIP(s.entry)
			if s.ip.IsValid() {
				p.multiOwner[s.ip] = p.egs[i].Name
			}
			continue
		}
		ip, err := ps.alloc.Allocate()
		if err != nil {
			s.reason, s.msg = v1.ReasonPoolExhausted, fmt.Sprintf("ExternalIPPool %q has no free IP (%d of %d used); add a range or lower spec.ips[%d].count", s.pool, ps.alloc.Used(), ps.alloc.Total(), s.entry)
			continue
		}
		s.ip = ip
		p.multiOwner[ip] = p.egs[i].Name
	}
}

// multiAllocCond is the IPAllocated condition of an Egress with the IPs
// slots: Allocated when every IP has an address, PartlyAllocated (True)
// when some have, else False with the first IP's reason; the message
// names each entry's problems once.
func multiAllocCond(slots []ipSlot) (c condParts, conflict string) {
	var got []string
	var why []string
	seen := map[string]bool{}
	first := ""
	for _, s := range slots {
		if s.ip.IsValid() {
			got = append(got, s.ip.String())
			continue
		}
		first = cmp.Or(first, s.reason)
		line := fmt.Sprintf("spec.ips[%d] (pool %q): %s: %s", s.entry, s.pool, s.reason, s.msg)
		if !seen[line] {
			seen[line] = true
			why = append(why, line)
		}
		if s.reason == v1.ReasonNamedIPConflict {
			conflict = cmp.Or(conflict, s.msg)
		}
	}
	switch {
	case len(why) == 0:
		return condParts{true, v1.ReasonAllocated, fmt.Sprintf("%d IPs allocated: %s", len(got), strings.Join(got, ", "))}, conflict
	case len(got) > 0:
		return condParts{true, v1.ReasonPartlyAllocated, fmt.Sprintf("%d of %d IPs allocated (%s); %s", len(got), len(slots), strings.Join(got, ", "), strings.Join(why, "; "))}, conflict
	}
	return condParts{false, first, fmt.Sprintf("none of the %d IPs is allocated: %s", len(slots), strings.Join(why, "; "))}, conflict
}

// condParts is a condition's status, reason and message.
type condParts struct {
	ok          bool
	reason, msg string
}

// zonePoolName is the scheduler pool of the Nodes of pool in zone: a name
// no ExternalIPPool can have (pool names are DNS subdomains, without
// spaces), and that reads well in the scheduler's messages.
func zonePoolName(pool, zone string) string {
	if zone == "" {
		return pool
	}
	return pool + " (zone " + zone + ")"
}

// zonePools adds to the scheduler's pools one pool per (pool, zone) that
// a multi-IP Egress asks for: the valid pool's Nodes (nodeSelector and
// poolKind.fits) whose topology.kubernetes.io/zone label is zone, with
// the pool's family. An entry with a zone is scheduled in that pool, so
// its IPs stay in the zone; the balance bound is then counted over the
// zone's Nodes and IPs.
func (p *pass) zonePools() {
	s := &p.sched
	family := map[string]scheduler.Family{}
	for _, sp := range s.pools {
		family[sp.Name] = sp.Family
	}
	done := map[string]bool{}
	for i := range p.egs {
		for _, src := range p.egs[i].Spec.IPs {
			name := zonePoolName(src.Pool, src.Zone)
			ps := p.pools[src.Pool]
			if src.Zone == "" || done[name] || ps == nil || ps.err != nil {
				continue
			}
			done[name] = true
			sp := scheduler.Pool{Name: name, Family: family[src.Pool]}
			for _, n := range s.poolNodes[src.Pool].matching {
				if p.zoneOf(n) == src.Zone {
					sp.EligibleNodes = append(sp.EligibleNodes, n)
				}
			}
			s.pools = append(s.pools, sp)
			s.poolNodes[name] = poolMatch{what: ps.kind.matchWhat() + " and zone " + src.Zone, matching: sp.EligibleNodes}
		}
	}
}

// zoneOf is Node's topology.kubernetes.io/zone label ("" when it has
// none, or is not in the pass).
func (p *pass) zoneOf(node string) string {
	if node == "" {
		return ""
	}
	if p.sched.zones == nil {
		p.sched.zones = make(map[string]string, len(p.in.Nodes))
		for i := range p.in.Nodes {
			p.sched.zones[p.in.Nodes[i].Name] = p.in.Nodes[i].Labels[corev1.LabelTopologyZone]
		}
	}
	return p.sched.zones[node]
}

// schedSlots are the scheduler's slots of multi-IP Egress i: one per IP,
// in the pool of its entry and zone, with its current Node while it keeps
// its address (for a cloud pool, where the cloud has the address) and, for
// a warm address taken in this pass, that address's Node preferred.
func (p *pass) schedSlots(i int) []scheduler.Slot {
	out := make([]scheduler.Slot, len(p.slots[i]))
	for k, s := range p.slots[i] {
		out[k] = scheduler.Slot{Pool: zonePoolName(s.pool, s.zone), IP: s.ip, Preferred: s.preferred}
		if s.ip.IsValid() {
			out[k].CurrentNode = s.cur
		}
		if ck := p.cloudKindOf(s.pool); ck != nil && s.prev != nil {
			// The address lives where the cloud has it (the status says no
			// Node while it is being attached).
			out[k].CurrentNode = cmp.Or(ck.currentNode(s.ip), s.cur)
		}
	}
	return out
}
