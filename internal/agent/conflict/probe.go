package conflict

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/packet"
	"github.com/vishvananda/netns"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"

	"github.com/egressip/egressip/internal/agent/nsrun"
)

// Defaults of ProbeConfig.
const (
	// DefaultProbes is how many probes a round sends per IP.
	DefaultProbes = 2
	// DefaultSpacing is the time between two probes of a round.
	DefaultSpacing = 200 * time.Millisecond
	// DefaultWait is how long a round listens after its last probe.
	DefaultWait = 500 * time.Millisecond
)

// ProbeConfig shapes one probe round. Zero fields take the defaults.
// RFC 5227 section 2.1.1 sends 3 probes 1-2 s apart before first use of an
// address; these rounds check addresses in use, repeatedly, so they are
// shorter, and one lost answer is caught by the next round.
type ProbeConfig struct {
	// Probes per IP and round (DefaultProbes).
	Probes int
	// Spacing between the probes of a round (DefaultSpacing).
	Spacing time.Duration
	// Wait after the last probe (DefaultWait).
	Wait time.Duration
}

// Or returns c with each zero field taken from d.
func (c ProbeConfig) Or(d ProbeConfig) ProbeConfig {
	if c.Probes <= 0 {
		c.Probes = d.Probes
	}
	if c.Spacing <= 0 {
		c.Spacing = d.Spacing
	}
	if c.Wait <= 0 {
		c.Wait = d.Wait
	}
	return c
}

func (c ProbeConfig) withDefaults() ProbeConfig {
	return c.Or(ProbeConfig{Probes: DefaultProbes, Spacing: DefaultSpacing, Wait: DefaultWait})
}

// Prober sends probe rounds in one network namespace. It is safe for
// concurrent use; rounds on the same interface and family should not
// overlap (each would see the other's probes, which carry our own MAC and
// are ignored, so results stay right).
type Prober struct {
	ns  netns.NsHandle
	cfg ProbeConfig
}

// NewProber returns a Prober for namespace ns (netns.None(): the caller's);
// the handle is duplicated, so the caller may close its own. Close it when
// done.
func NewProber(ns netns.NsHandle, cfg ProbeConfig) (*Prober, error) {
	p := &Prober{ns: netns.None(), cfg: cfg.withDefaults()}
	if ns.IsOpen() {
		fd, err := unix.Dup(int(ns))
		if err != nil {
			return nil, fmt.Errorf("conflict: duplicate netns handle: %w", err)
		}
		p.ns = netns.NsHandle(fd)
	}
	return p, nil
}

// Close releases the namespace handle.
func (p *Prober) Close() error {
	if p.ns.IsOpen() {
		return p.ns.Close()
	}
	return nil
}

// inNetNS runs fn in the Prober's namespace, on a locked OS thread that is
// discarded afterwards when that namespace is not the caller's; sockets fn
// opens stay in the namespace.
func (p *Prober) inNetNS(fn func() error) error { return nsrun.In(p.ns, fn) }

// OwnMACs returns the hardware addresses of every interface of the
// namespace, canonical (lower case), as the set Foreign takes.
func (p *Prober) OwnMACs() (map[string]bool, error) {
	var ifs []net.Interface
	if err := p.inNetNS(func() (err error) {
		ifs, err = net.Interfaces()
		return err
	}); err != nil {
		return nil, fmt.Errorf("conflict: list interfaces: %w", err)
	}
	own := map[string]bool{}
	for _, i := range ifs {
		if len(i.HardwareAddr) > 0 {
			own[strings.ToLower(i.HardwareAddr.String())] = true
		}
	}
	return own, nil
}

// naFilter is a classic BPF program for a packet socket of EtherType IPv6
// accepting only ICMPv6 (next header 58) Neighbor Advertisements (type
// 136) without extension headers: offsets from the Ethernet header.
var naFilter = func() []bpf.RawInstruction {
	raw, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 14 + 6, Size: 1},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: 58, SkipTrue: 3},
		bpf.LoadAbsolute{Off: 14 + ipv6HeaderLen, Size: 1},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: 136, SkipTrue: 1},
		bpf.RetConstant{Val: 0xffff},
		bpf.RetConstant{Val: 0},
	})
	if err != nil {
		panic(err)
	}
	return raw
}()

// Probe runs one round on interface ifname for ips (IPv4 and IPv6 mixed):
// each IP is probed ProbeConfig.Probes times, ProbeConfig.Spacing apart,
// and the interface is listened to until ProbeConfig.Wait after the last
// probe. It returns every claim seen for one of ips, our own included
// (filter with Foreign). It fails when the interface is missing or has no
// Ethernet address, or a socket cannot be opened or written (CAP_NET_RAW);
// ctx cancels the round.
func (p *Prober) Probe(ctx context.Context, ifname string, ips []netip.Addr) ([]Answer, error) {
	return p.ProbeWith(ctx, ifname, ips, p.cfg)
}

