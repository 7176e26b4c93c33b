package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/cloud"
	"github.com/egressip/egressip/internal/cloud/warm"
)

// Provider calls, as the action label of the cloud call metrics names them.
const (
	actionInterfaces  = "Interfaces"
	actionAssign      = "Assign"
	actionAssignCount = "AssignCount"
	actionUnassign    = "Unassign"
)

var (
	cloudCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "egressip_controller_cloud_calls_total",
		Help: "Cloud API calls the controller made, by action (Interfaces, Holders, Assign, AssignCount, Unassign, TaggedInterfaces, SubnetZones, CreateInterface, AttachInterface, DeleteInterface, ElasticIPs, Associate, Disassociate) and result (ok, LimitExceeded, SubnetFull, Throttled, NotFound, InUse, Unauthorized, InterfaceLimit, error).",
	}, []string{"action", labelResult})
	cloudCallDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "egressip_controller_cloud_call_duration_seconds",
		Help:    "Duration of one cloud API call as the controller sees it (SDK retries included), by action, in seconds.",
		Buckets: prometheus.ExponentialBuckets(0.01, 2, 12),
	}, []string{"action"})
	poolCloudIPs = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "egressip_controller_pool_cloud_ips",
		Help: "Addresses of a cloud-backed ExternalIPPool after the last pass, by state: attached (allocated + warm), warm (attached, allocated to no Egress), allocated.",
	}, []string{labelPool, "state"})
)

func init() {
	metrics.Registry.MustRegister(cloudCalls, cloudCallDuration, poolCloudIPs)
}

// CloudConfig sets how the controller uses a cloud provider.
type CloudConfig struct {
	// Provider is the cloud API; nil disables cloud-backed pools.
	Provider cloud.Provider
	// RefreshInterval is how often the Nodes' interfaces are re-read from
	// the cloud (to see addresses others attached or detached, and
	// capacity changes). Default 60 s.
	RefreshInterval time.Duration
	// Parallelism bounds concurrent cloud calls. Default 4.
	Parallelism int
	// BackoffInitial and BackoffMax bound the exponential backoff after
	// an interface or subnet was reported full or the API kept throttling.
	// Defaults 1 s and 2 min.
	BackoffInitial, BackoffMax time.Duration
	// Overlay is how long the controller trusts its own calls' results
	// over a re-read that does not show them yet (the cloud's reads lag
	// its writes). Default 2 min.
	Overlay time.Duration
	// ClusterName is the value of the egressip.io/cluster tag on the
	// network interfaces the controller creates, so that controllers of
	// several clusters in one account never touch each other's. Default
	// "egressip".
	ClusterName string
	// Clock is the time the actuator reads and waits on: refresh ticks,
	// backoffs, overlay deadlines, cooldowns, re-read spacing. Default
	// clock.RealClock{}; tests set a k8s.io/utils/clock/testing.FakeClock
	// and step it.
	Clock clock.WithTicker
}

