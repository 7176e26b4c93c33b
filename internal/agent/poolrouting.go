package agent

import (
	"context"
	"fmt"
	"net/netip"
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
	return &PoolRouting{router: r, engine: e.Datapath, closer: h.Close}, nil
}

// Close releases the netlink handle; the tables and rules stay for the
// next agent, which adopts or removes them.
func (p *PoolRouting) Close() {
	if p.closer != nil {
		p.closer()
	}
}

// poolEgresses lists, from an applied State, the egress IPs held here
// with the marks of the Egresses SNATing to them and their pool's
// subnetInfo.
func poolEgresses(st datapath.State, ids datapath.IDs, cfg datapath.Config, egs []v1alpha1.Egress, pools []v1alpha1.ExternalIPPool) []poolroute.Egress {
	poolOf := map[string]string{}
	for i := range egs {
		poolOf[egs[i].Name] = egs[i].Spec.ExternalIPPool
	}
	subnet := map[string]*v1alpha1.SubnetInfo{}
	for i := range pools {
		subnet[pools[i].Name] = pools[i].Spec.SubnetInfo
	}
	idx := map[netip.Addr]int{}
	var out []poolroute.Egress
	for _, e := range st.Egresses {
		id, ok := ids[e.Name]
		if e.Role != datapath.RoleEgress || !e.IP.IsValid() || !ok {
			continue
		}
		i, seen := idx[e.IP]
		if !seen {
			pe := poolroute.Egress{IP: e.IP}
			if si := subnet[poolOf[e.Name]]; si != nil {
				if gw, err := netip.ParseAddr(si.Gateway); err == nil && gw.Unmap().Is4() == e.IP.Is4() {
					pe.Gateway, pe.PrefixLen = gw.Unmap(), int(si.PrefixLength)
				}
			}
			i = len(out)
			idx[e.IP] = i
			out = append(out, pe)
		}
		out[i].Marks = append(out[i].Marks, cfg.Mark(id))
	}
	return out
}

// Sync programs the pool routing of st and reports whether an egress IP
// held here is not bound yet (the caller comes back soon: the binding
// reconciler runs apart). Problems are logged, on change only.
func (p *PoolRouting) Sync(ctx context.Context, st datapath.State, egs []v1alpha1.Egress, pools []v1alpha1.ExternalIPPool) bool {
	log := ctrllog.FromContext(ctx).WithName("poolroute")
	want := poolEgresses(st, p.engine.IDs(), p.engine.Config(), egs, pools)
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
