package controller

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/ipam"
	"github.com/egressip/egressip/internal/nodeaddr"
	"github.com/egressip/egressip/internal/poolspec"
	"github.com/egressip/egressip/internal/scheduler"
)

// Condition reasons written by the controller.
const (
	ReasonAllocated         = "Allocated"
	ReasonPoolNotFound      = "PoolNotFound"
	ReasonPoolInvalid       = "PoolInvalid"
	ReasonPoolExhausted     = "PoolExhausted"
	ReasonIPOutsidePool     = "IPOutsidePool"
	ReasonScheduled         = "Scheduled"
	ReasonWaitingForRelease = "WaitingForRelease"
	ReasonAnnounced         = "Announced"
	ReasonBinding           = "Binding"
	ReasonNotAssigned       = "NotAssigned"
	ReasonValid             = "Valid"
	ReasonInvalid           = "Invalid"
	ReasonInUse             = "InUse"
	// ReasonInvalidSelector: spec.appliedTo holds a selector that cannot be
	// parsed (condition SelectorValid and a Warning Event).
	ReasonInvalidSelector = "InvalidSelector"
	// ReasonNoEgressNode is the Ready reason while no Node holds the
	// Egress's IP (none allocated or none assigned); the selected Pods'
	// traffic then follows spec.failurePolicy.
	ReasonNoEgressNode = "NoEgressNode"
)

// Node eligibility reasons (scheduler.Node.Reason).
const (
	NodeDeleting           = "Deleting"
	NodeNotReady           = "NotReady"
	NodeNetworkUnavailable = "NetworkUnavailable"
	NodeNotLinux           = "NotLinux"
	NodeAgentDead          = "AgentDead"
	NodeCordoned           = "Cordoned"
)

// PassConfig holds the controller settings one pass uses.
type PassConfig struct {
	// DefaultCapacity is the number of egress IPs a Node may hold when it
	// has no valid egressip.io/max-egress-ips annotation; also the largest
	// value that annotation may take.
	DefaultCapacity int
	// BalanceFactor is the scheduler's c (0 means scheduler.DefaultBalanceFactor).
	BalanceFactor float64
	// ReleaseTimeout bounds a planned move's wait for the old Node to
	// release an IP: a Node that still reports the IP bound this long
	// after the wait began counts as not releasing it and is treated, for
	// that IP, like a dead Node (the IP is assigned elsewhere at once).
	// 0 waits without limit (tests of the pass alone); egressip-controller
	// sets --release-timeout (default DefaultReleaseTimeout).
	ReleaseTimeout time.Duration
}

// DefaultReleaseTimeout is the default of --release-timeout: as long as a
// crashed Node's IPs take to move (--agent-dead-after), so that a Node
// that answers polls but does not release is never waited for longer than
// a dead one.
const DefaultReleaseTimeout = 3 * time.Second

// releaseKey names one wait: Node must release IP.
type releaseKey struct {
	Node string
	IP   netip.Addr
}

// passInput is everything one pass looks at, read from the cache.
type passInput struct {
	Pools    []v1.ExternalIPPool
	Egresses []v1.Egress
	Nodes    []corev1.Node
	Agents   func(node string) AgentState
	Config   PassConfig
	// Cloud is the cloud side; nil when the controller runs without a
	// cloud provider (cloud-backed pools are then invalid).
	Cloud *cloudInput
	// Now is the pass's clock reading.
	Now time.Time
	// ReleaseSince says when the pass began to wait for a Node to
	// release an IP (the zero time: not waiting yet).
	ReleaseSince func(releaseKey) time.Time
}

// releaseExpired reports whether the wait for k has lasted
// Config.ReleaseTimeout or longer.
func (in *passInput) releaseExpired(k releaseKey) bool {
	if in.Config.ReleaseTimeout <= 0 || in.ReleaseSince == nil {
		return false
	}
	since := in.ReleaseSince(k)
	return !since.IsZero() && in.Now.Sub(since) >= in.Config.ReleaseTimeout
}

// egressChange is the outcome of a pass for one Egress.
type egressChange struct {
	Status v1.EgressStatus
	// Event, when Reason is set, is the Event to record on the Egress.
	EventType, EventReason, EventNote string
	// MoveReason is set when the Egress leaves a Node (for metrics).
	MoveReason string
	// SelectorEvent, when set, is the note of a Warning Event
	// (ReasonInvalidSelector): the Egress's selectors became unparsable.
	SelectorEvent string
	// IPChangedNote, when set, is the note of the EgressIPChanged Warning
	// Event: status.egressIP changes from one address to another.
	IPChangedNote string
	// ConflictEvent, when set, is the note of a Warning Event
	// (v1.ReasonDuplicateIP): another host answers for the Egress's IP.
	ConflictEvent string
}

// passOutput is what a pass decides.
type passOutput struct {
	Egresses map[string]egressChange
	Pools    map[string]v1.ExternalIPPoolStatus
	// InvalidCapacity lists Nodes whose capacity annotation is invalid, with
	// the parse error.
	InvalidCapacity map[string]error
	// Unplaced counts Egresses without a Node, by reason.
	Unplaced map[string]int
	// Awaited lists the Nodes whose next report the pass waits for: to
	// release an IP before a planned move completes, or to bind and announce
	// a newly assigned one. The reconciler polls them sooner.
	Awaited []string
	// Waits lists every (Node, IP) release the pass waits for; the
	// reconciler keeps when each began (passInput.ReleaseSince).
	Waits []releaseKey
	// Finalize says, per pool, whether it must carry PoolFinalizer: every
	// pool does, until it is being deleted and no Egress uses it.
	Finalize map[string]bool
	// Cloud is what the pass asks of the cloud; nil without a provider.
	Cloud *cloudOutput
	// Conflicts counts the Egresses whose condition Conflict is True.
	Conflicts int
}

// PoolFinalizer keeps an ExternalIPPool that Egresses still use from being
// deleted; the controller removes it once no Egress names the pool.
const PoolFinalizer = "egressip.io/pool-in-use"

