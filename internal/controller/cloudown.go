package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/cloud"
)

// Interface calls of OwnInterfaces pools, as the action label of the cloud
// call metrics names them.
const (
	actionTagged    = "TaggedInterfaces"
	actionSubnets   = "SubnetZones"
	actionCreateENI = "CreateInterface"
	actionAttachENI = "AttachInterface"
	actionDeleteENI = "DeleteInterface"
)

// placeIP changes ip in the view: an attach moves it off every interface
// onto the one with ID iface (a primary one or another attached one); a
// detach takes it off iface only (it may be attached elsewhere since).
func placeIP(ifaces map[string]cloud.Interface, ip netip.Addr, iface string, attach bool) {
	drop := func(l []netip.Addr) []netip.Addr {
		return slices.DeleteFunc(l, func(a netip.Addr) bool { return a == ip })
	}
	if !attach {
		for n, ifc := range ifaces {
			if ifc.ID == iface {
				ifc.Secondary = drop(slices.Clone(ifc.Secondary))
			}
			ifc.Others = slices.Clone(ifc.Others)
			for i := range ifc.Others {
				if ifc.Others[i].ID == iface {
					ifc.Others[i].Secondary = drop(slices.Clone(ifc.Others[i].Secondary))
				}
			}
			ifaces[n] = ifc
		}
		return
	}
	put := func(l []netip.Addr) []netip.Addr {
		l = append(l, ip)
		slices.SortFunc(l, netip.Addr.Compare)
		return l
	}
	for n, ifc := range ifaces {
		ifc.Secondary = drop(ifc.Secondary)
		ifc.Others = slices.Clone(ifc.Others)
		for i := range ifc.Others {
			ifc.Others[i].Secondary = drop(slices.Clone(ifc.Others[i].Secondary))
			if attach && ifc.Others[i].ID == iface {
				ifc.Others[i].Secondary = put(ifc.Others[i].Secondary)
			}
		}
		if attach && ifc.ID == iface {
			ifc.Secondary = put(ifc.Secondary)
		}
		ifaces[n] = ifc
	}
}

// tagOthers copies the tags of the tagged listing onto the Nodes'
// attached interfaces (DescribeInstances carries no interface tags).
func tagOthers(ifaces map[string]cloud.Interface, tagged []cloud.ENI) {
	byID := make(map[string]cloud.ENI, len(tagged))
	for _, e := range tagged {
		byID[e.ID] = e
	}
	for n, ifc := range ifaces {
		ifc.Others = slices.Clone(ifc.Others)
		for i := range ifc.Others {
			if t, ok := byID[ifc.Others[i].ID]; ok {
				ifc.Others[i].Tags = t.Tags
			}
		}
		ifaces[n] = ifc
	}
}

// readOwn lists the interfaces tagged with our cluster and describes the
// subnets of the OwnInterfaces pools. ok is false when the provider cannot
// manage interfaces or the listing failed (the last one is kept).
func (c *CloudActuator) readOwn(ctx context.Context) (tagged []cloud.ENI, subnets map[string]cloud.Subnet, subnetErr map[string]string, ok bool) {
	im, can := c.cfg.Provider.(cloud.InterfaceManager)
	if !can {
		return nil, nil, nil, false
	}
	err := c.call(ctx, actionTagged, func() error {
		var err error
		tagged, err = im.TaggedInterfaces(ctx, map[string]string{TagCluster: c.cfg.ClusterName})
		return err
	})
	if err != nil {
		log.FromContext(ctx).Error(err, "listing the controller's own network interfaces failed; keeping the last listing")
		return nil, nil, nil, false
	}
	var pools v1.ExternalIPPoolList
	if err := c.reader.List(ctx, &pools); err != nil {
		log.FromContext(ctx).Error(err, "listing ExternalIPPools for their subnets failed")
		return nil, nil, nil, false
	}
	var ids []string
	for _, p := range pools.Items {
		if ownInterfaces(p.Spec.Cloud) && !slices.Contains(ids, p.Spec.Cloud.AWS.SubnetID) {
			ids = append(ids, p.Spec.Cloud.AWS.SubnetID)
		}
	}
	subnets, subnetErr = map[string]cloud.Subnet{}, map[string]string{}
	if len(ids) == 0 {
		return tagged, subnets, subnetErr, true
	}
	err = c.call(ctx, actionSubnets, func() error {
		got, err := im.SubnetZones(ctx, ids)
		maps.Copy(subnets, got)
		return err
	})
	if err != nil {
		// One unknown subnet fails the batch: ask one at a time to tell
		// which.
		for _, id := range ids {
			got, err := im.SubnetZones(ctx, []string{id})
			if err != nil {
				subnetErr[id] = err.Error()
				continue
			}
			maps.Copy(subnets, got)
		}
	}
	return tagged, subnets, subnetErr, true
}

