// Package announce tells the L2 neighbours that an egress IP now lives at
// this Node's MAC address: a gratuitous ARP for IPv4 and an unsolicited
// Neighbor Advertisement for IPv6, each in a short burst after binding and,
// optionally, periodically afterwards.
//
// # IPv4: gratuitous ARP
//
// The packet is an ARP Announcement as defined by RFC 5227 section 2.3: an
// ARP *request* broadcast to ff:ff:ff:ff:ff:ff with sender IP = target IP =
// the egress IP, sender hardware address = the interface MAC and target
// hardware address zero. RFC 5944 section 4.6 allows a request or a reply
// for a gratuitous ARP; the request is used because RFC 5227 section 3
// chooses it for announcements: RFC 826's receive path updates an existing
// cache entry for the sender from either, but a request is broadcast by
// definition while a broadcast reply is unusual and not handled alike by
// every stack. Linux with the default arp_accept=0 updates existing entries
// from it (the tests check this). Only IPv4 egress IPs get ARP.
//
// # IPv6: unsolicited Neighbor Advertisement
//
// RFC 4861 section 7.2.6: a Neighbor Advertisement to the all-nodes
// multicast address ff02::1 with the Override flag set and Solicited clear,
// Target Address = the egress IP and a Target Link-Layer Address option with
// the interface MAC, hop limit 255. The source is the interface's link-local
// address (chosen explicitly, not "the first address", so a Node whose
// global address is listed first still sends from fe80::/10); when the
// interface has no usable link-local address the egress IP itself is used,
// which is also an address assigned to the interface. Only IPv6 egress IPs
// get NA.
//
// Sending needs CAP_NET_RAW (an AF_PACKET socket for ARP, a raw ICMPv6
// socket for NDP) in the namespace of the interface.
//
// Sockets are opened per announcement and closed straight away; they are
// bound so that they receive nothing (a drop-all BPF filter for ARP, an
// ICMPv6 filter blocking every type for NDP).
package announce

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
	"github.com/mdlayher/packet"
	"github.com/vishvananda/netns"
	"golang.org/x/net/bpf"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"

	"github.com/egressip/egressip/internal/agent/nsrun"
)

// DefaultSchedule is the burst sent after an IP is bound: at once, then after
// 1, 2 and 4 seconds (offsets from the start of the burst).
var DefaultSchedule = []time.Duration{0, time.Second, 2 * time.Second, 4 * time.Second}

// Family of an announcement.
type Family int

const (
	// IPv4 announcements are gratuitous ARP requests.
	IPv4 Family = 4
	// IPv6 announcements are unsolicited Neighbor Advertisements.
	IPv6 Family = 6
)

func (f Family) String() string {
	switch f {
	case IPv4:
		return "ipv4"
	case IPv6:
		return "ipv6"
	}
	return fmt.Sprintf("Family(%d)", int(f))
}

// Event describes one announcement attempt, for logging and metrics.
type Event struct {
	IP        netip.Addr
	Interface string
	Family    Family
	Err       error // nil when the packet was sent
	Time      time.Time
}

// Config configures an Announcer. The zero value is usable.
type Config struct {
	// Schedule lists the offsets, from the start of a burst, at which to
	// announce. nil means DefaultSchedule; offsets are sorted.
	Schedule []time.Duration
	// Refresh, when > 0, re-announces every Refresh after the burst for as
	// long as the announcement runs. Off by default.
	Refresh time.Duration
	// OnEvent, when set, is called synchronously after every attempt.
	OnEvent func(Event)
}

// Stats are cumulative counters.
type Stats struct {
	ARPSent, NASent     uint64
	ARPErrors, NAErrors uint64
}

// Announcer sends announcements. It is safe for concurrent use.
type Announcer struct {
	ns       netns.NsHandle
	schedule []time.Duration
	refresh  time.Duration
	onEvent  func(Event)

	arpSent, naSent, arpErrs, naErrs atomic.Uint64

	mu      sync.Mutex
	running map[netip.Addr]*run
	wg      sync.WaitGroup
	closed  bool
}

