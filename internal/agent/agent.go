package agent

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/vishvananda/netns"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent/announce"
	"github.com/egressip/egressip/internal/agent/bind"
	"github.com/egressip/egressip/internal/agentcert"
	"github.com/egressip/egressip/internal/report"
)

// DefaultResyncPeriod is how often the agent re-runs a reconcile without any
// event (restoring addresses removed by hand), and the longest backoff
// between retries of a failed reconcile.
const DefaultResyncPeriod = 30 * time.Second

// DefaultRecordPath is the agent's default ownership record: on tmpfs
// (/run), so it lives exactly as long as the addresses it lists (both are
// gone after a reboot), mounted from the host by the DaemonSet.
const DefaultRecordPath = "/run/egressip/ownership.json"

// Config configures an Agent.
type Config struct {
	// NodeName is the name of the Node the agent runs on. Required.
	NodeName string
	// Interface, when set, is the interface every egress IP is bound on (a
	// pool's subnetInfo.vlan still selects its VLAN sub-interface). When
	// empty the interface is chosen per IP (see bind.SelectInterface).
	Interface string
	// AnnounceInterval, when > 0, re-announces every bound egress IP this
	// often after its burst. 0 (the default) turns periodic announcements
	// off.
	AnnounceInterval time.Duration
	// ResyncPeriod is the period of the reconcile run without an event and
	// the cap of the retry backoff. 0 means DefaultResyncPeriod.
	ResyncPeriod time.Duration
	// AnnounceSchedule is the burst sent after an IP is bound, as offsets
	// from its start. nil means announce.DefaultSchedule (0, 1, 2, 4 s).
	AnnounceSchedule []time.Duration
	// NetNSPath, when set, is the path of the network namespace (for
	// example /run/netns/node1) in which addresses are bound and announced;
	// empty means the agent's own namespace (the host's, in a DaemonSet).
	NetNSPath string
	// Proto is the IFA_PROTO ownership mark; 0 means bind.DefaultProto.
	Proto uint8
	// Ownership is the address ownership mode; "" means bind.OwnershipAuto.
	Ownership bind.Ownership
	// RecordPath is the ownership record (bind.Config.RecordPath); empty
	// means none.
	RecordPath string
}

// entry is one owned address as the report shows it.
type entry struct {
	iface string
	// started: this process started an announcement burst for the binding
	// on iface.
	started bool
	// announced: an announcement of that burst was sent.
	announced bool
}

// Agent binds and announces the egress IPs assigned to one Node. It
// implements reconcile.Reconciler; see the package documentation.
type Agent struct {
	cfg      Config
	instance string
	binder   *bind.Binder
	ann      *announce.Announcer
	log      logr.Logger

	reader client.Reader // the manager's cache, set by SetupWithManager

	hintsMu sync.Mutex
	hints   map[netip.Addr]bind.Hint

	mu    sync.Mutex
	state map[netip.Addr]*entry
	// refused are the assigned IPs the last reconcile did not bind, and
	// why (report.Report.Refused).
	refused []report.RefusedIP

	synced atomic.Bool // a reconcile has completed

	// dpStatus is the datapath finding served in the report (nil: none).
	dpStatus atomic.Pointer[report.DatapathStatus]
	// ownStatus is the ownership status served in the report.
	ownStatus atomic.Pointer[report.OwnershipStatus]
	// refusedEgresses is the datapath's refused Egresses the report serves.
	refusedEgresses atomic.Pointer[[]report.RefusedEgress]
	// kernel is the kernel feature finding served in the report (nil: none).
	kernel atomic.Pointer[report.KernelStatus]
	// certs is the agent's identity for the report server; nil serves
	// plain HTTP (SetCertificates).
	certs *agentcert.Source
}

// SetRefusedEgresses sets the Egresses whose datapath this Node's kernel
// refuses, as the report serves them (Report.RefusedEgresses); nil or empty
// clears them.
func (a *Agent) SetRefusedEgresses(rs []report.RefusedEgress) { a.refusedEgresses.Store(&rs) }

