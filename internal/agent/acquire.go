package agent

import (
	"context"
	"net/netip"
	"slices"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/report"
)

// acquireTTL is how long the agent keeps binding for an acquire
// instruction (report.Acquire) after the last poll: a controller that
// stops polling (it crashed, lost its lease, or this Node is cut off from
// it) leaves no address bound that no status assigns here for longer
// than that. It is a few poll intervals at the default (500 ms), and
// below the controller's default dead-after (2 s), so a Node cut off from
// the controller drops what only a poll gave it before it could be
// declared dead and the address handed to a third Node.
const acquireTTL = 1500 * time.Millisecond

// heldAcquire is one acquire instruction the agent honours.
type heldAcquire struct {
	report.Acquire
	// carried is when a poll last carried it.
	carried time.Time
}

// takeAcquires notes the acquire instructions of poll p, taken at now:
// new ones are added, carried ones refreshed. An instruction the poll no
// longer carries is kept until withAcquired drops it (the controller
// stops sending it once it has written the move, and this agent's cache
// may not show that write yet: dropping it at once would unbind the
// address until the cache catches up). An instruction for an Egress the
// agent holds a release instruction for (onPoll takes p's releases first)
// is ignored, the rule withAcquired applies. It returns the IPs of the
// instructions p brought new.
func (a *Agent) takeAcquires(p report.Poll, now time.Time) []netip.Addr {
	a.releaseMu.Lock()
	defer a.releaseMu.Unlock()
	if a.acquires == nil {
		a.acquires = map[types.UID]*heldAcquire{}
	}
	var added []netip.Addr
	for _, ac := range p.Acquires {
		uid := types.UID(ac.UID)
		if _, released := a.releases[uid]; released {
			continue // the release wins, as in withAcquired
		}
		if h, ok := a.acquires[uid]; ok && h.Acquire == ac {
			h.carried = now
			continue
		}
		a.acquires[uid] = &heldAcquire{Acquire: ac, carried: now}
		added = append(added, ac.IP)
	}
	return added
}

// acquireAnswerWait bounds how long a poll that brings new acquire
// instructions waits for their IPs to be bound and announced before it is
// answered (awaitAnnounced): well inside the controller's poll timeout
// (default 400 ms), and long enough for a reconcile that binds a few
// hundred addresses, so that the controller sees them in this poll's
// report and writes the moves without waiting for the next poll.
const acquireAnswerWait = 150 * time.Millisecond

// awaitAnnounced waits, for at most d and checking every 5 ms, until a
// reconcile begun after the first `after` ones has finished (it saw the
// new instructions) and every IP of ips that reconcile bound is
// announced; IPs it did not bind (an instruction it refused) are not
// waited for.
func (a *Agent) awaitAnnounced(ips []netip.Addr, after int64, d time.Duration) {
	deadline := time.Now().Add(d)
	for {
		done := a.reconcileDone.Load() > after
		if done {
			a.mu.Lock()
			done = !slices.ContainsFunc(ips, func(ip netip.Addr) bool { e := a.state[ip]; return e != nil && !e.announced })
			a.mu.Unlock()
		}
		if done || !time.Now().Before(deadline) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// kickReconcile asks for a reconcile unless one is already pending.
func (a *Agent) kickReconcile() {
	select {
	case a.kick <- event.GenericEvent{Object: &v1alpha1.Egress{}}:
	default: // a reconcile is already pending
	}
}

// withAcquired returns held plus, for every acquire instruction of the
// last poll, a copy of its Egress from the cache whose status names this
// Node: the controller has chosen this Node for an Egress whose Node is
// dead and waits for this Node to report the address bound before it
// writes the move (report.Acquire). The copy is made only when the cache
// holds that Egress (same UID) without spec.ips, at the instruction's
// resource version or older, with status.egressIP the instruction's IP;
// so computeDesired checks the address against its pool as for any
// assignment. A cache that shows a newer version has seen a status
// written since: the status decides alone, and the instruction is
// dropped. An instruction no poll has carried for acquireTTL is dropped,
// and so is one for an Egress the controller asks this Node to release.
// applied reports whether any copy was added (the caller then reconciles
// again within acquireTTL).
func (a *Agent) withAcquired(ctx context.Context, held []v1alpha1.Egress) (out []v1alpha1.Egress, applied bool) {
	log := ctrllog.FromContext(ctx)
	now := time.Now()
	a.releaseMu.Lock()
	acs := make([]report.Acquire, 0, len(a.acquires))
	for uid, h := range a.acquires {
		_, released := a.releases[uid]
		if released || now.Sub(h.carried) > acquireTTL {
			delete(a.acquires, uid)
			continue
		}
		acs = append(acs, h.Acquire)
	}
	a.releaseMu.Unlock()
	if len(acs) == 0 {
		return held, false
	}
	have := make(map[types.UID]bool, len(held))
	for i := range held {
		have[held[i].UID] = true
	}
	out = held
	for _, ac := range acs {
		if have[types.UID(ac.UID)] {
			continue
		}
		var eg v1alpha1.Egress
		if err := a.reader.Get(ctx, client.ObjectKey{Name: ac.Egress}, &eg); err != nil {
			if !apierrors.IsNotFound(err) {
				log.Error(err, "cannot read the Egress of an acquire instruction from the cache", "egress", klog.KRef("", ac.Egress))
			}
			continue
		}
		if why, newer := acquireRefusal(&eg, ac); why != "" {
			log.V(1).Info("not acquiring ahead of the status", "egress", klog.KObj(&eg), "ip", ac.IP, "reason", why)
			if newer {
				a.dropAcquire(ac)
			}
			continue
		}
		cp := eg.DeepCopy()
		cp.Status.EgressNode = a.cfg.NodeName
		out = append(out, *cp)
		applied = true
	}
	return out, applied
}

// dropAcquire forgets the acquire instruction ac (unless a poll has
// replaced it by another one for the same Egress since).
func (a *Agent) dropAcquire(ac report.Acquire) {
	a.releaseMu.Lock()
	defer a.releaseMu.Unlock()
	if h, ok := a.acquires[types.UID(ac.UID)]; ok && h.Acquire == ac {
		delete(a.acquires, types.UID(ac.UID))
	}
}

// acquireRefusal says why the cached eg does not get bound for the
// acquire instruction ac, or "" when it does (see withAcquired); newer
// is set when the cache shows eg newer than the instruction.
func acquireRefusal(eg *v1alpha1.Egress, ac report.Acquire) (why string, newer bool) {
	c, err := resourceversion.CompareResourceVersion(eg.ResourceVersion, ac.ResourceVersion)
	switch {
	case string(eg.UID) != ac.UID:
		return "the cache holds another Egress of that name", false
	case err == nil && c > 0:
		return "the cache shows a newer status", true
	case err != nil && eg.ResourceVersion != ac.ResourceVersion:
		return "resource versions " + eg.ResourceVersion + " and " + ac.ResourceVersion + " do not compare", false
	case len(eg.Spec.IPs) > 0:
		return "the Egress has spec.ips", false
	case eg.DeletionTimestamp != nil:
		return "the Egress is being deleted", false
	case eg.Status.EgressIP != ac.IP.String():
		return "the cached status.egressIP is " + eg.Status.EgressIP, false
	}
	return "", false
}
