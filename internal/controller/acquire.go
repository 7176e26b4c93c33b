package controller

import (
	"cmp"
	"net/netip"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/report"
)

// DefaultAcquireTimeout is the default of --acquire-timeout: how long the
// pass holds back a failover's move while the new Node binds the address
// on the poll's instruction (acquireHolds). Binding and announcing take
// one poll round and a reconcile of the agent, about 100 to 300 ms; a
// Node that has not reported the address by then gets the move written
// as before (two patches: the move, then Ready).
const DefaultAcquireTimeout = time.Second

// acquireKey names one held move: Egress UID moving to Node.
type acquireKey struct {
	UID  types.UID
	Node string
}

// heldMove is one Egress status write a pass holds back: the Egress at
// index of the pass's list moves from a dead Node to Node, whose agent is
// told to bind the address first (Acquire).
type heldMove struct {
	index   int
	key     acquireKey
	acquire report.Acquire
}

// acquireHolds returns the moves of a pass to hold back until their new
// Node reports the address bound, so that one patch writes the move and
// Ready (issue 22 goal 2: a failover of hundreds of Egresses then needs
// one write per Egress instead of two). A move is held when all hold:
//   - timeout is positive and the hold began (since; now when new) less
//     than timeout ago;
//   - the Egress's pool is not cloud-backed (cloud names the pools that
//     are: there the address must be attached to the new Node's
//     interface first, which the move's status drives);
//   - the Egress, not being deleted and without spec.ips, keeps its
//     address and leaves a Node whose agent is dead for a Node whose
//     agent answers and takes acquire instructions (report.Report.Acquires);
//   - the new status has Assigned=True (Scheduled) and Ready=False
//     (Binding): the new Node does not report the address announced yet.
//
// Moves from a live Node (planned moves, drains) are not held: their old
// Node must release first, which the status write tells it. At most
// report.MaxReleases moves to one Node are held (one poll's worth); the
// others are written at once. The result is in the order of egs.
func acquireHolds(egs []v1.Egress, changes map[string]egressChange, cloud map[string]bool, agents func(string) AgentState, since func(acquireKey) (time.Time, bool), now time.Time, timeout time.Duration) []heldMove {
	if timeout <= 0 {
		return nil
	}
	var out []heldMove
	perNode := map[string]int{}
	for i := range egs {
		e := &egs[i]
		ch, ok := changes[e.Name]
		if !ok || cloud[e.Spec.ExternalIPPool] || !holdable(e, &ch.Status, agents) {
			continue
		}
		k := acquireKey{UID: e.UID, Node: ch.Status.EgressNode}
		if t, ok := since(k); ok && now.Sub(t) >= timeout || perNode[k.Node] >= report.MaxReleases {
			continue
		}
		perNode[k.Node]++
		ip, _ := netip.ParseAddr(e.Status.EgressIP)
		out = append(out, heldMove{index: i, key: k, acquire: report.Acquire{IP: ip, UID: string(e.UID), ResourceVersion: e.ResourceVersion, Egress: e.Name}})
	}
	return out
}

// holdable reports whether the change of e to st is a failover move that
// acquireHolds may hold back (all but the timeout).
func holdable(e *v1.Egress, st *v1.EgressStatus, agents func(string) AgentState) bool {
	old := &e.Status
	if e.DeletionTimestamp != nil || len(e.Spec.IPs) > 0 || e.ResourceVersion == "" {
		return false
	}
	if old.EgressNode == "" || st.EgressNode == "" || old.EgressNode == st.EgressNode {
		return false
	}
	if ip, err := netip.ParseAddr(old.EgressIP); err != nil || old.EgressIP != st.EgressIP || ip.String() != old.EgressIP {
		return false
	}
	if !agents(old.EgressNode).Dead {
		return false
	}
	if to := agents(st.EgressNode); !to.Known || to.Dead || !to.Report.Acquires {
		return false
	}
	return conditionIs(st.Conditions, v1.ConditionAssigned, metav1.ConditionTrue, v1.ReasonScheduled) &&
		conditionIs(st.Conditions, v1.ConditionReady, metav1.ConditionFalse, v1.ReasonBinding)
}

// conditionIs reports whether cs holds condition t with status s and reason.
func conditionIs(cs []metav1.Condition, t string, s metav1.ConditionStatus, reason string) bool {
	c := meta.FindStatusCondition(cs, t)
	return c != nil && c.Status == s && c.Reason == reason
}

// acquireInstructions groups holds by their new Node, each list sorted by
// IP then Egress (acquireHolds holds at most report.MaxReleases per Node).
func acquireInstructions(holds []heldMove) map[string][]report.Acquire {
	out := map[string][]report.Acquire{}
	for _, h := range holds {
		out[h.key.Node] = append(out[h.key.Node], h.acquire)
	}
	for _, as := range out {
		slices.SortFunc(as, func(a, b report.Acquire) int {
			return cmp.Or(a.IP.Compare(b.IP), cmp.Compare(a.Egress, b.Egress))
		})
	}
	return out
}

// trackAcquires keeps when each hold of holds began (now for new ones)
// and forgets the others; it returns how soon the first of them reaches
// the acquire timeout (0: none), so that a pass runs then and writes it.
func (r *PassReconciler) trackAcquires(holds []heldMove, now time.Time) time.Duration {
	next := make(map[acquireKey]time.Time, len(holds))
	var soonest time.Duration
	for _, h := range holds {
		since, ok := r.acquireSince[h.key]
		if !ok {
			since = now
		}
		next[h.key] = since
		soonest = minPositive(soonest, max(since.Add(r.Config.AcquireTimeout).Sub(now), 10*time.Millisecond))
	}
	r.acquireSince = next
	return soonest
}

// acquireStarted is when the hold k began, if the pass holds it.
func (r *PassReconciler) acquireStarted(k acquireKey) (time.Time, bool) {
	t, ok := r.acquireSince[k]
	return t, ok
}

// hold takes the writes of holds out of the set: not attempted, so the
// API server holds those Egresses as read.
func (w *egressWriteSet) hold(holds []heldMove) {
	if len(holds) == 0 {
		return
	}
	held := make(map[int]bool, len(holds))
	for _, h := range holds {
		held[h.index] = true
		w.patched[h.index] = false
	}
	w.writes = slices.DeleteFunc(w.writes, func(sw statusWrite) bool { return sw.index >= 0 && held[sw.index] })
}

// cloudPools names the cloud-backed pools of pools.
func cloudPools(pools []v1.ExternalIPPool) map[string]bool {
	out := map[string]bool{}
	for i := range pools {
		if pools[i].Spec.Cloud != nil {
			out[pools[i].Name] = true
		}
	}
	return out
}
