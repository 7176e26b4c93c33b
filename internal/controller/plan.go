package controller

import (
	"cmp"
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
	"k8s.io/apimachinery/pkg/api/validate/content"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/scheduler"
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
	// AcquireTimeout bounds how long a pass holds back the move of an
	// Egress off a dead Node while the new Node binds its address on the
	// poll's instruction (acquireHolds), so that the move and Ready are
	// one patch. 0 holds nothing (the move is written at once, Ready
	// later); egressip-controller sets --acquire-timeout (default
	// DefaultAcquireTimeout).
	AcquireTimeout time.Duration
}

// DefaultReleaseTimeout is the default of --release-timeout: as long as a
// crashed Node's IPs take to move (--agent-dead-after), so that a Node
// that answers polls but does not release is never waited for longer than
// a dead one.
const DefaultReleaseTimeout = DefaultDeadAfter

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
	// Selectors remembers selectorError across passes (nil: parse every
	// Egress's selectors in every pass); the caller ends its pass
	// (selectorMemo.endPass) after plan.
	Selectors *selectorMemo
	// Memo remembers Egress statuses across passes (egressMemo; nil:
	// compute every Egress's status, the reference); the caller ends
	// its pass (egressMemo.endPass) after plan and the status diff.
	Memo *egressMemo
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
	// (v1.ReasonInvalidSelector): the Egress's selectors became unparsable.
	SelectorEvent string
	// IPChangedNote, when set, is the note of the EgressIPChanged Warning
	// Event: status.egressIP changes from one address to another.
	IPChangedNote string
	// ConflictEvent, when set, is the note of a Warning Event
	// (v1.ReasonDuplicateIP): another host answers for the Egress's IP.
	ConflictEvent string

	// memo is the memo entry this change was computed for or replayed
	// from (nil without one): statusEqualToRead asks it how the status
	// compares with the one read.
	memo *memoEntry
}