// SetKernelStatus sets the kernel feature finding the report serves; nil
// removes it.
func (a *Agent) SetKernelStatus(s *report.KernelStatus) { a.kernel.Store(s) }

// SetDatapathStatus sets the datapath finding the report serves; nil
// removes it.
func (a *Agent) SetDatapathStatus(s *report.DatapathStatus) { a.dpStatus.Store(s) }

// New opens the netlink and announcement machinery in the configured
// namespace and reads the addresses egressip already owns there (left by a
// previous agent instance), so Report is truthful before the first
// reconcile. It changes nothing on the Node. It fails when NodeName is empty,
// the namespace cannot be opened, the netlink sockets cannot be created or
// the owned addresses cannot be listed. Call Close when done.
func New(cfg Config) (*Agent, error) {
	if cfg.NodeName == "" {
		return nil, errors.New("agent: node name is empty")
	}
	if cfg.ResyncPeriod < 0 || cfg.AnnounceInterval < 0 {
		return nil, errors.New("agent: negative resync period or announce interval")
	}
	if cfg.ResyncPeriod == 0 {
		cfg.ResyncPeriod = DefaultResyncPeriod
	}
	ns := netns.None()
	if cfg.NetNSPath != "" {
		h, err := netns.GetFromPath(cfg.NetNSPath)
		if err != nil {
			return nil, fmt.Errorf("agent: open network namespace %s: %w", cfg.NetNSPath, err)
		}
		defer func() { _ = h.Close() }() // bind and announce keep their own references
		ns = h
	}
	id := make([]byte, 8)
	if _, err := rand.Read(id); err != nil {
		return nil, fmt.Errorf("agent: instance id: %w", err)
	}
	a := &Agent{
		cfg:      cfg,
		instance: hex.EncodeToString(id),
		log:      ctrllog.Log.WithName("agent").WithValues("node", cfg.NodeName),
		hints:    map[netip.Addr]bind.Hint{},
		state:    map[netip.Addr]*entry{},
	}
	b, err := bind.New(ns, bind.Config{Interface: cfg.Interface, HintFor: a.hintFor, Proto: cfg.Proto,
		Ownership: cfg.Ownership, RecordPath: cfg.RecordPath})
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	an, err := announce.New(ns, announce.Config{
		Schedule: cfg.AnnounceSchedule,
		Refresh:  cfg.AnnounceInterval,
		OnEvent:  a.onAnnounce,
	})
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("agent: %w", err)
	}
	a.binder, a.ann = b, an

	owned, err := b.Owned()
	if errors.Is(err, bind.ErrRecordUnreadable) {
		// Start anyway, to serve the report and its Node condition;
		// every reconcile refuses to change addresses until it is fixed.
		a.log.Error(err, "cannot read the ownership record; binding and unbinding nothing until it is fixed")
	} else if err != nil {
		_ = a.Close() // the Owned error is the one to report
		return nil, fmt.Errorf("agent: %w", err)
	}
	a.noteOwnership(a.log)
	for _, o := range owned {
		if _, dup := a.state[o.Addr]; !dup {
			a.state[o.Addr] = &entry{iface: o.Interface}
		}
	}
	a.setBoundGauge()
	if len(owned) > 0 {
		a.log.Info("found egress IPs bound by a previous agent; they stay until the first reconcile decides", "bound", owned)
	}
	return a, nil
}

// Close stops every announcement and releases the sockets. It unbinds
// nothing: the addresses stay for the next agent instance. It returns the
// error of releasing the announcer's namespace handle, if any.
func (a *Agent) Close() error {
	err := a.ann.Close()
	a.binder.Close()
	return err
}

// Instance identifies this Agent; it is new for every New.
func (a *Agent) Instance() string { return a.instance }

