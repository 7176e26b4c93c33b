package controller

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/report"
	"github.com/egressip/egressip/internal/testenv"
	"github.com/egressip/egressip/internal/testutil/poll"
)

var env *testenv.Env

func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	testenv.Main(m, &env)
}

// fakeAgent stands in for egressip-agent on one Node: it serves a real
// report on the Node's InternalIP (a loopback address) and "binds" every IP
// whose Egress status names its Node, as the agent does through its field
// selector. Stop makes it stop answering, like a crashed Node.
type fakeAgent struct {
	node string
	addr netip.Addr
	srv  *http.Server

	mu       sync.Mutex
	bound    map[netip.Addr]bool
	stopped  bool
	datapath *report.DatapathStatus  // served as the report's finding
	owner    *report.OwnershipStatus // served as the report's ownership status
	refused  []report.RefusedEgress  // served as the report's refused Egresses
	// refuse lists IPs the agent reports refused (with the message)
	// instead of bound, as the real agent does for an address it will not
	// bind.
	refuse map[netip.Addr]string
	kernel *report.KernelStatus // served as the report's kernel finding
	fence  *report.FenceStatus  // served as the report's fence status
	vlans  *report.VLANStatus   // served as the report's VLAN status
	// stale: the agent has lost the API server: it keeps what it has
	// bound and syncs nothing, but still answers polls.
	stale bool
	// obey: the agent honours the polls' release instructions, as the
	// real one does; polls keeps the instructions received.
	obey  bool
	polls [][]report.Release
	// conflicts and macs are served as the report's duplicate-IP
	// conflicts and the Node's MACs.
	conflicts []report.ConflictIP
	macs      []string
	// nics is served as the report's NIC MACs (report.Report.NICs).
	nics []string
	// acquires: the agent takes the polls' acquire instructions, as the
	// real one does (report.Acquire): it says so in its report and binds
	// each acquired IP while a poll carried it in the last 1.5 s, unless
	// lazy (it then reports taking them but binds nothing for them).
	// acquired holds when a poll last carried each IP; acquirePolls
	// counts the polls that carried any.
	acquires, lazy bool
	acquired       map[netip.Addr]time.Time
	acquirePolls   int
	// multi: the test has Egresses with spec.ips, whose IPs other than
	// the first are not found by the status.egressNode field selector, so
	// sync lists every Egress.
	multi bool
}

func (a *fakeAgent) isMulti() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.multi
}

// setNICs sets the NIC MACs the agent serves (nil: none).
func (a *fakeAgent) setNICs(nics []string) {
	a.mu.Lock()
	a.nics = slices.Sorted(slices.Values(nics))
	a.mu.Unlock()
}

// onPoll serves a poll: it keeps its release instructions and, when obey
// is set, releases what they name.
func (a *fakeAgent) onPoll(p report.Poll) report.Report {
	a.mu.Lock()
	if len(p.Releases) > 0 {
		a.polls = append(a.polls, p.Releases)
	}
	if a.obey {
		for _, r := range p.Releases {
			delete(a.bound, r.IP)
		}
	}
	if a.acquires && len(p.Acquires) > 0 {
		a.acquirePolls++
		if a.acquired == nil {
			a.acquired = map[netip.Addr]time.Time{}
		}
		for _, ac := range p.Acquires {
			a.acquired[ac.IP] = time.Now()
			if !a.lazy && !a.stale {
				a.bound[ac.IP] = true
			}
		}
	}
	a.mu.Unlock()
	return a.current()
}

// setStale makes the agent lose (true) or regain its API server; obey
// says whether it honours release instructions meanwhile.
func (a *fakeAgent) setStale(stale, obey bool) {
	a.mu.Lock()
	a.stale, a.obey = stale, obey
	a.mu.Unlock()
}

// releases returns the release instructions received so far.
func (a *fakeAgent) releases() [][]report.Release {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([][]report.Release(nil), a.polls...)
}

// setConflicts sets the conflicts and Node MACs the agent serves.
func (a *fakeAgent) setConflicts(cs []report.ConflictIP, macs []string) {
	a.mu.Lock()
	a.conflicts, a.macs = cs, macs
	a.mu.Unlock()
}

// setRefused makes the agent refuse ip with msg ("" stops refusing).
func (a *fakeAgent) setRefused(ip netip.Addr, msg string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.refuse == nil {
		a.refuse = map[netip.Addr]string{}
	}
	if msg == "" {
		delete(a.refuse, ip)
		return
	}
	a.refuse[ip] = msg
}

// setOwnership sets the ownership status the agent serves (nil: none).
func (a *fakeAgent) setOwnership(st *report.OwnershipStatus) {
	a.mu.Lock()
	a.owner = st
	a.mu.Unlock()
}

// setRefusedEgresses sets the refused Egresses the agent serves (nil: none).
func (a *fakeAgent) setRefusedEgresses(rs []report.RefusedEgress) {
	a.mu.Lock()
	a.refused = rs
	a.mu.Unlock()
}

