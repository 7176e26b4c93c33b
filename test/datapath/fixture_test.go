package datapath_test

import (
	"context"
	"net/netip"
	"sync"
	"testing"

	"github.com/egressip/egressip/internal/agent/datapath"
	dp "github.com/egressip/egressip/test/datapath"
)

// spec is an Egress as the tests describe it.
type spec struct {
	name    string
	ip      netip.Addr // invalid: none allocated
	node    *dp.Node   // nil: no egress Node
	policy  datapath.FailurePolicy
	members []*dp.Pod
	// assigning: no Node yet because the controller has not assigned
	// the Egress for the first time (datapath.Egress.Assigning).
	assigning bool
	// v6 gives the family when ip is invalid (the pool's family).
	v6 bool
}

// fixture is a harness cluster with a Datapath on every Node.
type fixture struct {
	t     *testing.T
	c     *dp.Cluster
	dps   map[*dp.Node]*datapath.Datapath
	bound map[netip.Addr]*dp.Node
	// stopQueue stops a Node's reject-queue reader (as an agent exit would).
	stopQueue map[*dp.Node]func()
	// uids are the Pod UIDs stateFor reports (State.Pods) where a test
	// changed them (another Pod given the same IP); the default is the
	// Pod's namespace name.
	uids map[*dp.Pod]string
	// cfg is the datapath configuration open uses (Uplink is set there).
	cfg datapath.Config
	// noPeers leaves State.Peers empty (no Pod CIDRs of other Nodes).
	noPeers bool
	// splits, when set, gives a Node's State.Splits (per-destination
	// classification; destinations_test.go).
	splits func(n *dp.Node, specs []spec) []datapath.Split
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixtureWith(t, datapath.Config{})
}

// newFixtureWith is newFixture with a datapath configuration for every
// Node (Uplink is filled in).
func newFixtureWith(t *testing.T, cfg datapath.Config) *fixture {
	t.Helper()
	c := dp.New(t, dp.Options{})
	f := &fixture{cfg: cfg, t: t, c: c, dps: map[*dp.Node]*datapath.Datapath{}, bound: map[netip.Addr]*dp.Node{}, stopQueue: map[*dp.Node]func(){}, uids: map[*dp.Pod]string{}}
	for _, n := range c.Nodes {
		f.open(n)
	}
	return f
}

// open (re)creates the Datapath of a Node, as an agent start would.
func (f *fixture) open(n *dp.Node) {
	f.t.Helper()
	if old := f.dps[n]; old != nil {
		f.stopQueue[n]()
		_ = old.Close()
	}
	cfg := f.cfg
	cfg.Uplink = n.Uplink
	d, err := datapath.New(cfg, n.Handle)
	if err != nil {
		f.t.Fatalf("datapath.New on %s: %v", n.Name, err)
	}
	f.dps[n] = d
	// The reject-queue reader, as the agent runs it beside Apply.
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := d.ServeRejectQueue(ctx); err != nil {
			f.t.Errorf("reject queue on %s: %v", n.Name, err)
		}
	}()
	var once sync.Once
	f.stopQueue[n] = func() { once.Do(func() { cancel(); <-done }) }
	f.t.Cleanup(func() { f.stopQueue[n](); _ = d.Close() })
}

