package controller

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"net/netip"
	"slices"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/recorder"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/report"
)

// passKey is the single work item: every trigger (Egress, pool, Node,
// agent liveness) is coalesced into one pending pass.
var passKey = reconcile.Request{NamespacedName: types.NamespacedName{Name: "egressip-scheduling-pass"}}

// PassReconciler runs the scheduling pass.
type PassReconciler struct {
	Client   client.Client
	Recorder recorder.EventRecorder
	Liveness *Liveness
	Config   PassConfig
	// Cloud serves cloud-backed pools; nil without a cloud provider.
	Cloud *CloudActuator
	// WriteParallelism bounds concurrent status patches. Default
	// DefaultWriteParallelism.
	WriteParallelism int
	// DeferrableWrites is how many patches one pass issues at most
	// when some are deferrable (writePriority prioAssign and prioOther):
	// the urgent ones count first and are never deferred (moves, Ready
	// changes, finalizers), deferrable ones fill the rest (prioritize),
	// and those left wait for the next pass, which runs at once. It
	// bounds how long a pass spends on a bulk (a cold start writes every
	// Egress), so that a Node's death found meanwhile waits at most that
	// long. Setup sets it to one second's worth of the client's rate
	// limit (--kube-api-qps); 0 means no bound (tests of the pass alone).
	DeferrableWrites int
	// APIReader reads the API server without the cache (consistent
	// reads). The first pass as leader, and the first after a status
	// write whose outcome is unknown, wait until the cache shows every
	// Egress at least as new as a read through it: another replica, or
	// this one, may have written statuses the cache does not show yet.
	// Nil skips that wait (tests of the pass alone).
	APIReader client.Reader
	// Selected holds the member publication's status.selectedPods and
	// status.shadowedBy, which the pass writes with the rest of each
	// Egress's status (selectedBoard); nil: the statuses' own are kept.
	Selected *selectedBoard

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
	// acquireSince holds when each move the pass holds back began
	// (acquireHolds); the pass worker alone uses it.
	acquireSince map[acquireKey]time.Time
	// selectors remembers the selectors' validity across passes.
	selectors selectorMemo
	// statuses remembers the Egress statuses across passes (egressMemo).
	statuses egressMemo
	// beforePass, when set (tests only), runs at the start of every pass
	// with the cache the pass reads, so a test can hold passes while it
	// makes several changes that one pass must see together.
	beforePass func(context.Context, client.Reader)
}

