package agent

import (
	"context"
	"io"
	"net/netip"
	"strings"

	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
)

// Assignment arrivals (issue 16 item 5).
//
// The reconcile loop is level-triggered: it compares the IPs the cache
// assigns to this Node with what is bound. An IP that left this Node and
// came back while the agent could not see the intermediate states (its
// watch stalled or dropped, the API server answered 503 and the informer
// re-listed, or the events arrived faster than the coalesced reconcile ran)
// looks unchanged to it: nothing was unbound, nothing is bound, and no
// burst would start, although a neighbour may now cache another Node's MAC
// for it. So the agent also follows the events: every arrival of an
// assignment (a create, or an update that moves the Egress onto this Node
// or changes its IP here, or the first changed version of an Egress after a
// watch error) bumps the IP's arrival generation, and a reconcile restarts
// the burst of every bound IP whose generation moved since its last burst.
// An unrelated status write (conditions, selectedPods) of an Egress held
// here without a gap bumps nothing.

// assignedIP returns the egress IP e's status assigns to node, and whether
// it assigns one: for a single-IP Egress a parsable status.egressIP with
// status.egressNode = node, for an Egress with spec.ips the first parsable
// status.ips entry naming node (the scheduler puts at most one IP of an
// Egress on a Node). A nil e assigns nothing.
func assignedIP(node string, e *v1alpha1.Egress) (netip.Addr, bool) {
	if e == nil {
		return netip.Addr{}, false
	}
	if len(e.Spec.IPs) > 0 {
		for _, i := range heldEntries(node, e) {
			if ip, err := netip.ParseAddr(e.Status.IPs[i].IP); err == nil && ip.Zone() == "" {
				return ip.Unmap(), true
			}
		}
		return netip.Addr{}, false
	}
	if e.Status.EgressNode != node || e.Status.EgressIP == "" {
		return netip.Addr{}, false
	}
	ip, err := netip.ParseAddr(e.Status.EgressIP)
	if err != nil || ip.Zone() != "" {
		return netip.Addr{}, false
	}
	return ip.Unmap(), true
}

// arrival decides whether the informer event old → cur (old nil for a
// create) brings an assignment of an IP to node, and which IP. afterGap
// says that the informer had a watch error since the agent last saw an
// event for this Egress: a changed version may then hide a move away and
// back. A delete (cur nil) never brings one.
func arrival(node string, old, cur *v1alpha1.Egress, afterGap bool) (netip.Addr, bool) {
	ip, ok := assignedIP(node, cur)
	if !ok {
		return netip.Addr{}, false
	}
	if old == nil {
		return ip, true // new to the cache: first list, a return into the field selector, a re-list
	}
	if oldIP, was := assignedIP(node, old); !was || oldIP != ip {
		return ip, true // moved onto this Node, or its IP here changed
	}
	if afterGap && old.ResourceVersion != cur.ResourceVersion {
		return ip, true // changed while the agent could not see it
	}
	return netip.Addr{}, false
}

// noteArrival records an informer event of an Egress (old nil for a
// create, cur nil for a delete) and bumps the arrival generation of the IP
// it assigns here, if any.
func (a *Agent) noteArrival(old, cur *v1alpha1.Egress) {
	a.assignMu.Lock()
	defer a.assignMu.Unlock()
	if cur == nil {
		if old != nil {
			delete(a.seenEpoch, old.UID)
		}
		return
	}
	gap := a.gapEpoch.Load()
	seen, known := a.seenEpoch[cur.UID]
	afterGap := known && seen < gap
	a.seenEpoch[cur.UID] = gap
	if ip, ok := arrival(a.cfg.NodeName, old, cur, afterGap); ok {
		a.assignSeq++
		a.assignGen[ip] = a.assignSeq
		a.log.V(1).Info("assignment arrived", "egress", klog.KObj(cur), "ip", ip, "resourceVersion", cur.ResourceVersion, "afterWatchError", afterGap)
	}
}

// arrivals returns a copy of the arrival generation of every IP, and
// forgets those of IPs not in keep (no longer assigned here; a later
// arrival gets a fresh, larger generation).
func (a *Agent) arrivals(keep map[netip.Addr]bool) map[netip.Addr]uint64 {
	a.assignMu.Lock()
	defer a.assignMu.Unlock()
	out := make(map[netip.Addr]uint64, len(a.assignGen))
	for ip, g := range a.assignGen {
		if !keep[ip] {
			delete(a.assignGen, ip)
			continue
		}
		out[ip] = g
	}
	return out
}

// WatchErrorHandler is the informers' watch error handler
// (cache.Options.DefaultWatchErrorHandler): it logs as client-go's default
// does and, for an error of the Egress informer other than a normal close,
// opens a new gap epoch, so that the first changed version of each Egress
// seen afterwards counts as an arrival (see arrival).
func (a *Agent) WatchErrorHandler(ctx context.Context, r *toolscache.Reflector, err error) {
	toolscache.DefaultWatchErrorHandler(ctx, r, err)
	if err == io.EOF { //nolint:errorlint // client-go's own test for a normal close: a wrapped EOF (a failed request) is a gap
		return // closed normally: the next watch resumes without a gap
	}
	if d := r.TypeDescription(); d != "" && (!strings.Contains(d, "Egress") || strings.Contains(d, "EgressMemberSlice")) {
		return
	}
	a.gapEpoch.Add(1)
}

// egressEvents is the Egress event handler: it records arrivals
// (noteArrival) before enqueueing key, so that the reconcile the event
// causes sees them.
func (a *Agent) egressEvents(key reconcile.Request) handler.Funcs {
	asEgress := func(o client.Object) *v1alpha1.Egress {
		e, _ := o.(*v1alpha1.Egress)
		return e
	}
	type queue = workqueue.TypedRateLimitingInterface[reconcile.Request]
	return handler.Funcs{
		CreateFunc: func(_ context.Context, e event.CreateEvent, q queue) {
			a.noteArrival(nil, asEgress(e.Object))
			q.Add(key)
		},
		UpdateFunc: func(_ context.Context, e event.UpdateEvent, q queue) {
			a.noteArrival(asEgress(e.ObjectOld), asEgress(e.ObjectNew))
			q.Add(key)
		},
		DeleteFunc: func(_ context.Context, e event.DeleteEvent, q queue) {
			a.noteArrival(asEgress(e.Object), nil)
			q.Add(key)
		},
		GenericFunc: func(_ context.Context, _ event.GenericEvent, q queue) { q.Add(key) },
	}
}