// runENIJobs creates and attaches, or detaches and deletes, our
// interfaces in the background; each completed job asks for a re-read and
// a pass.
func (c *CloudActuator) runENIJobs(ctx context.Context, out *cloudOutput) {
	im, ok := c.cfg.Provider.(cloud.InterfaceManager)
	if !ok {
		return
	}
	c.mu.Lock()
	c.dropStaleCreateErrors(out.CreateENIs)
	var creates []eniCreate
	now := c.cfg.Clock.Now()
	for _, cr := range out.CreateENIs {
		k := cr.Node + "/" + cr.Pool
		if c.creating[k] || now.Before(c.backoffUntil[backoffKey{backoffCreate, cr.Pool}]) {
			continue
		}
		c.creating[k] = true
		creates = append(creates, cr)
	}
	var deletes []eniDelete
	for _, d := range out.DeleteENIs {
		if c.busy[d.InterfaceID] || now.Before(c.backoffUntil[backoffKey{backoffDelete, d.InterfaceID}]) {
			continue
		}
		c.busy[d.InterfaceID] = true
		deletes = append(deletes, d)
	}
	devices := map[string][]int{}
	for _, ifc := range c.ifaces {
		used := []int{0}
		for _, e := range ifc.Others {
			used = append(used, e.DeviceIndex)
		}
		devices[ifc.InstanceID] = append(used, c.devices[ifc.InstanceID]...) // creates in flight
	}
	for _, cr := range creates {
		used := devices[cr.InstanceID]
		dev := nextDevice(used)
		devices[cr.InstanceID] = append(used, dev) // two creates for one instance in one pass
		c.devices[cr.InstanceID] = append(c.devices[cr.InstanceID], dev)
		go c.createENI(ctx, im, cr, dev)
	}
	c.mu.Unlock()
	for _, d := range deletes {
		go c.deleteENI(ctx, im, d)
	}
}

// dropStaleCreateErrors forgets the create or attach error of every pool
// that this pass wants no interface for and that has none being created:
// the need that failed is gone (another create met it, or the Egresses
// left), so the error no longer describes the pool. Without this, an
// attach that lost a race for a device index to a create that succeeded
// kept the pool's CloudInterfaces condition at InterfaceFailed until the
// next successful create, which may never come. Called with c.mu held.
func (c *CloudActuator) dropStaleCreateErrors(wanted []eniCreate) {
	for pool := range c.createFailed {
		if slices.ContainsFunc(wanted, func(cr eniCreate) bool { return cr.Pool == pool }) || creatingFor(c.creating, pool) {
			continue
		}
		delete(c.createFailed, pool)
		delete(c.poolError, pool)
	}
}

// nextDevice is the lowest device index not in used.
func nextDevice(used []int) int {
	for i := 1; ; i++ {
		if !slices.Contains(used, i) {
			return i
		}
	}
}

