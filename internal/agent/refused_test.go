package agent_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/egressip/egressip/internal/report"
	"github.com/egressip/egressip/internal/testutil/poll"
)

// refusal returns the report's refusal of ip, or an error.
func refusal(rep report.Report, s string) (report.RefusedIP, error) {
	r, ok := rep.LookupRefused(ip(s))
	if !ok {
		return r, fmt.Errorf("report refuses %v, not %s", rep.Refused, s)
	}
	return r, nil
}

// TestStatusOutsidePoolNotBound: the agent binds only an address that lies
// in the Egress's pool and matches its allocation. A status.egressIP set by
// hand outside every pool (8.8.8.8), a status that is not the named
// spec.egressIP, or one moved out of the pool after it was bound, is never
// bound (or is released), and the report names the Egress and says why;
// the other Egresses stay bound (issue 15 fault 3).
func TestStatusOutsidePoolNotBound(t *testing.T) {
	env := apiServer(t)
	c := env.Client
	n := newTestNode(t)
	p4 := createPool(t, c, "192.0.2.0/24", "192.0.2.1", 24)
	hand := createEgress(t, c, "hand", p4, "", n.name)
	setStatus(t, c, hand, "8.8.8.8", n.name)
	named := createEgress(t, c, "named", p4, "192.0.2.12", n.name)
	setStatus(t, c, named, "192.0.2.13", n.name)
	moved := createEgress(t, c, "moved", p4, "", n.name)
	setStatus(t, c, moved, "192.0.2.11", n.name)
	createEgress(t, c, "ok", p4, "192.0.2.10", n.name)

	r := startAgent(t, env.Config, n.name, newAgent(t, n.config()))
	never := []string{"8.8.8.8", "192.0.2.13", "198.51.100.5"}
	checkNever := func() error {
		for _, s := range never {
			if n.present(t, ip(s)) {
				return fmt.Errorf("%s is on the Node", s)
			}
		}
		return nil
	}
	poll.Until(t, 15*time.Second, "valid IPs bound, the others refused", func() error {
		if err := checkNever(); err != nil {
			t.Fatal(err)
		}
		rep, err := r.report(ctx)
		if err != nil {
			return err
		}
		if err := wantReport(rep, n.NodeIf, true, ip("192.0.2.10"), ip("192.0.2.11")); err != nil {
			return err
		}
		rf, err := refusal(rep, "8.8.8.8")
		if err != nil {
			return err
		}
		if want := fmt.Sprintf(`status.egressIP 8.8.8.8 cannot come from ExternalIPPool %q: IP 8.8.8.8 is in none of the pool's ipRanges`, p4); rf.Message != want || !slices.Equal(rf.Egresses, []string{hand}) {
			return fmt.Errorf("refusal of 8.8.8.8 = %+v, want %q for %s", rf, want, hand)
		}
		rf, err = refusal(rep, "192.0.2.13")
		if err != nil {
			return err
		}
		if want := "status.egressIP 192.0.2.13 is not the address spec.egressIP names (192.0.2.12)"; rf.Message != want || !slices.Equal(rf.Egresses, []string{named}) {
			return fmt.Errorf("refusal of 192.0.2.13 = %+v, want %q", rf, want)
		}
		return nil
	})
	if got := metricValue(t, "egressip_agent_refused_ips", map[string]string{"cause": "status"}); got != 2 {
		t.Errorf("refused_ips{cause=status} = %v, want 2", got)
	}

	// A bound address whose status is moved out of the pool is released,
	// and the new one is not bound.
	setStatus(t, c, moved, "198.51.100.5", n.name)
	poll.Until(t, 15*time.Second, "192.0.2.11 released, 198.51.100.5 refused", func() error {
		if err := checkNever(); err != nil {
			t.Fatal(err)
		}
		rep, err := r.report(ctx)
		if err != nil {
			return err
		}
		if err := wantReport(rep, n.NodeIf, true, ip("192.0.2.10")); err != nil {
			return err
		}
		rf, err := refusal(rep, "198.51.100.5")
		if err != nil {
			return err
		}
		if !strings.Contains(rf.Message, "is in none of the pool's ipRanges") || !slices.Equal(rf.Egresses, []string{moved}) {
			return fmt.Errorf("refusal of 198.51.100.5 = %+v", rf)
		}
		return nil
	})
	if owned := n.owned(t); len(owned) != 1 || owned[ip("192.0.2.10")] == "" {
		t.Errorf("owned %v, want only 192.0.2.10", owned)
	}
}

// TestNodeAddressAgentRefusesForeign: the agent still refuses to bind an
// address that is already on the Node and not its own (the Node's own
// 192.0.2.2, and a foreign secondary address), leaves both untouched, and
// reports each with why; other Egresses are bound (issue 14, build item 3,
// rule 5).
func TestNodeAddressAgentRefusesForeign(t *testing.T) {
	env := apiServer(t)
	c := env.Client
	n := newTestNode(t)
	n.Node.MustIP(t, "addr", "add", "192.0.2.77/32", "dev", n.NodeIf)
	before := n.Node.MustIP(t, "-o", "addr", "show", "dev", n.NodeIf)
	p4 := createPool(t, c, "192.0.2.0/24", "192.0.2.1", 24)
	createEgress(t, c, "own", p4, "192.0.2.2", n.name)
	createEgress(t, c, "foreign", p4, "192.0.2.77", n.name)
	createEgress(t, c, "fine", p4, "192.0.2.10", n.name)

	r := startAgent(t, env.Config, n.name, newAgent(t, n.config()))
	poll.Until(t, 15*time.Second, "192.0.2.10 bound, 192.0.2.2 and 192.0.2.77 refused", func() error {
		rep, err := r.report(ctx)
		if err != nil {
			return err
		}
		if err := wantReport(rep, n.NodeIf, true, ip("192.0.2.10")); err != nil {
			return err
		}
		for _, s := range []string{"192.0.2.2", "192.0.2.77"} {
			rf, err := refusal(rep, s)
			if err != nil {
				return err
			}
			if !strings.HasPrefix(rf.Message, s+" is already on the Node and egressip did not add it, so the agent leaves it alone (sync: bind "+s+" on "+n.NodeIf) ||
				!strings.HasSuffix(rf.Message, "; remove it from the Node or give the Egress another address") {
				return fmt.Errorf("refusal of %s: %q", s, rf.Message)
			}
		}
		return nil
	})
	if got := metricValue(t, "egressip_agent_refused_ips", map[string]string{"cause": "bind"}); got != 2 {
		t.Errorf("refused_ips{cause=bind} = %v, want 2", got)
	}
	r.stop(t)
	after := n.Node.MustIP(t, "-o", "addr", "show", "dev", n.NodeIf)
	for _, pfx := range []string{"192.0.2.2/24", "192.0.2.77/32"} {
		if !strings.Contains(before, "inet "+pfx) || !strings.Contains(after, "inet "+pfx) {
			t.Errorf("foreign %s touched:\nbefore:\n%s\nafter:\n%s", pfx, before, after)
		}
	}
	if owned := n.owned(t); len(owned) != 1 || owned[ip("192.0.2.10")] == "" {
		t.Errorf("owned %v, want only 192.0.2.10", owned)
	}
	t.Logf("addresses after the agent stopped:\n%s", after)
}