type run struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// New returns an Announcer sending in network namespace ns; pass
// netns.None() for the caller's namespace (the agent's host namespace). A
// namespace handle is duplicated, so the caller may close its own.
func New(ns netns.NsHandle, cfg Config) (*Announcer, error) {
	a := &Announcer{
		ns:       netns.None(),
		schedule: append([]time.Duration(nil), cfg.Schedule...),
		refresh:  cfg.Refresh,
		onEvent:  cfg.OnEvent,
		running:  map[netip.Addr]*run{},
	}
	if cfg.Schedule == nil {
		a.schedule = append([]time.Duration(nil), DefaultSchedule...)
	}
	for _, d := range a.schedule {
		if d < 0 {
			return nil, fmt.Errorf("announce: negative schedule offset %s", d)
		}
	}
	slices.Sort(a.schedule)
	if cfg.Refresh < 0 {
		return nil, fmt.Errorf("announce: negative refresh interval %s", cfg.Refresh)
	}
	if ns.IsOpen() {
		fd, err := unix.Dup(int(ns))
		if err != nil {
			return nil, fmt.Errorf("announce: duplicate netns handle: %w", err)
		}
		a.ns = netns.NsHandle(fd)
	}
	return a, nil
}

// Stats returns a snapshot of the counters.
func (a *Announcer) Stats() Stats {
	return Stats{
		ARPSent: a.arpSent.Load(), NASent: a.naSent.Load(),
		ARPErrors: a.arpErrs.Load(), NAErrors: a.naErrs.Load(),
	}
}

// Send sends one announcement for ip on interface ifname: a gratuitous ARP
// for IPv4, an unsolicited NA for IPv6. It counts and reports the attempt.
func (a *Announcer) Send(ip netip.Addr, ifname string) error {
	ip = ip.Unmap()
	fam := IPv6
	if ip.Is4() {
		fam = IPv4
	}
	var err error
	if !ip.IsValid() || ip.Zone() != "" {
		err = fmt.Errorf("announce %v on %s: invalid IP", ip, ifname)
	} else {
		err = a.inNetNS(func() error {
			ifi, err := net.InterfaceByName(ifname)
			if err != nil {
				return err
			}
			if fam == IPv4 {
				return sendGARP(ifi, ip)
			}
			return sendNA(ifi, ip)
		})
		if err != nil {
			err = fmt.Errorf("announce %s on %s: %w", ip, ifname, err)
		}
	}
	switch {
	case fam == IPv4 && err == nil:
		a.arpSent.Add(1)
	case fam == IPv4:
		a.arpErrs.Add(1)
	case err == nil:
		a.naSent.Add(1)
	default:
		a.naErrs.Add(1)
	}
	if a.onEvent != nil {
		a.onEvent(Event{IP: ip, Interface: ifname, Family: fam, Err: err, Time: time.Now()})
	}
	return err
}

// inNetNS runs fn in the Announcer's namespace. For a namespace other than
// the caller's, fn runs on a locked OS thread that is discarded afterwards,
// so no other goroutine ever inherits the namespace switch.
func (a *Announcer) inNetNS(fn func() error) error { return nsrun.In(a.ns, fn) }

// dropAll is a classic BPF program accepting no packet: the ARP socket only
// sends.
var dropAll = func() []bpf.RawInstruction {
	raw, err := bpf.Assemble([]bpf.Instruction{bpf.RetConstant{Val: 0}})
	if err != nil {
		panic(err)
	}
	return raw
}()

func sendGARP(ifi *net.Interface, ip netip.Addr) error {
	if len(ifi.HardwareAddr) != 6 {
		return fmt.Errorf("interface has no Ethernet address (%q)", ifi.HardwareAddr)
	}
	p, err := arp.NewPacket(arp.OperationRequest, ifi.HardwareAddr, ip, make(net.HardwareAddr, 6), ip)
	if err != nil {
		return err
	}
	payload, err := p.MarshalBinary()
	if err != nil {
		return err
	}
	frame, err := (&ethernet.Frame{
		Destination: ethernet.Broadcast,
		Source:      ifi.HardwareAddr,
		EtherType:   ethernet.EtherTypeARP,
		Payload:     payload,
	}).MarshalBinary()
	if err != nil {
		return err
	}
	c, err := packet.Listen(ifi, packet.Raw, int(ethernet.EtherTypeARP), &packet.Config{Filter: dropAll})
	if err != nil {
		return err
	}
	// Closing an AF_PACKET socket waits for an RCU grace period
	// (synchronize_net), often 5-15 ms; do not make the caller wait for it.
	defer func() { go func() { _ = c.Close() }() }() // nothing to do if the close fails
	_, err = c.WriteTo(frame, &packet.Addr{HardwareAddr: ethernet.Broadcast})
	return err
}

