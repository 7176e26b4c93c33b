package datapath_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent/datapath"
	"github.com/egressip/egressip/internal/agent/datapathsync"
	dp "github.com/egressip/egressip/test/datapath"
)

// mip is one IP of a multi-IP Egress as the tests describe it: its holder
// and readiness (status.ips[i].node, .ready); its zone is its holder's.
type mip struct {
	ip    netip.Addr
	node  *dp.Node
	ready bool
}

// multiSpec is an Egress with several IPs, and the zone of every Node
// (topology.kubernetes.io/zone; "" for none).
type multiSpec struct {
	name    string
	ips     []mip
	members []*dp.Pod
	zones   map[*dp.Node]string
	policy  datapath.FailurePolicy // "" is Fail
}

// egress is the Egress object whose status.ips the controller would write
// for s.
func (s multiSpec) egress() *v1alpha1.Egress {
	e := &v1alpha1.Egress{ObjectMeta: metav1.ObjectMeta{Name: s.name}, Spec: v1alpha1.EgressSpec{IPs: []v1alpha1.EgressIPSource{{Pool: "p"}}}}
	for _, x := range s.ips {
		st := v1alpha1.EgressIPStatus{IP: x.ip.String(), Pool: "p", Ready: x.ready}
		if x.node != nil {
			st.Node, st.Zone = x.node.Name, s.zones[x.node]
		}
		e.Status.IPs = append(e.Status.IPs, st)
	}
	return e
}

// multiStateFor is n's State for s as the agent's computeState gives it:
// the IPs through datapathsync.MultiIPs (held, usable with the zone
// preference), RoleEgress where n holds one (with the other Nodes' members
// as remote), RoleSource while one is usable, RoleFailed otherwise.
func (f *fixture) multiStateFor(n *dp.Node, s multiSpec) datapath.State {
	st := f.stateFor(n, nil)
	v6 := s.ips[0].ip.Is6()
	e := datapath.Egress{Name: s.name, FailurePolicy: datapath.FailurePolicyFail, IPs: datapathsync.MultiIPs(s.egress(), n.Name, s.zones[n])}
	if s.policy != "" {
		e.FailurePolicy = s.policy
	}
	held := false
	for _, x := range e.IPs {
		if x.Held {
			e.IP, held = x.IP, true
		}
	}
	for _, p := range s.members {
		if p.Node == n {
			e.Local = append(e.Local, p.IP(v6))
		} else if held {
			e.Remote = append(e.Remote, datapath.Member{IP: p.IP(v6), HostIP: p.Node.NodeIP(v6)})
		}
	}
	switch {
	case held:
		e.Role = datapath.RoleEgress
	case len(e.Local) == 0:
		return st
	case slices.ContainsFunc(e.IPs, func(x datapath.EgressIP) bool { return x.Usable }):
		e.Role = datapath.RoleSource
	default:
		e.Role = datapath.RoleFailed
	}
	st.Egresses = append(st.Egresses, e)
	return st
}

// applyMulti programs every Node for s and binds each IP on its holder
// (release before acquire).
func (f *fixture) applyMulti(s multiSpec) {
	f.t.Helper()
	want := map[netip.Addr]*dp.Node{}
	for _, x := range s.ips {
		if x.node != nil {
			want[x.ip] = x.node
		}
	}
	f.program(want, func(n *dp.Node) datapath.State { return f.multiStateFor(n, s) })
}

// session is one long-lived TCP connection to the external server and
// the source the server saw when it opened.
type session struct {
	c   net.Conn
	r   *bufio.Reader
	src netip.Addr
	pod *dp.Pod
}

// openSessions opens n connections from each of pods (round robin) with
// WHOECHO and returns them with their sources.
func openSessions(ctx context.Context, t *testing.T, pods []*dp.Pod, dst netip.Addr, n int) []*session {
	t.Helper()
	var out []*session
	for i := range n {
		p := pods[i%len(pods)]
		c, err := dp.Dial(ctx, &p.NS, "tcp", dst, dp.ServerPort)
		if err != nil {
			t.Fatalf("connection %d from %s: %v", i, p.Name, err)
		}
		t.Cleanup(func() { _ = c.Close() })
		if _, err := io.WriteString(c, "WHOECHO\n"); err != nil {
			t.Fatal(err)
		}
		r := bufio.NewReader(c)
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("connection %d from %s: source: %v", i, p.Name, err)
		}
		src, err := netip.ParseAddr(strings.TrimSpace(line))
		if err != nil {
			t.Fatalf("connection %d: source %q: %v", i, line, err)
		}
		out = append(out, &session{c: c, r: r, src: src, pod: p})
	}
	return out
}

