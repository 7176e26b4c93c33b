package datapathsync

import (
	"cmp"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent/datapath"
	"github.com/egressip/egressip/internal/selection"
)

// CIDRs are the destinations that never take an egress path, as given by
// the agent's flags. A nil ClusterCIDRs means the Pod CIDRs of the Nodes
// (spec.podCIDRs).
type CIDRs struct {
	// ClusterCIDRs are the Pod CIDRs (--cluster-cidrs); nil: every Node's
	// spec.podCIDRs.
	ClusterCIDRs []netip.Prefix
	// ServiceCIDRs are the Service CIDRs (--service-cidrs); nil: the
	// cluster's networking.k8s.io/v1 ServiceCIDR objects, where served.
	ServiceCIDRs []netip.Prefix
	// ExcludeCIDRs are further destinations kept off egress paths
	// (--exclude-cidrs), for example a corporate network.
	ExcludeCIDRs []netip.Prefix
}

// stateInput is what one Node's datapath State is computed from, read from
// the agent's cache.
type stateInput struct {
	Node     string
	Egresses []v1alpha1.Egress
	Pools    []v1alpha1.ExternalIPPool
	// Namespaces are every namespace; Pods are this Node's Pods.
	Namespaces []corev1.Namespace
	Pods       []corev1.Pod
	// Slices are EgressMemberSlices; those of Egresses this Node does not
	// hold are ignored.
	Slices []v1alpha1.EgressMemberSlice
	Nodes  []corev1.Node
	CIDRs  CIDRs
}

// computeState returns the datapath State of in.Node, normalized (every
// list sorted and without duplicates) so equal States compare equal.
//
// Roles (see datapath.Role): RoleEgress when status.egressNode is this Node
// and status.egressIP is set, with the members of its EgressMemberSlices
// that do not run here as Remote; RoleSource when members run here and
// another Node holds the IP; RoleFailed when members run here and no Node
// or no IP is set. Egresses with RoleNone are left out. Local members are
// this Node's Pods the Egress wins by package selection; remote ones are
// trusted from the controller's slices.
func computeState(in stateInput) datapath.State {
	pools := make(map[string]*v1alpha1.ExternalIPPool, len(in.Pools))
	for i := range in.Pools {
		pools[in.Pools[i].Name] = &in.Pools[i]
	}
	var local []corev1.Pod
	for _, p := range in.Pods {
		if p.Spec.NodeName == in.Node {
			local = append(local, p)
		}
	}
	sel := selection.Select(selection.Input{
		Egresses: in.Egresses, Namespaces: in.Namespaces, Pods: local,
		Family: func(e *v1alpha1.Egress) selection.Family { return selection.EgressFamily(e, pools) },
	})

	var st datapath.State
	st.Pods = podsOf(local)
	myIPs := map[netip.Addr]bool{}
	for i := range in.Nodes {
		n := &in.Nodes[i]
		for _, a := range n.Status.Addresses {
			if a.Type != corev1.NodeInternalIP {
				continue
			}
			ip, err := netip.ParseAddr(a.Address)
			if err != nil {
				continue
			}
			st.NodeIPs = append(st.NodeIPs, ip.Unmap())
			if n.Name == in.Node {
				myIPs[ip.Unmap()] = true
				continue
			}
			pr := datapath.Peer{IP: ip.Unmap()}
			for _, c := range n.Spec.PodCIDRs {
				if p, err := netip.ParsePrefix(c); err == nil {
					pr.PodCIDRs = append(pr.PodCIDRs, p.Masked())
				}
			}
			if len(pr.PodCIDRs) > 0 {
				st.Peers = append(st.Peers, pr)
			}
		}
		if in.CIDRs.ClusterCIDRs == nil {
			for _, c := range n.Spec.PodCIDRs {
				if p, err := netip.ParsePrefix(c); err == nil {
					st.ClusterCIDRs = append(st.ClusterCIDRs, p)
				}
			}
		}
	}
	st.ClusterCIDRs = append(st.ClusterCIDRs, in.CIDRs.ClusterCIDRs...)
	st.ClusterCIDRs = append(st.ClusterCIDRs, in.CIDRs.ServiceCIDRs...)
	st.ClusterCIDRs = append(st.ClusterCIDRs, in.CIDRs.ExcludeCIDRs...)
	for i, p := range st.ClusterCIDRs {
		st.ClusterCIDRs[i] = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-unmapBits(p)).Masked()
	}
	slices.SortFunc(st.ClusterCIDRs, comparePrefix)
	st.ClusterCIDRs = slices.Compact(st.ClusterCIDRs)
	slices.SortFunc(st.Peers, func(a, b datapath.Peer) int { return a.IP.Compare(b.IP) })
	st.Peers = slices.CompactFunc(st.Peers, func(a, b datapath.Peer) bool { return a.IP == b.IP })
	slices.SortFunc(st.NodeIPs, netip.Addr.Compare)
	st.NodeIPs = slices.Compact(st.NodeIPs)

	slicesOf := map[string][]*v1alpha1.EgressMemberSlice{}
	for i := range in.Slices {
		s := &in.Slices[i]
		slicesOf[s.Egress] = append(slicesOf[s.Egress], s)
	}

	zone := nodeZone(in.Nodes, in.Node)
	for i := range in.Egresses {
		e := &in.Egresses[i]
		eg := datapath.Egress{Name: e.Name, FailurePolicy: datapath.FailurePolicyFail}
		if e.Spec.FailurePolicy == v1alpha1.FailurePolicyIgnore {
			eg.FailurePolicy = datapath.FailurePolicyIgnore
		}
		if ip, err := netip.ParseAddr(e.Status.EgressIP); err == nil && ip.Zone() == "" {
			eg.IP = ip.Unmap()
		}
		localSet := map[netip.Addr]bool{}
		for _, m := range sel.Members[e.Name] {
			if !localSet[m.PodIP] {
				localSet[m.PodIP] = true
				eg.Local = append(eg.Local, m.PodIP)
			}
		}
		held := eg.IP.IsValid() && e.Status.EgressNode == in.Node
		if len(e.Spec.IPs) > 0 {
			// Several IPs: status.ips, not the repeated egressIP/egressNode.
			eg.IP, held = netip.Addr{}, false
			eg.IPs = MultiIPs(e, in.Node, zone)
			for _, x := range eg.IPs {
				if x.Held {
					eg.IP, held = x.IP, true
				}
			}
		}
		switch {
		case held:
			eg.Role = datapath.RoleEgress
			eg.Remote = remoteMembers(slicesOf[e.Name], localSet, myIPs, eg.IP.Is4())
		case len(eg.Local) == 0:
			continue // RoleNone
		default:
			eg.Role, eg.Assigning = memberRole(e, eg.IPs, eg.IP)
		}
		slices.SortFunc(eg.Local, netip.Addr.Compare)
		slices.SortFunc(eg.Remote, func(a, b datapath.Member) int { return a.IP.Compare(b.IP) })
		st.Egresses = append(st.Egresses, eg)
	}
	slices.SortFunc(st.Egresses, func(a, b datapath.Egress) int { return strings.Compare(a.Name, b.Name) })
	byName := make(map[string]*v1alpha1.Egress, len(in.Egresses))
	for i := range in.Egresses {
		byName[in.Egresses[i].Name] = &in.Egresses[i]
	}
	st.Splits = splitsOf(sel, st.Egresses, byName)
	return st
}

