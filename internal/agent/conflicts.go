package agent

import (
	"context"
	"net/netip"
	"slices"

	"github.com/egressip/egressip/internal/agent/conflict"
	"github.com/egressip/egressip/internal/report"
)

// Duplicate-IP detection (issue 16 item 3): the Checker of package
// conflict probes every IP assigned here and bound at start, after each
// bind and every Config.ConflictInterval; this file feeds it and turns its
// rounds into the report's conflicts and the metrics. The agent never
// unbinds because of a conflict: the controller's assignment stands, and
// the condition tells a person to find the other host.

// conflictTargets returns the IPs assigned here and bound, with their
// interfaces.
func (a *Agent) conflictTargets() []conflict.Target {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]conflict.Target, 0, len(a.state))
	for ip, e := range a.state {
		if e.want {
			out = append(out, conflict.Target{IP: ip, Interface: e.iface})
		}
	}
	return out
}

// onConflictRound publishes a round: the conflicts and the Node's MACs for
// the report, the metrics, and a log line for each conflict that starts
// or ends.
func (a *Agent) onConflictRound(r conflict.Round) {
	out := make([]report.ConflictIP, 0, len(r.Conflicts))
	n := map[string]int{}
	for _, c := range r.Conflicts {
		macs := c.MACs
		if len(macs) > report.MaxMACs {
			macs = macs[:report.MaxMACs]
		}
		out = append(out, report.ConflictIP{IP: c.IP, Interface: c.Interface, MACs: slices.Clone(macs), Since: c.Since})
		n[familyOf(c.IP)]++
	}
	a.conflicts.Store(&out)
	if macs, err := a.prober.AddressedMACs(report.MaxMACs); err == nil {
		a.macs.Store(&macs)
	}
	for _, f := range []string{familyIPv4, familyIPv6} {
		conflictIPs.WithLabelValues(f).Set(float64(n[f]))
	}
	byIP := map[netip.Addr]conflict.Conflict{}
	for _, c := range r.Conflicts {
		byIP[c.IP] = c
	}
	for _, ip := range r.Started {
		conflictsDetected.WithLabelValues(familyOf(ip)).Inc()
		c := byIP[ip]
		a.log.Info("duplicate IP: another host answers for an egress IP bound here; keeping it and reporting the conflict",
			"ip", ip, "interface", c.Interface, "otherMACs", c.MACs)
	}
	for _, ip := range r.Ended {
		a.log.Info("duplicate IP conflict ended: no other host answered the last probe round, or the IP left this Node", "ip", ip)
	}
	conflictProbeErrors.Add(float64(len(r.Errors)))
}

// reportConflicts adds the conflicts of IPs still bound, and the Node's
// MACs, to r. Callers hold a.mu (the state is read).
func (a *Agent) reportConflicts(r *report.Report) {
	if p := a.conflicts.Load(); p != nil {
		for _, c := range *p {
			if _, bound := a.state[c.IP]; bound {
				c.MACs = slices.Clone(c.MACs)
				r.Conflicts = append(r.Conflicts, c)
			}
		}
	}
	if p := a.macs.Load(); p != nil && len(*p) > 0 {
		r.MACs = slices.Clone(*p)
	}
}

// runConflictChecks runs the duplicate-IP checker until ctx is done (a
// manager runnable); it returns nil, also when the checks are off.
func (a *Agent) runConflictChecks(ctx context.Context) error {
	if a.checker == nil {
		return nil
	}
	return a.checker.Run(ctx)
}