// stateFor computes a Node's State from the specs, as the agent would:
// the egress Node gets RoleEgress with its local and remote members, a
// Node with members gets RoleSource (RoleFailed when no Node holds it).
func (f *fixture) stateFor(n *dp.Node, specs []spec) datapath.State {
	st := datapath.State{NodeIPs: f.c.NodeIPs(), ClusterCIDRs: f.c.ClusterCIDRs()}
	for _, m := range f.c.Nodes {
		if m != n && !f.noPeers {
			st.Peers = append(st.Peers, datapath.Peer{IP: m.IPv4, PodCIDRs: []netip.Prefix{m.PodV4, m.PodV6}},
				datapath.Peer{IP: m.IPv6, PodCIDRs: []netip.Prefix{m.PodV4, m.PodV6}})
		}
	}
	for _, p := range n.Pods {
		uid := f.uids[p]
		if uid == "" {
			uid = p.Name
		}
		st.Pods = append(st.Pods, datapath.LocalPod{IP: p.IPv4, UID: uid}, datapath.LocalPod{IP: p.IPv6, UID: uid})
	}
	for _, s := range specs {
		v6 := s.v6 || (s.ip.IsValid() && s.ip.Is6())
		e := datapath.Egress{Name: s.name, IP: s.ip, FailurePolicy: s.policy}
		if e.FailurePolicy == "" {
			e.FailurePolicy = datapath.FailurePolicyFail
		}
		for _, p := range s.members {
			if p.Node == n {
				e.Local = append(e.Local, p.IP(v6))
			} else if s.node == n {
				e.Remote = append(e.Remote, datapath.Member{IP: p.IP(v6), HostIP: p.Node.NodeIP(v6)})
			}
		}
		switch {
		case s.node == n:
			e.Role = datapath.RoleEgress
		case len(e.Local) == 0:
			e.Role = datapath.RoleNone
		case s.node == nil || !s.ip.IsValid():
			e.Role = datapath.RoleFailed
			e.Assigning = s.assigning
		default:
			e.Role = datapath.RoleSource
		}
		st.Egresses = append(st.Egresses, e)
	}
	if f.splits != nil {
		st.Splits = f.splits(n, specs)
	}
	return st
}

// apply programs every Node and moves the egress IPs to their Nodes.
func (f *fixture) apply(specs []spec) {
	f.t.Helper()
	want := map[netip.Addr]*dp.Node{}
	for _, s := range specs {
		if s.ip.IsValid() && s.node != nil {
			want[s.ip] = s.node
		}
	}
	f.program(want, func(n *dp.Node) datapath.State { return f.stateFor(n, specs) })
}

// program moves the egress IPs to the Nodes want names, release before
// acquire as a planned move does: it unbinds every IP bound elsewhere,
// applies stateFor on every Node, then binds each IP on its Node and
// points the neighbours at it.
func (f *fixture) program(want map[netip.Addr]*dp.Node, stateFor func(*dp.Node) datapath.State) {
	f.t.Helper()
	for ip, n := range f.bound {
		if want[ip] != n {
			if err := f.c.UnbindEIP(n, ip); err != nil {
				f.t.Fatal(err)
			}
			delete(f.bound, ip)
		}
	}
	for _, n := range f.c.Nodes {
		if err := f.dps[n].Apply(context.Background(), stateFor(n)); err != nil {
			f.t.Fatalf("Apply on %s: %v", n.Name, err)
		}
	}
	for ip, n := range want {
		if f.bound[ip] == n {
			continue
		}
		if err := f.c.BindEIP(n, ip); err != nil {
			f.t.Fatal(err)
		}
		if err := f.c.PointNeighbours(n, ip); err != nil {
			f.t.Fatal(err)
		}
		f.bound[ip] = n
	}
}

// applyNode programs one Node only.
func (f *fixture) applyNode(n *dp.Node, specs []spec) {
	f.t.Helper()
	if err := f.dps[n].Apply(context.Background(), f.stateFor(n, specs)); err != nil {
		f.t.Fatalf("Apply on %s: %v", n.Name, err)
	}
}

// fam is one IP family's addresses in table-driven tests.
type fam struct {
	name string
	v6   bool
	ext  netip.Addr
	eip  netip.Addr
	eip2 netip.Addr
	svc  netip.Addr
	// tunnel MTU and the MSS it allows (MTU - IP - TCP headers)
	mtu, mss int
}

var families = []fam{
	{
		name: "ipv4", ext: dp.ExtV4, svc: dp.ServiceV4,
		eip: netip.MustParseAddr("192.0.2.100"), eip2: netip.MustParseAddr("192.0.2.101"),
		mtu: 1500 - 36, mss: 1500 - 36 - 40,
	},
	{
		name: "ipv6", v6: true, ext: dp.ExtV6, svc: dp.ServiceV6,
		eip: netip.MustParseAddr("2001:db8::100"), eip2: netip.MustParseAddr("2001:db8::101"),
		mtu: 1500 - 56, mss: 1500 - 56 - 60,
	},
}
