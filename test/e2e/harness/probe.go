package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"time"

	"github.com/mdlayher/arp"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/egressip/egressip/internal/testutil/netnstest"
)

// inNamespace runs fn on a thread switched into namespace ns
// (netnstest.DoIn); sockets that fn opens stay in ns after it returns.
func inNamespace(ns string, fn func() error) error {
	return netnstest.DoIn(ns, fn)
}

// linkMAC returns the hardware address of ifname in namespace ns.
func linkMAC(ns, ifname string) (net.HardwareAddr, error) {
	n, err := netnstest.Open(ns)
	if err != nil {
		return nil, err
	}
	defer func() { _ = n.Close() }()
	nh, err := n.OpenNetlink()
	if err != nil {
		return nil, err
	}
	defer nh.Close()
	l, err := nh.LinkByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("link %s in %s: %w", ifname, ns, err)
	}
	return l.Attrs().HardwareAddr, nil
}

// Ping sends ICMP echoes from the client namespace to ip, one every
// pingInterval as ping(8) sends them every second, and waits up to timeout
// for a reply to any of them. One echo alone failed once in CI for an IPv6
// Egress created right after the previous one with the same address was
// deleted from another Node: the client's Neighbor Solicitation or the
// echo was lost, and nothing sent it again within the timeout.
func (c *Cluster) Ping(ip netip.Addr, timeout time.Duration) error {
	network, proto := "ip4:icmp", 1
	var typ icmp.Type = ipv4.ICMPTypeEcho
	if ip.Is6() {
		network, proto, typ = "ip6:ipv6-icmp", 58, ipv6.ICMPTypeEchoRequest
	}
	var conn *icmp.PacketConn
	if err := inNamespace(c.ClientNS, func() (err error) {
		conn, err = icmp.ListenPacket(network, "")
		return err
	}); err != nil {
		return fmt.Errorf("open ICMP socket: %w", err)
	}
	defer func() { _ = conn.Close() }()
	id := os.Getpid() & 0xffff
	msg := icmp.Message{Type: typ, Body: &icmp.Echo{ID: id, Seq: 1, Data: []byte("egressip")}}
	b, err := msg.Marshal(nil)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(timeout)
	next := time.Now() // when the next echo goes out
	buf := make([]byte, 1500)
	sent := 0
	for {
		if now := time.Now(); !now.Before(next) && now.Before(deadline) {
			if _, err := conn.WriteTo(b, &net.IPAddr{IP: ip.AsSlice()}); err != nil {
				return fmt.Errorf("send echo to %s: %w", ip, err)
			}
			sent++
			next = now.Add(pingInterval)
		}
		_ = conn.SetReadDeadline(minTime(deadline, next))
		n, from, err := conn.ReadFrom(buf)
		if err != nil {
			if time.Now().Before(deadline) {
				continue // time for the next echo
			}
			return fmt.Errorf("no echo reply from %s to %d echoes in %v: %w", ip, sent, timeout, err)
		}
		m, err := icmp.ParseMessage(proto, buf[:n])
		if err != nil {
			continue
		}
		if e, ok := m.Body.(*icmp.Echo); ok && (m.Type == ipv4.ICMPTypeEchoReply || m.Type == ipv6.ICMPTypeEchoReply) && e.ID == id && from.String() == ip.String() {
			return nil
		}
	}
}

// Neighbour returns the MAC the client namespace's neighbour table holds
// for ip (after Ping, this is what ARP or NDP resolved).
func (c *Cluster) Neighbour(ip netip.Addr) (net.HardwareAddr, error) {
	h, err := netns.GetFromName(c.ClientNS)
	if err != nil {
		return nil, err
	}
	defer func() { _ = h.Close() }()
	nh, err := netlink.NewHandleAt(h)
	if err != nil {
		return nil, err
	}
	defer nh.Close()
	fam := netlink.FAMILY_V4
	if ip.Is6() {
		fam = netlink.FAMILY_V6
	}
	neighs, err := nh.NeighList(0, fam)
	if err != nil {
		return nil, fmt.Errorf("list neighbours: %w", err)
	}
	for _, n := range neighs {
		if n.IP.Equal(ip.AsSlice()) && len(n.HardwareAddr) > 0 && n.State&(netlink.NUD_REACHABLE|netlink.NUD_STALE|netlink.NUD_DELAY|netlink.NUD_PROBE|netlink.NUD_PERMANENT) != 0 {
			return n.HardwareAddr, nil
		}
	}
	return nil, fmt.Errorf("no neighbour entry for %s", ip)
}