// plan runs allocation and scheduling over in. It is a pure function of its
// input: the reconciler gathers the input and writes what changed.
func plan(in passInput) passOutput { //nolint:gocyclo // one pure pass in sequential sections (pools, Nodes, statuses); splitting it is a refactor of its own
	out := passOutput{
		Egresses:        make(map[string]egressChange, len(in.Egresses)),
		Pools:           make(map[string]v1.ExternalIPPoolStatus, len(in.Pools)),
		InvalidCapacity: map[string]error{},
		Unplaced:        map[string]int{},
	}
	egs := slices.Clone(in.Egresses)
	slices.SortFunc(egs, func(a, b v1.Egress) int { return olderFirst(&a.ObjectMeta, &b.ObjectMeta) })

	// Pools.
	type poolState struct {
		obj   *v1.ExternalIPPool
		pool  *ipam.Pool // nil for a cloud pool without ipRanges
		alloc *ipam.Allocator
		err   error
		sel   labels.Selector
		cloud *cloudPool // set for a cloud-backed pool
		// nodeIPs are the Node addresses in the pool's ranges, never
		// allocated (not for cloud pools: the cloud assigns each address
		// to one interface).
		nodeIPs []netip.Addr
	}
	var attached map[netip.Addr]string
	var view *eniView
	if in.Cloud != nil {
		out.Cloud = &cloudOutput{Pools: map[string]*cloudPoolOut{}, Allocations: map[string]netip.Addr{}, HeldWanted: map[netip.Addr]bool{}}
		attached = attachedAt(in.Cloud)
		view = newENIView(in.Cloud)
	}
	agentOK := func(node string) bool { st := in.Agents(node); return !st.Dead }
	pools := make(map[string]*poolState, len(in.Pools))
	for i := range in.Pools {
		p := &in.Pools[i]
		ps := &poolState{obj: p}
		switch {
		case p.Spec.Cloud != nil && in.Cloud == nil:
			ps.err = fmt.Errorf("the pool is cloud-backed (spec.cloud) but the controller runs without a cloud provider; start it with --cloud-provider=aws")
		case p.Spec.Cloud != nil && len(p.Spec.IPRanges) == 0:
		default:
			ps.pool, ps.err = poolspec.Parse(p)
		}
		if ps.err == nil && p.Spec.Cloud != nil {
			ps.cloud = newCloudPool(p, in.Cloud, in.Egresses)
			ps.cloud.markOurs(p, in.Cloud, attached, in.Egresses)
		}
		if ps.err == nil {
			if ps.pool != nil {
				ps.alloc = ipam.NewAllocator(ps.pool)
			}
			ps.sel = labels.Everything()
			if p.Spec.NodeSelector != nil {
				ps.sel, ps.err = metav1.LabelSelectorAsSelector(p.Spec.NodeSelector)
				if ps.err != nil {
					ps.err = fmt.Errorf("nodeSelector: %w", ps.err)
				}
			}
		}
		pools[p.Name] = ps
	}
	var cloudPools []*cloudPool
	for _, ps := range pools {
		if ps.cloud != nil {
			cloudPools = append(cloudPools, ps.cloud)
		}
	}
	// Pools must not share addresses (the webhook rejects it; this catches
	// what raced past it): the older pool keeps the address, the newer one
	// is invalid until fixed.
	byAge := make([]*v1.ExternalIPPool, 0, len(in.Pools))
	for i := range in.Pools {
		byAge = append(byAge, &in.Pools[i])
	}
	slices.SortFunc(byAge, func(a, b *v1.ExternalIPPool) int { return olderFirst(&a.ObjectMeta, &b.ObjectMeta) })
	for i, p := range byAge {
		ps := pools[p.Name]
		for _, older := range byAge[:i] {
			o := pools[older.Name]
			if ps.err != nil || o.err != nil || ps.pool == nil || o.pool == nil {
				continue
			}
			if a, b, overlap := ipam.Overlaps(ps.pool.Ranges(), o.pool.Ranges()); overlap {
				ps.err = fmt.Errorf("ipRanges[%d] %s overlaps ExternalIPPool %q (ipRanges[%d] %s), which is older", a, ps.pool.Ranges()[a], older.Name, b, o.pool.Ranges()[b])
			}
		}
	}

	// A Node's own address is never an egress IP (issue 14): take them out
	// of every ranged pool before anything is reserved.
	nodeIdx := nodeAddressIndex(in, attached)
	for _, ps := range pools {
		if ps.err == nil && ps.pool != nil && ps.cloud == nil {
			ps.pool, ps.nodeIPs = withNodeExclusions(ps.pool, nodeIdx)
			ps.alloc = ipam.NewAllocator(ps.pool)
		}
	}

	// Allocation: keep what statuses and specs already say, then allocate
	// the lowest free address for the rest, oldest Egress first.
	ips := make([]netip.Addr, len(egs))
	// conflict is set for an Egress whose IP is a Node's address: it keeps
	// the IP in its status but is not scheduled (the Node wins).
	conflict := make([]*nodeaddr.Owner, len(egs))
	conflictHeld := map[netip.Addr]bool{}
	// rejected is the Warning Event note for an Egress whose status holds
	// an IP its pool cannot give (written by hand, or left from an older
	// spec); the pass allocates another.
	rejected := make([]string, len(egs))
	preferred := make([]string, len(egs)) // cloud pools: the Node holding the address
	// heldNote is the Warning Event note (v1.ReasonAddressHeld) for an
	// Egress whose address an interface that is not ours holds.
	heldNote := make([]string, len(egs))
	allocCond := make([]metav1.Condition, len(egs))
	var pending []int
	keeper := statusKeepers(egs)
	keeps := func(i int, ip netip.Addr) bool { k, ok := keeper[ip]; return !ok || k == i }
	for i := range egs {
		e := &egs[i]
		ps := pools[e.Spec.ExternalIPPool]
		switch {
		case ps == nil:
			allocCond[i] = allocatedCond(false, ReasonPoolNotFound, fmt.Sprintf("ExternalIPPool %q does not exist; create it or fix spec.externalIPPool", e.Spec.ExternalIPPool))
			continue
		case ps.err != nil:
			allocCond[i] = allocatedCond(false, ReasonPoolInvalid, fmt.Sprintf("ExternalIPPool %q is invalid: %v", e.Spec.ExternalIPPool, ps.err))
			continue
		}
		if cp := ps.cloud; cp != nil {
			if e.Spec.EgressIP != "" {
				ip, err := netip.ParseAddr(e.Spec.EgressIP)
				if err == nil {
					err = cp.checkNamed(ip, ps.pool)
				}
				if err != nil {
					allocCond[i] = allocatedCond(false, ReasonIPOutsidePool, fmt.Sprintf("spec.egressIP %s cannot be used from ExternalIPPool %q: %v", e.Spec.EgressIP, e.Spec.ExternalIPPool, err))
					continue
				}
				if h, held := in.Cloud.Held[ip]; held {
					out.Cloud.HeldWanted[ip] = true
					allocCond[i] = allocatedCond(false, v1.ReasonAddressHeld, heldMessage(ip, "spec.egressIP", h))
					if prev := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionIPAllocated); prev == nil || prev.Reason != v1.ReasonAddressHeld || prev.Message != allocCond[i].Message {
						heldNote[i] = allocCond[i].Message
					}
					continue
				}
				cp.used[ip] = true
				ips[i] = ip
				allocCond[i] = allocatedCond(true, ReasonAllocated, fmt.Sprintf("%s (named in spec) from ExternalIPPool %q", ip, e.Spec.ExternalIPPool))
				continue
			}
			ip, err := netip.ParseAddr(e.Status.EgressIP)
			if err != nil && e.Status.EgressIP == "" {
				ip, err = in.Cloud.Recent[e.Name], nil // our write may not be in the cache yet
			}
			if h, held := in.Cloud.Held[ip]; err == nil && held {
				// Someone else holds the address now: the Egress gets
				// another one.
				heldNote[i] = fmt.Sprintf("%s; this Egress gets another address", heldMessage(ip, "status.egressIP", h))
				ip = netip.Addr{}
			}
			if err == nil && ip.IsValid() && cp.checkNamed(ip, ps.pool) == nil && !cp.used[ip] && keeps(i, ip) {
				cp.used[ip] = true
				ips[i] = ip
				if e.Status.EgressIP == "" {
					preferred[i] = attached[ip]
				}
				allocCond[i] = allocatedCond(true, ReasonAllocated, fmt.Sprintf("%s allocated from ExternalIPPool %q", ip, e.Spec.ExternalIPPool))
				continue
			}
			pending = append(pending, i)
			continue
		}
		if e.Spec.EgressIP != "" {
			ip, err := netip.ParseAddr(e.Spec.EgressIP)
			if err == nil {
				err = ps.alloc.Reserve(ip)
			}
			if o, ok := nodeIdx[ip]; ok && errors.Is(err, ipam.ErrExcludedAddress) {
				ips[i], conflict[i] = ip, &o
				allocCond[i] = allocatedCond(true, ReasonAllocated, fmt.Sprintf("%s (named in spec) from ExternalIPPool %q", ip, e.Spec.ExternalIPPool))
				continue
			}
			if err != nil {
				allocCond[i] = allocatedCond(false, ReasonIPOutsidePool, fmt.Sprintf("spec.egressIP %s cannot be used from ExternalIPPool %q: %v", e.Spec.EgressIP, e.Spec.ExternalIPPool, err))
				continue
			}
			ips[i] = ip
			allocCond[i] = allocatedCond(true, ReasonAllocated, fmt.Sprintf("%s (named in spec) from ExternalIPPool %q", ip, e.Spec.ExternalIPPool))
			continue
		}
		if ip, err := netip.ParseAddr(e.Status.EgressIP); err == nil && ps.pool.Contains(ip) && !ps.alloc.IsAllocated(ip) && keeps(i, ip) {
			if err := ps.alloc.Reserve(ip); err == nil {
				ips[i] = ip
				allocCond[i] = allocatedCond(true, ReasonAllocated, fmt.Sprintf("%s allocated from ExternalIPPool %q", ip, e.Spec.ExternalIPPool))
				continue
			}
		}
		if ip, kept, o, note := statusIPKept(e, ps.pool, nodeIdx, conflictHeld); kept {
			conflictHeld[ip] = true
			ips[i], conflict[i] = ip, o
			allocCond[i] = allocatedCond(true, ReasonAllocated, fmt.Sprintf("%s allocated from ExternalIPPool %q", ip, e.Spec.ExternalIPPool))
			continue
		} else if note != "" {
			rejected[i] = note
		}
		pending = append(pending, i)
	}
	for _, ps := range pools {
		if ps.cloud != nil {
			ps.cloud.fillWarm(in.Cloud, attached, func(n string) bool { return agentOK(n) && ps.cloud.fits(in.Cloud, n) })
		}
	}
	for _, i := range pending {
		e := &egs[i]
		ps := pools[e.Spec.ExternalIPPool]
		if cp := ps.cloud; cp != nil {
			ip, node, ok := cp.takeWarm()
			if !ok {
				cp.pending++
				msg := fmt.Sprintf("ExternalIPPool %q has no warm IP available; the controller is attaching one through the cloud API", e.Spec.ExternalIPPool)
				if why := cp.interfaceTrouble(in.Cloud); why != "" {
					msg += "; but the pool cannot get network interfaces of its own: " + why
				}
				allocCond[i] = allocatedCond(false, ReasonWaitingForWarmIP, msg)
				continue
			}
			ips[i], preferred[i] = ip, node
			allocCond[i] = allocatedCond(true, ReasonAllocated, fmt.Sprintf("%s (warm on Node %s) allocated from ExternalIPPool %q", ip, node, e.Spec.ExternalIPPool))
			continue
		}
		ip, err := ps.alloc.Allocate()
		if err != nil {
			allocCond[i] = allocatedCond(false, ReasonPoolExhausted, fmt.Sprintf("ExternalIPPool %q has no free IP (%d of %d used); add a range or delete an Egress", e.Spec.ExternalIPPool, ps.alloc.Used(), ps.alloc.Total()))
			continue
		}
		ips[i] = ip
		allocCond[i] = allocatedCond(true, ReasonAllocated, fmt.Sprintf("%s allocated from ExternalIPPool %q", ip, e.Spec.ExternalIPPool))
	}

	// Nodes.
	sNodes := make([]scheduler.Node, 0, len(in.Nodes))
	flagCapacity := make(map[string]int, len(in.Nodes))
	for i := range in.Nodes {
		n := &in.Nodes[i]
		sn := scheduler.Node{Name: n.Name, Capacity: in.Config.DefaultCapacity}
		if v, ok := n.Annotations[scheduler.CapacityAnnotation]; ok {
			c, err := scheduler.ParseCapacity(v, in.Config.DefaultCapacity)
			if err != nil {
				out.InvalidCapacity[n.Name] = err
			} else {
				sn.Capacity = c
			}
		}
		flagCapacity[n.Name] = sn.Capacity
		if in.Cloud != nil {
			if c, ok := nodeCloudCapacity(in.Cloud, view, n.Name, cloudPools); ok && c < sn.Capacity {
				sn.Capacity = c
			}
		}
		sn.Reason = ineligibleReason(n, in.Agents(n.Name))
		sn.Eligible = sn.Reason == ""
		sNodes = append(sNodes, sn)
	}
	var nodeByName map[string]*scheduler.Node // built on first NoEligibleNode message
	// poolNodes keeps, per pool, the Nodes that match it, so that a
	// NoEligibleNode condition can say why none can hold an IP (noNodeDetail,
	// computed only for such conditions).
	poolNodes := map[string]poolMatch{}
	sPools := make([]scheduler.Pool, 0, len(in.Pools))
	for _, p := range in.Pools {
		ps := pools[p.Name]
		sp := scheduler.Pool{Name: p.Name, Family: scheduler.IPv4}
		if ps.err != nil {
			sp.Family = 0
		} else if ps.pool != nil && ps.pool.Is6() {
			sp.Family = scheduler.IPv6
		}
		if ps.err == nil {
			for i := range in.Nodes {
				if ps.sel.Matches(labels.Set(in.Nodes[i].Labels)) && (ps.cloud == nil || ps.cloud.fits(in.Cloud, in.Nodes[i].Name)) {
					sp.EligibleNodes = append(sp.EligibleNodes, in.Nodes[i].Name)
				}
			}
			what := "the nodeSelector"
			switch {
			case ps.cloud != nil && ps.cloud.own:
				what = "the nodeSelector and the cloud subnet's VPC and availability zone"
			case ps.cloud != nil:
				what = "the nodeSelector and the cloud subnet"
			}
			poolNodes[p.Name] = poolMatch{what: what, matching: sp.EligibleNodes}
		}
		sPools = append(sPools, sp)
	}
	sEgs := make([]scheduler.Egress, len(egs))
	for i := range egs {
		sEgs[i] = scheduler.Egress{Name: egs[i].Name, Created: egs[i].CreationTimestamp.Time, Pool: egs[i].Spec.ExternalIPPool, IP: ips[i], CurrentNode: egs[i].Status.EgressNode}
		if conflict[i] != nil {
			sEgs[i].IP = netip.Addr{} // the Node wins: scheduled nowhere
		}
		if !sEgs[i].IP.IsValid() {
			sEgs[i].CurrentNode = ""
		}
		if ps := pools[egs[i].Spec.ExternalIPPool]; ps != nil && ps.cloud != nil && ips[i].IsValid() {
			switch {
			case preferred[i] != "":
				// A warm address taken in this pass: its Node first,
				// within the balance bound.
				sEgs[i].Preferred = preferred[i]
			case egs[i].Status.EgressIP == ips[i].String():
				// The address lives where the cloud has it, or where a
				// call in flight attaches it: that Node is its current
				// one (the status may lag behind, or say nothing while
				// attaching), so it stays put and does not bounce
				// between Nodes while calls run.
				if n := cmp.Or(in.Cloud.Attaching[ips[i]], attached[ips[i]]); n != "" {
					sEgs[i].CurrentNode = n
				}
			}
		}
	}
	res := scheduler.Schedule(scheduler.Input{Pools: sPools, Nodes: sNodes, Egresses: sEgs, BalanceFactor: in.Config.BalanceFactor})
	placed := make(map[string]scheduler.Placement, len(res.Placements))
	for _, p := range res.Placements {
		placed[p.Egress] = p
	}
	moveReason := make(map[string]string, len(res.Moves))
	for _, m := range res.Moves {
		moveReason[m.Egress] = m.Reason
	}

	// Which Nodes report each IP bound (alive agents only).
	holders := map[netip.Addr][]string{}
	for i := range in.Nodes {
		st := in.Agents(in.Nodes[i].Name)
		if !st.Known || st.Dead {
			continue
		}
		for _, b := range st.Report.Bound {
			holders[b.IP] = append(holders[b.IP], in.Nodes[i].Name)
		}
	}

	refused := refusalsOf(in.Nodes, in.Agents)
	owners := macOwners(in.Nodes, in.Agents)

	// Statuses.
	attach := map[string][]netip.Addr{}
	attachNode := map[string]string{}
	attachFrom := map[string]map[netip.Addr]string{}
	for i := range egs {
		e := &egs[i]
		// selectedPods and shadowedBy belong to the member publication
		// (MembersReconciler.writeSelected): kept as they are.
		st := v1.EgressStatus{Conditions: slices.Clone(e.Status.Conditions), SelectedPods: e.Status.SelectedPods, ShadowedBy: e.Status.ShadowedBy}
		ch := egressChange{}
		meta.SetStatusCondition(&st.Conditions, withGen(allocCond[i], e.Generation))
		if ips[i].IsValid() {
			st.EgressIP = ips[i].String()
		}
		p := placed[e.Name]
		cur := e.Status.EgressNode
		target := p.Node
		if target != "" && target != cur {
			ip := ips[i]
			expired := func(n string) bool { return in.releaseExpired(releaseKey{n, ip}) }
			if waitFor := releasePending(ip, target, cur, holders, in.Agents, expired); waitFor != "" {
				msg := fmt.Sprintf("moving to Node %s: waiting for Node %s to release %s", target, waitFor, st.EgressIP)
				if t := in.Config.ReleaseTimeout; t > 0 {
					msg += fmt.Sprintf(" (it is told to in every poll; after %v it counts as not releasing)", t)
				}
				meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1.ConditionAssigned, Status: metav1.ConditionFalse, Reason: ReasonWaitingForRelease,
					Message: msg, ObservedGeneration: e.Generation})
				target = ""
				out.Awaited = append(out.Awaited, waitFor)
				out.Waits = append(out.Waits, releaseKey{waitFor, ip})
				if cur != "" {
					ch.EventType, ch.EventReason, ch.EventNote = corev1.EventTypeNormal, "Releasing", fmt.Sprintf("releasing %s from Node %s before moving it to Node %s (%s)", st.EgressIP, cur, p.Node, cmp.Or(moveReason[e.Name], "rebalance"))
					ch.MoveReason = cmp.Or(moveReason[e.Name], "Release")
				}
			}
		}
		var cp *cloudPool
		if ps := pools[e.Spec.ExternalIPPool]; ps != nil {
			cp = ps.cloud
		}
		if cp != nil && target != "" {
			// On the target's interface and ours: nothing to attach. An
			// address there that is not ours (a Pod IP of the CNI, and in
			// OwnInterfaces mode anything on the primary interface) goes
			// through the attach and its look-up, which refuses it.
			if attached[ips[i]] == target && cp.ours[ips[i]] == target && (!cp.own || view.ifaceAt[ips[i]] != in.Cloud.Ifaces[target].ID) {
				st.InterfaceMAC = view.macAt[ips[i]]
			} else {
				msg := fmt.Sprintf("attaching %s to the network interface of Node %s through the cloud API", st.EgressIP, target)
				eni, ok := view.pick(target, cp)
				if !ok && cp.own {
					msg = fmt.Sprintf("waiting for an interface of the controller's own on Node %s to attach %s to (see the pool's condition %s)", target, st.EgressIP, v1.ConditionCloudInterfaces)
				}
				if le := in.Cloud.LastError[eni]; le != "" {
					msg += "; the last call on that interface failed: " + le
					ch.EventType, ch.EventReason, ch.EventNote = corev1.EventTypeWarning, "AttachFailed", msg
				}
				meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1.ConditionAssigned, Status: metav1.ConditionFalse, Reason: ReasonAttaching,
					Message: msg, ObservedGeneration: e.Generation})
				if ok {
					attach[eni] = append(attach[eni], ips[i])
					attachNode[eni] = target
					if from := holdingInterface(in.Cloud.Ifaces, ips[i]); cp.ours[ips[i]] != "" && from != "" && from != eni {
						if attachFrom[eni] == nil {
							attachFrom[eni] = map[netip.Addr]string{}
						}
						attachFrom[eni][ips[i]] = from
					}
				}
				target = ""
			}
		}
		st.EgressNode = target
		// lateNote: other alive Nodes still report the IP bound (a wait
		// that expired, or a Node back from the dead before its agent
		// resynced); timedOut: this pass assigns it because of an
		// expired wait.
		var lateNote string
		timedOut := false
		if target != "" {
			var others []string
			for _, h := range holders[ips[i]] {
				if h != target {
					others = append(others, h)
				}
			}
			if target != cur {
				late := lateHolders(ips[i], target, cur, holders, in.Agents, func(n string) bool { return in.releaseExpired(releaseKey{n, ips[i]}) })
				timedOut = len(late) > 0
				others = slices.Compact(slices.Sorted(slices.Values(append(others, late...))))
			}
			if len(others) > 0 {
				lateNote = fmt.Sprintf("; Node %s still reports it bound although every poll tells it to release it, so it counts as not releasing it, like a dead Node (--release-timeout %v)",
					strings.Join(others, ", "), in.Config.ReleaseTimeout)
			}
		}
		if cp != nil && target != "" {
			cp.bound[ips[i]] = true
		}
		if cp != nil && ips[i].IsValid() {
			out.Cloud.Allocations[e.Name] = ips[i]
		}
		switch {
		case conflict[i] != nil:
			msg := nodeConflictMessage(ips[i], *conflict[i], e.Spec.EgressIP != "")
			prev := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionAssigned)
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1.ConditionAssigned, Status: metav1.ConditionFalse, Reason: v1.ReasonNodeAddressConflict, Message: msg, ObservedGeneration: e.Generation})
			out.Unplaced[v1.ReasonNodeAddressConflict]++
			if cur != "" || prev == nil || prev.Reason != v1.ReasonNodeAddressConflict || prev.Message != msg {
				note := msg
				if cur != "" {
					note = fmt.Sprintf("%s removed from Node %s: %s; %s", st.EgressIP, cur, msg, failureEffect(e.Spec.FailurePolicy))
					ch.MoveReason = v1.ReasonNodeAddressConflict
				}
				ch.EventType, ch.EventReason, ch.EventNote = corev1.EventTypeWarning, v1.ReasonNodeAddressConflict, note
			}
		case target != "":
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1.ConditionAssigned, Status: metav1.ConditionTrue, Reason: ReasonScheduled,
				Message: fmt.Sprintf("%s is assigned to Node %s", st.EgressIP, target) + lateNote, ObservedGeneration: e.Generation})
			switch {
			case timedOut:
				ch.EventType, ch.EventReason, ch.EventNote = corev1.EventTypeWarning, v1.ReasonReleaseTimedOut, fmt.Sprintf("%s assigned to Node %s", st.EgressIP, target)+lateNote
				if cur != "" {
					ch.MoveReason = cmp.Or(moveReason[e.Name], "Rebalance")
				}
			case cur == "":
				ch.EventType, ch.EventReason, ch.EventNote = corev1.EventTypeNormal, "Assigned", fmt.Sprintf("%s assigned to Node %s", st.EgressIP, target)
			case cur != target:
				ch.EventType, ch.EventReason, ch.EventNote = corev1.EventTypeNormal, "Moved", fmt.Sprintf("%s moved from Node %s to Node %s (%s)", st.EgressIP, cur, target, cmp.Or(moveReason[e.Name], "rebalance"))
				ch.MoveReason = cmp.Or(moveReason[e.Name], "Rebalance")
			}
		case !isWaiting(st.Conditions) && !isAttaching(st.Conditions) || p.Node == "":
			reason, msg := ReasonNotAssigned, "waiting for an IP (see condition IPAllocated)"
			if ips[i].IsValid() {
				noNode := ""
				if pm, ok := poolNodes[e.Spec.ExternalIPPool]; ok && p.Reason == scheduler.ReasonNoEligibleNode {
					if nodeByName == nil {
						nodeByName = make(map[string]*scheduler.Node, len(sNodes))
						for i := range sNodes {
							nodeByName[sNodes[i].Name] = &sNodes[i]
						}
					}
					noNode = noNodeDetail(e.Spec.ExternalIPPool, pm.what, len(in.Nodes), pm.matching, nodeByName)
				}
				reason, msg = p.Reason, unplacedMessage(p, noNode)
			}
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1.ConditionAssigned, Status: metav1.ConditionFalse, Reason: reason, Message: msg, ObservedGeneration: e.Generation})
			out.Unplaced[reason]++
			if cur != "" {
				ch.EventType, ch.EventReason, ch.EventNote = corev1.EventTypeWarning, "Unassigned", fmt.Sprintf("%s removed from Node %s: %s; %s", st.EgressIP, cur, msg, failureEffect(e.Spec.FailurePolicy))
				ch.MoveReason = cmp.Or(moveReason[e.Name], reason)
			}
		}
		rc := readyCondition(e, st, in.Agents)
		rc.Message += noPodsNote(e)
		applyRefusal(e, refused[e.Name], &rc, &ch)
		if rc.Reason == ReasonBinding {
			out.Awaited = append(out.Awaited, st.EgressNode)
		}
		if prev := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionReady); rc.Reason == v1.ReasonBindRefused && ch.EventReason == "" &&
			(prev == nil || prev.Reason != v1.ReasonBindRefused || prev.Message != rc.Message) {
			ch.EventType, ch.EventReason, ch.EventNote = corev1.EventTypeWarning, v1.ReasonBindRefused, rc.Message
		}
		if heldNote[i] != "" && (ch.EventReason == "" || ch.EventType == corev1.EventTypeNormal) {
			// Says more than an Assigned or Moved Event would.
			ch.EventType, ch.EventReason, ch.EventNote = corev1.EventTypeWarning, v1.ReasonAddressHeld, heldNote[i]
		}
		if rejected[i] != "" && ch.EventReason == "" {
			ch.EventType, ch.EventReason, ch.EventNote = corev1.EventTypeWarning, v1.ReasonStatusIPRejected, rejected[i]
		}
		if prev := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionReady); rc.Reason == ReasonNoEgressNode && ch.EventReason == "" &&
			(prev == nil || prev.Reason != ReasonNoEgressNode || prev.Message != rc.Message) {
			ch.EventType, ch.EventReason, ch.EventNote = corev1.EventTypeWarning, ReasonNoEgressNode, rc.Message
		}
		meta.SetStatusCondition(&st.Conditions, rc)
		if applyConflict(e, &st, &ch, in.Agents, owners) {
			out.Conflicts++
		}
		if err := selectorError(e); err != nil {
			msg := "spec.appliedTo selects no Pod: " + err.Error()
			if prev := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionSelectorValid); prev == nil || prev.Message != msg {
				ch.SelectorEvent = msg
			}
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1.ConditionSelectorValid, Status: metav1.ConditionFalse,
				Reason: ReasonInvalidSelector, Message: msg, ObservedGeneration: e.Generation})
		} else {
			meta.RemoveStatusCondition(&st.Conditions, v1.ConditionSelectorValid)
		}
		ch.Status = st
		ch.IPChangedNote = ipChangedNote(e, st)
		out.Egresses[e.Name] = ch
	}
	setSharedWith(out.Egresses)

	if out.Cloud != nil {
		for ifc, ipl := range attach {
			if in.Cloud.Blocked[ifc] {
				continue
			}
			slices.SortFunc(ipl, func(a, b netip.Addr) int { return a.Compare(b) })
			out.Cloud.Attach = append(out.Cloud.Attach, cloudOp{Node: attachNode[ifc], InterfaceID: ifc, IPs: slices.Compact(ipl), From: attachFrom[ifc]})
		}
		slices.SortFunc(out.Cloud.Attach, func(a, b cloudOp) int { return cmp.Compare(a.Node, b.Node) })
		attaching := map[string]int{}
		for ifc, ipl := range attach {
			attaching[attachNode[ifc]] += len(ipl)
		}
		for _, p := range in.Pools {
			ps := pools[p.Name]
			if ps.cloud == nil {
				continue
			}
			out.Cloud.Pools[p.Name] = planCloudPool(&p, ps.cloud, ps.pool, sPoolNodes(sPools, p.Name), in.Cloud, view, attached, sNodes, flagCapacity, attaching, func(ip netip.Addr) bool { return ownedByAny(cloudPools, ip) })
			for _, ip := range out.Cloud.Pools[p.Name].HeldInRange {
				out.Cloud.HeldWanted[ip] = true
			}
			if p.Spec.Cloud.AWS != nil && p.Spec.Cloud.AWS.ElasticIPs != nil && p.DeletionTimestamp == nil {
				var wants []eipWant
				for i := range egs {
					if egs[i].Spec.ExternalIPPool != p.Name || !ips[i].IsValid() {
						continue
					}
					w := eipWant{Egress: egs[i].Name, IP: ips[i]}
					if st := out.Egresses[egs[i].Name].Status; st.EgressNode != "" && st.InterfaceMAC != "" {
						w.Interface = holdingInterface(in.Cloud.Ifaces, ips[i])
					}
					wants = append(wants, w)
				}
				if _, read := in.Cloud.EIPs[p.Name]; !read {
					out.Cloud.ReadEIPs = true // a new pool: read its Elastic IPs now, not at the next refresh
				}
				ep := planElasticIPs(in.Cloud.EIPs[p.Name], wants, func(ip netip.Addr) bool { return ownedByAny(cloudPools, ip) },
					func(alloc string) bool { return in.Cloud.Blocked["eip/"+alloc] })
				for _, op := range ep.Ops {
					op.Pool = p.Name
					out.Cloud.EIPOps = append(out.Cloud.EIPOps, op)
				}
				for name, pub := range ep.Public {
					ch := out.Egresses[name]
					ch.Status.PublicIP = pub.String()
					out.Egresses[name] = ch
				}
				ep.Cond.ObservedGeneration = p.Generation
				out.Cloud.Pools[p.Name].EIPCond = &ep.Cond
			}
			out.Cloud.Recheck = minPositive(out.Cloud.Recheck, out.Cloud.Pools[p.Name].Plan.Recheck)
			out.Cloud.DeleteENIs = append(out.Cloud.DeleteENIs, out.Cloud.Pools[p.Name].Deletes...)
		}
		out.Cloud.CreateENIs = view.eniCreates()
		out.Cloud.LateFacts = lateFacts(in.Nodes, in.Cloud)
		for _, p := range in.Pools {
			if in.Cloud.Manage && ownInterfaces(p.Spec.Cloud) {
				sn := p.Spec.Cloud.AWS.SubnetID
				if _, ok := in.Cloud.Subnets[sn]; !ok && in.Cloud.SubnetErr[sn] == "" {
					out.Cloud.Reread = true
				}
			}
		}
		poolNames, nodeNames := map[string]bool{}, map[string]bool{}
		for _, p := range in.Pools {
			if ownInterfaces(p.Spec.Cloud) && p.Spec.Cloud.AWS.SubnetID != "" {
				poolNames[p.Name] = true
			}
		}
		for i := range in.Nodes {
			nodeNames[in.Nodes[i].Name] = true
		}
		held := map[netip.Addr]bool{}
		for i := range egs {
			if ip, err := netip.ParseAddr(egs[i].Status.EgressIP); err == nil {
				held[ip] = true
			}
		}
		out.Cloud.DeleteENIs = append(out.Cloud.DeleteENIs, collect(in.Cloud, poolNames, nodeNames, func(ip netip.Addr) bool { return held[ip] })...)
	}

	// Pool statuses and deletion protection.
	users := map[string][]string{}
	for i := range egs {
		users[egs[i].Spec.ExternalIPPool] = append(users[egs[i].Spec.ExternalIPPool], egs[i].Name)
	}
	out.Finalize = map[string]bool{}
	for _, p := range in.Pools {
		ps := pools[p.Name]
		st := v1.ExternalIPPoolStatus{Conditions: slices.Clone(p.Status.Conditions)}
		deleting := p.DeletionTimestamp != nil
		out.Finalize[p.Name] = !deleting || len(users[p.Name]) > 0 || (out.Cloud != nil && out.Cloud.Pools[p.Name] != nil && out.Cloud.Pools[p.Name].Busy)
		if deleting && len(users[p.Name]) > 0 {
			held := slices.Sorted(slices.Values(users[p.Name]))
			if len(held) > 10 {
				held = append(held[:10], fmt.Sprintf("and %d more", len(users[p.Name])-10))
			}
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonInUse,
				Message: fmt.Sprintf("deletion waits: Egresses %s still use this pool; delete them or point them at another pool", strings.Join(held, ", ")), ObservedGeneration: p.Generation})
			if ps.err == nil && ps.alloc != nil && ps.cloud == nil {
				st.Usage = v1.IPPoolUsage{Total: saturate(ps.alloc.Total()), TotalText: ps.alloc.TotalText(), Used: saturate(ps.alloc.Used())}
			}
			if ps.cloud != nil {
				cs := out.Cloud.Pools[p.Name].Status
				st.Cloud = &cs
				if c := out.Cloud.Pools[p.Name].Interfaces; c != nil {
					meta.SetStatusCondition(&st.Conditions, *c)
				}
			}
			out.Pools[p.Name] = st
			continue
		}
		if deleting && out.Finalize[p.Name] {
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonInUse,
				Message: "deletion waits: the controller is releasing the pool's cloud addresses and deleting its network interfaces", ObservedGeneration: p.Generation})
			if co := out.Cloud.Pools[p.Name]; co != nil {
				cs := co.Status
				st.Cloud = &cs
				if co.Interfaces != nil {
					meta.SetStatusCondition(&st.Conditions, *co.Interfaces)
				}
			}
			out.Pools[p.Name] = st
			continue
		}
		if ps.err != nil {
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: ReasonInvalid, Message: ps.err.Error(), ObservedGeneration: p.Generation})
		} else {
			if ps.cloud != nil {
				co := out.Cloud.Pools[p.Name]
				cs := co.Status
				st.Cloud = &cs
				if co.Interfaces != nil {
					meta.SetStatusCondition(&st.Conditions, *co.Interfaces)
				}
				st.Usage = v1.IPPoolUsage{Total: int64(cs.Attached), TotalText: strconv.Itoa(int(cs.Attached)), Used: int64(cs.Allocated)}
				if ps.alloc != nil {
					st.Usage.Total, st.Usage.TotalText = saturate(ps.alloc.Total()), ps.alloc.TotalText()
				}
			} else {
				st.Usage = v1.IPPoolUsage{Total: saturate(ps.alloc.Total()), TotalText: ps.alloc.TotalText(), Used: saturate(ps.alloc.Used())}
			}
			if ps.pool != nil && ps.cloud == nil {
				st.Excluded = excludedStatus(ps.pool, nodeIdx, ps.nodeIPs)
			}
			msg := fmt.Sprintf("%d of %s IPs used", st.Usage.Used, st.Usage.TotalText) + excludedSummary(st.Excluded)
			if ps.cloud != nil {
				msg += heldSummary(out.Cloud.Pools[p.Name].HeldInRange, in.Cloud.Held)
				if c := out.Cloud.Pools[p.Name].EIPCond; c != nil {
					meta.SetStatusCondition(&st.Conditions, *c)
				} else {
					meta.RemoveStatusCondition(&st.Conditions, v1.ConditionElasticIPs)
				}
			}
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: ReasonValid,
				Message: msg, ObservedGeneration: p.Generation})
		}
		out.Pools[p.Name] = st
	}
	return out
}

