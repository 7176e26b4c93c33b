package controller

import (
	"fmt"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// writeLedger remembers the Egresses a pass wrote, as the API server
// returned them, until the cache shows those writes. The next pass reads
// them instead of the cache's older copies, so that it never allocates an
// address it has just given to another Egress whose write the informer
// has not delivered yet (issue 23: two Egresses on one address under a
// burst). It is used by the single pass worker only.
//
// Resource versions are compared as integers: Kubernetes guarantees since
// 1.35 that they are comparable for objects of one resource (KEP-5504,
// k8s.io/apimachinery/pkg/util/resourceversion).
type writeLedger struct {
	byUID map[types.UID]*v1.Egress
}

// record keeps e, the object a successful status patch returned.
func (l *writeLedger) record(e *v1.Egress) {
	if l.byUID == nil {
		l.byUID = map[types.UID]*v1.Egress{}
	}
	l.byUID[e.UID] = e
}

// len is the number of writes the cache has not shown yet (after the last
// overlay).
func (l *writeLedger) len() int { return len(l.byUID) }

// overlay replaces in cached (in place) each Egress older than the one
// this controller wrote by the written one, and forgets the writes the
// cache shows: the same or a newer resource version, or the Egress gone
// from the cache (it was in the cache when written, and the cache never
// goes back, so it has seen the deletion). It returns how many Egresses
// it replaced, or an error when a resource version cannot be compared
// (the caller then reads the API server instead).
func (l *writeLedger) overlay(cached []v1.Egress) (int, error) {
	if len(l.byUID) == 0 {
		return 0, nil
	}
	seen := make(map[types.UID]bool, len(l.byUID))
	replaced := 0
	for i := range cached {
		w, ok := l.byUID[cached[i].UID]
		if !ok {
			continue
		}
		seen[w.UID] = true
		c, err := resourceversion.CompareResourceVersion(cached[i].ResourceVersion, w.ResourceVersion)
		if err != nil {
			return replaced, fmt.Errorf("compare resource versions of Egress %s: %w", w.Name, err)
		}
		if c >= 0 {
			delete(l.byUID, w.UID)
			continue
		}
		cached[i] = *w.DeepCopy()
		replaced++
	}
	for uid := range l.byUID {
		if !seen[uid] {
			delete(l.byUID, uid)
		}
	}
	return replaced, nil
}

// caughtUp reports whether cached shows every Egress of live (a consistent
// read from the API server) at its live resource version or newer; if not,
// it names one that lags. An Egress in cached but not in live was created
// after the read or is being removed: it is no risk (a deleted Egress only
// holds its address a little longer). missing lists the Egresses of live
// the cache does not hold: not seen yet, or deleted since the read (the
// caller asks the API server which). An error means a resource version
// cannot be compared.
func caughtUp(cached, live []v1.Egress) (ok bool, lag string, missing []*v1.Egress, err error) {
	rv := make(map[types.UID]string, len(cached))
	for i := range cached {
		rv[cached[i].UID] = cached[i].ResourceVersion
	}
	ok = true
	for i := range live {
		e := &live[i]
		c, found := rv[e.UID]
		if !found {
			missing = append(missing, e)
			ok, lag = false, fmt.Sprintf("Egress %s (resourceVersion %s) not in the cache yet", e.Name, e.ResourceVersion)
			continue
		}
		cmp, err := resourceversion.CompareResourceVersion(c, e.ResourceVersion)
		if err != nil {
			return false, "", nil, fmt.Errorf("compare resource versions of Egress %s: %w", e.Name, err)
		}
		if cmp < 0 {
			ok, lag = false, fmt.Sprintf("Egress %s at resourceVersion %s in the cache, %s in the API server", e.Name, c, e.ResourceVersion)
		}
	}
	return ok, lag, missing, nil
}
