package datapath_test

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/egressip/egressip/internal/agent/datapath"
	"github.com/egressip/egressip/internal/podstart"
	"github.com/egressip/egressip/internal/podstart/cniapi"
	dp "github.com/egressip/egressip/test/datapath"
)

// withoutPlugin runs the Pod starts as they ran before egressip-cni: the
// plugin is not chained, the Node's agent classifies a Pod only once its
// status shows its IP (after the sandbox is up and the Pod may send).
var withoutPlugin = flag.Bool("podstart.without-plugin", false,
	"TestPodStartFirstPacket: do not chain egressip-cni (the behaviour before it, to show the fault)")

// withoutPeers runs the Pod starts with the egress Node knowing no peer
// Pod CIDRs (State.Peers empty): it admits a remote member only once its
// slice arrives, the behaviour before the peer-Pod-CIDR admission.
var withoutPeers = flag.Bool("podstart.without-peers", false,
	"TestPodStartFirstPacket*: give the Nodes no peer Pod CIDRs (the behaviour before, to show the remote-member gap)")

// podStartCount is the number of Pod starts per family.
const podStartCount = 50

// buildPlugin builds cmd/cni into dir as egressip-cni.
func buildPlugin(t *testing.T, dir string) {
	t.Helper()
	out, err := exec.Command("go", "build", "-o", filepath.Join(dir, cniapi.PluginType), "github.com/egressip/egressip/cmd/cni").CombinedOutput()
	if err != nil {
		t.Fatalf("build egressip-cni: %v: %s", err, out)
	}
}

// agentDouble stands in for the agents' informer side (the Pod object,
// namespace labels and Egress selectors; tested against a real API server
// in internal/agent): namespace "pay" is selected by Egress e1, Ready on
// gw. It serves the real plugin protocol (package podstart) for Node src
// and programs the real datapaths: src's on the plugin's ADD (what its
// agent does), gw's on the Pod's status (when the controller's
// EgressMemberSlice reaches gw's agent).
type agentDouble struct {
	f       *fixture
	e1      spec
	src, gw *dp.Node
	v6      bool

	mu      sync.Mutex
	members map[string]*dp.Pod // by namespace/name
}

func (a *agentDouble) specs() []spec {
	s := a.e1
	s.members = nil
	for _, p := range a.members {
		s.members = append(s.members, p)
	}
	slices.SortFunc(s.members, func(x, y *dp.Pod) int { return x.IPv4.Compare(y.IPv4) })
	return []spec{s}
}

func (a *agentDouble) applyTo(ctx context.Context, ns ...*dp.Node) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	sp := a.specs()
	for _, n := range ns {
		if err := a.f.dps[n].Apply(ctx, a.f.stateFor(n, sp)); err != nil {
			return fmt.Errorf("apply %s: %w", n.Name, err)
		}
	}
	return nil
}

func (a *agentDouble) classify(namespace, name string, ips []netip.Addr) bool {
	if namespace != "pay" {
		return false
	}
	p := &dp.Pod{Node: a.src}
	for _, ip := range ips {
		if ip.Is4() {
			p.IPv4 = ip
		} else {
			p.IPv6 = ip
		}
	}
	a.mu.Lock()
	a.members[namespace+"/"+name] = p
	a.mu.Unlock()
	return true
}

// PodAdded implements podstart.Gate as src's agent does: classify, apply
// src, answer.
func (a *agentDouble) PodAdded(ctx context.Context, req cniapi.Request) ([]string, error) {
	if !a.classify(req.Namespace, req.Name, req.IPs) {
		return nil, nil
	}
	return []string{"e1"}, a.applyTo(ctx, a.src)
}

func (a *agentDouble) PodDeleted(ctx context.Context, req cniapi.Request) error {
	a.mu.Lock()
	delete(a.members, req.Namespace+"/"+req.Name)
	a.mu.Unlock()
	return a.applyTo(ctx, a.src)
}

// status is the Pod's status with its IPs reaching the agents: src's
// classifies it now if it has not yet (without the plugin), gw's learns
// the remote member.
func (a *agentDouble) status(ctx context.Context, p *dp.Pod, ref dp.PodRef) error {
	a.classify(ref.Namespace, ref.Name, []netip.Addr{p.IPv4, p.IPv6})
	return a.applyTo(ctx, a.src, a.gw)
}

