package agent

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent/bind"
)

// desiredState is what the Egresses assigned to a Node ask for.
type desiredState struct {
	// ips are the egress IPs to bind, sorted, without duplicates.
	ips []netip.Addr
	// want is ips as a set.
	want map[netip.Addr]bool
	// hints holds the pool's subnetInfo for every IP whose pool is known
	// and has one.
	hints map[netip.Addr]bind.Hint
	// skipped explains every Egress assigned to the Node that asks for
	// nothing usable (for the log).
	skipped []skippedEgress
}

type skippedEgress struct {
	name   string
	reason string
}

// computeDesired returns the egress IPs the Egresses assigned to node ask
// for. Egresses naming another Node are ignored (the cache should not hold
// them; this is a second line of defence). An Egress being deleted still
// counts while its status names node. When several Egresses share an IP the
// hint comes from the first by name that has one, so the result does not
// depend on the order of egs.
func computeDesired(node string, egs []v1alpha1.Egress, pools []v1alpha1.ExternalIPPool) desiredState {
	byName := make(map[string]*v1alpha1.ExternalIPPool, len(pools))
	for i := range pools {
		byName[pools[i].Name] = &pools[i]
	}
	sorted := make([]*v1alpha1.Egress, 0, len(egs))
	for i := range egs {
		sorted = append(sorted, &egs[i])
	}
	slices.SortFunc(sorted, func(a, b *v1alpha1.Egress) int { return strings.Compare(a.Name, b.Name) })

	d := desiredState{want: map[netip.Addr]bool{}, hints: map[netip.Addr]bind.Hint{}}
	for _, eg := range sorted {
		if eg.Status.EgressNode != node || eg.Status.EgressIP == "" {
			continue
		}
		ip, err := netip.ParseAddr(eg.Status.EgressIP)
		if err != nil || ip.Zone() != "" {
			d.skipped = append(d.skipped, skippedEgress{eg.Name, fmt.Sprintf("status.egressIP %q is not an IP address", eg.Status.EgressIP)})
			continue
		}
		ip = ip.Unmap()
		if !d.want[ip] {
			d.want[ip] = true
			d.ips = append(d.ips, ip)
		}
		if _, ok := d.hints[ip]; ok {
			continue
		}
		h, ok := poolHint(byName[eg.Spec.ExternalIPPool], ip)
		if mac, err := net.ParseMAC(eg.Status.InterfaceMAC); err == nil && eg.Status.InterfaceMAC != "" {
			// A cloud-backed address: the cloud delivers it only to the
			// interface it is attached to.
			h.MAC, ok = mac.String(), true
		}
		if ok {
			d.hints[ip] = h
		}
	}
	slices.SortFunc(d.ips, netip.Addr.Compare)
	return d
}

// poolHint turns a pool's subnetInfo into an interface selection hint for
// ip. It reports false when the pool is unknown, has no subnetInfo, or its
// gateway is not an address of ip's family.
func poolHint(pool *v1alpha1.ExternalIPPool, ip netip.Addr) (bind.Hint, bool) {
	if pool == nil || pool.Spec.SubnetInfo == nil {
		return bind.Hint{}, false
	}
	si := pool.Spec.SubnetInfo
	gw, err := netip.ParseAddr(si.Gateway)
	if err != nil {
		return bind.Hint{}, false
	}
	gw = gw.Unmap()
	if gw.Is4() != ip.Is4() || si.PrefixLength < 0 || int(si.PrefixLength) > gw.BitLen() {
		return bind.Hint{}, false
	}
	return bind.Hint{
		Subnet: netip.PrefixFrom(gw, int(si.PrefixLength)).Masked(),
		VLAN:   int(si.VLAN),
	}, true
}