func (c *CloudConfig) defaults() {
	if c.RefreshInterval <= 0 {
		c.RefreshInterval = time.Minute
	}
	if c.Parallelism <= 0 {
		c.Parallelism = 4
	}
	if c.BackoffInitial <= 0 {
		c.BackoffInitial = time.Second
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = 2 * time.Minute
	}
	if c.Overlay <= 0 {
		c.Overlay = 2 * time.Minute
	}
	if c.ClusterName == "" {
		c.ClusterName = "egressip"
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
}

// overlayEntry is the result of one of our own calls for one address.
type overlayEntry struct {
	node     string // attached to this Node's interface; "" = detached
	iface    string
	deadline time.Time
}

// backoffKind says what a failed cloud call backs off.
type backoffKind uint8

const (
	// backoffInterface: calls on one network interface (id: its ID); the
	// pass treats the interface as blocked meanwhile.
	backoffInterface backoffKind = iota + 1
	// backoffPool: warm attaches for one pool after a full subnet or
	// throttling (id: the pool's name).
	backoffPool
	// backoffCreate: creating and attaching interfaces of the controller's
	// own for one pool (id: the pool's name).
	backoffCreate
	// backoffDelete: deleting one interface of the controller's own (id:
	// its ID).
	backoffDelete
)

// backoffKey names one backoff: what backs off, and which one.
type backoffKey struct {
	kind backoffKind
	id   string
}

// String is the key's ID in flowcontrol.Backoff, unique per key.
func (k backoffKey) String() string {
	return [...]string{backoffInterface: "eni", backoffPool: "pool", backoffCreate: "create", backoffDelete: "delete"}[k.kind] + "/" + k.id
}

// CloudActuator is the runnable that holds the controller's view of the
// cloud and runs the cloud calls the pass decides, off the pass's critical
// path: the pass reads a snapshot (Input), decides,
// and hands the calls to Run, which executes them in the background and
// signals a new pass through Events when they complete.
//
// Nothing here is the only copy of anything: a restarted controller
// rebuilds the view from the cloud (Interfaces) and its ownership of
// addresses from the pool statuses (warm list) and Egress statuses.
type CloudActuator struct {
	cfg    CloudConfig
	reader client.Reader
	// Events receives one event when a call completed or the view
	// changed; the pass controller watches it.
	Events chan event.GenericEvent

	mu            sync.Mutex
	ready         bool
	ifaces        map[string]cloud.Interface
	overlay       map[netip.Addr]overlayEntry
	owned         map[string]map[netip.Addr]bool
	prevAllocated map[string]map[netip.Addr]bool
	cool          map[netip.Addr]time.Time
	lastScaleDown map[string]time.Time
	busy          map[string]bool
	detaching     map[netip.Addr]bool
	attaching     map[netip.Addr]string
	lastError     map[string]string
	warmAttaching map[string]int
	recent        map[string]netip.Addr
	held          map[netip.Addr]heldAddr
	ours          map[netip.Addr]string // address -> interface our own call attached it to
	eips          map[string]eipView    // pool -> its Elastic IPs as last read
	// writeSeq numbers our completed calls; eniOverlay and eipOverlay
	// keep their results over re-reads begun before them (cloudoverlay.go).
	writeSeq   uint64
	eniOverlay map[string]eniOverlayEntry
	eipOverlay map[string]eipOverlayEntry
	// devices are, per instance, the device indexes of the creates in
	// flight, so that a create in the next pass picks another.
	devices      map[string][]int
	runCtx       context.Context
	backoff      *flowcontrol.Backoff
	backoffUntil map[backoffKey]time.Time
	refreshNow   chan struct{}
	// Own interfaces (OwnInterfaces pools): every interface tagged with
	// our cluster, the pools' subnets, the "node/pool" pairs with a
	// create in flight, and each pool's last interface error.
	tagged    []cloud.ENI
	subnets   map[string]cloud.Subnet
	subnetErr map[string]string
	creating  map[string]bool
	poolError map[string]string
	// createFailed marks the pools whose poolError came from a create or
	// an attach: it is dropped once a pass wants no interface for the
	// pool any more (dropStaleCreateErrors).
	createFailed map[string]bool
	// lateAsked are the late facts a re-read was asked for (askLate).
	lateAsked map[string]bool
	// nicAsked is, per Node, the NIC list its agent reported that differs
	// from the cloud view and the re-reads asked for it (nicsReported);
	// nicPending are the Nodes whose re-read nicNow asks for.
	nicAsked   map[string]nicAsk
	nicPending map[string]bool
	nicNow     chan struct{}
}

// NewCloudActuator returns a CloudActuator over cfg.Provider, which must not be nil.
func NewCloudActuator(reader client.Reader, cfg CloudConfig) *CloudActuator {
	cfg.defaults()
	backoff := flowcontrol.NewBackOff(cfg.BackoffInitial, cfg.BackoffMax)
	backoff.Clock = cfg.Clock
	return &CloudActuator{
		cfg: cfg, reader: reader,
		Events:        make(chan event.GenericEvent, 1),
		ifaces:        map[string]cloud.Interface{},
		overlay:       map[netip.Addr]overlayEntry{},
		owned:         map[string]map[netip.Addr]bool{},
		prevAllocated: map[string]map[netip.Addr]bool{},
		cool:          map[netip.Addr]time.Time{},
		lastScaleDown: map[string]time.Time{},
		busy:          map[string]bool{},
		detaching:     map[netip.Addr]bool{},
		attaching:     map[netip.Addr]string{},
		lastError:     map[string]string{},
		warmAttaching: map[string]int{},
		held:          map[netip.Addr]heldAddr{},
		ours:          map[netip.Addr]string{},
		eniOverlay:    map[string]eniOverlayEntry{},
		eipOverlay:    map[string]eipOverlayEntry{},
		devices:       map[string][]int{},
		backoff:       backoff,
		backoffUntil:  map[backoffKey]time.Time{},
		refreshNow:    make(chan struct{}, 1),
		subnets:       map[string]cloud.Subnet{},
		subnetErr:     map[string]string{},
		creating:      map[string]bool{},
		poolError:     map[string]string{},
		createFailed:  map[string]bool{},
		lateAsked:     map[string]bool{},
		nicAsked:      map[string]nicAsk{},
		nicPending:    map[string]bool{},
		nicNow:        make(chan struct{}, 1),
	}
}

// NeedLeaderElection makes the refresher run only on the elected leader.
func (c *CloudActuator) NeedLeaderElection() bool { return true }

// Ready reports whether the interfaces were read at least once.
func (c *CloudActuator) Ready() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ready
}

