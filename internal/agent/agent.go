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
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent/announce"
	"github.com/egressip/egressip/internal/agent/bind"
	"github.com/egressip/egressip/internal/agent/conflict"
	"github.com/egressip/egressip/internal/agent/fence"
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
	// CreateVLANs: create the VLAN sub-interface a pool's subnetInfo.vlan
	// names (package poolroute's rules: marked as egressip's, a foreign
	// link with that ID refused) instead of expecting it to exist.
	CreateVLANs bool
	// VLANParent, with CreateVLANs, is the parent of every such
	// sub-interface; empty: the interface chosen for the IP without the
	// VLAN (the one carrying the untagged subnet).
	VLANParent string
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
	// AddressLifetime is the valid lifetime egress addresses are bound
	// with (bind.Config.Lifetime): the kernel removes an address the agent
	// has not renewed for that long, so an agent that is gone leaves no
	// duplicate behind (issue 16). 0 binds them forever. Whole seconds,
	// at least twice RenewInterval and at most ControllerDeadAfter.
	AddressLifetime time.Duration
	// RenewInterval is how often the agent renews the lifetime of every
	// owned address; 0 means DefaultRenewInterval. Unused when
	// AddressLifetime is 0.
	RenewInterval time.Duration
	// ControllerDeadAfter is the controller's --agent-dead-after (the
	// agent's --controller-dead-after), which
	// AddressLifetime must not exceed: an agent that is gone loses its
	// addresses about when the controller moves them. 0 means
	// DefaultControllerDeadAfter.
	ControllerDeadAfter time.Duration
	// ConflictInterval is how often every bound egress IP is probed for
	// duplicates on the wire (package conflict), besides at start and after
	// each bind. 0 means conflict.DefaultInterval (10 s); negative turns
	// the checks off.
	ConflictInterval time.Duration
	// ConflictProbe shapes one probe round; the zero value takes the
	// package's defaults.
	ConflictProbe conflict.ProbeConfig
	// TakeoverGuard is the longest time a reconcile holds back binding an
	// egress IP this Node does not hold yet while another host still
	// answers ARP / ND for it (guard.go): a Node cut off from the
	// controller releases its IPs on its own (fencing), and the guard
	// keeps the new Node silent until it has. 0 means
	// DefaultTakeoverGuard; negative turns the guard off.
	TakeoverGuard time.Duration
	// TakeoverProbe shapes the guard's probe round; zero fields take
	// DefaultTakeoverProbe's.
	TakeoverProbe conflict.ProbeConfig
}

// Defaults of the address lifetime (docs/failover.md, "Agent gone").
const (
	// DefaultAddressLifetime is the default valid lifetime of egress
	// addresses (--address-lifetime): the controller's default
	// --agent-dead-after (2 s), the longest it may be.
	DefaultAddressLifetime = 2 * time.Second
	// DefaultRenewInterval is the default of --address-renew-interval:
	// a quarter of the lifetime, so three renewals in a row may be late
	// or lost before an address expires on a live agent.
	DefaultRenewInterval = 500 * time.Millisecond
	// DefaultControllerDeadAfter is the controller's default
	// --agent-dead-after (controller.DefaultDeadAfter).
	DefaultControllerDeadAfter = 2 * time.Second
)

// CheckLifetime checks the address lifetime against the renew interval
// and the controller's dead-after (Config's rules); the error names both
// flags concerned.
func CheckLifetime(lifetime, renew, deadAfter time.Duration) error {
	if renew == 0 {
		renew = DefaultRenewInterval
	}
	if deadAfter == 0 {
		deadAfter = DefaultControllerDeadAfter
	}
	switch {
	case lifetime == 0:
		return nil
	case lifetime < 0 || lifetime%time.Second != 0:
		return fmt.Errorf("--address-lifetime %v: want whole seconds (the kernel counts lifetimes in seconds), or 0 for addresses that never expire", lifetime)
	case renew < 0:
		return fmt.Errorf("--address-renew-interval %v is negative", renew)
	case lifetime < 2*renew:
		return fmt.Errorf("--address-lifetime %v must be at least twice --address-renew-interval %v, so that one late renewal does not remove the addresses", lifetime, renew)
	case lifetime > deadAfter:
		return fmt.Errorf("--address-lifetime %v must not exceed --controller-dead-after %v (the controller's --agent-dead-after): an agent that is gone would leave its addresses answering after the controller moved them", lifetime, deadAfter)
	}
	return nil
}

