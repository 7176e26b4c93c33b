package datapath_test

import (
	"context"
	"testing"
	"time"

	dp "github.com/egressip/egressip/test/datapath"
)

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestSources: a selected Pod on the egress Node and one on another Node
// reach the external server from the egress IP; an unselected Pod from its
// Node IP; in-cluster traffic never enters the tunnel; return traffic of
// the remote member comes back through it.
func TestSources(t *testing.T) {
	for _, fm := range families {
		t.Run(fm.name, func(t *testing.T) {
			f := newFixture(t)
			n1, n2, n3 := f.c.Nodes[0], f.c.Nodes[1], f.c.Nodes[2]
			remote, local, unselected := n1.Pods[0], n2.Pods[0], n1.Pods[1]
			f.apply([]spec{{name: "e1", ip: fm.eip, node: n2, members: []*dp.Pod{remote, local}}})
			ctx := ctxT(t, 30*time.Second)

			for _, tc := range []struct {
				pod  *dp.Pod
				want string
			}{
				{remote, fm.eip.String()},
				{local, fm.eip.String()},
				{unselected, n1.NodeIP(fm.v6).String()},
			} {
				got, err := dp.TCPWho(ctx, &tc.pod.NS, fm.ext)
				if err != nil || got.String() != tc.want {
					t.Errorf("TCP from %s: server saw %v (err %v), want %s", tc.pod.Name, got, err, tc.want)
				}
				got, err = dp.UDPWho(ctx, &tc.pod.NS, fm.ext)
				if err != nil || got.String() != tc.want {
					t.Errorf("UDP from %s: server saw %v (err %v), want %s", tc.pod.Name, got, err, tc.want)
				}
			}
			// Symmetric return: the remote member's replies left n2 and
			// entered n1 through the tunnel.
			if _, tx, _ := dp.LinkStats(&n2.NS, "egx"); tx == 0 {
				t.Errorf("n2 sent nothing into the tunnel: return traffic not symmetric")
			}
			if rx, _, _ := dp.LinkStats(&n1.NS, "egx"); rx == 0 {
				t.Errorf("n1 received nothing from the tunnel: return traffic not symmetric")
			}

			// In-cluster: Pod->Pod (both members, both directions of
			// Nodes) and Pod->Service never enter the tunnel.
			target := n3.Pods[0]
			srv, err := dp.StartServer(&target.NS)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(srv.Close)
			svcSrv, err := dp.StartServer(&n1.Pods[1].NS) // the ClusterIP's backend
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(svcSrv.Close)
			before := map[string]uint64{}
			for _, n := range f.c.Nodes {
				_, tx, _ := dp.LinkStats(&n.NS, "egx")
				before[n.Name] = tx
			}
			for _, p := range []*dp.Pod{remote, local} {
				got, err := dp.TCPWho(ctx, &p.NS, target.IP(fm.v6))
				if err != nil || got != p.IP(fm.v6) {
					t.Errorf("Pod->Pod from %s: peer saw %v (err %v), want the Pod IP %s", p.Name, got, err, p.IP(fm.v6))
				}
				got, err = dp.TCPWhoPort(ctx, &p.NS, fm.svc, 80)
				if err != nil || got != p.IP(fm.v6) {
					t.Errorf("Pod->Service from %s: backend saw %v (err %v), want the Pod IP %s", p.Name, got, err, p.IP(fm.v6))
				}
				// Pod->Node: nothing listens there; only the path counts.
				_, _ = dp.TCPWho(ctx, &p.NS, n3.NodeIP(fm.v6))
			}
			for _, n := range f.c.Nodes {
				if _, tx, _ := dp.LinkStats(&n.NS, "egx"); tx != before[n.Name] {
					t.Errorf("in-cluster traffic entered the tunnel on %s: %d packets", n.Name, tx-before[n.Name])
				}
			}
		})
	}
}
