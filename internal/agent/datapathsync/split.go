package datapathsync

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent/datapath"
	"github.com/egressip/egressip/internal/destinations"
	"github.com/egressip/egressip/internal/selection"
)

// splitsOf returns the datapath Splits of a Node (issue 21): its own
// members whose destinations several Egresses share, or one Egress carries
// only in part, as package selection divided them (sel.Destinations); and,
// on an egress Node, the remote members listed by more than one Egress
// held here, divided by destinations.Resolve over those Egresses alone
// (the same rule: a destination the source Node sends here belongs to one
// of them, and the rule gives it to the same one among fewer Egresses).
// Members with the same division form one Split. egs are the State's
// Egresses (Local and Remote filled in), byName the Egress objects.
func splitsOf(sel selection.Result, egs []datapath.Egress, byName map[string]*v1alpha1.Egress) []datapath.Split {
	groups := map[string]*datapath.Split{}
	add := func(remote bool, ip netip.Addr, spans []destinations.Span) {
		var key strings.Builder
		fmt.Fprint(&key, remote)
		for _, s := range spans {
			fmt.Fprintf(&key, "|%s-%s=%s", s.First, s.Last, s.Egress)
		}
		g := groups[key.String()]
		if g == nil {
			g = &datapath.Split{Remote: remote, Spans: spans}
			groups[key.String()] = g
		}
		g.IPs = append(g.IPs, ip)
	}
	local := map[netip.Addr]bool{}
	remoteOf := map[netip.Addr][]string{}
	for _, e := range egs {
		for _, ip := range e.Local {
			local[ip] = true
		}
		for _, m := range e.Remote {
			remoteOf[m.IP] = append(remoteOf[m.IP], e.Name)
		}
	}
	for ip := range local {
		if spans, ok := sel.Destinations[ip]; ok {
			add(false, ip, spans)
		}
	}
	for ip, names := range remoteOf {
		if len(names) < 2 {
			continue
		}
		claims := make([]destinations.Claim, 0, len(names))
		for _, n := range names {
			if e := byName[n]; e != nil {
				claims = append(claims, selection.ClaimOf(e))
			}
		}
		add(true, ip, destinations.Resolve(ip.Is6(), claims))
	}
	if len(groups) == 0 {
		return nil
	}
	out := make([]datapath.Split, 0, len(groups))
	for _, g := range groups {
		slices.SortFunc(g.IPs, netip.Addr.Compare)
		out = append(out, *g)
	}
	slices.SortFunc(out, func(a, b datapath.Split) int {
		if a.Remote != b.Remote {
			if a.Remote {
				return 1
			}
			return -1
		}
		return a.IPs[0].Compare(b.IPs[0])
	})
	return out
}

// splitsEqual reports whether two normalized Split lists are the same.
func splitsEqual(a, b []datapath.Split) bool {
	return slices.EqualFunc(a, b, func(x, y datapath.Split) bool {
		return x.Remote == y.Remote && slices.Equal(x.IPs, y.IPs) && slices.Equal(x.Spans, y.Spans)
	})
}
