package agent_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/mdlayher/packet"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap/zapcore"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent"
	"github.com/egressip/egressip/internal/agent/bind"
	"github.com/egressip/egressip/internal/report"
	"github.com/egressip/egressip/internal/testenv"
	"github.com/egressip/egressip/internal/testutil/netnstest"
)

var (
	envOnce   sync.Once
	sharedEnv *testenv.Env
	envErr    error
)

func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.Level(zapcore.InfoLevel), zap.WriteTo(os.Stderr)))
	code := m.Run()
	if sharedEnv != nil {
		if err := sharedEnv.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stop envtest: %v\n", err)
		}
	}
	os.Exit(code)
}

// apiServer returns the control plane shared by the tests of this package,
// started on first use (tests use unique Node and object names).
func apiServer(t *testing.T) *testenv.Env {
	t.Helper()
	netnstest.RequireRoot(t)
	envOnce.Do(func() { sharedEnv, envErr = testenv.Start() })
	if envErr != nil {
		t.Fatalf("start envtest: %v", envErr)
	}
	return sharedEnv
}

func uniq(prefix string) string {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return prefix + "-" + hex.EncodeToString(b)
}

// testNode is a network namespace acting as a Node, joined by a veth pair to
// a peer namespace (its L2 neighbour and default gateway) that captures
// every frame the Node sends.
type testNode struct {
	*netnstest.Pair
	name    string // the Kubernetes Node name
	capture *capture
	check   *bind.Binder // reads ownership in the Node namespace
}

// newTestNode sets up 192.0.2.2/24 and 2001:db8::2/64 on the Node side,
// 192.0.2.1/24 and 2001:db8::1/64 on the peer side, default routes via the
// peer, and starts capturing on the peer.
func newTestNode(t *testing.T) *testNode {
	t.Helper()
	p := netnstest.NewPair(t)
	p.Node.MustIP(t, "addr", "add", "192.0.2.2/24", "dev", p.NodeIf)
	p.Node.MustIP(t, "-6", "addr", "add", "2001:db8::2/64", "dev", p.NodeIf, "nodad")
	p.Peer.MustIP(t, "addr", "add", "192.0.2.1/24", "dev", p.PeerIf)
	p.Peer.MustIP(t, "-6", "addr", "add", "2001:db8::1/64", "dev", p.PeerIf, "nodad")
	p.Node.MustIP(t, "route", "add", "default", "via", "192.0.2.1")
	p.Node.MustIP(t, "-6", "route", "add", "default", "via", "2001:db8::1")
	b, err := bind.New(p.Node.Handle, bind.Config{})
	if err != nil {
		t.Fatalf("binder for checks: %v", err)
	}
	t.Cleanup(b.Close)
	return &testNode{Pair: p, name: uniq("node"), capture: startCapture(t, p.Peer, p.PeerIf), check: b}
}

// owned lists the addresses egressip owns in the Node namespace.
func (n *testNode) owned(t *testing.T) map[netip.Addr]string {
	t.Helper()
	bs, err := n.check.Owned()
	if err != nil {
		t.Fatalf("owned addresses: %v", err)
	}
	out := map[netip.Addr]string{}
	for _, b := range bs {
		out[b.Addr] = b.Interface
	}
	return out
}

// present reports whether ip is on any interface of the Node namespace,
// owned or not.
func (n *testNode) present(t *testing.T, ip netip.Addr) bool {
	t.Helper()
	out := n.Node.MustIP(t, "-o", "addr", "show")
	for f := range strings.FieldsSeq(out) {
		if pfx, err := netip.ParsePrefix(f); err == nil && pfx.Addr() == ip {
			return true
		}
	}
	return false
}

func (n *testNode) config() agent.Config {
	return agent.Config{NodeName: n.name, NetNSPath: n.Node.Path, ResyncPeriod: 2 * time.Second}
}

// runningAgent is an Agent wired as Run wires it, with its parts exposed.
type runningAgent struct {
	agent  *agent.Agent
	mgr    manager.Manager
	port   int
	cancel context.CancelFunc
	mgrErr chan error
	repErr chan error
	once   sync.Once
}