// Report returns what the agent holds: every address egressip owns on the
// Node as of the last reconcile (or, before it, as found by New), with its
// interface and whether an announcement of its current burst was sent.
func (a *Agent) Report() report.Report {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := report.Report{Node: a.cfg.NodeName, Instance: a.instance, Bound: make([]report.BoundIP, 0, len(a.state))}
	for ip, e := range a.state {
		r.Bound = append(r.Bound, report.BoundIP{IP: ip, Interface: e.iface, Announced: e.announced})
	}
	for _, rf := range a.refused {
		rf.Egresses = slices.Clone(rf.Egresses)
		r.Refused = append(r.Refused, rf)
	}
	if st := a.dpStatus.Load(); st != nil {
		c := *st
		r.Datapath = &c
	}
	if st := a.ownStatus.Load(); st != nil {
		c := *st
		r.Ownership = &c
	}
	if rs := a.refusedEgresses.Load(); rs != nil && len(*rs) > 0 {
		r.RefusedEgresses = slices.Clone(*rs)
	}
	if st := a.kernel.Load(); st != nil {
		c := *st
		c.Missing = slices.Clone(st.Missing)
		r.Kernel = &c
	}
	r.Sort()
	return r
}

// ReadyCheck is a readiness check (healthz.Checker): it fails until the
// first reconcile has completed, whatever its outcome. It never fails again
// afterwards, also not during a control-plane outage.
func (a *Agent) ReadyCheck(*http.Request) error {
	if !a.synced.Load() {
		return errors.New("no reconcile completed yet (waiting for the first List of Egresses)")
	}
	return nil
}

func (a *Agent) hintFor(ip netip.Addr) bind.Hint {
	a.hintsMu.Lock()
	defer a.hintsMu.Unlock()
	return a.hints[ip]
}

func (a *Agent) setHints(h map[netip.Addr]bind.Hint) {
	a.hintsMu.Lock()
	a.hints = h
	a.hintsMu.Unlock()
}

// onAnnounce is called by the announcer after every attempt.
func (a *Agent) onAnnounce(ev announce.Event) {
	fam := familyOf(ev.IP)
	if ev.Err != nil {
		announceErrors.WithLabelValues(fam).Inc()
		a.log.Error(ev.Err, "announcement failed", "ip", ev.IP, "interface", ev.Interface)
		return
	}
	announcements.WithLabelValues(fam).Inc()
	a.mu.Lock()
	first := false
	if e := a.state[ev.IP]; e != nil && e.started && e.iface == ev.Interface {
		first = !e.announced
		e.announced = true
	}
	a.mu.Unlock()
	if first {
		a.log.Info("announced egress IP", "ip", ev.IP, "interface", ev.Interface, "family", fam)
	} else {
		a.log.V(1).Info("announced egress IP", "ip", ev.IP, "interface", ev.Interface, "family", fam)
	}
}

// noteOwnership publishes the binder's ownership status in the report and
// logs it when it changes (an error, with what to do, while it is bad).
func (a *Agent) noteOwnership(log logr.Logger) {
	st := ownershipStatus(a.binder.Status())
	prev := a.ownStatus.Swap(&st)
	if prev != nil && *prev == st {
		return
	}
	if st.Healthy {
		log.Info("address ownership", "mode", st.Mode, "reason", st.Reason, "detail", st.Message)
		return
	}
	log.Error(errors.New(st.Message), "address ownership record problem", "mode", st.Mode, "reason", st.Reason)
}

