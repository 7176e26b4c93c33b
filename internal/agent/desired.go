package agent

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"unicode/utf8"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent/bind"
	"github.com/egressip/egressip/internal/ipam"
	"github.com/egressip/egressip/internal/poolspec"
	"github.com/egressip/egressip/internal/report"
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
	// refused are the IPs of skipped Egresses that no other Egress asks
	// for validly, with the Egresses and why (for the report), sorted by
	// IP.
	refused []report.RefusedIP
}

type skippedEgress struct {
	name   string
	ip     netip.Addr // zero when status.egressIP is not an address
	reason string
}

// computeDesired returns the egress IPs the Egresses assigned to node ask
// for: status.egressIP of single-IP Egresses whose status.egressNode is
// node, and every status.ips[i].ip whose node is node of Egresses with
// spec.ips (candidates). Egresses naming another Node are ignored (the cache should not hold
// them; this is a second line of defence). An Egress being deleted still
// counts while its status names node. An Egress whose status.egressIP is
// not what its allocation allows (statusAllowed: in its pool, equal to a
// named spec.egressIP, attached by the cloud) is skipped and its IP
// refused, whoever wrote the status (issue 15 fault 3). When several
// Egresses share an IP the hint comes from the first by name that has one,
// so the result does not depend on the order of egs.
func computeDesired(node string, egs []v1alpha1.Egress, pools []v1alpha1.ExternalIPPool) desiredState {
	byName := make(map[string]*v1alpha1.ExternalIPPool, len(pools))
	for i := range pools {
		byName[pools[i].Name] = &pools[i]
	}
	parsed := map[string]parsedPool{}
	sorted := make([]*v1alpha1.Egress, 0, len(egs))
	for i := range egs {
		sorted = append(sorted, &egs[i])
	}
	slices.SortFunc(sorted, func(a, b *v1alpha1.Egress) int { return strings.Compare(a.Name, b.Name) })

	d := desiredState{want: map[netip.Addr]bool{}, hints: map[netip.Addr]bind.Hint{}}
	for _, eg := range sorted {
		for _, c := range candidates(node, eg, byName, parsed) {
			if c.why != "" {
				d.skipped = append(d.skipped, skippedEgress{eg.Name, c.ip, c.why})
				continue
			}
			ip := c.ip
			if !d.want[ip] {
				d.want[ip] = true
				d.ips = append(d.ips, ip)
			}
			if _, ok := d.hints[ip]; ok {
				continue
			}
			h, ok := poolHint(byName[c.pool], ip)
			if mac, err := net.ParseMAC(c.mac); err == nil && c.mac != "" {
				// A cloud-backed address: the cloud delivers it only to the
				// interface it is attached to.
				h.MAC, ok = mac.String(), true
			}
			if ok {
				d.hints[ip] = h
			}
		}
	}
	slices.SortFunc(d.ips, netip.Addr.Compare)
	d.refused = refusals(d.skipped, d.want)
	return d
}

// candidate is one IP an Egress's status assigns to a Node: its pool and
// interface MAC (cloud pools), and why it is refused ("" when allowed; ip
// is zero when the status does not hold an address).
type candidate struct {
	ip       netip.Addr
	pool     string
	mac, why string
}

// candidates returns the IPs eg's status assigns to node. A single-IP
// Egress (no spec.ips) assigns status.egressIP when status.egressNode is
// node, checked by statusAllowed; an Egress with spec.ips assigns every
// status.ips entry whose node is node, each checked against its own pool
// (multiEntryAllowed); its status.egressIP/egressNode only repeat one
// entry and are not read.
func candidates(node string, eg *v1alpha1.Egress, byName map[string]*v1alpha1.ExternalIPPool, parsed map[string]parsedPool) []candidate {
	if len(eg.Spec.IPs) > 0 {
		var out []candidate
		for _, i := range heldEntries(node, eg) {
			e := eg.Status.IPs[i]
			ip, err := netip.ParseAddr(e.IP)
			if err != nil || ip.Zone() != "" {
				out = append(out, candidate{why: fmt.Sprintf("status.ips[%d].ip %q is not an IP address", i, e.IP)})
				continue
			}
			ip = ip.Unmap()
			out = append(out, candidate{ip: ip, pool: e.Pool, mac: e.InterfaceMAC, why: multiEntryAllowed(eg, i, ip, byName, parsed)})
		}
		return out
	}
	if eg.Status.EgressNode != node || eg.Status.EgressIP == "" {
		return nil
	}
	ip, err := netip.ParseAddr(eg.Status.EgressIP)
	if err != nil || ip.Zone() != "" {
		return []candidate{{why: fmt.Sprintf("status.egressIP %q is not an IP address", eg.Status.EgressIP)}}
	}
	ip = ip.Unmap()
	return []candidate{{ip: ip, pool: eg.Spec.ExternalIPPool, mac: eg.Status.InterfaceMAC, why: statusAllowed(eg, ip, byName[eg.Spec.ExternalIPPool], parsed)}}
}