// setKernel sets the kernel finding the agent serves (nil: none).
func (a *fakeAgent) setKernel(st *report.KernelStatus) {
	a.mu.Lock()
	a.kernel = st
	a.mu.Unlock()
}

// setVLANs sets the VLAN status the agent serves (nil: none).
func (a *fakeAgent) setVLANs(st *report.VLANStatus) {
	a.mu.Lock()
	a.vlans = st
	a.mu.Unlock()
}

// setFence sets the fence status the agent serves (nil: none).
func (a *fakeAgent) setFence(st *report.FenceStatus) {
	a.mu.Lock()
	a.fence = st
	a.mu.Unlock()
}

// setDatapath sets the datapath finding the agent serves (nil: none).
func (a *fakeAgent) setDatapath(st *report.DatapathStatus) {
	a.mu.Lock()
	a.datapath = st
	a.mu.Unlock()
}

func (a *fakeAgent) current() report.Report {
	a.mu.Lock()
	defer a.mu.Unlock()
	r := report.Report{Node: a.node, Instance: "test", Datapath: a.datapath, Ownership: a.owner, RefusedEgresses: a.refused, Kernel: a.kernel,
		Conflicts: a.conflicts, MACs: a.macs, Fence: a.fence, NICs: a.nics, VLANs: a.vlans, Acquires: a.acquires}
	for ip := range a.bound {
		if msg, ok := a.refuse[ip]; ok {
			r.Refused = append(r.Refused, report.RefusedIP{IP: ip, Message: msg})
			continue
		}
		r.Bound = append(r.Bound, report.BoundIP{IP: ip, Interface: "eth0", Announced: true})
	}
	r.Sort()
	return r
}

// sync binds what the API server assigns to this Node, like the agent:
// status.egressIP where status.egressNode is this Node and, once a test
// has multi-IP Egresses (multi), every status.ips entry of this Node.
func (a *fakeAgent) sync(ctx context.Context, c client.Client) {
	var list v1.EgressList
	var opts []client.ListOption
	if !a.isMulti() {
		opts = append(opts, client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector(v1.EgressNodeField, a.node)})
	}
	if err := c.List(ctx, &list, opts...); err != nil {
		return
	}
	want := map[netip.Addr]bool{}
	for _, e := range list.Items {
		if ip, err := netip.ParseAddr(e.Status.EgressIP); err == nil && e.Status.EgressNode == a.node {
			want[ip] = true
		}
		for _, s := range e.Status.IPs {
			if ip, err := netip.ParseAddr(s.IP); err == nil && s.Node == a.node {
				want[ip] = true
			}
		}
	}
	a.mu.Lock()
	if a.stale {
		a.mu.Unlock()
		return
	}
	if a.owner != nil && !a.owner.Healthy {
		// As the real agent: nothing new is bound while ownership is
		// unknown, and nothing bound is removed.
		for ip := range want {
			if !a.bound[ip] {
				delete(want, ip)
			}
		}
		for ip := range a.bound {
			want[ip] = true
		}
	}
	if !a.lazy {
		for ip, at := range a.acquired {
			if time.Since(at) < 1500*time.Millisecond {
				want[ip] = true
			} else {
				delete(a.acquired, ip)
			}
		}
	}
	a.bound = want
	a.mu.Unlock()
}

func (a *fakeAgent) Bound(ip string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.bound[netip.MustParseAddr(ip)]
}

// cluster is one test's Nodes, agents, pool and a running controller.
type cluster struct {
	t      *testing.T
	ctx    context.Context
	env    *testenv.Env
	c      client.Client
	port   int
	agents map[string]*fakeAgent
	stop   context.CancelFunc
	done   chan struct{}
	opts   Options
	// metricsAddr, when set before startController, serves /metrics there.
	metricsAddr string
}

var nextLoopback = 10

// newCluster creates nodes n1..nN (Ready, labelled egress=true, InternalIP
// on 127.0.0.x with a fake agent each) and starts a controller manager.
func newCluster(t *testing.T, prefix string, nodes int, capacity int) *cluster {
	t.Helper()
	cl := newNodes(t, env, prefix, nodes, capacity)
	cl.startController()
	return cl
}

// newNodes is newCluster on control plane e, without a controller.
func newNodes(t *testing.T, e *testenv.Env, prefix string, nodes int, capacity int) *cluster {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	port := freePort(t)
	cl := &cluster{t: t, ctx: ctx, env: e, c: e.Client, port: port, agents: map[string]*fakeAgent{}}
	for i := 1; i <= nodes; i++ {
		cl.addNode(fmt.Sprintf("%s-n%d", prefix, i))
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			for _, a := range cl.agents {
				if !a.isStopped() {
					a.sync(ctx, e.Client)
				}
			}
		}
	}()
	cl.opts = Options{
		Pass:     PassConfig{DefaultCapacity: capacity},
		Liveness: LivenessConfig{Interval: 200 * time.Millisecond, Timeout: 200 * time.Millisecond, DeadAfter: 600 * time.Millisecond, FailureThreshold: 3, Port: port},
	}
	return cl
}

