package datapath

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/egressip/egressip/internal/destinations"
)

// frActNop is FR_ACT_NOP (include/uapi/linux/fib_rules.h).
const frActNop = 3

// setChunk bounds the elements per netlink message: one attribute holds at
// most 64 KiB.
const setChunk = 512

// Datapath programs one Node's network namespace from States. It owns one
// nftables table, the tunnel device, its routing tables and the policy
// rules at Config.RulePriority..+2, and touches nothing else. Methods are
// safe for concurrent use.
type Datapath struct {
	cfg Config
	ns  netns.NsHandle
	nl  *netlink.Handle
	// offloadsAt is when the tunnel device's offloads were last checked
	// (zero: never, or the device was created since); see
	// offloadCheckInterval.
	offloadsAt time.Time

	mu sync.Mutex
	// ids, roles and eips are what is programmed (read back from the
	// kernel by New, then the last Plan applied).
	ids   IDs
	roles map[string]Role
	eips  map[string]netip.Addr
	// members is the programmed member classification (Plan.Members).
	members map[netip.Addr]uint32
	// splits is the programmed classification of split members
	// (Plan.Splits).
	splits map[netip.Addr][]uint32
	// assigning holds the Egresses last applied with Assigning set (in
	// memory only: after a restart none is taken for assigning).
	assigning map[string]bool
	// applied is the last Plan applied; nil until the first Apply, which
	// then reconciles against the kernel rather than memory.
	applied *Plan
	// lastWrite is what the last program wrote to the table (LastWrite).
	lastWrite PickWrite
	// rejected holds the rejected-packet counts harvested from tables that
	// a later Apply replaced, by Egress name.
	rejected map[string]uint64
	// onStep, set only by tests, observes the kernel between the phases
	// of program.
	onStep func(step string, plan Plan)
	// refused are the Egresses whose part of the table the kernel refused
	// in the last Apply, by name (see isolate).
	refused map[string]refusal
	// rulesetHook, when set (tests only), edits every Ruleset before it is
	// sent to the kernel: the way to make the kernel refuse one Egress.
	rulesetHook func(*Ruleset)
	// drains are the member flows kept on the path of an Egress their
	// member left (in memory only: a restarted agent ends them), and
	// pending those the Apply in progress programs (read by build).
	drains  map[drainKey]drain
	pending []drain
	// uids are the Pods' UIDs by IP as of the last Apply (State.Pods).
	uids map[netip.Addr]string
	// now is the clock of drains (time.Now; tests may replace it).
	now func() time.Time
	// beforeTable, when set (SetBeforeTable), runs in every Apply after
	// the routes and rules are added and before the table is written.
	beforeTable func(Plan) error
}

// SetBeforeTable sets fn to run in every Apply between adding the routes
// and rules and writing the nftables table, with the Plan being applied:
// the place for policy routing of others (package poolroute) that must be
// in place before the table marks a flow for it. fn runs under the
// Datapath's lock and must not call its methods; its error fails the
// Apply before the table is written.
func (d *Datapath) SetBeforeTable(fn func(Plan) error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.beforeTable = fn
}

// New opens the datapath of the namespace ns (netns.None(): the current
// one) and reads back the Egress IDs a previous process programmed, so that
// an Apply of the same State reproduces the same ruleset. It changes
// nothing. It fails on an invalid cfg, when the uplink's MTU cannot be read
// (unless cfg.UplinkMTU is set), or when the namespace cannot be opened.
func New(cfg Config, ns netns.NsHandle) (*Datapath, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	var h *netlink.Handle
	if ns.IsOpen() {
		h, err = netlink.NewHandleAt(ns)
	} else {
		h, err = netlink.NewHandle()
	}
	if err != nil {
		return nil, fmt.Errorf("open netlink: %w", err)
	}
	if cfg.UplinkMTU == 0 {
		if cfg.Uplink == "" {
			h.Close()
			return nil, errors.New("datapath config: Uplink or UplinkMTU is required")
		}
		l, err := h.LinkByName(cfg.Uplink)
		if err != nil {
			h.Close()
			return nil, fmt.Errorf("uplink %s: %w", cfg.Uplink, err)
		}
		cfg.UplinkMTU = l.Attrs().MTU
	}
	if cfg, err = cfg.withDefaults(); err != nil {
		h.Close()
		return nil, err
	}
	d := &Datapath{cfg: cfg, ns: ns, nl: h, rejected: map[string]uint64{}, now: time.Now}
	if err := d.readBack(); err != nil {
		h.Close()
		return nil, err
	}
	if d.cfg.queueForm, err = d.probeQueue(); err != nil {
		h.Close()
		return nil, err
	}
	return d, nil
}

