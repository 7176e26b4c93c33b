package controller

import (
	"cmp"
	"fmt"
	"iter"
	"maps"
	"net/netip"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/cloud"
	"github.com/egressip/egressip/internal/cloud/warm"
	"github.com/egressip/egressip/internal/ipam"
	"github.com/egressip/egressip/internal/scheduler"
)

// cloudInput is the cloud side of a pass, read from the CloudActuator's memory.
// Everything here is a snapshot; plan does not modify it.
type cloudInput struct {
	// Now is the pass's time (cooldowns, spacing, backoffs).
	Now time.Time
	// Ifaces are the Nodes' interfaces as last seen, by Node name.
	Ifaces map[string]cloud.Interface
	// Owned are, per pool, the addresses the controller attached for it
	// and has not detached, as remembered from earlier passes and calls
	// (the pool status and the Egress statuses add to it).
	Owned map[string]map[netip.Addr]bool
	// PrevAllocated are, per pool, the addresses an agent may have bound
	// at the end of the previous pass (published in an Egress status with
	// a Node): one that is not allocated any more was released and cools
	// down.
	PrevAllocated map[string]map[netip.Addr]bool
	// CoolUntil holds the end of each address's cooldown.
	CoolUntil map[netip.Addr]time.Time
	// LastScaleDown is when each pool last detached addresses.
	LastScaleDown map[string]time.Time
	// PoolBackoff: no warm attach for the pool before this time.
	PoolBackoff map[string]time.Time
	// Blocked are interfaces not to call now (a call in flight, or in
	// backoff after an error).
	Blocked map[string]bool
	// Detaching are warm addresses being detached: no longer the pool's.
	Detaching map[netip.Addr]bool
	// Attaching maps addresses with an attach call in flight to the Node
	// they are being attached to.
	Attaching map[netip.Addr]string
	// Recent maps each cloud-pool Egress to the address the previous pass
	// gave it: a pass that reads the cache before that status write
	// arrived gives the same address again instead of another one (which
	// could hand one address to two Egresses).
	Recent map[string]netip.Addr
	// WarmAttaching counts, per pool, the addresses warm attach calls in
	// flight are adding.
	WarmAttaching map[string]int
	// LastError holds, per interface, the error of its last failed call
	// (cleared by a success), for the Egresses' conditions.
	LastError map[string]string
	// Cluster is CloudConfig.ClusterName, the value of TagCluster on our
	// interfaces.
	Cluster string
	// Manage is set when the provider can create interfaces
	// (cloud.InterfaceManager).
	Manage bool
	// Subnets are the OwnInterfaces pools' subnets as the cloud describes
	// them; SubnetErr says why one could not be described.
	Subnets   map[string]cloud.Subnet
	SubnetErr map[string]string
	// Tagged are every interface carrying our TagCluster, attached or not,
	// as last listed (for the collector).
	Tagged []cloud.ENI
	// Creating marks "node/pool" pairs with an interface being created
	// and attached.
	Creating map[string]bool
	// PoolError holds, per pool, the error of its last failed interface
	// call (create, attach, delete), cleared by a success.
	PoolError map[string]string
	// Held are the addresses a look-up found held by an interface that is
	// not ours (issue 17 item 4): they are never attached, and an Egress
	// that names one gets a condition naming the holder.
	Held map[netip.Addr]heldAddr
	// Ours maps the addresses our own calls attached (and nothing has
	// detached since) to their interface.
	Ours map[netip.Addr]string
	// EIPs are, per pool naming Elastic IPs, the allocations as last
	// read.
	EIPs map[string]eipView
}

// cloudOp is one named-address attach for the CloudActuator to run: every address
// for one interface in one call.
type cloudOp struct {
	Node, InterfaceID string
	IPs               []netip.Addr
	// From maps the addresses that are ours now (attached for an Egress
	// or warm, on a known interface) to the interface holding them: only
	// those may be taken with reassignment. Every other address must be
	// free when the CloudActuator looks it up.
	From map[netip.Addr]string
}

