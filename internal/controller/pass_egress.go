package controller

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/scheduler"
)

// egressStatus is one Egress's status and change while the Egress status
// phase builds them.
type egressStatus struct {
	// i indexes pass.egs; e is that Egress.
	i  int
	e  *v1.Egress
	st v1.EgressStatus
	ch egressChange
}

// egressStatuses is the Egress status phase: for each Egress, in
// allocation order, its conditions IPAllocated, Assigned, Ready,
// Conflict and SelectorValid, the Node its status names, and the Event
// to record; then which Egresses share an address.
func (p *pass) egressStatuses() {
	for i := range p.egs {
		if p.isMulti(i) {
			es := p.multiStatus(i)
			es.ch.Status = es.st
			p.out.Egresses[es.e.Name] = es.ch
			continue
		}
		key, memo := memoKey{}, false
		if p.in.Memo != nil {
			key, memo = p.memoKeyOf(i)
		}
		if memo {
			if en := p.in.Memo.lookup(p, i, &key); en != nil {
				p.replay(i, en)
				continue
			}
		}
		awaited, conflicts := len(p.out.Awaited), p.out.Conflicts
		es := p.egressStatus(i)
		es.ch.Status = es.st
		es.ch.IPChangedNote = ipChangedNote(es.e, es.st)
		if memo {
			es.ch = p.in.Memo.store(p, i, &key, es.ch, p.out.Awaited[awaited:], p.out.Conflicts > conflicts).ch
		}
		p.out.Egresses[es.e.Name] = es.ch
	}
	setSharedWith(p.out.Egresses)
}

// replay puts the change a memo entry remembers for Egress i into the
// output, with its effects, as egressStatus would have computed them.
func (p *pass) replay(i int, en *memoEntry) {
	p.out.Awaited = append(p.out.Awaited, en.awaited...)
	if en.conflict {
		p.out.Conflicts++
	}
	p.out.Egresses[p.egs[i].Name] = en.ch
}

// kindOf is the poolKind of Egress i's pool (l2Pool when the pool does
// not exist).
func (p *pass) kindOf(i int) poolKind {
	if ps := p.pools[p.egs[i].Spec.ExternalIPPool]; ps != nil {
		return ps.kind
	}
	return l2Pool{}
}

// egressStatus decides Egress i's status.
func (p *pass) egressStatus(i int) *egressStatus {
	e := p.egs[i]
	// selectedPods and shadowedBy are the member publication's counts
	// (PassReconciler.Selected, already in e): kept as they are.
	es := &egressStatus{i: i, e: e, st: v1.EgressStatus{Conditions: slices.Clone(e.Status.Conditions), SelectedPods: e.Status.SelectedPods, ShadowedBy: e.Status.ShadowedBy}}
	meta.SetStatusCondition(&es.st.Conditions, withGen(p.alloc[i].cond, e.Generation))
	if ip := p.alloc[i].ip; ip.IsValid() {
		es.st.EgressIP = ip.String()
	}
	pl := p.sched.placed[e.Name]
	target := p.waitForRelease(es, pl.Node)
	target = p.kindOf(i).assign(p, i, target, es)
	es.st.EgressNode = target
	p.assignedCondition(es, pl, target)
	p.readyCondition(es)
	if applyConflict(e, &es.st, &es.ch, p.in.Agents, p.sched.owners) {
		p.out.Conflicts++
	}
	selectorCondition(es, p.in.Selectors.err(e))
	shadowedCondition(es)
	return es
}

// waitForRelease returns the Node Egress es may be assigned to now:
// target, the scheduler's choice, unless the address moves there and
// another Node must release it first (releasePending); the Assigned
// condition then says WaitingForRelease and the pass awaits that Node.
func (p *pass) waitForRelease(es *egressStatus, target string) string {
	e, cur := es.e, es.e.Status.EgressNode
	if target == "" || target == cur {
		return target
	}
	ip := p.alloc[es.i].ip
	expired := func(n string) bool { return p.in.releaseExpired(releaseKey{n, ip}) }
	waitFor := releasePending(ip, target, cur, p.sched.holders, p.in.Agents, expired)
	if waitFor == "" {
		return target
	}
	msg := fmt.Sprintf("moving to Node %s: waiting for Node %s to release %s", target, waitFor, es.st.EgressIP)
	if t := p.in.Config.ReleaseTimeout; t > 0 {
		msg += fmt.Sprintf(" (it is told to in every poll; after %v it counts as not releasing)", t)
	}
	meta.SetStatusCondition(&es.st.Conditions, metav1.Condition{Type: v1.ConditionAssigned, Status: metav1.ConditionFalse, Reason: v1.ReasonWaitingForRelease,
		Message: msg, ObservedGeneration: e.Generation})
	p.out.Awaited = append(p.out.Awaited, waitFor)
	p.out.Waits = append(p.out.Waits, releaseKey{waitFor, ip})
	if cur != "" {
		mr := p.sched.moveReason[e.Name]
		es.ch.EventType, es.ch.EventReason, es.ch.EventNote = corev1.EventTypeNormal, v1.EventReleasing, fmt.Sprintf("releasing %s from Node %s before moving it to Node %s (%s)", es.st.EgressIP, cur, target, cmp.Or(mr, "rebalance"))
		es.ch.MoveReason = cmp.Or(mr, "Release")
	}
	return ""
}