// remoteMembers are the members of an Egress held here from its slices:
// parsable, of the Egress's family (v4), not running here (localSet, or a
// host IP of this Node, myIPs), each once.
func remoteMembers(ems []*v1alpha1.EgressMemberSlice, localSet, myIPs map[netip.Addr]bool, v4 bool) []datapath.Member {
	var out []datapath.Member
	seen := map[netip.Addr]bool{}
	for _, s := range ems {
		for _, m := range s.Members {
			pod, err1 := netip.ParseAddr(m.PodIP)
			host, err2 := netip.ParseAddr(m.HostIP)
			if err1 != nil || err2 != nil {
				continue
			}
			pod, host = pod.Unmap(), host.Unmap()
			if localSet[pod] || myIPs[host] || seen[pod] || pod.Is4() != v4 || host.Is4() != pod.Is4() {
				continue
			}
			seen[pod] = true
			out = append(out, datapath.Member{IP: pod, HostIP: host})
		}
	}
	return out
}

// memberRole is the role of an Egress on a Node where members run and
// which holds none of its IPs (ip: status.egressIP of a single-IP Egress;
// ips: the IPs of one with spec.ips), and whether it waits for its first
// assignment: RoleSource while another Node holds the IP (a usable one,
// for several IPs), else RoleFailed. Until the controller has written an
// IP or the Assigned condition once, the Egress is being assigned for the
// first time.
func memberRole(e *v1alpha1.Egress, ips []datapath.EgressIP, ip netip.Addr) (datapath.Role, bool) {
	first := meta.FindStatusCondition(e.Status.Conditions, v1alpha1.ConditionAssigned) == nil
	switch {
	case len(e.Spec.IPs) > 0 && slices.ContainsFunc(ips, func(x datapath.EgressIP) bool { return x.Usable }):
		return datapath.RoleSource, false
	case len(e.Spec.IPs) > 0:
		return datapath.RoleFailed, len(ips) == 0 && first
	case ip.IsValid() && e.Status.EgressNode != "":
		return datapath.RoleSource, false
	default:
		return datapath.RoleFailed, e.Status.EgressIP == "" && first
	}
}