// ownershipStatus is the report form of a bind.Status.
func ownershipStatus(s bind.Status) report.OwnershipStatus {
	o := report.OwnershipStatus{Mode: string(s.Mode), Healthy: s.Err == nil}
	switch {
	case errors.Is(s.Err, bind.ErrRecordUnreadable):
		o.Reason = report.ReasonRecordUnreadable
	case errors.Is(s.Err, bind.ErrRecordUnwritable):
		o.Reason = report.ReasonRecordUnwritable
	case errors.Is(s.Err, bind.ErrRecordMissing):
		o.Reason = report.ReasonRecordMissing
	case s.Mode == bind.OwnershipRecord || s.MarkDropped:
		o.Reason = report.ReasonOwnershipRecord
	default:
		o.Reason = report.ReasonOwnershipMark
	}
	switch {
	case s.Err != nil:
		o.Message = s.Err.Error()
	case s.Mode == bind.OwnershipRecord:
		o.Message = "ownership record " + s.RecordPath + " (forced: IFA_PROTO not used)"
	case s.MarkDropped:
		o.Message = "the kernel drops the address protocol (IFA_PROTO, Linux 5.18+): ownership record " + s.RecordPath + " alone"
	case s.RecordPath != "":
		o.Message = "address protocol (IFA_PROTO) mark and ownership record " + s.RecordPath
	case s.Note != "":
		o.Message = s.Note
	default:
		o.Message = "address protocol (IFA_PROTO) mark, no ownership record"
	}
	if len(o.Message) > report.MaxDatapathMessage {
		o.Message = o.Message[:report.MaxDatapathMessage]
	}
	return o
}

// setBoundGauge sets egressip_agent_bound_ips from the state. Callers must
// not hold a.mu.
func (a *Agent) setBoundGauge() {
	a.mu.Lock()
	n := map[string]int{}
	for ip := range a.state {
		n[familyOf(ip)]++
	}
	a.mu.Unlock()
	for _, f := range []string{familyIPv4, familyIPv6} {
		boundIPs.WithLabelValues(f).Set(float64(n[f]))
	}
}

// Reconcile makes the Node hold exactly the egress IPs of the cached
// Egresses assigned to it; the request is ignored (there is one work key).
// It returns an error, and changes nothing, when the cache cannot be read;
// it returns the joined per-IP errors of binding and unbinding otherwise.
// On success it asks to run again after Config.ResyncPeriod.
func (a *Agent) Reconcile(ctx context.Context, _ reconcile.Request) (reconcile.Result, error) {
	start := time.Now()
	defer func() { reconcileDuration.Observe(time.Since(start).Seconds()) }()
	log := ctrllog.FromContext(ctx)

	if a.reader == nil {
		return reconcile.Result{}, errors.New("agent: SetupWithManager was not called")
	}
	var egs v1alpha1.EgressList
	if err := a.reader.List(ctx, &egs); err != nil {
		// The desired state is unknown: leave every address as it is.
		return reconcile.Result{}, fmt.Errorf("list Egresses assigned to node %s: %w", a.cfg.NodeName, err)
	}
	var pools v1alpha1.ExternalIPPoolList
	if err := a.reader.List(ctx, &pools); err != nil {
		return reconcile.Result{}, fmt.Errorf("list ExternalIPPools: %w", err)
	}
	d := computeDesired(a.cfg.NodeName, egs.Items, pools.Items)
	for _, s := range d.skipped {
		log.Info("ignoring Egress assigned to this node", "egress", klog.KRef("", s.name), "reason", s.reason)
	}

	err := a.apply(ctx, d)
	a.synced.Store(true)
	if err != nil {
		return reconcile.Result{}, err
	}
	return reconcile.Result{RequeueAfter: a.cfg.ResyncPeriod}, nil
}

type restart struct {
	ip    netip.Addr
	iface string
}

