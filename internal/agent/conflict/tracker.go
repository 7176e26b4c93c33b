package conflict

import (
	"net/netip"
	"slices"
	"time"
)

// Conflict is an egress IP held by this Node that something else answers
// for.
type Conflict struct {
	// IP is the egress IP.
	IP netip.Addr
	// Interface is the interface it was probed on.
	Interface string
	// MACs are the foreign MACs seen in the last round that saw any,
	// canonical, sorted.
	MACs []string
	// Since is when a round first saw the conflict (this stretch of it).
	Since time.Time
}

// Tracker keeps conflicts across probe rounds. The zero value is ready.
// Not safe for concurrent use.
type Tracker struct {
	cur map[netip.Addr]Conflict
}

// Observe records one round on iface at now: each probed IP with foreign
// answers becomes a conflict (or stays one, keeping Since and taking the
// new MACs); each probed IP without any ends its conflict (one clean round
// is enough). It returns the IPs whose conflict started and ended, sorted.
func (t *Tracker) Observe(now time.Time, iface string, probed []netip.Addr, foreign map[netip.Addr][]string) (started, ended []netip.Addr) {
	if t.cur == nil {
		t.cur = map[netip.Addr]Conflict{}
	}
	for _, ip := range probed {
		macs := foreign[ip]
		old, was := t.cur[ip]
		switch {
		case len(macs) > 0 && was:
			old.MACs, old.Interface = slices.Clone(macs), iface
			t.cur[ip] = old
		case len(macs) > 0:
			t.cur[ip] = Conflict{IP: ip, Interface: iface, MACs: slices.Clone(macs), Since: now}
			started = append(started, ip)
		case was:
			delete(t.cur, ip)
			ended = append(ended, ip)
		}
	}
	slices.SortFunc(started, netip.Addr.Compare)
	slices.SortFunc(ended, netip.Addr.Compare)
	return started, ended
}

// Retain forgets the conflicts of IPs not in held (released by this Node:
// no longer ours to report) and returns them, sorted.
func (t *Tracker) Retain(held map[netip.Addr]bool) (ended []netip.Addr) {
	for ip := range t.cur {
		if !held[ip] {
			delete(t.cur, ip)
			ended = append(ended, ip)
		}
	}
	slices.SortFunc(ended, netip.Addr.Compare)
	return ended
}

// List returns the current conflicts sorted by IP (copies).
func (t *Tracker) List() []Conflict {
	out := make([]Conflict, 0, len(t.cur))
	for _, c := range t.cur {
		c.MACs = slices.Clone(c.MACs)
		out = append(out, c)
	}
	slices.SortFunc(out, func(a, b Conflict) int { return a.IP.Compare(b.IP) })
	return out
}