// ZoneLabel is the Node label whose value is its zone
// (topology.kubernetes.io/zone): a source Node prefers the IPs of an
// Egress held in its own zone.
const ZoneLabel = "topology.kubernetes.io/zone"

// nodeZone is the zone label of Node name among nodes ("" when it has
// none or is not among them).
func nodeZone(nodes []corev1.Node, name string) string {
	for i := range nodes {
		if nodes[i].Name == name {
			return nodes[i].Labels[ZoneLabel]
		}
	}
	return ""
}

// MultiIPs lists the allocated IPs of an Egress with spec.ips as node sees
// them, sorted by IP: Held when status.ips names node, Usable when the
// entry is Ready with a Node and, while some Ready entry's zone is zone
// (node's, non-empty), only the Ready entries of that zone (issue 20:
// "the Pod uses only the IPs in its zone while one is Ready there").
func MultiIPs(e *v1alpha1.Egress, node, zone string) []datapath.EgressIP {
	inZone := false
	for _, x := range e.Status.IPs {
		if x.Ready && x.Node != "" && zone != "" && x.Zone == zone {
			inZone = true
		}
	}
	var out []datapath.EgressIP
	seen := map[netip.Addr]bool{}
	for _, x := range e.Status.IPs {
		ip, err := netip.ParseAddr(x.IP)
		if err != nil || ip.Zone() != "" || seen[ip.Unmap()] {
			continue
		}
		ip = ip.Unmap()
		seen[ip] = true
		out = append(out, datapath.EgressIP{IP: ip, Held: x.Node == node,
			Usable: x.Ready && x.Node != "" && (!inZone || x.Zone == zone)})
	}
	slices.SortFunc(out, func(a, b datapath.EgressIP) int { return a.IP.Compare(b.IP) })
	return out
}

// podsOf lists the IPs of the running Pods among pods (host-network and
// finished Pods excepted) with their UIDs, sorted by IP: how the datapath
// tells a member that moved to another Egress (same Pod, its flows drain)
// from an IP that went to another Pod.
func podsOf(pods []corev1.Pod) []datapath.LocalPod {
	var out []datapath.LocalPod
	for i := range pods {
		p := &pods[i]
		if p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, pip := range p.Status.PodIPs {
			if ip, err := netip.ParseAddr(pip.IP); err == nil {
				out = append(out, datapath.LocalPod{IP: ip.Unmap(), UID: string(p.UID)})
			}
		}
	}
	slices.SortFunc(out, func(a, b datapath.LocalPod) int {
		return cmp.Or(a.IP.Compare(b.IP), strings.Compare(a.UID, b.UID))
	})
	return slices.Compact(out)
}

// unmapBits is 96 for an IPv4-mapped IPv6 prefix (so ::ffff:10.0.0.0/104
// becomes 10.0.0.0/8), else 0.
func unmapBits(p netip.Prefix) int {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		return 96
	}
	return 0
}

func comparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// stateEqual reports whether two normalized States are the same.
func stateEqual(a, b datapath.State) bool {
	return slices.Equal(a.NodeIPs, b.NodeIPs) && slices.Equal(a.ClusterCIDRs, b.ClusterCIDRs) && slices.Equal(a.Pods, b.Pods) &&
		slices.EqualFunc(a.Peers, b.Peers, func(x, y datapath.Peer) bool { return x.IP == y.IP && slices.Equal(x.PodCIDRs, y.PodCIDRs) }) &&
		slices.EqualFunc(a.Egresses, b.Egresses, func(x, y datapath.Egress) bool {
			return x.Name == y.Name && x.IP == y.IP && x.Role == y.Role && x.FailurePolicy == y.FailurePolicy && x.Assigning == y.Assigning &&
				slices.Equal(x.Local, y.Local) && slices.Equal(x.Remote, y.Remote) && slices.Equal(x.IPs, y.IPs)
		}) && splitsEqual(a.Splits, b.Splits)
}
