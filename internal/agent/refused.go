package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/egressip/egressip/internal/agent/bind"
	"github.com/egressip/egressip/internal/report"
)

// Causes of egressip_agent_refused_ips.
const (
	refusedStatus = "status" // status.egressIP is not what the allocation allows
	refusedBind   = "bind"   // binding failed (foreign address, no interface, netlink)
)

// setRefused stores the refusals the report serves and sets the metric:
// status are computeDesired's, bindFailed those of the last Sync.
func (a *Agent) setRefused(status, bindFailed []report.RefusedIP) {
	all := append(slices.Clone(status), bindFailed...)
	slices.SortFunc(all, func(x, y report.RefusedIP) int { return x.IP.Compare(y.IP) })
	a.mu.Lock()
	a.refused = all
	a.mu.Unlock()
	refusedIPs.WithLabelValues(refusedStatus).Set(float64(len(status)))
	refusedIPs.WithLabelValues(refusedBind).Set(float64(len(bindFailed)))
}

// bindRefusals returns, for every desired IP that is not bound after Sync
// (byIP: what egressip owns now), the error Sync gave for it, worded for
// the Egress's Ready condition. A foreign address (bind.ErrForeignAddress)
// says it is left alone.
func bindRefusals(desired []netip.Addr, byIP map[netip.Addr][]bind.Bound, syncErr error) []report.RefusedIP {
	var out []report.RefusedIP
	for _, ip := range desired {
		if len(byIP[ip]) > 0 {
			continue
		}
		err := errorFor(syncErr, ip)
		var msg string
		switch {
		case errors.Is(err, bind.ErrForeignAddress):
			msg = fmt.Sprintf("%s is already on the Node and egressip did not add it, so the agent leaves it alone (%v); remove it from the Node or give the Egress another address", ip, err)
		case err != nil:
			msg = fmt.Sprintf("binding failed: %v", err)
		default:
			msg = "binding failed; see the agent's log"
		}
		out = append(out, report.RefusedIP{IP: ip, Message: truncate(msg, report.MaxRefusedMessage)})
	}
	return out
}

// errorFor picks the error of one IP out of Sync's joined error. bind
// words each per-IP error "sync: bind <ip> ..." or, for an address it
// rejects outright, ends it with the quoted IP.
func errorFor(syncErr error, ip netip.Addr) error {
	var list []error
	if j, ok := syncErr.(interface{ Unwrap() []error }); ok {
		list = j.Unwrap()
	} else if syncErr != nil {
		list = []error{syncErr}
	}
	for _, e := range list {
		s := e.Error()
		if strings.Contains(s, "bind "+ip.String()+" ") || strings.Contains(s, "bind "+ip.String()+":") || strings.Contains(s, fmt.Sprintf("%q", ip.String())) {
			return e
		}
	}
	return nil
}