// parsedPool is a pool's spec as ipam reads it, parsed once per reconcile.
type parsedPool struct {
	pool *ipam.Pool // nil for a cloud pool without ipRanges, or on err
	err  error
}

// statusAllowed returns "" when eg's status.egressIP ip is an address its
// allocation allows, else why not (for the log and the report):
//   - the pool must be in the cache and valid;
//   - a named spec.egressIP must equal ip;
//   - ip must be one of the pool's allocatable addresses (ipam.Pool.Check:
//     in its ranges, not reserved, not special-purpose);
//   - for a cloud-backed pool without ranges, status.interfaceMAC must be
//     set: the controller writes it once the cloud attached ip to this
//     Node's interface.
//
// Node addresses are the controller's to exclude: the agent does not know
// the other Nodes', and its own are already on the Node (bind refuses them
// as foreign).
func statusAllowed(eg *v1alpha1.Egress, ip netip.Addr, pool *v1alpha1.ExternalIPPool, parsed map[string]parsedPool) string {
	if pool == nil {
		return fmt.Sprintf("ExternalIPPool %q is not known to this agent, so status.egressIP %s cannot be checked against it", eg.Spec.ExternalIPPool, ip)
	}
	if eg.Spec.EgressIP != "" {
		if named, err := netip.ParseAddr(eg.Spec.EgressIP); err != nil || named.Unmap() != ip {
			return fmt.Sprintf("status.egressIP %s is not the address spec.egressIP names (%s)", ip, eg.Spec.EgressIP)
		}
	}
	if why := poolAllows(pool, ip, eg.Status.InterfaceMAC, parsed); why != "" {
		return "status.egressIP " + why
	}
	return ""
}

// poolAllows returns "" when ip is one of pool's allocatable addresses
// (ipam.Pool.Check: in its ranges, not reserved, not special-purpose), or,
// for a cloud-backed pool without ranges, when mac (the interfaceMAC the
// controller writes once the cloud attached ip to this Node's interface)
// is set; else why not, a phrase starting with the IP. parsed caches each
// pool's parse for one reconcile.
func poolAllows(pool *v1alpha1.ExternalIPPool, ip netip.Addr, mac string, parsed map[string]parsedPool) string {
	pp, ok := parsed[pool.Name]
	if !ok {
		if !isCloudOnly(pool) {
			pp.pool, pp.err = poolspec.Parse(pool)
		}
		parsed[pool.Name] = pp
	}
	switch {
	case pp.err != nil:
		return fmt.Sprintf("%s cannot be checked against ExternalIPPool %q: the pool is invalid (%v)", ip, pool.Name, pp.err)
	case pp.pool != nil:
		if err := pp.pool.Check(ip); err != nil {
			return fmt.Sprintf("%s cannot come from ExternalIPPool %q: %v", ip, pool.Name, err)
		}
	case mac == "":
		return fmt.Sprintf("%s of cloud-backed ExternalIPPool %q has no interfaceMAC: the cloud has not attached it to this Node", ip, pool.Name)
	}
	return ""
}

// refusals groups the skipped Egresses with a valid IP that no Egress asks
// for validly (want) by IP, sorted, each with the first reason by Egress
// name (skipped is in name order).
func refusals(skipped []skippedEgress, want map[netip.Addr]bool) []report.RefusedIP {
	byIP := map[netip.Addr]int{}
	var out []report.RefusedIP
	for _, s := range skipped {
		if !s.ip.IsValid() || want[s.ip] {
			continue
		}
		if i, ok := byIP[s.ip]; ok {
			out[i].Egresses = append(out[i].Egresses, s.name)
			continue
		}
		byIP[s.ip] = len(out)
		out = append(out, report.RefusedIP{IP: s.ip, Egresses: []string{s.name}, Message: truncate(s.reason, report.MaxRefusedMessage)})
	}
	slices.SortFunc(out, func(a, b report.RefusedIP) int { return a.IP.Compare(b.IP) })
	return out
}

// truncate cuts s to at most n bytes, on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
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
