package controller

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/selection"
)

// membersKey is the single work item of the member publication: every Pod,
// Namespace, Egress, pool or slice event coalesces into one pending pass.
var membersKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: "egressip-member-slices"}}

// CacheOptions are the controller manager's cache options: Pods are cached
// through selection.StripPod and every object without its managedFields.
func CacheOptions() cache.Options {
	return cache.Options{
		ByObject:         map[client.Object]cache.ByObject{&corev1.Pod{}: {Transform: selection.StripPod}},
		DefaultTransform: cache.TransformStripManagedFields(),
	}
}

// MembersReconciler publishes, for every Egress, the Pods that use it
// (package selection) in EgressMemberSlices of at most MaxPerSlice members,
// writing only slices whose content changed.
type MembersReconciler struct {
	Client client.Client
	// MaxPerSlice is the largest number of members per slice; 0 means
	// v1.MaxMembersPerSlice.
	MaxPerSlice int
	// Selected, when set, receives each pass's status.selectedPods and
	// status.shadowedBy for the scheduling pass to write (selectedBoard);
	// nil: this reconciler patches them itself (writeSelected).
	Selected *selectedBoard
}

// Reconcile runs one publication pass over every Egress. It returns an
// error (and is retried with backoff) when the cache cannot be read or a
// write failed for another reason than a stale cache.
func (r *MembersReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	start := time.Now()
	logger := log.FromContext(ctx)
	var (
		egs   v1.EgressList
		pools v1.ExternalIPPoolList
		nss   corev1.NamespaceList
		pods  corev1.PodList
		sls   v1.EgressMemberSliceList
	)
	for _, l := range []struct {
		what string
		list client.ObjectList
	}{{"Egresses", &egs}, {"ExternalIPPools", &pools}, {"Namespaces", &nss}, {"Pods", &pods}, {"EgressMemberSlices", &sls}} {
		if err := r.Client.List(ctx, l.list); err != nil {
			return reconcile.Result{}, fmt.Errorf("list %s: %w", l.what, err)
		}
	}
	poolByName := make(map[string]*v1.ExternalIPPool, len(pools.Items))
	for i := range pools.Items {
		poolByName[pools.Items[i].Name] = &pools.Items[i]
	}
	sel := selection.Select(selection.Input{
		Egresses: egs.Items, Namespaces: nss.Items, Pods: pods.Items,
		Family: func(e *v1.Egress) selection.Family { return selection.EgressFamily(e, poolByName) },
	})
	for name, err := range sel.Invalid {
		logger.V(1).Info("Egress selects no Pod: invalid selector", "egress", klog.KRef("", name), "err", err)
	}

	max := cmp.Or(r.MaxPerSlice, v1.MaxMembersPerSlice)
	byEgress := map[string][]*v1.EgressMemberSlice{}
	for i := range sls.Items {
		s := &sls.Items[i]
		byEgress[s.Egress] = append(byEgress[s.Egress], s)
	}
	var errs []error
	writes := 0
	var counts map[string]selectedEntry
	if r.Selected != nil {
		counts = make(map[string]selectedEntry, len(egs.Items))
	}
	// Slices of Egresses that are gone: the garbage collector removes them
	// where kube-controller-manager runs; deleting them here also covers
	// control planes without one and ends stale members sooner.
	live := make(map[string]bool, len(egs.Items))
	for i := range egs.Items {
		live[egs.Items[i].Name] = true
	}
	for name, ss := range byEgress {
		if live[name] {
			continue
		}
		for _, s := range ss {
			errs = append(errs, r.write(ctx, "delete", s, func() error { return r.Client.Delete(ctx, s, client.Preconditions{UID: &s.UID}) }))
			writes++
		}
	}
	for i := range egs.Items {
		e := &egs.Items[i]
		var existing []sliceContent
		objs := map[string]*v1.EgressMemberSlice{}
		for _, s := range byEgress[e.Name] {
			if !ownedBy(s, e) {
				// Left by an earlier Egress of the same name; the garbage
				// collector would remove it too, but it must not be read
				// as this Egress's members meanwhile.
				errs = append(errs, r.write(ctx, "delete", s, func() error { return r.Client.Delete(ctx, s, client.Preconditions{UID: &s.UID}) }))
				writes++
				continue
			}
			objs[s.Name] = s
			existing = append(existing, sliceContent{Name: s.Name, Members: s.Members})
		}
		var want []v1.EgressMember
		for _, m := range sel.Members[e.Name] {
			if !m.HostIP.IsValid() {
				continue // no Node IP of the family to tunnel replies to
			}
			want = append(want, v1.EgressMember{PodIP: m.PodIP.String(), HostIP: m.HostIP.String()})
		}
		if e.DeletionTimestamp != nil {
			continue // going away: the garbage collector removes its slices
		}
		if counts != nil {
			counts[e.Name] = selectedEntry{uid: e.UID, st: selectedOf(e.Name, sel)}
		} else {
			errs = append(errs, r.writeSelected(ctx, e, selectedOf(e.Name, sel)))
		}
		ch := packSlices(e.Name, existing, want, max)
		for _, c := range ch.Create {
			s := &v1.EgressMemberSlice{
				ObjectMeta: metav1.ObjectMeta{Name: c.Name, OwnerReferences: []metav1.OwnerReference{{
					APIVersion: v1.GroupVersion.String(), Kind: kindEgress, Name: e.Name, UID: e.UID, Controller: new(true),
				}}},
				Egress:  e.Name,
				Members: c.Members,
			}
			if l := e.Name; len(validation.IsValidLabelValue(l)) == 0 {
				s.Labels = map[string]string{v1.EgressLabel: l}
			}
			errs = append(errs, r.write(ctx, "create", s, func() error { return r.Client.Create(ctx, s) }))
		}
		for _, c := range ch.Update {
			s := objs[c.Name].DeepCopy()
			s.Members = c.Members
			errs = append(errs, r.write(ctx, "update", s, func() error { return r.Client.Update(ctx, s) }))
		}
		for _, name := range ch.Delete {
			s := objs[name]
			errs = append(errs, r.write(ctx, "delete", s, func() error {
				return r.Client.Delete(ctx, s, client.Preconditions{ResourceVersion: &s.ResourceVersion})
			}))
		}
		writes += len(ch.Create) + len(ch.Update) + len(ch.Delete)
	}
	if counts != nil {
		r.Selected.publish(counts)
	}
	if err := errors.Join(errs...); err != nil {
		return reconcile.Result{}, err
	}
	logger.V(1).Info("member slices published", "egresses", len(egs.Items), "pods", len(pods.Items), "writes", writes, "duration", time.Since(start))
	return reconcile.Result{}, nil
}