func (a *fakeAgent) isStopped() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.stopped
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}

func (cl *cluster) addNode(name string) {
	t := cl.t
	t.Helper()
	nextLoopback++
	addr := netip.AddrFrom4([4]byte{127, 0, 0, byte(nextLoopback)})
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"egress": "true", corev1.LabelOSStable: "linux"}}}
	if err := cl.c.Create(cl.ctx, n); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cl.c.Delete(context.Background(), n) })
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now()}}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: addr.String()}}
	if err := cl.c.Status().Update(cl.ctx, n); err != nil {
		t.Fatal(err)
	}
	a := &fakeAgent{node: name, addr: addr, bound: map[netip.Addr]bool{}}
	l, err := net.Listen("tcp", net.JoinHostPort(addr.String(), strconv.Itoa(cl.port)))
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: report.PollHandler(a.onPoll), ReadHeaderTimeout: time.Second}
	a.srv = srv
	go func() { _ = srv.Serve(l) }() // srv, not a.srv: a test may replace a.srv (TestAgentCertificateRotation)
	t.Cleanup(func() { _ = a.srv.Close() })
	cl.agents[name] = a
}

// crash stops node's agent from answering (as a crashed Node would).
func (cl *cluster) crash(node string) {
	a := cl.agents[node]
	a.mu.Lock()
	a.stopped = true
	a.mu.Unlock()
	_ = a.srv.Close()
}

func (cl *cluster) startController() {
	t := cl.t
	t.Helper()
	mgr, err := ctrl.NewManager(cl.env.Config, ctrl.Options{
		Scheme:                 cl.env.Scheme,
		Cache:                  CacheOptions(),
		Metrics:                metricsserver.Options{BindAddress: cmpOr(cl.metricsAddr, "0")},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: new(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := Setup(mgr, cl.opts); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(cl.ctx)
	cl.stop = cancel
	cl.done = make(chan struct{})
	go func() {
		defer close(cl.done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager: %v", err)
		}
	}()
	t.Cleanup(cl.stopController)
}

func (cl *cluster) stopController() {
	if cl.stop != nil {
		cl.stop()
		<-cl.done
		cl.stop = nil
	}
}

func (cl *cluster) pool(name string, mutate func(*v1.ExternalIPPool)) {
	cl.t.Helper()
	p := &v1.ExternalIPPool{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.ExternalIPPoolSpec{
		IPRanges:     []v1.IPRange{{CIDR: "192.0.2.0/28"}},
		NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"egress": "true"}},
	}}
	if mutate != nil {
		mutate(p)
	}
	if err := cl.c.Create(cl.ctx, p); err != nil {
		cl.t.Fatal(err)
	}
	cl.t.Cleanup(func() { _ = cl.c.Delete(context.Background(), p) })
}

func (cl *cluster) egress(name, pool, ip string) *v1.Egress {
	cl.t.Helper()
	e := &v1.Egress{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1.EgressSpec{
		AppliedTo:      v1.AppliedTo{PodSelector: &metav1.LabelSelector{}},
		ExternalIPPool: pool, EgressIP: ip,
	}}
	if err := cl.c.Create(cl.ctx, e); err != nil {
		cl.t.Fatal(err)
	}
	cl.t.Cleanup(func() { _ = cl.c.Delete(context.Background(), e) })
	return e
}

func (cl *cluster) get(name string) *v1.Egress {
	cl.t.Helper()
	var e v1.Egress
	if err := cl.c.Get(cl.ctx, client.ObjectKey{Name: name}, &e); err != nil {
		cl.t.Fatal(err)
	}
	return &e
}

// eventually waits up to 20 s (poll.Until) for cond, whose message says
// what it saw when it is not met yet.
func (cl *cluster) eventually(what string, cond func() (bool, string)) {
	cl.t.Helper()
	poll.Until(cl.t, 20*time.Second, what, func() error {
		if ok, msg := cond(); !ok {
			return errors.New(msg)
		}
		return nil
	})
}

func ready(e *v1.Egress) bool {
	return meta.IsStatusConditionTrue(e.Status.Conditions, v1.ConditionReady)
}

func describe(e *v1.Egress) string {
	s := fmt.Sprintf("%s ip=%q node=%q", e.Name, e.Status.EgressIP, e.Status.EgressNode)
	for _, c := range e.Status.Conditions {
		s += fmt.Sprintf(" %s=%s(%s: %s)", c.Type, c.Status, c.Reason, c.Message)
	}
	return s
}

// waitReady waits until every named Egress is Ready and returns them.
func (cl *cluster) waitReady(names ...string) map[string]*v1.Egress {
	cl.t.Helper()
	out := map[string]*v1.Egress{}
	for _, n := range names {
		cl.eventually(n+" Ready", func() (bool, string) {
			e := cl.get(n)
			out[n] = e
			return ready(e) && cl.agents[e.Status.EgressNode] != nil && cl.agents[e.Status.EgressNode].Bound(e.Status.EgressIP), describe(e)
		})
	}
	return out
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