// FlushNeighbour forgets the client's neighbour entry for ip.
func (c *Cluster) FlushNeighbour(ip netip.Addr) {
	_ = inNS(c.ClientNS, "neigh", "flush", "to", ip.String())
}

// ARPReply is one answer seen by an ARPWatcher.
type ARPReply struct {
	At  time.Time
	MAC string
}

// ARPWatcher asks for one IPv4 address from the client namespace every
// interval (an ARP request, as a host whose cache expired would) and keeps
// every reply: which MACs answered and when, and how many requests it sent.
type ARPWatcher struct {
	mu      sync.Mutex
	replies []ARPReply
	sent    int
	stop    context.CancelFunc
	sending chan struct{}
	done    chan struct{}
}

// arpDrain is how long an ARPWatcher keeps reading after its last request:
// a reply to a request sent on a veth pair arrives within microseconds, so
// this only has to cover the reader's scheduling delay on a loaded machine.
const arpDrain = 300 * time.Millisecond

// WatchARP starts an ARPWatcher for ip.
func (c *Cluster) WatchARP(ip netip.Addr, interval time.Duration) (*ARPWatcher, error) {
	if !ip.Is4() {
		return nil, errors.New("WatchARP takes an IPv4 address")
	}
	var cl *arp.Client
	if err := inNamespace(c.ClientNS, func() error {
		ifi, err := net.InterfaceByName("eth0")
		if err != nil {
			return err
		}
		cl, err = arp.Dial(ifi)
		return err
	}); err != nil {
		return nil, fmt.Errorf("open ARP client: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &ARPWatcher{stop: cancel, sending: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.sending)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			if cl.Request(ip) == nil {
				w.mu.Lock()
				w.sent++
				w.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	go func() {
		defer close(w.done)
		defer func() { _ = cl.Close() }()
		var drainUntil time.Time
		for {
			if ctx.Err() != nil {
				if drainUntil.IsZero() {
					<-w.sending
					drainUntil = time.Now().Add(arpDrain)
				}
				if time.Now().After(drainUntil) {
					return
				}
			}
			_ = cl.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
			p, _, err := cl.Read()
			if err != nil {
				continue
			}
			if p.Operation == arp.OperationReply && p.SenderIP == ip {
				w.mu.Lock()
				w.replies = append(w.replies, ARPReply{At: time.Now(), MAC: p.SenderHardwareAddr.String()})
				w.mu.Unlock()
			}
		}
	}()
	return w, nil
}

// Stop ends the watch and returns every reply seen. It stops sending,
// then keeps reading for arpDrain so that every request sent has had its
// chance to be answered.
func (w *ARPWatcher) Stop() []ARPReply {
	w.stop()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]ARPReply(nil), w.replies...)
}

// Sent returns how many ARP requests the watcher has sent so far.
func (w *ARPWatcher) Sent() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sent
}

// Unanswered returns, after Stop, how many of the requests sent got no
// reply from mac. Each request on this segment gets exactly one reply from
// each host holding the address, so this counts the requests sent while
// mac did not hold it. Unlike the time between two replies read, it does
// not grow when the watcher itself is descheduled on a loaded machine:
// requests not sent are not counted.
func (w *ARPWatcher) Unanswered(mac string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	got := 0
	for _, r := range w.replies {
		if r.MAC == mac {
			got++
		}
	}
	return max(0, w.sent-got)
}

// Replies returns the replies seen so far.
func (w *ARPWatcher) Replies() []ARPReply {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]ARPReply(nil), w.replies...)
}

// pingInterval is the time between two echoes of Ping.
const pingInterval = 250 * time.Millisecond

// minTime returns the earlier of a and b.
func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
