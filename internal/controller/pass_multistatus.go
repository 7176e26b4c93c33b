package controller

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/scheduler"
)

// The Egress status phase for multi-IP Egresses: each IP's Node (the
// scheduler's, after the release wait a planned move needs, as for a
// single-IP Egress) and readiness (the Node's agent reports it bound and
// announced, as readyCondition decides for one IP) give one status.ips
// entry; the conditions, status.readyIPs, egressIP/egressNode and the
// Events sum them up.

// ipMove is one IP of a multi-IP Egress whose Node changes in a pass.
type ipMove struct {
	ip, from, to string
	// waiting: a planned move waits for from to release ip (to is then
	// the Node it moves to, and the status names no Node meanwhile).
	waiting bool
	reason  string
}

// multiStatus decides multi-IP Egress i's status.
func (p *pass) multiStatus(i int) *egressStatus {
	e := p.egs[i]
	es := &egressStatus{i: i, e: e, st: v1.EgressStatus{Conditions: slices.Clone(e.Status.Conditions), SelectedPods: e.Status.SelectedPods, ShadowedBy: e.Status.ShadowedBy}}
	meta.SetStatusCondition(&es.st.Conditions, withGen(p.alloc[i].cond, e.Generation))
	slots := p.slots[i]
	placed := p.sched.slots[e.Name]
	ips := make([]v1.EgressIPStatus, len(slots))
	var moves []ipMove
	var waits []string
	for k := range slots {
		var sp scheduler.SlotPlacement
		if k < len(placed) {
			sp = placed[k]
		}
		var mv *ipMove
		ips[k], mv = p.ipStatus(e, k, &slots[k], sp)
		if mv != nil {
			moves = append(moves, *mv)
			if mv.waiting {
				waits = append(waits, fmt.Sprintf("%s waits for Node %s to release it before it moves to Node %s", mv.ip, mv.from, mv.to))
			}
		}
	}
	es.st.IPs = ips
	first := max(0, slices.IndexFunc(ips, func(s v1.EgressIPStatus) bool { return s.Node != "" }))
	es.st.EgressIP, es.st.EgressNode = ips[first].IP, ips[first].Node
	es.st.InterfaceMAC, es.st.PublicIP = ips[first].InterfaceMAC, ips[first].PublicIP
	ready := 0
	for _, s := range ips {
		if s.Ready {
			ready++
		}
	}
	es.st.ReadyIPs = fmt.Sprintf("%d/%d", ready, len(ips))
	p.multiAssigned(es, slots, waits)
	p.multiEvent(es, moves, slots)
	if es.ch.EventReason == "" || es.ch.EventType == corev1.EventTypeNormal {
		for _, s := range slots {
			if s.attachFailed {
				es.ch.EventType, es.ch.EventReason, es.ch.EventNote = corev1.EventTypeWarning, v1.EventAttachFailed, s.attachMsg
				break
			}
		}
	}
	p.multiReady(es, ready)
	if applyConflict(e, &es.st, &es.ch, p.in.Agents, p.sched.owners) {
		p.out.Conflicts++
	}
	selectorCondition(es, p.in.Selectors.err(es.e))
	shadowedCondition(es)
	return es
}