// cloudPoolOut is the cloud outcome of a pass for one pool.
type cloudPoolOut struct {
	Plan   warm.Plan
	Status v1.CloudPoolStatus
	// Bound are the addresses an agent may hold (an Egress status names a
	// Node for them, before or after this pass).
	Bound map[netip.Addr]bool
	// Owned are the allocated plus the warm addresses.
	Owned map[netip.Addr]bool
	// Released were allocated in the previous pass and are warm now.
	Released []netip.Addr
	// Interfaces is the pool's CloudInterfaces condition (OwnInterfaces
	// pools); Busy is set while the pool still holds addresses or
	// interfaces (a deleted pool keeps its finalizer until then).
	Interfaces *metav1.Condition
	Busy       bool
	// Deletes are the pool's interfaces to detach and delete.
	Deletes []eniDelete
	// HeldInRange are addresses of the pool's ipRanges held by an
	// interface that is not ours (cloudInput.Held), sorted: skipped.
	HeldInRange []netip.Addr
	// EIPCond is the pool's ElasticIPs condition (pools naming Elastic
	// IPs only).
	EIPCond *metav1.Condition
}

// cloudOutput is what a pass asks of the cloud.
type cloudOutput struct {
	// Attach are named-address attaches, sorted by Node (failovers, moves,
	// user-named addresses): one call per interface.
	Attach []cloudOp
	Pools  map[string]*cloudPoolOut
	// CreateENIs and DeleteENIs are the interfaces to create and attach,
	// or to detach and delete (OwnInterfaces pools and the collector).
	CreateENIs []eniCreate
	DeleteENIs []eniDelete
	// Reread asks for a re-read of the cloud now (an OwnInterfaces pool's
	// subnet is not described yet).
	Reread bool
	// LateFacts are "node|providerID|instance type" keys of Nodes whose
	// cloud view is behind the Node object (a providerID set after
	// registration, an instance-type label that differs from the type
	// last read): each new key asks for one re-read now.
	LateFacts []string
	// Recheck, when positive, is when a new pass may decide differently.
	Recheck time.Duration
	// Allocations maps every cloud-pool Egress with an address to it.
	Allocations map[string]netip.Addr
	// HeldWanted are the held addresses (cloudInput.Held) an Egress or a
	// pool's ipRanges still ask for; the CloudActuator forgets the others.
	HeldWanted map[netip.Addr]bool
	// EIPOps are the Elastic IP calls of the pass.
	EIPOps []eipOp
	// ReadEIPs asks for a refresh now: a pool names Elastic IPs not read
	// yet.
	ReadEIPs bool
}

// cloudPool is a cloud-backed pool's working state in a pass.
type cloudPool struct {
	// name is the pool's name.
	name   string
	spec   *v1.CloudPool
	subnet string
	// own: interface mode OwnInterfaces; groups and maxIfaces are its
	// securityGroupIDs and maxInterfacesPerNode.
	own       bool
	groups    []string
	maxIfaces int
	// ranged is set when spec.ipRanges restricts the pool.
	ranged bool
	used   map[netip.Addr]bool
	// owned: addresses the pool owns (attached by us).
	owned map[netip.Addr]bool
	// avail: warm addresses out of cooldown, by Node (sorted).
	avail map[string][]netip.Addr
	// pending counts Egresses waiting for an address.
	pending int
	// load counts, per Node, the pool's Egresses on it (status).
	load map[string]int
	// bound: addresses an Egress status names with a Node (input or
	// output of the pass).
	bound map[netip.Addr]bool
	// ours maps the addresses known to be ours to the Node whose
	// interface holds them (see markOurs).
	ours map[netip.Addr]string
}