// write runs do, counts it and returns its error unless the cache was
// merely behind (conflict, already exists, not found): the watch event
// that follows brings a new pass.
func (r *MembersReconciler) write(ctx context.Context, op string, s *v1.EgressMemberSlice, do func() error) error {
	err := do()
	switch {
	case err == nil:
		sliceWrites.WithLabelValues(op, resultOK).Inc()
		log.FromContext(ctx).V(1).Info("member slice written", "op", op, "slice", klog.KObj(s), "members", len(s.Members))
		return nil
	case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) || apierrors.IsNotFound(err):
		sliceWrites.WithLabelValues(op, resultConflict).Inc()
		return nil
	default:
		sliceWrites.WithLabelValues(op, resultError).Inc()
		return fmt.Errorf("%s EgressMemberSlice %s: %w", op, s.Name, err)
	}
}

func ownedBy(s *v1.EgressMemberSlice, e *v1.Egress) bool {
	for _, o := range s.OwnerReferences {
		if o.Kind == kindEgress && o.UID == e.UID {
			return true
		}
	}
	return false
}

// sliceContent is one slice as packSlices sees it.
type sliceContent struct {
	Name    string
	Members []v1.EgressMember
}

// sliceChanges are the writes packSlices asks for.
type sliceChanges struct {
	Create, Update []sliceContent
	Delete         []string
}

