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
// Egresses with the same egress IP, sorted, at most maxSharedWith.
func setSharedWith(chs map[string]egressChange) {
	byIP := map[string][]string{}
	for name, ch := range chs {
		if ch.Status.EgressIP != "" {
			byIP[ch.Status.EgressIP] = append(byIP[ch.Status.EgressIP], name)
		}
	}
	for name, ch := range chs {
		var others []string
		for _, n := range byIP[ch.Status.EgressIP] {
			if n != name && ch.Status.EgressIP != "" {
				others = append(others, n)
			}
		}
		slices.Sort(others)
		if len(others) > maxSharedWith {
			others = others[:maxSharedWith]
		}
		ch.Status.SharedWith = others
		chs[name] = ch
	}
}
