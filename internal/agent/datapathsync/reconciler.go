package datapathsync

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent/datapath"
	"github.com/egressip/egressip/internal/agent/hoststack"
	"github.com/egressip/egressip/internal/report"
	"github.com/egressip/egressip/internal/selection"
)

// controllerName names the datapath reconciler in logs and metrics.
const controllerName = "egressip-agent-datapath"

// DefaultResyncPeriod is the period of re-applying an unchanged State when
// Reconciler.ResyncPeriod is 0: 30 s, the binding reconciler's default too
// (agent.DefaultResyncPeriod, --resync-period).
const DefaultResyncPeriod = 30 * time.Second

// Datapath is the engine a Reconciler programs: package datapath's
// *Datapath, or a stand-in in tests.
type Datapath interface {
	// Apply programs the Node from st; applying the same State twice
	// changes nothing.
	Apply(ctx context.Context, st datapath.State) error
	// Counters returns the packets rejected so far per Egress name
	// (failurePolicy Fail); keys starting with "@" are other drop
	// counters and are ignored here.
	Counters(ctx context.Context) (map[string]uint64, error)
}

// HostStackCheck is package hoststack's *Detector, or a stand-in in tests.
type HostStackCheck interface {
	// Detect examines the host devices of the routes to podIPs.
	Detect(podIPs []netip.Addr) (hoststack.Finding, error)
}

// statusOf turns a host stack finding into the report's datapath status.
func statusOf(f hoststack.Finding) *report.DatapathStatus {
	if !f.Bypass {
		msg := fmt.Sprintf("no eBPF bypass of the host stack found (%d Pod devices examined)", f.Devices)
		if len(f.Unexamined) > 0 {
			msg += "; not examined: " + strings.Join(f.Unexamined, ", ")
		}
		return &report.DatapathStatus{Supported: true, Reason: v1alpha1.ReasonHostStack, Message: msg}
	}
	msg := f.Message()
	if len(msg) > report.MaxDatapathMessage {
		msg = msg[:report.MaxDatapathMessage-3] + "..."
	}
	return &report.DatapathStatus{Supported: false, Reason: v1alpha1.ReasonHostStackBypass, Message: msg}
}

