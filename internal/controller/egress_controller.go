// Package controller holds egressip-controller's reconcilers: one scheduling
// pass over every Egress (allocation, placement, status) and the liveness
// poller that tells the pass which agents are alive and what they have bound.
package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/report"
	"github.com/egressip/egressip/internal/scheduler"
)

// passKey is the single work item: every trigger (Egress, pool, Node,
// agent liveness) is coalesced into one pending pass.
var passKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: "egressip-scheduling-pass"}}

// Label names and values several of the controller's metrics share.
const (
	labelResult    = "result"
	labelPool      = "pool"
	resultOK       = "ok"
	resultConflict = "conflict"
	resultError    = "error"

	kindEgress         = "Egress"
	kindExternalIPPool = "ExternalIPPool"
)

var (
	passDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "egressip_controller_schedule_pass_duration_seconds",
		Help:    "Duration of one scheduling pass (read cache, allocate, schedule, write changed statuses), in seconds.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
	})
	movesTotal = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "egressip_controller_moves_total",
		Help: "Egress IPs that left a Node, by reason (NodeRemoved, NodeIneligible/<why>, NodeNotInPool, CapacityReduced, ...).",
	}, []string{"reason"})
	unplacedEgresses = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "egressip_controller_unplaced_egresses",
		Help: "Egresses without an egress Node after the last pass, by reason.",
	}, []string{"reason"})
	statusWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "egressip_controller_status_writes_total",
		Help: "Status patches issued, by kind (Egress, ExternalIPPool) and result (ok, conflict, error).",
	}, []string{"kind", labelResult})
	invalidCapacity = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "egressip_controller_invalid_capacity_annotations",
		Help: "Nodes whose egressip.io/max-egress-ips annotation is invalid (the default capacity applies).",
	})
	conflictEgresses = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "egressip_controller_ip_conflicts",
		Help: "Egresses whose condition Conflict is True after the last pass: the agent of the egress Node sees another host answer for the egress IP.",
	})
	conflictEvents = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "egressip_controller_ip_conflict_events_total",
		Help: "DuplicateIP Warning Events recorded on Egresses (a conflict started, or the other MACs changed).",
	})
)

func init() {
	metrics.Registry.MustRegister(passDuration, movesTotal, unplacedEgresses, statusWrites, invalidCapacity, conflictEgresses, conflictEvents)
	// Start the common series at zero so dashboards see them before the
	// first move or write.
	for _, r := range []string{scheduler.MoveNodeRemoved, scheduler.MoveNodeIneligible, scheduler.MoveNodeNotInPool, scheduler.MoveCapacityReduced} {
		movesTotal.WithLabelValues(r)
	}
	for _, k := range []string{kindEgress, kindExternalIPPool} {
		for _, res := range []string{resultOK, resultConflict, resultError} {
			statusWrites.WithLabelValues(k, res)
		}
	}
}

// PassReconciler runs the scheduling pass.
type PassReconciler struct {
	Client   client.Client
	Recorder recorder.EventRecorder
	Liveness *Liveness
	Config   PassConfig
	// Cloud serves cloud-backed pools; nil without a cloud provider.
	Cloud *Cloud
	// WriteParallelism bounds concurrent status patches. Default 16.
	WriteParallelism int
	// APIReader reads the API server without the cache (consistent
	// reads). The first pass as leader, and the first after a status
	// write whose outcome is unknown, wait until the cache shows every
	// Egress at least as new as a read through it: another replica, or
	// this one, may have written statuses the cache does not show yet.
	// Nil skips that wait (tests of the pass alone).
	APIReader client.Reader

	reportedInvalid map[string]string
	// written holds the Egresses this controller wrote and the cache does
	// not show yet; the next pass reads them instead (writeLedger).
	written writeLedger
	// synced is set once the cache has caught up with a consistent read
	// (see APIReader); cleared by a write with an unknown outcome.
	synced bool
	// live is the consistent read the cache must catch up with.
	live []v1.Egress
	// releaseSince holds when each release the pass waits for began
	// (passInput.ReleaseSince); the pass worker alone uses it.
	releaseSince map[releaseKey]time.Time
	// beforePass, when set (tests only), runs at the start of every pass
	// with the cache the pass reads, so a test can hold passes while it
	// makes several changes that one pass must see together.
	beforePass func(context.Context, client.Reader)
}