// selectorError is the error parsing e's appliedTo selectors would give
// the member publication and the agents (metav1.LabelSelectorAsSelector),
// or nil.
func selectorError(e *v1.Egress) error {
	for _, s := range []struct {
		name string
		sel  *metav1.LabelSelector
	}{{"namespaceSelector", e.Spec.AppliedTo.NamespaceSelector}, {"podSelector", e.Spec.AppliedTo.PodSelector}} {
		if s.sel == nil {
			continue
		}
		if _, err := metav1.LabelSelectorAsSelector(s.sel); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return nil
}

// statusKeepers says, for each address that the statuses of two or more
// Egresses without spec.egressIP hold, which of them keeps it (its index
// in egs): the one whose traffic already uses it. That is, in order: the
// one Ready on it, the one assigned to a Node, the one whose IPAllocated
// condition became true first, then the older (olderFirst). The others
// get a new address, so the source address of an Egress in use never
// changes because another claims it (issue 23). Addresses held once are
// not in the map.
func statusKeepers(egs []v1.Egress) map[netip.Addr]int {
	byIP := map[netip.Addr][]int{}
	for i := range egs {
		if egs[i].Spec.EgressIP != "" {
			continue
		}
		if ip, err := netip.ParseAddr(egs[i].Status.EgressIP); err == nil {
			byIP[ip] = append(byIP[ip], i)
		}
	}
	keeper := map[netip.Addr]int{}
	for ip, claim := range byIP {
		if len(claim) < 2 {
			continue
		}
		keeper[ip] = slices.MinFunc(claim, func(a, b int) int { return inUseFirst(&egs[a], &egs[b]) })
	}
	return keeper
}

// inUseFirst orders two Egresses claiming one address: Ready before not,
// assigned before not, allocated earlier before later, then olderFirst.
func inUseFirst(a, b *v1.Egress) int {
	for _, t := range []string{v1.ConditionReady, v1.ConditionAssigned} {
		ta, tb := meta.IsStatusConditionTrue(a.Status.Conditions, t), meta.IsStatusConditionTrue(b.Status.Conditions, t)
		if ta != tb {
			if ta {
				return -1
			}
			return 1
		}
	}
	since := func(e *v1.Egress) metav1.Time {
		if c := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionIPAllocated); c != nil && c.Status == metav1.ConditionTrue {
			return c.LastTransitionTime
		}
		return metav1.Time{}
	}
	sa, sb := since(a), since(b)
	switch {
	case !sa.IsZero() && !sb.IsZero() && !sa.Equal(&sb):
		return sa.Compare(sb.Time)
	case sa.IsZero() != sb.IsZero():
		if !sa.IsZero() {
			return -1
		}
		return 1
	}
	return olderFirst(&a.ObjectMeta, &b.ObjectMeta)
}

