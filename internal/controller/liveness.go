package controller

import (
	"context"
	"crypto/tls"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agentcert"
	"github.com/egressip/egressip/internal/report"
)

// LivenessConfig sets how the controller polls agents.
type LivenessConfig struct {
	// Interval between two polls of one agent. Default 1 s.
	Interval time.Duration
	// Timeout of one poll. Default 500 ms.
	Timeout time.Duration
	// DeadAfter: an agent that has not answered for this long, and failed at
	// least FailureThreshold polls in a row, is dead. Default 3 s.
	DeadAfter time.Duration
	// FailureThreshold is the number of failed polls in a row needed before
	// an agent is declared dead. Default 3.
	FailureThreshold int
	// Port is the agent's report port. Default report.DefaultPort.
	Port int
	// Parallelism bounds how many polls run at once. Default 64.
	Parallelism int
	// TLS, when set, is the TLS configuration of a poll of a Node's agent
	// (agentcert.ClientConfig): the report is then accepted only over
	// mutual TLS from that Node's agent. nil polls over plain HTTP, for
	// tests of the controller alone; egressip-controller always sets it.
	TLS func(node string) *tls.Config
	// RefusedEventInterval is the least time between two Warning Events
	// for refused polls of one Node (the metric counts every one). Default
	// 5 minutes.
	RefusedEventInterval time.Duration
	// Clock is the time the poller reads and waits on: when a poll
	// happened, how long an agent has been silent, the poll and expedite
	// intervals. Default clock.RealClock{}; tests set a
	// k8s.io/utils/clock/testing.FakeClock and step it.
	Clock clock.WithTicker
}

func (c *LivenessConfig) defaults() {
	if c.Interval <= 0 {
		c.Interval = time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = 500 * time.Millisecond
	}
	if c.DeadAfter <= 0 {
		c.DeadAfter = 3 * time.Second
	}
	if c.FailureThreshold <= 0 {
		c.FailureThreshold = 3
	}
	if c.Port == 0 {
		c.Port = report.DefaultPort
	}
	if c.Parallelism <= 0 {
		c.Parallelism = 64
	}
	if c.RefusedEventInterval <= 0 {
		c.RefusedEventInterval = 5 * time.Minute
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
}

// refusedReports counts polls refused because the server on a Node's
// report port is not that Node's agent.
var refusedReports = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "egressip_controller_agent_reports_refused_total",
	Help: "Agent polls refused because the server was not the polled Node's agent, by reason: " +
		"NotTLS (plain HTTP or another protocol), UntrustedCertificate (not issued by the agent CA: a spoofed server or a man in the middle), " +
		"InvalidCertificate (expired, not yet valid, wrong usage), WrongIdentity (another Node's agent), HandshakeFailed (other TLS failures).",
}, []string{labelRefusedReason})

// labelRefusedReason labels refusals by agentcert reason.
const labelRefusedReason = "reason"

func init() {
	metrics.Registry.MustRegister(refusedReports)
	for _, r := range agentcert.RefusedReasons {
		refusedReports.WithLabelValues(r)
	}
}

// AgentState is what the controller knows of one Node's agent.
type AgentState struct {
	// Known is false until the first poll answered: an unknown agent is
	// treated as alive so that a controller restart moves nothing.
	Known bool
	// Dead is true once the agent failed FailureThreshold polls in a row and
	// has not answered for DeadAfter.
	Dead bool
	// Report is the last report received (valid when Known).
	Report report.Report
	// LastSeen is when the agent last answered.
	LastSeen time.Time

	failures int
}

