package controller

import (
	"cmp"
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/cloud"
)

// Elastic IP provider calls, as the action label of the cloud call metrics
// names them.
const (
	actionElasticIPs   = "ElasticIPs"
	actionAssociate    = "Associate"
	actionDisassociate = "Disassociate"
)

// eipView is what the CloudActuator last read of one pool's Elastic IPs.
type eipView struct {
	// IPs are the allocations found (by ID or by tag).
	IPs []cloud.ElasticIP
	// Missing are named allocation IDs that do not exist.
	Missing []string
	// Err is the error of the last read, if it failed.
	Err string
}

// eipOp is one Elastic IP call for the CloudActuator to run.
type eipOp struct {
	Pool, AllocationID string
	// Associate with InterfaceID/Private, or (false) disassociate
	// AssociationID.
	Associate     bool
	InterfaceID   string
	Private       netip.Addr
	AssociationID string
}

// eipWant is one Egress of the pool with an address.
type eipWant struct {
	Egress string
	IP     netip.Addr
	// Interface holds IP for us at the Egress's Node (assigned and
	// attached); empty while it is not.
	Interface string
}

// eipPlan is the Elastic IP outcome of a pass for one pool.
type eipPlan struct {
	Ops []eipOp
	// Public maps Egresses to their associated public address.
	Public map[string]netip.Addr
	Cond   metav1.Condition
}

// planElasticIPs decides a pool's associations: an Egress keeps the
// allocation associated with its address (a move carries it, in EC2
// itself); an assigned Egress without one gets the lowest free
// allocation; an allocation associated with an address of ours that no
// Egress of the pool uses any more is disassociated; and an allocation
// that is unknown or associated with an address not ours is reported and
// never touched. ours says whether an address is egressip's; blocked
// whether an allocation has a call in flight or is backing off.
func planElasticIPs(view eipView, wants []eipWant, ours func(netip.Addr) bool, blocked func(string) bool) eipPlan {
	out := eipPlan{Public: map[string]netip.Addr{}}
	if view.Err != "" {
		out.Cond = metav1.Condition{Type: v1.ConditionElasticIPs, Status: metav1.ConditionFalse, Reason: v1.ReasonElasticIPsUnreadable,
			Message: "the pool's Elastic IPs cannot be read (associations are left as they are): " + view.Err}
		return out
	}
	byPrivate := map[netip.Addr]cloud.ElasticIP{}
	for _, e := range view.IPs {
		if e.AssociationID != "" {
			byPrivate[e.PrivateIP] = e
		}
	}
	wanted := map[netip.Addr]bool{}
	for _, w := range wants {
		wanted[w.IP] = true
	}
	var free []cloud.ElasticIP
	var elsewhere []string
	for _, e := range view.IPs {
		switch {
		case e.AssociationID == "":
			if !blocked(e.AllocationID) {
				free = append(free, e)
			}
		case wanted[e.PrivateIP]:
		case ours(e.PrivateIP):
			if !blocked(e.AllocationID) {
				out.Ops = append(out.Ops, eipOp{AllocationID: e.AllocationID, AssociationID: e.AssociationID})
			}
		default:
			elsewhere = append(elsewhere, fmt.Sprintf("%s (%s) is associated with %s on %s", e.AllocationID, e.PublicIP, e.PrivateIP, cmp.Or(e.InterfaceID, "an unknown interface")))
		}
	}
	slices.SortFunc(wants, func(a, b eipWant) int { return cmp.Compare(a.Egress, b.Egress) })
	short := 0
	for _, w := range wants {
		if e, ok := byPrivate[w.IP]; ok {
			out.Public[w.Egress] = e.PublicIP
			continue
		}
		if w.Interface == "" {
			continue // associated once the address is attached on its Node
		}
		if len(free) == 0 {
			short++
			continue
		}
		e := free[0]
		free = free[1:]
		out.Ops = append(out.Ops, eipOp{AllocationID: e.AllocationID, Associate: true, InterfaceID: w.Interface, Private: w.IP})
	}
	var problems []string
	for _, id := range view.Missing {
		problems = append(problems, id+" does not exist in this account and region")
	}
	problems = append(problems, elsewhere...)
	switch {
	case len(problems) > 0:
		out.Cond = metav1.Condition{Type: v1.ConditionElasticIPs, Status: metav1.ConditionFalse, Reason: v1.ReasonElasticIPUnusable,
			Message: strings.Join(problems, "; ") + ": fix or remove these allocations in spec.cloud.aws.elasticIPs (one associated with an address that is not egressip's is never taken; disassociate it first)"}
		if short > 0 {
			out.Cond.Message += fmt.Sprintf("; %d assigned Egresses have no Elastic IP", short)
		}
	case short > 0:
		out.Cond = metav1.Condition{Type: v1.ConditionElasticIPs, Status: metav1.ConditionFalse, Reason: v1.ReasonElasticIPsExhausted,
			Message: fmt.Sprintf("%d assigned Egresses have no Elastic IP: add allocations to spec.cloud.aws.elasticIPs (%d usable)", short, len(view.IPs)-len(elsewhere))}
	default:
		out.Cond = metav1.Condition{Type: v1.ConditionElasticIPs, Status: metav1.ConditionTrue, Reason: v1.ReasonElasticIPsAssociated,
			Message: fmt.Sprintf("%d of %d Elastic IPs associated with the pool's egress IPs", len(out.Public), len(view.IPs))}
	}
	return out
}

