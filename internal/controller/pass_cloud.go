package controller

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/scheduler"
)

// cloudPass is the cloud side of a pass across pools: the cloud's view,
// the cloud pools, and the named-address attaches the Egress statuses ask
// for. A nil *cloudPass (no provider) does nothing.
type cloudPass struct {
	in  *cloudInput
	out *cloudOutput
	// attached maps every secondary address of the known interfaces to
	// its Node (attachedAt).
	attached map[netip.Addr]string
	view     *eniView
	// pools are the cloud pools in the order of passInput.Pools.
	pools []*cloudPool
	// attach lists, per interface, the addresses to attach to it for
	// Egresses; attachNode is the interface's Node and attachFrom maps
	// addresses of ours that another interface holds to that interface.
	attach     map[string][]netip.Addr
	attachNode map[string]string
	attachFrom map[string]map[netip.Addr]string
}

// newCloudPass is the cloud side of a pass over ci, or nil when ci is.
func newCloudPass(ci *cloudInput) *cloudPass {
	if ci == nil {
		return nil
	}
	return &cloudPass{
		in:         ci,
		out:        &cloudOutput{Pools: map[string]*cloudPoolOut{}, Allocations: map[string]netip.Addr{}, HeldWanted: map[netip.Addr]bool{}},
		attached:   attachedAt(ci),
		view:       newENIView(ci),
		attach:     map[string][]netip.Addr{},
		attachNode: map[string]string{},
		attachFrom: map[string]map[netip.Addr]string{},
	}
}

// attachedMap is c.attached, nil without a provider.
func (c *cloudPass) attachedMap() map[netip.Addr]string {
	if c == nil {
		return nil
	}
	return c.attached
}

// newKind is the poolKind of the valid cloud-backed pool pl: its working
// state, with the addresses known to be ours marked.
func (c *cloudPass) newKind(pl *v1.ExternalIPPool, egs []v1.Egress) *cloudKind {
	cp := newCloudPool(pl, c.in, egs)
	cp.markOurs(pl, c.in, c.attached, egs)
	return &cloudKind{c: c, cp: cp}
}

// collectPools lists the cloud pools, in the order of pools.
func (c *cloudPass) collectPools(pools []v1.ExternalIPPool, states map[string]*poolState) {
	if c == nil {
		return
	}
	for i := range pools {
		if k, ok := states[pools[i].Name].kind.(*cloudKind); ok {
			c.pools = append(c.pools, k.cp)
		}
	}
}

// nodeCapacity lowers capacity, a Node's egress-IP capacity from its
// annotation or the flag, to what the cloud lets it hold
// (nodeCloudCapacity).
func (c *cloudPass) nodeCapacity(node string, capacity int) int {
	if c == nil {
		return capacity
	}
	if cc, ok := nodeCloudCapacity(c.in, c.view, node, c.pools); ok && cc < capacity {
		return cc
	}
	return capacity
}

// busy reports whether the cloud pool named pool still has addresses to
// release or interfaces to delete (it keeps its finalizer meanwhile).
func (c *cloudPass) busy(pool string) bool {
	return c != nil && c.out.Pools[pool] != nil && c.out.Pools[pool].Busy
}

// poolParts copies the cloud status and the CloudInterfaces condition of
// the pool's cloud outcome, if it has one, into st.
func (c *cloudPass) poolParts(pool string, st *v1.ExternalIPPoolStatus) {
	if c == nil {
		return
	}
	co := c.out.Pools[pool]
	if co == nil {
		return
	}
	cs := co.Status
	st.Cloud = &cs
	if co.Interfaces != nil {
		meta.SetStatusCondition(&st.Conditions, *co.Interfaces)
	}
}

// cloudKind is the poolKind of a cloud-backed pool (spec.cloud): its
// addresses are secondary addresses the cloud attaches to one Node's
// interface, taken warm or attached on demand.
type cloudKind struct {
	c  *cloudPass
	cp *cloudPool
}

var _ poolKind = (*cloudKind)(nil)

func (*cloudKind) excludeNodes(*pass, *poolState) {}