// Reconcile runs one pass. It returns an error (and is retried with backoff)
// when it cannot read the cache or some status writes failed; the writes
// that succeeded stay.
//
// The steps: read the cache (and wait for it to show this controller's
// writes), plan (a pure function) with the member publication's counts,
// hand the cloud its calls, export the pass's metrics, write the statuses
// and finalizers that changed, tell the liveness poller which releases to
// ask of the agents, and have it poll soon the Nodes the pass waits for.
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
	// The plan sees the member publication's latest counts; the patches
	// are computed against egs as read, so a count that changed is
	// written with the rest.
	in := passInput{Pools: pools.Items, Egresses: r.Selected.overlay(egs.Items), Nodes: nodes.Items, Agents: agentSnapshot(r.Liveness.State), Config: r.Config,
		Now: start, ReleaseSince: func(k releaseKey) time.Time { return r.releaseSince[k] }, Selectors: &r.selectors, Memo: &r.statuses}
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
	r.selectors.endPass()
	if out.Cloud != nil {
		r.Cloud.remember(out.Cloud, start)
		r.Cloud.Run(ctx, out.Cloud)
		setPoolMetrics(out.Cloud)
		result.RequeueAfter = minPositive(out.Cloud.Recheck, r.Cloud.nextBackoff(time.Now()))
	}

	result.RequeueAfter = minPositive(result.RequeueAfter, r.trackReleases(out.Waits, start))
	r.reportCapacity(ctx, nodes.Items, out.InvalidCapacity)
	setPassMetrics(&out)

	ew := r.egressWrites(egs.Items, &out)
	r.statuses.endPass()
	holds := acquireHolds(egs.Items, out.Egresses, cloudPools(pools.Items), r.Liveness.State, r.acquireStarted, start, r.Config.AcquireTimeout)
	ew.hold(holds)
	result.RequeueAfter = minPositive(result.RequeueAfter, r.trackAcquires(holds, start))
	acquires := acquireInstructions(holds)
	writes, deferred := r.prioritize(append(ew.writes, r.poolWrites(pools.Items, &out)...))
	for _, w := range deferred {
		if w.index >= 0 {
			ew.patched[w.index] = false // not attempted: the API server holds it as read
		}
	}
	if len(deferred) > 0 {
		deferredWrites.Add(float64(len(deferred)))
		result.RequeueAfter = minPositive(result.RequeueAfter, time.Millisecond) // the next chunk, after this pass's writes
	}
	writesFrom := time.Now()
	errs, unknown, slowest := r.runWrites(ctx, writes)
	writesTook := time.Since(writesFrom)
	for i, e := range ew.written {
		if e != nil {
			r.written.record(e)
			// The Events go after all of the pass's patches: each is one
			// more create on the same API server, and a failover's
			// hundreds of them issued beside the moves would slow the
			// moves (docs/failover.md, "Failover at scale").
			r.recordChange(e, out.Egresses[egs.Items[i].Name])
		}
	}
	r.Liveness.SetReleases(releaseInstructions(ew.final(egs.Items), nodes.Items, r.Liveness.State, acquires))
	r.Liveness.SetAcquires(acquires)
	// Polled soon once the statuses they wait for are written and the
	// release instructions set: expedited before the writes, a Node's
	// report would change with the first of a failover's hundreds of
	// moves it binds, which ends the expedited polls, and the pass that
	// writes them Ready would wait for its regular poll.
	for _, n := range out.Awaited {
		r.Liveness.Expedite(n)
	}
	if unknown {
		r.synced = false
	}
	if err := errors.Join(errs...); err != nil {
		return reconcile.Result{}, err
	}
	if len(writes) >= bigPassWrites {
		byPrio := [prioOther + 1]int{}
		for _, w := range writes {
			byPrio[w.prio]++
		}
		logger.Info("scheduling pass wrote many statuses", "moves", byPrio[prioMove], "readyChanges", byPrio[prioReady],
			"assignments", byPrio[prioAssign], "other", byPrio[prioOther], "deferred", len(deferred), "heldForAcquire", len(holds), "planned", writesFrom.Sub(start), "writing", writesTook, "slowestWrite", slowest,
			"duration", time.Since(start))
	}
	logger.V(1).Info("scheduling pass done", "egresses", len(egs.Items), "nodes", len(nodes.Items), "writes", len(writes), "deferred", len(deferred), "heldForAcquire", len(holds), "duration", time.Since(start))
	return result, nil
}

// agentSnapshot is state read at most once per Node: the first answer for
// a Node is the answer for the rest of the pass. The liveness poller's
// state changes while a pass runs; a pass that read a Node's agent twice
// (the memo's key, then the conditions) could otherwise remember a status
// under facts it was not computed from (egressMemo). Not safe for
// concurrent use: plan runs on one goroutine.
func agentSnapshot(state func(node string) AgentState) func(node string) AgentState {
	seen := map[string]AgentState{}
	return func(node string) AgentState {
		if s, ok := seen[node]; ok {
			return s
		}
		s := state(node)
		seen[node] = s
		return s
	}
}

// setPassMetrics exports what a pass found: the unplaced Egresses by
// reason (the common reasons at zero when none) and the conflicts.
func setPassMetrics(out *passOutput) {
	unplacedEgresses.Reset()
	for _, reason := range []string{v1.ReasonNoEligibleNode, v1.ReasonCapacityExhausted, v1.ReasonPoolExhausted} {
		unplacedEgresses.WithLabelValues(reason).Set(0)
	}
	for reason, n := range out.Unplaced {
		unplacedEgresses.WithLabelValues(reason).Set(float64(n))
	}
	conflictEgresses.Set(float64(out.Conflicts))
}

