package datapathsync

import (
	"context"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"time"

	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	toolscache "k8s.io/client-go/tools/cache"
	ctrlcache "sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/event"
)

// serviceCIDRRetry spaces the attempts to ask the API server whether it
// serves ServiceCIDRs: 1 s doubling to 1 min (it may be unreachable when the
// agent starts).
var serviceCIDRRetry = wait.Backoff{Duration: time.Second, Factor: 2, Cap: time.Minute, Steps: math.MaxInt32}

// serviceCIDRRecheck is how often an API server that does not serve
// ServiceCIDRs is asked again (a control-plane upgrade may add them).
const serviceCIDRRecheck = 10 * time.Minute

// watchServiceCIDRs finds the cluster's Service CIDRs for a reconciler
// whose CIDRs.ServiceCIDRs is nil (no --service-cidrs): the
// networking.k8s.io/v1 ServiceCIDR objects (Kubernetes 1.33 and later; the
// API server creates one, "kubernetes", from --service-cluster-ip-range).
// Once discovery shows the resource is served, it starts an informer for it
// (after the manager started, so that the agent starts, and serves its
// report, while the API server is unreachable), marks the reconciler so
// that it reads them, and kicks it on every change. On a cluster without
// the resource it logs once that Service CIDRs must be given with
// --service-cidrs and asks again every serviceCIDRRecheck. It returns nil
// when ctx is done, or the error of starting the informer.
func (r *Reconciler) watchServiceCIDRs(ctx context.Context, dc discovery.DiscoveryInterface, informers ctrlcache.Informers) error {
	b := serviceCIDRRetry
	told := false
	for {
		served, err := serviceCIDRsServed(dc)
		if err == nil && served {
			break
		}
		d := serviceCIDRRecheck
		switch {
		case err != nil:
			d = b.Step()
			r.log.V(1).Info("cannot ask whether ServiceCIDRs are served; retrying", "err", err, "retryIn", d)
		case !told:
			told = true
			r.log.Info("the API server does not serve networking.k8s.io/v1 ServiceCIDR (Kubernetes before 1.33): Service CIDRs are kept off egress paths only when given with --service-cidrs; asking again every 10 min")
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(d):
		}
	}
	inf, err := informers.GetInformer(ctx, &networkingv1.ServiceCIDR{})
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("watch ServiceCIDRs: %w", err)
	}
	kick := func(any) {
		select {
		case r.serviceCIDREvents <- event.GenericEvent{Object: &networkingv1.ServiceCIDR{}}:
		default: // one pending kick is enough: the reconcile lists them all
		}
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    kick,
		UpdateFunc: func(_, n any) { kick(n) },
		DeleteFunc: kick,
	}); err != nil {
		return fmt.Errorf("watch ServiceCIDRs: %w", err)
	}
	r.serviceCIDRsOn.Store(true)
	r.log.Info("keeping the cluster's ServiceCIDRs off egress paths")
	kick(nil)
	<-ctx.Done()
	return nil
}

// serviceCIDRsServed reports whether the API server serves
// networking.k8s.io/v1 servicecidrs. A missing group version is "no"; any
// other discovery failure is an error.
func serviceCIDRsServed(dc discovery.DiscoveryInterface) (bool, error) {
	rl, err := dc.ServerResourcesForGroupVersion(networkingv1.SchemeGroupVersion.String())
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(rl.APIResources, func(r metav1.APIResource) bool { return r.Name == "servicecidrs" }), nil
}

// serviceCIDRPrefixes returns the CIDRs of every ServiceCIDR (spec.cidrs),
// skipping any that do not parse; never nil, so that an empty result still
// means "read, none".
func serviceCIDRPrefixes(l *networkingv1.ServiceCIDRList) []netip.Prefix {
	out := []netip.Prefix{}
	for _, sc := range l.Items {
		for _, c := range sc.Spec.CIDRs {
			if p, err := netip.ParsePrefix(c); err == nil {
				out = append(out, p.Masked())
			}
		}
	}
	return out
}