// entry is one owned address as the report shows it.
type entry struct {
	iface string
	// started: this process started an announcement burst for the binding
	// on iface.
	started bool
	// announced: an announcement of that burst was sent.
	announced bool
	// gen is the arrival generation (assign.go) the current burst was
	// started for; a larger one restarts the burst.
	gen uint64
	// want: the IP is assigned here (probed for duplicates).
	want bool
}

// Agent binds and announces the egress IPs assigned to one Node. It
// implements reconcile.Reconciler; see the package documentation.
type Agent struct {
	cfg      Config
	instance string
	binder   *bind.Binder
	// vlans keeps the VLAN sub-interfaces (Config.CreateVLANs); nil without.
	vlans *vlanKeeper
	ann   *announce.Announcer
	log   logr.Logger

	reader client.Reader // the manager's cache, set by SetupWithManager
	// indexer adds HolderIndex to the cache (set by SetupWithManager; nil:
	// list every Egress); indexed says it was added.
	indexer client.FieldIndexer
	indexMu sync.Mutex
	indexed atomic.Bool

	hintsMu sync.Mutex
	hints   map[netip.Addr]bind.Hint

	mu    sync.Mutex
	state map[netip.Addr]*entry
	// refused are the assigned IPs the last reconcile did not bind, and
	// why (report.Report.Refused).
	refused []report.RefusedIP

	synced atomic.Bool // a reconcile has completed

	// Assignment arrivals (assign.go): assignGen is each IP's arrival
	// generation, from the counter assignSeq; seenEpoch is, per Egress,
	// the gap epoch of the last event seen; gapEpoch counts the Egress
	// informer's watch errors.
	assignMu  sync.Mutex
	assignSeq uint64
	assignGen map[netip.Addr]uint64
	seenEpoch map[types.UID]uint64
	gapEpoch  atomic.Uint64

	// dpStatus is the datapath finding served in the report (nil: none).
	dpStatus atomic.Pointer[report.DatapathStatus]
	// ownStatus is the ownership status served in the report.
	ownStatus atomic.Pointer[report.OwnershipStatus]
	// refusedEgresses is the datapath's refused Egresses the report serves.
	refusedEgresses atomic.Pointer[[]report.RefusedEgress]
	// kernel is the kernel feature finding served in the report (nil: none).
	kernel atomic.Pointer[report.KernelStatus]
	// vlanStatus is the last VLAN sync's outcome the report serves
	// (report.Report.VLANs); nil without Config.CreateVLANs.
	vlanStatus atomic.Pointer[report.VLANStatus]

	// lastPoll is when the report was last served to a poll, in Unix
	// nanoseconds (0: never); see LastControllerPoll.
	lastPoll atomic.Int64
	// reconcileStarts counts the reconciles begun; reconcileDone is the
	// number (in that count) of the last one finished (awaitAnnounced).
	reconcileStarts, reconcileDone atomic.Int64
	// releaseMu guards releases.
	releaseMu sync.Mutex
	// releases are the controller's release instructions (report.Release)
	// by Egress UID; see onPoll and withoutReleased.
	releases map[types.UID]*heldRelease
	// acquires are the last poll's acquire instructions (report.Acquire)
	// by Egress UID (guarded by releaseMu); see withAcquired.
	acquires map[types.UID]*heldAcquire
	// kick asks for a reconcile (a poll brought a new release instruction
	// for an IP the Node holds).
	kick chan event.GenericEvent
	// started is when New ran (the fencer's "last poll" until the first).
	started time.Time
	// apiReader reads the API server directly (consistent reads), set by
	// SetupWithManager; the rejoin after a fence uses it.
	apiReader client.Reader
	// fenced: the fencer decided this Node must hold no egress IP.
	fenced atomic.Bool
	// rejoining: the fence was lifted and the cache has not yet been seen
	// to agree with a consistent read (see rejoin).
	rejoining atomic.Bool
	// fenceStatus is the fence state served in the report (nil: never
	// fenced).
	fenceStatus atomic.Pointer[report.FenceStatus]
	// Duplicate-IP detection (conflicts.go): nil checker when off.
	prober  *conflict.Prober
	checker *conflict.Checker
	// conflicts and macs are served in the report.
	conflicts atomic.Pointer[[]report.ConflictIP]
	macs      atomic.Pointer[[]string]
	// guard is the takeover guard's state (guard.go); reconciles alone
	// use it, one at a time.
	guard takeoverGuard
	// certs is the agent's identity for the report server; nil serves
	// plain HTTP (SetCertificates).
	certs *agentcert.Source
}

