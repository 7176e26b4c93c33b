package webhook

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// maxNamed bounds the Egress names one warning lists.
const maxNamed = 5

// egressWarnings are the admission warnings (RFC 7234 Warning headers that
// kubectl prints; the request is admitted) of an Egress create (old nil)
// or update that is otherwise valid:
//   - an edit of spec.externalIPPool or spec.egressIP that changes the
//     source address of an Egress that has one (status.egressIP), or an
//     edit of spec.ips (including a switch between one IP and several)
//     of an Egress that has addresses (ipsEditWarning);
//   - a spec.egressIP another Egress already uses (they share the address);
//   - an appliedTo that selects every namespace (namespaceSelector {}, or
//     one that only requires kubernetes.io/metadata.name to exist), or
//     every Pod of every namespace (podSelector {} and no
//     namespaceSelector), on create or when spec.appliedTo changes.
//
// A failed List of Egresses only drops the warnings that need it.
func (v *EgressValidator) egressWarnings(ctx context.Context, old, e *v1.Egress) admission.Warnings {
	var ws admission.Warnings
	if old != nil && old.Status.EgressIP != "" {
		cur := old.Status.EgressIP
		switch {
		case len(e.Spec.IPs) > 0 || len(old.Spec.IPs) > 0:
			if !equality.Semantic.DeepEqual(old.Spec.IPs, e.Spec.IPs) {
				ws = append(ws, ipsEditWarning(old, e))
			}
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
	at := e.Spec.AppliedTo
	if old != nil && equality.Semantic.DeepEqual(old.Spec.AppliedTo, at) {
		return ws // warned when the selectors were written
	}
	switch {
	case at.NamespaceSelector != nil && len(at.NamespaceSelector.MatchLabels) == 0 && len(at.NamespaceSelector.MatchExpressions) == 0:
		ws = append(ws, "spec.appliedTo.namespaceSelector {} selects every namespace (kube-system and every tenant's included): the matching Pods of all of them leave with this Egress's address unless an older Egress selects them; name the namespaces with matchLabels")
	case at.NamespaceSelector != nil && everyNamespace(at.NamespaceSelector):
		ws = append(ws, "spec.appliedTo.namespaceSelector requires only that the label "+corev1.LabelMetadataName+" exists, which every namespace has: it selects every namespace (kube-system and every tenant's included); name the namespaces with matchLabels")
	case at.NamespaceSelector == nil && at.PodSelector != nil && len(at.PodSelector.MatchLabels) == 0 && len(at.PodSelector.MatchExpressions) == 0:
		ws = append(ws, "spec.appliedTo.podSelector {} without a namespaceSelector selects every Pod of every namespace (kube-system and every tenant's included): all of them leave with this Egress's address unless an older Egress selects them; add a namespaceSelector, or labels to the podSelector")
	}
	return ws
}

// everyNamespace reports whether s, with no matchLabels, only requires
// the label every namespace carries (kubernetes.io/metadata.name, set by
// the API server since Kubernetes 1.21) to exist.
func everyNamespace(s *metav1.LabelSelector) bool {
	if len(s.MatchLabels) > 0 || len(s.MatchExpressions) == 0 {
		return false
	}
	for _, r := range s.MatchExpressions {
		if r.Key != corev1.LabelMetadataName || r.Operator != metav1.LabelSelectorOpExists {
			return false
		}
	}
	return true
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

// ipsEditWarning is the warning of an edit of spec.ips (or a switch
// between externalIPPool and ips) of Egress e, whose addresses before the
// edit are in old's status: which addresses it has now, and that the
// controller may drop or add some, announcing each change.
func ipsEditWarning(old, e *v1.Egress) string {
	var cur []string
	for _, s := range old.Status.IPs {
		if s.IP != "" {
			cur = append(cur, s.IP)
		}
	}
	if len(cur) == 0 {
		cur = []string{old.Status.EgressIP}
	}
	return fmt.Sprintf("this edit of Egress %s's IPs may change its source addresses (now %s): the controller keeps each address its entry's pool still allows, allocates or drops the rest, and records every change in an EgressIPChanged Event; the Pods' new connections use the new set at once, and peers' allow-lists that name a dropped address stop matching",
		e.Name, strings.Join(cur, ", "))
}