// Liveness polls every Node's agent and keeps their last reports. It runs
// only on the leader and signals the scheduling pass through Events when an
// agent dies, comes back, or reports a different set of bound IPs.
type Liveness struct {
	cfg    LivenessConfig
	reader client.Reader
	client *report.Client
	// Events receives one event per change; the pass controller watches it.
	Events chan event.GenericEvent

	mu        sync.Mutex
	agents    map[string]*AgentState
	expedited map[string]bool
	runCtx    context.Context // the context Start runs with
	// releases are, per Node, the Releases its next polls carry (set by
	// the pass, see SetReleases).
	releases map[string][]report.Release
	// dpHook is called with a Node's name when its agent's datapath
	// finding changes (see onDatapathChange).
	dpHook func(node string)
	// Recorder, when set, records the Warning Events of refused polls.
	Recorder recorder.EventRecorder
	// refusedEvent is when the last refused-poll Event of each Node was
	// recorded.
	refusedEvent map[string]time.Time
	// nicHook is called with a Node's name and its agent's NICs after
	// every poll whose report lists them (see onNICs).
	nicHook func(node string, nics []string)
}

// onNICs makes fn be called, outside the lock, after every answered poll
// whose report lists the Node's NICs (report.Report.NICs), with the Node's
// name and that list: the cloud view compares it with what the cloud last
// said (CloudActuator.nicsReported). fn must be quick; it runs on the poller.
func (l *Liveness) onNICs(fn func(node string, nics []string)) {
	l.mu.Lock()
	l.nicHook = fn
	l.mu.Unlock()
}

// onDatapathChange makes fn be called, outside the lock, with the name of
// every Node whose agent's datapath finding (report.Report.Datapath),
// ownership status (report.Report.Ownership), kernel finding
// (report.Report.Kernel), fence status or VLAN status (report.Report.VLANs)
// changes, and at once for every
// Node already known.
func (l *Liveness) onDatapathChange(fn func(node string)) {
	l.mu.Lock()
	l.dpHook = fn
	known := make([]string, 0, len(l.agents))
	for n, s := range l.agents {
		if s.Known {
			known = append(known, n)
		}
	}
	l.mu.Unlock()
	for _, n := range known {
		fn(n)
	}
}

// sameDatapath reports whether two findings are equal (nil: none).
func sameDatapath(a, b *report.DatapathStatus) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// sameOwnership reports whether two ownership statuses are equal (nil: none).
func sameOwnership(a, b *report.OwnershipStatus) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

// expediteInterval and expediteFor: how often and how long a Node that must
// release an IP is polled, so a planned move waits about 100 ms for the
// release to be seen instead of a whole poll interval.
// At most maxExpedited Nodes are expedited at once, so a pass that moves
// thousands of IPs does not turn into thousands of polls every 100 ms; the
// others wait for their regular poll.
const (
	expediteInterval = 100 * time.Millisecond
	expediteFor      = 5 * time.Second
	maxExpedited     = 16
)

// Expedite polls node every 100 ms for up to 5 s, or until its report
// changes: the pass calls it while it waits for node to release an IP.
func (l *Liveness) Expedite(node string) {
	l.mu.Lock()
	ctx := l.runCtx
	if ctx == nil || l.expedited[node] || len(l.expedited) >= maxExpedited {
		l.mu.Unlock()
		return
	}
	l.expedited[node] = true
	l.mu.Unlock()
	go func() {
		defer func() {
			l.mu.Lock()
			delete(l.expedited, node)
			l.mu.Unlock()
		}()
		var n corev1.Node
		if err := l.reader.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return
		}
		addr, ok := nodeAddress(&n)
		if !ok {
			return
		}
		start := l.State(node)
		clk := l.cfg.Clock
		deadline := clk.Now().Add(expediteFor)
		for clk.Now().Before(deadline) {
			select {
			case <-ctx.Done():
				return
			case <-clk.After(expediteInterval):
			}
			l.poll(ctx, node, addr, true)
			if now := l.State(node); now.Dead || !sameBound(now.Report, start.Report) {
				return
			}
		}
	}()
}

// SetReleases replaces the instructions the polls carry: byNode holds, per
// Node, the IPs the controller waits for that Node to release
// (report.Release). A Node absent from byNode is told nothing.
func (l *Liveness) SetReleases(byNode map[string][]report.Release) {
	l.mu.Lock()
	l.releases = byNode
	l.mu.Unlock()
}

