package agent

import (
	"context"
	"maps"
	"net/netip"
	"slices"
	"time"

	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/egressip/egressip/internal/agent/bind"
	"github.com/egressip/egressip/internal/agent/conflict"
)

// The takeover guard. Fencing (package fence) makes a Node cut off from
// the controller release its egress IPs before the controller can declare
// it dead and move them, but that is a race between two timers on two
// machines: the fence ends about 150 ms before the move with the default
// flags, and a loaded Node whose timers run late still answers when the
// new Node binds (seen once in CI: the cut-off Node answered ARP for
// 100 ms after the new one's first answer). So before binding an IP it
// does not hold, the agent probes for it on the interface it would bind
// it on (an ARP probe, RFC 5227 section 2.1.1, or a DAD-style Neighbor
// Solicitation, RFC 4862 section 5.4, the frames of package conflict),
// and while another host answers it holds the bind back, probing again
// every takeoverRetry, for at most Config.TakeoverGuard. Then it binds
// anyway: a host that still answers after that is not an egressip Node
// letting go, and the duplicate-IP checker reports it as a conflict.
// Addresses of cloud-backed pools (a bind hint with a MAC) are not
// probed: the cloud attaches them to one interface at a time.

// Defaults of the takeover guard.
const (
	// DefaultTakeoverGuard is the default of Config.TakeoverGuard
	// (--takeover-guard): the controller's default dead-after (2 s), so
	// a cut-off Node whose fence runs up to that late still never answers
	// together with the new one.
	DefaultTakeoverGuard = 2 * time.Second
	// takeoverRetry is how soon a reconcile that held an IP back runs
	// again to probe it.
	takeoverRetry = 50 * time.Millisecond
	// Outcomes of egressip_agent_takeover_guard_total.
	guardHeld    = "held"
	guardExpired = "expired"
)

// DefaultTakeoverProbe is the guard's probe round: two probes 10 ms apart
// and 20 ms of listening after the last, so a bind waits 30 ms when
// nobody answers. The kernel of a Node holding the address answers an
// ARP probe or a DAD Neighbor Solicitation itself, within a millisecond
// on a LAN, whatever its user space is doing.
var DefaultTakeoverProbe = conflict.ProbeConfig{Probes: 2, Spacing: 10 * time.Millisecond, Wait: 20 * time.Millisecond}

// takeoverGuard is the guard's state between reconciles.
type takeoverGuard struct {
	// since is, for each IP held back, when the guard first saw another
	// host answer for it in the current hold.
	since map[netip.Addr]time.Time
}

// guardTakeovers probes the IPs of ips that this Node does not own yet
// (owned, as read before the bind) and returns those to hold back: the
// ones another host answered for, for less than Config.TakeoverGuard
// since the guard first saw it. It holds nothing when the guard is off,
// the owned addresses are unknown (ownedErr), or a probe fails: the guard
// never keeps an address unbound on an error of its own.
func (a *Agent) guardTakeovers(ctx context.Context, ips []netip.Addr, hints map[netip.Addr]bind.Hint,
	owned []bind.Bound, ownedErr error) map[netip.Addr]bool {
	log := ctrllog.FromContext(ctx)
	if a.cfg.TakeoverGuard < 0 || a.prober == nil || ownedErr != nil {
		a.guard.since = nil
		return nil
	}
	have := make(map[netip.Addr]bool, len(owned))
	for _, b := range owned {
		have[b.Addr] = true
	}
	byIface := map[string][]netip.Addr{}
	for _, ip := range ips {
		if have[ip] || hints[ip].MAC != "" {
			continue
		}
		iface, err := a.binder.Interface(ip)
		if err != nil {
			continue // the bind fails too, and says why
		}
		byIface[iface] = append(byIface[iface], ip)
	}
	if len(byIface) == 0 {
		a.guard.since = nil
		return nil
	}
	own, err := a.prober.OwnMACs()
	if err != nil {
		log.Error(err, "takeover guard: cannot list this Node's MACs; binding without probing")
		a.guard.since = nil
		return nil
	}
	now := time.Now()
	held, expired, probedIPs := map[netip.Addr]bool{}, map[netip.Addr]bool{}, map[netip.Addr]bool{}
	next := map[netip.Addr]time.Time{}
	for _, iface := range slices.Sorted(maps.Keys(byIface)) {
		probed := byIface[iface]
		answers, err := a.prober.ProbeWith(ctx, iface, probed, a.cfg.TakeoverProbe)
		for _, ip := range probed {
			probedIPs[ip] = err == nil
		}
		if err != nil {
			conflictProbeErrors.Inc()
			log.Error(err, "takeover guard: probe failed; binding without it", "interface", iface, "ips", probed)
			continue
		}
		for ip, macs := range conflict.Foreign(answers, probed, own) {
			since, ok := a.guard.since[ip]
			if !ok {
				since = now
			}
			if waited := now.Sub(since); waited >= a.cfg.TakeoverGuard {
				takeoverHolds.WithLabelValues(guardExpired).Inc()
				expired[ip] = true
				log.Info("takeover guard: another host still answers for this egress IP; binding it anyway, the duplicate-IP check reports the conflict",
					"ip", ip, "interface", iface, "otherMACs", macs, "waited", waited)
				continue
			}
			if !ok {
				log.Info("takeover guard: another host still answers for this egress IP; holding the bind until it stops",
					"ip", ip, "interface", iface, "otherMACs", macs, "atMost", a.cfg.TakeoverGuard)
			}
			takeoverHolds.WithLabelValues(guardHeld).Inc()
			held[ip] = true
			next[ip] = since
		}
	}
	for ip, since := range a.guard.since {
		if !held[ip] && !expired[ip] && probedIPs[ip] {
			log.Info("takeover guard: the other host stopped answering; binding", "ip", ip, "held", now.Sub(since))
		}
	}
	a.guard.since = next
	return held
}

// without returns ips less those in drop (ips itself when drop is empty).
func without(ips []netip.Addr, drop map[netip.Addr]bool) []netip.Addr {
	if len(drop) == 0 {
		return ips
	}
	return slices.DeleteFunc(slices.Clone(ips), func(ip netip.Addr) bool { return drop[ip] })
}