// keep takes the address spec.egressIP names unless an interface not ours
// holds it, else the address the status holds (or the previous pass
// gave, while its status write is not in the cache yet).
func (k *cloudKind) keep(p *pass, ps *poolState, i int) bool {
	e, cp, ci := p.egs[i], k.cp, k.c.in
	if e.Spec.EgressIP != "" {
		k.keepNamed(p, ps, i)
		return true
	}
	ip, err := netip.ParseAddr(e.Status.EgressIP)
	if err != nil && e.Status.EgressIP == "" {
		ip, err = ci.Recent[e.Name], nil // our write may not be in the cache yet
	}
	if h, held := ci.Held[ip]; err == nil && held {
		// Someone else holds the address now: the Egress gets another
		// one.
		p.alloc[i].heldNote = fmt.Sprintf("%s; this Egress gets another address", heldMessage(ip, "status.egressIP", h))
		ip = netip.Addr{}
	}
	if err != nil || !ip.IsValid() || cp.checkNamed(ip, ps.pool) != nil || cp.used[ip] || !p.keeps(i, ip) {
		return false
	}
	cp.used[ip] = true
	p.allocated(i, ip, allocatedMsg(ip, e.Spec.ExternalIPPool))
	if e.Status.EgressIP == "" {
		p.alloc[i].preferred = k.c.attached[ip]
	}
	return true
}

// keepNamed takes the address spec.egressIP of Egress i names.
func (k *cloudKind) keepNamed(p *pass, ps *poolState, i int) {
	e, cp, ci := p.egs[i], k.cp, k.c.in
	ip, err := netip.ParseAddr(e.Spec.EgressIP)
	if err == nil {
		err = cp.checkNamed(ip, ps.pool)
	}
	if err != nil {
		p.alloc[i].cond = allocatedCond(false, v1.ReasonIPOutsidePool, fmt.Sprintf("spec.egressIP %s cannot be used from ExternalIPPool %q: %v", e.Spec.EgressIP, e.Spec.ExternalIPPool, err))
		return
	}
	if h, held := ci.Held[ip]; held {
		k.c.out.HeldWanted[ip] = true
		c := allocatedCond(false, v1.ReasonAddressHeld, heldMessage(ip, "spec.egressIP", h))
		p.alloc[i].cond = c
		if prev := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionIPAllocated); prev == nil || prev.Reason != v1.ReasonAddressHeld || prev.Message != c.Message {
			p.alloc[i].heldNote = c.Message
		}
		return
	}
	cp.used[ip] = true
	p.allocated(i, ip, fmt.Sprintf("%s (named in spec) from ExternalIPPool %q", ip, e.Spec.ExternalIPPool))
}

// ready lists the warm addresses left once kept and named ones are used.
func (k *cloudKind) ready(p *pass, _ *poolState) {
	k.cp.fillWarm(k.c.in, k.c.attached, func(n string) bool { return p.agentOK(n) && k.cp.fits(k.c.in, n) })
}

// allocateNew gives Egress i a warm address, or WaitingForWarmIP while
// the pool attaches one.
func (k *cloudKind) allocateNew(p *pass, _ *poolState, i int) {
	e, cp := p.egs[i], k.cp
	ip, node, ok := cp.takeWarm()
	if !ok {
		cp.pending++
		msg := fmt.Sprintf("ExternalIPPool %q has no warm IP available; the controller is attaching one through the cloud API", e.Spec.ExternalIPPool)
		if why := cp.interfaceTrouble(k.c.in); why != "" {
			msg += "; but the pool cannot get network interfaces of its own: " + why
		}
		p.alloc[i].cond = allocatedCond(false, v1.ReasonWaitingForWarmIP, msg)
		return
	}
	p.allocated(i, ip, fmt.Sprintf("%s (warm on Node %s) allocated from ExternalIPPool %q", ip, node, e.Spec.ExternalIPPool))
	p.alloc[i].preferred = node
}

// fits: the Node's interface must be able to reach the pool's subnet.
func (k *cloudKind) fits(_ *pass, node string) bool { return k.cp.fits(k.c.in, node) }

func (k *cloudKind) matchWhat() string {
	if k.cp.own {
		return "the nodeSelector and the cloud subnet's VPC and availability zone"
	}
	return "the nodeSelector and the cloud subnet"
}

// schedEgress: a warm address taken in this pass prefers its Node; an
// address the cloud has (or is attaching) stays on that Node.
func (k *cloudKind) schedEgress(p *pass, i int, se *scheduler.Egress) {
	ip := p.alloc[i].ip
	if !ip.IsValid() {
		return
	}
	switch {
	case p.alloc[i].preferred != "":
		// A warm address taken in this pass: its Node first, within the
		// balance bound.
		se.Preferred = p.alloc[i].preferred
	case p.egs[i].Status.EgressIP == ip.String():
		// The address lives where the cloud has it, or where a call in
		// flight attaches it: that Node is its current one (the status
		// may lag behind, or say nothing while attaching), so it stays
		// put and does not bounce between Nodes while calls run.
		if n := cmp.Or(k.c.in.Attaching[ip], k.c.attached[ip]); n != "" {
			se.CurrentNode = n
		}
	}
}