// statusWrite is one patch a pass issues.
type statusWrite struct {
	obj client.Object
	do  func(context.Context) error
	// prio is how urgent the patch is; index is the Egress's index in the
	// pass's list (-1 for a pool).
	prio  writePriority
	index int
}

// bigPassWrites is the number of patches from which a pass logs what it
// wrote, by priority, at the default level (a failover of a loaded Node,
// a cold start).
const bigPassWrites = 100

// writePriority orders a pass's patches: the client's rate limiter hands
// out its tokens in the order the patches are issued, so the ones a
// failover needs go first, and the deferrable ones (DeferrableWrites)
// may wait for the next pass.
type writePriority uint8

const (
	// prioMove: an Egress leaves its Node (failover, drain, release) or
	// changes address; a pool's finalizer. Never deferred.
	prioMove writePriority = iota
	// prioReady: an Egress's Ready condition changes status on the same
	// Node (it became Ready after its agent bound it, or stopped being).
	// Never deferred.
	prioReady
	// prioAssign: an Egress without a Node gets one, the bulk of a cold
	// start. Deferrable: a new Egress that waits one more pass loses
	// nothing it had.
	prioAssign
	// prioOther: anything else (messages, observed generations, public
	// IPs, other conditions, pool statuses). Deferrable.
	prioOther
)

// egressWritePriority is the priority of the patch from status a to b.
func egressWritePriority(a, b *v1.EgressStatus) writePriority {
	switch {
	case a.EgressNode != "" && a.EgressNode != b.EgressNode, a.EgressIP != "" && a.EgressIP != b.EgressIP:
		return prioMove
	case a.EgressNode == "" && b.EgressNode != "":
		return prioAssign
	case b.EgressNode != "" && conditionStatus(a.Conditions, v1.ConditionReady) != conditionStatus(b.Conditions, v1.ConditionReady):
		return prioReady
	}
	return prioOther
}

// conditionStatus is the status of the condition t in cs, "" when absent.
func conditionStatus(cs []metav1.Condition, t string) metav1.ConditionStatus {
	if c := meta.FindStatusCondition(cs, t); c != nil {
		return c.Status
	}
	return ""
}

// prioritize orders writes by priority (stable: the pass's order within
// one class) and splits off the deferrable ones beyond what is left of
// DeferrableWrites after the urgent ones (moves, Ready changes): a pass
// issues all it needs and, within one second's worth of patches, what
// it can defer. So a failover's pass (200 moves), and the pass that
// writes their Ready changes, issue nothing deferrable: the pass after
// them, which the next urgent changes wait for, starts as soon as they
// are written. Deferrable writes wait only while every pass needs more
// than DeferrableWrites urgent patches.
func (r *PassReconciler) prioritize(writes []statusWrite) (now, later []statusWrite) {
	slices.SortStableFunc(writes, func(a, b statusWrite) int { return cmp.Compare(a.prio, b.prio) })
	if r.DeferrableWrites <= 0 {
		return writes, nil
	}
	urgent := slices.IndexFunc(writes, func(w statusWrite) bool { return w.prio >= prioAssign })
	budget := max(r.DeferrableWrites-urgent, 0)
	if urgent < 0 || len(writes)-urgent <= budget {
		return writes, nil
	}
	cut := urgent + budget
	return writes[:cut], writes[cut:]
}

// egressWriteSet are the Egress status patches of a pass: written holds
// what each successful patch returned (the pass records their Events once
// every patch is done), patched marks the Egresses a patch
// was attempted for (both indexed like the Egresses read).
type egressWriteSet struct {
	writes  []statusWrite
	written []*v1.Egress
	patched []bool
}

// final is what the API server holds now, as far as this pass knows: the
// Egresses it wrote as returned, the others as read (a failed patch
// leaves its Egress out: its state is unknown).
func (w *egressWriteSet) final(egs []v1.Egress) []*v1.Egress {
	final := make([]*v1.Egress, 0, len(egs))
	for i := range egs {
		switch {
		case w.written[i] != nil:
			final = append(final, w.written[i])
		case !w.patched[i]:
			final = append(final, &egs[i])
		}
	}
	return final
}