// RejectQueueForm names how the ruleset sends rejected SYNs to the reject
// queue: "nft queue", "xt NFQUEUE", or "none" (Config.RejectQueue -1, or a
// kernel with neither; the rejection is then synchronous).
func (d *Datapath) RejectQueueForm() string { return d.cfg.queueForm.String() }

// probeQueue finds the queue expression the kernel accepts: the native
// one, else xtables' NFQUEUE through nft_compat, else none. Each try is
// one batch that creates a table holding the expression and deletes it
// again, so a success leaves the ruleset as it was and a failure changes
// nothing. It fails only when nftables itself cannot be reached.
func (d *Datapath) probeQueue() (queueForm, error) {
	if d.cfg.RejectQueue < 0 {
		return queueNone, nil
	}
	for _, form := range []queueForm{queueNative, queueCompat} {
		c, err := d.nft()
		if err != nil {
			return queueNone, err
		}
		cfg := d.cfg
		cfg.queueForm = form
		t := c.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: d.cfg.TableName + "-probe"})
		ch := c.AddChain(&nftables.Chain{Name: "probe", Table: t})
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: []expr.Any{cfg.queueExpr()}})
		c.DelTable(t)
		err = c.Flush()
		if err == nil {
			return form, nil
		}
		if !errors.Is(err, unix.ENOENT) && !strings.Contains(err.Error(), "no such file") && !errors.Is(err, unix.EOPNOTSUPP) {
			return queueNone, fmt.Errorf("probe the queue expression: %w", err)
		}
	}
	return queueNone, nil
}

// Config returns the effective configuration (defaults and uplink MTU
// filled in).
func (d *Datapath) Config() Config { return d.cfg }

// Close releases the netlink handle. The programmed datapath stays in
// place for the next process; Teardown removes it.
func (d *Datapath) Close() error {
	d.nl.Close()
	return nil
}

func (d *Datapath) nft(extra ...nftables.ConnOption) (*nftables.Conn, error) {
	opts := extra
	if d.ns.IsOpen() {
		opts = append(opts, nftables.WithNetNSFd(int(d.ns)))
	}
	c, err := nftables.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("open nftables: %w", err)
	}
	return c, nil
}

func (d *Datapath) table() *nftables.Table {
	return &nftables.Table{Family: nftables.TableFamilyINet, Name: d.cfg.TableName}
}

// readBack loads IDs, roles and held egress IPs from the table's ids and
// snat sets. A missing table means a fresh Node.
func (d *Datapath) readBack() error {
	d.ids, d.roles, d.eips, d.members, d.splits = IDs{}, map[string]Role{}, map[string]netip.Addr{}, map[netip.Addr]uint32{}, map[netip.Addr][]uint32{}
	c, err := d.nft()
	if err != nil {
		return err
	}
	t := d.table()
	s, err := c.GetSetByName(t, setIDs)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || strings.Contains(err.Error(), "no such file") {
			return nil
		}
		return fmt.Errorf("read back set %s: %w", setIDs, err)
	}
	els, err := c.GetSetElements(s)
	if err != nil {
		return fmt.Errorf("read back set %s: %w", setIDs, err)
	}
	byMark := map[uint32]string{}
	for _, e := range els {
		mark, err := markOf(e.Key)
		if err != nil {
			return fmt.Errorf("read back set %s: %w", setIDs, err)
		}
		word, name, ok := strings.Cut(e.Comment, "/")
		if !ok {
			continue
		}
		for r, w := range roleWord {
			if w == word {
				d.roles[name] = r
			}
		}
		d.ids[name] = uint16(mark >> d.cfg.idShift())
		byMark[mark] = name
	}
	var members []SetContent
	for _, f := range families {
		for _, name := range []string{mapLocal + f.suffix, mapRemote + f.suffix, setSplitMembers + f.suffix} {
			s, err := c.GetSetByName(t, name)
			if err != nil {
				continue
			}
			els, err := c.GetSetElements(s)
			if err != nil {
				return fmt.Errorf("read back map %s: %w", name, err)
			}
			members = append(members, SetContent{Set: nftables.Set{Name: name}, Elements: els})
		}
	}
	d.members, d.splits = membersOf(members), splitMarksOf(members)
	for _, f := range families {
		s, err := c.GetSetByName(t, mapSNAT+f.suffix)
		if err != nil {
			continue
		}
		els, err := c.GetSetElements(s)
		if err != nil {
			return fmt.Errorf("read back map %s: %w", s.Name, err)
		}
		for _, e := range els {
			mark, err := markOf(e.Key)
			if err != nil {
				continue
			}
			if a, ok := netip.AddrFromSlice(e.Val); ok && byMark[mark] != "" {
				d.eips[byMark[mark]] = a
			}
		}
	}
	return nil
}

// IDs returns a copy of the programmed ID assignment.
func (d *Datapath) IDs() IDs {
	d.mu.Lock()
	defer d.mu.Unlock()
	return maps.Clone(d.ids)
}

