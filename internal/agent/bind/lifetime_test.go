package bind_test

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/egressip/egressip/internal/agent/bind"
	"github.com/egressip/egressip/internal/testutil/netnstest"
)

const forever = 0xffffffff

// TestAddressLifetimeRenewAndExpiry binds with a 3 s valid lifetime, both
// modes of ownership (the IFA_PROTO mark, and the record alone), and
// checks what the kernel does on renewal (RTM_NEWADDR, NLM_F_REPLACE): the
// lifetime is reset, the mark, the scope (host for IPv4), the prefix
// length, the flags and IPv6's preferred lifetime 0 are kept, and no
// RTM_DELADDR is sent. Without renewal the kernel removes both addresses;
// the test measures when.
func TestAddressLifetimeRenewAndExpiry(t *testing.T) {
	for _, mode := range []bind.Ownership{bind.OwnershipAuto, bind.OwnershipRecord} {
		t.Run(string(mode), func(t *testing.T) {
			p := nodeWithSubnets(t)
			cfg := bind.Config{Lifetime: 3 * time.Second, Ownership: mode}
			if mode == bind.OwnershipRecord {
				cfg.RecordPath = t.TempDir() + "/ownership.json"
			}
			b := newBinder(t, p.Node, cfg)
			v4, v6 := netip.MustParseAddr("192.0.2.10"), netip.MustParseAddr("2001:db8::10")
			wantProto := bind.DefaultProto
			if mode == bind.OwnershipRecord {
				wantProto = 0
			}
			mustBind(t, b, v4)
			mustBind(t, b, v6)
			check := func(when string) {
				t.Helper()
				a4, a6 := mustAddr(t, p.Node, v4), mustAddr(t, p.Node, v6)
				if a4.Valid == forever || a4.Valid > 3 || a4.Preferred > a4.Valid || a4.Scope != unix.RT_SCOPE_HOST || a4.Proto != wantProto ||
					a4.PrefixLen != 32 || !a4.has(unix.IFA_F_NOPREFIXROUTE) || a4.has(unix.IFA_F_PERMANENT) {
					t.Errorf("%s: IPv4 %+v; want valid <= 3 s, scope host, proto %d, /32 noprefixroute", when, a4, wantProto)
				}
				if a6.Valid == forever || a6.Valid > 3 || a6.Preferred != 0 || !a6.has(unix.IFA_F_DEPRECATED) || a6.Proto != wantProto ||
					a6.PrefixLen != 128 || !a6.has(unix.IFA_F_NOPREFIXROUTE) || !a6.has(unix.IFA_F_NODAD) || a6.Scope != unix.RT_SCOPE_UNIVERSE {
					t.Errorf("%s: IPv6 %+v; want valid <= 3 s, preferred 0 (deprecated), proto %d, /128 noprefixroute nodad", when, a6, wantProto)
				}
			}
			check("after bind")

			// Renew every second for 5 s, longer than the lifetime.
			deletes := watchDeletes(t, p.Node)
			for range 5 {
				time.Sleep(time.Second)
				renewed, err := b.Renew()
				if err != nil {
					t.Fatalf("Renew: %v", err)
				}
				if slices.SortFunc(renewed, netip.Addr.Compare); !slices.Equal(renewed, []netip.Addr{v4, v6}) {
					t.Fatalf("Renew renewed %v; want %v and %v", renewed, v4, v6)
				}
				check("after a renewal")
				if a := mustAddr(t, p.Node, v4); a.Valid < 2 {
					t.Errorf("renewal did not reset the lifetime: %+v", a)
				}
			}
			if d := deletes(); len(d) > 0 {
				t.Fatalf("renewal deleted %v (the address must never leave the interface)", d)
			}
			owned, err := b.Owned()
			if err != nil || len(owned) != 2 {
				t.Fatalf("Owned() = %v, %v; want both, still ours", owned, err)
			}

			// No more renewals: the kernel removes both within the lifetime
			// plus its check granularity (the bound docs/failover.md states:
			// lifetime + 1 s).
			gone4, gone6 := waitExpired(t, p.Node, v4, v6)
			if gone4 > 4*time.Second || gone6 > 4*time.Second {
				t.Errorf("removed %v (IPv4) and %v (IPv6) after the last renewal; want at most lifetime + 1 s", gone4, gone6)
			}
			t.Logf("without renewal, the kernel removed IPv4 %v and IPv6 %v after the last renewal (lifetime 3 s)", gone4, gone6)
			if renewed, err := b.Renew(); err != nil || len(renewed) != 0 {
				t.Errorf("Renew after expiry = %v, %v; want nothing, no error", renewed, err)
			}
			// Sync binds them again.
			if _, _, err := b.Sync([]netip.Addr{v4, v6}); err != nil {
				t.Fatal(err)
			}
			check("bound again")
		})
	}
}

// waitExpired waits up to 8 s for v4 and v6 to leave ns and returns how
// long each took.
func waitExpired(t *testing.T, ns *netnstest.NS, v4, v6 netip.Addr) (gone4, gone6 time.Duration) {
	t.Helper()
	last := time.Now()
	for time.Since(last) < 8*time.Second && (gone4 == 0 || gone6 == 0) {
		as := dumpAddrs(t, ns)
		if _, ok := findAddr(as, v4); !ok && gone4 == 0 {
			gone4 = time.Since(last)
		}
		if _, ok := findAddr(as, v6); !ok && gone6 == 0 {
			gone6 = time.Since(last)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if gone4 == 0 || gone6 == 0 {
		t.Fatalf("not removed 8 s after the last renewal (IPv4 after %v, IPv6 after %v)", gone4, gone6)
	}
	return gone4, gone6
}

// TestAddressLifetimeZeroMakesPermanent: an agent run without a lifetime
// adopts addresses an agent with one bound, and Renew makes them
// permanent; bound forever, they keep IPv6's preferred lifetime 0.
func TestAddressLifetimeZeroMakesPermanent(t *testing.T) {
	p := nodeWithSubnets(t)
	v4, v6 := netip.MustParseAddr("192.0.2.11"), netip.MustParseAddr("2001:db8::11")
	b := newBinder(t, p.Node, bind.Config{Lifetime: 3 * time.Second})
	mustBind(t, b, v4)
	mustBind(t, b, v6)
	b2 := newBinder(t, p.Node, bind.Config{})
	renewed, err := b2.Renew()
	if err != nil || len(renewed) != 2 {
		t.Fatalf("Renew = %v, %v; want both", renewed, err)
	}
	a4, a6 := mustAddr(t, p.Node, v4), mustAddr(t, p.Node, v6)
	if a4.Valid != forever || !a4.has(unix.IFA_F_PERMANENT) || a4.Proto != bind.DefaultProto || a4.Scope != unix.RT_SCOPE_HOST {
		t.Errorf("IPv4 %+v; want permanent, marked, scope host", a4)
	}
	if a6.Valid != forever || a6.Preferred != 0 || a6.Proto != bind.DefaultProto {
		t.Errorf("IPv6 %+v; want valid forever, preferred 0, marked", a6)
	}
	if renewed, err := b2.Renew(); err != nil || len(renewed) != 0 {
		t.Errorf("second Renew = %v, %v; want nothing to do", renewed, err)
	}
}

func TestAddressLifetimeRejectsFractions(t *testing.T) {
	p := nodeWithSubnets(t)
	for _, l := range []time.Duration{-time.Second, 500 * time.Millisecond, 1500 * time.Millisecond} {
		if _, err := bind.New(p.Node.Handle, bind.Config{Lifetime: l}); err == nil {
			t.Errorf("lifetime %v accepted", l)
		}
	}
}
