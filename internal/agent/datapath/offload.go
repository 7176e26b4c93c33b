package datapath

import (
	"errors"
	"fmt"
	"slices"

	"github.com/safchain/ethtool"
	"github.com/vishvananda/netlink"
)

// TunnelFeatures are the ethtool features (the kernel's
// netdev_features_strings names) that the agent keeps on for the tunnel
// device: checked when the device is created and then at most once per
// offloadCheckInterval, after an Apply's routes and table are written. The kernel turns them all on for a new VXLAN
// device, but a udev or NetworkManager policy that applies to every new
// link can turn them off, and the tunnel then costs several times more:
// measured in the test/datapath harness, bulk TCP through a tunnel device
// without TSO and GSO needed 4.6 to 5.3 CPU-seconds per GB instead of 0.9
// (docs/datapath.md, "Tunnel throughput").
//
//   - tx-tcp-segmentation, tx-tcp6-segmentation, tx-generic-segmentation:
//     a forwarded TCP super-packet (GSO, up to 64 KiB) enters the tunnel
//     whole and is encapsulated once; without them the kernel cuts it into
//     MSS-sized packets before the tunnel and each one is encapsulated,
//     routed and filtered on its own.
//   - tx-scatter-gather and tx-checksum-ip-generic: the kernel keeps
//     segmentation offloads off without them (netdev_fix_features).
//   - rx-gro: decapsulated packets go through the device's GRO cells,
//     which aggregate the inner TCP segments again when the uplink handed
//     over MTU-sized packets (a NIC or kernel without UDP-tunnel GRO).
//   - rx-checksum: the inner checksum validated with the outer one is
//     not checked again.
var TunnelFeatures = []string{
	"tx-scatter-gather",
	"tx-checksum-ip-generic",
	"tx-generic-segmentation",
	"tx-tcp-segmentation",
	"tx-tcp6-segmentation",
	"rx-gro",
	"rx-checksum",
}

// TunnelMinOffloadSize is the smallest GSO and GRO maximum size in bytes
// the agent leaves on the tunnel device: 65536, the kernel's default
// (GSO_LEGACY_MAX_SIZE). A smaller IFLA_GSO_MAX_SIZE or IFLA_GRO_MAX_SIZE
// (ip link set DEV gso_max_size N) makes the kernel cut or stop
// aggregating super-packets at that size. Larger values (BIG TCP) are left
// as they are.
const TunnelMinOffloadSize = 65536

// ensureOffloads turns on the TunnelFeatures of the device name that are
// off and raises its GSO and GRO maximum sizes to TunnelMinOffloadSize.
// It must run in the device's namespace (ethtool ioctls act on the
// calling thread's namespace); h is a netlink handle of that namespace.
// It fails when a feature cannot be read, set or stays off after being
// set (the kernel can refuse, e.g. "fixed" features), or when a size
// cannot be set; the error names the features.
func ensureOffloads(h *netlink.Handle, name string) error {
	var errs []error
	e, err := ethtool.NewEthtool()
	if err != nil {
		return fmt.Errorf("ethtool socket: %w", err)
	}
	defer e.Close()
	have, err := e.Features(name)
	if err != nil {
		return fmt.Errorf("read features of %s: %w", name, err)
	}
	var off []string
	want := map[string]bool{}
	for _, f := range TunnelFeatures {
		if on, ok := have[f]; ok && !on {
			off = append(off, f)
			want[f] = true
		}
	}
	if len(off) > 0 {
		if err := e.Change(name, want); err != nil {
			errs = append(errs, fmt.Errorf("turn on %v on %s: %w", off, name, err))
		} else if have, err = e.Features(name); err != nil {
			errs = append(errs, fmt.Errorf("read features of %s: %w", name, err))
		} else if still := slices.DeleteFunc(off, func(f string) bool { return have[f] }); len(still) > 0 {
			errs = append(errs, fmt.Errorf("features %v of %s stay off", still, name))
		}
	}
	l, err := h.LinkByName(name)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("find tunnel device %s: %w", name, err))...)
	}
	if a := l.Attrs(); a.GSOMaxSize != 0 && a.GSOMaxSize < TunnelMinOffloadSize {
		if err := h.LinkSetGSOMaxSize(l, TunnelMinOffloadSize); err != nil {
			errs = append(errs, fmt.Errorf("set gso_max_size of %s: %w", name, err))
		}
	}
	if a := l.Attrs(); a.GROMaxSize != 0 && a.GROMaxSize < TunnelMinOffloadSize {
		if err := h.LinkSetGROMaxSize(l, TunnelMinOffloadSize); err != nil {
			errs = append(errs, fmt.Errorf("set gro_max_size of %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