// countBySource counts sessions by source.
func countBySource(ss []*session) map[netip.Addr]int {
	m := map[netip.Addr]int{}
	for _, s := range ss {
		m[s.src]++
	}
	return m
}

// echoAll checks that every session still carries data (no reset, no
// other source: the server's socket is bound to the source it saw).
func echoAll(t *testing.T, ss []*session, msg string) {
	t.Helper()
	for i, s := range ss {
		if err := echo(s.c, s.r, fmt.Sprintf("%s-%d", msg, i)); err != nil {
			t.Errorf("connection %d from %s via %s: %v", i, s.pod.Name, s.src, err)
		}
	}
}

// multiFams are the three IPs of TestMultiIP's Egress per family.
var multiFams = []struct {
	fam
	ips [3]netip.Addr
}{
	{families[0], [3]netip.Addr{netip.MustParseAddr("192.0.2.201"), netip.MustParseAddr("192.0.2.202"), netip.MustParseAddr("192.0.2.203")}},
	{families[1], [3]netip.Addr{netip.MustParseAddr("2001:db8::201"), netip.MustParseAddr("2001:db8::202"), netip.MustParseAddr("2001:db8::203")}},
}

// TestMultiIPSpreadAndNotReady: an Egress with 3 IPs held by the 3 Nodes,
// 3 selected Pods behind each Node. 36 connections leave with exactly the
// 3 IPs, each keeping the source it opened with (echoes work to the end);
// after one IP is marked not Ready, every source Node rewrites only the
// Egress's pick map, the next 30 connections use only the other two, and
// the connections open on those two see no reset.
func TestMultiIPSpreadAndNotReady(t *testing.T) {
	for _, fm := range multiFams {
		t.Run(fm.name, func(t *testing.T) {
			f := newMultiFixture(t)
			n := f.c.Nodes
			var pods []*dp.Pod
			for _, node := range n {
				pods = append(pods, node.Pods...)
			}
			s := multiSpec{name: "multi", members: pods, ips: []mip{
				{fm.ips[0], n[0], true}, {fm.ips[1], n[1], true}, {fm.ips[2], n[2], true}}}
			f.applyMulti(s)
			ctx := ctxT(t, 120*time.Second)

			before := openSessions(ctx, t, pods, fm.ext, 36)
			got := countBySource(before)
			t.Logf("%s: 36 connections by source: %v", fm.name, got)
			if len(got) != 3 || got[fm.ips[0]] == 0 || got[fm.ips[1]] == 0 || got[fm.ips[2]] == 0 {
				t.Fatalf("sources %v, want exactly the 3 egress IPs", got)
			}
			echoAll(t, before, "before")

			// The second IP is not Ready any more (its holder still holds it).
			s.ips[1].ready = false
			f.applyMulti(s)
			for _, node := range n {
				if w := f.dps[node].LastWrite(); w.Table || w.Maps != 1 {
					t.Errorf("%s: the not-Ready IP made it write %+v, want one pick map in place", node.Name, w)
				}
			}
			after := openSessions(ctx, t, pods, fm.ext, 30)
			got = countBySource(after)
			t.Logf("%s: 30 connections after %s is not Ready: %v", fm.name, fm.ips[1], got)
			if len(got) != 2 || got[fm.ips[0]] == 0 || got[fm.ips[2]] == 0 {
				t.Errorf("sources %v, want only %s and %s", got, fm.ips[0], fm.ips[2])
			}
			var others []*session
			for _, ss := range before {
				if ss.src != fm.ips[1] {
					others = append(others, ss)
				}
			}
			echoAll(t, others, "others")
			echoAll(t, after, "after")
		})
	}
}