// assign names target in the status once the address is on the target's
// interface and ours; until then it asks for the attach and the Assigned
// condition says Attaching.
func (k *cloudKind) assign(p *pass, i int, target string, es *egressStatus) string {
	ip := p.alloc[i].ip
	if target != "" {
		mac, msg, failed := k.place(ip, target)
		if msg == "" {
			es.st.InterfaceMAC = mac
		} else {
			if failed {
				es.ch.EventType, es.ch.EventReason, es.ch.EventNote = corev1.EventTypeWarning, v1.EventAttachFailed, msg
			}
			meta.SetStatusCondition(&es.st.Conditions, metav1.Condition{Type: v1.ConditionAssigned, Status: metav1.ConditionFalse, Reason: v1.ReasonAttaching,
				Message: msg, ObservedGeneration: p.egs[i].Generation})
			target = ""
		}
	}
	if ip.IsValid() {
		k.c.out.Allocations[p.egs[i].Name] = ip
	}
	return target
}

// place puts ip, an address of the pool, on an interface of Node target,
// for one Egress or one IP of a multi-IP Egress. When the address is there
// and ours it returns that interface's MAC, marks the address bound and
// msg is "". Otherwise it asks for the attach (attachTo) and msg says
// what the IP waits for (the Assigned condition's Attaching message);
// failed is set when the last call on that interface failed (msg then
// says how, for a Warning Event). An address there that is not ours (a Pod
// IP of the CNI, and in OwnInterfaces mode anything on the primary
// interface) goes through the attach and its look-up, which refuses it.
func (k *cloudKind) place(ip netip.Addr, target string) (mac, msg string, failed bool) {
	cp, c := k.cp, k.c
	if c.attached[ip] == target && cp.ours[ip] == target && (!cp.own || c.view.ifaceAt[ip] != c.in.Ifaces[target].ID) {
		cp.bound[ip] = true
		return c.view.macAt[ip], "", false
	}
	msg, failed = k.attachTo(ip, target)
	return "", msg, failed
}

// attachTo asks for ip on an interface of target and returns the Attaching
// message, with the error of the last call on that interface when it
// failed (failed).
func (k *cloudKind) attachTo(ip netip.Addr, target string) (string, bool) {
	cp, c := k.cp, k.c
	msg := fmt.Sprintf("attaching %s to the network interface of Node %s through the cloud API", ip, target)
	eni, ok := c.view.pick(target, cp)
	if !ok && cp.own {
		msg = fmt.Sprintf("waiting for an interface of the controller's own on Node %s to attach %s to (see the pool's condition %s)", target, ip, v1.ConditionCloudInterfaces)
	}
	failed := false
	if le := c.in.LastError[eni]; le != "" {
		msg += "; the last call on that interface failed: " + le
		failed = true
	}
	if !ok {
		return msg, failed
	}
	c.attach[eni] = append(c.attach[eni], ip)
	c.attachNode[eni] = target
	if from := holdingInterface(c.in.Ifaces, ip); cp.ours[ip] != "" && from != "" && from != eni {
		if c.attachFrom[eni] == nil {
			c.attachFrom[eni] = map[netip.Addr]string{}
		}
		c.attachFrom[eni][ip] = from
	}
	return msg, failed
}

// poolStatus sets the cloud status, the conditions CloudInterfaces and
// ElasticIPs, and the usage: the attached addresses, or the ranges when
// the pool has ipRanges. The Ready message adds the held addresses.
func (k *cloudKind) poolStatus(p *pass, ps *poolState, st *v1.ExternalIPPoolStatus) string {
	name := ps.obj.Name
	k.c.poolParts(name, st)
	cs := *st.Cloud
	st.Usage = v1.IPPoolUsage{Total: int64(cs.Attached), TotalText: strconv.Itoa(int(cs.Attached)), Used: int64(cs.Allocated)}
	if ps.alloc != nil {
		st.Usage.Total, st.Usage.TotalText = saturate(ps.alloc.Total()), ps.alloc.TotalText()
	}
	co := k.c.out.Pools[name]
	msg := heldSummary(co.HeldInRange, k.c.in.Held)
	if co.EIPCond != nil {
		meta.SetStatusCondition(&st.Conditions, *co.EIPCond)
	} else {
		meta.RemoveStatusCondition(&st.Conditions, v1.ConditionElasticIPs)
	}
	return msg
}

// deletingStatus keeps the cloud status of a pool being deleted.
func (k *cloudKind) deletingStatus(_ *pass, ps *poolState, st *v1.ExternalIPPoolStatus) {
	k.c.poolParts(ps.obj.Name, st)
}