// releasesFor returns the Releases a poll of node carries.
func (l *Liveness) releasesFor(node string) []report.Release {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.releases[node]
}

// NewLiveness returns a poller reading Nodes from reader.
func NewLiveness(reader client.Reader, cfg LivenessConfig) *Liveness {
	cfg.defaults()
	c := report.NewClient(cfg.Port, cfg.Timeout)
	c.TLS = cfg.TLS
	return &Liveness{
		cfg:          cfg,
		reader:       reader,
		client:       c,
		Events:       make(chan event.GenericEvent, 1),
		agents:       map[string]*AgentState{},
		expedited:    map[string]bool{},
		refusedEvent: map[string]time.Time{},
	}
}

// NeedLeaderElection makes the poller run only on the elected leader.
func (l *Liveness) NeedLeaderElection() bool { return true }

// State returns a copy of the agent state of node.
func (l *Liveness) State(node string) AgentState {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s, ok := l.agents[node]; ok {
		return *s
	}
	return AgentState{}
}

// Start polls until ctx ends.
func (l *Liveness) Start(ctx context.Context) error {
	l.mu.Lock()
	l.runCtx = ctx
	l.mu.Unlock()
	// A sliding period without jitter, as wait.UntilWithContext, on the
	// configured clock: the next round starts Interval after this one
	// ended.
	for ctx.Err() == nil {
		l.pollAll(ctx)
		select {
		case <-ctx.Done():
		case <-l.cfg.Clock.After(l.cfg.Interval):
		}
	}
	return nil
}

func (l *Liveness) pollAll(ctx context.Context) {
	logger := log.FromContext(ctx).WithName("liveness")
	var nodes corev1.NodeList
	if err := l.reader.List(ctx, &nodes); err != nil {
		logger.Error(err, "list Nodes for agent polls")
		return
	}
	present := make(map[string]bool, len(nodes.Items))
	pieces := make([]func(context.Context), 0, len(nodes.Items))
	for i := range nodes.Items {
		n := &nodes.Items[i]
		present[n.Name] = true
		addr, ok := nodeAddress(n)
		name := n.Name
		pieces = append(pieces, func(ctx context.Context) { l.poll(ctx, name, addr, ok) })
	}
	workqueue.ParallelizeUntil(ctx, l.cfg.Parallelism, len(pieces), func(i int) { pieces[i](ctx) })
	l.mu.Lock()
	for name := range l.agents {
		if !present[name] {
			delete(l.agents, name)
			delete(l.refusedEvent, name)
		}
	}
	l.mu.Unlock()
	l.client.Forget(present)
}

func (l *Liveness) poll(ctx context.Context, node string, addr netip.Addr, hasAddr bool) {
	var (
		rep report.Report
		err error
	)
	if hasAddr {
		rep, err = l.client.Poll(ctx, node, addr, report.Poll{Releases: l.releasesFor(node)})
		l.noteRefused(ctx, node, err)
	}
	now := l.cfg.Clock.Now()
	l.mu.Lock()
	s, ok := l.agents[node]
	if !ok {
		s = &AgentState{LastSeen: now}
		l.agents[node] = s
	}
	changed, dpChanged := false, false
	if hasAddr && err == nil && rep.Node == node {
		changed = !s.Known || s.Dead || !sameBound(s.Report, rep)
		dpChanged = !s.Known || s.Dead || !sameDatapath(s.Report.Datapath, rep.Datapath) || !sameOwnership(s.Report.Ownership, rep.Ownership) ||
			!s.Report.Kernel.Equal(rep.Kernel) || !s.Report.Fence.Equal(rep.Fence) ||
			!s.Report.VLANs.Equal(rep.VLANs)
		s.Known, s.Dead, s.failures, s.LastSeen, s.Report = true, false, 0, now, rep
	} else {
		s.failures++
		if !s.Dead && s.failures >= l.cfg.FailureThreshold && now.Sub(s.LastSeen) >= l.cfg.DeadAfter {
			s.Dead, changed, dpChanged = true, true, s.Known
			log.FromContext(ctx).Info("agent declared dead", "node", klog.KRef("", node), "failures", s.failures, "lastSeen", s.LastSeen, "err", err)
		}
	}
	hook, nicHook := l.dpHook, l.nicHook
	l.mu.Unlock()
	if changed {
		l.notify()
	}
	if dpChanged && hook != nil {
		hook(node)
	}
	if nicHook != nil && hasAddr && err == nil && rep.Node == node && len(rep.NICs) > 0 {
		nicHook(node, rep.NICs)
	}
}