// TestMultiIPZone: Nodes 1 and 3 in zone a, Node 2 in zone b; the Egress
// has one IP held in each zone (Node 1, Node 2). Pods behind Node 3 leave
// with the zone-a IP (20 of 20 connections) while it is Ready, with the
// zone-b IP while it is not, and with the zone-a IP again once it is
// Ready again, the connections opened meanwhile staying on the zone-b IP.
func TestMultiIPZone(t *testing.T) {
	for _, fm := range multiFams {
		t.Run(fm.name, func(t *testing.T) {
			f := newMultiFixture(t)
			n := f.c.Nodes
			src := n[2].Pods
			s := multiSpec{name: "zonal", members: src,
				zones: map[*dp.Node]string{n[0]: "a", n[1]: "b", n[2]: "a"},
				ips:   []mip{{fm.ips[0], n[0], true}, {fm.ips[1], n[1], true}}}
			f.applyMulti(s)
			ctx := ctxT(t, 120*time.Second)
			want := func(ss []*session, ip netip.Addr, when string) {
				t.Helper()
				got := countBySource(ss)
				t.Logf("%s %s: %v", fm.name, when, got)
				if got[ip] != len(ss) {
					t.Errorf("%s: sources %v, want %d of %d on %s", when, got, len(ss), len(ss), ip)
				}
			}
			inZone := openSessions(ctx, t, src, fm.ext, 20)
			want(inZone, fm.ips[0], "zone-a IP Ready")

			s.ips[0].ready = false // no eligible zone-a Node
			f.applyMulti(s)
			fallback := openSessions(ctx, t, src, fm.ext, 20)
			want(fallback, fm.ips[1], "zone-a IP not Ready")

			s.ips[0].ready = true
			f.applyMulti(s)
			if w := f.dps[n[2]].LastWrite(); w.Table || w.Maps != 1 {
				t.Errorf("the zone-a IP's return made Node 3 write %+v, want one pick map in place", w)
			}
			back := openSessions(ctx, t, src, fm.ext, 20)
			want(back, fm.ips[0], "zone-a IP Ready again")
			echoAll(t, fallback, "stay") // they keep the zone-b IP
			echoAll(t, inZone, "zone-a")
		})
	}
}

// TestMultiIPNoneReadyFailurePolicy: with no IP of the Egress Ready, its
// failurePolicy applies as for a single-IP Egress without a Node: Fail
// rejects a member's new connection (EHOSTUNREACH), Ignore lets it leave
// with its Node's IP; once an IP is Ready again, new connections use it.
func TestMultiIPNoneReadyFailurePolicy(t *testing.T) {
	fm := multiFams[0]
	f := newMultiFixture(t)
	n := f.c.Nodes
	failPod, ignPod := n[2].Pods[0], n[2].Pods[1]
	fail := multiSpec{name: "mfail", members: []*dp.Pod{failPod}, ips: []mip{{fm.ips[0], n[0], false}, {fm.ips[1], n[1], false}}}
	ign := multiSpec{name: "mign", members: []*dp.Pod{ignPod}, policy: datapath.FailurePolicyIgnore,
		ips: []mip{{netip.MustParseAddr("192.0.2.211"), n[0], false}}}
	apply := func() {
		for _, nd := range n {
			st := f.multiStateFor(nd, fail)
			st.Egresses = append(st.Egresses, f.multiStateFor(nd, ign).Egresses...)
			if err := f.dps[nd].Apply(context.Background(), st); err != nil {
				t.Fatalf("Apply on %s: %v", nd.Name, err)
			}
		}
	}
	for _, x := range []mip{fail.ips[0], fail.ips[1], ign.ips[0]} {
		if err := f.c.BindEIP(x.node, x.ip); err != nil {
			t.Fatal(err)
		}
		if err := f.c.PointNeighbours(x.node, x.ip); err != nil {
			t.Fatal(err)
		}
	}
	apply()
	ctx := ctxT(t, 60*time.Second)
	// Warm the Pod's gateway neighbour entry in-cluster first (see
	// TestFailurePolicy).
	peer, err := dp.StartServer(&n[0].Pods[0].NS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(peer.Close)
	if _, err := dp.TCPWho(ctx, &failPod.NS, n[0].Pods[0].IPv4); err != nil {
		t.Fatalf("in-cluster warm-up: %v", err)
	}
	if _, err := dp.TCPWho(ctx, &failPod.NS, fm.ext); !errors.Is(err, unix.EHOSTUNREACH) {
		t.Errorf("Fail with no IP Ready: connect error %v, want EHOSTUNREACH", err)
	}
	if got, err := dp.TCPWho(ctx, &ignPod.NS, fm.ext); err != nil || got != n[2].IPv4 {
		t.Errorf("Ignore with no IP Ready: server saw %v (err %v), want the Node IP %s", got, err, n[2].IPv4)
	}
	fail.ips[1].ready = true
	apply()
	ss := openSessions(ctx, t, []*dp.Pod{failPod}, fm.ext, 5)
	if got := countBySource(ss); got[fm.ips[1]] != 5 {
		t.Errorf("one IP Ready again: sources %v, want 5 of 5 on %s", got, fm.ips[1])
	}
}

// newMultiFixture is newFixture with 3 Pods behind each Node.
func newMultiFixture(t *testing.T) *fixture {
	t.Helper()
	c := dp.New(t, dp.Options{PodsPerNode: 3})
	f := &fixture{t: t, c: c, dps: map[*dp.Node]*datapath.Datapath{}, bound: map[netip.Addr]*dp.Node{}, stopQueue: map[*dp.Node]func(){}, uids: map[*dp.Pod]string{}}
	for _, n := range c.Nodes {
		f.open(n)
	}
	return f
}
