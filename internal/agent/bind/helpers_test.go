package bind_test

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"syscall"
	"testing"

	"github.com/egressip/egressip/internal/agent/bind"
	"github.com/egressip/egressip/internal/testutil/netnstest"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// seenAddr is an address as decoded by the test's own minimal rtnetlink
// parser (syscall.NetlinkRIB), independent of the package's codec.
type seenAddr struct {
	IP        netip.Addr
	PrefixLen int
	LinkIndex int
	Flags     uint32
	Proto     uint8
	Scope     uint8
	// Valid and Preferred are the remaining lifetimes in seconds
	// (IFA_CACHEINFO; 0xffffffff: forever).
	Valid, Preferred uint32
}

func (a seenAddr) has(flag uint32) bool { return a.Flags&flag != 0 }

// dumpAddrs lists every address in the namespace.
func dumpAddrs(t *testing.T, ns *netnstest.NS) []seenAddr {
	t.Helper()
	var out []seenAddr
	err := ns.Do(func() error {
		rib, err := syscall.NetlinkRIB(syscall.RTM_GETADDR, syscall.AF_UNSPEC)
		if err != nil {
			return err
		}
		msgs, err := syscall.ParseNetlinkMessage(rib)
		if err != nil {
			return err
		}
		for _, m := range msgs {
			if m.Header.Type != syscall.RTM_NEWADDR {
				continue
			}
			ifa := m.Data[:syscall.SizeofIfAddrmsg]
			a := seenAddr{
				PrefixLen: int(ifa[1]),
				Flags:     uint32(ifa[2]),
				Scope:     ifa[3],
				LinkIndex: int(binary.NativeEndian.Uint32(ifa[4:8])),
			}
			attrs, err := syscall.ParseNetlinkRouteAttr(&m)
			if err != nil {
				return err
			}
			var local, address []byte
			for _, at := range attrs {
				switch at.Attr.Type {
				case syscall.IFA_LOCAL:
					local = at.Value
				case syscall.IFA_ADDRESS:
					address = at.Value
				case unix.IFA_FLAGS:
					a.Flags = binary.NativeEndian.Uint32(at.Value[:4])
				case 11: // IFA_PROTO
					a.Proto = at.Value[0]
				case unix.IFA_CACHEINFO: // struct ifa_cacheinfo: preferred, valid, cstamp, tstamp
					a.Preferred = binary.NativeEndian.Uint32(at.Value[0:4])
					a.Valid = binary.NativeEndian.Uint32(at.Value[4:8])
				}
			}
			if local == nil {
				local = address
			}
			a.IP, _ = netip.AddrFromSlice(local)
			out = append(out, a)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("dump addresses in %s: %v", ns.Name, err)
	}
	return out
}

func findAddr(addrs []seenAddr, ip netip.Addr) (seenAddr, bool) {
	for _, a := range addrs {
		if a.IP == ip {
			return a, true
		}
	}
	return seenAddr{}, false
}

func mustAddr(t *testing.T, ns *netnstest.NS, ip netip.Addr) seenAddr {
	t.Helper()
	a, ok := findAddr(dumpAddrs(t, ns), ip)
	if !ok {
		t.Fatalf("%s not present in %s", ip, ns.Name)
	}
	return a
}

func mustAbsent(t *testing.T, ns *netnstest.NS, ip netip.Addr) {
	t.Helper()
	if a, ok := findAddr(dumpAddrs(t, ns), ip); ok {
		t.Fatalf("%s still present in %s: %+v", ip, ns.Name, a)
	}
}

func newBinder(t *testing.T, ns *netnstest.NS, cfg bind.Config) *bind.Binder {
	t.Helper()
	b, err := bind.New(ns.Handle, cfg)
	if err != nil {
		t.Fatalf("bind.New: %v", err)
	}
	t.Cleanup(b.Close)
	return b
}

func mustBind(t *testing.T, b *bind.Binder, ip netip.Addr) {
	t.Helper()
	if _, err := b.Bind(ip); err != nil {
		t.Fatalf("Bind(%s): %v", ip, err)
	}
}

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParseAddr(s)
	}
	return out
}

// routeSnapshot renders the main table's routes, for before/after
// comparisons.
func routeSnapshot(t *testing.T, ns *netnstest.NS) []string {
	t.Helper()
	h := ns.Netlink(t)
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		t.Fatalf("list routes: %v", err)
	}
	var out []string
	for _, r := range routes {
		out = append(out, r.String())
	}
	slices.Sort(out)
	return out
}
