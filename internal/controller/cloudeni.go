package controller

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/cloud"
	"github.com/egressip/egressip/internal/cloud/warm"
)

// Tags on the network interfaces the controller creates for pools in
// interface mode OwnInterfaces (docs/cloud-aws.md).
const (
	// TagNoManage with the value "true" makes the AWS VPC CNI's ipamd
	// leave the interface alone (amazon-vpc-cni-k8s pkg/ipamd: ENIs with
	// node.k8s.amazonaws.com/no_manage=true are unmanaged; the primary ENI
	// is managed whatever its tags).
	TagNoManage = "node.k8s.amazonaws.com/no_manage"
	// TagCluster holds CloudConfig.ClusterName: the interface belongs to
	// this cluster's egressip controller.
	TagCluster = "egressip.io/cluster"
	// TagNode holds the name of the Node the interface was made for.
	TagNode = "egressip.io/node"
	// TagPool holds the name of the ExternalIPPool the interface serves.
	TagPool = "egressip.io/pool"
)

// ownInterfaces reports whether the pool puts its addresses on
// interfaces of the controller's own (the default) rather than on the
// Nodes' primary ones.
func ownInterfaces(p *v1.CloudPool) bool {
	return p != nil && p.AWS != nil && p.AWS.Interfaces() == v1.AWSOwnInterfaces
}

// eniCreate asks the CloudActuator to create one interface for a pool on a Node
// and attach it.
type eniCreate struct {
	Pool, Node, InstanceID, SubnetID string
	Groups                           []string
}

// eniDelete asks the CloudActuator to detach (when attached) and delete one of its
// interfaces.
type eniDelete struct {
	Pool, Node, InterfaceID, AttachmentID string
	Why                                   string
}

// ours reports whether an interface carries this cluster's ownership tag
// and the CNI's no_manage tag.
func (ci *cloudInput) ours(e cloud.ENI) bool {
	return ownTags(e.Tags, ci.Cluster)
}

// ownTags reports whether an interface's tags make it ours: TagCluster is
// the cluster's name and TagNoManage is "true".
func ownTags(tags map[string]string, cluster string) bool {
	return tags[TagCluster] == cluster && tags[TagNoManage] == "true"
}

// eniView is, for one pass, where each address of ours lives and how many
// free address slots each of our interfaces has left after the attaches
// the pass asks for.
type eniView struct {
	ci *cloudInput
	// free counts the free slots of each of our attached interfaces.
	free map[string]int
	// byNodePool lists our interfaces per "node/pool", by device index.
	byNodePool map[string][]cloud.ENI
	// ifaceAt and macAt map each secondary address (primary interfaces
	// and ours) to its interface and that interface's MAC.
	ifaceAt map[netip.Addr]string
	macAt   map[netip.Addr]string
	// creates are the interfaces the pass asks to create, by "node/pool".
	creates map[string]eniCreate
	// err holds, per pool, why a Node could not get an interface
	// (instance at its interface limit), for the pool's condition.
	full map[string][]string
}

func newENIView(ci *cloudInput) *eniView {
	v := &eniView{ci: ci, free: map[string]int{}, byNodePool: map[string][]cloud.ENI{}, ifaceAt: map[netip.Addr]string{},
		macAt: map[netip.Addr]string{}, creates: map[string]eniCreate{}, full: map[string][]string{}}
	for node, ifc := range ci.Ifaces {
		for _, ip := range ifc.Secondary {
			v.ifaceAt[ip], v.macAt[ip] = ifc.ID, ifc.MAC
		}
		for _, e := range ifc.Others {
			if !ci.ours(e) {
				continue
			}
			for _, ip := range e.Secondary {
				v.ifaceAt[ip], v.macAt[ip] = e.ID, e.MAC
			}
			if e.Tags[TagNode] != node {
				continue // moved between Nodes by hand: not used, the collector removes it
			}
			k := node + "/" + e.Tags[TagPool]
			v.byNodePool[k] = append(v.byNodePool[k], e)
			v.free[e.ID] = ifc.Limit - 1 - len(e.Secondary)
		}
	}
	return v
}