// ipStatus is the status.ips entry of slot k (s) of Egress e, placed at
// sp by the scheduler, and the Node change it makes (nil: none).
func (p *pass) ipStatus(e *v1.Egress, k int, s *ipSlot, sp scheduler.SlotPlacement) (v1.EgressIPStatus, *ipMove) {
	st := v1.EgressIPStatus{Pool: s.pool}
	if !s.ip.IsValid() {
		st.Reason = cmp.Or(s.reason, v1.ReasonIPNotAllocated)
		return st, nil
	}
	st.IP = s.ip.String()
	target, cur := sp.Node, s.cur
	mr := p.sched.slotMove[e.Name][k]
	if target != "" && target != cur {
		expired := func(n string) bool { return p.in.releaseExpired(releaseKey{n, s.ip}) }
		if waitFor := releasePending(s.ip, target, cur, p.sched.holders, p.in.Agents, expired); waitFor != "" {
			p.out.Awaited = append(p.out.Awaited, waitFor)
			p.out.Waits = append(p.out.Waits, releaseKey{waitFor, s.ip})
			st.Reason = v1.ReasonWaitingForRelease
			var mv *ipMove
			if cur != "" {
				mv = &ipMove{ip: st.IP, from: cur, to: target, waiting: true, reason: cmp.Or(mr, "Release")}
			}
			return st, mv
		}
	}
	if ck := p.cloudKindOf(s.pool); ck != nil && target != "" {
		// A cloud pool's address: named with its Node once the cloud
		// has it on that Node's interface, as for a single-IP Egress;
		// until then the IP has no Node and says Attaching (a move
		// detaches it from its old Node's interface by reassigning it).
		mac, msg, failed := ck.place(s.ip, target)
		if msg != "" {
			st.Reason, s.attachMsg, s.attachFailed = v1.ReasonAttaching, msg, failed
			return st, nil
		}
		st.InterfaceMAC = mac
	}
	st.Node, st.Zone = target, p.zoneOf(target)
	var mv *ipMove
	if target != cur {
		mv = &ipMove{ip: st.IP, from: cur, to: target, reason: cmp.Or(mr, sp.Reason)}
	}
	if target == "" {
		st.Reason = cmp.Or(sp.Reason, v1.ReasonNotAssigned)
		return st, mv
	}
	st.Ready, st.Reason = p.ipReady(s, target)
	return st, mv
}

// ipReady says whether node's agent reports s's address bound and
// announced, and if not why (Binding, BindRefused), as readyCondition
// does for a single-IP Egress: until the controller has heard from the
// agent (just after a restart), an IP that stays on its Node keeps the
// readiness its status had.
func (p *pass) ipReady(s *ipSlot, node string) (bool, string) {
	a := p.in.Agents(node)
	if !a.Known && !a.Dead && s.prev != nil && s.prev.Node == node {
		return s.prev.Ready, s.prev.Reason
	}
	if b, ok := a.Report.Lookup(s.ip); ok && a.Known && !a.Dead && b.Announced {
		return true, ""
	}
	if _, ok := a.Report.LookupRefused(s.ip); ok && a.Known && !a.Dead && s.prev != nil && s.prev.Node == node {
		return false, v1.ReasonBindRefused
	}
	p.out.Awaited = append(p.out.Awaited, node)
	return false, v1.ReasonBinding
}

// multiAssigned sets the Assigned condition of multi-IP Egress es:
// Scheduled when every IP has a Node, PartlyAssigned (True) when some
// have, else False with the first IP's reason; the message says how many
// and why the others have none. waits describe the planned moves that
// wait for a release.
func (p *pass) multiAssigned(es *egressStatus, slots []ipSlot, waits []string) {
	e, ips := es.e, es.st.IPs
	var on, why []string
	first := ""
	for k, s := range ips {
		if s.Node != "" {
			on = append(on, fmt.Sprintf("%s on %s", s.IP, s.Node))
			continue
		}
		first = cmp.Or(first, s.Reason)
		why = append(why, p.unplacedIP(e, k, s, slots[k]))
	}
	why = append(why, waits...)
	c := metav1.Condition{Type: v1.ConditionAssigned, ObservedGeneration: e.Generation}
	switch {
	case len(on) == len(ips):
		c.Status, c.Reason, c.Message = metav1.ConditionTrue, v1.ReasonScheduled, fmt.Sprintf("all %d IPs have a Node: %s", len(ips), strings.Join(on, ", "))
	case len(on) > 0:
		c.Status, c.Reason = metav1.ConditionTrue, v1.ReasonPartlyAssigned
		c.Message = fmt.Sprintf("%d of %d IPs have a Node (%s); %s", len(on), len(ips), strings.Join(on, ", "), strings.Join(why, "; "))
	default:
		c.Status, c.Reason = metav1.ConditionFalse, first
		c.Message = fmt.Sprintf("none of the %d IPs has a Node: %s", len(ips), strings.Join(why, "; "))
		if first != v1.ReasonAttaching {
			// Attaching IPs are placed: the cloud call is under way.
			p.out.Unplaced[first]++
		}
	}
	meta.SetStatusCondition(&es.st.Conditions, c)
}