// olderFirst orders objects by creationTimestamp, then name: the priority
// order of the scheduling pass (DESIGN.md).
func olderFirst(a, b *metav1.ObjectMeta) int {
	if c := a.CreationTimestamp.Compare(b.CreationTimestamp.Time); c != 0 {
		return c
	}
	return cmp.Compare(a.Name, b.Name)
}

// releasePending returns the Node that must release ip before it may be
// bound on target, or "". A Node must release when its alive agent reports
// ip bound, or when it is the current Node and its agent has not answered
// yet (it may hold ip). A dead agent's Node is not waited for: that is the
// failover case; nor is a Node whose wait for ip has expired
// (PassConfig.ReleaseTimeout): it counts as not releasing ip.
func releasePending(ip netip.Addr, target, cur string, holders map[netip.Addr][]string, agents func(string) AgentState, expired func(node string) bool) string {
	for _, h := range holders[ip] {
		if h != target && !expired(h) {
			return h
		}
	}
	if cur != "" && cur != target && !expired(cur) {
		if st := agents(cur); !st.Known && !st.Dead {
			return cur
		}
	}
	return ""
}

// lateHolders lists, sorted, the Nodes other than target that releasePending
// no longer waits for although they may still hold ip: their wait expired
// (expired) while they report ip bound, or, for cur, while its agent has
// not answered.
func lateHolders(ip netip.Addr, target, cur string, holders map[netip.Addr][]string, agents func(string) AgentState, expired func(node string) bool) []string {
	var late []string
	for _, h := range holders[ip] {
		if h != target && expired(h) {
			late = append(late, h)
		}
	}
	if cur != "" && cur != target && expired(cur) && !slices.Contains(late, cur) {
		if st := agents(cur); !st.Known && !st.Dead {
			late = append(late, cur)
		}
	}
	slices.Sort(late)
	return late
}

