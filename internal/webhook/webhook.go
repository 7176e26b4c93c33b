// Package webhook holds egressip's validating admission webhook: the rules
// that span objects, which CEL in the CRD schema cannot see.
//
//   - an ExternalIPPool must not share an address with another pool;
//   - an update of a pool must not remove or shrink a range that holds IPs
//     allocated to Egresses (adding a separate range is fine);
//   - an Egress's spec.egressIP must lie in the pool it names and be of that
//     pool's family (when the pool exists; a missing pool is reported by the
//     controller as a condition, since pools may be created after Egresses);
//   - a pool's ranges must not contain special-purpose addresses
//     (loopback, link-local, multicast, ...: ipam.SpecialBlocks); CEL
//     refuses such a cidr, this check finds them in start/end ranges. A
//     pool whose ranges hold Node addresses is admitted with a warning;
//   - an Egress's named spec.egressIP must not be a Node's own address
//     (an InternalIP or ExternalIP in status.addresses), checked when it is
//     new or changed;
//   - an Egress's appliedTo selectors must parse as Kubernetes label
//     selectors (label values and matchExpressions keys and values; CEL in
//     the schema checks the operators and matchLabels keys, but checking
//     every value exceeds the CEL cost budget of an unbounded
//     metav1.LabelSelector).
//
// The checks read the manager's cache, so two conflicting objects created
// in the same instant can both pass; the controller's pass catches that case
// (the older pool wins, the newer one is marked not Ready).
package webhook

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/ipam"
	"github.com/egressip/egressip/internal/poolspec"
)

// +kubebuilder:webhook:path=/validate-egressip-io-v1alpha1-externalippool,mutating=false,failurePolicy=fail,sideEffects=None,groups=egressip.io,resources=externalippools,verbs=create;update,versions=v1alpha1,name=vexternalippool-v1alpha1.egressip.io,admissionReviewVersions=v1
// +kubebuilder:webhook:path=/validate-egressip-io-v1alpha1-egress,mutating=false,failurePolicy=fail,sideEffects=None,groups=egressip.io,resources=egresses,verbs=create;update,versions=v1alpha1,name=vegress-v1alpha1.egressip.io,admissionReviewVersions=v1

// Setup registers both validators with mgr's webhook server.
func Setup(mgr ctrl.Manager) error {
	r := mgr.GetClient()
	if err := ctrl.NewWebhookManagedBy(mgr, &v1.ExternalIPPool{}).WithValidator(&PoolValidator{Reader: r}).Complete(); err != nil {
		return fmt.Errorf("register ExternalIPPool webhook: %w", err)
	}
	if err := ctrl.NewWebhookManagedBy(mgr, &v1.Egress{}).WithValidator(&EgressValidator{Reader: r}).Complete(); err != nil {
		return fmt.Errorf("register Egress webhook: %w", err)
	}
	return nil
}

var (
	poolGK   = v1.GroupVersion.WithKind("ExternalIPPool").GroupKind()
	egressGK = v1.GroupVersion.WithKind("Egress").GroupKind()
)

// PoolValidator validates ExternalIPPools against other pools and the
// Egresses that use them.
type PoolValidator struct {
	Reader client.Reader
}

// ValidateCreate rejects a pool that overlaps another pool.
func (v *PoolValidator) ValidateCreate(ctx context.Context, p *v1.ExternalIPPool) (admission.Warnings, error) {
	if err := v.validate(ctx, nil, p); err != nil {
		return nil, err
	}
	return v.poolWarnings(ctx, nil, p), nil
}

// ValidateUpdate rejects overlaps and updates that drop allocated IPs.
func (v *PoolValidator) ValidateUpdate(ctx context.Context, old, p *v1.ExternalIPPool) (admission.Warnings, error) {
	if err := v.validate(ctx, old, p); err != nil {
		return nil, err
	}
	return v.poolWarnings(ctx, old, p), nil
}

// ValidateDelete allows deletion; a pool in use waits on its finalizer.
func (v *PoolValidator) ValidateDelete(context.Context, *v1.ExternalIPPool) (admission.Warnings, error) {
	return nil, nil
}

