package agent

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/event"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/report"
)

// TestReleaseWaitBoundedAgentRule is the agent's side of the poll's
// release instruction, as a table over one agent: an instruction holds
// back the Egress while the cache's copy is older than the instruction's
// resource version, and is forgotten once the cache catches up (the cache
// decides again, also for a later assignment back here) or once neither
// the poll nor the cache names the Egress.
func TestReleaseWaitBoundedAgentRule(t *testing.T) {
	a := &Agent{cfg: Config{NodeName: "n1"}, state: map[netip.Addr]*entry{}, kick: make(chan event.GenericEvent, 1)}
	ip := netip.MustParseAddr("192.0.2.5")
	a.state[ip] = &entry{iface: "eth0"}
	cached := func(rv, node string) []v1alpha1.Egress {
		e := eg("e1", "p1", ip.String(), node)
		e.UID, e.ResourceVersion = types.UID("uid-1"), rv
		return []v1alpha1.Egress{e}
	}
	names := func(egs []v1alpha1.Egress) []string {
		var out []string
		for _, e := range egs {
			out = append(out, e.Name)
		}
		return out
	}
	log := logr.Discard()

	if got := names(a.withoutReleased(log, cached("10", "n1"))); !slices.Equal(got, []string{"e1"}) {
		t.Fatalf("without instruction: %v, want e1", got)
	}
	before := time.Now()
	rep := a.onPoll(report.Poll{Releases: []report.Release{{IP: ip, UID: "uid-1", ResourceVersion: "12", Egress: "e1"}}})
	if rep.Node != "n1" {
		t.Fatalf("poll answered %+v", rep)
	}
	if a.LastControllerPoll().Before(before) {
		t.Fatalf("LastControllerPoll %v, want at or after %v", a.LastControllerPoll(), before)
	}
	select {
	case <-a.kick:
	default:
		t.Fatal("a new instruction for a held IP did not ask for a reconcile")
	}
	// The same instruction again asks for nothing more.
	a.onPoll(report.Poll{Releases: []report.Release{{IP: ip, UID: "uid-1", ResourceVersion: "12", Egress: "e1"}}})
	select {
	case <-a.kick:
		t.Fatal("a repeated instruction asked for another reconcile")
	default:
	}
	for _, rv := range []string{"10", "11"} {
		if got := names(a.withoutReleased(log, cached(rv, "n1"))); len(got) != 0 {
			t.Fatalf("cache at %s, instruction at 12: %v kept, want e1 held back", rv, got)
		}
	}
	// A poll that no longer carries it: still held back while the cache is older.
	a.onPoll(report.Poll{})
	if got := names(a.withoutReleased(log, cached("11", "n1"))); len(got) != 0 {
		t.Fatalf("instruction dropped while the cache is still older: %v", got)
	}
	// The cache catches up: assigned back to n1 at 13, the cache decides.
	if got := names(a.withoutReleased(log, cached("13", "n1"))); !slices.Equal(got, []string{"e1"}) {
		t.Fatalf("cache newer than the instruction: %v, want e1", got)
	}
	if got := names(a.withoutReleased(log, cached("11", "n1"))); !slices.Equal(got, []string{"e1"}) {
		t.Fatalf("the instruction outlived the catch-up: %v", got)
	}
	// Neither the poll nor the cache names it: forgotten.
	a.onPoll(report.Poll{Releases: []report.Release{{IP: ip, UID: "uid-1", ResourceVersion: "20", Egress: "e1"}}})
	a.withoutReleased(log, nil)
	a.onPoll(report.Poll{})
	a.withoutReleased(log, nil)
	if len(a.releases) != 0 {
		t.Fatalf("instructions left: %v", a.releases)
	}
}