// Start re-reads the Nodes' interfaces every RefreshInterval (and sooner
// after a call reported a full interface or subnet) until ctx ends.
func (c *CloudActuator) Start(ctx context.Context) error {
	c.mu.Lock()
	c.runCtx = ctx
	c.mu.Unlock()
	t := c.cfg.Clock.NewTicker(c.cfg.RefreshInterval)
	defer t.Stop()
	for {
		if err := c.Refresh(ctx); err != nil && ctx.Err() == nil {
			log.FromContext(ctx).Error(err, "reading the Nodes' cloud interfaces failed; retrying")
			select {
			case <-ctx.Done():
				return nil
			case <-c.cfg.Clock.After(c.cfg.BackoffInitial):
			}
			continue
		}
		// Wait for the next full refresh; meanwhile re-read the Nodes
		// whose NICs changed (nicsReported), each time only those.
		for full := false; !full; {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C():
				full = true
			case <-c.refreshNow:
				full = true
			case <-c.nicNow:
				c.mu.Lock()
				names := slices.Sorted(maps.Keys(c.nicPending))
				clear(c.nicPending)
				c.mu.Unlock()
				if err := c.refreshNodes(ctx, names); err != nil && ctx.Err() == nil {
					log.FromContext(ctx).Error(err, "re-reading the interfaces of Nodes whose NICs changed failed", "nodes", names)
				}
			}
		}
	}
}

// Refresh reads every Node's interface from the cloud, keeping the results
// of our own recent calls that the read does not show yet.
func (c *CloudActuator) Refresh(ctx context.Context) error {
	var nodes corev1.NodeList
	if err := c.reader.List(ctx, &nodes); err != nil {
		return fmt.Errorf("list Nodes: %w", err)
	}
	ids := map[string]string{}
	for i := range nodes.Items {
		if pid := nodes.Items[i].Spec.ProviderID; pid != "" {
			ids[nodes.Items[i].Name] = pid
		}
	}
	seq := c.readSeq()
	var got map[string]cloud.Interface
	err := c.call(ctx, actionInterfaces, func() error {
		var err error
		got, err = c.cfg.Provider.Interfaces(ctx, ids)
		return err
	})
	if err != nil {
		if got == nil {
			return fmt.Errorf("read interfaces: %w", err)
		}
		// A partial answer: some Nodes could not be looked up (e.g. a
		// providerID of another cloud or of Fargate). They hold no cloud
		// IPs; the others go on.
		log.FromContext(ctx).Info("Some Nodes have no cloud interface", "err", err)
	}
	tagged, subnets, subnetErr, ok := c.readOwn(ctx)
	now := c.cfg.Clock.Now()
	c.mu.Lock()
	tagged = c.overlayENIs(got, tagged, ok, seq, now)
	for ip, o := range c.overlay {
		if now.After(o.deadline) {
			delete(c.overlay, ip)
			continue
		}
		placeIP(got, ip, o.iface, o.node != "")
	}
	if ok {
		tagOthers(got, tagged)
		c.tagged = tagged
	} else {
		tagOthers(got, c.tagged) // keep the last listing's tags
	}
	changed := !c.ready || !maps.EqualFunc(c.ifaces, got, sameInterface)
	if ok && (!maps.Equal(c.subnets, subnets) || !maps.Equal(c.subnetErr, subnetErr)) {
		changed = true
	}
	if ok {
		c.subnets, c.subnetErr = subnets, subnetErr
	}
	c.ifaces, c.ready = got, true
	for n := range c.nicAsked {
		if _, ok := got[n]; !ok {
			delete(c.nicAsked, n) // the Node or its instance is gone
		}
	}
	for ip, ifc := range c.ours {
		if holdingInterface(got, ip) != ifc {
			delete(c.ours, ip) // detached or taken by someone else since
		}
	}
	c.mu.Unlock()
	if changed {
		c.notify()
	}
	c.recheckHeld(ctx)
	var pools v1.ExternalIPPoolList
	if err := c.reader.List(ctx, &pools); err != nil {
		return fmt.Errorf("list ExternalIPPools: %w", err)
	}
	c.refreshElasticIPs(ctx, pools.Items)
	return nil
}

