package kernel

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestKernelProbeDecide: features found -> which parts are refused or
// degraded, and what the condition message says.
func TestKernelProbeDecide(t *testing.T) {
	missing := errors.New("operation not supported")
	all := func(except ...Feature) map[Feature]error {
		r := map[Feature]error{}
		for _, f := range FeaturesOf(PartDatapath, PartRejectQueue, PartOwnership) {
			r[f] = nil
		}
		for _, f := range except {
			r[f] = missing
		}
		return r
	}
	for _, tc := range []struct {
		name            string
		results         map[Feature]error
		refused         []Part
		degraded        []Part
		msgHas, msgNot  []string
		present, absent []Feature
	}{
		{name: "everything", results: all(), msgHas: []string{"kernel 5.14.0 has every feature probed (11)"}, present: []Feature{VXLANGPE, IFAProto}},
		{name: "no VXLAN-GPE", results: all(VXLANGPE), refused: []Part{PartDatapath},
			msgHas: []string{"kernel 5.14.0: datapath not started, missing vxlan-gpe (operation not supported)"}, absent: []Feature{VXLANGPE}, present: []Feature{NftSets}},
		{name: "no NFQUEUE", results: all(NFQueue), degraded: []Part{PartRejectQueue},
			msgHas: []string{"reject-queue degraded, missing nfqueue"}, msgNot: []string{"datapath"}},
		{name: "no IFA_PROTO", results: all(IFAProto), degraded: []Part{PartOwnership},
			msgHas: []string{"address-ownership degraded, missing ifa-proto"}},
		{name: "two parts, two features in one", results: all(NftInetNAT, SysctlRPFilter, NFQueue), refused: []Part{PartDatapath}, degraded: []Part{PartRejectQueue},
			msgHas: []string{"datapath not started, missing nft-inet-nat (operation not supported), sysctl-ipv4-rp-filter (operation not supported); reject-queue degraded, missing nfqueue"}},
		{name: "datapath not probed", results: map[Feature]error{IFAProto: nil},
			msgHas: []string{"every feature probed (1)"}, absent: []Feature{VXLANGPE}, present: []Feature{IFAProto}},
		{name: "unknown feature ignored", results: map[Feature]error{"no-such": missing},
			msgHas: []string{"every feature probed (0)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := Decide("5.14.0", tc.results)
			for _, p := range []Part{PartDatapath, PartRejectQueue, PartOwnership} {
				wantR, wantD := slices.Contains(tc.refused, p), slices.Contains(tc.degraded, p)
				if d.Refused(p) != wantR || d.Degraded(p) != wantD {
					t.Errorf("part %s: refused %v degraded %v, want %v %v", p, d.Refused(p), d.Degraded(p), wantR, wantD)
				}
			}
			msg := d.ConditionMessage()
			for _, s := range tc.msgHas {
				if !strings.Contains(msg, s) {
					t.Errorf("message %q lacks %q", msg, s)
				}
			}
			for _, s := range tc.msgNot {
				if strings.Contains(msg, s) {
					t.Errorf("message %q has %q", msg, s)
				}
			}
			for _, f := range tc.present {
				if !d.Present(f) {
					t.Errorf("%s not present", f)
				}
			}
			for _, f := range tc.absent {
				if d.Present(f) {
					t.Errorf("%s present", f)
				}
			}
		})
	}
}

// TestKernelProbeMessageBounded: a condition message with long kernel
// errors is cut at MaxConditionMessage bytes.
func TestKernelProbeMessageBounded(t *testing.T) {
	r := map[Feature]error{}
	for _, f := range FeaturesOf(PartDatapath) {
		r[f] = errors.New(strings.Repeat("x", 300))
	}
	msg := Decide("6.1.0", r).ConditionMessage()
	if len(msg) != MaxConditionMessage || !strings.HasSuffix(msg, "...") || !strings.HasPrefix(msg, "kernel 6.1.0: datapath not started") {
		t.Errorf("message of %d bytes: %.80q...", len(msg), msg)
	}
}

// TestKernelProbeSpecs: every feature is in the table once, with an
// effect and a consequence, and the message of a missing one names the
// feature, the release and the consequence.
func TestKernelProbeSpecs(t *testing.T) {
	seen := map[Feature]bool{}
	for _, s := range Specs {
		if seen[s.Feature] || s.Without == "" || (s.Effect != Refuse && s.Effect != Degrade) {
			t.Errorf("bad or duplicate row %+v", s)
		}
		seen[s.Feature] = true
		m := Missing{Spec: s, Detail: "no such file or directory"}.Message("4.18.0-553.el8_10.x86_64")
		for _, want := range []string{string(s.Feature), "4.18.0-553.el8_10.x86_64", s.Without, "no such file or directory"} {
			if !strings.Contains(m, want) {
				t.Errorf("message %q lacks %q", m, want)
			}
		}
	}
}