func (c *CloudActuator) createENI(ctx context.Context, im cloud.InterfaceManager, cr eniCreate, device int) {
	k := cr.Node + "/" + cr.Pool
	defer func() {
		c.mu.Lock()
		delete(c.creating, k)
		c.devices[cr.InstanceID] = slices.DeleteFunc(c.devices[cr.InstanceID], func(d int) bool { return d == device })
		if len(c.devices[cr.InstanceID]) == 0 {
			delete(c.devices, cr.InstanceID)
		}
		c.mu.Unlock()
		c.reread()
	}()
	spec := cloud.InterfaceSpec{
		SubnetID: cr.SubnetID, Groups: cr.Groups,
		Tags:        map[string]string{TagNoManage: "true", TagCluster: c.cfg.ClusterName, TagNode: cr.Node, TagPool: cr.Pool},
		Description: fmt.Sprintf("egressip: egress IPs of pool %s on Node %s (cluster %s)", cr.Pool, cr.Node, c.cfg.ClusterName),
	}
	var eni cloud.ENI
	err := c.call(ctx, actionCreateENI, func() error {
		var err error
		eni, err = im.CreateInterface(ctx, spec)
		return err
	})
	if err != nil {
		c.poolFailed(ctx, cr.Pool, backoffKey{backoffCreate, cr.Pool}, fmt.Errorf("creating a network interface in %s for Node %s: %w", cr.SubnetID, cr.Node, err))
		return
	}
	c.mu.Lock()
	c.busy[eni.ID] = true // not an orphan for the collector while it attaches
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.busy, eni.ID)
		c.mu.Unlock()
	}()
	var attachment string
	err = c.call(ctx, actionAttachENI, func() error {
		var err error
		attachment, err = im.AttachInterface(ctx, eni.ID, cr.InstanceID, device)
		return err
	})
	if err != nil {
		// Do not leave it behind: delete it now (the collector would
		// later anyway).
		_ = c.call(ctx, actionDeleteENI, func() error { return im.DeleteInterface(ctx, eni.ID, "") })
		c.poolFailed(ctx, cr.Pool, backoffKey{backoffCreate, cr.Pool}, fmt.Errorf("attaching network interface %s to Node %s (instance %s) at device index %d: %w", eni.ID, cr.Node, cr.InstanceID, device, err))
		return
	}
	c.succeeded(backoffKey{backoffCreate, cr.Pool})
	c.mu.Lock()
	delete(c.poolError, cr.Pool)
	delete(c.createFailed, cr.Pool)
	// In the view at once, so that the next create on this instance picks
	// another device index and the next pass can use it before a re-read.
	eni.InstanceID, eni.DeviceIndex, eni.AttachmentID, eni.Tags = cr.InstanceID, device, attachment, spec.Tags
	c.attachedENI(cr.Node, eni, c.cfg.Clock.Now()) // and kept over re-reads begun before now
	if ifc, ok := c.ifaces[cr.Node]; ok && !slices.ContainsFunc(ifc.Others, func(e cloud.ENI) bool { return e.ID == eni.ID }) {
		ifc.Others = append(slices.Clone(ifc.Others), eni)
		slices.SortFunc(ifc.Others, func(a, b cloud.ENI) int { return a.DeviceIndex - b.DeviceIndex })
		c.ifaces[cr.Node] = ifc
	}
	c.mu.Unlock()
	log.FromContext(ctx).Info("attached a network interface of our own", "pool", klog.KRef("", cr.Pool), "node", klog.KRef("", cr.Node), "interface", eni.ID, "deviceIndex", device)
}

func (c *CloudActuator) deleteENI(ctx context.Context, im cloud.InterfaceManager, d eniDelete) {
	defer func() {
		c.mu.Lock()
		delete(c.busy, d.InterfaceID)
		c.mu.Unlock()
		c.reread()
	}()
	err := c.call(ctx, actionDeleteENI, func() error { return im.DeleteInterface(ctx, d.InterfaceID, d.AttachmentID) })
	if err != nil && !errors.Is(err, cloud.ErrNotFound) {
		c.poolFailed(ctx, d.Pool, backoffKey{backoffDelete, d.InterfaceID}, fmt.Errorf("deleting network interface %s (%s): %w", d.InterfaceID, d.Why, err))
		return
	}
	c.succeeded(backoffKey{backoffDelete, d.InterfaceID})
	c.mu.Lock()
	delete(c.eniOverlay, d.InterfaceID)
	c.mu.Unlock()
	log.FromContext(ctx).Info("deleted a network interface of our own", "pool", klog.KRef("", d.Pool), "node", klog.KRef("", d.Node), "interface", d.InterfaceID, "why", d.Why)
}

