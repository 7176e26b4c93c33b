package controller

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
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

// Defaults of the liveness flags (docs/failover.md, "The channel"). They
// are chosen together: a poll ends before the next is due (400 ms <
// 500 ms), so a silent agent fails DefaultFailureThreshold polls within
// 3 × 500 ms + 400 ms = 1.9 s of its last answer and DefaultDeadAfter
// alone decides when it is dead; the agent's fencing defaults
// (internal/agent/fence) finish unbinding a cut-off Node 1.85 s after its
// last poll, before 2 s.
const (
	DefaultPollInterval     = 500 * time.Millisecond
	DefaultPollTimeout      = 400 * time.Millisecond
	DefaultDeadAfter        = 2 * time.Second
	DefaultFailureThreshold = 3
)

// LivenessConfig sets how the controller polls agents.
type LivenessConfig struct {
	// Interval between two rounds of polls: a round starts every Interval
	// (a fixed rate, whatever the previous round's polls still wait for),
	// and polls every agent whose previous poll has ended. Default
	// DefaultPollInterval (500 ms).
	Interval time.Duration
	// Timeout of one poll; less than Interval (Check). Default
	// DefaultPollTimeout (400 ms).
	Timeout time.Duration
	// DeadAfter: an agent that has not answered for this long, and failed at
	// least FailureThreshold polls in a row, is dead; it is declared dead
	// at that instant, not at its next failed poll. Default
	// DefaultDeadAfter (2 s).
	DeadAfter time.Duration
	// FailureThreshold is the number of failed polls in a row needed before
	// an agent is declared dead. Default DefaultFailureThreshold (3).
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
		c.Interval = DefaultPollInterval
	}
	if c.Timeout <= 0 {
		c.Timeout = DefaultPollTimeout
	}
	if c.DeadAfter <= 0 {
		c.DeadAfter = DefaultDeadAfter
	}
	if c.FailureThreshold <= 0 {
		c.FailureThreshold = DefaultFailureThreshold
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

// Check refuses liveness flags that cannot work together, naming them
// (egressip-controller exits with code 2, see CheckFlags): every duration
// and the threshold must be positive (0 would silently mean the default),
// and a poll must time out before the next round is due
// (--agent-poll-timeout < --agent-poll-interval): otherwise a silent agent
// is still in its last poll when the next round comes, skips it, and fails
// one poll every two intervals instead of one per interval.
func (c LivenessConfig) Check() error {
	var errs []error
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"--agent-poll-interval", c.Interval}, {"--agent-poll-timeout", c.Timeout}, {"--agent-dead-after", c.DeadAfter}} {
		if d.v <= 0 {
			errs = append(errs, fmt.Errorf("%s %v: want a positive duration", d.flag, d.v))
		}
	}
	if c.FailureThreshold < 1 {
		errs = append(errs, fmt.Errorf("--agent-failure-threshold %d: want at least 1", c.FailureThreshold))
	}
	if len(errs) == 0 && c.Timeout >= c.Interval {
		errs = append(errs, fmt.Errorf("--agent-poll-timeout %v must be less than --agent-poll-interval %v: "+
			"a poll that does not answer would still wait when the next round is due, and a silent agent would "+
			"fail one poll every two intervals", c.Timeout, c.Interval))
	}
	return errors.Join(errs...)
}

// refusedReports counts polls refused because the server on a Node's
// report port is not that Node's agent.
var refusedReports = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "egressip_controller_agent_reports_refused_total",
	Help: "Agent polls refused because the server was not the polled Node's agent, by reason: " +
		"NotTLS (plain HTTP or another protocol), UntrustedCertificate (not issued by the agent CA: a spoofed server or a man in the middle), " +
		"InvalidCertificate (expired, not yet valid, wrong usage), WrongIdentity (another Node's agent), HandshakeFailed (other TLS failures).",
}, []string{labelRefusedReason})

// agentPolls counts the polls of the agents by outcome: ok (a report of
// the polled Node came back in time) or failed (timeout, refused,
// anything else). Failed polls of agents that answer are what a false
// failover would be made of; TestNoFalseFailover reads it.
var agentPolls = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "egressip_controller_agent_polls_total",
	Help: "Agent polls by result: ok (the Node's report came back within --agent-poll-timeout) or failed.",
}, []string{labelResult})

// labelRefusedReason labels refusals by agentcert reason.
const labelRefusedReason = "reason"