// egressWrites are the status patches (with their Events and move
// metrics) of the Egresses whose status the pass changed.
func (r *PassReconciler) egressWrites(egs []v1.Egress, out *passOutput) *egressWriteSet {
	w := &egressWriteSet{written: make([]*v1.Egress, len(egs)), patched: make([]bool, len(egs))}
	for i := range egs {
		e := &egs[i]
		ch, ok := out.Egresses[e.Name]
		if !ok || statusEqualToRead(&e.Status, &ch) {
			continue
		}
		w.patched[i] = true
		// The closure captures its own copy: capturing ch moved it to the
		// heap for every Egress, written or not.
		wch := ch
		w.writes = append(w.writes, statusWrite{obj: e, prio: egressWritePriority(&e.Status, &ch.Status), index: i, do: func(ctx context.Context) error {
			patch := client.MergeFromWithOptions(e.DeepCopy(), client.MergeFromWithOptimisticLock{})
			// A copy: the client decodes the answer into e, and wch's
			// lists may be a memo entry's (egressMemo).
			wch.Status.DeepCopyInto(&e.Status)
			if err := r.Client.Status().Patch(ctx, e, patch); err != nil {
				return err
			}
			w.written[i] = e.DeepCopy()
			return nil
		}})
	}
	return w
}

// recordChange records the Events of a written Egress change and counts
// its move.
func (r *PassReconciler) recordChange(e *v1.Egress, ch egressChange) {
	if ch.EventReason != "" {
		r.Recorder.Eventf(e, nil, ch.EventType, ch.EventReason, "Schedule", "%s", ch.EventNote)
	}
	if ch.IPChangedNote != "" {
		r.Recorder.Eventf(e, nil, corev1.EventTypeWarning, v1.EventEgressIPChanged, "Allocate", "%s", ch.IPChangedNote)
	}
	if ch.SelectorEvent != "" {
		r.Recorder.Eventf(e, nil, corev1.EventTypeWarning, v1.ReasonInvalidSelector, "Select", "%s", ch.SelectorEvent)
	}
	if ch.ConflictEvent != "" {
		r.Recorder.Eventf(e, nil, corev1.EventTypeWarning, v1.ReasonDuplicateIP, "Probe", "%s", ch.ConflictEvent)
		conflictEvents.Inc()
	}
	if ch.MoveReason != "" {
		movesTotal.WithLabelValues(ch.MoveReason).Inc()
	}
}