func isAttaching(cs []metav1.Condition) bool {
	c := meta.FindStatusCondition(cs, v1.ConditionAssigned)
	return c != nil && c.Reason == ReasonAttaching
}

func isWaiting(cs []metav1.Condition) bool {
	c := meta.FindStatusCondition(cs, v1.ConditionAssigned)
	return c != nil && c.Reason == ReasonWaitingForRelease
}

// readyCondition says whether the egress Node's agent reports the IP bound
// and announced. Until the controller has heard from that agent (just after
// a controller restart) it keeps the previous Ready condition.
func readyCondition(e *v1.Egress, st v1.EgressStatus, agents func(string) AgentState) metav1.Condition {
	c := metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionFalse, ObservedGeneration: e.Generation}
	if st.EgressNode == "" {
		c.Reason, c.Message = ReasonNoEgressNode, "no Node holds the egress IP (see condition Assigned); "+failureEffect(e.Spec.FailurePolicy)
		return c
	}
	a := agents(st.EgressNode)
	if !a.Known && !a.Dead && st.EgressNode == e.Status.EgressNode && st.EgressIP == e.Status.EgressIP {
		if prev := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionReady); prev != nil {
			p := *prev
			p.ObservedGeneration = e.Generation
			return p
		}
	}
	ip, _ := netip.ParseAddr(st.EgressIP)
	if b, ok := a.Report.Lookup(ip); ok && a.Known && !a.Dead && b.Announced {
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, ReasonAnnounced, fmt.Sprintf("%s is bound on %s of Node %s and announced", st.EgressIP, b.Interface, st.EgressNode)
		return c
	}
	if r, ok := a.Report.LookupRefused(ip); ok && a.Known && !a.Dead && st.EgressIP == e.Status.EgressIP && st.EgressNode == e.Status.EgressNode {
		// Only for the assignment the agent has seen: a new one gets its
		// own answer.
		c.Reason, c.Message = v1.ReasonBindRefused, fmt.Sprintf("the agent on Node %s does not bind %s: %s", st.EgressNode, st.EgressIP, r.Message)
		return c
	}
	c.Reason, c.Message = ReasonBinding, fmt.Sprintf("waiting for the agent on Node %s to bind and announce %s", st.EgressNode, st.EgressIP)
	if o := a.Report.Ownership; a.Known && !a.Dead && o != nil && !o.Healthy {
		// The agent binds nothing new while it cannot keep ownership
		// (internal/agent/bind): say why, as the Node condition does.
		c.Message += fmt.Sprintf("; its agent reports an ownership problem that keeps it from adding addresses (Node condition EgressIPOwnershipKnown, %s): %s", o.Reason, o.Message)
	}
	return c
}