func sendNA(ifi *net.Interface, ip netip.Addr) error {
	if len(ifi.HardwareAddr) == 0 {
		return errors.New("interface has no link-layer address")
	}
	c, _, err := ndp.Listen(ifi, ndp.LinkLocal)
	if err != nil {
		// No (non-tentative) link-local address: send from the egress IP,
		// which is assigned to the interface and, bound with nodad, usable.
		var err2 error
		c, _, err2 = ndp.Listen(ifi, ndp.Addr(ip.String()))
		if err2 != nil {
			return fmt.Errorf("open NDP socket: link-local source: %v; egress IP source: %w", err, err2)
		}
	}
	defer func() { _ = c.Close() }() // the NA was sent or failed already
	var block ipv6.ICMPFilter
	block.SetAll(true)
	if err := c.SetICMPFilter(&block); err != nil {
		return err
	}
	na := &ndp.NeighborAdvertisement{
		Router:        false,
		Solicited:     false,
		Override:      true,
		TargetAddress: ip,
		Options: []ndp.Option{&ndp.LinkLayerAddress{
			Direction: ndp.Target,
			Addr:      ifi.HardwareAddr,
		}},
	}
	// A nil control message uses the Conn's default: hop limit 255, the
	// chosen source address, this interface.
	return c.WriteTo(na, nil, netip.IPv6LinkLocalAllNodes())
}

// Announce runs the burst for ip on ifname, then, when Refresh is set,
// re-announces until ctx is done. It blocks. It returns ctx's error when
// cancelled; otherwise nil if at least one announcement went out, else the
// last error.
func (a *Announcer) Announce(ctx context.Context, ip netip.Addr, ifname string) error {
	start := time.Now()
	var lastErr error
	sent := false
	try := func() {
		if err := a.Send(ip, ifname); err != nil {
			lastErr = err
		} else {
			sent = true
		}
	}
	for _, off := range a.schedule {
		if err := sleepUntil(ctx, start.Add(off)); err != nil {
			return err
		}
		try()
	}
	if a.refresh > 0 {
		t := time.NewTicker(a.refresh)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-t.C:
				try()
			}
		}
	}
	if sent || lastErr == nil {
		return nil
	}
	return lastErr
}

func sleepUntil(ctx context.Context, at time.Time) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d := time.Until(at)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Start runs Announce for ip in the background, replacing (and cancelling)
// a run already going for the same IP, so calling Start again restarts the
// burst, e.g. after the IP moved to another interface. The new run begins
// once the replaced one has returned. It is a no-op after Close.
func (a *Announcer) Start(ip netip.Addr, ifname string) {
	ip = ip.Unmap()
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return
	}
	var prev <-chan struct{}
	if old := a.running[ip]; old != nil {
		old.cancel()
		prev = old.done
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &run{cancel: cancel, done: make(chan struct{})}
	a.running[ip] = r
	a.wg.Go(func() {
		defer close(r.done)
		// The replaced run may be inside a send; wait for it so that runs for
		// one IP never overlap and Stop's wait covers every run it replaced.
		if prev != nil {
			<-prev
		}
		_ = a.Announce(ctx, ip, ifname) // outcomes go to the counters and OnEvent
		a.mu.Lock()
		if a.running[ip] == r {
			delete(a.running, ip)
		}
		a.mu.Unlock()
		cancel()
	})
}

// Stop cancels the background announcements for ip and waits for them to end.
func (a *Announcer) Stop(ip netip.Addr) {
	ip = ip.Unmap()
	a.mu.Lock()
	r := a.running[ip]
	delete(a.running, ip)
	a.mu.Unlock()
	if r != nil {
		r.cancel()
		<-r.done
	}
}

// Running lists the IPs with background announcements in progress.
func (a *Announcer) Running() []netip.Addr {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]netip.Addr, 0, len(a.running))
	for ip := range a.running {
		out = append(out, ip)
	}
	return out
}

// Close stops every background run, waits for them and releases the
// namespace handle.
func (a *Announcer) Close() error {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return nil
	}
	a.closed = true
	for ip, r := range a.running {
		r.cancel()
		delete(a.running, ip)
	}
	a.mu.Unlock()
	a.wg.Wait()
	if a.ns.IsOpen() {
		return a.ns.Close()
	}
	return nil
}
