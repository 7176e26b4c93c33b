package webhook

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// maxNamed bounds the Egress names one warning lists.
const maxNamed = 5

// egressWarnings are the admission warnings (RFC 7234 Warning headers that
// kubectl prints; the request is admitted) of an Egress create (old nil)
// or update that is otherwise valid:
//   - an edit of spec.externalIPPool or spec.egressIP that changes the
//     source address of an Egress that has one (status.egressIP);
//   - a spec.egressIP another Egress already uses (they share the address);
//   - a namespaceSelector {} that selects every namespace.
//
// A failed List of Egresses only drops the warnings that need it.
func (v *EgressValidator) egressWarnings(ctx context.Context, old, e *v1.Egress) admission.Warnings {
	var ws admission.Warnings
	if old != nil && old.Status.EgressIP != "" {
		cur := old.Status.EgressIP
		switch {
		case e.Spec.EgressIP != "" && e.Spec.EgressIP != cur && (e.Spec.EgressIP != old.Spec.EgressIP || e.Spec.ExternalIPPool != old.Spec.ExternalIPPool):
			ws = append(ws, fmt.Sprintf("this edit changes the source address of Egress %s from %s to %s: its Pods' traffic leaves with %s at once, and peers' allow-lists that name %s stop matching", e.Name, cur, e.Spec.EgressIP, e.Spec.EgressIP, cur))
		case e.Spec.EgressIP == "" && e.Spec.ExternalIPPool != old.Spec.ExternalIPPool:
			ws = append(ws, fmt.Sprintf("this edit changes the source address of Egress %s from %s to an address of ExternalIPPool %q: its Pods' traffic leaves with the new address at once, and peers' allow-lists that name %s stop matching", e.Name, cur, e.Spec.ExternalIPPool, cur))
		}
	}
	if ip, err := netip.ParseAddr(e.Spec.EgressIP); err == nil && (old == nil || old.Spec.EgressIP != e.Spec.EgressIP) {
		var egs v1.EgressList
		if err := v.Reader.List(ctx, &egs); err == nil {
			var users []string
			for i := range egs.Items {
				o := &egs.Items[i]
				if o.Name == e.Name {
					continue
				}
				for _, s := range []string{o.Status.EgressIP, o.Spec.EgressIP} {
					if a, err := netip.ParseAddr(s); err == nil && a == ip {
						users = append(users, o.Name)
						break
					}
				}
			}
			if len(users) > 0 {
				ws = append(ws, fmt.Sprintf("egressIP %s is already used by Egress %s: the Egresses share it (one Node holds it for all of them, and their status.sharedWith names each other)", ip, listNames(users)))
			}
		}
	}
	if s := e.Spec.AppliedTo.NamespaceSelector; s != nil && len(s.MatchLabels) == 0 && len(s.MatchExpressions) == 0 {
		ws = append(ws, "spec.appliedTo.namespaceSelector {} selects every namespace (kube-system and every tenant's included): the matching Pods of all of them leave with this Egress's address unless an older Egress selects them; name the namespaces with matchLabels")
	}
	return ws
}

// listNames writes names sorted, at most maxNamed, then how many more.
func listNames(names []string) string {
	names = slices.Clone(names)
	slices.Sort(names)
	if len(names) > maxNamed {
		return strings.Join(names[:maxNamed], ", ") + fmt.Sprintf(" and %d more", len(names)-maxNamed)
	}
	return strings.Join(names, ", ")
}