// failureEffect says what the selected Pods get while the Egress has no
// Node, per spec.failurePolicy (empty, from an API server that did not
// apply the default, means Fail).
func failureEffect(p v1.FailurePolicy) string {
	if p == v1.FailurePolicyIgnore {
		return "failurePolicy Ignore: the selected Pods' external traffic leaves with their Node's IP"
	}
	return "failurePolicy Fail: the selected Pods' external traffic is rejected"
}

// poolMatch is what a pool asks of Nodes (for messages) and the Nodes
// that match it.
type poolMatch struct {
	what     string
	matching []string
}

// noNodeDetail says why no Node of pool can hold an IP: how many of the
// total Nodes match what the pool asks of them (what: "the nodeSelector",
// plus the subnet for cloud pools), and for those that match, why each is
// not eligible (ineligibleReason) or has capacity 0. It returns "" when
// every matching Node could hold one (the caller then says less).
func noNodeDetail(pool, what string, total int, matching []string, nodes map[string]*scheduler.Node) string {
	if len(matching) == 0 {
		return fmt.Sprintf("none of the %d Nodes matches %s of pool %q", total, what, pool)
	}
	why := map[string]int{}
	for _, name := range matching {
		n := nodes[name]
		switch {
		case n == nil:
		case !n.Eligible:
			why[n.Reason]++
		case n.Capacity == 0:
			why["capacity 0"]++
		}
	}
	parts := make([]string, 0, len(why))
	for _, r := range slices.Sorted(maps.Keys(why)) {
		parts = append(parts, fmt.Sprintf("%d %s", why[r], r))
	}
	if len(parts) == 0 {
		return ""
	}
	return fmt.Sprintf("%d of %d Nodes match %s of pool %q, none can hold an IP: %s", len(matching), total, what, pool, strings.Join(parts, ", "))
}

