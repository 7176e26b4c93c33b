package announce_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/egressip/egressip/internal/testutil/netnstest"
	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/mdlayher/packet"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// frame is one Ethernet frame seen by the peer, with its arrival time.
type frame struct {
	b  []byte
	at time.Time
}

// capture reads every frame arriving on an interface of the peer namespace.
type capture struct {
	t      testing.TB
	frames chan frame
}

func startCapture(t testing.TB, ns *netnstest.NS, ifname string) *capture {
	t.Helper()
	var c *packet.Conn
	err := ns.Do(func() error {
		ifi, err := net.InterfaceByName(ifname)
		if err != nil {
			return err
		}
		c, err = packet.Listen(ifi, packet.Raw, unix.ETH_P_ALL, nil)
		return err
	})
	if err != nil {
		t.Fatalf("capture on %s in %s: %v", ifname, ns.Name, err)
	}
	cp := &capture{t: t, frames: make(chan frame, 4096)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for {
			n, _, err := c.ReadFrom(buf)
			if err != nil {
				return // closed
			}
			select {
			case cp.frames <- frame{b: bytes.Clone(buf[:n]), at: time.Now()}:
			default: // never block the reader; tests read promptly
			}
		}
	}()
	t.Cleanup(func() { _ = c.Close(); <-done }) // closing ends the reader; its error does not matter
	return cp
}

type garp struct {
	eth *ethernet.Frame
	arp *arp.Packet
	at  time.Time
}

type na struct {
	eth *ethernet.Frame
	ip6 *ipv6.Header
	na  *ndp.NeighborAdvertisement
	at  time.Time
}

func decodeARP(f frame) (garp, bool) {
	var eth ethernet.Frame
	if eth.UnmarshalBinary(f.b) != nil || eth.EtherType != ethernet.EtherTypeARP {
		return garp{}, false
	}
	var p arp.Packet
	if p.UnmarshalBinary(eth.Payload) != nil {
		return garp{}, false
	}
	return garp{&eth, &p, f.at}, true
}

func decodeNA(f frame) (na, bool) {
	var eth ethernet.Frame
	if eth.UnmarshalBinary(f.b) != nil || eth.EtherType != ethernet.EtherTypeIPv6 {
		return na{}, false
	}
	h, err := ipv6.ParseHeader(eth.Payload)
	if err != nil || h.NextHeader != unix.IPPROTO_ICMPV6 || len(eth.Payload) < ipv6.HeaderLen+h.PayloadLen {
		return na{}, false
	}
	m, err := ndp.ParseMessage(eth.Payload[ipv6.HeaderLen : ipv6.HeaderLen+h.PayloadLen])
	if err != nil {
		return na{}, false
	}
	adv, ok := m.(*ndp.NeighborAdvertisement)
	if !ok {
		return na{}, false
	}
	return na{&eth, h, adv, f.at}, true
}

// next reports whether a frame accepted by match arrives within timeout.
func (c *capture) next(timeout time.Duration, match func(frame) bool) bool {
	deadline := time.After(timeout)
	for {
		select {
		case f := <-c.frames:
			if match(f) {
				return true
			}
		case <-deadline:
			return false
		}
	}
}

// garpFor waits for an ARP packet whose sender IP is ip.
func (c *capture) garpFor(ip netip.Addr, timeout time.Duration) (garp, bool) {
	var g garp
	ok := c.next(timeout, func(f frame) bool {
		var ok bool
		g, ok = decodeARP(f)
		return ok && g.arp.SenderIP == ip
	})
	return g, ok
}

// naFor waits for a Neighbor Advertisement whose target is ip.
func (c *capture) naFor(ip netip.Addr, timeout time.Duration) (na, bool) {
	var n na
	ok := c.next(timeout, func(f frame) bool {
		var ok bool
		n, ok = decodeNA(f)
		return ok && n.na.TargetAddress == ip
	})
	return n, ok
}

// drain counts, for timeout, the ARP packets sent from mac and the NAs sent
// from mac.
func (c *capture) drain(mac net.HardwareAddr, timeout time.Duration) (arps, nas int) {
	c.next(timeout, func(f frame) bool {
		if g, ok := decodeARP(f); ok && bytes.Equal(g.eth.Source, mac) {
			arps++
		}
		if n, ok := decodeNA(f); ok && bytes.Equal(n.eth.Source, mac) {
			nas++
		}
		return false
	})
	return arps, nas
}

// ping sends ICMP echo requests to dst from the peer namespace (no ping
// binary) and waits for the matching reply.
func ping(t testing.TB, ns *netnstest.NS, dst netip.Addr) error {
	t.Helper()
	network, listen, proto := "ip4:icmp", "0.0.0.0", 1
	var echo, reply icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
	if dst.Is6() {
		network, listen, proto = "ip6:ipv6-icmp", "::", 58
		echo, reply = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
	}
	var c *icmp.PacketConn
	if err := ns.Do(func() (err error) {
		c, err = icmp.ListenPacket(network, listen)
		return err
	}); err != nil {
		return err
	}
	defer func() { _ = c.Close() }() // test probe socket
	id := int(rand.Uint32() & 0xffff)
	payload := []byte("egressip-ping")
	buf := make([]byte, 1500)
	for seq := 1; seq <= 5; seq++ {
		msg := icmp.Message{Type: echo, Body: &icmp.Echo{ID: id, Seq: seq, Data: payload}}
		b, err := msg.Marshal(nil) // ICMPv6 checksum is filled in by the kernel
		if err != nil {
			return err
		}
		if _, err := c.WriteTo(b, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Second))
		for {
			n, from, err := c.ReadFrom(buf)
			if err != nil {
				break // timeout: next seq
			}
			m, err := icmp.ParseMessage(proto, buf[:n])
			if err != nil || m.Type != reply {
				continue
			}
			e, ok := m.Body.(*icmp.Echo)
			src, _ := netip.AddrFromSlice(from.(*net.IPAddr).IP)
			if ok && e.ID == id && e.Seq == seq && src.Unmap() == dst && bytes.Equal(e.Data, payload) {
				return nil
			}
		}
	}
	return errors.New("no echo reply from " + dst.String())
}