// Apply programs st: the tunnel device, the nftables table (replaced in one
// transaction when its content changed), the encapsulating routes, the
// policy rules, and conntrack cleanup for every Egress whose role here
// changed and every egress IP released here. A member that leaves an
// Egress while its Pod still runs keeps its open flows on the old path
// until they end (see planDrains; call Apply again while Draining is not
// 0). Applying the same State again changes nothing else. When IDs run out it programs the Egresses that
// have one and returns an error wrapping ErrTooManyEgresses.
//
// When the kernel refuses the table, Apply finds the Egresses whose part
// is refused on its own (isolate), programs every other Egress, and
// returns a *RefusedError (wrapping ErrEgressRefused) naming them: one
// Egress never stops the others. A refused Egress with FailurePolicyFail
// keeps the rejection of its local Pods' traffic where the kernel takes
// that much. A refused Egress is tried again once it changes.
func (d *Datapath) Apply(ctx context.Context, st State) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	logger := logr.FromContextOrDiscard(ctx).WithName("datapath")
	d.resolveKeys(st)
	// Egresses the kernel refused before and that have not changed since
	// are left out (or reduced to their rejection) up front; a changed
	// one is tried again.
	kept, refused := d.withoutRefused(st)
	keep, ended, err := d.planDrains(st)
	if err != nil {
		return err
	}
	d.pending = slices.Collect(maps.Values(keep))
	defer func() { d.pending = nil }()
	plan, buildErr := d.build(kept)
	if buildErr != nil && !errors.Is(buildErr, ErrTooManyEgresses) {
		return buildErr
	}
	err = d.program(ctx, plan)
	if _, isTable := errors.AsType[*tableError](err); isTable {
		// One Egress's part may be what the kernel refuses: find the
		// Egresses whose part fails on its own, program the others.
		bad, ierr := d.isolate(kept)
		if ierr != nil || len(bad) == 0 {
			d.applied = nil
			return errors.Join(err, ierr)
		}
		for n, e := range bad {
			if i := slices.IndexFunc(st.Egresses, func(x Egress) bool { return x.Name == n }); i >= 0 {
				e.egress = st.Egresses[i]
			}
			refused[n] = e
			logger.Error(e.err, "the kernel refuses this Egress's part of the datapath; the other Egresses are programmed without it", "egress", klog.KRef("", n))
		}
		kept = d.fallback(st, refused)
		plan, buildErr = d.build(kept)
		if buildErr != nil && !errors.Is(buildErr, ErrTooManyEgresses) {
			return buildErr
		}
		err = d.program(ctx, plan)
	}
	if err != nil {
		// Part of the plan may be in place: reconcile against the kernel
		// next time rather than against memory.
		d.applied = nil
		return err
	}
	n, err := d.cleanConntrack(plan, st, keep, ended)
	if err != nil {
		d.applied = nil
		return err
	}
	if n > 0 {
		logger.Info("conntrack entries deleted after role changes", "entries", n)
	}
	for k, dr := range keep {
		if _, ok := d.drains[k]; !ok {
			logger.V(1).Info("member left its Egress: its open flows keep their path until they end", "egress", klog.KRef("", dr.Egress), "member", dr.IP)
		}
	}
	if len(ended) > 0 {
		logger.V(1).Info("drains ended", "drains", len(ended))
	}
	d.drains = keep
	d.uids = map[netip.Addr]string{}
	for _, p := range st.Pods {
		d.uids[p.IP.Unmap()] = p.UID
	}
	d.ids, d.roles, d.eips, d.members, d.splits, d.applied = plan.IDs, plan.Roles, plan.EIPs, plan.Members, plan.Splits, &plan
	d.assigning = assigningOf(st)
	d.refused = refused
	return errors.Join(buildErr, refusedError(refused))
}