// startAgent starts a (New) and its manager against cfg; stop runs in
// t.Cleanup.
func startAgent(t *testing.T, cfg *rest.Config, node string, a *agent.Agent) *runningAgent {
	t.Helper()
	mgr, err := agent.NewManager(cfg, node, manager.Options{
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  cache.Options{DefaultWatchErrorHandler: a.WatchErrorHandler},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningAgent{agent: a, mgr: mgr, port: ln.Addr().(*net.TCPAddr).Port, cancel: cancel,
		mgrErr: make(chan error, 1), repErr: make(chan error, 1)}
	go func() { r.repErr <- a.ServeReport(ctx, ln) }()
	go func() { r.mgrErr <- mgr.Start(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// newAgent is agent.New that fails the test on error.
func newAgent(t *testing.T, cfg agent.Config) *agent.Agent {
	t.Helper()
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatalf("agent.New: %v", err)
	}
	return a
}

// stop cancels the agent's context, waits for the manager and the report
// server, and closes the agent (which unbinds nothing).
func (r *runningAgent) stop(t *testing.T) {
	r.once.Do(func() {
		r.cancel()
		for _, c := range []chan error{r.mgrErr, r.repErr} {
			select {
			case err := <-c:
				_ = err // a run ended by the cancel may return an error; not checked here
			case <-time.After(60 * time.Second):
				t.Errorf("agent did not stop within 60 s")
			}
		}
		if err := r.agent.Close(); err != nil {
			t.Errorf("close agent: %v", err)
		}
	})
}

// report fetches the agent's report over HTTP, as the controller does.
func (r *runningAgent) report(ctx context.Context) (report.Report, error) {
	return getReport(ctx, r.port)
}

func getReport(ctx context.Context, port int) (report.Report, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return report.NewClient(port, 2*time.Second).Get(ctx, netip.MustParseAddr("127.0.0.1"), report.Poll{})
}

// wantReport checks that rep lists exactly ips, on iface, announced as
// given.
func wantReport(rep report.Report, iface string, announced bool, ips ...netip.Addr) error {
	var got []netip.Addr
	for _, b := range rep.Bound {
		got = append(got, b.IP)
		if b.Interface != iface {
			return fmt.Errorf("report: %s on %q, want %q", b.IP, b.Interface, iface)
		}
		if b.Announced != announced {
			return fmt.Errorf("report: %s announced=%v, want %v", b.IP, b.Announced, announced)
		}
	}
	want := slices.Clone(ips)
	slices.SortFunc(want, netip.Addr.Compare)
	if !slices.Equal(got, want) {
		return fmt.Errorf("report lists %v, want %v", got, want)
	}
	return nil
}

// API objects

func createPool(t *testing.T, c client.Client, cidr, gateway string, prefixLen int32) string {
	t.Helper()
	p := &v1alpha1.ExternalIPPool{
		ObjectMeta: metav1.ObjectMeta{Name: uniq("pool")},
		Spec: v1alpha1.ExternalIPPoolSpec{
			IPRanges:   []v1alpha1.IPRange{{CIDR: cidr}},
			SubnetInfo: &v1alpha1.SubnetInfo{Gateway: gateway, PrefixLength: prefixLen},
		},
	}
	if err := c.Create(context.Background(), p); err != nil {
		t.Fatalf("create pool: %v", err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), p) })
	return p.Name
}

// createEgress creates an Egress asking for ip from pool and, when node is
// set, writes status.egressIP and status.egressNode through the status
// subresource as the controller does.
func createEgress(t *testing.T, c client.Client, prefix, pool, ip, node string) string {
	t.Helper()
	e := &v1alpha1.Egress{
		ObjectMeta: metav1.ObjectMeta{Name: uniq(prefix)},
		Spec: v1alpha1.EgressSpec{
			AppliedTo:      v1alpha1.AppliedTo{PodSelector: &metav1.LabelSelector{}},
			ExternalIPPool: pool,
			EgressIP:       ip,
		},
	}
	if err := c.Create(context.Background(), e); err != nil {
		t.Fatalf("create Egress: %v", err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		var cur v1alpha1.Egress
		if c.Get(ctx, client.ObjectKey{Name: e.Name}, &cur) == nil && len(cur.Finalizers) > 0 {
			cur.Finalizers = nil
			_ = c.Update(ctx, &cur)
		}
		_ = c.Delete(ctx, e)
	})
	setStatus(t, c, e.Name, ip, node)
	return e.Name
}

// setStatus writes status.egressIP and status.egressNode of Egress name.
func setStatus(t *testing.T, c client.Client, name, ip, node string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var e v1alpha1.Egress
		if err := c.Get(context.Background(), client.ObjectKey{Name: name}, &e); err != nil {
			return err
		}
		e.Status.EgressIP, e.Status.EgressNode = ip, node
		return c.Status().Update(context.Background(), &e)
	})
	if err != nil {
		t.Fatalf("update status of Egress %s: %v", name, err)
	}
}