// noteRefused counts a poll of node refused because the server is not
// node's agent (agentcert.Classify), and records a Warning Event on the
// Node at most once per RefusedEventInterval. A refused poll is a failed
// poll: poll then treats it as an agent that did not answer.
func (l *Liveness) noteRefused(ctx context.Context, node string, err error) {
	re, ok := agentcert.Classify(err)
	if !ok {
		return
	}
	refusedReports.WithLabelValues(re.Reason).Inc()
	now := l.cfg.Clock.Now()
	l.mu.Lock()
	last, seen := l.refusedEvent[node]
	due := !seen || now.Sub(last) >= l.cfg.RefusedEventInterval
	if due {
		l.refusedEvent[node] = now
	}
	rec := l.Recorder
	l.mu.Unlock()
	if !due {
		return
	}
	log.FromContext(ctx).Info("agent report refused: the server on the report port is not this Node's agent",
		"node", klog.KRef("", node), "reason", re.Reason, "err", re.Err)
	if rec == nil {
		return
	}
	var n corev1.Node
	if gerr := l.reader.Get(ctx, client.ObjectKey{Name: node}, &n); gerr != nil {
		return
	}
	rec.Eventf(&n, nil, corev1.EventTypeWarning, v1.ReasonAgentReportRefused, "Poll",
		"report of Node %s refused (%s): %v; the Node is not kept alive by it and its IPs are not Ready on it (further refusals within %v are only counted in egressip_controller_agent_reports_refused_total)",
		node, re.Reason, re.Err, l.cfg.RefusedEventInterval)
}

// notify asks for a scheduling pass without blocking: one pending signal is
// enough since the pass reads every agent's state.
func (l *Liveness) notify() {
	select {
	case l.Events <- event.GenericEvent{Object: &corev1.Node{}}:
	default:
	}
}

func sameBound(a, b report.Report) bool {
	if a.Instance != b.Instance || len(a.Bound) != len(b.Bound) || !slices.Equal(a.RefusedEgresses, b.RefusedEgresses) {
		return false
	}
	for i := range a.Bound {
		if a.Bound[i] != b.Bound[i] {
			return false
		}
	}
	// A duplicate-IP conflict that starts, ends or names other MACs is
	// news for the Egress's Conflict condition; so are the Node's MACs,
	// which name the Node behind another's conflict.
	if !slices.Equal(a.MACs, b.MACs) || !slices.EqualFunc(a.Conflicts, b.Conflicts, func(x, y report.ConflictIP) bool {
		return x.IP == y.IP && slices.Equal(x.MACs, y.MACs)
	}) {
		return false
	}
	// A new or changed refusal is news too: the Egress's Ready condition
	// says why it is not bound.
	return slices.EqualFunc(a.Refused, b.Refused, func(x, y report.RefusedIP) bool {
		return x.IP == y.IP && x.Message == y.Message && slices.Equal(x.Egresses, y.Egresses)
	})
}

// nodeAddress is the address the agent of n is reached at: its first
// InternalIP (the agent runs on the host network).
func nodeAddress(n *corev1.Node) (netip.Addr, bool) {
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			return ip, true
		}
	}
	return netip.Addr{}, false
}