// program writes the device, routes and rules, and the table (when
// changed), in the order that never leaves a marked flow without its
// route: the routes and policy rules a new or changed Egress needs are
// added first, then the table that marks its members' connections is
// replaced, and only then are the rules and routes nobody marks for any
// more deleted (removal in the reverse order). Otherwise a member's first
// packet could be marked (the mark lives in conntrack for the whole flow)
// while no rule routes the mark yet: it leaves through the main table and
// the CNI masquerades it, and the flow is reset once the route appears.
func (d *Datapath) program(ctx context.Context, plan Plan) error {
	if err := d.ensureDevice(); err != nil {
		return err
	}
	staleRoutes, err := d.addRoutes(plan.Routes)
	if err != nil {
		return err
	}
	staleRules, err := d.addRules(plan.Rules)
	if err != nil {
		return err
	}
	if d.beforeTable != nil {
		if err := d.beforeTable(plan); err != nil {
			return err
		}
	}
	d.step(stepAdded, plan)
	d.lastWrite = PickWrite{}
	if d.applied == nil || !reflect.DeepEqual(d.applied.NFT, plan.NFT) {
		// Only the usable IPs of Egresses with several IPs changed: their
		// pick maps are rewritten in place, nothing else.
		var prev Ruleset
		if d.applied != nil {
			prev = d.applied.NFT
		}
		if picks, ok := picksOnly(prev, plan.NFT); ok && d.applied != nil {
			w, err := d.writePicks(picks)
			d.lastWrite = w
			if err != nil {
				return err
			}
			logr.FromContextOrDiscard(ctx).WithName("datapath").V(1).Info("pick maps rewritten", "table", d.cfg.TableName, "maps", w.Maps, "elements", w.Elements)
		} else {
			if err := d.writeTable(plan); err != nil {
				return err
			}
			d.lastWrite = PickWrite{Table: true, Elements: plan.NFT.elementCount(), Messages: plan.NFT.messageCount()}
			logr.FromContextOrDiscard(ctx).WithName("datapath").V(1).Info("nftables table replaced", "table", d.cfg.TableName, "egresses", len(plan.IDs))
		}
	}
	d.step(stepTable, plan)
	if err := d.delRules(staleRules); err != nil {
		return err
	}
	d.step(stepRulesDeleted, plan)
	err = d.delRoutes(staleRoutes)
	d.checkOffloads(ctx)
	return err
}

// Steps of program, reported to a test's observer (Datapath.onStep).
const (
	stepAdded        = "routes and rules added"
	stepTable        = "table written"
	stepRulesDeleted = "stale rules deleted"
)

// step calls the test observer, if any, between two phases of program.
func (d *Datapath) step(name string, plan Plan) {
	if d.onStep != nil {
		d.onStep(name, plan)
	}
}

// offloadCheckInterval is how often an Apply checks the tunnel device's
// offloads (checkOffloads) once the device exists: the check allocates
// about 3 MB (ethtool's string tables) and took 1–8 ms on the test machine,
// too much for every Apply of a failover.
const offloadCheckInterval = time.Minute

// checkOffloads runs ensureOffloads on the tunnel device when it was
// created since the last check or offloadCheckInterval has passed. It
// runs after the routes and the table are written, so a failover does not
// wait for it; a failure is logged, not returned, because the tunnel still
// carries traffic (at a higher CPU cost).
func (d *Datapath) checkOffloads(ctx context.Context) {
	if !d.offloadsAt.IsZero() && time.Since(d.offloadsAt) < offloadCheckInterval {
		return
	}
	name := d.cfg.TunnelDevice
	if err := inNetNS(d.ns, func() error { return ensureOffloads(d.nl, name) }); err != nil {
		logr.FromContextOrDiscard(ctx).WithName("datapath").Error(err, "tunnel device offloads not set: the tunnel works, at a higher CPU cost", "device", name)
	}
	d.offloadsAt = time.Now()
}

// ensureDevice creates or repairs the tunnel device: flow-based VXLAN-GPE,
// MTU uplink-36, the link-local /32, loose rp_filter, up. Its offloads
// are checkOffloads'.
func (d *Datapath) ensureDevice() error {
	name, mtu := d.cfg.TunnelDevice, d.cfg.UplinkMTU-overheadV4
	l, err := d.nl.LinkByName(name)
	if err == nil {
		if vx, ok := l.(*netlink.Vxlan); !ok || !vx.FlowBased || vx.Port != int(d.cfg.TunnelPort) {
			if err := d.nl.LinkDel(l); err != nil {
				return fmt.Errorf("replace tunnel device %s: %w", name, err)
			}
			l = nil
		}
	} else {
		if _, ok := errors.AsType[netlink.LinkNotFoundError](err); !ok {
			return fmt.Errorf("find tunnel device %s: %w", name, err)
		}
		l = nil
	}
	if l == nil {
		if err := inNetNS(d.ns, func() error { return addGPEDevice(name, d.cfg.TunnelPort, mtu) }); err != nil {
			return err
		}
		d.offloadsAt = time.Time{}
		if l, err = d.nl.LinkByName(name); err != nil {
			return fmt.Errorf("find tunnel device %s: %w", name, err)
		}
	}
	if l.Attrs().MTU != mtu {
		if err := d.nl.LinkSetMTU(l, mtu); err != nil {
			return fmt.Errorf("set MTU of %s: %w", name, err)
		}
	}
	addr := &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(d.cfg.TunnelAddr, 32)), Scope: unix.RT_SCOPE_LINK}
	if err := d.nl.AddrReplace(l, addr); err != nil {
		return fmt.Errorf("address %s on %s: %w", d.cfg.TunnelAddr, name, err)
	}
	if err := inNetNS(d.ns, func() error {
		// No IPv6 link-local address (addr_gen_mode 1, "none"): the
		// device carries IPv6 but needs no address, MLD or ND of its own.
		if err := writeSysctl("net/ipv6/conf/"+name+"/addr_gen_mode", "1"); err != nil {
			return err
		}
		return writeSysctl("net/ipv4/conf/"+name+"/rp_filter", "2")
	}); err != nil {
		return err
	}
	if l.Attrs().Flags&(1<<0) == 0 || l.Attrs().OperState != netlink.OperUp {
		if err := d.nl.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up: %w", name, err)
		}
	}
	return nil
}