// Metrics

// metricValue returns the value of a counter or gauge, or the sample count
// of a histogram, from controller-runtime's registry; labels must match
// exactly. A missing series reads 0.
func metricValue(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !labelsEqual(m.GetLabel(), labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return 0
}

func labelsEqual(got []*dto.LabelPair, want map[string]string) bool {
	if len(got) != len(want) {
		return false
	}
	for _, l := range got {
		if v, ok := want[l.GetName()]; !ok || v != l.GetValue() {
			return false
		}
	}
	return true
}

func reconcileCount(t *testing.T) float64 {
	return metricValue(t, "egressip_agent_reconcile_duration_seconds", nil)
}

// Capture

type frame struct {
	b  []byte
	at time.Time
}

// capture receives every frame arriving on an interface of the peer.
type capture struct {
	frames chan frame
}

func startCapture(t *testing.T, ns *netnstest.NS, ifname string) *capture {
	t.Helper()
	var conn *packet.Conn
	if err := ns.Do(func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		conn, err = packet.Listen(ifi, packet.Raw, unix.ETH_P_ALL, nil)
		return err
	}); err != nil {
		t.Fatalf("capture on %s: %v", ifname, err)
	}
	c := &capture{frames: make(chan frame, 8192)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 9000)
		for {
			n, _, err := conn.ReadFrom(buf)
			if err != nil {
				return
			}
			select {
			case c.frames <- frame{bytes.Clone(buf[:n]), time.Now()}:
			default:
			}
		}
	}()
	t.Cleanup(func() { _ = conn.Close(); <-done }) // closing ends the reader; its error does not matter
	return c
}

// drop discards the frames received so far.
func (c *capture) drop() {
	for {
		select {
		case <-c.frames:
		default:
			return
		}
	}
}

// announcementFor reports whether f is a gratuitous ARP (sender IP = target
// IP = ip) or an unsolicited Neighbor Advertisement (target ip, override,
// not solicited) for ip.
func announcementFor(f frame, ip netip.Addr) bool {
	var eth ethernet.Frame
	if eth.UnmarshalBinary(f.b) != nil {
		return false
	}
	switch eth.EtherType {
	case ethernet.EtherTypeARP:
		var p arp.Packet
		return p.UnmarshalBinary(eth.Payload) == nil && p.Operation == arp.OperationRequest &&
			p.SenderIP == ip && p.TargetIP == ip
	case ethernet.EtherTypeIPv6:
		h, err := ipv6.ParseHeader(eth.Payload)
		if err != nil || h.NextHeader != unix.IPPROTO_ICMPV6 || len(eth.Payload) < ipv6.HeaderLen+h.PayloadLen {
			return false
		}
		m, err := ndp.ParseMessage(eth.Payload[ipv6.HeaderLen : ipv6.HeaderLen+h.PayloadLen])
		if err != nil {
			return false
		}
		na, ok := m.(*ndp.NeighborAdvertisement)
		return ok && na.TargetAddress == ip && na.Override && !na.Solicited
	}
	return false
}

var errNoAnnouncement = errors.New("no announcement")

// waitAnnouncements returns the arrival time of the first announcement for
// each of ips, waiting at most timeout for all of them; other frames are
// discarded.
func (c *capture) waitAnnouncements(timeout time.Duration, ips ...netip.Addr) (map[netip.Addr]time.Time, error) {
	seen := map[netip.Addr]time.Time{}
	deadline := time.After(timeout)
	for len(seen) < len(ips) {
		select {
		case f := <-c.frames:
			for _, ip := range ips {
				if _, ok := seen[ip]; !ok && announcementFor(f, ip) {
					seen[ip] = f.at
				}
			}
		case <-deadline:
			var missing []netip.Addr
			for _, ip := range ips {
				if _, ok := seen[ip]; !ok {
					missing = append(missing, ip)
				}
			}
			return seen, fmt.Errorf("%w for %v within %s", errNoAnnouncement, missing, timeout)
		}
	}
	return seen, nil
}

// countAnnouncements counts, for d, the announcements for each of ips.
func (c *capture) countAnnouncements(d time.Duration, ips ...netip.Addr) map[netip.Addr]int {
	out := map[netip.Addr]int{}
	deadline := time.After(d)
	for {
		select {
		case f := <-c.frames:
			for _, ip := range ips {
				if announcementFor(f, ip) {
					out[ip]++
				}
			}
		case <-deadline:
			return out
		}
	}
}