// cloudOps is the cloud operations phase: the named-address attaches the
// Egress statuses asked for, each cloud pool's warm plan, status and
// Elastic IPs, the interfaces to create, and the leftovers to collect.
// Without a provider it does nothing.
func (p *pass) cloudOps() {
	c := p.cloud
	if c == nil {
		return
	}
	attaching := c.attachOps()
	for _, pl := range p.in.Pools {
		if k, ok := p.pools[pl.Name].kind.(*cloudKind); ok {
			c.planPool(p, &pl, k, attaching)
		}
	}
	c.out.CreateENIs = c.view.eniCreates()
	c.out.LateFacts = lateFacts(p.in.Nodes, c.in)
	for _, pl := range p.in.Pools {
		if c.in.Manage && ownInterfaces(pl.Spec.Cloud) {
			sn := pl.Spec.Cloud.AWS.SubnetID
			if _, ok := c.in.Subnets[sn]; !ok && c.in.SubnetErr[sn] == "" {
				c.out.Reread = true
			}
		}
	}
	c.collectLeftovers(p)
}

// attachOps turns the attaches the Egress statuses asked for into one
// call per interface not blocked, sorted by Node; it returns how many
// addresses are being attached to each Node.
func (c *cloudPass) attachOps() map[string]int {
	for ifc, ipl := range c.attach {
		if c.in.Blocked[ifc] {
			continue
		}
		slices.SortFunc(ipl, func(a, b netip.Addr) int { return a.Compare(b) })
		c.out.Attach = append(c.out.Attach, cloudOp{Node: c.attachNode[ifc], InterfaceID: ifc, IPs: slices.Compact(ipl), From: c.attachFrom[ifc]})
	}
	slices.SortFunc(c.out.Attach, func(a, b cloudOp) int { return cmp.Compare(a.Node, b.Node) })
	attaching := map[string]int{}
	for ifc, ipl := range c.attach {
		attaching[c.attachNode[ifc]] += len(ipl)
	}
	return attaching
}

// planPool plans one cloud pool (planCloudPool) and its Elastic IPs.
func (c *cloudPass) planPool(p *pass, pl *v1.ExternalIPPool, k *cloudKind, attaching map[string]int) {
	ps := p.pools[pl.Name]
	ours := func(ip netip.Addr) bool { return ownedByAny(c.pools, ip) }
	co := planCloudPool(pl, k.cp, ps.pool, sPoolNodes(p.sched.pools, pl.Name), c.in, c.view, c.attached, p.sched.nodes, p.sched.flagCapacity, attaching, ours)
	c.out.Pools[pl.Name] = co
	for _, ip := range co.HeldInRange {
		c.out.HeldWanted[ip] = true
	}
	if pl.Spec.Cloud.AWS != nil && pl.Spec.Cloud.AWS.ElasticIPs != nil && pl.DeletionTimestamp == nil {
		c.planEIPs(p, pl, co, ours)
	}
	c.out.Recheck = minPositive(c.out.Recheck, co.Plan.Recheck)
	c.out.DeleteENIs = append(c.out.DeleteENIs, co.Deletes...)
}

// planEIPs plans the Elastic IPs of the pool pl and writes the public
// addresses into its Egresses' statuses.
func (c *cloudPass) planEIPs(p *pass, pl *v1.ExternalIPPool, co *cloudPoolOut, ours func(netip.Addr) bool) {
	var wants []eipWant
	for i := range p.egs {
		ip := p.alloc[i].ip
		if p.egs[i].Spec.ExternalIPPool != pl.Name || !ip.IsValid() {
			continue
		}
		w := eipWant{Egress: p.egs[i].Name, IP: ip}
		if st := p.out.Egresses[p.egs[i].Name].Status; st.EgressNode != "" && st.InterfaceMAC != "" {
			w.Interface = holdingInterface(c.in.Ifaces, ip)
		}
		wants = append(wants, w)
	}
	if _, read := c.in.EIPs[pl.Name]; !read {
		c.out.ReadEIPs = true // a new pool: read its Elastic IPs now, not at the next refresh
	}
	ep := planElasticIPs(c.in.EIPs[pl.Name], wants, ours, func(alloc string) bool { return c.in.Blocked["eip/"+alloc] })
	for _, op := range ep.Ops {
		op.Pool = pl.Name
		c.out.EIPOps = append(c.out.EIPOps, op)
	}
	for name, pub := range ep.Public {
		ch := p.out.Egresses[name]
		ch.Status.PublicIP = pub.String()
		p.out.Egresses[name] = ch
	}
	ep.Cond.ObservedGeneration = pl.Generation
	co.EIPCond = &ep.Cond
}