// attachable is how many more interfaces the pool may attach to the Node:
// the instance type's free interface slots (the primary and every other
// interface attached, the CNI's included, count), within the pool's
// maxInterfacesPerNode.
func (v *eniView) attachable(node string, cp *cloudPool) int {
	ifc := v.ci.Ifaces[node]
	if ifc.MaxInterfaces == 0 {
		return 0
	}
	n := ifc.MaxInterfaces - 1 - len(ifc.Others)
	if m := cp.maxIfaces; m > 0 {
		n = min(n, m-len(v.byNodePool[node+"/"+cp.name]))
	}
	for k := range v.creates {
		if k == node+"/"+cp.name {
			n-- // asked for in this pass already
		}
	}
	if v.ci.Creating[node+"/"+cp.name] {
		n--
	}
	return max(n, 0)
}

// room is how many more of the pool's addresses the Node may take: the
// free slots of the pool's interfaces on it plus, in OwnInterfaces mode,
// the slots of the interfaces it may still attach.
func (v *eniView) room(node string, cp *cloudPool) int {
	ifc := v.ci.Ifaces[node]
	if !cp.own {
		return ifc.Limit - 1 - len(ifc.Secondary)
	}
	r := 0
	for _, e := range v.byNodePool[node+"/"+cp.name] {
		r += max(v.free[e.ID], 0)
	}
	return r + v.attachable(node, cp)*max(ifc.Limit-1, 0)
}

// pick returns the interface of the Node that takes one more address of
// the pool and counts the slot as used: the primary interface in
// PrimaryInterface mode; else the first of the pool's interfaces on the
// Node with a free slot. When none has one, it asks for a new interface
// (if the Node may attach one) and returns false: the address waits for
// the next pass.
func (v *eniView) pick(node string, cp *cloudPool) (string, bool) {
	ifc := v.ci.Ifaces[node]
	if !cp.own {
		return ifc.ID, ifc.ID != ""
	}
	for _, e := range v.byNodePool[node+"/"+cp.name] {
		if v.free[e.ID] > 0 && !v.ci.Blocked[e.ID] {
			v.free[e.ID]--
			return e.ID, true
		}
	}
	v.wantInterface(node, cp)
	return "", false
}

// wantInterface asks for one more interface of the pool on the Node, if
// the instance and the pool's cap allow one; otherwise it records the
// Node as full.
func (v *eniView) wantInterface(node string, cp *cloudPool) {
	k := node + "/" + cp.name
	if _, asked := v.creates[k]; asked || v.ci.Creating[k] {
		return
	}
	ifc := v.ci.Ifaces[node]
	if v.attachable(node, cp) == 0 {
		if !slices.Contains(v.full[cp.name], node) {
			v.full[cp.name] = append(v.full[cp.name], node)
		}
		return
	}
	groups := cp.groups
	if len(groups) == 0 {
		groups = ifc.Groups // by default those of the Node's primary interface
	}
	v.creates[k] = eniCreate{Pool: cp.name, Node: node, InstanceID: ifc.InstanceID, SubnetID: cp.subnet, Groups: slices.Clone(groups)}
}

// split turns one warm attach (a count, or named addresses) for a Node
// into one op per interface of the pool, within their free slots; what
// does not fit asks for a new interface and waits.
func (v *eniView) split(node string, cp *cloudPool, count int, ips []netip.Addr) []cloudSplit {
	var out []cloudSplit
	want := count
	if len(ips) > 0 {
		want = len(ips)
	}
	for _, e := range v.byNodePool[node+"/"+cp.name] {
		if want == 0 {
			break
		}
		n := min(max(v.free[e.ID], 0), want)
		if n == 0 || v.ci.Blocked[e.ID] {
			continue
		}
		s := cloudSplit{InterfaceID: e.ID, Count: n}
		if len(ips) > 0 {
			s.IPs, ips = ips[:n], ips[n:]
			s.Count = 0
		}
		v.free[e.ID] -= n
		want -= n
		out = append(out, s)
	}
	if want > 0 {
		v.wantInterface(node, cp)
	}
	return out
}