// packSlices decides how the members of Egress egress are spread over its
// slices, moving as little as possible, as the EndpointSlice controller
// does: a member stays in the slice that holds it (its hostIP updated in
// place); members that left are removed from their slice; new members fill
// the existing slices with room (by name), then new slices named
// sliceName(egress, k) for the lowest unused k; a slice left empty is
// deleted. So a change to one Pod rewrites one slice. Members of each slice
// are sorted by podIP. Only slices whose content changes are returned.
func packSlices(egress string, existing []sliceContent, want []v1.EgressMember, max int) sliceChanges {
	wantBy := make(map[string]v1.EgressMember, len(want))
	for _, m := range want {
		wantBy[m.PodIP] = m
	}
	existing = slices.Clone(existing)
	slices.SortFunc(existing, func(a, b sliceContent) int { return strings.Compare(a.Name, b.Name) })

	placed := map[string]bool{}
	type work struct {
		sliceContent
		dirty bool
	}
	ws := make([]*work, 0, len(existing))
	used := map[string]bool{}
	for _, s := range existing {
		used[s.Name] = true
		w := &work{sliceContent: sliceContent{Name: s.Name}}
		for _, m := range s.Members {
			nm, ok := wantBy[m.PodIP]
			if !ok || placed[m.PodIP] || len(w.Members) >= max {
				w.dirty = true
				continue
			}
			placed[m.PodIP] = true
			if nm != m {
				w.dirty = true
			}
			w.Members = append(w.Members, nm)
		}
		ws = append(ws, w)
	}
	var fresh []v1.EgressMember
	for _, m := range want {
		if !placed[m.PodIP] {
			placed[m.PodIP] = true
			fresh = append(fresh, m)
		}
	}
	slices.SortFunc(fresh, func(a, b v1.EgressMember) int { return strings.Compare(a.PodIP, b.PodIP) })
	for _, w := range ws {
		for len(fresh) > 0 && len(w.Members) < max {
			w.Members = append(w.Members, fresh[0])
			fresh = fresh[1:]
			w.dirty = true
		}
	}
	var ch sliceChanges
	for _, w := range ws {
		switch {
		case len(w.Members) == 0:
			ch.Delete = append(ch.Delete, w.Name)
		case w.dirty:
			slices.SortFunc(w.Members, func(a, b v1.EgressMember) int { return strings.Compare(a.PodIP, b.PodIP) })
			ch.Update = append(ch.Update, w.sliceContent)
		}
	}
	for k := 0; len(fresh) > 0; k++ {
		name := sliceName(egress, k)
		if used[name] {
			continue
		}
		n := min(max, len(fresh))
		ch.Create = append(ch.Create, sliceContent{Name: name, Members: slices.Clone(fresh[:n])})
		fresh = fresh[n:]
	}
	return ch
}

// sliceName is the name of slice k of Egress egress: "<egress>-<k>", or,
// when that would exceed 253 characters, the first 200 characters of the
// name, a hash of the whole name and k. Deterministic names make a create
// repeated from a stale cache fail with AlreadyExists instead of leaving a
// duplicate.
func sliceName(egress string, k int) string {
	suffix := "-" + strconv.Itoa(k)
	if len(egress)+len(suffix) <= validation.DNS1123SubdomainMaxLength {
		return egress + suffix
	}
	h := sha256.Sum256([]byte(egress))
	return strings.TrimRight(egress[:200], ".-") + "-" + hex.EncodeToString(h[:6]) + suffix
}

// memberInputChanged reports whether an Egress update changes what the
// publication reads of it: its spec (the generation), its deletion, or
// the addresses of its status (status.egressIP and status.ips decide its
// family, selection.EgressFamily).
func memberInputChanged(o, n *v1.Egress) bool {
	if o.Generation != n.Generation || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil) || o.Status.EgressIP != n.Status.EgressIP ||
		len(o.Status.IPs) != len(n.Status.IPs) {
		return true
	}
	for i := range o.Status.IPs {
		if o.Status.IPs[i].IP != n.Status.IPs[i].IP {
			return true
		}
	}
	return false
}

// SetupWithManager registers the publication with mgr (runs on the
// elected leader only, like every controller of the manager).
func (r *MembersReconciler) SetupWithManager(mgr ctrl.Manager) error {
	toPass := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{membersKey}
	})
	pods := builder.WithPredicates(predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*corev1.Pod)
		n, ok2 := e.ObjectNew.(*corev1.Pod)
		return !ok1 || !ok2 || selection.PodChanged(o, n)
	}})
	labelsOnly := builder.WithPredicates(predicate.LabelChangedPredicate{})
	var egresses []builder.WatchesOption
	if r.Selected != nil {
		// The scheduling pass writes the counts: a status update matters
		// only when it changes what selection reads. Without this, each
		// of the pass's patches (hundreds a second in a failover) would
		// bring a publication over every Egress, taking CPU from the pass
		// and the API server.
		egresses = append(egresses, builder.WithPredicates(predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*v1.Egress)
			n, ok2 := e.ObjectNew.(*v1.Egress)
			return !ok1 || !ok2 || memberInputChanged(o, n)
		}}))
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("egressip-member-slices").
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Watches(&v1.Egress{}, toPass, egresses...).
		Watches(&v1.ExternalIPPool{}, toPass, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&v1.EgressMemberSlice{}, toPass).
		Watches(&corev1.Namespace{}, toPass, labelsOnly).
		Watches(&corev1.Pod{}, toPass, pods).
		Complete(r)
}
