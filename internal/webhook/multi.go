package webhook

import (
	"context"
	"fmt"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/poolspec"
)

// zoneLabel is the well-known Node label of spec.ips[].zone.
const zoneLabel = corev1.LabelTopologyZone

// validateIPs checks what the schema cannot see in an Egress's spec.ips:
// each entry's pool exists (a missing one is a warning: the Egress waits
// for it), is not being deleted and, if cloud-backed, names no Elastic
// IPs (those are associated per Egress, not per IP); every pool is of one IP family (an
// Egress is IPv4 or IPv6; a dual-stack workload takes two Egresses, as with
// single-IP Egresses); no pool is asked for more IPs than it has addresses,
// summed over its entries; each named address lies in its entry's pool. A
// zone that no Node carries, and an entry asking for more IPs than its pool
// and zone have Nodes (Nodes are listed without their pool's nodeSelector),
// are warnings, since Nodes may join later.
func (v *EgressValidator) validateIPs(ctx context.Context, e *v1.Egress) (admission.Warnings, error) {
	var ws admission.Warnings
	var errs field.ErrorList
	asked := map[string]uint64{} // IPs asked per pool, over its entries
	family, familyOf := "", ""
	for i, s := range e.Spec.IPs {
		at := field.NewPath("spec", "ips").Index(i)
		count := uint64(max(1, len(s.Addresses)))
		if s.Count != nil {
			count = uint64(max(*s.Count, 1))
		}
		asked[s.Pool] += count
		var p v1.ExternalIPPool
		if err := v.Reader.Get(ctx, client.ObjectKey{Name: s.Pool}, &p); err != nil {
			if apierrors.IsNotFound(err) {
				ws = append(ws, fmt.Sprintf("ExternalIPPool %q of spec.ips[%d] does not exist yet; those IPs wait for it", s.Pool, i))
				continue
			}
			return nil, apierrors.NewInternalError(fmt.Errorf("get ExternalIPPool %s: %w", s.Pool, err))
		}
		if p.DeletionTimestamp != nil {
			errs = append(errs, field.Invalid(at.Child("pool"), s.Pool, fmt.Sprintf("ExternalIPPool %q is being deleted", s.Pool)))
			continue
		}
		if p.Spec.Cloud != nil && p.Spec.Cloud.AWS != nil && p.Spec.Cloud.AWS.ElasticIPs != nil {
			// The controller gives such an IP no address either
			// (ElasticIPsNotSupported).
			errs = append(errs, field.Invalid(at.Child("pool"), s.Pool, fmt.Sprintf(
				"ExternalIPPool %q names Elastic IPs (spec.cloud.aws.elasticIPs), which are associated per Egress (status.publicIP), not per IP; give this pool in externalIPPool, or a cloud pool without elasticIPs in spec.ips", s.Pool)))
			continue
		}
		fam, total, check := poolFacts(&p)
		if fam != "" {
			if family == "" {
				family, familyOf = fam, s.Pool
			} else if fam != family {
				errs = append(errs, field.Invalid(at.Child("pool"), s.Pool, fmt.Sprintf(
					"ExternalIPPool %q is %s but %q is %s: the IPs of one Egress are of one family (give a dual-stack workload one Egress per family)",
					s.Pool, fam, familyOf, family)))
			}
		}
		if total > 0 && asked[s.Pool] > total {
			errs = append(errs, field.Invalid(at.Child("count"), count, fmt.Sprintf(
				"ExternalIPPool %q has %d addresses in all, and this Egress asks for %d of them", s.Pool, total, asked[s.Pool])))
		}
		for j, a := range s.Addresses {
			ip, err := netip.ParseAddr(string(a))
			if err != nil {
				continue // the schema rejects it
			}
			if o, ok := v.nodeAddress(ctx, ip); ok {
				errs = append(errs, field.Invalid(at.Child("addresses").Index(j), a,
					fmt.Sprintf("is %s: a Node's own address is never an egress IP", o)))
				continue
			}
			if check == nil {
				continue // a cloud pool without ranges: the cloud checks the subnet
			}
			if err := check(ip); err != nil {
				errs = append(errs, field.Invalid(at.Child("addresses").Index(j), a,
					fmt.Sprintf("not usable from ExternalIPPool %q: %v", s.Pool, err)))
			}
		}
		ws = append(ws, v.zoneWarnings(ctx, i, s, count)...)
	}
	if len(errs) > 0 {
		return ws, apierrors.NewInvalid(egressGK, e.Name, errs)
	}
	return ws, nil
}

// poolFacts returns a pool's family ("IPv4", "IPv6", or "" when its spec
// does not parse: its own condition reports that), its number of addresses
// (0 when unknown: a cloud pool without ranges) and its address check (nil
// for a cloud pool without ranges).
func poolFacts(p *v1.ExternalIPPool) (string, uint64, func(netip.Addr) error) {
	if p.Spec.Cloud != nil && len(p.Spec.IPRanges) == 0 {
		return "IPv4", 0, nil // cloud-backed pools are IPv4 only
	}
	pool, err := poolspec.Parse(p)
	if err != nil {
		return "", 0, nil
	}
	fam := "IPv4"
	if pool.Is6() {
		fam = "IPv6"
	}
	return fam, pool.Total(), pool.Check
}

// zoneWarnings warns when entry i's zone has no Node at all, or fewer Nodes
// than the entry asks IPs for. A failed List drops the warnings.
func (v *EgressValidator) zoneWarnings(ctx context.Context, i int, s v1.EgressIPSource, count uint64) admission.Warnings {
	if s.Zone == "" {
		return nil
	}
	var nodes corev1.NodeList
	if err := v.Reader.List(ctx, &nodes, client.MatchingLabels{zoneLabel: s.Zone}); err != nil {
		return nil
	}
	switch n := uint64(len(nodes.Items)); {
	case n == 0:
		return admission.Warnings{fmt.Sprintf("no Node has %s=%s (spec.ips[%d].zone): those IPs stay unplaced until one does",
			zoneLabel, s.Zone, i)}
	case n < count:
		return admission.Warnings{fmt.Sprintf("spec.ips[%d] asks for %d IPs in zone %s, which has %d Nodes: a Node holds at most one IP "+
			"of an Egress, so %d stay unplaced (FewerNodesThanIPs) until more Nodes join", i, count, s.Zone, n, count-n)}
	}
	return nil
}

// nodeAddress reports whether ip is a Node's own address, and whose (see
// checkNodeAddress); a failed List reports nothing, as the controller
// reports such conflicts too.
func (v *EgressValidator) nodeAddress(ctx context.Context, ip netip.Addr) (string, bool) {
	idx, err := nodeAddresses(ctx, v.Reader)
	if err != nil {
		return "", false
	}
	o, ok := idx[ip.Unmap()]
	return fmt.Sprint(o), ok
}
