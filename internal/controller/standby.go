package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// standbyInformers starts, on every replica and not only once it is
// elected, the informers that a new leader's first poll and first pass
// wait for: Egresses, ExternalIPPools and Nodes. controller-runtime creates
// an informer when a controller's watch or a first read asks for it, which
// on a standby happens only after it has taken the Lease, so its poller
// and its first pass would wait for a full List of every Egress and Node
// (seconds at 5,000 Egresses and 1,000 Nodes; docs/failover.md, "Leader
// takeover"). A standby holds the same caches as the leader for these
// kinds, at the leader's memory cost.
type standbyInformers struct {
	cache cache.Cache
	kinds []client.Object
}

// newStandbyInformers returns the runnable for the pass's and the
// poller's kinds.
func newStandbyInformers(c cache.Cache) standbyInformers {
	return standbyInformers{cache: c, kinds: []client.Object{&v1.Egress{}, &v1.ExternalIPPool{}, &corev1.Node{}}}
}

// Start starts each informer and waits until it has synced, then returns
// nil. It fails when an informer cannot be created or ctx ends before its
// sync.
func (s standbyInformers) Start(ctx context.Context) error {
	for _, k := range s.kinds {
		if _, err := s.cache.GetInformer(ctx, k); err != nil {
			return fmt.Errorf("start the %T informer before the election: %w", k, err)
		}
	}
	return nil
}

// NeedLeaderElection is false: the informers run on standbys too.
func (standbyInformers) NeedLeaderElection() bool { return false }