// unplacedIP says why IP k (st, slot s) of Egress e has no Node.
func (p *pass) unplacedIP(e *v1.Egress, k int, st v1.EgressIPStatus, s ipSlot) string {
	if st.IP == "" {
		return fmt.Sprintf("IP %d of spec.ips[%d] has no address (%s, see condition IPAllocated)", k+1, s.entry, st.Reason)
	}
	if st.Reason == v1.ReasonWaitingForRelease {
		return fmt.Sprintf("%s: %s", st.IP, st.Reason)
	}
	if st.Reason == v1.ReasonAttaching {
		return fmt.Sprintf("%s: %s (%s)", st.IP, st.Reason, s.attachMsg)
	}
	var sp scheduler.SlotPlacement
	if pl := p.sched.slots[e.Name]; k < len(pl) {
		sp = pl[k]
	}
	pool := zonePoolName(s.pool, s.zone)
	msg := unplacedMessage(scheduler.Placement{Reason: sp.Reason, Message: sp.Message}, p.noNodeDetail(pool, scheduler.Placement{Reason: sp.Reason}))
	return fmt.Sprintf("%s: %s (%s)", st.IP, st.Reason, msg)
}

// multiReady sets the Ready condition of multi-IP Egress es, of which
// ready IPs are Ready: True (Announced) when all are, PartlyReady (True)
// with "n of N IPs Ready" when some are; when none is, False with Binding
// while some IP has a Node, else NoEgressNode (and only then does
// failurePolicy apply). A Node refusing the Egress's datapath makes it
// DatapathRefused, as for a single-IP Egress.
func (p *pass) multiReady(es *egressStatus, ready int) {
	e, ch, ips := es.e, &es.ch, es.st.IPs
	var notReady []string
	for k, s := range ips {
		if s.Ready {
			continue
		}
		switch {
		case s.Node != "":
			notReady = append(notReady, fmt.Sprintf("%s on Node %s: %s", s.IP, s.Node, s.Reason))
		case s.IP != "":
			notReady = append(notReady, fmt.Sprintf("%s has no Node: %s", s.IP, s.Reason))
		default:
			notReady = append(notReady, fmt.Sprintf("IP %d has no address: %s", k+1, s.Reason))
		}
	}
	rc := metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionTrue, ObservedGeneration: e.Generation}
	head := fmt.Sprintf("%d of %d IPs Ready", ready, len(ips))
	switch {
	case ready == len(ips):
		rc.Reason, rc.Message = v1.ReasonAnnounced, head+": each is bound and announced by its Node"
	case ready > 0:
		rc.Reason, rc.Message = v1.ReasonPartlyReady, head+"; new connections use the Ready ones; "+strings.Join(notReady, "; ")
	case es.st.EgressNode != "":
		rc.Status, rc.Reason, rc.Message = metav1.ConditionFalse, v1.ReasonBinding, head+"; waiting for the agents to bind and announce them: "+strings.Join(notReady, "; ")
	default:
		rc.Status, rc.Reason, rc.Message = metav1.ConditionFalse, v1.ReasonNoEgressNode, head+": no Node holds any of them (see condition Assigned); "+failureEffectOf(e)
	}
	rc.Message += noPodsNote(e)
	applyRefusal(e, p.sched.refused[e.Name], &rc, ch)
	prev := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionReady)
	if rc.Reason == v1.ReasonNoEgressNode && ch.EventReason == "" && (prev == nil || prev.Reason != rc.Reason || prev.Message != rc.Message) {
		ch.EventType, ch.EventReason, ch.EventNote = corev1.EventTypeWarning, v1.ReasonNoEgressNode, rc.Message
	}
	meta.SetStatusCondition(&es.st.Conditions, rc)
}

