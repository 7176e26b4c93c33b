package datapathsync_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap/zapcore"
	"k8s.io/client-go/util/retry"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/testenv"
	"github.com/egressip/egressip/internal/testutil/netnstest"
)

// The helpers below are the few of package agent's test helpers that the
// datapath reconciler's tests need (they moved here with the reconciler).

var (
	envOnce   sync.Once
	sharedEnv *testenv.Env
	envErr    error
)

func TestMain(m *testing.M) {
	ctrl.SetLogger(zap.New(zap.UseDevMode(true), zap.Level(zapcore.InfoLevel), zap.WriteTo(os.Stderr)))
	code := m.Run()
	if sharedEnv != nil {
		if err := sharedEnv.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stop envtest: %v\n", err)
		}
	}
	os.Exit(code)
}

// apiServer returns the control plane shared by the tests of this package,
// started on first use (tests use unique Node and object names).
func apiServer(t *testing.T) *testenv.Env {
	t.Helper()
	netnstest.RequireRoot(t)
	envOnce.Do(func() { sharedEnv, envErr = testenv.Start() })
	if envErr != nil {
		t.Fatalf("start envtest: %v", envErr)
	}
	return sharedEnv
}

// uniq returns prefix-<8 random hex digits>, for object names no other
// test (or earlier run against the shared API server) uses.
func uniq(prefix string) string {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return prefix + "-" + hex.EncodeToString(b)
}

// setStatus writes status.egressIP and status.egressNode of Egress name
// through the status subresource, as the controller does.
func setStatus(t *testing.T, c client.Client, name, ip, node string) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		var e v1alpha1.Egress
		if err := c.Get(context.Background(), client.ObjectKey{Name: name}, &e); err != nil {
			return err
		}
		e.Status.EgressIP, e.Status.EgressNode = ip, node
		return c.Status().Update(context.Background(), &e)
	})
	if err != nil {
		t.Fatalf("update status of Egress %s: %v", name, err)
	}
}

// metricValue returns the value of a counter or gauge from
// controller-runtime's registry; labels must match exactly. A missing
// series reads 0.
func metricValue(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := crmetrics.Registry.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !labelsEqual(m.GetLabel(), labels) {
				continue
			}
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			}
		}
	}
	return 0
}

func labelsEqual(got []*dto.LabelPair, want map[string]string) bool {
	if len(got) != len(want) {
		return false
	}
	for _, l := range got {
		if v, ok := want[l.GetName()]; !ok || v != l.GetValue() {
			return false
		}
	}
	return true
}