// lateNote says which other alive Nodes still report Egress i's address
// bound on target (a wait that expired, or a Node back from the dead
// before its agent resynced), or ""; timedOut is set when this pass
// assigns it because of an expired wait.
func (p *pass) lateNote(i int, target, cur string) (note string, timedOut bool) {
	ip := p.alloc[i].ip
	var others []string
	for _, h := range p.sched.holders[ip] {
		if h != target {
			others = append(others, h)
		}
	}
	if target != cur {
		late := lateHolders(ip, target, cur, p.sched.holders, p.in.Agents, func(n string) bool { return p.in.releaseExpired(releaseKey{n, ip}) })
		timedOut = len(late) > 0
		others = slices.Compact(slices.Sorted(slices.Values(append(others, late...))))
	}
	if len(others) > 0 {
		note = fmt.Sprintf("; Node %s still reports it bound although every poll tells it to release it, so it counts as not releasing it, like a dead Node (--release-timeout %v)",
			strings.Join(others, ", "), p.in.Config.ReleaseTimeout)
	}
	return note, timedOut
}

// assignedCondition sets the Assigned condition, the Event and the move
// reason of Egress es, whose status names target (pl is its placement):
// NodeAddressConflict, Scheduled, or why it has no Node. A condition the
// release wait or the cloud attach set stays.
func (p *pass) assignedCondition(es *egressStatus, pl scheduler.Placement, target string) {
	e, cur := es.e, es.e.Status.EgressNode
	switch {
	case p.alloc[es.i].conflict != nil:
		p.nodeConflict(es)
	case target != "":
		p.scheduled(es, target)
	case !isWaiting(es.st.Conditions) && !isAttaching(es.st.Conditions) || pl.Node == "":
		// An Egress without an address counts under its IPAllocated
		// reason (PoolExhausted, ...): that says why it has no Node.
		reason, msg, counted := v1.ReasonNotAssigned, "waiting for an IP (see condition IPAllocated)", p.alloc[es.i].cond.Reason
		if p.alloc[es.i].ip.IsValid() {
			reason, msg = pl.Reason, unplacedMessage(pl, p.noNodeDetail(e.Spec.ExternalIPPool, pl))
			counted = reason
		}
		meta.SetStatusCondition(&es.st.Conditions, metav1.Condition{Type: v1.ConditionAssigned, Status: metav1.ConditionFalse, Reason: reason, Message: msg, ObservedGeneration: e.Generation})
		p.out.Unplaced[counted]++
		if cur != "" {
			es.ch.EventType, es.ch.EventReason, es.ch.EventNote = corev1.EventTypeWarning, v1.EventUnassigned, fmt.Sprintf("%s removed from Node %s: %s; %s", es.st.EgressIP, cur, msg, failureEffectOf(e))
			es.ch.MoveReason = cmp.Or(p.sched.moveReason[e.Name], reason)
		}
	}
}

// nodeConflict: Egress es's address is a Node's; the Node wins.
func (p *pass) nodeConflict(es *egressStatus) {
	e, cur := es.e, es.e.Status.EgressNode
	msg := nodeConflictMessage(p.alloc[es.i].ip, *p.alloc[es.i].conflict, e.Spec.EgressIP != "")
	prev := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionAssigned)
	meta.SetStatusCondition(&es.st.Conditions, metav1.Condition{Type: v1.ConditionAssigned, Status: metav1.ConditionFalse, Reason: v1.ReasonNodeAddressConflict, Message: msg, ObservedGeneration: e.Generation})
	p.out.Unplaced[v1.ReasonNodeAddressConflict]++
	if cur != "" || prev == nil || prev.Reason != v1.ReasonNodeAddressConflict || prev.Message != msg {
		note := msg
		if cur != "" {
			note = fmt.Sprintf("%s removed from Node %s: %s; %s", es.st.EgressIP, cur, msg, failureEffectOf(e))
			es.ch.MoveReason = v1.ReasonNodeAddressConflict
		}
		es.ch.EventType, es.ch.EventReason, es.ch.EventNote = corev1.EventTypeWarning, v1.ReasonNodeAddressConflict, note
	}
}