// poolFailed records a pool's interface error for its condition and backs
// off the key (backoffCreate for the pool, or backoffDelete for the
// interface) exponentially
// (CloudConfig.BackoffInitial doubling to BackoffMax), so that a missing
// permission or a bad security group is not retried on every pass.
func (c *CloudActuator) poolFailed(ctx context.Context, pool string, key backoffKey, err error) {
	msg := err.Error()
	if len(msg) > 400 {
		msg = msg[:400] + "..."
	}
	now := c.cfg.Clock.Now()
	c.mu.Lock()
	c.poolError[pool] = msg
	c.createFailed[pool] = key.kind == backoffCreate
	if !c.createFailed[pool] {
		delete(c.createFailed, pool)
	}
	c.backoff.Next(key.String(), now)
	until := now.Add(c.backoff.Get(key.String()))
	c.backoffUntil[key] = until
	c.mu.Unlock()
	log.FromContext(ctx).Info("network interface call failed; backing off", "pool", klog.KRef("", pool), "until", until, "err", err)
}

// succeeded clears a backoff key after a successful interface call.
func (c *CloudActuator) succeeded(key backoffKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.backoff.Reset(key.String())
	delete(c.backoffUntil, key)
}

// lateFacts lists the Nodes whose cloud view lags their object: a
// spec.providerID but no interface read for it yet, or a
// node.kubernetes.io/instance-type label other than the instance type
// last read (a stop, resize, start).
func lateFacts(nodes []corev1.Node, ci *cloudInput) []string {
	var out []string
	for i := range nodes {
		n := &nodes[i]
		pid := n.Spec.ProviderID
		if pid == "" {
			continue
		}
		typ := n.Labels[corev1.LabelInstanceTypeStable]
		ifc, ok := ci.Ifaces[n.Name]
		if !ok || (typ != "" && ifc.InstanceType != "" && typ != ifc.InstanceType) {
			out = append(out, n.Name+"|"+pid+"|"+typ)
		}
	}
	return out
}

// askLate asks for a re-read for each late fact not asked for before
// (each fact once, so that a Node the cloud does not know, e.g. a
// Fargate one, costs one re-read, not one per pass).
func (c *CloudActuator) askLate(keys []string) {
	c.mu.Lock()
	fresh := false
	for _, k := range keys {
		if !c.lateAsked[k] {
			c.lateAsked[k] = true
			fresh = true
		}
	}
	if len(c.lateAsked) > 10000 {
		c.lateAsked = map[string]bool{} // bound the memory; at worst one more re-read each
	}
	c.mu.Unlock()
	if fresh {
		select {
		case c.refreshNow <- struct{}{}:
		default:
		}
	}
}

// reread asks the refresher for a re-read now (which notifies a pass).
func (c *CloudActuator) reread() {
	select {
	case c.refreshNow <- struct{}{}:
	default:
	}
	c.notify()
}

// NIC-driven re-reads (issue 17 item 6): EC2 tells no controller that
// someone else attached or detached an interface (that needs EventBridge),
// but the instance's kernel sees it at once, as a NIC appearing or leaving,
// and the Node's agent lists its NICs' MACs in every report. When that list
// differs from the MACs the cloud last gave for the Node (its primary
// interface and the others on network card 0), the Node's interfaces are
// re-read, and the re-read triggers a pass when anything changed.
const (
	// maxNICRereads bounds the re-reads asked for one NIC list that still
	// differs after them: EC2's reads may lag the attachment the kernel
	// already shows, and a NIC the view does not list (one on another
	// network card) must not cost a re-read on every poll.
	maxNICRereads = 3
	// nicRereadSpacing is the wait before the second re-read for one
	// list; it doubles for the third.
	nicRereadSpacing = 2 * time.Second
)

// nicAsk is the re-reads asked for one Node's reported NIC list.
type nicAsk struct {
	// nics is the list, joined with commas.
	nics string
	// tries is how many re-reads were asked for it; next is when another
	// may be.
	tries int
	next  time.Time
}