func init() {
	metrics.Registry.MustRegister(refusedReports, agentPolls)
	agentPolls.WithLabelValues("ok")
	agentPolls.WithLabelValues("failed")
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
	// deadCheck is true while a timer waits for LastSeen + DeadAfter to
	// declare the agent dead then (see scheduleDeadCheck).
	deadCheck bool
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
	// inFlight holds the Nodes whose round poll has not ended yet: the
	// next round skips them (an expedited poll does not count).
	inFlight map[string]bool
	// slots bounds the polls of all rounds running at once to
	// Parallelism.
	slots  chan struct{}
	runCtx context.Context // the context Start runs with
	// releases are, per Node, the Releases its next polls carry (set by
	// the pass, see SetReleases).
	releases map[string][]report.Release
	// acquires are, per Node, the Acquires its next polls carry (set by
	// the pass, see SetAcquires).
	acquires map[string][]report.Acquire
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

// SetAcquires replaces the acquire instructions the polls carry: byNode
// holds, per Node, the IPs the pass waits for that Node to bind before it
// writes their move (report.Acquire; see acquireHolds). A Node absent
// from byNode is told nothing.
//
// A Node whose list gains an instruction is polled at once, outside the
// regular and expedited rounds: its agent binds on the poll, so waiting
// for the next round would add up to a poll interval (or the expedited
// 100 ms) to the failover.
func (l *Liveness) SetAcquires(byNode map[string][]report.Acquire) {
	l.mu.Lock()
	old := l.acquires
	l.acquires = byNode
	ctx := l.runCtx
	l.mu.Unlock()
	if ctx == nil {
		return
	}
	for node, as := range byNode {
		had := make(map[report.Acquire]bool, len(old[node]))
		for _, a := range old[node] {
			had[a] = true
		}
		if slices.ContainsFunc(as, func(a report.Acquire) bool { return !had[a] }) {
			go l.pollOnce(ctx, node)
		}
	}
}

// pollOnce polls node once now (an acquire instruction for it is new).
func (l *Liveness) pollOnce(ctx context.Context, node string) {
	var n corev1.Node
	if err := l.reader.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		return
	}
	if addr, ok := nodeAddress(&n); ok {
		l.poll(ctx, node, addr, true)
	}
}

// pollFor returns what a poll of node carries: its Releases and Acquires.
func (l *Liveness) pollFor(node string) report.Poll {
	l.mu.Lock()
	defer l.mu.Unlock()
	return report.Poll{Releases: l.releases[node], Acquires: l.acquires[node]}
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
		inFlight:     map[string]bool{},
		slots:        make(chan struct{}, cfg.Parallelism),
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

// Start polls until ctx ends: a round at once, then one every Interval of
// the configured clock, at a fixed rate. A round does not hold up the
// next: an agent that does not answer keeps only its own poll waiting
// (up to Timeout), and the next round polls every other agent on time
// and skips it while that poll waits. Before, a round waited for its
// slowest poll and the next began Interval after it, so one silent agent
// stretched every agent's period by the timeout; the fencing rule of the
// agents (internal/agent/fence, PolledMargin) counts on rounds coming on
// time for the Nodes that answer.
func (l *Liveness) Start(ctx context.Context) error {
	l.mu.Lock()
	l.runCtx = ctx
	l.mu.Unlock()
	tick := l.cfg.Clock.NewTicker(l.cfg.Interval)
	defer tick.Stop()
	var rounds sync.WaitGroup
	defer rounds.Wait()
	for {
		rounds.Go(func() { l.pollAll(ctx) })
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C():
		}
	}
}