// Reconcile runs one pass. It returns an error (and is retried with backoff)
// when it cannot read the cache or some status writes failed; the writes
// that succeeded stay.
func (r *PassReconciler) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	start := time.Now()
	defer func() { passDuration.Observe(time.Since(start).Seconds()) }()
	logger := log.FromContext(ctx)
	if r.beforePass != nil {
		r.beforePass(ctx, r.Client)
	}

	var (
		pools v1.ExternalIPPoolList
		egs   v1.EgressList
		nodes corev1.NodeList
	)
	if err := r.Client.List(ctx, &pools); err != nil {
		return reconcile.Result{}, fmt.Errorf("list ExternalIPPools: %w", err)
	}
	if err := r.Client.List(ctx, &egs); err != nil {
		return reconcile.Result{}, fmt.Errorf("list Egresses: %w", err)
	}
	if err := r.Client.List(ctx, &nodes); err != nil {
		return reconcile.Result{}, fmt.Errorf("list Nodes: %w", err)
	}
	if wait, err := r.readYourWrites(ctx, egs.Items); err != nil || wait {
		return reconcile.Result{RequeueAfter: cacheWait}, err
	}
	in := passInput{Pools: pools.Items, Egresses: egs.Items, Nodes: nodes.Items, Agents: r.Liveness.State, Config: r.Config,
		Now: start, ReleaseSince: func(k releaseKey) time.Time { return r.releaseSince[k] }}
	var result reconcile.Result
	if r.Cloud != nil {
		if !r.Cloud.Ready() {
			// Without the cloud's view a pass would take every cloud
			// address for detached; wait for the first read.
			return reconcile.Result{RequeueAfter: 200 * time.Millisecond}, nil
		}
		in.Cloud = r.Cloud.input(start)
	}
	out := plan(in)
	if out.Cloud != nil {
		r.Cloud.remember(out.Cloud, start)
		r.Cloud.Run(ctx, out.Cloud)
		setPoolMetrics(out.Cloud)
		result.RequeueAfter = minPositive(out.Cloud.Recheck, r.Cloud.nextBackoff(time.Now()))
	}

	result.RequeueAfter = minPositive(result.RequeueAfter, r.trackReleases(out.Waits, start))
	r.reportCapacity(ctx, nodes.Items, out.InvalidCapacity)
	for _, n := range out.Awaited {
		r.Liveness.Expedite(n)
	}
	unplacedEgresses.Reset()
	for _, reason := range []string{scheduler.ReasonNoEligibleNode, scheduler.ReasonCapacityExhausted, ReasonNotAssigned} {
		unplacedEgresses.WithLabelValues(reason).Set(0)
	}
	for reason, n := range out.Unplaced {
		unplacedEgresses.WithLabelValues(reason).Set(float64(n))
	}
	conflictEgresses.Set(float64(out.Conflicts))

	type write struct {
		obj client.Object
		do  func(context.Context) error
	}
	var writes []write
	written := make([]*v1.Egress, len(egs.Items)) // what each successful patch returned
	patched := make([]bool, len(egs.Items))       // a patch was attempted
	for i := range egs.Items {
		e := &egs.Items[i]
		ch, ok := out.Egresses[e.Name]
		if !ok || equality.Semantic.DeepEqual(e.Status, ch.Status) {
			continue
		}
		patched[i] = true
		writes = append(writes, write{obj: e, do: func(ctx context.Context) error {
			patch := client.MergeFromWithOptions(e.DeepCopy(), client.MergeFromWithOptimisticLock{})
			e.Status = ch.Status
			if err := r.Client.Status().Patch(ctx, e, patch); err != nil {
				return err
			}
			written[i] = e.DeepCopy()
			if ch.EventReason != "" {
				r.Recorder.Eventf(e, nil, ch.EventType, ch.EventReason, "Schedule", "%s", ch.EventNote)
			}
			if ch.IPChangedNote != "" {
				r.Recorder.Eventf(e, nil, corev1.EventTypeWarning, EventEgressIPChanged, "Allocate", "%s", ch.IPChangedNote)
			}
			if ch.SelectorEvent != "" {
				r.Recorder.Eventf(e, nil, corev1.EventTypeWarning, ReasonInvalidSelector, "Select", "%s", ch.SelectorEvent)
			}
			if ch.ConflictEvent != "" {
				r.Recorder.Eventf(e, nil, corev1.EventTypeWarning, v1.ReasonDuplicateIP, "Probe", "%s", ch.ConflictEvent)
				conflictEvents.Inc()
			}
			if ch.MoveReason != "" {
				movesTotal.WithLabelValues(ch.MoveReason).Inc()
			}
			return nil
		}})
	}
	for i := range pools.Items {
		p := &pools.Items[i]
		if want := out.Finalize[p.Name]; want != controllerutil.ContainsFinalizer(p, PoolFinalizer) {
			writes = append(writes, write{obj: p, do: func(ctx context.Context) error {
				patch := client.MergeFromWithOptions(p.DeepCopy(), client.MergeFromWithOptimisticLock{})
				if want {
					controllerutil.AddFinalizer(p, PoolFinalizer)
				} else {
					controllerutil.RemoveFinalizer(p, PoolFinalizer)
				}
				return r.Client.Patch(ctx, p, patch)
			}})
			continue // the status follows in the pass this patch triggers
		}
		st := out.Pools[p.Name]
		if equality.Semantic.DeepEqual(p.Status, st) {
			continue
		}
		writes = append(writes, write{obj: p, do: func(ctx context.Context) error {
			patch := client.MergeFromWithOptions(p.DeepCopy(), client.MergeFromWithOptimisticLock{})
			p.Status = st
			return r.Client.Status().Patch(ctx, p, patch)
		}})
	}

	errs := make([]error, len(writes))
	var unknown atomic.Bool
	par := r.WriteParallelism
	if par <= 0 {
		par = 16
	}
	workqueue.ParallelizeUntil(ctx, par, len(writes), func(i int) {
		w := writes[i]
		kind := kindEgress
		if _, ok := w.obj.(*v1.ExternalIPPool); ok {
			kind = kindExternalIPPool
		}
		err := w.do(ctx)
		switch {
		case err == nil:
			statusWrites.WithLabelValues(kind, resultOK).Inc()
		case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
			// The cache is behind; the watch event that follows brings a
			// new pass with fresh objects.
			statusWrites.WithLabelValues(kind, resultConflict).Inc()
		default:
			statusWrites.WithLabelValues(kind, resultError).Inc()
			errs[i] = fmt.Errorf("patch status of %s %s: %w", kind, w.obj.GetName(), err)
			if kind == kindEgress {
				unknown.Store(true) // it may have been applied all the same
			}
		}
	})
	for _, e := range written {
		if e != nil {
			r.written.record(e)
		}
	}
	// What the API server holds now, as far as this pass knows: the
	// Egresses it wrote as returned, the others as read (a failed patch
	// leaves its Egress out: its state is unknown).
	final := make([]*v1.Egress, 0, len(egs.Items))
	for i := range egs.Items {
		switch {
		case written[i] != nil:
			final = append(final, written[i])
		case !patched[i]:
			final = append(final, &egs.Items[i])
		}
	}
	r.Liveness.SetReleases(releaseInstructions(final, nodes.Items, r.Liveness.State))
	if unknown.Load() {
		r.synced = false
	}
	if err := errors.Join(errs...); err != nil {
		return reconcile.Result{}, err
	}
	logger.V(1).Info("scheduling pass done", "egresses", len(egs.Items), "nodes", len(nodes.Items), "writes", len(writes), "duration", time.Since(start))
	return result, nil
}