// poolWrites are the finalizer patches of the pools whose protection
// changes, else the status patches of the pools whose status changed.
func (r *PassReconciler) poolWrites(pools []v1.ExternalIPPool, out *passOutput) []statusWrite {
	var writes []statusWrite
	for i := range pools {
		p := &pools[i]
		if want := out.Finalize[p.Name]; want != controllerutil.ContainsFinalizer(p, PoolFinalizer) {
			writes = append(writes, statusWrite{obj: p, prio: prioMove, index: -1, do: func(ctx context.Context) error {
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
		writes = append(writes, statusWrite{obj: p, prio: prioOther, index: -1, do: func(ctx context.Context) error {
			patch := client.MergeFromWithOptions(p.DeepCopy(), client.MergeFromWithOptimisticLock{})
			p.Status = st
			return r.Client.Status().Patch(ctx, p, patch)
		}})
	}
	return writes
}

// DefaultWriteParallelism is PassReconciler.WriteParallelism's default:
// how many status patches a pass has in flight at once. The scale test
// (1,000 Nodes, 5,000 Egresses, a Node holding 206 dying) measured the
// failover's 206 patches against the same API server at 1.22 s 16 at a
// time and 0.45 s 64 at a time: a patch waits mostly on the API server's
// round trip, not on its CPU. 64 stays well below kube-apiserver's
// default --max-mutating-requests-inflight (200), and the client's rate
// limit (--kube-api-qps, --kube-api-burst) still bounds the rate.
const DefaultWriteParallelism = 64

// runWrites issues writes, WriteParallelism at a time, counting each
// result. A conflict or a missing object is no error (the cache is
// behind; the watch event that follows brings a new pass). unknown is set
// when an Egress patch failed otherwise: it may have been applied all the
// same. slowest is the longest any one write took, from its start to its
// answer (a wait for the client's rate limiter included).
func (r *PassReconciler) runWrites(ctx context.Context, writes []statusWrite) (errs []error, unknown bool, slowest time.Duration) {
	errs = make([]error, len(writes))
	var unsure atomic.Bool
	var slowestNs atomic.Int64
	par := r.WriteParallelism
	if par <= 0 {
		par = DefaultWriteParallelism
	}
	workqueue.ParallelizeUntil(ctx, par, len(writes), func(i int) {
		w := writes[i]
		kind := kindEgress
		if _, ok := w.obj.(*v1.ExternalIPPool); ok {
			kind = kindExternalIPPool
		}
		began := time.Now()
		err := w.do(ctx)
		for took := int64(time.Since(began)); ; {
			cur := slowestNs.Load()
			if took <= cur || slowestNs.CompareAndSwap(cur, took) {
				break
			}
		}
		switch {
		case err == nil:
			statusWrites.WithLabelValues(kind, resultOK).Inc()
		case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
			statusWrites.WithLabelValues(kind, resultConflict).Inc()
		default:
			statusWrites.WithLabelValues(kind, resultError).Inc()
			errs[i] = fmt.Errorf("patch status of %s %s: %w", kind, w.obj.GetName(), err)
			if kind == kindEgress {
				unsure.Store(true)
			}
		}
	})
	return errs, unsure.Load(), time.Duration(slowestNs.Load())
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
// that Node, once for each Egress whose status.egressIP or status.ips
// lists it (heldIPs; with that Egress's UID and resource version, so that
// the agent can tell its own cache's copy is older). IPs no Egress holds are not named (the agent's
// cache, once it catches up, removes them). An IP a Node is told to
// acquire (acquiring, per Node) counts as assigned to it. Each Node's list is sorted by
// IP, then Egress name, and holds at most report.MaxReleases entries.
func releaseInstructions(egs []*v1.Egress, nodes []corev1.Node, agents func(string) AgentState, acquiring map[string][]report.Acquire) map[string][]report.Release {
	byIP := map[netip.Addr][]*v1.Egress{}
	assigned := map[releaseKey]bool{}
	for _, e := range egs {
		for ip, node := range heldIPs(e) {
			byIP[ip] = append(byIP[ip], e)
			if node != "" {
				assigned[releaseKey{node, ip}] = true
			}
		}
	}
	for node, as := range acquiring {
		for _, a := range as {
			assigned[releaseKey{node, a.IP}] = true
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

// heldIPs yields each address e's status gives once, with its Node ("":
// none): status.egressIP with status.egressNode, and for an Egress with
// spec.ips every status.ips entry (egressIP repeats one of them).
func heldIPs(e *v1.Egress) iter.Seq2[netip.Addr, string] {
	return func(yield func(netip.Addr, string) bool) {
		first, err := netip.ParseAddr(e.Status.EgressIP)
		if err == nil && !yield(first, e.Status.EgressNode) {
			return
		}
		for k, s := range e.Status.IPs {
			ip, err := netip.ParseAddr(s.IP)
			if err != nil || ip == first || slices.ContainsFunc(e.Status.IPs[:k], func(o v1.EgressIPStatus) bool { return o.IP == s.IP }) {
				continue
			}
			if !yield(ip, s.Node) {
				return
			}
		}
	}
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
		r.Recorder.Eventf(n, nil, corev1.EventTypeWarning, v1.EventInvalidCapacity, "Schedule", "%v; using the default capacity %d", err, r.Config.DefaultCapacity)
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
	if r.Selected != nil {
		b = b.WatchesRawSource(source.Channel(r.Selected.events, toPass))
	}
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