// scheduled: Egress es is assigned to target; the Event says whether it
// is new there, moved, or assigned because a release wait expired.
func (p *pass) scheduled(es *egressStatus, target string) {
	e, cur := es.e, es.e.Status.EgressNode
	late, timedOut := p.lateNote(es.i, target, cur)
	meta.SetStatusCondition(&es.st.Conditions, metav1.Condition{Type: v1.ConditionAssigned, Status: metav1.ConditionTrue, Reason: v1.ReasonScheduled,
		Message: es.st.EgressIP + " is assigned to Node " + target + late, ObservedGeneration: e.Generation})
	mr := p.sched.moveReason[e.Name]
	switch {
	case timedOut:
		es.ch.EventType, es.ch.EventReason, es.ch.EventNote = corev1.EventTypeWarning, v1.ReasonReleaseTimedOut, fmt.Sprintf("%s assigned to Node %s", es.st.EgressIP, target)+late
		if cur != "" {
			es.ch.MoveReason = cmp.Or(mr, "Rebalance")
		}
	case cur == "":
		es.ch.EventType, es.ch.EventReason, es.ch.EventNote = corev1.EventTypeNormal, v1.EventAssigned, es.st.EgressIP+" assigned to Node "+target
	case cur != target:
		es.ch.EventType, es.ch.EventReason, es.ch.EventNote = corev1.EventTypeNormal, v1.EventMoved, fmt.Sprintf("%s moved from Node %s to Node %s (%s)", es.st.EgressIP, cur, target, cmp.Or(mr, "rebalance"))
		es.ch.MoveReason = cmp.Or(mr, "Rebalance")
	}
}

// noNodeDetail is noNodeDetail for pool when pl says no Node is eligible,
// else "".
func (p *pass) noNodeDetail(pool string, pl scheduler.Placement) string {
	pm, ok := p.sched.poolNodes[pool]
	if !ok || pl.Reason != v1.ReasonNoEligibleNode {
		return ""
	}
	if p.sched.nodeByName == nil {
		p.sched.nodeByName = make(map[string]*scheduler.Node, len(p.sched.nodes))
		for i := range p.sched.nodes {
			p.sched.nodeByName[p.sched.nodes[i].Name] = &p.sched.nodes[i]
		}
	}
	return noNodeDetail(pool, pm.what, len(p.in.Nodes), pm.matching, p.sched.nodeByName)
}

// readyCondition sets Egress es's Ready condition (readyCondition, with
// the agents' refusals) and picks its Event: the first that applies of
// the one already chosen, BindRefused, AddressHeld (over a Normal one),
// StatusIPRejected and NoEgressNode, the last two only when it changed.
func (p *pass) readyCondition(es *egressStatus) {
	e, ch, a := es.e, &es.ch, &p.alloc[es.i]
	rc := readyCondition(e, es.st, p.in.Agents)
	rc.Message += noPodsNote(e)
	applyRefusal(e, p.sched.refused[e.Name], &rc, ch)
	if rc.Reason == v1.ReasonBinding {
		p.out.Awaited = append(p.out.Awaited, es.st.EgressNode)
	}
	prev := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionReady)
	changed := prev == nil || prev.Reason != rc.Reason || prev.Message != rc.Message
	if rc.Reason == v1.ReasonBindRefused && ch.EventReason == "" && changed {
		ch.EventType, ch.EventReason, ch.EventNote = corev1.EventTypeWarning, v1.ReasonBindRefused, rc.Message
	}
	if a.heldNote != "" && (ch.EventReason == "" || ch.EventType == corev1.EventTypeNormal) {
		// Says more than an Assigned or Moved Event would.
		ch.EventType, ch.EventReason, ch.EventNote = corev1.EventTypeWarning, v1.ReasonAddressHeld, a.heldNote
	}
	if a.rejected != "" && ch.EventReason == "" {
		ch.EventType, ch.EventReason, ch.EventNote = corev1.EventTypeWarning, v1.ReasonStatusIPRejected, a.rejected
	}
	if rc.Reason == v1.ReasonNoEgressNode && ch.EventReason == "" && changed {
		ch.EventType, ch.EventReason, ch.EventNote = corev1.EventTypeWarning, v1.ReasonNoEgressNode, rc.Message
	}
	meta.SetStatusCondition(&es.st.Conditions, rc)
}

// selectorCondition sets SelectorValid=False, with a Warning Event when
// the message changed, while spec.appliedTo cannot be parsed (err, from
// selectorError), and removes the condition otherwise.
func selectorCondition(es *egressStatus, err error) {
	e := es.e
	if err == nil {
		// RemoveStatusCondition copies the slice even when the condition
		// is absent, the common case (a tenth of a warm pass).
		if meta.FindStatusCondition(es.st.Conditions, v1.ConditionSelectorValid) != nil {
			meta.RemoveStatusCondition(&es.st.Conditions, v1.ConditionSelectorValid)
		}
		return
	}
	msg := "spec.appliedTo selects no Pod: " + err.Error()
	if prev := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionSelectorValid); prev == nil || prev.Message != msg {
		es.ch.SelectorEvent = msg
	}
	meta.SetStatusCondition(&es.st.Conditions, metav1.Condition{Type: v1.ConditionSelectorValid, Status: metav1.ConditionFalse,
		Reason: v1.ReasonInvalidSelector, Message: msg, ObservedGeneration: e.Generation})
}
