// Package controller holds egressip-controller's reconcilers: one scheduling
// pass over every Egress (allocation, placement, status) and the liveness
// poller that tells the pass which agents are alive and what they have bound.
//
// Where things are: setup.go wires the reconcilers to a manager;
// pass_reconciler.go reads the cache, calls plan and writes what changed;
// plan (pass.go) is the pure pass, one phase per pass_*.go file, with what
// differs between L2 and cloud pools in pass_l2.go and pass_cloud.go;
// cloud*.go hold the cloud runnable (CloudActuator) and its planning
// helpers; liveness.go polls the agents; members.go publishes
// EgressMemberSlices; metrics.go and collector.go export the metrics.
package controller

import (
	"context"
	"fmt"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// Options are the controller's tunables, set by egressip-controller's flags.
type Options struct {
	Pass     PassConfig
	Liveness LivenessConfig
	// MaxMembersPerSlice bounds the members of one EgressMemberSlice;
	// 0 means v1alpha1.MaxMembersPerSlice (100), also the largest allowed.
	MaxMembersPerSlice int
	// Cloud enables cloud-backed pools when Cloud.Provider is set.
	Cloud CloudConfig
	// AgentTLS, when set, secures the agent channel: the controller keeps
	// the agent CA, signs the agents' certificates and polls them over
	// mutual TLS (docs/security.md). nil polls over plain HTTP, for tests
	// of the controller alone; egressip-controller always sets it.
	AgentTLS *AgentTLSOptions
	// beforePass is PassReconciler.beforePass (tests only).
	beforePass func(context.Context, client.Reader)
	// onCloud, when set (tests only), receives the CloudActuator that
	// Setup creates, so that a test can read the controller's cloud view.
	onCloud func(*CloudActuator)
}

// checkReleaseTimeout refuses a release timeout that cannot work with the
// poll settings: the wait needs one poll to carry the instruction and
// another to show the release, so it must last at least two poll
// intervals. 0 (no limit) is accepted here, for tests of the pass;
// egressip-controller refuses it (CheckFlags).
func checkReleaseTimeout(t time.Duration, lc LivenessConfig) error {
	lc.defaults()
	switch {
	case t < 0:
		return fmt.Errorf("--release-timeout %v is negative", t)
	case t > 0 && t < 2*lc.Interval:
		return fmt.Errorf("--release-timeout %v must be at least twice --agent-poll-interval %v: one poll carries the release instruction, the next shows the release", t, lc.Interval)
	}
	return nil
}

// CheckFlags checks the timings egressip-controller was started with
// against each other, as Setup does, and also refuses a release timeout of
// 0 (the wait for a release must end) and a negative acquire timeout.
// The error names both flags.
func CheckFlags(o Options) error {
	if err := o.Liveness.Check(); err != nil {
		return err
	}
	if o.Pass.AcquireTimeout < 0 {
		return fmt.Errorf("--acquire-timeout %v must not be negative (0 turns the hold off)", o.Pass.AcquireTimeout)
	}
	if o.Pass.ReleaseTimeout <= 0 {
		return fmt.Errorf("--release-timeout %v must be positive (at least twice --agent-poll-interval)", o.Pass.ReleaseTimeout)
	}
	return checkReleaseTimeout(o.Pass.ReleaseTimeout, o.Liveness)
}

// The client rate limits egressip-controller's --kube-api-qps and
// --kube-api-burst default to. controller-runtime gives each resource type
// a client of its own, each with a token bucket of these sizes, so Egress
// status patches share theirs with nothing else. The burst covers a
// failover of a Node holding 200 Egresses (a patch to move each, another
// when it is Ready on its new Node) without waiting for tokens; the rate
// writes the 10,000 patches of a cold start of 5,000 Egresses in about
// 100 s (docs/install.md, "API rate limits").
const (
	DefaultKubeAPIQPS   = 100
	DefaultKubeAPIBurst = 400
)

// deferrableWrites is PassReconciler.DeferrableWrites for a client limited
// to qps requests per second: one second's worth, at least 16; unlimited when the client has no rate limit
// (qps < 0).
func deferrableWrites(qps float32) int {
	if qps < 0 {
		return 0
	}
	if qps == 0 {
		qps = 5 // client-go's default QPS
	}
	return max(int(qps), 16)
}

// Setup registers the scheduling pass, the agent liveness poller and the
// member slice publication with mgr; mgr's cache should be built with
// CacheOptions (Pods stripped). They run only on the elected leader.
func Setup(mgr ctrl.Manager, o Options) error {
	if o.Pass.DefaultCapacity <= 0 {
		return fmt.Errorf("default capacity must be positive, got %d", o.Pass.DefaultCapacity)
	}
	if err := checkReleaseTimeout(o.Pass.ReleaseTimeout, o.Liveness); err != nil {
		return err
	}
	if o.MaxMembersPerSlice < 0 || o.MaxMembersPerSlice > v1.MaxMembersPerSlice {
		return fmt.Errorf("members per slice must be between 1 and %d, got %d", v1.MaxMembersPerSlice, o.MaxMembersPerSlice)
	}
	collectorOnce.Do(func() { metrics.Registry.MustRegister(collector) })
	collector.set(mgr.GetCache(), o.Pass.DefaultCapacity)
	rec := mgr.GetEventRecorder("egressip-controller")
	if o.AgentTLS != nil {
		tlsFor, err := setupAgentTLS(mgr, *o.AgentTLS, rec)
		if err != nil {
			return err
		}
		o.Liveness.TLS = tlsFor
	}
	l := NewLiveness(mgr.GetClient(), o.Liveness)
	l.Recorder = rec
	board := newSelectedBoard()
	r := &PassReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Recorder: rec, Liveness: l, Config: o.Pass, beforePass: o.beforePass,
		DeferrableWrites: deferrableWrites(mgr.GetConfig().QPS), Selected: board}
	if o.Cloud.Provider != nil {
		r.Cloud = NewCloudActuator(mgr.GetClient(), o.Cloud)
		l.onNICs(r.Cloud.nicsReported)
		if o.onCloud != nil {
			o.onCloud(r.Cloud)
		}
	}
	if err := r.SetupWithManager(mgr); err != nil {
		return err
	}
	if err := mgr.Add(newStandbyInformers(mgr.GetCache())); err != nil {
		return fmt.Errorf("set up the standby informers: %w", err)
	}
	nd := &NodeDatapathReconciler{Client: mgr.GetClient(), Recorder: r.Recorder, Liveness: l}
	if err := nd.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up the Node datapath condition: %w", err)
	}
	m := &MembersReconciler{Client: mgr.GetClient(), MaxPerSlice: o.MaxMembersPerSlice, Selected: board}
	if err := m.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("set up member slices: %w", err)
	}
	return nil
}