// localPodIPs returns the IPs of the Pods running on node, host-network
// Pods excepted.
func localPodIPs(pods []corev1.Pod, node string) []netip.Addr {
	var out []netip.Addr
	for i := range pods {
		p := &pods[i]
		if p.Spec.NodeName != node || p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, pip := range p.Status.PodIPs {
			if ip, err := netip.ParseAddr(pip.IP); err == nil {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out
}

// checkHostStack runs HostCheck and hands a changed finding to OnFinding,
// logging and recording an Event on a change.
func (r *Reconciler) checkHostStack(ctx context.Context, pods []corev1.Pod) {
	if r.HostCheck == nil {
		return
	}
	log := ctrllog.FromContext(ctx)
	f, err := r.HostCheck.Detect(localPodIPs(pods, r.NodeName))
	if err != nil {
		log.Error(err, "check whether Pod traffic crosses the host stack")
		return
	}
	st := statusOf(f)
	r.mu.Lock()
	changed := r.lastFinding == nil || *r.lastFinding != *st
	r.lastFinding = st
	r.mu.Unlock()
	if !changed {
		return
	}
	if st.Supported {
		log.Info("Pod traffic crosses the host stack", "devices", f.Devices)
	} else {
		log.Info("Pod traffic bypasses the host stack: the datapath cannot carry it", "evidence", st.Message)
	}
	if r.OnFinding != nil {
		r.OnFinding(st)
	}
}

// Reconciler computes this Node's datapath State from the cache
// (all Egresses and pools, all Namespaces and Nodes, this Node's Pods, the
// EgressMemberSlices) and applies it to DP when it changed, and again every
// ResyncPeriod to repair hand-made changes. It runs beside the binding
// reconciler (package agent's Agent) in the same manager, whose cache must
// come from agent.DatapathCacheOptions(node) (agent.NewDatapathManager
// builds such a manager).
type Reconciler struct {
	NodeName string
	DP       Datapath
	CIDRs    CIDRs
	// ResyncPeriod is the period of re-applying an unchanged State; 0
	// means DefaultResyncPeriod.
	ResyncPeriod time.Duration
	// HostCheck, when set, is run on every reconcile over the IPs of this
	// Node's Pods (host-network Pods excepted) to find a CNI that bypasses
	// the host's IP stack; its finding goes to OnFinding.
	HostCheck HostStackCheck
	// OnFinding receives each finding of HostCheck (the agent serves it in
	// its report); it is not called when the check fails.
	OnFinding func(*report.DatapathStatus)
	// OnRefused receives, after every Apply that programmed the Node, the
	// Egresses whose part the engine refused (empty when none; the agent
	// serves them in its report, and the controller turns them not Ready).
	OnRefused func([]report.RefusedEgress)
	// PoolRoutes, when set, routes the egress IPs held here by their
	// pool's network after every reconcile (poolrouting.go).
	PoolRoutes *PoolRouting

	reader client.Reader
	log    logr.Logger
	// serviceCIDRsOn is set once the ServiceCIDR informer runs (see
	// watchServiceCIDRs); serviceCIDREvents kicks a reconcile on changes.
	serviceCIDRsOn    atomic.Bool
	serviceCIDREvents chan event.GenericEvent

	// ann holds the Pods the egressip-cni plugin announced (PodAdded) and
	// annEvents kicks a reconcile for them.
	annMu     sync.Mutex
	ann       map[types.NamespacedName]*announcement
	annEvents chan event.GenericEvent

	mu          sync.Mutex
	last        *datapath.State
	lastApply   time.Time
	lastFinding *report.DatapathStatus
	lastRefused []report.RefusedEgress
}

// drainRecheck is the period of re-applying an unchanged State while the
// engine drains flows of members that left an Egress.
const drainRecheck = 5 * time.Second

// drainer is implemented by engines that keep flows on an Egress's path
// after their member left it (package datapath's Draining).
type drainer interface{ Draining() int }

// draining reports whether the engine has drains in progress.
func (r *Reconciler) draining() bool {
	d, ok := r.DP.(drainer)
	return ok && d.Draining() > 0
}

func (r *Reconciler) lastApplyTime() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastApply
}

func (r *Reconciler) lastNames() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		return nil
	}
	out := make([]string, 0, len(r.last.Egresses))
	for _, e := range r.last.Egresses {
		out = append(out, e.Name)
	}
	return out
}

// Applied returns the last State applied successfully, and whether there
// is one.
func (r *Reconciler) Applied() (datapath.State, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.last == nil {
		return datapath.State{}, false
	}
	return *r.last, true
}

