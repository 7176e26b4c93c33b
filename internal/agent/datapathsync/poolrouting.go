package datapathsync

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent/datapath"
	"github.com/egressip/egressip/internal/agent/poolroute"
)

// PoolRouting routes the egress IPs this Node holds by their pool's own
// network (package poolroute) after every datapath Apply: an egress IP
// bound on a link other than the default-route link leaves through that
// link, to its pool's subnetInfo.gateway.
type PoolRouting struct {
	router *poolroute.Router
	engine poolEngine
	closer func()
	last   string

	mu    sync.Mutex
	egs   []v1alpha1.Egress
	pools []v1alpha1.ExternalIPPool
}

// poolRecheck is how soon the datapath reconciler comes back while an
// egress IP held here is not bound yet (the binding reconciler runs apart).
const poolRecheck = time.Second

// poolEngine is what PoolRouting reads of the datapath engine.
type poolEngine interface {
	IDs() datapath.IDs
	Config() datapath.Config
}

// NewPoolRouting opens pool routing in the engine's network namespace,
// with the engine's ID mask. Close releases its netlink handle. It fails
// when the handle cannot be opened.
func (e *Engine) NewPoolRouting() (*PoolRouting, error) {
	var (
		h   *netlink.Handle
		err error
	)
	if e.ns.IsOpen() {
		h, err = netlink.NewHandleAt(e.ns)
	} else {
		h, err = netlink.NewHandle()
	}
	if err != nil {
		return nil, fmt.Errorf("pool routing: open netlink: %w", err)
	}
	r, err := poolroute.New(h, poolroute.Config{IDMask: e.Config().IDMask})
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("pool routing: %w", err)
	}
	p := &PoolRouting{router: r, engine: e.Datapath, closer: h.Close}
	e.SetBeforeTable(p.beforeTable)
	return p, nil
}

// SetInputs gives the Egresses and pools of the pass about to Apply, for
// the routes and rules added before the datapath's table (beforeTable).
func (p *PoolRouting) SetInputs(egs []v1alpha1.Egress, pools []v1alpha1.ExternalIPPool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.egs, p.pools = egs, pools
}

// beforeTable adds, inside the datapath's Apply, the pool routes and
// rules the new plan needs before its table marks flows for them, so the
// first packets of an Egress that just arrived on this Node do not leave
// through the main table. Stale ones go in Sync, after the Apply.
func (p *PoolRouting) beforeTable(plan datapath.Plan) error {
	p.mu.Lock()
	egs, pools := p.egs, p.pools
	p.mu.Unlock()
	if _, err := p.router.Add(poolEgresses(plan.EIPs, plan.IDs, p.engine.Config(), egs, pools)); err != nil {
		return fmt.Errorf("pool routing: %w", err)
	}
	return nil
}

// Close releases the netlink handle; the tables and rules stay for the
// next agent, which adopts or removes them.
// A nil PoolRouting is closed already.
func (p *PoolRouting) Close() {
	if p != nil && p.closer != nil {
		p.closer()
	}
}

// poolEgresses lists, from an applied State, the egress IPs held here
// with the marks of the Egresses SNATing to them and their pool's
// subnetInfo.
func poolEgresses(eips map[string]netip.Addr, ids datapath.IDs, cfg datapath.Config, egs []v1alpha1.Egress, pools []v1alpha1.ExternalIPPool) []poolroute.Egress {
	poolOf := map[string]string{}
	for i := range egs {
		poolOf[egs[i].Name] = egs[i].Spec.ExternalIPPool
		for _, x := range egs[i].Status.IPs { // the per-IP parts of a multi-IP Egress
			if ip, err := netip.ParseAddr(x.IP); err == nil {
				poolOf[datapath.SubName(egs[i].Name, ip)] = x.Pool
			}
		}
	}
	subnet := map[string]*v1alpha1.SubnetInfo{}
	for i := range pools {
		subnet[pools[i].Name] = pools[i].Spec.SubnetInfo
	}
	names := slices.Sorted(maps.Keys(eips))
	idx := map[netip.Addr]int{}
	var out []poolroute.Egress
	for _, name := range names {
		ip := eips[name]
		id, ok := ids[name]
		if !ip.IsValid() || !ok {
			continue
		}
		i, seen := idx[ip]
		if !seen {
			pe := poolroute.Egress{IP: ip}
			if si := subnet[poolOf[name]]; si != nil {
				if gw, err := netip.ParseAddr(si.Gateway); err == nil && gw.Unmap().Is4() == ip.Is4() {
					pe.Gateway, pe.PrefixLen = gw.Unmap(), int(si.PrefixLength)
				}
			}
			i = len(out)
			idx[ip] = i
			out = append(out, pe)
		}
		out[i].Marks = append(out[i].Marks, cfg.Mark(id))
	}
	return out
}

// heldEIPs is the egress IP of every Egress st gives RoleEgress here.
func heldEIPs(st datapath.State) map[string]netip.Addr {
	m := map[string]netip.Addr{}
	for _, e := range st.Egresses {
		switch {
		case e.Role == datapath.RoleEgress && len(e.IPs) > 0:
			// Several IPs: the part of the IP held here SNATs.
			for _, x := range e.IPs {
				if x.Held {
					m[datapath.SubName(e.Name, x.IP)] = x.IP.Unmap()
				}
			}
		case e.Role == datapath.RoleEgress && e.IP.IsValid():
			m[e.Name] = e.IP.Unmap()
		}
	}
	return m
}

// Sync programs the pool routing of st and reports whether an egress IP
// held here is not bound yet (the caller comes back soon: the binding
// reconciler runs apart). Problems are logged, on change only.
func (p *PoolRouting) Sync(ctx context.Context, st datapath.State, egs []v1alpha1.Egress, pools []v1alpha1.ExternalIPPool) bool {
	log := ctrllog.FromContext(ctx).WithName("poolroute")
	p.SetInputs(egs, pools)
	want := poolEgresses(heldEIPs(st), p.engine.IDs(), p.engine.Config(), egs, pools)
	res, err := p.router.Sync(want)
	poolroute.Observe(res, err)
	msg := res.String()
	if e := res.Err(); e != nil {
		msg += "; " + e.Error()
	}
	if err != nil {
		log.Error(err, "program the pool routing tables")
	} else if msg != p.last {
		p.last = msg
		if e := res.Err(); e != nil {
			log.Error(e, "egress IPs whose traffic follows the main table", "routes", res.String())
		} else {
			log.V(1).Info("pool routing programmed", "routes", res.String())
		}
	}
	for _, r := range res.Routes {
		if r.Link == "" {
			return true
		}
	}
	return err != nil
}