// cloudSplit is one interface's share of a warm attach.
type cloudSplit struct {
	InterfaceID string
	Count       int
	IPs         []netip.Addr
}

// eniCreates returns the pass's interface requests, sorted.
func (v *eniView) eniCreates() []eniCreate {
	out := make([]eniCreate, 0, len(v.creates))
	for _, c := range v.creates {
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b eniCreate) int { return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.Pool, b.Pool)) })
	return out
}

// fullMessage says which Nodes could not get another interface for the
// pool, or "".
func (v *eniView) fullMessage(pool string) string {
	nodes := v.full[pool]
	if len(nodes) == 0 {
		return ""
	}
	slices.Sort(nodes)
	if len(nodes) > 5 {
		nodes = append(nodes[:5], fmt.Sprintf("and %d more", len(v.full[pool])-5))
	}
	return fmt.Sprintf("Nodes %v have no free interface slot for this pool (instance type interface limit or maxInterfacesPerNode) and their interfaces are full; raise maxInterfacesPerNode, use a larger instance type or add Nodes", nodes)
}

// ownedCapacity is how many egress IPs our interfaces on a Node can hold
// for the scheduler: the slots of our interfaces not taken by warm
// addresses, plus the slots of the interfaces still attachable (the most
// any OwnInterfaces pool allows).
func (v *eniView) ownedCapacity(node string, pools []*cloudPool) (int, bool) {
	ifc := v.ci.Ifaces[node]
	if ifc.ID == "" {
		return 0, false
	}
	c, attach := 0, 0
	for _, cp := range pools {
		if !cp.own {
			continue
		}
		for _, e := range v.byNodePool[node+"/"+cp.name] {
			taken := 0
			for _, ip := range e.Secondary {
				if !usedByAny(pools, ip) {
					taken++
				}
			}
			c += max(ifc.Limit-1-taken, 0)
		}
		attach = max(attach, v.attachable(node, cp))
	}
	return c + attach*max(ifc.Limit-1, 0), true
}

// ownPlan turns a pool's warm plan into calls on its own interfaces
// (OwnInterfaces mode): attaches split over the interfaces' free slots
// (asking for a new interface where they do not fit), detaches grouped
// by the interface that holds each address. It also releases what has
// lost its purpose, without the scale-down spacing: every warm address,
// cooling ones included, of a pool being deleted or on a Node no longer
// eligible for the pool; and it deletes the pool's interfaces that are
// empty on such Nodes (or everywhere, for a pool being deleted).
func ownPlan(p *v1.ExternalIPPool, cp *cloudPool, o *cloudPoolOut, warmIPs []warm.IP, eligible []string, ci *cloudInput, v *eniView) {
	deleting := p.DeletionTimestamp != nil
	isEligible := map[string]bool{}
	for _, n := range eligible {
		isEligible[n] = true
	}
	var attach []warm.Op
	for _, op := range o.Plan.Attach {
		for _, s := range v.split(op.Node, cp, op.Count, op.IPs) {
			attach = append(attach, warm.Op{Node: op.Node, InterfaceID: s.InterfaceID, Count: s.Count, IPs: s.IPs})
		}
	}
	detach := map[string][]netip.Addr{}
	nodeOf := map[string]string{}
	add := func(node string, ip netip.Addr) {
		id := v.ifaceAt[ip]
		if id == "" || ci.Blocked[id] || slices.Contains(detach[id], ip) {
			return
		}
		detach[id] = append(detach[id], ip)
		nodeOf[id] = node
	}
	for _, op := range o.Plan.Detach {
		for _, ip := range op.IPs {
			add(op.Node, ip)
		}
	}
	for _, w := range warmIPs {
		if deleting || !isEligible[w.Node] {
			add(w.Node, w.Addr)
		}
	}
	o.Plan.Attach = attach
	o.Plan.Detach = nil
	for _, id := range slices.Sorted(maps.Keys(detach)) {
		ips := detach[id]
		slices.SortFunc(ips, netip.Addr.Compare)
		o.Plan.Detach = append(o.Plan.Detach, warm.Op{Node: nodeOf[id], InterfaceID: id, IPs: ips})
	}
	slices.SortFunc(o.Plan.Detach, func(a, b warm.Op) int { return cmp.Compare(a.Node, b.Node) })

	emptyInterfaces(p, o, ci, isEligible)
	o.Interfaces = interfacesCondition(p, cp, o, eligible, ci, v)
}