// trackReleases keeps when each wait of waits began (now for new ones) and
// forgets the others; it returns how soon the first of them reaches the
// release timeout (0: none), so that a pass runs then.
func (r *PassReconciler) trackReleases(waits []releaseKey, now time.Time) time.Duration {
	next := make(map[releaseKey]time.Time, len(waits))
	var soonest time.Duration
	for _, k := range waits {
		since, ok := r.releaseSince[k]
		if !ok {
			since = now
		}
		next[k] = since
		if t := r.Config.ReleaseTimeout; t > 0 {
			// At least 10 ms: a wait that just expired is decided by the
			// pass that runs then.
			soonest = minPositive(soonest, max(since.Add(t).Sub(now), 10*time.Millisecond))
		}
	}
	r.releaseSince = next
	return soonest
}

// releaseInstructions returns, per Node, what its polls tell it to release:
// every IP its alive agent reports bound that no Egress of egs assigns to
// that Node, once for each Egress whose status.egressIP it is (with that
// Egress's UID and resource version, so that the agent can tell its own
// cache's copy is older). IPs no Egress holds are not named (the agent's
// cache, once it catches up, removes them). Each Node's list is sorted by
// IP, then Egress name, and holds at most report.MaxReleases entries.
func releaseInstructions(egs []*v1.Egress, nodes []corev1.Node, agents func(string) AgentState) map[string][]report.Release {
	byIP := map[netip.Addr][]*v1.Egress{}
	assigned := map[releaseKey]bool{}
	for _, e := range egs {
		ip, err := netip.ParseAddr(e.Status.EgressIP)
		if err != nil {
			continue
		}
		byIP[ip] = append(byIP[ip], e)
		if e.Status.EgressNode != "" {
			assigned[releaseKey{e.Status.EgressNode, ip}] = true
		}
	}
	out := map[string][]report.Release{}
	for i := range nodes {
		name := nodes[i].Name
		st := agents(name)
		if !st.Known || st.Dead {
			continue
		}
		var rs []report.Release
		for _, b := range st.Report.Bound {
			if assigned[releaseKey{name, b.IP}] {
				continue
			}
			for _, e := range byIP[b.IP] {
				rs = append(rs, report.Release{IP: b.IP, UID: string(e.UID), ResourceVersion: e.ResourceVersion, Egress: e.Name})
			}
		}
		if len(rs) == 0 {
			continue
		}
		slices.SortFunc(rs, func(a, b report.Release) int {
			return cmp.Or(a.IP.Compare(b.IP), cmp.Compare(a.Egress, b.Egress))
		})
		out[name] = rs[:min(len(rs), report.MaxReleases)]
	}
	return out
}