// writeTable replaces the table in one transaction (add, delete, add, then
// the content) after harvesting its rejected-packet counters.
func (d *Datapath) writeTable(plan Plan) error {
	if err := d.harvest(); err != nil {
		return err
	}
	c, err := d.nft(sendBuffer(plan.NFT))
	if err != nil {
		return err
	}
	t := d.table()
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	if err := fillTable(c, t, plan.NFT); err != nil {
		return err
	}
	if err := c.Flush(); err != nil {
		return &tableError{fmt.Errorf("replace nftables table inet %s: %w", t.Name, err)}
	}
	return nil
}

// fillTable adds the content of nft to the batch of c, in table t. It
// fails (with a *tableError) when a set or its elements cannot be encoded.
func fillTable(c *nftables.Conn, t *nftables.Table, nft Ruleset) error {
	// Chains first, rules last: the verdict maps' elements name chains
	// (jump dst...), the rules name sets; the kernel resolves both when
	// they are added (ENOENT otherwise).
	chains := make([]*nftables.Chain, len(nft.Chains))
	for i, cc := range nft.Chains {
		ch := cc.Chain
		ch.Table = t
		chains[i] = c.AddChain(&ch)
	}
	for _, sc := range nft.Sets {
		s := sc.Set
		s.Table = t
		if err := c.AddSet(&s, nil); err != nil {
			return &tableError{fmt.Errorf("nftables set %s: %w", s.Name, err)}
		}
		for i := 0; i < len(sc.Elements); i += setChunk {
			if err := c.SetAddElements(&s, sc.Elements[i:min(i+setChunk, len(sc.Elements))]); err != nil {
				return &tableError{fmt.Errorf("nftables set %s: %w", s.Name, err)}
			}
		}
	}
	for _, n := range nft.Counters {
		c.AddObj(&nftables.NamedObj{Table: t, Name: n, Type: nftables.ObjTypeCounter, Obj: &expr.Counter{}})
	}
	for i, cc := range nft.Chains {
		for _, r := range cc.Rules {
			c.AddRule(&nftables.Rule{Table: t, Chain: chains[i], Exprs: r})
		}
	}
	return nil
}

// readCounters returns the table's named counters (packets), by name; an
// absent table gives none.
func (d *Datapath) readCounters() (map[string]uint64, error) {
	c, err := d.nft()
	if err != nil {
		return nil, err
	}
	objs, err := c.GetNamedObjects(d.table())
	if err != nil {
		if errors.Is(err, unix.ENOENT) || strings.Contains(err.Error(), "no such file") {
			return nil, nil
		}
		return nil, fmt.Errorf("read nftables counters: %w", err)
	}
	out := map[string]uint64{}
	for _, o := range objs {
		switch o := o.(type) {
		case *nftables.NamedObj:
			if ctr, ok := o.Obj.(*expr.Counter); ok {
				out[o.Name] = ctr.Packets
			}
		case *nftables.CounterObj:
			out[o.Name] = o.Packets
		}
	}
	return out, nil
}

// harvest adds the current rejected and drop counters to d.rejected
// before the table that holds them is replaced.
func (d *Datapath) harvest() error {
	cur, err := d.readCounters()
	if err != nil {
		return err
	}
	names := map[uint16]string{}
	for n, id := range d.ids {
		names[id] = n
	}
	for k, v := range cur {
		if id, ok := strings.CutPrefix(k, rejectedPrefix); ok {
			if n, err := strconv.Atoi(id); err == nil && names[uint16(n)] != "" {
				d.rejected[names[uint16(n)]] += v
			}
			continue
		}
		// The guards' drop counters, kept under their "@" keys (no
		// Egress name starts with "@").
		d.rejected["@"+k] += v
	}
	return nil
}