// attachedAt maps every secondary address of the known primary
// interfaces and of our own interfaces to its Node.
func attachedAt(ci *cloudInput) map[netip.Addr]string {
	at := map[netip.Addr]string{}
	for node, ifc := range ci.Ifaces {
		for _, ip := range ifc.Secondary {
			at[ip] = node
		}
		for _, e := range ifc.Others {
			if ci.ours(e) {
				for _, ip := range e.Secondary {
					at[ip] = node
				}
			}
		}
	}
	return at
}

// fits reports whether the Node can hold the pool's addresses as far as
// the network goes: in PrimaryInterface mode its primary interface is in
// the pool's subnet; in OwnInterfaces mode the subnet is in the Node's
// VPC and availability zone (an interface attaches only there).
func (cp *cloudPool) fits(ci *cloudInput, node string) bool {
	ifc := ci.Ifaces[node]
	if ifc.ID == "" {
		return false
	}
	if !cp.own {
		return ifc.SubnetID == cp.subnet
	}
	sn, ok := ci.Subnets[cp.subnet]
	return ok && ci.Manage && sn.VPCID == ifc.VPCID && sn.Zone == ifc.Zone
}

// newCloudPool gathers a cloud pool's owned and warm addresses.
func newCloudPool(p *v1.ExternalIPPool, ci *cloudInput, egs []v1.Egress) *cloudPool {
	cp := &cloudPool{spec: p.Spec.Cloud, name: p.Name, ranged: len(p.Spec.IPRanges) > 0, used: map[netip.Addr]bool{}, owned: map[netip.Addr]bool{}, avail: map[string][]netip.Addr{}, load: map[string]int{}, bound: map[netip.Addr]bool{}}
	if a := p.Spec.Cloud.AWS; a != nil {
		cp.subnet = a.SubnetID
		cp.own = ownInterfaces(p.Spec.Cloud)
		cp.groups, cp.maxIfaces = a.SecurityGroupIDs, int(a.MaxInterfacesPerNode)
	}
	if cp.own {
		// Every address on the pool's own interfaces is the pool's: the
		// CNI leaves those interfaces alone and nothing else attaches
		// there.
		for _, ifc := range ci.Ifaces {
			for _, e := range ifc.Others {
				if ci.ours(e) && e.Tags[TagPool] == p.Name {
					for _, ip := range e.Secondary {
						if !ci.Detaching[ip] {
							cp.owned[ip] = true
						}
					}
				}
			}
		}
	}
	for ip := range ci.Owned[p.Name] {
		if !ci.Detaching[ip] {
			cp.owned[ip] = true
		}
	}
	if p.Status.Cloud != nil {
		for _, w := range p.Status.Cloud.WarmIPs {
			if ip, err := netip.ParseAddr(w.IP); err == nil && !ci.Detaching[ip] {
				cp.owned[ip] = true
			}
		}
	}
	for i := range egs {
		for ip, node := range poolStatusIPs(&egs[i], p.Name) {
			if ip.IsValid() {
				cp.owned[ip] = true
				if node != "" {
					cp.bound[ip] = true
				}
			}
			if node != "" {
				cp.load[node]++
			}
		}
	}
	return cp
}

// poolStatusIPs yields each address e's status holds from the pool named
// pool, with its Node ("": none): status.egressIP and status.egressNode
// of an Egress of that pool (an invalid address when it has none, with
// its Node), and the status.ips entries of that pool of a multi-IP
// Egress (spec.ips), each address once.
func poolStatusIPs(e *v1.Egress, pool string) iter.Seq2[netip.Addr, string] {
	return func(yield func(netip.Addr, string) bool) {
		if len(e.Spec.IPs) == 0 {
			if e.Spec.ExternalIPPool == pool {
				ip, _ := netip.ParseAddr(e.Status.EgressIP)
				yield(ip, e.Status.EgressNode)
			}
			return
		}
		for k, s := range e.Status.IPs {
			ip, err := netip.ParseAddr(s.IP)
			if err != nil || s.Pool != pool || slices.ContainsFunc(e.Status.IPs[:k], func(o v1.EgressIPStatus) bool { return o.IP == s.IP }) {
				continue
			}
			if !yield(ip, s.Node) {
				return
			}
		}
	}
}