func (v *PoolValidator) validate(ctx context.Context, old, p *v1.ExternalIPPool) error {
	// The node selector must parse as the controller parses it
	// (metav1.LabelSelectorAsSelector): label syntax the schema's CEL does
	// not check. Checked on create and when it changes only, so that a
	// pool admitted earlier with a bad one can still take and drop its
	// finalizer (and be deleted).
	if s := p.Spec.NodeSelector; s != nil && (old == nil || !equality.Semantic.DeepEqual(old.Spec.NodeSelector, s)) {
		if errs := metav1validation.ValidateLabelSelector(s, metav1validation.LabelSelectorValidationOptions{}, field.NewPath("spec", "nodeSelector")); len(errs) > 0 {
			return apierrors.NewInvalid(poolGK, p.Name, errs)
		}
	}
	rangesPath := field.NewPath("spec", "ipRanges")
	if p.Spec.Cloud != nil && len(p.Spec.IPRanges) == 0 {
		// A cloud-backed pool without ranges takes whatever free address
		// the cloud picks in its subnet: no ranges to check or overlap.
		return nil
	}
	pool, err := poolspec.Parse(p)
	if err != nil {
		return apierrors.NewInvalid(poolGK, p.Name, specErrors(err))
	}
	if old != nil && equality.Semantic.DeepEqual(old.Spec.IPRanges, p.Spec.IPRanges) {
		// Ranges unchanged (labels, finalizers, the node selector...): a
		// pool that was admitted, or raced past this check with another,
		// must still take its finalizer and edits; the controller marks the
		// newer of two overlapping pools not Ready.
		return nil
	}
	errs := specialRangeErrors(pool, rangesPath)
	var pools v1.ExternalIPPoolList
	if err := v.Reader.List(ctx, &pools); err != nil {
		return apierrors.NewInternalError(fmt.Errorf("list ExternalIPPools: %w", err))
	}
	for _, other := range pools.Items {
		if other.Name == p.Name {
			continue
		}
		otherRanges, err := ipam.ParseRanges(poolspec.Ranges(other.Spec.IPRanges))
		if err != nil {
			continue
		}
		if i, j, ok := ipam.Overlaps(pool.Ranges(), otherRanges); ok {
			errs = append(errs, field.Invalid(rangesPath.Index(i), pool.Ranges()[i].String(),
				fmt.Sprintf("overlaps ExternalIPPool %q (ipRanges[%d] %s): pools must not share addresses", other.Name, j, otherRanges[j])))
		}
	}
	if old != nil {
		var egs v1.EgressList
		if err := v.Reader.List(ctx, &egs); err != nil {
			return apierrors.NewInternalError(fmt.Errorf("list Egresses: %w", err))
		}
		var allocated []netip.Addr
		holders := map[netip.Addr][]string{}
		for _, e := range egs.Items {
			if e.Spec.ExternalIPPool != p.Name {
				continue
			}
			if ip, err := netip.ParseAddr(e.Status.EgressIP); err == nil {
				allocated = append(allocated, ip)
				holders[ip] = append(holders[ip], e.Name)
			}
		}
		for _, ip := range pool.Uncovered(allocated) {
			names := holders[ip]
			slices.Sort(names)
			errs = append(errs, field.Forbidden(rangesPath,
				fmt.Sprintf("the update would drop %s, allocated to Egress %s; delete or move those Egresses first, or keep the range", ip, strings.Join(names, ", "))))
		}
	}
	if len(errs) > 0 {
		return apierrors.NewInvalid(poolGK, p.Name, errs)
	}
	return nil
}

// specErrors turns ipam's FieldErrors (fields relative to spec, such as
// "ipRanges[1]") into API field errors under spec, each with the value it
// is about, so that a within-pool overlap reads
// `spec.ipRanges[1]: Invalid value: "192.0.2.8/29": overlaps ipRanges[0] (192.0.2.0/28)`.
// Any other error is reported against spec.ipRanges.
func specErrors(err error) field.ErrorList {
	var fes ipam.FieldErrors
	if !errors.As(err, &fes) {
		return field.ErrorList{field.Invalid(field.NewPath("spec", "ipRanges"), "", err.Error())}
	}
	out := make(field.ErrorList, 0, len(fes))
	for _, fe := range fes {
		path := "spec." + fe.Field
		var bad any = fe.Value
		if fe.Value == "" {
			bad = field.OmitValueType{} // "Invalid value: <reason>", not `Invalid value: ""`
		}
		out = append(out, &field.Error{Type: field.ErrorTypeInvalid, Field: path, BadValue: bad, Detail: fe.Reason})
	}
	return out
}

// errNoPool stands for the pool of an Egress that names none (spec.ips).
var errNoPool = errors.New("no spec.externalIPPool")

// EgressValidator checks an Egress's selectors, and its named IP against
// its pool.
type EgressValidator struct {
	Reader client.Reader
}