// flowLeft waits until n's conntrack holds a confirmed UDP flow from
// src:port to dst:ServerPort (confirmed at the end of postrouting: the
// packet's NAT is decided and it is on its way).
func flowLeft(ctx context.Context, n *dp.Node, src netip.Addr, port uint16, dst netip.Addr) error {
	h, err := n.OpenNetlink()
	if err != nil {
		return err
	}
	defer h.Close()
	fam := netlink.InetFamily(unix.AF_INET)
	if src.Is6() {
		fam = unix.AF_INET6
	}
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	for {
		flows, err := h.ConntrackTableList(netlink.ConntrackTable, fam)
		if err != nil {
			return err
		}
		for _, fl := range flows {
			s, _ := netip.AddrFromSlice(fl.Forward.SrcIP)
			d, _ := netip.AddrFromSlice(fl.Forward.DstIP)
			if fl.Forward.Protocol == unix.IPPROTO_UDP && s.Unmap() == src && d.Unmap() == dst && fl.Forward.SrcPort == port {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("no conntrack entry of %s:%d -> %s on %s: %w", src, port, dst, n.Name, ctx.Err())
		case <-tick.C:
		}
	}
}

// startResult is what one Pod start observed.
type startResult struct {
	udpSrc, tcpSrc netip.Addr
	udpErr, tcpErr error
	// udpFirst and tcpFirst are the times from the Pod's creation to the
	// first datagram's arrival at the server and to the TCP reply;
	// udpLost is the datagrams sent before the first that arrived.
	udpFirst, tcpFirst time.Duration
	udpLost            int
	// tcpRetrans is the connection's retransmitted segments (TCP_INFO
	// tcpi_total_retrans) once answered: 1 when the first SYN was lost.
	tcpRetrans uint32
}

// appTraffic is the Pod's process: at once a TCP connection and a UDP
// datagram (repeated every 100 ms until answered, as a resolver would).
// sent is called with the datagrams' source port once the first has left
// the Pod's socket.
func appTraffic(ctx context.Context, srv *dp.Server, p *dp.Pod, ext netip.Addr, stream string, t0 time.Time, sent func(port uint16)) startResult {
	var r startResult
	var wg sync.WaitGroup
	var once sync.Once
	defer once.Do(func() { sent(0) })
	wg.Go(func() {
		got, retrans, err := tcpWhoRetrans(ctx, &p.NS, ext)
		r.tcpSrc, r.tcpErr, r.tcpFirst, r.tcpRetrans = got, err, time.Since(t0), retrans
	})
	wg.Go(func() {
		c, err := dp.Dial(ctx, &p.NS, "udp", ext, dp.ServerPort)
		if err != nil {
			r.udpErr = err
			return
		}
		defer func() { _ = c.Close() }()
		buf := make([]byte, 100)
		for seq := range 50 {
			if _, err := fmt.Fprintf(c, "probe %s %d", stream, seq); err != nil {
				r.udpErr = err
				return
			}
			once.Do(func() { sent(netip.MustParseAddrPort(c.LocalAddr().String()).Port()) })
			_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			n, err := c.Read(buf)
			if err == nil {
				r.udpSrc, _ = netip.ParseAddr(string(buf[:n]))
				// Lost: the datagrams sent before the first one that
				// reached the server (several may be queued at once
				// while the Pod's first ARP is answered, proxy_delay).
				if seqs := srv.ProbeSeqs(stream); len(seqs) > 0 {
					r.udpLost = slices.Min(seqs)
				} else {
					r.udpLost = seq
				}
				if ts := srv.Probes(stream); len(ts) > 0 {
					r.udpFirst = ts[0].Sub(t0)
				}
				return
			}
			if ne, ok := errors.AsType[net.Error](err); !ok || !ne.Timeout() {
				r.udpErr = err
				return
			}
		}
		r.udpErr = errors.New("no UDP reply")
	})
	wg.Wait()
	return r
}

// tcpWhoRetrans is dp.TCPWho that also returns the connection's
// retransmission count once the reply has arrived.
func tcpWhoRetrans(ctx context.Context, ns *dp.NS, dst netip.Addr) (netip.Addr, uint32, error) {
	c, err := dp.Dial(ctx, ns, "tcp", dst, dp.ServerPort)
	if err != nil {
		return netip.Addr{}, 0, err
	}
	defer func() { _ = c.Close() }()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := fmt.Fprintf(c, "WHO\n"); err != nil {
		return netip.Addr{}, 0, err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return netip.Addr{}, 0, fmt.Errorf("read WHO reply: %w", err)
	}
	var info *unix.TCPInfo
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err == nil {
		cerr := raw.Control(func(fd uintptr) { info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) })
		err = errors.Join(err, cerr)
	}
	if err != nil {
		return netip.Addr{}, 0, fmt.Errorf("TCP_INFO: %w", err)
	}
	ip, err := netip.ParseAddr(strings.TrimSpace(line))
	return ip, info.Total_retrans, err
}

