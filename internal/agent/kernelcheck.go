package agent

import (
	"errors"

	v1 "github.com/egressip/egressip/api/v1alpha1"

	"github.com/go-logr/logr"

	"github.com/egressip/egressip/internal/agent/kernel"
	"github.com/egressip/egressip/internal/report"
)

// KernelCheck collects the agent's start-up probe of kernel features
// (package kernel): ProbeKernel probes what can be probed before the
// datapath starts, SetRejectQueueForm adds the datapath's own queue probe,
// Decision decides and Record logs, sets the metric and returns the
// finding the report serves (and the controller turns into the Node
// condition EgressKernelFeatures).
type KernelCheck struct {
	release string
	results map[kernel.Feature]error
}

// ProbeKernel probes, with p, the features of address ownership and, when
// withDatapath, those of the datapath (all but the reject queue's, see
// SetRejectQueueForm). release is the kernel release the messages name
// (kernel.Release()).
func ProbeKernel(p kernel.Prober, release string, withDatapath bool) *KernelCheck {
	parts := []kernel.Part{kernel.PartOwnership}
	if withDatapath {
		parts = append(parts, kernel.PartDatapath)
	}
	return &KernelCheck{release: release, results: kernel.ProbeAll(p, kernel.FeaturesOf(parts...))}
}

// rejectQueueNone is what Engine.RejectQueueForm says when there is no
// reject queue (datapath.Datapath.RejectQueueForm).
const rejectQueueNone = "none"

// errNoQueue is the NFQueue finding when the datapath found neither queue
// form.
var errNoQueue = errors.New("nftables accepts neither the queue expression nor xtables' NFQUEUE target")

// SetRejectQueueForm records the reject queue probe of the started
// datapath (Engine.RejectQueueForm): "none" means NFQueue is missing.
// Call it only when the reject queue is configured (not -1).
func (k *KernelCheck) SetRejectQueueForm(form string) {
	if form == rejectQueueNone {
		k.results[kernel.NFQueue] = errNoQueue
		return
	}
	k.results[kernel.NFQueue] = nil
}

// Decision is the decision for the features probed so far.
func (k *KernelCheck) Decision() kernel.Decision { return kernel.Decide(k.release, k.results) }

// RecordKernel logs one line per missing feature (naming it, the kernel
// release and what happens without it) and one line for each part refused
// or degraded, sets egressip_agent_kernel_feature for every feature probed
// (1 present, 0 missing), and returns the finding for the report.
func RecordKernel(log logr.Logger, d kernel.Decision) *report.KernelStatus {
	st := &report.KernelStatus{Release: d.Release, Reason: v1.ReasonKernelFeaturesPresent, Message: d.ConditionMessage()}
	for _, f := range d.Probed {
		v := 0.0
		if d.Present(f) {
			v = 1
		}
		kernelFeature.WithLabelValues(string(f)).Set(v)
	}
	for _, m := range d.Missing {
		st.Missing = append(st.Missing, string(m.Feature))
		log.Info("kernel feature missing", "feature", m.Feature, "kernel", d.Release, "part", m.Part, "effect", m.Effect,
			"message", m.Message(d.Release))
	}
	if len(d.Missing) > 0 {
		st.Reason = v1.ReasonKernelFeatureMissing
	}
	for _, p := range []kernel.Part{kernel.PartDatapath, kernel.PartRejectQueue, kernel.PartOwnership} {
		switch {
		case d.Refused(p):
			log.Error(errors.New(st.Message), "not starting a part of the agent: the kernel lacks a feature it needs", "part", p, "kernel", d.Release)
		case d.Degraded(p):
			log.Info("running a part of the agent degraded: the kernel lacks a feature", "part", p, "kernel", d.Release)
		}
	}
	if len(d.Missing) == 0 {
		log.Info("kernel has every feature probed", "kernel", d.Release, "features", d.Probed)
	}
	return st
}