// heldRelease is one release instruction the agent honours.
type heldRelease struct {
	report.Release
	// fresh: the last poll carried it.
	fresh bool
}

// LastControllerPoll is when this agent last served its report to a poll
// (the controller is the only client of the report port), or the zero time
// if it never did.
func (a *Agent) LastControllerPoll() time.Time {
	if n := a.lastPoll.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// onPoll serves one poll: it notes the time (LastControllerPoll), takes
// the poll's release instructions (replacing those of the previous poll;
// entries the poll no longer carries are kept while the cache still shows
// their Egress older than the instruction, see withoutReleased), asks for a
// reconcile when one names an IP the Node holds and is new, takes the
// poll's acquire instructions (a new one asks for a reconcile, and the
// answer waits up to acquireAnswerWait for its IP to be announced, see
// withAcquired), and returns the report.
func (a *Agent) onPoll(p report.Poll) report.Report {
	a.lastPoll.Store(time.Now().UnixNano())
	newFor := false
	a.releaseMu.Lock()
	if a.releases == nil {
		a.releases = map[types.UID]*heldRelease{}
	}
	for _, h := range a.releases {
		h.fresh = false
	}
	var taken []report.Release
	for _, r := range p.Releases {
		uid := types.UID(r.UID)
		if h, ok := a.releases[uid]; ok && h.Release == r {
			h.fresh = true
			continue
		}
		a.releases[uid] = &heldRelease{Release: r, fresh: true}
		taken = append(taken, r)
	}
	a.releaseMu.Unlock()
	if added := a.takeAcquires(p, time.Now()); len(added) > 0 {
		a.log.Info("the controller asks this Node to bind egress IPs before their move is written", "new", len(added), "acquires", len(p.Acquires))
		after := a.reconcileStarts.Load()
		a.kickReconcile()
		a.awaitAnnounced(added, after, acquireAnswerWait)
	}
	if len(taken) > 0 {
		a.mu.Lock()
		for _, r := range taken {
			if a.state[r.IP] != nil {
				newFor = true
			}
		}
		a.mu.Unlock()
	}
	if newFor {
		a.log.Info("the controller asks this Node to release egress IPs", "releases", taken)
		select {
		case a.kick <- event.GenericEvent{Object: &v1alpha1.Egress{}}:
		default: // a reconcile is already pending
		}
	}
	return a.Report()
}

// withoutReleased returns egs without the Egresses a release instruction
// holds back: the cache shows the Egress older than the instruction's
// resource version, so its assignment to this Node is stale (the
// controller has already taken it away). It forgets the instructions that
// need no honouring any more: the cache shows their Egress at that version
// or newer, or no longer holds it and the last poll did not carry them.
// Resource versions that cannot be compared count as older unless equal.
func (a *Agent) withoutReleased(log logr.Logger, egs []v1alpha1.Egress) []v1alpha1.Egress {
	a.releaseMu.Lock()
	defer a.releaseMu.Unlock()
	if len(a.releases) == 0 {
		return egs
	}
	inCache := make(map[types.UID]bool, len(egs))
	out := make([]v1alpha1.Egress, 0, len(egs))
	for i := range egs {
		eg := &egs[i]
		inCache[eg.UID] = true
		h, ok := a.releases[eg.UID]
		if !ok {
			out = append(out, *eg)
			continue
		}
		c, err := resourceversion.CompareResourceVersion(eg.ResourceVersion, h.ResourceVersion)
		if err != nil && eg.ResourceVersion == h.ResourceVersion {
			c = 0
		} else if err != nil {
			c = -1
		}
		if c >= 0 {
			delete(a.releases, eg.UID)
			out = append(out, *eg)
			continue
		}
		if slices.Contains(holderNodes(eg), a.cfg.NodeName) {
			log.Info("not binding: the controller asked this Node to release the IP, and this cache's copy of the Egress is older than the controller's",
				"egress", klog.KObj(eg), "ip", h.IP, "cachedVersion", eg.ResourceVersion, "controllerVersion", h.ResourceVersion)
		}
	}
	for uid, h := range a.releases {
		if !inCache[uid] && !h.fresh {
			delete(a.releases, uid)
		}
	}
	return out
}

// lastPollOrStart is LastControllerPoll, or the agent's start when it was
// never polled: an agent that starts cut off fences like one cut off later.
func (a *Agent) lastPollOrStart() time.Time {
	if t := a.LastControllerPoll(); !t.IsZero() {
		return t
	}
	return a.started
}

// Fenced reports whether the agent is fenced (holds no egress IP because
// its fencer said so).
func (a *Agent) Fenced() bool { return a.fenced.Load() }

// SetFence applies a fencing decision: a fence makes every reconcile
// desire nothing (so the next one, asked for at once, unbinds every egress
// IP and stops announcing it); lifting it starts the rejoin (see rejoin).
// It is the fence.Fencer's OnChange.
func (a *Agent) SetFence(ctx context.Context, d fence.Decision) {
	log := ctrllog.FromContext(ctx)
	msg := d.Message
	if len(msg) > report.MaxDatapathMessage {
		msg = msg[:report.MaxDatapathMessage]
	}
	st := &report.FenceStatus{Fenced: d.Fence, Reason: d.Reason, Message: msg, Since: time.Now()}
	if prev := a.fenceStatus.Load(); prev != nil {
		st.FencedAt, st.FenceReason, st.FenceMessage = prev.FencedAt, prev.FenceReason, prev.FenceMessage
	}
	if d.Fence {
		st.FencedAt, st.FenceReason, st.FenceMessage = st.Since, d.Reason, msg
		a.rejoining.Store(false)
		a.fenced.Store(true)
	} else {
		if !a.fenced.Load() {
			return
		}
		st.Rejoining = true
		a.rejoining.Store(true)
		a.fenced.Store(false)
	}
	a.fenceStatus.Store(st)
	log.Info("fence state changed; reconciling", "node", klog.KRef("", a.cfg.NodeName), "fenced", d.Fence, "reason", d.Reason)
	select {
	case a.kick <- event.GenericEvent{Object: &v1alpha1.Egress{}}:
	default: // a reconcile is already pending
	}
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
	if err := CheckLifetime(cfg.AddressLifetime, cfg.RenewInterval, cfg.ControllerDeadAfter); err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	if cfg.RenewInterval == 0 {
		cfg.RenewInterval = DefaultRenewInterval
	}
	if cfg.TakeoverGuard == 0 {
		cfg.TakeoverGuard = DefaultTakeoverGuard
	}
	cfg.TakeoverProbe = cfg.TakeoverProbe.Or(DefaultTakeoverProbe)
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
		cfg:       cfg,
		instance:  hex.EncodeToString(id),
		log:       ctrllog.Log.WithName("agent").WithValues("node", klog.KRef("", cfg.NodeName)),
		hints:     map[netip.Addr]bind.Hint{},
		state:     map[netip.Addr]*entry{},
		assignGen: map[netip.Addr]uint64{},
		seenEpoch: map[types.UID]uint64{},
		kick:      make(chan event.GenericEvent, 1),
		started:   time.Now(),
	}
	b, err := bind.New(ns, bind.Config{Interface: cfg.Interface, HintFor: a.hintFor, Proto: cfg.Proto,
		Ownership: cfg.Ownership, RecordPath: cfg.RecordPath, Lifetime: cfg.AddressLifetime})
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
	if cfg.CreateVLANs {
		if a.vlans, err = newVLANKeeper(ns, cfg); err != nil {
			_ = a.Close()
			return nil, fmt.Errorf("agent: %w", err)
		}
	}
	if cfg.ConflictInterval >= 0 || cfg.TakeoverGuard >= 0 {
		if a.prober, err = conflict.NewProber(ns, cfg.ConflictProbe); err != nil {
			_ = a.Close()
			return nil, fmt.Errorf("agent: %w", err)
		}
	}
	if cfg.ConflictInterval >= 0 {
		a.checker = conflict.NewChecker(a.prober, a.conflictTargets, cfg.ConflictInterval, a.onConflictRound, a.log.WithName("conflict"))
	}

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
	// Adopted addresses get this agent's lifetime at once: the previous
	// agent's last renewal may be almost a lifetime ago.
	if _, err := b.Renew(); err != nil {
		a.log.Error(err, "cannot renew the lifetime of adopted egress IPs")
	}
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
	if a.vlans != nil {
		a.vlans.Close()
	}
	if a.prober != nil {
		err = errors.Join(err, a.prober.Close())
	}
	return err
}