// ProbeWith is Probe with the round shaped by cfg (zero fields take the
// defaults) instead of the Prober's own ProbeConfig.
func (p *Prober) ProbeWith(ctx context.Context, ifname string, ips []netip.Addr, cfg ProbeConfig) ([]Answer, error) {
	cfg = cfg.withDefaults()
	var v4, v6 []netip.Addr
	for _, ip := range ips {
		if ip = ip.Unmap(); ip.Is4() {
			v4 = append(v4, ip)
		} else {
			v6 = append(v6, ip)
		}
	}
	var (
		ifi          *net.Interface
		arpC, ndpC   *packet.Conn
		arpFr, ndpFr [][]byte
	)
	err := p.inNetNS(func() error {
		var err error
		if ifi, err = net.InterfaceByName(ifname); err != nil {
			return err
		}
		if len(ifi.HardwareAddr) != 6 {
			return errNoEthernet
		}
		if len(v4) > 0 {
			if arpC, err = packet.Listen(ifi, packet.Raw, int(ethernet.EtherTypeARP), nil); err != nil {
				return fmt.Errorf("open ARP socket: %w", err)
			}
		}
		if len(v6) > 0 {
			if ndpC, err = packet.Listen(ifi, packet.Raw, int(etherTypeIPv6), &packet.Config{Filter: naFilter}); err != nil {
				return fmt.Errorf("open IPv6 packet socket: %w", err)
			}
		}
		return nil
	})
	conns := []*packet.Conn{arpC, ndpC}
	defer func() {
		for _, c := range conns {
			if c != nil {
				_ = c.Close()
			}
		}
	}()
	if err != nil {
		return nil, fmt.Errorf("probe on %s: %w", ifname, err)
	}
	for _, ip := range v4 {
		f, err := ARPProbe(ifi.HardwareAddr, ip)
		if err != nil {
			return nil, err
		}
		arpFr = append(arpFr, f)
	}
	for _, ip := range v6 {
		f, err := NSProbe(ifi.HardwareAddr, ip)
		if err != nil {
			return nil, err
		}
		ndpFr = append(ndpFr, f)
	}

	end := time.Now().Add(time.Duration(cfg.Probes-1)*cfg.Spacing + cfg.Wait)
	var (
		mu      sync.Mutex
		answers []Answer
		readers sync.WaitGroup
	)
	read := func(c *packet.Conn, parse func([]byte) (Answer, bool)) {
		buf := make([]byte, 1600)
		_ = c.SetReadDeadline(end)
		for {
			n, _, err := c.ReadFrom(buf)
			if err != nil {
				return // the deadline, or the socket closed by a cancel
			}
			if a, ok := parse(buf[:n]); ok {
				mu.Lock()
				answers = append(answers, a)
				mu.Unlock()
			}
		}
	}
	if arpC != nil {
		readers.Go(func() { read(arpC, ParseARP) })
	}
	if ndpC != nil {
		readers.Go(func() { read(ndpC, ParseNA) })
	}
	stop := context.AfterFunc(ctx, func() {
		for _, c := range conns {
			if c != nil {
				_ = c.SetReadDeadline(time.Now())
			}
		}
	})
	defer stop()

	var sendErr error
	for i := 0; i < cfg.Probes && ctx.Err() == nil; i++ {
		if i > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(cfg.Spacing):
			}
		}
		for _, f := range arpFr {
			if _, err := arpC.WriteTo(f, &packet.Addr{HardwareAddr: ethernet.Broadcast}); err != nil {
				sendErr = errors.Join(sendErr, err)
			}
		}
		for _, f := range ndpFr {
			if _, err := ndpC.WriteTo(f, &packet.Addr{HardwareAddr: f[:6]}); err != nil {
				sendErr = errors.Join(sendErr, err)
			}
		}
	}
	readers.Wait()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	mu.Lock()
	defer mu.Unlock()
	if sendErr != nil {
		return slices.Clone(answers), fmt.Errorf("probe on %s: send: %w", ifname, sendErr)
	}
	return slices.Clone(answers), nil
}

// AddressedMACs returns, sorted and canonical, the MACs of the
// namespace's interfaces that are up and have an IP address other than a
// link-local one (at most max): the ones another Node's probe can see
// answering. Interfaces without addresses (the host ends of Pod veths, for
// instance) are left out, so the list stays short.
func (p *Prober) AddressedMACs(maxMACs int) ([]string, error) {
	var out []string
	err := p.inNetNS(func() error {
		ifs, err := net.Interfaces()
		if err != nil {
			return err
		}
		for _, i := range ifs {
			if i.Flags&net.FlagUp == 0 || len(i.HardwareAddr) != 6 {
				continue
			}
			addrs, err := i.Addrs()
			if err != nil {
				continue
			}
			for _, a := range addrs {
				pfx, err := netip.ParsePrefix(a.String())
				if err == nil && !pfx.Addr().IsLinkLocalUnicast() && !pfx.Addr().IsLoopback() {
					out = append(out, strings.ToLower(i.HardwareAddr.String()))
					break
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("conflict: list interfaces: %w", err)
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) > maxMACs {
		out = out[:maxMACs]
	}
	return out, nil
}