func creatingFor(creating map[string]bool, pool string) bool {
	for k := range creating {
		if _, p, _ := strings.Cut(k, "/"); p == pool {
			return true
		}
	}
	return false
}

// collect finds our interfaces that nothing uses any more: tagged with
// our cluster but detached (a crash between create and attach, or an
// instance terminated without DeleteOnTermination), attached to an
// instance no Node of the cluster runs on, made for a Node that no longer
// exists, or serving a pool that no longer exists. Each is detached and
// deleted, which releases its addresses, unless an Egress status still
// names one of them (a move takes it first). It never looks at an
// interface without our TagCluster and TagNoManage tags.
func collect(ci *cloudInput, pools map[string]bool, nodes map[string]bool, held func(netip.Addr) bool) []eniDelete {
	instances := map[string]string{}
	for node, ifc := range ci.Ifaces {
		instances[ifc.InstanceID] = node
	}
	var out []eniDelete
	for _, e := range ci.Tagged {
		if !ci.ours(e) || ci.Blocked[e.ID] {
			continue
		}
		why := ""
		switch {
		case e.InstanceID == "":
			why = "detached"
		case instances[e.InstanceID] == "":
			why = fmt.Sprintf("attached to instance %s, which no Node runs on", e.InstanceID)
		case !nodes[e.Tags[TagNode]]:
			why = fmt.Sprintf("made for Node %s, which no longer exists", e.Tags[TagNode])
		case !pools[e.Tags[TagPool]]:
			why = fmt.Sprintf("made for ExternalIPPool %s, which no longer exists", e.Tags[TagPool])
		}
		if why == "" || slices.ContainsFunc(e.Secondary, held) {
			continue
		}
		out = append(out, eniDelete{Pool: e.Tags[TagPool], Node: e.Tags[TagNode], InterfaceID: e.ID, AttachmentID: e.AttachmentID, Why: why})
	}
	return out
}

// nodeCloudCapacity is a Node's egress-IP capacity from the cloud: the
// primary interface's (cloudCapacity) when a PrimaryInterface pool may use
// it, plus our own interfaces' (eniView.ownedCapacity) when an
// OwnInterfaces pool may. ok is false when the Node has no interface known
// or no cloud pool can use it.
func nodeCloudCapacity(ci *cloudInput, v *eniView, node string, pools []*cloudPool) (int, bool) {
	c, ok := 0, false
	primary, own := false, false
	for _, cp := range pools {
		if cp.fits(ci, node) {
			primary = primary || !cp.own
			own = own || cp.own
		}
	}
	if primary {
		if n, k := cloudCapacity(ci.Ifaces[node], pools); k {
			c, ok = c+n, true
		}
	}
	if own {
		if n, k := v.ownedCapacity(node, pools); k {
			c, ok = c+n, true
		}
	}
	if !primary && !own {
		// No cloud pool can use the Node: as before, its primary
		// interface bounds it (0 when unknown).
		return cloudCapacity(ci.Ifaces[node], pools)
	}
	return c, ok
}

// interfaceTrouble is what keeps an OwnInterfaces pool from getting
// interfaces now (a failed interface call, an unusable subnet), or "".
func (cp *cloudPool) interfaceTrouble(ci *cloudInput) string {
	switch {
	case !cp.own:
		return ""
	case !ci.Manage:
		return "the cloud provider cannot create network interfaces"
	case ci.SubnetErr[cp.subnet] != "":
		return fmt.Sprintf("subnet %s: %s", cp.subnet, ci.SubnetErr[cp.subnet])
	}
	return ci.PoolError[cp.name]
}