// markOurs records which attached addresses are known to be ours and
// where: those an Egress status publishes on the Node whose interface holds
// them (Assigned is written only after the cloud confirmed the attach),
// those the pool status lists warm on that Node, and those our own calls
// attached (ci.Owned, ci.Ours), and, in any mode, every address on an
// interface tagged as ours for this cluster (cloudInput.ours). An Egress
// status naming an address without that Node is no proof: it is written
// before the attach. In OwnInterfaces mode nothing on a Node's primary
// interface is ours (it belongs to the VPC CNI). Held addresses are never
// ours.
func (cp *cloudPool) markOurs(p *v1.ExternalIPPool, ci *cloudInput, at map[netip.Addr]string, egs []v1.Egress) {
	cp.ours = map[netip.Addr]string{}
	for ip := range ci.Owned[p.Name] {
		if n := at[ip]; n != "" && !ci.Detaching[ip] {
			cp.ours[ip] = n
		}
	}
	if p.Status.Cloud != nil {
		for _, w := range p.Status.Cloud.WarmIPs {
			if ip, err := netip.ParseAddr(w.IP); err == nil && at[ip] == w.Node {
				cp.ours[ip] = w.Node
			}
		}
	}
	for i := range egs {
		for ip, node := range poolStatusIPs(&egs[i], p.Name) {
			if ip.IsValid() && node != "" && at[ip] == node {
				cp.ours[ip] = node
			}
		}
	}
	for ip, ifc := range ci.Ours {
		if n := at[ip]; n != "" && holdingInterface(ci.Ifaces, ip) == ifc {
			cp.ours[ip] = n
		}
	}
	// An interface tagged as ours for this cluster (TagCluster, TagNoManage)
	// holds only addresses we put there: the VPC CNI leaves it alone.
	for node, ifc := range ci.Ifaces {
		for _, e := range ifc.Others {
			if !ci.ours(e) {
				continue
			}
			for _, ip := range e.Secondary {
				if !ci.Detaching[ip] {
					cp.ours[ip] = node
				}
			}
		}
	}
	if cp.own {
		// In OwnInterfaces mode the Node's primary interface is the VPC
		// CNI's: nothing on it is ours, whatever a status says.
		for _, ifc := range ci.Ifaces {
			for _, ip := range ifc.Secondary {
				delete(cp.ours, ip)
			}
		}
	}
	for ip := range ci.Held {
		delete(cp.ours, ip)
		delete(cp.owned, ip)
	}
}

// fillWarm lists the available warm addresses once the allocation of kept
// and named addresses has marked them used. An address released in this
// very pass (see releasedNow) is cooling already: it is not available.
func (cp *cloudPool) fillWarm(ci *cloudInput, at map[netip.Addr]string, eligible func(string) bool) {
	for ip := range cp.owned {
		node, ok := at[ip]
		if !ok || cp.used[ip] || !eligible(node) || ci.Now.Before(ci.CoolUntil[ip]) || cp.releasedNow(ci, ip) {
			continue
		}
		cp.avail[node] = append(cp.avail[node], ip)
	}
	for _, ips := range cp.avail {
		slices.SortFunc(ips, func(a, b netip.Addr) int { return a.Compare(b) })
	}
}

// releasedNow reports whether ip left an Egress in this pass: an agent may
// hold it (the previous pass published it with a Node, or an Egress status
// in this pass's input names a Node for it) and no Egress is allocated it
// now. Such an address starts its cooldown in this pass (warm.Cooldown),
// so no Egress may take it in the same pass that released it.
func (cp *cloudPool) releasedNow(ci *cloudInput, ip netip.Addr) bool {
	return !cp.used[ip] && (ci.PrevAllocated[cp.name][ip] || cp.bound[ip])
}