// Reconcile computes the State and applies it when it differs from the
// last one applied or the last apply is older than ResyncPeriod. It changes
// nothing and returns an error when the cache cannot be read; it returns
// the engine's error when Apply fails (retried with backoff).
func (r *Reconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	log := ctrllog.FromContext(ctx)
	resync := r.ResyncPeriod
	if resync <= 0 {
		resync = DefaultResyncPeriod
	}
	in := stateInput{Node: r.NodeName, CIDRs: r.CIDRs}
	if in.CIDRs.ServiceCIDRs == nil && r.serviceCIDRsOn.Load() {
		var scs networkingv1.ServiceCIDRList
		if err := r.reader.List(ctx, &scs); err != nil {
			return reconcile.Result{}, fmt.Errorf("list ServiceCIDRs: %w", err)
		}
		in.CIDRs.ServiceCIDRs = serviceCIDRPrefixes(&scs)
	}
	var (
		egs   v1alpha1.EgressList
		pools v1alpha1.ExternalIPPoolList
		nss   corev1.NamespaceList
		pods  corev1.PodList
		sls   v1alpha1.EgressMemberSliceList
		nodes corev1.NodeList
	)
	for _, l := range []struct {
		what string
		list client.ObjectList
	}{{"Egresses", &egs}, {"ExternalIPPools", &pools}, {"Namespaces", &nss}, {"Pods", &pods}, {"EgressMemberSlices", &sls}, {"Nodes", &nodes}} {
		if err := r.reader.List(ctx, l.list); err != nil {
			return reconcile.Result{}, fmt.Errorf("list %s: %w", l.what, err)
		}
	}
	r.checkHostStack(ctx, pods.Items)
	// Pods the CNI plugin announced are classified with the IPs it gave,
	// before their status shows them (docs/datapath.md, "Pod start").
	covered, redundant := overlayAnnounced(pods.Items, r.snapshotAnnounced())
	in.Egresses, in.Pools, in.Namespaces, in.Pods, in.Slices, in.Nodes = egs.Items, pools.Items, nss.Items, pods.Items, sls.Items, nodes.Items
	st := computeState(in)

	// While flows drain (a member left its Egress with open flows), the
	// State is applied again every drainRecheck so that the drains that
	// are over end and release their routes.
	if r.draining() {
		resync = min(resync, drainRecheck)
	}
	r.mu.Lock()
	same := r.last != nil && stateEqual(*r.last, st) && time.Since(r.lastApply) < resync
	r.mu.Unlock()
	if same {
		r.resolveAnnounced(st, covered, redundant)
		if r.PoolRoutes != nil && r.PoolRoutes.Sync(ctx, st, egs.Items, pools.Items) {
			return reconcile.Result{RequeueAfter: poolRecheck}, nil
		}
		return reconcile.Result{RequeueAfter: resync - time.Since(r.lastApplyTime())}, nil
	}
	start := time.Now()
	if r.PoolRoutes != nil {
		r.PoolRoutes.SetInputs(egs.Items, pools.Items)
	}
	err := r.DP.Apply(ctx, st)
	refused, partial := errors.AsType[*datapath.RefusedError](err)
	if err != nil && (!partial || errors.Is(err, datapath.ErrTooManyEgresses)) {
		datapathApplies.WithLabelValues("error").Inc()
		return reconcile.Result{}, fmt.Errorf("apply the datapath of node %s: %w", r.NodeName, err)
	}
	// Applied; refused Egresses are the engine's verdict on them, not a
	// failure of the Node's datapath: they are reported and stay out until
	// they change (a retry of the same State would be refused again).
	r.publishRefused(ctx, refused)
	if partial {
		datapathApplies.WithLabelValues("partial").Inc()
	} else {
		datapathApplies.WithLabelValues("ok").Inc()
	}
	r.resolveAnnounced(st, covered, redundant)
	if r.draining() {
		resync = min(resync, drainRecheck)
	}
	if r.PoolRoutes != nil && r.PoolRoutes.Sync(ctx, st, egs.Items, pools.Items) {
		resync = min(resync, poolRecheck)
	}
	r.mu.Lock()
	changed := r.last == nil || !stateEqual(*r.last, st)
	r.last, r.lastApply = &st, time.Now()
	r.mu.Unlock()
	if changed {
		roles := map[string]int{}
		for _, e := range st.Egresses {
			roles[roleName(e.Role)]++
		}
		log.Info("datapath applied", "egresses", len(st.Egresses), "roles", roles, "nodeIPs", len(st.NodeIPs), "clusterCIDRs", len(st.ClusterCIDRs), "duration", time.Since(start))
	}
	return reconcile.Result{RequeueAfter: resync}, nil
}

// publishRefused logs every refused Egress (by name, once per change of its
// message) and hands the list, sorted and bounded as the report wants it,
// to OnRefused; a nil ref clears it.
func (r *Reconciler) publishRefused(ctx context.Context, ref *datapath.RefusedError) {
	var out []report.RefusedEgress
	if ref != nil {
		for n, e := range ref.Egresses {
			msg := e.Error()
			if len(msg) > report.MaxRefusedMessage {
				msg = msg[:report.MaxRefusedMessage-3] + "..."
			}
			out = append(out, report.RefusedEgress{Egress: n, Message: msg})
		}
	}
	slices.SortFunc(out, func(a, b report.RefusedEgress) int { return strings.Compare(a.Egress, b.Egress) })
	if len(out) > report.MaxRefusedEgresses {
		out = out[:report.MaxRefusedEgresses]
	}
	r.mu.Lock()
	prev := r.lastRefused
	r.lastRefused = out
	r.mu.Unlock()
	if slices.Equal(prev, out) {
		return
	}
	log := ctrllog.FromContext(ctx)
	for _, x := range out {
		if !slices.Contains(prev, x) {
			log.Error(errors.New(x.Message), "this Node's kernel refuses the Egress's datapath; the other Egresses are programmed", "egress", klog.KRef("", x.Egress))
		}
	}
	if r.OnRefused != nil {
		r.OnRefused(out)
	}
}

