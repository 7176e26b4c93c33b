package webhook

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/destinations"
	"github.com/egressip/egressip/internal/selection"
)

// destinationWarnings are the warnings about spec.destinationCIDRs and
// spec.excludedCIDRs (issue 21) that CEL cannot give, on create or when
// either list changes: entries of the other IP family than the Egress's
// (its egressIP or its pool's, which CEL cannot read), which it never
// uses, and a list left with none of its own family, which makes it carry
// no traffic at all; destinations that its own excludedCIDRs cover
// entirely; and an excluded /0 with no destinations, which leaves nothing
// of that family to carry. A pool that cannot be read drops only the family warnings.
func (v *EgressValidator) destinationWarnings(ctx context.Context, old, e *v1.Egress) admission.Warnings {
	if old != nil && slices.Equal(old.Spec.DestinationCIDRs, e.Spec.DestinationCIDRs) && slices.Equal(old.Spec.ExcludedCIDRs, e.Spec.ExcludedCIDRs) {
		return nil
	}
	var ws admission.Warnings
	pools := map[string]*v1.ExternalIPPool{}
	var p v1.ExternalIPPool
	if err := v.Reader.Get(ctx, client.ObjectKey{Name: e.Spec.ExternalIPPool}, &p); err == nil {
		pools[p.Name] = &p
	}
	dst, exc := destinations.Parse(e.Spec.DestinationCIDRs), destinations.Parse(e.Spec.ExcludedCIDRs)
	if fam := selection.EgressFamily(e, pools); fam != selection.Any {
		var other []string
		for _, d := range slices.Concat(dst, exc) {
			if !fam.Matches(d.Addr()) {
				other = append(other, d.String())
			}
		}
		switch {
		case len(dst) > 0 && !slices.ContainsFunc(dst, func(d netip.Prefix) bool { return fam.Matches(d.Addr()) }):
			ws = append(ws, fmt.Sprintf("spec.destinationCIDRs lists no IPv%d network, the family of this Egress: it carries no traffic at all (leave destinationCIDRs empty to carry every destination)", fam))
		case len(other) > 0:
			ws = append(ws, fmt.Sprintf("%s: not IPv%d, the family of this Egress, so it never uses them (a dual-stack workload needs one Egress per family)", strings.Join(other, ", "), fam))
		}
	}
	if len(dst) == 0 {
		fam := selection.EgressFamily(e, pools)
		for _, x := range exc {
			if x.Bits() == 0 && (fam == selection.Any || fam.Matches(x.Addr())) {
				ws = append(ws, fmt.Sprintf("spec.excludedCIDRs %s excludes every destination of its family and spec.destinationCIDRs is empty: "+
					"this Egress carries no traffic of that family", x))
			}
		}
	}
	for _, d := range dst {
		for _, x := range exc {
			if x.Addr().Is6() == d.Addr().Is6() && x.Bits() <= d.Bits() && x.Contains(d.Addr()) {
				ws = append(ws, fmt.Sprintf("spec.destinationCIDRs %s lies inside spec.excludedCIDRs %s of the same Egress: it carries none of it", d, x))
				break
			}
		}
	}
	return ws
}