// takeWarm allocates a warm address on the least-loaded Node that has one
// (ties: the Node name) and returns it with its Node.
func (cp *cloudPool) takeWarm() (netip.Addr, string, bool) {
	best := ""
	for node, ips := range cp.avail {
		if len(ips) == 0 {
			continue
		}
		if best == "" || cp.load[node] < cp.load[best] || (cp.load[node] == cp.load[best] && node < best) {
			best = node
		}
	}
	if best == "" {
		return netip.Addr{}, "", false
	}
	ip := cp.avail[best][0]
	cp.avail[best] = cp.avail[best][1:]
	cp.load[best]++
	cp.used[ip] = true
	return ip, best, true
}

// checkNamed says whether ip may be used from the cloud pool.
func (cp *cloudPool) checkNamed(ip netip.Addr, pool *ipam.Pool) error {
	if !ip.Is4() {
		return fmt.Errorf("a cloud-backed pool is IPv4 only")
	}
	if cp.ranged && pool != nil {
		return pool.Check(ip)
	}
	return nil
}

// cloudCapacity is the number of allocated egress IPs a Node's interface
// may hold: its address limit, minus the primary, minus the secondary
// addresses others (such as a CNI's Pod IPs) use, minus our warm addresses
// on it that stay warm (a warm address taken by an Egress on this Node
// counts as allocated). So an address moved onto the Node always finds a
// free slot. ok is false when the Node's interface is unknown.
func cloudCapacity(ifc cloud.Interface, pools []*cloudPool) (int, bool) {
	if ifc.ID == "" {
		return 0, false
	}
	taken := 0
	for _, ip := range ifc.Secondary {
		if !usedByAny(pools, ip) {
			taken++
		}
	}
	return max(ifc.Limit-1-taken, 0), true
}

// usedByAny reports whether ip is allocated to an Egress of a cloud pool.
func usedByAny(pools []*cloudPool, ip netip.Addr) bool {
	for _, cp := range pools {
		if cp.used[ip] {
			return true
		}
	}
	return false
}

// warmNodes are the pool's eligible Nodes that may take warm addresses:
// room is the smaller of the free slots of the interface (after the
// attaches this pass asks for) and the Node's egress-IP capacity
// (annotation or flag) left after every address of ours on it.
func warmNodes(names []string, ci *cloudInput, cp *cloudPool, v *eniView, capacity, held, poolLoad, attaching map[string]int) []warm.Node {
	var out []warm.Node
	for _, n := range names {
		ifc := ci.Ifaces[n]
		if ifc.ID == "" || (!cp.own && ci.Blocked[ifc.ID]) {
			continue
		}
		free := v.room(n, cp)
		if cp.own {
			attaching[n] = 0 // v.room already counts this pass's named attaches
		}
		room := min(free, capacity[n]-held[n]) - attaching[n]
		out = append(out, warm.Node{Name: n, InterfaceID: ifc.ID, Room: room, Load: poolLoad[n]})
	}
	slices.SortFunc(out, func(a, b warm.Node) int { return cmp.Compare(a.Name, b.Name) })
	return out
}

func minPositive(a, b time.Duration) time.Duration {
	switch {
	case a <= 0:
		return b
	case b <= 0:
		return a
	}
	return min(a, b)
}

// ownedByAny reports whether any cloud pool owns ip or uses it.
func ownedByAny(pools []*cloudPool, ip netip.Addr) bool {
	for _, cp := range pools {
		if cp.owned[ip] || cp.used[ip] {
			return true
		}
	}
	return false
}

// sPoolNodes returns the eligible Node names of the scheduler pool name.
func sPoolNodes(sp []scheduler.Pool, name string) []string {
	for _, p := range sp {
		if p.Name == name {
			return p.EligibleNodes
		}
	}
	return nil
}