// cacheWait is how soon a pass that waits for the cache to catch up runs
// again.
const cacheWait = 50 * time.Millisecond

// readYourWrites makes egs (the cache's Egresses) at least as new as every
// status this controller or a previous leader wrote: it replaces the
// cached copies older than this controller's own writes (writeLedger),
// and until the cache has caught up with a consistent read of the API
// server (see APIReader) it returns wait: the pass must not allocate
// from it yet. Errors are those of the read and of comparing resource
// versions.
func (r *PassReconciler) readYourWrites(ctx context.Context, egs []v1.Egress) (wait bool, err error) {
	if !r.synced && r.APIReader != nil {
		if r.live == nil {
			var live v1.EgressList
			if err := r.APIReader.List(ctx, &live); err != nil {
				return false, fmt.Errorf("read Egresses from the API server: %w", err)
			}
			r.live = live.Items
			if r.live == nil {
				r.live = []v1.Egress{}
			}
		}
		ok, lag, missing, err := caughtUp(egs, r.live)
		if err != nil {
			r.live = nil
			return false, err
		}
		if len(missing) > 0 {
			// Not in the cache: not seen yet, or deleted since the read
			// (then it holds no address and is no longer waited for).
			gone := map[types.UID]bool{}
			for _, m := range missing {
				var cur v1.Egress
				err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(m), &cur)
				switch {
				case apierrors.IsNotFound(err) || err == nil && cur.UID != m.UID:
					gone[m.UID] = true
				case err != nil:
					return false, fmt.Errorf("read Egress %s from the API server: %w", m.Name, err)
				}
			}
			r.live = slices.DeleteFunc(r.live, func(e v1.Egress) bool { return gone[e.UID] })
			if len(gone) > 0 {
				ok, lag, _, err = caughtUp(egs, r.live)
				if err != nil {
					r.live = nil
					return false, err
				}
			}
		}
		if !ok {
			log.FromContext(ctx).V(1).Info("waiting for the cache to show earlier status writes", "lagging", lag)
			return true, nil
		}
		r.live = nil
	}
	r.synced = true
	if _, err := r.written.overlay(egs); err != nil {
		r.synced = false
		return false, err
	}
	return false, nil
}