// passOutput is what a pass decides.
type passOutput struct {
	Egresses map[string]egressChange
	Pools    map[string]v1.ExternalIPPoolStatus
	// InvalidCapacity lists Nodes whose capacity annotation is invalid, with
	// the parse error.
	InvalidCapacity map[string]error
	// Unplaced counts Egresses without a Node, by reason: the Assigned
	// condition's, or for an Egress without an address the IPAllocated
	// condition's (PoolExhausted, PoolNotFound, ...).
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

// selectorError is the error parsing e's appliedTo selectors would give
// the member publication and the agents (metav1.LabelSelectorAsSelector),
// or nil.
func selectorError(e *v1.Egress) error {
	for _, s := range []struct {
		name string
		sel  *metav1.LabelSelector
	}{{"namespaceSelector", e.Spec.AppliedTo.NamespaceSelector}, {"podSelector", e.Spec.AppliedTo.PodSelector}} {
		if s.sel == nil || matchLabelsValid(s.sel) {
			continue
		}
		if _, err := metav1.LabelSelectorAsSelector(s.sel); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	return nil
}

// matchLabelsValid reports whether sel has only matchLabels, every one
// valid: then metav1.LabelSelectorAsSelector accepts it, and it is
// checked with the same two functions LabelSelectorAsSelector's
// labels.NewRequirement applies to an equality requirement (the key's and
// the value's syntax), without building the selector and the field paths
// of its errors (most of a cold pass's allocations for the selectors).
// false means "ask LabelSelectorAsSelector", which also gives the error.
func matchLabelsValid(sel *metav1.LabelSelector) bool {
	if len(sel.MatchExpressions) > 0 {
		return false
	}
	for k, v := range sel.MatchLabels {
		if len(content.IsLabelKey(k)) > 0 || len(validation.IsValidLabelValue(v)) > 0 {
			return false
		}
	}
	return true
}

// statusKeepers says, for each address that the statuses of two or more
// Egresses without spec.egressIP hold, which of them keeps it (its index
// in egs): the one whose traffic already uses it. That is, in order: the
// one Ready on it, the one assigned to a Node, the one whose IPAllocated
// condition became true first, then the older (olderFirst). The others
// get a new address, so the source address of an Egress in use never
// changes because another claims it (issue 23). Addresses held once are
// not in the map.
func statusKeepers(egs []*v1.Egress) map[netip.Addr]int {
	// first is the first claimant of each address; more lists the
	// claimants, in index order, of the addresses claimed twice or more
	// (rare: no slice per address).
	first := make(map[netip.Addr]int, len(egs))
	var more map[netip.Addr][]int
	for i := range egs {
		if egs[i].Spec.EgressIP != "" {
			continue
		}
		ip, err := netip.ParseAddr(egs[i].Status.EgressIP)
		if err != nil {
			continue
		}
		f, ok := first[ip]
		if !ok {
			first[ip] = i
			continue
		}
		if more == nil {
			more = map[netip.Addr][]int{}
		}
		if more[ip] == nil {
			more[ip] = []int{f}
		}
		more[ip] = append(more[ip], i)
	}
	keeper := map[netip.Addr]int{}
	for ip, claim := range more {
		keeper[ip] = slices.MinFunc(claim, func(a, b int) int { return inUseFirst(egs[a], egs[b]) })
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
	return c != nil && c.Reason == v1.ReasonAttaching
}

func isWaiting(cs []metav1.Condition) bool {
	c := meta.FindStatusCondition(cs, v1.ConditionAssigned)
	return c != nil && c.Reason == v1.ReasonWaitingForRelease
}

// readyCondition says whether the egress Node's agent reports the IP bound
// and announced. Until the controller has heard from that agent (just after
// a controller restart) it keeps the previous Ready condition.
func readyCondition(e *v1.Egress, st v1.EgressStatus, agents func(string) AgentState) metav1.Condition {
	c := metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionFalse, ObservedGeneration: e.Generation}
	if st.EgressNode == "" {
		c.Reason, c.Message = v1.ReasonNoEgressNode, "no Node holds the egress IP (see condition Assigned); "+failureEffectOf(e)
		if a := meta.FindStatusCondition(st.Conditions, v1.ConditionIPAllocated); st.EgressIP == "" && a != nil && a.Status != metav1.ConditionTrue {
			// Say why at once rather than send the reader through
			// Assigned to IPAllocated.
			c.Message = fmt.Sprintf("no egress IP is allocated (IPAllocated %s: %s); %s", a.Reason, a.Message, failureEffectOf(e))
		}
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
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, v1.ReasonAnnounced, st.EgressIP+" is bound on "+b.Interface+" of Node "+st.EgressNode+" and announced"
		return c
	}
	if r, ok := a.Report.LookupRefused(ip); ok && a.Known && !a.Dead && st.EgressIP == e.Status.EgressIP && st.EgressNode == e.Status.EgressNode {
		// Only for the assignment the agent has seen: a new one gets its
		// own answer.
		c.Reason, c.Message = v1.ReasonBindRefused, fmt.Sprintf("the agent on Node %s does not bind %s: %s", st.EgressNode, st.EgressIP, r.Message)
		return c
	}
	c.Reason, c.Message = v1.ReasonBinding, "waiting for the agent on Node "+st.EgressNode+" to bind and announce "+st.EgressIP
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
	case v1.ReasonNoEligibleNode:
		if noNode != "" {
			return "no eligible Node (a Ready, uncordoned Linux Node with a live agent, capacity above 0, matching the pool's nodeSelector): " + noNode
		}
		return "no eligible Node: no Ready Linux Node with a live agent matches the pool's nodeSelector" + detail(p.Message)
	case v1.ReasonCapacityExhausted:
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
		return v1.IneligibleDeleting
	case !conditionTrue(n, corev1.NodeReady):
		return v1.IneligibleNotReady
	case conditionTrue(n, corev1.NodeNetworkUnavailable):
		return v1.IneligibleNetworkUnavailable
	case n.Labels[corev1.LabelOSStable] != "" && n.Labels[corev1.LabelOSStable] != "linux":
		return v1.IneligibleNotLinux
	case agent.Dead:
		return v1.IneligibleAgentDead
	case n.Spec.Unschedulable:
		return v1.IneligibleCordoned
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

// allocatedMsg is the IPAllocated message of an Egress given ip from pool:
// "<ip> allocated from ExternalIPPool <pool, quoted as by %q>". It is
// fmt.Sprintf("%s allocated from ExternalIPPool %q", ip, pool) in one
// allocation instead of four (every Egress, every pass: a fifth of a warm
// pass's allocations, BenchmarkPass); TestAllocatedMsg holds it to that.
func allocatedMsg(ip netip.Addr, pool string) string {
	const mid = " allocated from ExternalIPPool "
	b := make([]byte, 0, 40+len(mid)+len(pool)+2)
	b = ip.AppendTo(b)
	b = append(b, mid...)
	b = strconv.AppendQuote(b, pool)
	return string(b)
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