// collectLeftovers asks to delete our interfaces that no pool or Node
// needs any more (collect).
func (c *cloudPass) collectLeftovers(p *pass) {
	poolNames, nodeNames := map[string]bool{}, map[string]bool{}
	for _, pl := range p.in.Pools {
		if ownInterfaces(pl.Spec.Cloud) && pl.Spec.Cloud.AWS.SubnetID != "" {
			poolNames[pl.Name] = true
		}
	}
	for i := range p.in.Nodes {
		nodeNames[p.in.Nodes[i].Name] = true
	}
	held := map[netip.Addr]bool{}
	for i := range p.egs {
		for ip := range heldIPs(p.egs[i]) {
			held[ip] = true
		}
	}
	c.out.DeleteENIs = append(c.out.DeleteENIs, collect(c.in, poolNames, nodeNames, func(ip netip.Addr) bool { return held[ip] })...)
}

// Multi-IP Egresses (spec.ips) with IPs from cloud pools: each IP takes
// the steps a single-IP Egress of the pool takes (keep, allocateNew,
// assign), through the methods below, called from pass_multi.go and
// pass_multistatus.go.

// keepIP reports whether an IP of a multi-IP Egress may keep ip, an
// address its status.ips holds from this pool, and marks it used: the
// pool may give it (IPv4, inside ipRanges if any), no interface that is
// not ours holds it, and no older Egress uses it.
func (k *cloudKind) keepIP(ps *poolState, ip netip.Addr) bool {
	cp := k.cp
	if _, held := k.c.in.Held[ip]; held || cp.used[ip] || cp.checkNamed(ip, ps.pool) != nil {
		return false
	}
	cp.used[ip] = true
	return true
}

// claimIP gives ip, an address spec.ips[].addresses names, to an IP of a
// multi-IP Egress, or returns why not (an IPAllocated reason and a
// message naming where); owner names the older Egress that uses it ("":
// none). what is where the spec names it, for messages.
func (k *cloudKind) claimIP(ps *poolState, ip netip.Addr, owner, what string) (reason, msg string) {
	cp := k.cp
	if err := cp.checkNamed(ip, ps.pool); err != nil {
		return v1.ReasonIPOutsidePool, fmt.Sprintf("%s (%s) cannot be used from ExternalIPPool %q: %v", ip, what, ps.obj.Name, err)
	}
	if h, held := k.c.in.Held[ip]; held {
		k.c.out.HeldWanted[ip] = true
		return v1.ReasonAddressHeld, heldMessage(ip, what, h)
	}
	if owner != "" || cp.used[ip] {
		return v1.ReasonNamedIPConflict, fmt.Sprintf("%s (%s) is already used by Egress %s, which is older; named addresses are not shared", ip, what, cmp.Or(owner, "another Egress"))
	}
	cp.used[ip] = true
	return "", ""
}

// takeIP gives an IP of a multi-IP Egress a warm address and its Node,
// or, while the pool has none, counts it pending (the warm plan attaches
// one) and returns WaitingForWarmIP with a message.
func (k *cloudKind) takeIP(entry int) (ip netip.Addr, node, reason, msg string) {
	cp := k.cp
	ip, node, ok := cp.takeWarm()
	if ok {
		return ip, node, "", ""
	}
	cp.pending++
	msg = fmt.Sprintf("ExternalIPPool %q has no warm IP available for spec.ips[%d]; the controller is attaching one through the cloud API", cp.name, entry)
	if why := cp.interfaceTrouble(k.c.in); why != "" {
		msg += "; but the pool cannot get network interfaces of its own: " + why
	}
	return netip.Addr{}, "", v1.ReasonWaitingForWarmIP, msg
}

// currentNode is the Node where the cloud has ip, or where a call in
// flight attaches it ("" when neither): the scheduler's current Node of an
// IP its status holds, so that it stays put while calls run (as
// schedEgress does for a single-IP Egress).
func (k *cloudKind) currentNode(ip netip.Addr) string {
	return cmp.Or(k.c.in.Attaching[ip], k.c.attached[ip])
}

// cloudKindOf is the cloudKind of the pool named pool, or nil for an L2
// pool, a missing or an invalid one.
func (p *pass) cloudKindOf(pool string) *cloudKind {
	if ps := p.pools[pool]; ps != nil && ps.err == nil {
		if k, ok := ps.kind.(*cloudKind); ok {
			return k
		}
	}
	return nil
}