func roleName(r datapath.Role) string {
	switch r {
	case datapath.RoleSource:
		return "source"
	case datapath.RoleEgress:
		return "egress"
	case datapath.RoleFailed:
		return "failed"
	}
	return "none"
}

// nodeAddrChanged reports whether a Node update can change the State:
// addresses, Pod CIDRs, or its creation/deletion (heartbeats do not).
func nodeAddrChanged(o, n *corev1.Node) bool {
	return !equality.Semantic.DeepEqual(o.Status.Addresses, n.Status.Addresses) || !equality.Semantic.DeepEqual(o.Spec.PodCIDRs, n.Spec.PodCIDRs)
}

// SetupWithManager registers the reconciler with mgr (built by
// agent.NewDatapathManager, as agent.Run does when RunOptions.Datapath is
// set). Every watched event maps to one work key, so changes coalesce into
// one State computation. Like the binding
// reconciler it never runs before the cache's first List of every watched
// kind.
func (r *Reconciler) SetupWithManager(mgr manager.Manager) error {
	if r.DP == nil || r.NodeName == "" {
		return errors.New("datapath reconciler: no engine or no node name")
	}
	r.reader = mgr.GetCache()
	r.log = mgr.GetLogger().WithName("datapath").WithValues("node", klog.KRef("", r.NodeName))
	rejected.mu.Lock()
	rejected.r = r
	rejected.mu.Unlock()

	key := reconcile.Request{NamespacedName: types.NamespacedName{Name: r.NodeName}}
	toKey := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{key}
	})
	kick := source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		q.Add(key)
		return nil
	})
	nodes := builder.WithPredicates(predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
		o, ok1 := e.ObjectOld.(*corev1.Node)
		n, ok2 := e.ObjectNew.(*corev1.Node)
		return !ok1 || !ok2 || nodeAddrChanged(o, n)
	}})
	r.serviceCIDREvents = make(chan event.GenericEvent, 1)
	r.annMu.Lock()
	r.annEvents = make(chan event.GenericEvent, 1)
	r.annMu.Unlock()
	if r.CIDRs.ServiceCIDRs == nil {
		// A bounded request: discovery calls take no context.
		dcfg := rest.CopyConfig(mgr.GetConfig())
		dcfg.Timeout = 10 * time.Second
		dc, err := discovery.NewDiscoveryClientForConfig(dcfg)
		if err != nil {
			return fmt.Errorf("datapath reconciler: discovery client: %w", err)
		}
		if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
			return r.watchServiceCIDRs(ctx, dc, mgr.GetCache())
		})); err != nil {
			return fmt.Errorf("datapath reconciler: add the ServiceCIDR watch: %w", err)
		}
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(controllerName).
		WatchesRawSource(source.Channel(r.serviceCIDREvents, toKey)).
		WatchesRawSource(source.Channel(r.annEvents, toKey)).
		Watches(&v1alpha1.Egress{}, toKey).
		Watches(&v1alpha1.ExternalIPPool{}, toKey).
		Watches(&v1alpha1.EgressMemberSlice{}, toKey).
		Watches(&corev1.Namespace{}, toKey, builder.WithPredicates(predicate.LabelChangedPredicate{})).
		Watches(&corev1.Pod{}, toKey, builder.WithPredicates(predicate.Funcs{UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*corev1.Pod)
			n, ok2 := e.ObjectNew.(*corev1.Pod)
			return !ok1 || !ok2 || selection.PodChanged(o, n)
		}})).
		Watches(&corev1.Node{}, toKey, nodes).
		WatchesRawSource(kick).
		WithOptions(controller.Options{
			MaxConcurrentReconciles: 1,
			RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](
				100*time.Millisecond, cmpDuration(r.ResyncPeriod, DefaultResyncPeriod)),
			SkipNameValidation: new(true),
			CacheSyncTimeout:   100 * 365 * 24 * time.Hour,
		}).
		WithLogConstructor(func(*reconcile.Request) logr.Logger {
			return mgr.GetLogger().WithValues("controller", controllerName, "node", klog.KRef("", r.NodeName))
		}).
		Complete(r)
}

func cmpDuration(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}