// RenewAddresses renews the valid lifetime of every owned address
// (bind.Binder.Renew) every Config.RenewInterval until ctx is done; it
// returns at once when Config.AddressLifetime is 0. An address the
// agent holds that was not renewed (it expired, or was removed by hand)
// triggers a reconcile, which binds it again if it is still assigned.
func (a *Agent) RenewAddresses(ctx context.Context) {
	if a.cfg.AddressLifetime == 0 {
		return
	}
	t := time.NewTicker(a.cfg.RenewInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		renewed, err := a.binder.Renew()
		if err != nil {
			renewErrors.Inc()
			a.log.Error(err, "cannot renew the lifetime of egress IPs; the kernel removes those not renewed within --address-lifetime", "lifetime", a.cfg.AddressLifetime)
		}
		got := make(map[netip.Addr]bool, len(renewed))
		for _, ip := range renewed {
			got[ip] = true
		}
		a.mu.Lock()
		var lost []netip.Addr
		for ip := range a.state {
			if !got[ip] {
				lost = append(lost, ip)
			}
		}
		a.mu.Unlock()
		if len(lost) > 0 && err == nil {
			a.log.Info("egress IPs gone from the Node before their renewal (expired or removed by hand); reconciling", "ips", lost)
			select {
			case a.kick <- event.GenericEvent{Object: &v1alpha1.Egress{}}:
			default:
			}
		}
	}
}