func sameInterface(a, b cloud.Interface) bool {
	return a.ID == b.ID && a.MAC == b.MAC && a.SubnetID == b.SubnetID && a.Limit == b.Limit && slices.Equal(a.Secondary, b.Secondary) &&
		a.MaxInterfaces == b.MaxInterfaces && a.Zone == b.Zone && a.VPCID == b.VPCID &&
		slices.EqualFunc(a.Others, b.Others, func(x, y cloud.ENI) bool {
			return x.ID == y.ID && x.DeviceIndex == y.DeviceIndex && maps.Equal(x.Tags, y.Tags) && slices.Equal(x.Secondary, y.Secondary)
		})
}

// input is the snapshot a pass reads.
func (c *CloudActuator) input(now time.Time) *cloudInput {
	c.mu.Lock()
	defer c.mu.Unlock()
	ci := &cloudInput{
		Now:           now,
		Ifaces:        maps.Clone(c.ifaces),
		Owned:         map[string]map[netip.Addr]bool{},
		PrevAllocated: map[string]map[netip.Addr]bool{},
		CoolUntil:     maps.Clone(c.cool),
		LastScaleDown: maps.Clone(c.lastScaleDown),
		PoolBackoff:   map[string]time.Time{},
		Blocked:       maps.Clone(c.busy),
		Detaching:     maps.Clone(c.detaching),
		Attaching:     maps.Clone(c.attaching),
		LastError:     maps.Clone(c.lastError),
		WarmAttaching: maps.Clone(c.warmAttaching),
		Recent:        maps.Clone(c.recent),
		Cluster:       c.cfg.ClusterName,
		Subnets:       maps.Clone(c.subnets),
		SubnetErr:     maps.Clone(c.subnetErr),
		Tagged:        slices.Clone(c.tagged),
		Creating:      maps.Clone(c.creating),
		PoolError:     maps.Clone(c.poolError),
		Held:          maps.Clone(c.held),
		Ours:          maps.Clone(c.ours),
		EIPs:          maps.Clone(c.eips),
	}
	_, ci.Manage = c.cfg.Provider.(cloud.InterfaceManager)
	for k, v := range c.owned {
		ci.Owned[k] = maps.Clone(v)
	}
	for k, v := range c.prevAllocated {
		ci.PrevAllocated[k] = maps.Clone(v)
	}
	for k, until := range c.backoffUntil {
		if !now.Before(until) {
			continue
		}
		switch k.kind {
		case backoffPool:
			ci.PoolBackoff[k.id] = until
		case backoffInterface:
			ci.Blocked[k.id] = true
		}
	}
	return ci
}

// remember records a pass's outcome: which addresses each pool owns and
// allocates, and which were released (they cool down).
func (c *CloudActuator) remember(out *cloudOutput, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for ip, until := range c.cool {
		if !now.Before(until) {
			delete(c.cool, ip)
		}
	}
	c.recent = maps.Clone(out.Allocations)
	for ip := range c.held {
		if !out.HeldWanted[ip] {
			delete(c.held, ip) // nothing asks for it any more
		}
	}
	for pool, po := range out.Pools {
		owned := maps.Clone(po.Owned)
		// Addresses attached by a call that completed during the pass
		// are not in its input yet: keep them.
		for ip := range c.owned[pool] {
			if o, ok := c.overlay[ip]; ok && o.node != "" {
				owned[ip] = true
			}
		}
		c.owned[pool] = owned
		c.prevAllocated[pool] = maps.Clone(po.Bound)
		for _, ip := range po.Released {
			c.cool[ip] = now.Add(warm.Cooldown)
		}
	}
	for pool := range c.owned {
		if _, ok := out.Pools[pool]; !ok {
			delete(c.owned, pool)
			delete(c.prevAllocated, pool)
		}
	}
}

