package bind

import (
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/vishvananda/netlink"
)

// NICs returns the hardware addresses of the namespace's network devices
// (see DeviceMACs), in any state, at most maxMACs. An interface a cloud
// attaches to the instance (an EC2 ENI, hot-plugged as a PCI device)
// shows up here as one more entry, and leaves when detached. Errors are
// those of listing the links.
func (b *Binder) NICs(maxMACs int) ([]string, error) {
	links, err := b.links.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	return DeviceMACs(links, maxMACs), nil
}

// DeviceMACs returns, lower case, sorted and without repeats, at most
// maxMACs, the 6-byte hardware addresses of the links of type "device"
// other than loopback. "device" is the type netlink gives a link without
// an rtnl kind, that is one a NIC driver created (ena, ixgbevf, virtio_net,
// ...); virtual links (veth, bridge, bond, vlan, macvlan, vxlan, ...)
// have a kind and are left out, so Pods coming and going change nothing.
func DeviceMACs(links []netlink.Link, maxMACs int) []string {
	var out []string
	for _, l := range links {
		a := l.Attrs()
		if l.Type() != "device" || a.Flags&net.FlagLoopback != 0 || len(a.HardwareAddr) != 6 {
			continue
		}
		out = append(out, strings.ToLower(a.HardwareAddr.String()))
	}
	slices.Sort(out)
	out = slices.Compact(out)
	if len(out) > maxMACs {
		out = out[:maxMACs]
	}
	return out
}