// pollAll runs one round: it polls every Node's agent whose previous round
// poll has ended, at most Parallelism polls at once over all rounds, and
// returns when its own polls have ended.
func (l *Liveness) pollAll(ctx context.Context) {
	logger := log.FromContext(ctx).WithName("liveness")
	var nodes corev1.NodeList
	if err := l.reader.List(ctx, &nodes); err != nil {
		logger.Error(err, "list Nodes for agent polls")
		return
	}
	present := make(map[string]bool, len(nodes.Items))
	pieces := make([]func(context.Context), 0, len(nodes.Items))
	marked := make([]string, 0, len(nodes.Items))
	l.mu.Lock()
	for i := range nodes.Items {
		n := &nodes.Items[i]
		present[n.Name] = true
		if l.inFlight[n.Name] {
			continue
		}
		l.inFlight[n.Name] = true
		marked = append(marked, n.Name)
		addr, ok := nodeAddress(n)
		name := n.Name
		pieces = append(pieces, func(ctx context.Context) {
			defer func() {
				l.mu.Lock()
				delete(l.inFlight, name)
				l.mu.Unlock()
			}()
			select {
			case l.slots <- struct{}{}:
			case <-ctx.Done():
				return
			}
			defer func() { <-l.slots }()
			l.poll(ctx, name, addr, ok)
		})
	}
	l.mu.Unlock()
	workqueue.ParallelizeUntil(ctx, l.cfg.Parallelism, len(pieces), func(i int) { pieces[i](ctx) })
	l.mu.Lock()
	if ctx.Err() != nil {
		// ParallelizeUntil stops handing out pieces once ctx ends: the
		// ones it never ran still hold their mark.
		for _, name := range marked {
			delete(l.inFlight, name)
		}
	}
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
		rep, err = l.client.Poll(ctx, node, addr, l.pollFor(node))
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
	answered := hasAddr && err == nil && rep.Node == node
	if answered {
		agentPolls.WithLabelValues("ok").Inc()
	} else {
		agentPolls.WithLabelValues("failed").Inc()
	}
	if answered {
		changed = !s.Known || s.Dead || !sameBound(s.Report, rep)
		dpChanged = !s.Known || s.Dead || !sameDatapath(s.Report.Datapath, rep.Datapath) || !sameOwnership(s.Report.Ownership, rep.Ownership) ||
			!s.Report.Kernel.Equal(rep.Kernel) || !s.Report.Fence.Equal(rep.Fence) ||
			!s.Report.VLANs.Equal(rep.VLANs)
		s.Known, s.Dead, s.failures, s.LastSeen, s.Report = true, false, 0, now, rep
	} else {
		s.failures++
		if !s.Dead && s.failures >= l.cfg.FailureThreshold {
			if now.Sub(s.LastSeen) >= l.cfg.DeadAfter {
				s.Dead, changed, dpChanged = true, true, s.Known
				log.FromContext(ctx).Info("agent declared dead", "node", klog.KRef("", node), "failures", s.failures, "lastSeen", s.LastSeen, "err", err)
			} else {
				l.scheduleDeadCheck(ctx, node, s, now)
			}
		}
	}
	hook, nicHook := l.dpHook, l.nicHook
	l.mu.Unlock()
	l.signalDead(node, changed, dpChanged, hook)
	if nicHook != nil && answered && len(rep.NICs) > 0 {
		nicHook(node, rep.NICs)
	}
}

// signalDead asks for a pass when changed, and calls hook (the datapath
// hook) for node when dpChanged.
func (l *Liveness) signalDead(node string, changed, dpChanged bool, hook func(string)) {
	if changed {
		l.notify()
	}
	if dpChanged && hook != nil {
		hook(node)
	}
}

// scheduleDeadCheck declares the agent of node dead at s.LastSeen +
// DeadAfter if it has not answered by then: it has already failed
// FailureThreshold polls, so waiting for the next failed poll would add up
// to a poll interval plus a timeout to every crash failover. One timer
// per agent at a time; l.mu is held.
func (l *Liveness) scheduleDeadCheck(ctx context.Context, node string, s *AgentState, now time.Time) {
	if s.deadCheck {
		return
	}
	s.deadCheck = true
	wait := s.LastSeen.Add(l.cfg.DeadAfter).Sub(now)
	go func() {
		select {
		case <-ctx.Done():
		case <-l.cfg.Clock.After(wait):
		}
		now := l.cfg.Clock.Now()
		l.mu.Lock()
		s, ok := l.agents[node]
		if !ok {
			l.mu.Unlock()
			return
		}
		s.deadCheck = false
		changed, dpChanged := false, false
		if ctx.Err() == nil && !s.Dead && s.failures >= l.cfg.FailureThreshold && now.Sub(s.LastSeen) >= l.cfg.DeadAfter {
			s.Dead, changed, dpChanged = true, true, s.Known
			log.FromContext(ctx).Info("agent declared dead", "node", klog.KRef("", node), "failures", s.failures, "lastSeen", s.LastSeen)
		}
		hook := l.dpHook
		l.mu.Unlock()
		l.signalDead(node, changed, dpChanged, hook)
	}()
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