// viewMACs returns the MACs the cloud view lists for ifc: the primary
// interface's and its others', sorted.
func viewMACs(ifc cloud.Interface) []string {
	out := make([]string, 0, 1+len(ifc.Others))
	out = append(out, ifc.MAC)
	for _, o := range ifc.Others {
		out = append(out, o.MAC)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// nicsReported takes the NIC MACs (sorted) node's agent reported and asks
// for a re-read when they differ from the cloud view of node: at once for
// a new list, then after nicRereadSpacing and twice that while it still
// differs, at most maxNICRereads times per list. A Node the view does not
// know (no providerID yet, not an instance) is left to lateFacts.
func (c *CloudActuator) nicsReported(node string, nics []string) {
	now := c.cfg.Clock.Now()
	c.mu.Lock()
	ifc, ok := c.ifaces[node]
	if !c.ready || !ok {
		c.mu.Unlock()
		return
	}
	if slices.Equal(viewMACs(ifc), nics) {
		delete(c.nicAsked, node)
		c.mu.Unlock()
		return
	}
	key := strings.Join(nics, ",")
	a := c.nicAsked[node]
	if a.nics == key && (a.tries >= maxNICRereads || now.Before(a.next)) {
		c.mu.Unlock()
		return
	}
	if a.nics != key {
		a = nicAsk{nics: key}
	}
	a.next = now.Add(nicRereadSpacing << a.tries)
	a.tries++
	c.nicAsked[node] = a
	c.nicPending[node] = true
	ctx := c.runCtx
	c.mu.Unlock()
	if ctx == nil {
		ctx = context.Background()
	}
	log.FromContext(ctx).V(1).Info("a Node's NICs differ from the cloud view; re-reading its interfaces", "node", klog.KRef("", node), "nics", nics, "view", viewMACs(ifc), "try", a.tries)
	select {
	case c.nicNow <- struct{}{}:
	default:
	}
}

// refreshNodes re-reads the interfaces of the named Nodes only (one
// DescribeInstances call per 200 instances, filtered to theirs) and merges
// them into the view as Refresh does: our own recent calls the read does
// not show yet stay (the overlay), interface tags come from the last
// listing by tag, or from the view for an interface that listing predates
// (one we just attached), and a pass is triggered when a Node's view
// changed. A Node gone or without a providerID is skipped. Errors are
// those of reading the Nodes or, when nothing was read, the cloud.
func (c *CloudActuator) refreshNodes(ctx context.Context, names []string) error {
	ids := make(map[string]string, len(names))
	for _, n := range names {
		var node corev1.Node
		if err := c.reader.Get(ctx, client.ObjectKey{Name: n}, &node); err != nil {
			if apierrors.IsNotFound(err) {
				continue
			}
			return fmt.Errorf("get Node %s: %w", n, err)
		}
		if pid := node.Spec.ProviderID; pid != "" {
			ids[n] = pid
		}
	}
	if len(ids) == 0 {
		return nil
	}
	seq := c.readSeq()
	var got map[string]cloud.Interface
	err := c.call(ctx, actionInterfaces, func() error {
		var err error
		got, err = c.cfg.Provider.Interfaces(ctx, ids)
		return err
	})
	if got == nil {
		return fmt.Errorf("read the interfaces of %d Nodes: %w", len(ids), err)
	}
	now := c.cfg.Clock.Now()
	c.mu.Lock()
	c.overlayENIs(got, nil, false, seq, now)
	for ip, o := range c.overlay {
		if !now.After(o.deadline) {
			placeIP(got, ip, o.iface, o.node != "")
		}
	}
	tagOthers(got, c.tagged)
	changed := false
	for n := range ids {
		ifc, ok := got[n]
		prev, had := c.ifaces[n]
		if !ok {
			if had {
				delete(c.ifaces, n) // terminated, or no longer an instance
				changed = true
			}
			continue
		}
		for i, o := range ifc.Others {
			if o.Tags != nil {
				continue
			}
			if j := slices.IndexFunc(prev.Others, func(p cloud.ENI) bool { return p.ID == o.ID }); j >= 0 {
				ifc.Others[i].Tags = prev.Others[j].Tags
			}
		}
		if !had || !sameInterface(prev, ifc) {
			changed = true
		}
		c.ifaces[n] = ifc
	}
	for ip, ifc := range c.ours {
		if holdingInterface(c.ifaces, ip) != ifc {
			delete(c.ours, ip)
		}
	}
	c.mu.Unlock()
	if changed {
		c.notify()
	}
	return nil
}

// view returns the controller's cloud view of node (a copy) and whether
// it has one.
func (c *CloudActuator) view(node string) (cloud.Interface, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ifc, ok := c.ifaces[node]
	ifc.Others = slices.Clone(ifc.Others)
	return ifc, ok
}
