package harness

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/packet"

	"github.com/egressip/egressip/internal/testutil/netnstest"
)

// Helpers of the duplicate-IP and announce-on-return tests (issue 16 items
// 3 and 5): a rogue host on the bridge, a passive capture of gratuitous
// ARP at the client, and a TCP proxy between one agent and the API server
// that the test can cut.

// Rogue is a namespace on the bridge that is not a Node of the cluster.
type Rogue struct {
	NS  string
	MAC net.HardwareAddr
}

// AddRogue creates namespace <Prefix>-rogue on the bridge (eth0, its peer
// vethr a port of br0) holding ips: IPv4 as /32, IPv6 as /128 without
// duplicate address detection, so its kernel answers ARP and Neighbor
// Solicitations for them at once.
func (c *Cluster) AddRogue(ips ...netip.Addr) (*Rogue, error) {
	ns := c.Config.Prefix + "-rogue"
	if err := netnstest.Add(ns); err != nil {
		return nil, err
	}
	r := &Rogue{NS: ns}
	if err := netnstest.Veth("", "vethr", ns, "eth0"); err != nil {
		r.Remove()
		return nil, err
	}
	steps := [][]string{
		{"ip", "link", "set", "vethr", "master", "br0", "up"},
		{"ip", "-n", ns, "link", "set", "lo", "up"},
		{"ip", "-n", ns, "link", "set", "eth0", "up"},
	}
	for _, ip := range ips {
		if ip.Is4() {
			steps = append(steps, []string{"ip", "-n", ns, "addr", "add", ip.String() + "/32", "dev", "eth0"})
		} else {
			steps = append(steps, []string{"ip", "-n", ns, "addr", "add", ip.String() + "/128", "dev", "eth0", "nodad"})
		}
	}
	for _, s := range steps {
		if err := run(s[0], s[1:]...); err != nil {
			r.Remove()
			return nil, err
		}
	}
	mac, err := linkMAC(ns, "eth0")
	if err != nil {
		r.Remove()
		return nil, err
	}
	r.MAC = mac
	return r, nil
}

// Remove takes the rogue off the bridge: its namespace (and so its veth
// pair and addresses) is deleted.
func (r *Rogue) Remove() {
	_ = netnstest.Remove(r.NS)
}

// GARP is one gratuitous ARP seen by a GARPCapture.
type GARP struct {
	At  time.Time
	MAC string // sender hardware address
}

// GARPCapture records, passively, every gratuitous ARP for one IPv4
// address that reaches the client's eth0 (ARP packets whose sender and
// target IP are both the address, as announce sends them). It sends
// nothing, so it never refreshes the client's neighbour table itself.
type GARPCapture struct {
	ip   netip.Addr
	conn *packet.Conn
	mu   sync.Mutex
	seen []GARP
	done chan struct{}
}

// CaptureGARP starts a GARPCapture for ip in the client namespace.
func (c *Cluster) CaptureGARP(ip netip.Addr) (*GARPCapture, error) {
	if !ip.Is4() {
		return nil, errors.New("CaptureGARP takes an IPv4 address")
	}
	g := &GARPCapture{ip: ip, done: make(chan struct{})}
	if err := inNamespace(c.ClientNS, func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		g.conn, err = packet.Listen(ifi, packet.Raw, int(ethernet.EtherTypeARP), nil)
		return err
	}); err != nil {
		return nil, fmt.Errorf("open ARP capture: %w", err)
	}
	go func() {
		defer close(g.done)
		buf := make([]byte, 1600)
		for {
			n, _, err := g.conn.ReadFrom(buf)
			if err != nil {
				return // closed by Stop
			}
			var f ethernet.Frame
			var p arp.Packet
			if f.UnmarshalBinary(buf[:n]) != nil || p.UnmarshalBinary(f.Payload) != nil {
				continue
			}
			if p.SenderIP == ip && p.TargetIP == ip {
				g.mu.Lock()
				g.seen = append(g.seen, GARP{At: time.Now(), MAC: p.SenderHardwareAddr.String()})
				g.mu.Unlock()
			}
		}
	}()
	return g, nil
}

// Seen returns the gratuitous ARPs seen so far.
func (g *GARPCapture) Seen() []GARP {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]GARP(nil), g.seen...)
}

