package controller

import (
	"strings"
	"testing"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// TestIPChangedNoteSingleMultiSwitch: turning a single-IP Egress into a
// multi-IP one, or back, gives the EgressIPChanged note whenever the set of
// source addresses changes (the fresh-user trial saw none either way), and
// none when it stays the same.
func TestIPChangedNoteSingleMultiSwitch(t *testing.T) {
	single := &v1.Egress{Spec: v1.EgressSpec{ExternalIPPool: "p"}, Status: v1.EgressStatus{EgressIP: "192.0.2.115", EgressNode: "n1"}}
	multi := &v1.Egress{Spec: v1.EgressSpec{IPs: []v1.EgressIPSource{{Pool: "p"}}}, Status: v1.EgressStatus{EgressIP: "192.0.2.115", EgressNode: "n1",
		IPs: []v1.EgressIPStatus{{IP: "192.0.2.115", Pool: "p", Node: "n1"}, {IP: "192.0.2.103", Pool: "p", Node: "n2"}}}}
	for _, c := range []struct {
		name string
		note string
		want []string // substrings; none: no note
	}{
		{"single to multi, one address added", multiIPChangedNote(single, []v1.EgressIPStatus{{IP: "192.0.2.115"}, {IP: "192.0.2.103"}}),
			[]string{"from 192.0.2.115 to 192.0.2.103, 192.0.2.115", "now also uses 192.0.2.103"}},
		{"single to multi, same address", multiIPChangedNote(single, []v1.EgressIPStatus{{IP: "192.0.2.115"}}), nil},
		{"multi to single, one address dropped", ipChangedNote(multi, v1.EgressStatus{EgressIP: "192.0.2.115"}),
			[]string{"from 192.0.2.103, 192.0.2.115 to 192.0.2.115", "no longer uses 192.0.2.103"}},
		{"multi to single, no address yet", ipChangedNote(multi, v1.EgressStatus{}), nil},
		{"single to single, changed", ipChangedNote(single, v1.EgressStatus{EgressIP: "192.0.2.116"}), []string{"from 192.0.2.115 to 192.0.2.116"}},
	} {
		if c.want == nil {
			if c.note != "" {
				t.Errorf("%s: want no note, got %q", c.name, c.note)
			}
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(c.note, w) {
				t.Errorf("%s: note %q lacks %q", c.name, c.note, w)
			}
		}
	}
}