// emptyInterfaces asks to delete the pool's interfaces that are empty and
// have lost their purpose (the pool is being deleted, or their Node is no
// longer eligible), and marks the pool busy while it has any.
func emptyInterfaces(p *v1.ExternalIPPool, o *cloudPoolOut, ci *cloudInput, isEligible map[string]bool) {
	deleting := p.DeletionTimestamp != nil
	// Interfaces of the pool that are empty and have no purpose left.
	for node, ifc := range ci.Ifaces {
		for _, e := range ifc.Others {
			if !ci.ours(e) || e.Tags[TagPool] != p.Name {
				continue
			}
			o.Busy = true
			if len(e.Secondary) > 0 || ci.Blocked[e.ID] || (!deleting && isEligible[node] && e.Tags[TagNode] == node) {
				continue
			}
			why := "its pool is being deleted"
			if !deleting {
				why = fmt.Sprintf("Node %s is no longer eligible for the pool", node)
			}
			o.Deletes = append(o.Deletes, eniDelete{Pool: p.Name, Node: node, InterfaceID: e.ID, AttachmentID: e.AttachmentID, Why: why})
		}
	}
	if o.Status.Attached > 0 || ci.Creating != nil && creatingFor(ci.Creating, p.Name) {
		o.Busy = true
	}
}

// interfacesCondition is the pool's CloudInterfaces condition.
func interfacesCondition(p *v1.ExternalIPPool, cp *cloudPool, o *cloudPoolOut, eligible []string, ci *cloudInput, v *eniView) *metav1.Condition {
	if cp.pending > 0 && len(o.Plan.Attach) == 0 && len(eligible) > 0 {
		// Egresses wait and no eligible Node can take one more address:
		// say which are at their interface limit.
		for _, n := range eligible {
			if v.room(n, cp) <= 0 && v.attachable(n, cp) == 0 && !slices.Contains(v.full[cp.name], n) {
				v.full[cp.name] = append(v.full[cp.name], n)
			}
		}
	}
	c := metav1.Condition{Type: v1.ConditionCloudInterfaces, Status: metav1.ConditionTrue, Reason: v1.ReasonInterfacesReady,
		Message: "egress IPs go on interfaces of the controller's own, tagged " + TagNoManage + "=true", ObservedGeneration: p.Generation}
	switch {
	case !ci.Manage:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, v1.ReasonInterfaceFailed, "the cloud provider cannot create network interfaces; use interfaceMode PrimaryInterface (only without the AWS VPC CNI) or a provider that can"
	case ci.SubnetErr[cp.subnet] != "":
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, v1.ReasonSubnetUnusable, fmt.Sprintf("subnet %s: %s; fix spec.cloud.aws.subnetID", cp.subnet, ci.SubnetErr[cp.subnet])
	case ci.PoolError[p.Name] != "":
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, v1.ReasonInterfaceFailed, ci.PoolError[p.Name]
	case v.fullMessage(p.Name) != "":
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, v1.ReasonInterfaceLimit, v.fullMessage(p.Name)
	}
	if sn, ok := ci.Subnets[cp.subnet]; ok && c.Status == metav1.ConditionTrue {
		fit := 0
		for node := range ci.Ifaces {
			if cp.fits(ci, node) {
				fit++
			}
		}
		if fit == 0 && len(ci.Ifaces) > 0 {
			c.Status, c.Reason = metav1.ConditionFalse, v1.ReasonSubnetUnusable
			c.Message = fmt.Sprintf("subnet %s is in VPC %s, zone %s: no Node runs there, and an interface attaches only to an instance in its subnet's VPC and zone; pick a subnet in the Nodes' zone", cp.subnet, sn.VPCID, sn.Zone)
		}
	}
	return &c
}
