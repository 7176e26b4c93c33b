package datapath

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/safchain/ethtool"

	"github.com/egressip/egressip/internal/testutil/netnstest"
)

// tunnelFeatures reads the TunnelFeatures of egx in ns with ethtool.
func tunnelFeatures(t *testing.T, d *Datapath) map[string]bool {
	t.Helper()
	var got map[string]bool
	if err := inNetNS(d.ns, func() error {
		e, err := ethtool.NewEthtool()
		if err != nil {
			return err
		}
		defer e.Close()
		got, err = e.Features(d.cfg.TunnelDevice)
		return err
	}); err != nil {
		t.Fatalf("read features of %s: %v", d.cfg.TunnelDevice, err)
	}
	return got
}

// TestTunnelOffloads: the tunnel device comes up with segmentation and
// receive offloads on and 64 KiB GSO/GRO sizes, and an Apply once
// offloadCheckInterval has passed restores them after something else (a
// udev or NetworkManager policy) turned them off or lowered the sizes.
// Read back with ethtool and netlink.
func TestTunnelOffloads(t *testing.T) {
	netnstest.RequireRoot(t)
	ns := kernelNS(t)
	_, d := newKernelDatapath(t, ns)
	ctx := context.Background()
	check := func(when string) {
		t.Helper()
		got := tunnelFeatures(t, d)
		for _, f := range TunnelFeatures {
			if on, ok := got[f]; !ok || !on {
				t.Errorf("%s: feature %s of egx is %v (known %v), want on", when, f, on, ok)
			}
		}
		l, err := d.nl.LinkByName("egx")
		if err != nil {
			t.Fatal(err)
		}
		if a := l.Attrs(); a.GSOMaxSize < TunnelMinOffloadSize || a.GROMaxSize < TunnelMinOffloadSize {
			t.Errorf("%s: egx gso_max_size %d, gro_max_size %d, want at least %d", when, a.GSOMaxSize, a.GROMaxSize, TunnelMinOffloadSize)
		}
	}
	if err := d.Apply(ctx, sampleState()); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	check("after the first Apply")

	// Someone else turns the offloads off and shrinks the sizes.
	out, err := ns.IP("link", "set", "egx", "gso_max_size", "16384", "gro_max_size", "16384")
	if err != nil {
		t.Fatalf("shrink sizes: %v %s", err, out)
	}
	if err := inNetNS(d.ns, func() error {
		e, err := ethtool.NewEthtool()
		if err != nil {
			return err
		}
		defer e.Close()
		return e.Change("egx", map[string]bool{"rx-gro": false, "tx-tcp-segmentation": false, "tx-tcp6-segmentation": false, "tx-generic-segmentation": false})
	}); err != nil {
		t.Fatalf("turn offloads off: %v", err)
	}
	off := tunnelFeatures(t, d)
	if off["rx-gro"] || off["tx-tcp-segmentation"] || off["tx-generic-segmentation"] {
		t.Fatalf("offloads still on after turning them off: %v", off)
	}
	detail, _ := ns.IP("-d", "link", "show", "egx")
	if !strings.Contains(detail, "gso_max_size "+strconv.Itoa(16384)) {
		t.Fatalf("gso_max_size not lowered: %s", detail)
	}
	// Within offloadCheckInterval of the last check an Apply leaves the
	// device alone (the check is too costly for every failover Apply).
	if err := d.Apply(ctx, sampleState()); err != nil {
		t.Fatalf("second Apply: %v", err)
	}
	if got := tunnelFeatures(t, d); got["rx-gro"] {
		t.Fatalf("rx-gro turned on again within the check interval")
	}
	// Once the interval has passed, an Apply with an unchanged State
	// repairs the device.
	d.offloadsAt = d.offloadsAt.Add(-offloadCheckInterval)
	if err := d.Apply(ctx, sampleState()); err != nil {
		t.Fatalf("third Apply: %v", err)
	}
	check("after the repairing Apply")
	// A device created anew is checked at once, within the interval.
	last := d.offloadsAt
	if _, err := ns.IP("link", "del", "egx"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if err := d.Apply(ctx, sampleState()); err != nil {
		t.Fatalf("Apply after the device was deleted: %v", err)
	}
	if !d.offloadsAt.After(last) {
		t.Errorf("offloads of the new device not checked (last check %v, before %v)", d.offloadsAt, last)
	}
	check("after the device was created again")
}
