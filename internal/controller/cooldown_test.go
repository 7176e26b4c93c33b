package controller

import (
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/cloud/warm"
)

// TestCooldownSamePassPlan is the pure decision of issue 17 item 5: an
// address that leaves an Egress cools down before any Egress may take it,
// even in the pass that released it; and the Egresses found pending in one
// pass are topped up with one batched attach per interface.
func TestCooldownSamePassPlan(t *testing.T) {
	a5, a9 := netip.MustParseAddr("10.0.0.5"), netip.MustParseAddr("10.0.0.9")
	type want struct {
		got      map[string]string // Egress -> status.egressIP ("" waiting)
		released []netip.Addr
		// attach: interface -> AssignCount of the warm plan
		attach    map[string]int
		available int
		recheck   time.Duration
	}
	cases := []struct {
		name string
		egs  []v1.Egress
		pool func(*v1.ExternalIPPool)
		ci   func() *cloudInput
		want want
	}{{
		// The reproduction: warmIPTarget 1 on one Node, old held
		// 10.0.0.5 (published on Node a) with 10.0.0.9 warm; in this pass
		// old is gone and new is there.
		name: "old deleted and new created in one pass",
		egs:  []v1.Egress{planEgress("new", "", "", 5)},
		pool: func(p *v1.ExternalIPPool) {
			p.Spec.Cloud.WarmIPTarget = 1
			p.Status.Cloud = &v1.CloudPoolStatus{WarmIPs: []v1.WarmIP{{IP: "10.0.0.9", Node: "a"}}}
		},
		ci: func() *cloudInput {
			ci := cloudIn(iface("a", 1, 10, "10.0.0.5", "10.0.0.9"))
			ci.Owned = map[string]map[netip.Addr]bool{"c": {a5: true, a9: true}}
			ci.PrevAllocated = map[string]map[netip.Addr]bool{"c": {a5: true}}
			return ci
		},
		// new takes 10.0.0.9; 10.0.0.5 cools for 30 s, so the warm target
		// is met by one more address, and the plan looks again when the
		// cooldown ends.
		want: want{got: map[string]string{"new": "10.0.0.9"}, released: []netip.Addr{a5}, attach: map[string]int{"eni-a": 1}, available: 0, recheck: warm.Cooldown},
	}, {
		// After a restart the previous pass is unknown; an Egress status
		// that still names a Node for an address it no longer gets (its
		// spec.egressIP changed) releases that address just the same.
		name: "released through a status naming a Node",
		egs: func() []v1.Egress {
			moved := planEgress("moved", "10.0.0.5", "a", 1)
			moved.Spec.EgressIP = "10.0.0.7"
			return []v1.Egress{moved, planEgress("new", "", "", 5)}
		}(),
		pool: func(p *v1.ExternalIPPool) {
			p.Spec.Cloud.WarmIPTarget = 0
			p.Status.Cloud = &v1.CloudPoolStatus{WarmIPs: []v1.WarmIP{{IP: "10.0.0.9", Node: "a"}}}
		},
		ci:   func() *cloudInput { return cloudIn(iface("a", 1, 10, "10.0.0.5", "10.0.0.7", "10.0.0.9")) },
		want: want{got: map[string]string{"moved": "10.0.0.7", "new": "10.0.0.9"}, released: []netip.Addr{a5}, attach: map[string]int{}, available: 0, recheck: warm.Cooldown},
	}, {
		name: "a cooldown that ended makes the address available again",
		egs:  []v1.Egress{planEgress("new", "", "", 5)},
		pool: func(p *v1.ExternalIPPool) {
			p.Spec.Cloud.WarmIPTarget = 0
			p.Status.Cloud = &v1.CloudPoolStatus{WarmIPs: []v1.WarmIP{{IP: "10.0.0.5", Node: "a"}}}
		},
		ci: func() *cloudInput {
			ci := cloudIn(iface("a", 1, 10, "10.0.0.5"))
			ci.CoolUntil = map[netip.Addr]time.Time{a5: ci.Now.Add(-time.Second)}
			return ci
		},
		want: want{got: map[string]string{"new": "10.0.0.5"}, attach: map[string]int{}},
	}, {
		name: "a cooling address is not taken, one still cooling is not released again",
		egs:  []v1.Egress{planEgress("new", "", "", 5)},
		pool: func(p *v1.ExternalIPPool) {
			p.Spec.Cloud.WarmIPTarget = 0
			p.Status.Cloud = &v1.CloudPoolStatus{WarmIPs: []v1.WarmIP{{IP: "10.0.0.5", Node: "a"}}}
		},
		ci: func() *cloudInput {
			ci := cloudIn(iface("a", 1, 10, "10.0.0.5"))
			ci.CoolUntil = map[netip.Addr]time.Time{a5: ci.Now.Add(10 * time.Second)}
			return ci
		},
		want: want{got: map[string]string{"new": ""}, attach: map[string]int{"eni-a": 1}, recheck: 10 * time.Second},
	}, {
		// Five Egresses found pending in one pass on two Nodes, nothing
		// warm: one AssignCount per interface for all of them, spread by
		// load (b already holds one of the pool's addresses).
		name: "pending Egresses of one pass are topped up in one call per interface",
		egs: []v1.Egress{planEgress("held", "10.0.0.7", "b", 0),
			planEgress("p1", "", "", 1), planEgress("p2", "", "", 2), planEgress("p3", "", "", 3), planEgress("p4", "", "", 4), planEgress("p5", "", "", 5)},
		pool: func(p *v1.ExternalIPPool) { p.Spec.Cloud.WarmIPTarget = 0 },
		ci:   func() *cloudInput { return cloudIn(iface("a", 1, 10), iface("b", 2, 10, "10.0.0.7")) },
		want: want{got: map[string]string{"held": "10.0.0.7", "p1": "", "p2": "", "p3": "", "p4": "", "p5": ""}, attach: map[string]int{"eni-a": 3, "eni-b": 2}},
	}}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := planPool()
			tc.pool(&p)
			out := plan(passInput{Pools: []v1.ExternalIPPool{p}, Egresses: tc.egs,
				Nodes: []corev1.Node{planNode("a"), planNode("b")}, Agents: alive, Config: PassConfig{DefaultCapacity: 10}, Cloud: tc.ci()})
			for name, ip := range tc.want.got {
				st := out.Egresses[name].Status
				if st.EgressIP != ip {
					t.Errorf("%s got %q, want %q", name, st.EgressIP, ip)
				}
				if ip == "" {
					if c := meta.FindStatusCondition(st.Conditions, v1.ConditionIPAllocated); c == nil || c.Reason != v1.ReasonWaitingForWarmIP {
						t.Errorf("%s waiting: IPAllocated = %+v", name, c)
					}
				}
			}
			po := out.Cloud.Pools["c"]
			if len(po.Released) != len(tc.want.released) || (len(po.Released) > 0 && po.Released[0] != tc.want.released[0]) {
				t.Errorf("released %v, want %v", po.Released, tc.want.released)
			}
			got := map[string]int{}
			for _, op := range po.Plan.Attach {
				if _, dup := got[op.InterfaceID]; dup {
					t.Errorf("two attaches on %s: %+v", op.InterfaceID, po.Plan.Attach)
				}
				got[op.InterfaceID] = op.Count
			}
			if len(got) != len(tc.want.attach) {
				t.Errorf("warm attaches %+v, want %v", po.Plan.Attach, tc.want.attach)
			}
			for ifc, n := range tc.want.attach {
				if got[ifc] != n {
					t.Errorf("warm attach on %s: %d addresses, want %d (%+v)", ifc, got[ifc], n, po.Plan.Attach)
				}
			}
			if len(out.Cloud.Attach) != 0 && tc.name != "released through a status naming a Node" {
				t.Errorf("named attaches %+v", out.Cloud.Attach)
			}
			if po.Plan.Available != tc.want.available {
				t.Errorf("available %d, want %d", po.Plan.Available, tc.want.available)
			}
			if po.Plan.Recheck != tc.want.recheck {
				t.Errorf("recheck %v, want %v", po.Plan.Recheck, tc.want.recheck)
			}
			// The cooldown the CloudActuator records for a released address is
			// warm.Cooldown from the pass's time.
			c := NewCloudActuator(nil, CloudConfig{Provider: nil})
			c.remember(out.Cloud, tc.ci().Now)
			for _, ip := range tc.want.released {
				if until := c.cool[ip]; until != tc.ci().Now.Add(warm.Cooldown) {
					t.Errorf("%s cools until %v, want %v", ip, until, tc.ci().Now.Add(warm.Cooldown))
				}
			}
		})
	}
}