// unplacedMessage is the Assigned condition's message for an unplaced
// Egress; noNode is its pool's noNodeDetail.
func unplacedMessage(p scheduler.Placement, noNode string) string {
	switch p.Reason {
	case scheduler.ReasonNoEligibleNode:
		if noNode != "" {
			return "no eligible Node (a Ready, uncordoned Linux Node with a live agent, capacity above 0, matching the pool's nodeSelector): " + noNode
		}
		return "no eligible Node: no Ready Linux Node with a live agent matches the pool's nodeSelector" + detail(p.Message)
	case scheduler.ReasonCapacityExhausted:
		return "all eligible Nodes are full (egressip.io/max-egress-ips); raise capacity or add Nodes" + detail(p.Message)
	}
	return cmp.Or(p.Message, p.Reason)
}

func detail(m string) string {
	if m == "" {
		return ""
	}
	return " (" + strings.TrimSpace(m) + ")"
}

// ineligibleReason returns why n cannot hold egress IPs, or "" if it can.
func ineligibleReason(n *corev1.Node, agent AgentState) string {
	switch {
	case n.DeletionTimestamp != nil:
		return NodeDeleting
	case !conditionTrue(n, corev1.NodeReady):
		return NodeNotReady
	case conditionTrue(n, corev1.NodeNetworkUnavailable):
		return NodeNetworkUnavailable
	case n.Labels[corev1.LabelOSStable] != "" && n.Labels[corev1.LabelOSStable] != "linux":
		return NodeNotLinux
	case agent.Dead:
		return NodeAgentDead
	case n.Spec.Unschedulable:
		return NodeCordoned
	}
	return ""
}

func conditionTrue(n *corev1.Node, t corev1.NodeConditionType) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == t {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// allocatedCond is the IPAllocated condition of an Egress.
func allocatedCond(ok bool, reason, msg string) metav1.Condition {
	s := metav1.ConditionFalse
	if ok {
		s = metav1.ConditionTrue
	}
	return metav1.Condition{Type: v1.ConditionIPAllocated, Status: s, Reason: reason, Message: msg}
}

func withGen(c metav1.Condition, gen int64) metav1.Condition {
	c.ObservedGeneration = gen
	return c
}

func saturate(u uint64) int64 {
	if u > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(u)
}