// multiEvent picks the Event of multi-IP Egress es: one Event names every
// IP whose Node changes in this pass with both Nodes (Warning Unassigned
// when one is left without a Node, else Normal Moved, Releasing or
// Assigned, the first that applies); the Warning NamedIPConflict instead
// of a Normal one (its note then names the moves too), or alone, when an
// IP lost its named address to an older Egress and IPAllocated says so
// for the first time. The Ready condition's Events (NoEgressNode,
// DatapathRefused) come only when neither applies. It also sets the Event note of a change of address
// (IPChangedNote).
func (p *pass) multiEvent(es *egressStatus, moves []ipMove, slots []ipSlot) {
	e, ch := es.e, &es.ch
	es.ch.IPChangedNote = multiIPChangedNote(e, es.st.IPs)
	conflict := ""
	if _, c := multiAllocCond(slots); c != "" {
		if prev := meta.FindStatusCondition(e.Status.Conditions, v1.ConditionIPAllocated); prev == nil || prev.Message != p.alloc[es.i].cond.Message {
			conflict = c
		}
	}
	if len(moves) > 0 {
		typ, reason, notes := corev1.EventTypeNormal, v1.EventAssigned, make([]string, 0, len(moves))
		rank := func(r string) int {
			return slices.Index([]string{v1.EventAssigned, v1.EventReleasing, v1.EventMoved, v1.EventUnassigned}, r)
		}
		for _, m := range moves {
			r, note := v1.EventMoved, fmt.Sprintf("%s moved from Node %s to Node %s (%s)", m.ip, m.from, m.to, cmp.Or(m.reason, "rebalance"))
			switch {
			case m.waiting:
				r, note = v1.EventReleasing, fmt.Sprintf("releasing %s from Node %s before moving it to Node %s (%s)", m.ip, m.from, m.to, cmp.Or(m.reason, "rebalance"))
			case m.from == "":
				r, note = v1.EventAssigned, fmt.Sprintf("%s assigned to Node %s", m.ip, m.to)
			case m.to == "":
				r, note = v1.EventUnassigned, fmt.Sprintf("%s removed from Node %s (%s)", m.ip, m.from, cmp.Or(m.reason, v1.ReasonNotAssigned))
				typ = corev1.EventTypeWarning
			}
			if rank(r) > rank(reason) {
				reason = r
			}
			notes = append(notes, note)
			if m.from != "" && ch.MoveReason == "" {
				ch.MoveReason = cmp.Or(m.reason, "Rebalance")
			}
		}
		note := strings.Join(notes, "; ")
		if typ == corev1.EventTypeWarning {
			note += "; " + fmt.Sprintf("%s of this Egress's IPs are Ready", es.st.ReadyIPs)
		}
		ch.EventType, ch.EventReason, ch.EventNote = typ, reason, note
		if conflict != "" && typ == corev1.EventTypeNormal {
			// One Event per pass: the Warning, naming the moves too.
			ch.EventType, ch.EventReason, ch.EventNote = corev1.EventTypeWarning, v1.ReasonNamedIPConflict, conflict+"; "+note
		}
		return
	}
	if conflict != "" {
		ch.EventType, ch.EventReason, ch.EventNote = corev1.EventTypeWarning, v1.ReasonNamedIPConflict, conflict
	}
}

// multiIPChangedNote is the note of the EgressIPChanged Warning Event
// when the set of addresses of multi-IP Egress e changes from what its
// status listed (statusAddrs: an address lost or added while it had some,
// including a single-IP Egress turned into a multi-IP one): the
// selected Pods' new connections then leave with other sources. Empty
// otherwise.
func multiIPChangedNote(e *v1.Egress, ips []v1.EgressIPStatus) string {
	set := func(l []v1.EgressIPStatus) []string {
		var out []string
		for _, s := range l {
			if _, err := netip.ParseAddr(s.IP); err == nil {
				out = append(out, s.IP)
			}
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	old, cur := set(statusAddrs(e.Status)), set(ips)
	if len(old) == 0 || slices.Equal(old, cur) {
		return ""
	}
	var gone, added []string
	for _, a := range old {
		if !slices.Contains(cur, a) {
			gone = append(gone, a)
		}
	}
	for _, a := range cur {
		if !slices.Contains(old, a) {
			added = append(added, a)
		}
	}
	parts := []string{}
	if len(gone) > 0 {
		parts = append(parts, "no longer uses "+strings.Join(gone, ", "))
	}
	if len(added) > 0 {
		parts = append(parts, "now also uses "+strings.Join(added, ", "))
	}
	return fmt.Sprintf("egress IPs changed from %s to %s: the Egress %s; peers that allow its sources must allow %s",
		strings.Join(old, ", "), cmp.Or(strings.Join(cur, ", "), "none"), strings.Join(parts, " and "), cmp.Or(strings.Join(cur, ", "), "none"))
}