// refreshElasticIPs reads the Elastic IPs of every pool that names some,
// one provider call per pool.
func (c *CloudActuator) refreshElasticIPs(ctx context.Context, pools []v1.ExternalIPPool) {
	prov, ok := c.cfg.Provider.(cloud.ElasticIPs)
	if !ok {
		return
	}
	seq := c.readSeq()
	views := map[string]eipView{}
	for i := range pools {
		p := &pools[i]
		if p.Spec.Cloud == nil || p.Spec.Cloud.AWS == nil || p.Spec.Cloud.AWS.ElasticIPs == nil {
			continue
		}
		sel := p.Spec.Cloud.AWS.ElasticIPs
		var got []cloud.ElasticIP
		err := c.call(ctx, actionElasticIPs, func() error {
			var err error
			got, err = prov.ElasticIPs(ctx, sel.AllocationIDs, sel.Tags)
			return err
		})
		v := eipView{IPs: got}
		if err != nil {
			v = eipView{Err: err.Error()}
		}
		for _, id := range sel.AllocationIDs {
			if err == nil && !slices.ContainsFunc(got, func(e cloud.ElasticIP) bool { return e.AllocationID == id }) {
				v.Missing = append(v.Missing, id)
			}
		}
		views[p.Name] = v
	}
	c.mu.Lock()
	c.overlayEIPs(views, seq, c.cfg.Clock.Now())
	changed := fmt.Sprint(views) != fmt.Sprint(c.eips)
	c.eips = views
	c.mu.Unlock()
	if changed {
		c.notify()
	}
}

// runElasticIPs runs the pass's Elastic IP calls, each in the background,
// one at a time per allocation.
func (c *CloudActuator) runElasticIPs(ctx context.Context, ops []eipOp) {
	prov, ok := c.cfg.Provider.(cloud.ElasticIPs)
	if !ok {
		return
	}
	for _, op := range ops {
		key := "eip/" + op.AllocationID
		c.mu.Lock()
		if c.busy[key] {
			c.mu.Unlock()
			continue
		}
		c.busy[key] = true
		c.mu.Unlock()
		go func() {
			defer func() {
				c.mu.Lock()
				delete(c.busy, key)
				c.mu.Unlock()
				c.notify()
			}()
			var err error
			var assoc string
			if op.Associate {
				err = c.call(ctx, actionAssociate, func() error {
					var err error
					assoc, err = prov.Associate(ctx, op.AllocationID, op.InterfaceID, op.Private)
					return err
				})
			} else {
				err = c.call(ctx, actionDisassociate, func() error { return prov.Disassociate(ctx, op.AssociationID) })
			}
			if err != nil {
				log.FromContext(ctx).Info("Elastic IP call failed", "allocation", op.AllocationID, "associate", op.Associate, "err", err)
				c.failed(ctx, actionAssociate, op.Pool, key, err)
				return
			}
			c.mu.Lock()
			v := c.eips[op.Pool]
			v.IPs = slices.Clone(v.IPs)
			for i := range v.IPs {
				if v.IPs[i].AllocationID == op.AllocationID {
					v.IPs[i].AssociationID, v.IPs[i].InterfaceID, v.IPs[i].PrivateIP = assoc, op.InterfaceID, op.Private
					if !op.Associate {
						v.IPs[i].InterfaceID, v.IPs[i].PrivateIP = "", netip.Addr{}
					}
				}
			}
			c.eips[op.Pool] = v
			if op.Associate {
				c.associated(op.Pool, op.AllocationID, assoc, op.InterfaceID, op.Private, c.cfg.Clock.Now())
			} else {
				c.associated(op.Pool, op.AllocationID, "", "", netip.Addr{}, c.cfg.Clock.Now())
			}
			c.mu.Unlock()
		}()
	}
}