// TestPodStartFirstPacketRemote (issue 23, the remote-member gap): the
// starts of TestPodStartFirstPacket, 20 per family, where the Pod runs on
// Node src and e1's egress Node gw learns it from the member slice only
// after the Pod's first packet has left src. gw admits the tunnelled flow
// anyway (the outer source is src, the inner source in src's Pod CIDR,
// the outer destination e1's IP held by gw), so the first datagram is
// answered (none lost), the first SYN gets its SYN-ACK without a
// retransmission, and nothing leaves with the Node IP. With
// -podstart.without-peers (gw knows no Pod CIDRs: the behaviour before)
// the same starts lose the first datagram and retransmit the SYN.
func TestPodStartFirstPacketRemote(t *testing.T) {
	bin := t.TempDir()
	buildPlugin(t, bin)
	for _, fm := range families {
		t.Run(fm.name, func(t *testing.T) {
			r := podStarts(t, bin, fm, 20)
			if r.leaked != 0 || r.bad != 0 {
				t.Errorf("%d connections and datagrams from the Node IP, %d starts with a wrong source or an error", r.leaked, r.bad)
			}
			if r.lost != 0 || r.retrans != 0 {
				t.Errorf("the egress Node dropped first packets of new remote members: %d datagrams lost, %d of 20 TCP connections retransmitted", r.lost, r.retrans)
			}
		})
	}
}

// TestPodStartFirstPacket (issue 23, fault 2): Egress e1 is Ready on Node
// gw and selects namespace pay; a Pod is created in pay on Node src the
// way the kubelet does it (the sandbox through the CNI chain, then the
// status with its IP) and at once sends a UDP datagram and opens a TCP
// connection to the external server. Over 50 starts per family, under
// failurePolicy Fail and Ignore in turn, with the Pod e1's first and only
// member on src (so src has no route for e1 before): no packet leaves
// with src's Node IP, no connection is reset, and both reach the server
// from the egress IP. The plugin is the real binary (cmd/cni), executed
// with the CNI environment and its configuration on stdin, chained into
// the conflist by podstart.Install; the agents' classification is
// agentDouble. The times from the Pod's creation to its first packet at
// the server are logged.
func TestPodStartFirstPacket(t *testing.T) {
	bin := t.TempDir()
	buildPlugin(t, bin)
	for _, fm := range families {
		t.Run(fm.name, func(t *testing.T) {
			r := podStarts(t, bin, fm, podStartCount)
			if r.leaked != 0 {
				t.Errorf("%d connections and datagrams reached the server from the Node IP", r.leaked)
			}
		})
	}
}

// podStartStats is what a series of Pod starts observed.
type podStartStats struct {
	// bad counts starts with a wrong source or an error; leaked the
	// connections and datagrams from the Node IP; lost the datagrams
	// sent before the first answered one; retrans the starts whose TCP
	// connection needed a retransmission (the SYN, in practice).
	bad, leaked, lost, retrans int
	// udpT and tcpT are the times from each Pod's creation to its first
	// datagram at the server and to its TCP reply, sorted.
	udpT, tcpT []time.Duration
}