// planCloudPool computes a cloud pool's warm addresses, its status and its
// warm plan after allocation.
func planCloudPool(p *v1.ExternalIPPool, cp *cloudPool, pool *ipam.Pool, poolNodes []string, ci *cloudInput, v *eniView,
	at map[netip.Addr]string, sNodes []scheduler.Node, flagCapacity, attaching map[string]int, ours func(netip.Addr) bool) *cloudPoolOut {
	o := &cloudPoolOut{Bound: map[netip.Addr]bool{}, Owned: map[netip.Addr]bool{}}
	for ip := range cp.bound {
		if cp.used[ip] {
			o.Bound[ip] = true
		}
	}
	for ip := range cp.used {
		o.Owned[ip] = true
		if _, ok := at[ip]; ok {
			o.Status.Allocated++
		}
	}
	var warmIPs []warm.IP
	for ip := range cp.owned {
		node, ok := at[ip]
		if !ok || cp.used[ip] {
			continue
		}
		o.Owned[ip] = true
		cool := ci.CoolUntil[ip]
		if cp.releasedNow(ci, ip) {
			o.Released = append(o.Released, ip)
			cool = ci.Now.Add(warm.Cooldown)
		}
		warmIPs = append(warmIPs, warm.IP{Addr: ip, Node: node, CoolUntil: cool})
	}
	slices.SortFunc(warmIPs, func(a, b warm.IP) int { return a.Addr.Compare(b.Addr) })
	slices.SortFunc(o.Released, func(a, b netip.Addr) int { return a.Compare(b) })
	o.Status.Warm = int32(len(warmIPs))
	o.Status.Attached = o.Status.Allocated + o.Status.Warm
	for _, w := range warmIPs {
		if len(o.Status.WarmIPs) == 1000 { // the API's MaxItems; the rest stay in memory
			break
		}
		o.Status.WarmIPs = append(o.Status.WarmIPs, v1.WarmIP{IP: w.Addr.String(), Node: w.Node})
	}

	eligible := map[string]bool{}
	for _, n := range sNodes {
		if n.Eligible {
			eligible[n.Name] = true
		}
	}
	held := map[string]int{}
	poolLoad := map[string]int{}
	for ip, node := range at {
		if ours(ip) {
			held[node]++
		}
		if o.Owned[ip] {
			poolLoad[node]++
		}
	}
	var names []string
	for _, n := range poolNodes {
		if eligible[n] {
			names = append(names, n)
		}
	}
	in := warm.Input{
		Now: ci.Now, WarmTarget: int(cp.spec.WarmIPTarget), MinimumTarget: int(cp.spec.MinimumIPTarget),
		Allocated: len(cp.used), Pending: cp.pending, Attaching: ci.WarmAttaching[p.Name], Warm: warmIPs,
		Nodes:         warmNodes(names, ci, cp, v, flagCapacity, held, maps.Clone(poolLoad), maps.Clone(attaching)),
		LastScaleDown: ci.LastScaleDown[p.Name], BackoffUntil: ci.PoolBackoff[p.Name], Ranged: cp.ranged,
	}
	if p.DeletionTimestamp != nil {
		// A pool being deleted keeps nothing warm.
		in.WarmTarget, in.MinimumTarget = 0, 0
	}
	if cp.ranged && pool != nil {
		free := ipam.NewAllocator(pool)
		for ip := range at {
			_ = free.Reserve(ip) // addresses outside the pool are not in its ranges anyway
		}
		for ip := range cp.used {
			_ = free.Reserve(ip)
		}
		for ip := range ci.Held {
			if pool.Contains(ip) {
				_ = free.Reserve(ip) // someone else's: skipped
				o.HeldInRange = append(o.HeldInRange, ip)
			}
		}
		slices.SortFunc(o.HeldInRange, netip.Addr.Compare)
		want := in.WarmTarget + in.Pending + in.MinimumTarget
		for range want {
			ip, err := free.Allocate()
			if err != nil {
				break
			}
			in.Free = append(in.Free, ip)
		}
	}
	o.Plan = warm.Compute(in)
	if cp.own {
		ownPlan(p, cp, o, warmIPs, names, ci, v)
	}
	return o
}