// RenewAtStart renews, once, the lifetime of the addresses egressip owns
// in the namespace cfg names, with cfg's lifetime and ownership settings
// (bind.Binder.Renew). egressip-agent calls it first thing, before its
// kernel probes, so that a quick restart leaves no gap. Errors are those
// of opening the namespace or the Binder, and of the renewal.
func RenewAtStart(cfg Config) error {
	if err := CheckLifetime(cfg.AddressLifetime, cfg.RenewInterval, cfg.ControllerDeadAfter); err != nil {
		return err
	}
	ns := netns.None()
	if cfg.NetNSPath != "" {
		h, err := netns.GetFromPath(cfg.NetNSPath)
		if err != nil {
			return fmt.Errorf("open network namespace %s: %w", cfg.NetNSPath, err)
		}
		defer func() { _ = h.Close() }()
		ns = h
	}
	b, err := bind.New(ns, bind.Config{Proto: cfg.Proto, Ownership: cfg.Ownership, RecordPath: cfg.RecordPath, Lifetime: cfg.AddressLifetime})
	if err != nil {
		return err
	}
	defer b.Close()
	_, err = b.Renew()
	return err
}

// Instance identifies this Agent; it is new for every New.
func (a *Agent) Instance() string { return a.instance }

// Report returns what the agent holds (and the MACs of the Node's NICs,
// bind.Binder.NICs): every address egressip owns on the
// Node as of the last reconcile (or, before it, as found by New), with its
// interface and whether an announcement of its current burst was sent.
func (a *Agent) Report() report.Report {
	var nics []string
	var nicErr error
	if a.binder != nil { // nil in tests that build an Agent without one
		nics, nicErr = a.binder.NICs(report.MaxMACs) // outside a.mu: a netlink dump
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	r := report.Report{Node: a.cfg.NodeName, Instance: a.instance, Bound: make([]report.BoundIP, 0, len(a.state)), Acquires: true}
	if nicErr == nil && len(nics) > 0 {
		r.NICs = nics
	}
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
	if st := a.fenceStatus.Load(); st != nil {
		c := *st
		r.Fence = &c
	}
	if st := a.vlanStatus.Load(); st != nil {
		r.VLANs = &report.VLANStatus{Links: slices.Clone(st.Links), Problems: slices.Clone(st.Problems), More: st.More}
	}
	a.reportConflicts(&r)
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
		o.Reason = v1alpha1.ReasonRecordUnreadable
	case errors.Is(s.Err, bind.ErrRecordUnwritable):
		o.Reason = v1alpha1.ReasonRecordUnwritable
	case errors.Is(s.Err, bind.ErrRecordMissing):
		o.Reason = v1alpha1.ReasonRecordMissing
	case s.Mode == bind.OwnershipRecord || s.MarkDropped:
		o.Reason = v1alpha1.ReasonOwnershipRecord
	default:
		o.Reason = v1alpha1.ReasonOwnershipMark
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
	seq := a.reconcileStarts.Add(1)
	defer func() {
		reconcileDuration.Observe(time.Since(start).Seconds())
		a.reconcileDone.Store(seq)
	}()
	log := ctrllog.FromContext(ctx)

	if a.reader == nil {
		return reconcile.Result{}, errors.New("agent: SetupWithManager was not called")
	}
	held, err := a.listHeld(ctx)
	if err != nil {
		// The desired state is unknown: leave every address as it is.
		return reconcile.Result{}, fmt.Errorf("list Egresses assigned to node %s: %w", a.cfg.NodeName, err)
	}
	var pools v1alpha1.ExternalIPPoolList
	if err := a.reader.List(ctx, &pools); err != nil {
		return reconcile.Result{}, fmt.Errorf("list ExternalIPPools: %w", err)
	}
	held, acquiring := a.withAcquired(ctx, a.withoutReleased(log, held))
	d := computeDesired(a.cfg.NodeName, held, pools.Items)
	for _, s := range d.skipped {
		log.Info("ignoring Egress assigned to this node", "egress", klog.KRef("", s.name), "reason", s.reason)
	}
	next := a.cfg.ResyncPeriod
	if acquiring && (next <= 0 || next > acquireTTL/3) {
		next = acquireTTL / 3 // drop them soon after the polls stop
	}
	switch {
	case a.fenced.Load():
		d = desiredState{want: map[netip.Addr]bool{}, hints: d.hints}
	case a.rejoining.Load():
		d = a.rejoin(ctx, d, pools.Items)
		if a.rejoining.Load() {
			next = rejoinRetry
		}
	}

	err = a.apply(ctx, d)
	a.synced.Store(true)
	if err != nil {
		return reconcile.Result{}, err
	}
	if len(a.guard.since) > 0 && (next <= 0 || next > takeoverRetry) {
		next = takeoverRetry // probe the held IPs again
	}
	return reconcile.Result{RequeueAfter: next}, nil
}

// rejoinRetry is how often a rejoining agent compares its cache with a
// consistent read.
const rejoinRetry = time.Second

// rejoin is the desired state of a reconcile after a fence was lifted:
// the informers may not have caught up with the moves made while the Node
// was fenced (a watch re-established after an outage can lag by its
// backoff, up to 30 s), so an IP that moved to another Node could still
// look assigned here. It reads the Egresses from the API server (a
// consistent list of all of them: the IPs of an Egress with spec.ips are
// not selectable by a field selector, see HolderIndex) and desires only the IPs both that read and the cache (cached) ask for.
// Once both agree the rejoin ends and the cache alone is followed again.
// When the read fails nothing is desired (the agent stays as fenced).
func (a *Agent) rejoin(ctx context.Context, cached desiredState, pools []v1alpha1.ExternalIPPool) desiredState {
	log := ctrllog.FromContext(ctx)
	none := desiredState{want: map[netip.Addr]bool{}, hints: cached.hints}
	if a.apiReader == nil {
		return none
	}
	var live v1alpha1.EgressList
	if err := a.apiReader.List(ctx, &live); err != nil {
		log.Info("rejoining after a fence: cannot read the Egresses assigned to this Node from the API server yet; binding nothing", "err", err)
		return none
	}
	ld := computeDesired(a.cfg.NodeName, live.Items, pools)
	if slices.Equal(ld.ips, cached.ips) {
		a.rejoining.Store(false)
		if st := a.fenceStatus.Load(); st != nil {
			c := *st
			c.Rejoining, c.Since = false, time.Now()
			a.fenceStatus.Store(&c)
		}
		log.Info("rejoined after a fence: the cache agrees with the API server", "assigned", cached.ips)
		return cached
	}
	both := desiredState{want: map[netip.Addr]bool{}, hints: cached.hints, refused: cached.refused}
	for _, ip := range cached.ips {
		if ld.want[ip] {
			both.ips = append(both.ips, ip)
			both.want[ip] = true
		}
	}
	log.Info("rejoining after a fence: the cache differs from the API server; binding only what both assign here",
		"cached", cached.ips, "apiServer", ld.ips, "binding", both.ips)
	return both
}

type restart struct {
	ip    netip.Addr
	iface string
	// arrived: the burst restarts only because an assignment of the IP
	// arrived again (assign.go).
	arrived bool
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
	bindIPs, vlanErrs := d.ips, map[netip.Addr]error(nil)
	if a.vlans != nil {
		var st *report.VLANStatus
		vlanErrs, st = a.vlans.ensure(log, d.ips, d.hints)
		a.vlanStatus.Store(st)
		bindIPs = slices.DeleteFunc(slices.Clone(d.ips), func(ip netip.Addr) bool { return vlanErrs[ip] != nil })
	}
	held := a.guardTakeovers(ctx, bindIPs, d.hints, before, beforeErr)
	bindIPs = without(bindIPs, held)
	added, removed, syncErr := a.binder.Sync(bindIPs)
	for _, ip := range d.ips {
		if vlanErrs[ip] != nil {
			syncErr = errors.Join(vlanErrs[ip], syncErr)
		}
	}
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
	// An IP the takeover guard holds back is not refused: it waits.
	tried := without(d.ips, held)
	a.setRefused(d.refused, bindRefusals(tried, byIP, syncErr))
	// Errors, counted per IP from what the kernel holds afterwards.
	nBind, nUnbind := 0, 0
	for _, ip := range tried {
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
	gens := a.arrivals(d.want)

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
		e.want = d.want[ip]
		next[ip] = e
		if d.want[ip] && (!e.started || isAdded[ip] || (!e.announced && !running[ip]) || e.gen != gens[ip]) {
			restarts = append(restarts, restart{ip, iface, e.started && !isAdded[ip] && e.gen != gens[ip]})
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
	a.restartBursts(ctx, restarts, isAdded, gens)
	return syncErr
}

// restartBursts starts a new announcement burst for each of restarts (in
// IP order), recording the arrival generation it is for, and asks for a
// duplicate-IP probe round when there is any.
func (a *Agent) restartBursts(ctx context.Context, restarts []restart, isAdded map[netip.Addr]bool, gens map[netip.Addr]uint64) {
	log := ctrllog.FromContext(ctx)
	slices.SortFunc(restarts, func(x, y restart) int { return x.ip.Compare(y.ip) })
	for _, r := range restarts {
		// Stop waits for the previous burst to end, so none of its events
		// can mark the new binding announced.
		a.ann.Stop(r.ip)
		a.mu.Lock()
		if e := a.state[r.ip]; e != nil {
			e.started, e.announced, e.gen = true, false, gens[r.ip]
		}
		a.mu.Unlock()
		switch {
		case isAdded[r.ip]:
			log.Info("bound egress IP", "ip", r.ip, "interface", r.iface)
		case r.arrived:
			log.Info("re-announcing egress IP: its assignment to this Node arrived again", "ip", r.ip, "interface", r.iface)
		default:
			log.Info("re-announcing egress IP", "ip", r.ip, "interface", r.iface)
		}
		a.ann.Start(r.ip, r.iface)
	}
	if len(restarts) > 0 && a.checker != nil {
		a.checker.Kick() // at start and after each bind (or return): probe for duplicates
	}
}
