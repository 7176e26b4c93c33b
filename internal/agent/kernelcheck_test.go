package agent

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	v1 "github.com/egressip/egressip/api/v1alpha1"

	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/egressip/egressip/internal/agent/kernel"
)

// missingProber finds every feature but one, which fails with err; it
// stands in for the real probes (kernel.NetNSProber, tested in netns in
// package kernel) to inject a missing feature this kernel has.
type missingProber struct {
	missing kernel.Feature
	err     error
}

func (p missingProber) Probe(f kernel.Feature) error {
	if f == p.missing {
		return p.err
	}
	return nil
}

// logLines captures log lines as text.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) add(prefix, args string) {
	l.mu.Lock()
	l.lines = append(l.lines, prefix+" "+args)
	l.mu.Unlock()
}

func (l *logLines) text() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// TestKernelProbeInjected: for each probed feature, injected missing, the
// agent logs a line naming the feature, the kernel release and what
// happens without it; the part is refused or degraded as the table says
// (and the datapath is refused exactly for its own features); the metric
// egressip_agent_kernel_feature is 0 for that feature and 1 for the
// others; and the report serves the finding the controller turns into the
// Node condition EgressKernelFeatures (False, KernelFeatureMissing, a
// message naming the feature and the release).
func TestKernelProbeInjected(t *testing.T) {
	const release = "4.18.0-553.el8_10.x86_64"
	for _, s := range kernel.Specs {
		t.Run(string(s.Feature), func(t *testing.T) {
			kerr := errors.New("operation not supported")
			k := ProbeKernel(missingProber{missing: s.Feature, err: kerr}, release, true)
			form := "nft queue"
			if s.Feature == kernel.NFQueue {
				form = "none"
			}
			k.SetRejectQueueForm(form)
			d := k.Decision()
			if got := d.Refused(s.Part); got != (s.Effect == kernel.Refuse) {
				t.Errorf("part %s refused = %v, want effect %s", s.Part, got, s.Effect)
			}
			if got := d.Degraded(s.Part); got != (s.Effect == kernel.Degrade) {
				t.Errorf("part %s degraded = %v, want effect %s", s.Part, got, s.Effect)
			}
			if d.Refused(kernel.PartDatapath) != (s.Part == kernel.PartDatapath) {
				t.Errorf("datapath refused = %v for a missing %s", d.Refused(kernel.PartDatapath), s.Feature)
			}

			var logs logLines
			st := RecordKernel(funcr.New(logs.add, funcr.Options{}), d)
			text := logs.text()
			for _, want := range []string{`"msg"="kernel feature missing"`, `"feature"="` + string(s.Feature) + `"`, `"kernel"="` + release + `"`, s.Without} {
				if !strings.Contains(text, want) {
					t.Errorf("log lacks %q:\n%s", want, text)
				}
			}
			if s.Effect == kernel.Refuse && !strings.Contains(text, "not starting a part of the agent") {
				t.Errorf("log does not say the part is not started:\n%s", text)
			}
			if s.Effect == kernel.Degrade && !strings.Contains(text, "running a part of the agent degraded") {
				t.Errorf("log does not say the part runs degraded:\n%s", text)
			}

			for _, o := range kernel.Specs {
				want := 1.0
				if o.Feature == s.Feature {
					want = 0
				}
				if got := testutil.ToFloat64(kernelFeature.WithLabelValues(string(o.Feature))); got != want {
					t.Errorf("egressip_agent_kernel_feature{feature=%q} = %v, want %v", o.Feature, got, want)
				}
			}

			a := &Agent{}
			a.SetKernelStatus(st)
			got := a.Report().Kernel
			if got == nil || got.Reason != v1.ReasonKernelFeatureMissing || got.Release != release ||
				len(got.Missing) != 1 || got.Missing[0] != string(s.Feature) {
				t.Fatalf("report's kernel finding: %+v", got)
			}
			detail := kerr.Error()
			if s.Feature == kernel.NFQueue {
				detail = errNoQueue.Error() // the datapath's finding, not the prober's
			}
			for _, want := range []string{"kernel " + release, string(s.Feature), detail} {
				if !strings.Contains(got.Message, want) {
					t.Errorf("condition message %q lacks %q", got.Message, want)
				}
			}
		})
	}
}

// TestKernelProbeAllPresent: with every feature found, the report's
// finding is KernelFeaturesPresent, every metric is 1, one log line says so.
func TestKernelProbeAllPresent(t *testing.T) {
	k := ProbeKernel(missingProber{}, "6.18.44", true)
	k.SetRejectQueueForm("xt NFQUEUE")
	var logs logLines
	st := RecordKernel(funcr.New(logs.add, funcr.Options{}), k.Decision())
	if st.Reason != v1.ReasonKernelFeaturesPresent || len(st.Missing) != 0 ||
		st.Message != fmt.Sprintf("kernel 6.18.44 has every feature probed (%d)", len(kernel.Specs)) {
		t.Errorf("finding %+v", st)
	}
	for _, s := range kernel.Specs {
		if got := testutil.ToFloat64(kernelFeature.WithLabelValues(string(s.Feature))); got != 1 {
			t.Errorf("%s = %v", s.Feature, got)
		}
	}
	if text := logs.text(); !strings.Contains(text, "kernel has every feature probed") || strings.Contains(text, "missing") {
		t.Errorf("log:\n%s", text)
	}
}