// Counters returns the packets rejected so far under FailurePolicyFail, by
// Egress name, for egressip_agent_packets_rejected_total{egress}; values
// never decrease while the process runs (a restart starts from the
// counters of the table then in place). It also reports, under the keys
// "unknown-source", "spoofed-tunnel", "eip-inbound" and "eip-source"
// (the source guard of egress IPv6 addresses) prefixed with "@",
// the datapath's drop counters, likewise carried over table replacements.
func (d *Datapath) Counters(ctx context.Context) (map[string]uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	cur, err := d.readCounters()
	if err != nil {
		return nil, err
	}
	out := maps.Clone(d.rejected)
	names := map[uint16]string{}
	for n, id := range d.ids {
		names[id] = n
	}
	for k, v := range cur {
		if id, ok := strings.CutPrefix(k, rejectedPrefix); ok {
			if n, err := strconv.Atoi(id); err == nil && names[uint16(n)] != "" {
				out[names[uint16(n)]] += v
			}
			continue
		}
		out["@"+k] += v
	}
	return out, nil
}

// routeKey identifies a route we own.
type routeKey struct {
	table int
	dst   netip.Prefix
}

func (d *Datapath) ownsTable(t int) bool {
	return t == d.cfg.ReturnTable() || (t > d.cfg.TableBase && t <= d.cfg.TableBase+int(d.cfg.maxID()))
}

// addRoutes adds or replaces the routes of want that are missing or
// differ, and returns the routes of our tables that want no longer holds
// (for delRoutes, once nothing marks for them): against the kernel on the
// first Apply (every wanted route replaced, since the kernel's dump is not
// decoded enough to compare outer destinations), against the last Plan
// afterwards.
func (d *Datapath) addRoutes(want []EncapRoute) ([]routeKey, error) {
	l, err := d.nl.LinkByName(d.cfg.TunnelDevice)
	if err != nil {
		return nil, fmt.Errorf("find tunnel device: %w", err)
	}
	have := map[routeKey]*EncapRoute{}
	if d.applied == nil {
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			rs, err := d.nl.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
			if err != nil {
				return nil, fmt.Errorf("list routes: %w", err)
			}
			for _, r := range rs {
				if !d.ownsTable(r.Table) || r.Dst == nil {
					continue
				}
				p, ok := netip.AddrFromSlice(r.Dst.IP)
				if !ok {
					continue
				}
				ones, _ := r.Dst.Mask.Size()
				have[routeKey{r.Table, netip.PrefixFrom(p.Unmap(), ones)}] = nil // unknown outer: replace
			}
		}
	} else {
		for i := range d.applied.Routes {
			r := &d.applied.Routes[i]
			have[routeKey{r.Table, r.Dst}] = r
		}
	}
	wanted := map[routeKey]bool{}
	for _, r := range want {
		k := routeKey{r.Table, r.Dst}
		wanted[k] = true
		if old, ok := have[k]; ok && old != nil && *old == r {
			continue
		}
		nr := &netlink.Route{
			LinkIndex: l.Attrs().Index, Table: r.Table, Dst: prefixNet(r.Dst), Scope: netlink.SCOPE_LINK,
			// A locked MTU: IPv6 forwarding ignores an unlocked route MTU
			// (ip6_dst_mtu_maybe_forward) and would use the device's.
			Protocol: unix.RTPROT_STATIC, MTU: r.MTU, MTULock: r.MTU != 0,
			Encap: &ipEncap{ID: tunnelID, Dst: r.Outer, TTL: tunnelTTL, Flags: tunnelCsum},
		}
		if err := d.nl.RouteReplace(nr); err != nil {
			return nil, fmt.Errorf("route %s table %d via %s: %w", r.Dst, r.Table, r.Outer, err)
		}
	}
	var stale []routeKey
	for k := range have {
		if !wanted[k] {
			stale = append(stale, k)
		}
	}
	return stale, nil
}

// delRoutes deletes routes of our tables; absent ones are not an error.
func (d *Datapath) delRoutes(stale []routeKey) error {
	for _, k := range stale {
		// Scope "nowhere" matches any scope (as ip-route(8) deletes); the
		// default, universe, would not match our link-scope routes.
		del := &netlink.Route{Table: k.table, Dst: prefixNet(k.dst), Scope: netlink.Scope(unix.RT_SCOPE_NOWHERE)}
		if err := d.nl.RouteDel(del); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("delete route %s table %d: %w", k.dst, k.table, err)
		}
	}
	return nil
}

// listRules returns our policy rules (priorities base..base+2) as they are
// in the kernel.
func (d *Datapath) listRules() ([]PolicyRule, []netlink.Rule, error) {
	var prs []PolicyRule
	var raw []netlink.Rule
	for _, fam := range []int{afInet, afInet6} {
		rs, err := d.nl.RuleList(fam)
		if err != nil {
			return nil, nil, fmt.Errorf("list rules: %w", err)
		}
		for _, r := range rs {
			if r.Priority < d.cfg.RulePriority || r.Priority > d.cfg.RulePriority+2 {
				continue
			}
			pr := PolicyRule{Family: fam, Priority: r.Priority, Mark: r.Mark}
			if r.Mask != nil {
				pr.Mask = *r.Mask
			}
			// RuleList does not decode the action; a rule with neither a
			// table nor a goto target is a nop.
			switch {
			case r.Goto > 0:
				pr.Goto = r.Goto
			case r.Table == unix.RT_TABLE_UNSPEC:
				pr.Nop = true
			default:
				pr.Table = r.Table
			}
			prs = append(prs, pr)
			raw = append(raw, r)
		}
	}
	return prs, raw, nil
}

