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
	if old == "" || cur == "" || old == cur {
		return ""
	}
	why := fmt.Sprintf("allocated from ExternalIPPool %q", e.Spec.ExternalIPPool)
	if e.Spec.EgressIP == cur {
		why = "named in spec.egressIP"
	}
	return fmt.Sprintf("egress IP changed from %s to %s (%s): the selected Pods' traffic now leaves with %s; peers that allow %s must allow %s", old, cur, why, cur, old, cur)
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