// Run executes a pass's cloud calls in the background: the named-address
// attaches (one call per interface), then each pool's warm attaches and
// detaches (one call per interface). Interfaces with a call in flight are
// skipped (the next pass asks again).
func (c *CloudActuator) Run(ctx context.Context, out *cloudOutput) {
	var jobs []cloudJob
	c.mu.Lock()
	claim := func(iface string) bool {
		if c.busy[iface] {
			return false
		}
		c.busy[iface] = true
		return true
	}
	for _, op := range out.Attach {
		if claim(op.InterfaceID) {
			for _, ip := range op.IPs {
				c.attaching[ip] = op.Node
			}
			jobs = append(jobs, cloudJob{action: actionAssign, node: op.Node, iface: op.InterfaceID, subnet: interfaceSubnet(c.ifaces[op.Node], op.InterfaceID), ips: op.IPs, from: op.From})
		}
	}
	for _, pool := range slices.Sorted(maps.Keys(out.Pools)) {
		po := out.Pools[pool]
		for _, op := range po.Plan.Attach {
			if !claim(op.InterfaceID) {
				continue
			}
			if len(op.IPs) > 0 {
				c.warmAttaching[pool] += len(op.IPs)
				jobs = append(jobs, cloudJob{action: actionAssign, pool: pool, node: op.Node, iface: op.InterfaceID, subnet: interfaceSubnet(c.ifaces[op.Node], op.InterfaceID), ips: op.IPs, count: len(op.IPs)})
			} else {
				c.warmAttaching[pool] += op.Count
				jobs = append(jobs, cloudJob{action: actionAssignCount, pool: pool, node: op.Node, iface: op.InterfaceID, count: op.Count})
			}
		}
		if len(po.Plan.Detach) > 0 {
			c.lastScaleDown[pool] = c.cfg.Clock.Now()
		}
		for _, op := range po.Plan.Detach {
			if !claim(op.InterfaceID) {
				continue
			}
			// Detached addresses leave the pool's ownership now, so the
			// next pass does not hand them out.
			for _, ip := range op.IPs {
				delete(c.owned[pool], ip)
				c.detaching[ip] = true
			}
			jobs = append(jobs, cloudJob{action: actionUnassign, pool: pool, node: op.Node, iface: op.InterfaceID, ips: op.IPs})
		}
	}
	if c.runCtx != nil {
		ctx = c.runCtx
	}
	c.mu.Unlock()
	c.runElasticIPs(ctx, out.EIPOps)
	if out.Reread || out.ReadEIPs {
		select {
		case c.refreshNow <- struct{}{}:
		default:
		}
	}
	c.askLate(out.LateFacts)
	c.runENIJobs(ctx, out)
	if len(jobs) == 0 {
		return
	}
	go func() {
		jobs := c.screen(ctx, jobs)
		workqueue.ParallelizeUntil(ctx, c.cfg.Parallelism, len(jobs), func(i int) {
			j := jobs[i]
			defer func() {
				c.mu.Lock()
				delete(c.busy, j.iface)
				if j.pool != "" && j.action != actionUnassign {
					if c.warmAttaching[j.pool] -= j.count; c.warmAttaching[j.pool] <= 0 {
						delete(c.warmAttaching, j.pool)
					}
				}
				for _, ip := range j.ips {
					if j.action == actionUnassign {
						delete(c.detaching, ip)
					} else if c.attaching[ip] == j.node {
						delete(c.attaching, ip)
					}
				}
				c.mu.Unlock()
				c.notify()
			}()
			var err error
			switch j.action {
			case actionAssign:
				err = c.assignNamed(ctx, j)
			case actionAssignCount:
				var got []netip.Addr
				err = c.call(ctx, j.action, func() error {
					var err error
					got, err = c.cfg.Provider.AssignCount(ctx, j.iface, j.count)
					return err
				})
				if err == nil {
					c.applied(j.pool, j.node, j.iface, got, true)
				}
			case actionUnassign:
				err = c.call(ctx, j.action, func() error { return c.cfg.Provider.Unassign(ctx, j.iface, j.ips) })
				if err == nil || errors.Is(err, cloud.ErrNotFound) {
					c.applied(j.pool, j.node, j.iface, j.ips, false)
					err = nil
				} else {
					c.mu.Lock() // still attached: the pool keeps owning them
					if c.owned[j.pool] == nil {
						c.owned[j.pool] = map[netip.Addr]bool{}
					}
					for _, ip := range j.ips {
						c.owned[j.pool][ip] = true
					}
					c.mu.Unlock()
				}
			}
			c.failed(ctx, j.action, j.pool, j.iface, err)
		})
	}()
}