// addRules adds the policy rules of want that are missing, and returns
// ours that want no longer holds (for delRules).
func (d *Datapath) addRules(want []PolicyRule) ([]netlink.Rule, error) {
	have, raw, err := d.listRules()
	if err != nil {
		return nil, err
	}
	for _, w := range want {
		if slices.Contains(have, w) {
			continue
		}
		r := netlink.NewRule()
		r.Family, r.Priority = w.Family, w.Priority
		if w.Mask != 0 {
			mask := w.Mask
			r.Mark, r.Mask = w.Mark, &mask
		}
		switch {
		case w.Nop:
			r.Type = frActNop
		case w.Goto != 0:
			r.Goto = w.Goto
		default:
			r.Table = w.Table
		}
		if err := d.nl.RuleAdd(r); err != nil {
			return nil, fmt.Errorf("add rule pref %d: %w", w.Priority, err)
		}
	}
	var stale []netlink.Rule
	for i, h := range have {
		if !slices.Contains(want, h) {
			stale = append(stale, raw[i])
		}
	}
	return stale, nil
}

// delRules deletes policy rules; absent ones are not an error.
func (d *Datapath) delRules(stale []netlink.Rule) error {
	for i := range stale {
		if err := d.nl.RuleDel(&stale[i]); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("delete rule pref %d: %w", stale[i].Priority, err)
		}
	}
	return nil
}

// ctFilter selects conntrack entries by connection-mark ID, by the
// reply-direction destination (the egress IP of an SNATed flow), or by
// original source and ID together (a member IP that left that Egress).
type ctFilter struct {
	mask  uint32
	marks map[uint32]bool
	ips   map[netip.Addr]bool
	// left holds member IPs that no longer belong to an Egress here (or
	// whose drain ended) with the ID mark (masked) their old entries
	// carry.
	left map[liveKey]bool
	// joinedFailed holds member IPs that have just joined an Egress whose
	// traffic is rejected (RoleFailed), or whose Egress has just become
	// so: their unmarked flows to destinations outside cluster, opened
	// before they joined, would otherwise go on leaving with the Node IP.
	joinedFailed map[netip.Addr]bool
	cluster      []netip.Prefix
	// failedSpans limits joinedFailed for split members: only their
	// flows to these destinations (those of their rejected Egresses).
	failedSpans map[netip.Addr][]destinations.Span
}

func (f *ctFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	id := flow.Mark & f.mask
	if f.marks[id] {
		return true
	}
	if a, ok := netip.AddrFromSlice(flow.Reverse.DstIP); ok && f.ips[a.Unmap()] {
		return true
	}
	if a, ok := netip.AddrFromSlice(flow.Forward.SrcIP); ok && id != 0 {
		if f.left[liveKey{a.Unmap(), id}] {
			return true
		}
	}
	if a, ok := netip.AddrFromSlice(flow.Forward.SrcIP); ok && id == 0 && f.joinedFailed[a.Unmap()] {
		// The destination as classified: after DNAT, the reply's source.
		if dst, ok := netip.AddrFromSlice(flow.Reverse.SrcIP); ok && !slices.ContainsFunc(f.cluster, func(p netip.Prefix) bool { return p.Contains(dst.Unmap()) }) {
			spans, split := f.failedSpans[a.Unmap()]
			return !split || destinations.Lookup(spans, dst.Unmap()) != ""
		}
	}
	return false
}

