package datapath

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/google/nftables"
)

// ErrEgressRefused is returned (wrapped in a *RefusedError) by Apply when
// the kernel refused the part of the table that belongs to some Egresses:
// the others are programmed, those are not (or only their rejection, see
// Apply).
var ErrEgressRefused = errors.New("the kernel refused the datapath of some Egresses")

// tableError is an error of the transaction that writes a table.
type tableError struct{ err error }

func (e *tableError) Error() string { return e.err.Error() }
func (e *tableError) Unwrap() error { return e.err }

// refusal is one Egress the kernel refused: the Egress as it was then (an
// equal Egress is not tried again) and the kernel's error.
type refusal struct {
	egress Egress
	err    error
}

// RefusedError names the Egresses whose part of the table the kernel
// refused, with the error each one's part alone got. It wraps
// ErrEgressRefused.
type RefusedError struct {
	// Egresses maps an Egress name to the kernel's error for its part.
	Egresses map[string]error
}

func (e *RefusedError) Error() string {
	names := slices.Sorted(maps.Keys(e.Egresses))
	parts := make([]string, 0, len(names))
	for _, n := range names {
		parts = append(parts, fmt.Sprintf("Egress %q: %v", n, e.Egresses[n]))
	}
	return fmt.Sprintf("%v: %s", ErrEgressRefused, strings.Join(parts, "; "))
}

func (e *RefusedError) Unwrap() error { return ErrEgressRefused }

// refusedError is nil without refusals, else the *RefusedError naming them.
func refusedError(rs map[string]refusal) error {
	if len(rs) == 0 {
		return nil
	}
	out := &RefusedError{Egresses: make(map[string]error, len(rs))}
	for n, r := range rs {
		out.Egresses[n] = r.err
	}
	return out
}

// build is Build with d's configuration and IDs, and the test hook.
func (d *Datapath) build(st State) (Plan, error) {
	p, err := buildPlan(d.cfg, st, d.ids, d.pending)
	if d.rulesetHook != nil {
		d.rulesetHook(&p.NFT)
	}
	return p, err
}

// withoutRefused returns st with every Egress that the kernel refused in
// the last Apply and that is unchanged since replaced by its fallback
// (see fallback), and those refusals; changed or vanished Egresses lose
// their refusal and are tried again.
func (d *Datapath) withoutRefused(st State) (State, map[string]refusal) {
	still := map[string]refusal{}
	for _, e := range st.Egresses {
		if r, ok := d.refused[e.Name]; ok && reflect.DeepEqual(r.egress, e) {
			still[e.Name] = r
		}
	}
	return d.fallback(st, still), still
}

// fallback returns st with every refused Egress reduced to what keeps its
// Pods from leaving with the Node's IP against its failurePolicy: with
// FailurePolicyFail, RoleFailed with its local members (their traffic is
// rejected, as while the Egress has no Node); otherwise nothing. A
// fallback is tried in a scratch table first and dropped when the kernel
// refuses it too (the name itself can be what is refused).
func (d *Datapath) fallback(st State, refused map[string]refusal) State {
	if len(refused) == 0 {
		return st
	}
	out := st
	out.Egresses = make([]Egress, 0, len(st.Egresses))
	for _, e := range st.Egresses {
		if _, ok := refused[e.Name]; !ok {
			out.Egresses = append(out.Egresses, e)
			continue
		}
		if e.FailurePolicy != FailurePolicyFail || len(e.Local) == 0 {
			continue
		}
		fb := Egress{Name: e.Name, Role: RoleFailed, FailurePolicy: FailurePolicyFail, Local: e.Local}
		probe := State{Egresses: []Egress{fb}, NodeIPs: st.NodeIPs, ClusterCIDRs: st.ClusterCIDRs}
		if p, err := d.build(probe); err == nil && d.tryTable(p.NFT) == nil {
			out.Egresses = append(out.Egresses, fb)
		}
	}
	return out
}

// isolate finds the Egresses of st whose part of the table the kernel
// refuses: it bisects st.Egresses, trying each half in a scratch table
// that the same transaction deletes again (the live table is never
// touched), down to single Egresses. It returns them with the kernel's
// error; none when every Egress passes alone (the failure then needs
// several Egresses together, and Apply reports it whole). It fails when
// the table without any Egress is refused, or nftables cannot be reached.
// Cost: about 2·k·log2(n) transactions for k refused Egresses of n.
func (d *Datapath) isolate(st State) (map[string]refusal, error) {
	try := func(egs []Egress) error {
		sub := st
		sub.Egresses = egs
		p, err := d.build(sub)
		if err != nil && !errors.Is(err, ErrTooManyEgresses) {
			return err
		}
		return d.tryTable(p.NFT)
	}
	if err := try(nil); err != nil {
		return nil, fmt.Errorf("isolate the refused Egress: the table without Egresses is refused too: %w", err)
	}
	bad := map[string]refusal{}
	var split func(egs []Egress, err error)
	split = func(egs []Egress, err error) {
		if len(egs) == 1 {
			bad[egs[0].Name] = refusal{egress: egs[0], err: err}
			return
		}
		h := len(egs) / 2
		for _, part := range [][]Egress{egs[:h], egs[h:]} {
			if err := try(part); err != nil {
				split(part, err)
			}
		}
	}
	egs := slices.Clone(st.Egresses)
	slices.SortFunc(egs, func(a, b Egress) int { return strings.Compare(a.Name, b.Name) })
	if err := try(egs); err != nil {
		split(egs, err)
	}
	return bad, nil
}

// tryTable sends nft in a scratch table (TableName + "-try") that the same
// transaction creates and deletes: the kernel validates everything and
// keeps nothing. A scratch table left by a crash is replaced.
func (d *Datapath) tryTable(nft Ruleset) error {
	c, err := d.nft(sendBuffer(nft))
	if err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyINet, Name: d.cfg.TableName + "-try"}
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	if err := fillTable(c, t, nft); err != nil {
		return err
	}
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return &tableError{fmt.Errorf("try nftables table inet %s: %w", t.Name, err)}
	}
	return nil
}

// Refused returns the Egresses whose datapath the kernel refused in the
// last Apply, with the error, by name.
func (d *Datapath) Refused() map[string]error {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]error, len(d.refused))
	for n, r := range d.refused {
		out[n] = r.err
	}
	return out
}

// resolveKeys renames what readBack found under a digest key (an Egress
// name too long for an ids comment, see idKey) to the name of st's Egress
// it stands for, so that the Egress keeps its ID, role and egress IP
// across a restart. Keys that match no Egress of st stay; Build frees
// their IDs.
func (d *Datapath) resolveKeys(st State) {
	hasDigest := false
	for k := range d.ids {
		if isDigestKey(k) {
			hasDigest = true
			break
		}
	}
	if !hasDigest {
		return
	}
	var names []string
	for _, e := range st.Egresses {
		names = append(names, e.Name)
		for _, x := range e.IPs { // the per-IP parts of an Egress with several IPs
			names = append(names, SubName(e.Name, x.IP))
		}
	}
	for _, name := range names {
		k := idKey(name)
		id, ok := d.ids[k]
		if !isDigestKey(k) || !ok {
			continue
		}
		delete(d.ids, k)
		d.ids[name] = id
		if r, ok := d.roles[k]; ok {
			delete(d.roles, k)
			d.roles[name] = r
		}
		if a, ok := d.eips[k]; ok {
			delete(d.eips, k)
			d.eips[name] = a
		}
	}
}