// reportCapacity records a Warning Event on each Node whose capacity
// annotation became invalid (once per distinct bad value).
func (r *PassReconciler) reportCapacity(ctx context.Context, nodes []corev1.Node, bad map[string]error) {
	if r.reportedInvalid == nil {
		r.reportedInvalid = map[string]string{}
	}
	invalidCapacity.Set(float64(len(bad)))
	for i := range nodes {
		n := &nodes[i]
		err, isBad := bad[n.Name]
		if !isBad {
			delete(r.reportedInvalid, n.Name)
			continue
		}
		v := n.Annotations["egressip.io/max-egress-ips"]
		if r.reportedInvalid[n.Name] == v {
			continue
		}
		r.reportedInvalid[n.Name] = v
		log.FromContext(ctx).Info("invalid capacity annotation ignored", "node", klog.KObj(n), "err", err)
		r.Recorder.Eventf(n, nil, corev1.EventTypeWarning, "InvalidCapacity", "Schedule", "%v; using the default capacity %d", err, r.Config.DefaultCapacity)
	}
}

// SetupWithManager registers the pass and the liveness poller.
func (r *PassReconciler) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.Add(r.Liveness); err != nil {
		return fmt.Errorf("add liveness poller: %w", err)
	}
	toPass := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{passKey}
	})
	b := ctrl.NewControllerManagedBy(mgr).
		Named("egressip-scheduling-pass").
		WithOptions(controller.Options{MaxConcurrentReconciles: 1}).
		Watches(&v1.Egress{}, toPass).
		Watches(&v1.ExternalIPPool{}, toPass).
		Watches(&corev1.Node{}, toPass, builderNodePredicate()).
		WatchesRawSource(source.Channel(r.Liveness.Events, toPass))
	if r.Cloud != nil {
		if err := mgr.Add(r.Cloud); err != nil {
			return fmt.Errorf("add cloud refresher: %w", err)
		}
		b = b.WatchesRawSource(source.Channel(r.Cloud.Events, toPass))
	}
	return b.Complete(r)
}

// nodeChanged reports whether a Node update matters to scheduling: labels,
// annotations, cordon, deletion, addresses, spec.providerID (cloud pools:
// a providerID set after registration), or the Ready and
// NetworkUnavailable condition statuses (heartbeat-only updates do not).
func nodeChanged(o, n *corev1.Node) bool {
	if !equality.Semantic.DeepEqual(o.Labels, n.Labels) || !equality.Semantic.DeepEqual(o.Annotations, n.Annotations) ||
		o.Spec.Unschedulable != n.Spec.Unschedulable || (o.DeletionTimestamp == nil) != (n.DeletionTimestamp == nil) ||
		o.Spec.ProviderID != n.Spec.ProviderID ||
		!equality.Semantic.DeepEqual(o.Status.Addresses, n.Status.Addresses) {
		return true
	}
	for _, t := range []corev1.NodeConditionType{corev1.NodeReady, corev1.NodeNetworkUnavailable} {
		if conditionTrue(o, t) != conditionTrue(n, t) {
			return true
		}
	}
	return false
}

func builderNodePredicate() builder.Predicates {
	return builder.WithPredicates(predicate.Funcs{
		UpdateFunc: func(e event.UpdateEvent) bool {
			o, ok1 := e.ObjectOld.(*corev1.Node)
			n, ok2 := e.ObjectNew.(*corev1.Node)
			return !ok1 || !ok2 || nodeChanged(o, n)
		},
	})
}