// First returns the first gratuitous ARP from mac at or after t.
func (g *GARPCapture) First(mac string, t time.Time) (GARP, bool) {
	for _, s := range g.Seen() {
		if s.MAC == mac && !s.At.Before(t) {
			return s, true
		}
	}
	return GARP{}, false
}

// Stop ends the capture.
func (g *GARPCapture) Stop() {
	_ = g.conn.Close()
	<-g.done
}

// APIProxy forwards TCP connections from agents to the API server, in the
// control-plane namespace on the bridge address. Cut closes every
// forwarded connection and refuses new ones (accepted and closed at once,
// as a broken path would), until Restore. TLS passes through untouched.
type APIProxy struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	cut      bool
	conns    map[net.Conn]bool
	accepted []time.Time // when each forwarded connection was accepted
}

// StartAPIProxy starts a proxy to the cluster's API server.
func (c *Cluster) StartAPIProxy() (*APIProxy, error) {
	u, err := url.Parse(c.Env.Config.Host)
	if err != nil {
		return nil, fmt.Errorf("API server address %q: %w", c.Env.Config.Host, err)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(BridgeV4.String(), "0"))
	if err != nil {
		return nil, fmt.Errorf("listen for the API proxy: %w", err)
	}
	p := &APIProxy{ln: ln, target: u.Host, conns: map[net.Conn]bool{}}
	go p.serve()
	return p, nil
}

func (p *APIProxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			_ = in.Close()
			continue
		}
		p.accepted = append(p.accepted, time.Now())
		p.conns[in] = true
		p.mu.Unlock()
		go p.forward(in)
	}
}

func (p *APIProxy) forward(in net.Conn) {
	out, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil {
		p.drop(in)
		return
	}
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		_ = out.Close()
		p.drop(in)
		return
	}
	p.conns[out] = true
	p.mu.Unlock()
	var wg sync.WaitGroup
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		_, _ = io.Copy(dst, src)
		p.drop(dst)
		p.drop(src)
	}
	wg.Add(2)
	go pipe(out, in)
	go pipe(in, out)
	wg.Wait()
}

func (p *APIProxy) drop(c net.Conn) {
	_ = c.Close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// Addr is the proxy's listen address (host:port).
func (p *APIProxy) Addr() string { return p.ln.Addr().String() }

// Cut closes every forwarded connection and refuses new ones.
func (p *APIProxy) Cut() {
	p.mu.Lock()
	p.cut = true
	open := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		open = append(open, c)
	}
	p.mu.Unlock()
	for _, c := range open {
		// Reset rather than close: the agent sees the connection drop at
		// once, as when a path breaks and comes back.
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		p.drop(c)
	}
}

// Restore forwards connections again.
func (p *APIProxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// FirstAcceptSince returns when the first connection forwarded at or
// after t was accepted: the moment the agent reached the API server again.
func (p *APIProxy) FirstAcceptSince(t time.Time) (time.Time, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range p.accepted {
		if !a.Before(t) {
			return a, true
		}
	}
	return time.Time{}, false
}

// Close stops the proxy and closes every connection.
func (p *APIProxy) Close() {
	_ = p.ln.Close()
	p.Cut()
}

// RouteAgentVia restarts n's agent (SIGTERM, which leaves its addresses
// bound; the new agent adopts them) with a kubeconfig whose server is the
// proxy p; nil p restores the direct path.
func (c *Cluster) RouteAgentVia(n *Node, p *APIProxy) error {
	kc := ""
	if p != nil {
		n.mu.Lock()
		own := n.kubeconfig
		n.mu.Unlock()
		b, err := os.ReadFile(own)
		if err != nil {
			return fmt.Errorf("read agent kubeconfig: %w", err)
		}
		u, err := url.Parse(c.Env.Config.Host)
		if err != nil {
			return err
		}
		if !strings.Contains(string(b), u.Host) {
			return fmt.Errorf("agent kubeconfig does not name the API server %s", u.Host)
		}
		kc = filepath.Join(c.dir, n.Name+"-proxied.kubeconfig")
		if err := os.WriteFile(kc, []byte(strings.ReplaceAll(string(b), u.Host, p.Addr())), 0o600); err != nil {
			return fmt.Errorf("write proxied kubeconfig: %w", err)
		}
	}
	c.StopAgent(n, syscall.SIGTERM)
	n.mu.Lock()
	n.Kubeconfig = kc
	n.mu.Unlock()
	return c.StartAgent(n)
}