// cleanConntrack deletes the entries of Egresses whose role on this Node
// changed (local <-> tunnelled <-> failed <-> none), of egress IPs this
// Node no longer holds, and of member IPs that left an Egress here (only
// the entries they opened under that Egress's mark: an IP reused by
// another Pod must be classified afresh, while its unmarked in-cluster
// flows stay), and of member IPs that just joined an Egress under
// failurePolicy Fail with no Node, or whose Egress just became so (only
// their unmarked flows to destinations outside the cluster: the next
// packet of such a flow is classified afresh and rejected, instead of
// leaving with the Node IP). Members that left an Egress but drain
// (drains) keep their entries; the entries of drains that ended are
// deleted. It returns how many were deleted.
func (d *Datapath) cleanConntrack(plan Plan, st State, drains map[drainKey]drain, ended []drain) (uint, error) {
	f := &ctFilter{mask: d.cfg.IDMask, marks: map[uint32]bool{}, ips: map[netip.Addr]bool{}, left: map[liveKey]bool{}, joinedFailed: map[netip.Addr]bool{}}
	draining := map[liveKey]bool{}
	for _, dr := range drains {
		draining[liveKey{dr.IP, dr.Mark & d.cfg.IDMask}] = true
	}
	for _, dr := range ended {
		if k := (liveKey{dr.IP, dr.Mark & d.cfg.IDMask}); !draining[k] {
			f.left[k] = true
		}
	}
	// failed: marks of Egresses rejected here, true when that began now.
	// An Egress waiting for its first assignment does not count: flows
	// that predate it are not cut (they are once it is failed for good).
	failed := map[uint32]bool{}
	assigning := assigningOf(st)
	for name, role := range plan.Roles {
		if role == RoleFailed && !assigning[name] {
			failed[d.cfg.Mark(plan.IDs[name])] = d.roles[name] != RoleFailed || d.ids[name] != plan.IDs[name] || d.assigning[name]
		}
	}
	oldMarks, newMarks := memberMarks(d.members, d.splits), memberMarks(plan.Members, plan.Splits)
	for ip, marks := range newMarks {
		for _, mark := range marks {
			if began, isFailed := failed[mark&d.cfg.IDMask]; isFailed && (began || !slices.Contains(oldMarks[ip], mark)) {
				f.joinedFailed[ip] = true
			}
		}
	}
	// A split member's earlier flows are cut only toward the destinations
	// of its rejected Egresses.
	if len(f.joinedFailed) > 0 && len(plan.Splits) > 0 {
		f.failedSpans = failedSpans(d.cfg, st, plan, failed, f.joinedFailed)
	}
	if len(f.joinedFailed) > 0 {
		for _, fam := range families {
			f.cluster = append(f.cluster, clusterPrefixes(fam, st)...)
		}
	}
	for name, id := range d.ids {
		if nid, ok := plan.IDs[name]; !ok || nid != id || !sameRole(plan.Roles[name], d.roles[name]) {
			f.marks[d.cfg.Mark(id)] = true
		}
	}
	for name, ip := range d.eips {
		if plan.EIPs[name] != ip {
			f.ips[ip] = true
		}
	}
	for ip, marks := range oldMarks {
		for _, mark := range marks {
			if slices.Contains(newMarks[ip], mark) {
				continue
			}
			if id := mark & d.cfg.IDMask; id != 0 && !f.marks[id] && !draining[liveKey{ip, id}] {
				f.left[liveKey{ip, id}] = true
			}
		}
	}
	if len(f.marks) == 0 && len(f.ips) == 0 && len(f.left) == 0 && len(f.joinedFailed) == 0 {
		return 0, nil
	}
	var total uint
	for _, fam := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		n, err := d.nl.ConntrackDeleteFilters(netlink.ConntrackTable, fam, f)
		total += n
		if err != nil {
			return total, fmt.Errorf("delete conntrack entries: %w", err)
		}
	}
	return total, nil
}

// assigningOf returns the Egresses of st under RoleFailed that wait for
// their first assignment (Egress.Assigning).
func assigningOf(st State) map[string]bool {
	m := map[string]bool{}
	for _, e := range st.Egresses {
		if e.Role == RoleFailed && e.Assigning {
			m[e.Name] = true
		}
	}
	return m
}

// Teardown removes everything the datapath owns: the nftables table, the
// routes of its tables, its policy rules and the tunnel device. Absent
// objects are not an error.
func (d *Datapath) Teardown(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	c, err := d.nft()
	if err != nil {
		return err
	}
	t := d.table()
	c.AddTable(t)
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		errs = append(errs, fmt.Errorf("delete nftables table: %w", err))
	}
	if _, raw, err := d.listRules(); err != nil {
		errs = append(errs, err)
	} else {
		for i := range raw {
			if err := d.nl.RuleDel(&raw[i]); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("delete rule pref %d: %w", raw[i].Priority, err))
			}
		}
	}
	for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
		rs, err := d.nl.RouteListFiltered(fam, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
		if err != nil {
			errs = append(errs, fmt.Errorf("list routes: %w", err))
			continue
		}
		for i := range rs {
			if d.ownsTable(rs[i].Table) {
				if err := d.nl.RouteDel(&rs[i]); err != nil && !errors.Is(err, unix.ESRCH) {
					errs = append(errs, fmt.Errorf("delete route: %w", err))
				}
			}
		}
	}
	if l, err := d.nl.LinkByName(d.cfg.TunnelDevice); err == nil {
		if err := d.nl.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", d.cfg.TunnelDevice, err))
		}
	}
	d.applied, d.ids, d.roles, d.eips, d.members, d.splits, d.refused = nil, IDs{}, map[string]Role{}, map[string]netip.Addr{}, map[netip.Addr]uint32{}, map[netip.Addr][]uint32{}, nil
	d.drains, d.uids = nil, nil
	return errors.Join(errs...)
}