// collector is registered once per process (the registry is global); each
// Setup points it at the newest manager's cache.
var (
	collectorOnce sync.Once
	collector     = &stateCollector{}
)

// Options are the controller's tunables, set by egressip-controller's flags.
type Options struct {
	Pass     PassConfig
	Liveness LivenessConfig
	// MaxMembersPerSlice bounds the members of one EgressMemberSlice;
	// 0 means v1alpha1.MaxMembersPerSlice (100), also the largest allowed.
	MaxMembersPerSlice int
	// Cloud enables cloud-backed pools when Cloud.Provider is set.
	Cloud CloudConfig
	// beforePass is PassReconciler.beforePass (tests only).
	beforePass func(context.Context, client.Reader)
	// onCloud, when set (tests only), receives the Cloud that Setup
	// creates, so that a test can read the controller's cloud view.
	onCloud func(*Cloud)
}

// checkReleaseTimeout refuses a release timeout that cannot work with the
// poll settings: the wait needs one poll to carry the instruction and
// another to show the release, so it must last at least two poll
// intervals. 0 (no limit) is accepted here, for tests of the pass;
// egressip-controller refuses it (CheckFlags).
func checkReleaseTimeout(t time.Duration, lc LivenessConfig) error {
	lc.defaults()
	switch {
	case t < 0:
		return fmt.Errorf("--release-timeout %v is negative", t)
	case t > 0 && t < 2*lc.Interval:
		return fmt.Errorf("--release-timeout %v must be at least twice --agent-poll-interval %v: one poll carries the release instruction, the next shows the release", t, lc.Interval)
	}
	return nil
}

// CheckFlags checks the timings egressip-controller was started with
// against each other, as Setup does, and also refuses a release timeout of
// 0 (the wait for a release must end). The error names both flags.
func CheckFlags(o Options) error {
	if o.Pass.ReleaseTimeout <= 0 {
		return fmt.Errorf("--release-timeout %v must be positive (at least twice --agent-poll-interval)", o.Pass.ReleaseTimeout)
	}
	return checkReleaseTimeout(o.Pass.ReleaseTimeout, o.Liveness)
}

// Setup registers the scheduling pass, the agent liveness poller and the
// member slice publication with mgr; mgr's cache should be built with
// CacheOptions (Pods stripped). They run only on the elected leader.
func Setup(mgr ctrl.Manager, o Options) error {
	if o.Pass.DefaultCapacity <= 0 {
		return fmt.Errorf("default capacity must be positive, got %d", o.Pass.DefaultCapacity)
	}
	if err := checkReleaseTimeout(o.Pass.ReleaseTimeout, o.Liveness); err != nil {
		return err
	}
	if o.MaxMembersPerSlice < 0 || o.MaxMembersPerSlice > v1.MaxMembersPerSlice {
		return fmt.Errorf("members per slice must be between 1 and %d, got %d", v1.MaxMembersPerSlice, o.MaxMembersPerSlice)
	}
	collectorOnce.Do(func() { metrics.Registry.MustRegister(collector) })
	collector.set(mgr.GetCache(), o.Pass.DefaultCapacity)
	l := NewLiveness(mgr.GetClient(), o.Liveness)
	r := &PassReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: mgr.GetEventRecorder("egressip-controller"), Liveness: l, Config: o.Pass, beforePass: o.beforePass}
	if o.Cloud.Provider != nil {
		r.Cloud = NewCloud(mgr.GetClient(), o.Cloud)
		l.onNICs(r.Cloud.nicsReported)
		if o.onCloud != nil {
			o.onCloud(r.Cloud)
		}
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return err
	}
	nd := &NodeDatapathReconciler{Client: mgr.GetClient(), Recorder: r.Recorder, Liveness: l}
	if err := nd.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the Node datapath condition: %w", err)
	}
	m := &MembersReconciler{Client: mgr.GetClient(), MaxPerSlice: o.MaxMembersPerSlice}
	if err := m.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up member slices: %w", err)
	}
	return nil
}