// applied records a successful call in the view and, for warm attaches,
// in the pool's ownership.
func (c *CloudActuator) applied(pool, node, iface string, ips []netip.Addr, attach bool) {
	now := c.cfg.Clock.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	key := backoffKey{backoffInterface, iface}
	c.backoff.Reset(key.String())
	delete(c.backoffUntil, key)
	delete(c.lastError, iface)
	for _, ip := range ips {
		placeIP(c.ifaces, ip, iface, attach)
	}
	for _, ip := range ips {
		o := overlayEntry{iface: iface, deadline: now.Add(c.cfg.Overlay)}
		if attach {
			o.node = node
			c.ours[ip] = iface
		} else if prev, ok := c.overlay[ip]; ok && prev.node != "" && prev.iface != iface {
			// Attached elsewhere by a call that completed first: a detach
			// from iface does not undo that.
			continue
		} else if c.ours[ip] == iface {
			delete(c.ours, ip)
		}
		c.overlay[ip] = o
	}
	if pool != "" && attach {
		if c.owned[pool] == nil {
			c.owned[pool] = map[netip.Addr]bool{}
		}
		for _, ip := range ips {
			c.owned[pool][ip] = true
		}
	}
}

// failed backs off after an error: the interface after a full interface or
// an unknown error, the pool after a full subnet or throttling; and asks
// for a re-read of the real state instead of retrying blindly.
func (c *CloudActuator) failed(ctx context.Context, action, pool, iface string, err error) {
	if err == nil {
		return
	}
	key := backoffKey{backoffInterface, iface}
	if pool != "" && (errors.Is(err, cloud.ErrSubnetFull) || errors.Is(err, cloud.ErrThrottled)) {
		key = backoffKey{backoffPool, pool}
	}
	now := c.cfg.Clock.Now()
	c.mu.Lock()
	c.backoff.Next(key.String(), now)
	until := now.Add(c.backoff.Get(key.String()))
	c.backoffUntil[key] = until
	msg := err.Error()
	if len(msg) > 200 {
		msg = msg[:200] + "..."
	}
	c.lastError[iface] = msg
	c.mu.Unlock()
	log.FromContext(ctx).Info("cloud call failed; backing off", "action", action, "pool", klog.KRef("", pool), "interface", iface, "until", until, "err", err)
	select {
	case c.refreshNow <- struct{}{}:
	default:
	}
}

// call runs one provider call with its metrics.
func (c *CloudActuator) call(ctx context.Context, action string, f func() error) error {
	start := c.cfg.Clock.Now()
	err := f()
	cloudCallDuration.WithLabelValues(action).Observe(c.cfg.Clock.Since(start).Seconds())
	res := resultOK
	switch {
	case err == nil:
	case errors.Is(err, cloud.ErrLimitExceeded):
		res = "LimitExceeded"
	case errors.Is(err, cloud.ErrSubnetFull):
		res = "SubnetFull"
	case errors.Is(err, cloud.ErrThrottled):
		res = "Throttled"
	case errors.Is(err, cloud.ErrNotFound):
		res = "NotFound"
	case errors.Is(err, cloud.ErrUnauthorized):
		res = "Unauthorized"
	case errors.Is(err, cloud.ErrInterfaceLimit):
		res = "InterfaceLimit"
	case errors.Is(err, cloud.ErrInUse):
		res = "InUse"
	default:
		res = resultError
	}
	cloudCalls.WithLabelValues(action, res).Inc()
	_ = ctx
	return err
}

func (c *CloudActuator) notify() {
	select {
	case c.Events <- event.GenericEvent{Object: &corev1.Node{}}:
	default:
	}
}

// nextBackoff is how long until the earliest backoff ends, or 0.
func (c *CloudActuator) nextBackoff(now time.Time) time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	var d time.Duration
	for _, until := range c.backoffUntil {
		if w := until.Sub(now); w > 0 {
			d = minPositive(d, w)
		}
	}
	return d
}

// setPoolMetrics exports the pools' cloud counters.
func setPoolMetrics(out *cloudOutput) {
	poolCloudIPs.Reset()
	for pool, po := range out.Pools {
		poolCloudIPs.WithLabelValues(pool, "attached").Set(float64(po.Status.Attached))
		poolCloudIPs.WithLabelValues(pool, "warm").Set(float64(po.Status.Warm))
		poolCloudIPs.WithLabelValues(pool, "allocated").Set(float64(po.Status.Allocated))
	}
}
