package controller

import (
	"fmt"
	"slices"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// maxSharedWith bounds status.sharedWith (the API's maxItems).
const maxSharedWith = 8

// ipChangedNote is the note of the EgressIPChanged Event when the pass
// moves e from its current status.egressIP to another address in st;
// empty when the address stays, or e had none, or loses it.
func ipChangedNote(e *v1.Egress, st v1.EgressStatus) string {
	old, cur := e.Status.EgressIP, st.EgressIP
	if len(e.Status.IPs) > 0 && cur != "" {
		// A multi-IP Egress turned single-IP: compare every address it
		// had, not only the first that egressIP repeated.
		return multiIPChangedNote(e, []v1.EgressIPStatus{{IP: cur}})
	}
	if old == "" || cur == "" || old == cur {
		return ""
	}
	why := fmt.Sprintf("allocated from ExternalIPPool %q", e.Spec.ExternalIPPool)
	if e.Spec.EgressIP == cur {
		why = "named in spec.egressIP"
	}
	return fmt.Sprintf("egress IP changed from %s to %s (%s): the selected Pods' traffic now leaves with %s; peers that allow %s must allow %s", old, cur, why, cur, old, cur)
}

// statusAddrs is what a status says the Egress's addresses are:
// status.ips for a multi-IP status, else status.egressIP (one entry, maybe
// empty).
func statusAddrs(st v1.EgressStatus) []v1.EgressIPStatus {
	if len(st.IPs) > 0 {
		return st.IPs
	}
	return []v1.EgressIPStatus{{IP: st.EgressIP, Node: st.EgressNode}}
}

// setSharedWith fills status.sharedWith of every Egress in chs: the other
// Egresses with the same egress IP, sorted, at most maxSharedWith. The
// statuses in chs come without sharedWith; only the Egresses whose address
// is shared are touched (counting first: most addresses have one Egress,
// and a list per address was a tenth of a pass over 5,000 Egresses,
// BenchmarkPass).
func setSharedWith(chs map[string]egressChange) {
	count := make(map[string]int, len(chs))
	shared := 0
	for _, ch := range chs {
		if ip := ch.Status.EgressIP; ip != "" {
			count[ip]++
			if count[ip] == 2 {
				shared++
			}
		}
	}
	if shared == 0 {
		return
	}
	byIP := make(map[string][]string, shared)
	for name, ch := range chs {
		if ip := ch.Status.EgressIP; ip != "" && count[ip] > 1 {
			byIP[ip] = append(byIP[ip], name)
		}
	}
	for _, names := range byIP {
		slices.Sort(names)
		for _, name := range names {
			ch := chs[name]
			others := make([]string, 0, min(len(names)-1, maxSharedWith))
			for _, n := range names {
				if n != name && len(others) < maxSharedWith {
					others = append(others, n)
				}
			}
			ch.Status.SharedWith = others
			chs[name] = ch
		}
	}
}
