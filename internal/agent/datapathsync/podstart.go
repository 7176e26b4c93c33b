package datapathsync

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	"github.com/egressip/egressip/internal/agent/datapath"
	"github.com/egressip/egressip/internal/podstart/cniapi"
)

// announcement is a Pod the egressip-cni plugin announced on this Node
// before its status shows its IPs (the kubelet writes the status only
// after the runtime's ADD returns, and the ADD waits for this).
type announcement struct {
	uid string
	ips []netip.Addr
	// done is closed once an applied State classifies the Pod; egresses
	// are then the Egresses it is a member of here.
	done     chan struct{}
	egresses []string
}

// PodAdded implements podstart.Gate: it records the Pod's IPs from the
// plugin, makes the reconciler run, and returns once a State that
// classifies the Pod with those IPs has been applied (the Pod's namespace
// and labels from the cache, every Egress's selectors). It returns an
// error when ctx ends first, for example because the Pod is not in this
// agent's cache (another Node's, or not yet seen).
func (r *Reconciler) PodAdded(ctx context.Context, req cniapi.Request) ([]string, error) {
	key := types.NamespacedName{Namespace: req.Namespace, Name: req.Name}
	a := &announcement{uid: req.UID, ips: slices.Clone(req.IPs), done: make(chan struct{})}
	r.annMu.Lock()
	if r.ann == nil {
		r.ann = map[types.NamespacedName]*announcement{}
	}
	if old := r.ann[key]; old != nil {
		select {
		case <-old.done:
		default:
			close(old.done) // a retried ADD: the newer request is answered
		}
	}
	r.ann[key] = a
	r.annMu.Unlock()
	r.kick()
	select {
	case <-a.done:
		r.annMu.Lock()
		defer r.annMu.Unlock()
		return a.egresses, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("pod %s not classified by the datapath in time (not in this agent's cache yet?): %w", key, ctx.Err())
	}
}

// PodDeleted implements podstart.Gate: it forgets the Pod's announced IPs
// (the runtime's DEL: the IPs may go to another Pod next).
func (r *Reconciler) PodDeleted(_ context.Context, req cniapi.Request) error {
	key := types.NamespacedName{Namespace: req.Namespace, Name: req.Name}
	r.annMu.Lock()
	a := r.ann[key]
	if a != nil && (req.UID == "" || a.uid == "" || req.UID == a.uid) {
		delete(r.ann, key)
	} else {
		a = nil
	}
	r.annMu.Unlock()
	if a != nil {
		r.kick()
	}
	return nil
}

// kick queues a reconcile without blocking.
func (r *Reconciler) kick() {
	r.annMu.Lock()
	ch := r.annEvents
	r.annMu.Unlock()
	if ch == nil {
		return
	}
	select {
	case ch <- event.GenericEvent{Object: &corev1.Pod{}}:
	default:
	}
}

// overlayAnnounced gives the cached Pods that the plugin announced, and
// whose status has no IP yet, the announced IPs (a pure step of
// Reconcile). It returns the announcements the Pods in the cache cover
// (announced or already showing their IPs), to be resolved once the State
// is applied, and those that the status has made redundant.
func overlayAnnounced(pods []corev1.Pod, ann map[types.NamespacedName]*announcement) (covered []*announcement, redundant []types.NamespacedName) {
	if len(ann) == 0 {
		return nil, nil
	}
	for i := range pods {
		p := &pods[i]
		key := types.NamespacedName{Namespace: p.Namespace, Name: p.Name}
		a := ann[key]
		if a == nil || (a.uid != "" && string(p.UID) != a.uid) {
			continue
		}
		covered = append(covered, a)
		if len(p.Status.PodIPs) > 0 || p.Status.PodIP != "" {
			redundant = append(redundant, key)
			continue
		}
		for _, ip := range a.ips {
			p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: ip.String()})
		}
		p.Status.PodIP = p.Status.PodIPs[0].IP
	}
	return covered, redundant
}

// snapshotAnnounced returns a copy of the announcement index.
func (r *Reconciler) snapshotAnnounced() map[types.NamespacedName]*announcement {
	r.annMu.Lock()
	defer r.annMu.Unlock()
	return maps.Clone(r.ann)
}

// resolveAnnounced answers the plugin's waiting ADDs that st, now applied,
// covers, and drops announcements the Pods' status has made redundant.
func (r *Reconciler) resolveAnnounced(st datapath.State, covered []*announcement, redundant []types.NamespacedName) {
	if len(covered) == 0 && len(redundant) == 0 {
		return
	}
	r.annMu.Lock()
	defer r.annMu.Unlock()
	for _, a := range covered {
		select {
		case <-a.done:
			continue
		default:
		}
		a.egresses = nil
		for _, e := range st.Egresses {
			if slices.ContainsFunc(a.ips, func(ip netip.Addr) bool { return slices.Contains(e.Local, ip) }) {
				a.egresses = append(a.egresses, e.Name)
			}
		}
		close(a.done)
	}
	for _, k := range redundant {
		if a := r.ann[k]; a != nil {
			select {
			case <-a.done:
				delete(r.ann, k)
			default:
			}
		}
	}
}
