package datapath

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
)

// Dump renders the datapath's nftables table as read back from the kernel:
// sets with their elements, counter names and chains with their rules'
// expressions, one item per line, without handles, counter values or
// batch-local IDs. Two Dumps are equal exactly when the programmed rulesets
// are; it is for tests and debugging, not a stable format. An absent table
// renders as "".
func (d *Datapath) Dump(ctx context.Context) (string, error) {
	c, err := d.nft()
	if err != nil {
		return "", err
	}
	t := d.table()
	tabs, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
	if err != nil {
		return "", fmt.Errorf("list nftables tables: %w", err)
	}
	if !slices.ContainsFunc(tabs, func(x *nftables.Table) bool { return x.Name == t.Name }) {
		return "", nil
	}
	var b strings.Builder
	sets, err := c.GetSets(t)
	if err != nil {
		return "", fmt.Errorf("list sets: %w", err)
	}
	slices.SortFunc(sets, func(x, y *nftables.Set) int { return strings.Compare(x.Name, y.Name) })
	for _, s := range sets {
		fmt.Fprintf(&b, "set %s key=%s data=%s map=%v interval=%v\n", s.Name, s.KeyType.Name, s.DataType.Name, s.IsMap, s.Interval)
		els, err := c.GetSetElements(s)
		if err != nil {
			return "", fmt.Errorf("list elements of %s: %w", s.Name, err)
		}
		var lines []string
		for _, e := range els {
			lines = append(lines, fmt.Sprintf("  %x -> %x end=%v %q", e.Key, e.Val, e.IntervalEnd, e.Comment))
		}
		slices.Sort(lines)
		b.WriteString(strings.Join(lines, "\n"))
		b.WriteString("\n")
	}
	objs, err := c.GetNamedObjects(t)
	if err != nil {
		return "", fmt.Errorf("list objects: %w", err)
	}
	var names []string
	for _, o := range objs {
		if n, ok := o.(*nftables.NamedObj); ok {
			names = append(names, n.Name)
		}
	}
	slices.Sort(names)
	fmt.Fprintf(&b, "counters %v\n", names)
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		return "", fmt.Errorf("list chains: %w", err)
	}
	slices.SortFunc(chains, func(x, y *nftables.Chain) int { return strings.Compare(x.Name, y.Name) })
	for _, ch := range chains {
		if ch.Table.Name != t.Name {
			continue
		}
		hook, prio := "-", "-"
		if ch.Hooknum != nil {
			hook = fmt.Sprint(*ch.Hooknum)
		}
		if ch.Priority != nil {
			prio = fmt.Sprint(*ch.Priority)
		}
		fmt.Fprintf(&b, "chain %s type=%s hook=%s prio=%s\n", ch.Name, ch.Type, hook, prio)
		rules, err := c.GetRules(t, ch)
		if err != nil {
			return "", fmt.Errorf("list rules of %s: %w", ch.Name, err)
		}
		for _, r := range rules {
			var parts []string
			for _, e := range r.Exprs {
				if tg, ok := e.(*expr.Target); ok {
					// Info is a pointer: show what it points to.
					parts = append(parts, fmt.Sprintf("Target{Name:%s Rev:%d Info:%+v}", tg.Name, tg.Rev, reflect.Indirect(reflect.ValueOf(tg.Info)).Interface()))
					continue
				}
				v := reflect.Indirect(reflect.ValueOf(e))
				parts = append(parts, fmt.Sprintf("%s%+v", v.Type().Name(), v.Interface()))
			}
			fmt.Fprintf(&b, "  %s\n", strings.Join(parts, " "))
		}
	}
	return b.String(), nil
}