// ValidateCreate rejects an egressIP outside the named pool and an Egress
// of a pool that is being deleted.
func (v *EgressValidator) ValidateCreate(ctx context.Context, e *v1.Egress) (admission.Warnings, error) {
	var p v1.ExternalIPPool
	err := errNoPool
	if e.Spec.ExternalIPPool != "" { // an Egress with spec.ips: validateIPs checks its pools
		err = v.Reader.Get(ctx, client.ObjectKey{Name: e.Spec.ExternalIPPool}, &p)
	}
	if err == nil && p.DeletionTimestamp != nil {
		// A new Egress would only hold up the deletion (the pool's
		// finalizer waits for its Egresses) and lose its IP with the pool.
		return nil, apierrors.NewInvalid(egressGK, e.Name, field.ErrorList{field.Invalid(field.NewPath("spec", "externalIPPool"), e.Spec.ExternalIPPool,
			fmt.Sprintf("ExternalIPPool %q is being deleted", e.Spec.ExternalIPPool))})
	}
	ws, err := v.validate(ctx, e)
	if err == nil {
		err = v.checkNodeAddress(ctx, e)
	}
	if err != nil {
		return ws, err
	}
	return append(append(ws, v.egressWarnings(ctx, nil, e)...), v.destinationWarnings(ctx, nil, e)...), nil
}

// ValidateUpdate rejects an egressIP outside the named pool, or a newly
// named egressIP that is a Node's address, and warns of an edit that
// changes the Egress's source address.
func (v *EgressValidator) ValidateUpdate(ctx context.Context, old, e *v1.Egress) (admission.Warnings, error) {
	ws, err := v.validate(ctx, e)
	if err == nil && old.Spec.EgressIP != e.Spec.EgressIP {
		// Only a newly named IP: an Egress whose Node took its address
		// later must stay editable (the controller reports the conflict).
		err = v.checkNodeAddress(ctx, e)
	}
	if err != nil {
		return ws, err
	}
	return append(append(ws, v.egressWarnings(ctx, old, e)...), v.destinationWarnings(ctx, old, e)...), nil
}

// ValidateDelete allows deletion.
func (v *EgressValidator) ValidateDelete(context.Context, *v1.Egress) (admission.Warnings, error) {
	return nil, nil
}

func (v *EgressValidator) validate(ctx context.Context, e *v1.Egress) (admission.Warnings, error) {
	// The same rules metav1.LabelSelectorAsSelector applies when the
	// controller and the agents parse the selectors.
	at := field.NewPath("spec", "appliedTo")
	var errs field.ErrorList
	if s := e.Spec.AppliedTo.NamespaceSelector; s != nil {
		errs = append(errs, metav1validation.ValidateLabelSelector(s, metav1validation.LabelSelectorValidationOptions{}, at.Child("namespaceSelector"))...)
	}
	if s := e.Spec.AppliedTo.PodSelector; s != nil {
		errs = append(errs, metav1validation.ValidateLabelSelector(s, metav1validation.LabelSelectorValidationOptions{}, at.Child("podSelector"))...)
	}
	if len(errs) > 0 {
		return nil, apierrors.NewInvalid(egressGK, e.Name, errs)
	}
	if len(e.Spec.IPs) > 0 {
		return v.validateIPs(ctx, e)
	}
	var p v1.ExternalIPPool
	if err := v.Reader.Get(ctx, client.ObjectKey{Name: e.Spec.ExternalIPPool}, &p); err != nil {
		if apierrors.IsNotFound(err) {
			return admission.Warnings{fmt.Sprintf("ExternalIPPool %q does not exist yet; the Egress waits for it", e.Spec.ExternalIPPool)}, nil
		}
		return nil, apierrors.NewInternalError(fmt.Errorf("get ExternalIPPool %s: %w", e.Spec.ExternalIPPool, err))
	}
	if e.Spec.EgressIP == "" {
		return nil, nil
	}
	ip, err := netip.ParseAddr(e.Spec.EgressIP)
	if err != nil {
		return nil, nil // the CRD schema rejects it already
	}
	if p.Spec.Cloud != nil && len(p.Spec.IPRanges) == 0 {
		if !ip.Is4() {
			return nil, apierrors.NewInvalid(egressGK, e.Name, field.ErrorList{field.Invalid(field.NewPath("spec", "egressIP"), e.Spec.EgressIP,
				fmt.Sprintf("ExternalIPPool %q is cloud-backed and IPv4 only", p.Name))})
		}
		return nil, nil // the cloud checks that the address is in the subnet
	}
	pool, err := poolspec.Parse(&p)
	if err != nil {
		return nil, nil // the pool's own condition reports it
	}
	if err := pool.Check(ip); err != nil {
		return nil, apierrors.NewInvalid(egressGK, e.Name, field.ErrorList{field.Invalid(field.NewPath("spec", "egressIP"), e.Spec.EgressIP,
			fmt.Sprintf("not usable from ExternalIPPool %q: %v", p.Name, err))})
	}
	return nil, nil
}