// podStarts starts n Pods in namespace pay on Node src, one after the
// other, each e1's only member there, with e1 Ready on Node gw (see
// TestPodStartFirstPacket), and returns what they observed.
func podStarts(t *testing.T, bin string, fm fam, n int) podStartStats {
	t.Helper()
	var st podStartStats
	f := newFixture(t)
	f.noPeers = *withoutPeers
	src, gw := f.c.Nodes[0], f.c.Nodes[1]
	a := &agentDouble{f: f, src: src, gw: gw, v6: fm.v6, members: map[string]*dp.Pod{},
		e1: spec{name: "e1", ip: fm.eip, node: gw}}
	f.apply(a.specs())

	confDir := t.TempDir()
	orig, err := dp.WriteConflist(confDir)
	if err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "agent.sock")
	sctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	ready := make(chan struct{})
	go func() {
		_, err := podstart.Serve(sctx, sock, podstart.Handler(a), false, func() { close(ready) })
		served <- err
	}()
	t.Cleanup(func() {
		stop()
		if err := <-served; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	<-ready
	if !*withoutPlugin {
		if _, _, err := podstart.Install(confDir, podstart.Entry{Socket: sock}); err != nil {
			t.Fatal(err)
		}
	}
	if b, _ := os.ReadFile(orig); true {
		t.Logf("conflist:\n%s", b)
	}
	rt := &dp.Runtime{Cluster: f.c, ConfDir: confDir, BinDir: bin}
	ctx := ctxT(t, 10*time.Minute)
	nodeIP := src.NodeIP(fm.v6)
	before := f.c.Server.Sources()[nodeIP]

	for i := range n {
		// Alternate the policy: e1 is Ready, so neither may matter.
		a.mu.Lock()
		a.e1.policy = []datapath.FailurePolicy{datapath.FailurePolicyFail, datapath.FailurePolicyIgnore}[i%2]
		a.mu.Unlock()
		ref := dp.PodRef{Namespace: "pay", Name: fmt.Sprintf("app-%d", i), UID: fmt.Sprintf("uid-%d", i)}
		t0 := time.Now()
		p, err := rt.Add(ctx, src, 3+i%12, ref)
		if err != nil {
			t.Fatalf("start %d: sandbox: %v", i, err)
		}
		// The Pod's process starts at once; the status the kubelet
		// writes reaches the agents through the API server after
		// the process's first packet has left the Node (20 of 20
		// in the runs): taken here as the moment src's
		// conntrack holds the first datagram's flow, its NAT
		// decided.
		statusDone := make(chan error, 1)
		r := appTraffic(ctx, f.c.Server, p, fm.ext, fmt.Sprintf("%s-%d", fm.name, i), t0, func(port uint16) {
			go func() {
				if err := flowLeft(ctx, src, p.IP(fm.v6), port, fm.ext); err != nil {
					statusDone <- err
					return
				}
				statusDone <- a.status(ctx, p, ref)
			}()
		})
		if err := <-statusDone; err != nil {
			t.Fatalf("start %d: status: %v", i, err)
		}
		if r.udpErr != nil || r.udpSrc != fm.eip || r.tcpErr != nil || r.tcpSrc != fm.eip {
			st.bad++
			t.Errorf("start %d (%s): UDP from %v (err %v), TCP from %v (err %v); want both from %s",
				i, a.e1.policy, r.udpSrc, r.udpErr, r.tcpSrc, r.tcpErr, fm.eip)
		}
		st.udpT, st.tcpT = append(st.udpT, r.udpFirst), append(st.tcpT, r.tcpFirst)
		st.lost += r.udpLost
		if r.tcpRetrans > 0 {
			st.retrans++
		}
		if err := rt.Del(ctx, p, ref); err != nil {
			t.Fatalf("start %d: delete: %v", i, err)
		}
		if err := a.applyTo(ctx, gw); err != nil {
			t.Fatal(err)
		}
	}
	st.leaked = f.c.Server.Sources()[nodeIP] - before
	slices.Sort(st.udpT)
	slices.Sort(st.tcpT)
	t.Logf("%d starts: %d with a wrong source or an error, %d from the Node IP, %d datagrams lost before the first answer, %d TCP connections retransmitted; "+
		"Pod creation to first datagram at the server: median %v, max %v; to the TCP reply: median %v, max %v",
		n, st.bad, st.leaked, st.lost, st.retrans, st.udpT[len(st.udpT)/2], st.udpT[len(st.udpT)-1], st.tcpT[len(st.tcpT)/2], st.tcpT[len(st.tcpT)-1])
	return st
}