// apply syncs the bindings to d and starts or stops announcements.
func (a *Agent) apply(ctx context.Context, d desiredState) error {
	log := ctrllog.FromContext(ctx)

	// Stop announcing what is about to be released, before it is unbound,
	// so no announcement for an IP goes out after it left the Node.
	a.mu.Lock()
	var leaving []netip.Addr
	for ip := range a.state {
		if !d.want[ip] {
			leaving = append(leaving, ip)
		}
	}
	a.mu.Unlock()
	for _, ip := range leaving {
		a.ann.Stop(ip)
	}

	before, beforeErr := a.binder.Owned()
	a.setHints(d.hints)
	added, removed, syncErr := a.binder.Sync(d.ips)
	a.noteOwnership(log)
	for _, ip := range removed {
		log.Info("unbound egress IP", "ip", ip)
	}
	after, err := a.binder.Owned()
	if err != nil {
		// What is bound is unknown; drop only what is certainly gone.
		a.mu.Lock()
		for _, ip := range removed {
			delete(a.state, ip)
		}
		a.mu.Unlock()
		a.setBoundGauge()
		a.setRefused(d.refused, nil)
		return errors.Join(syncErr, err)
	}

	byIP := map[netip.Addr][]bind.Bound{}
	for _, b := range after {
		byIP[b.Addr] = append(byIP[b.Addr], b)
	}
	a.setRefused(d.refused, bindRefusals(d.ips, byIP, syncErr))
	// Errors, counted per IP from what the kernel holds afterwards.
	nBind, nUnbind := 0, 0
	for _, ip := range d.ips {
		if len(byIP[ip]) == 0 {
			nBind++
		}
	}
	if beforeErr == nil {
		seen := map[netip.Addr]bool{}
		for _, b := range before {
			if !d.want[b.Addr] && len(byIP[b.Addr]) > 0 && !seen[b.Addr] {
				seen[b.Addr] = true
				nUnbind++
			}
		}
	}
	bindErrors.Add(float64(nBind))
	unbindErrors.Add(float64(nUnbind))
	if syncErr != nil {
		log.Error(syncErr, "some egress IPs could not be synced", "bindFailures", nBind, "unbindFailures", nUnbind)
	}

	isAdded := map[netip.Addr]bool{}
	for _, ip := range added {
		isAdded[ip] = true
	}
	running := map[netip.Addr]bool{}
	for _, ip := range a.ann.Running() {
		running[ip] = true
	}

	a.mu.Lock()
	next := make(map[netip.Addr]*entry, len(byIP))
	var gone []netip.Addr
	var restarts []restart
	for ip, bs := range byIP {
		iface := bs[0].Interface
		if len(bs) > 1 && d.want[ip] {
			// Owned on several links (a move whose clean-up failed):
			// report and announce the one chosen now.
			if sel, err := a.binder.Interface(ip); err == nil && slices.ContainsFunc(bs, func(b bind.Bound) bool { return b.Interface == sel }) {
				iface = sel
			}
		}
		e := &entry{iface: iface}
		if old := a.state[ip]; old != nil && old.iface == iface {
			*e = *old
		}
		next[ip] = e
		if d.want[ip] && (!e.started || isAdded[ip] || (!e.announced && !running[ip])) {
			restarts = append(restarts, restart{ip, iface})
		}
	}
	for ip := range a.state {
		if next[ip] == nil {
			gone = append(gone, ip)
		}
	}
	a.state = next
	a.mu.Unlock()
	a.setBoundGauge()

	for _, ip := range gone {
		a.ann.Stop(ip) // desired but not bound (the bind failed), or released
	}
	slices.SortFunc(restarts, func(x, y restart) int { return x.ip.Compare(y.ip) })
	for _, r := range restarts {
		// Stop waits for the previous burst to end, so none of its events
		// can mark the new binding announced.
		a.ann.Stop(r.ip)
		a.mu.Lock()
		if e := a.state[r.ip]; e != nil {
			e.started, e.announced = true, false
		}
		a.mu.Unlock()
		if isAdded[r.ip] {
			log.Info("bound egress IP", "ip", r.ip, "interface", r.iface)
		} else {
			log.Info("re-announcing egress IP", "ip", r.ip, "interface", r.iface)
		}
		a.ann.Start(r.ip, r.iface)
	}
	return syncErr
}
