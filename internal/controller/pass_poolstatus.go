package controller

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// poolStatuses is the pool status phase: every pool's status (Ready,
// usage, excluded addresses, the kind's own parts) and whether it keeps
// PoolFinalizer: a pool does until it is being deleted, no Egress uses it
// and its cloud side has released everything.
func (p *pass) poolStatuses() {
	users := map[string][]string{}
	for i := range p.egs {
		e := p.egs[i]
		if e.Spec.ExternalIPPool != "" {
			users[e.Spec.ExternalIPPool] = append(users[e.Spec.ExternalIPPool], e.Name)
		}
		// A multi-IP Egress (spec.ips) uses every pool it names, once.
		named := map[string]bool{}
		for _, src := range e.Spec.IPs {
			if !named[src.Pool] {
				named[src.Pool] = true
				users[src.Pool] = append(users[src.Pool], e.Name)
			}
		}
	}
	p.out.Finalize = map[string]bool{}
	for i := range p.in.Pools {
		pl := &p.in.Pools[i]
		ps := p.pools[pl.Name]
		st := v1.ExternalIPPoolStatus{Conditions: slices.Clone(pl.Status.Conditions)}
		deleting := pl.DeletionTimestamp != nil
		p.out.Finalize[pl.Name] = !deleting || len(users[pl.Name]) > 0 || p.cloud.busy(pl.Name)
		switch {
		case deleting && len(users[pl.Name]) > 0:
			held := slices.Sorted(slices.Values(users[pl.Name]))
			if len(held) > 10 {
				held = append(held[:10], fmt.Sprintf("and %d more", len(users[pl.Name])-10))
			}
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1.ReasonInUse,
				Message: fmt.Sprintf("deletion waits: Egresses %s still use this pool; delete them or point them at another pool", strings.Join(held, ", ")), ObservedGeneration: pl.Generation})
			ps.kind.deletingStatus(p, ps, &st)
		case deleting && p.out.Finalize[pl.Name]:
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1.ReasonInUse,
				Message: "deletion waits: the controller is releasing the pool's cloud addresses and deleting its network interfaces", ObservedGeneration: pl.Generation})
			p.cloud.poolParts(pl.Name, &st)
		case ps.err != nil:
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionFalse, Reason: v1.ReasonInvalid, Message: ps.err.Error(), ObservedGeneration: pl.Generation})
		default:
			more := ps.kind.poolStatus(p, ps, &st)
			msg := fmt.Sprintf("%d of %s IPs used", st.Usage.Used, st.Usage.TotalText) + excludedSummary(st.Excluded) + more
			meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: v1.ConditionReady, Status: metav1.ConditionTrue, Reason: v1.ReasonValid,
				Message: msg, ObservedGeneration: pl.Generation})
		}
		p.out.Pools[pl.Name] = st
	}
}
