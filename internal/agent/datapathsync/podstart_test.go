package datapathsync_test

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent"
	"github.com/egressip/egressip/internal/agent/datapathsync"
	"github.com/egressip/egressip/internal/podstart"
	"github.com/egressip/egressip/internal/podstart/cniapi"
	"github.com/egressip/egressip/internal/testutil/poll"
)

// cniAdd runs the egressip-cni binary's ADD as a runtime would, chained
// after a main plugin whose result gives ips, and returns its stdout.
func cniAdd(bin, sock, ns, name string, timeout int, ips ...string) (string, error) {
	var ipl []string
	for _, ip := range ips {
		bits := "/32"
		if strings.Contains(ip, ":") {
			bits = "/128"
		}
		ipl = append(ipl, fmt.Sprintf(`{"address":%q,"interface":0}`, ip+bits))
	}
	conf := fmt.Sprintf(`{"cniVersion":"1.0.0","name":"k8s","type":%q,"socket":%q,"timeoutSeconds":%d,
		"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0","sandbox":"/var/run/netns/x"}],"ips":[%s]}}`,
		cniapi.PluginType, sock, timeout, strings.Join(ipl, ","))
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "CNI_COMMAND=ADD", "CNI_CONTAINERID=c-"+name, "CNI_NETNS=/var/run/netns/x",
		"CNI_IFNAME=eth0", "CNI_PATH="+filepath.Dir(bin),
		"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE="+ns+";K8S_POD_NAME="+name)
	cmd.Stdin = strings.NewReader(conf)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

// TestPodStartGateClassifiesBeforeStatus (issue 23, fault 2) runs the
// agent's datapath reconciler on a real API server with a recording
// engine, the pod-start socket (podstart.Run with the reconciler as its
// Gate) and the real egressip-cni binary: for a Pod in a selected
// namespace whose status has no IP yet (the kubelet writes it after the
// ADD), the plugin's ADD returns only once a State with the Pod's IPs as
// e1's members has been applied; a Pod no Egress selects is answered with
// no membership; a Pod this agent's cache does not hold (another Node's)
// fails the ADD after timeoutSeconds, so the kubelet retries; with no
// socket at all (no agent on the Node) the ADD passes its result on.
func TestPodStartGateClassifiesBeforeStatus(t *testing.T) {
	bin := filepath.Join(t.TempDir(), cniapi.PluginType)
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/egressip/egressip/cmd/cni").CombinedOutput(); err != nil {
		t.Fatalf("build egressip-cni: %v: %s", err, out)
	}
	env := apiServer(t)
	c := env.Client
	ctx := context.Background()
	src, gw := uniq("psn"), uniq("psn")
	mkNode(t, c, src, "192.0.2.31", "10.31.0.0/24")
	mkNode(t, c, gw, "192.0.2.32", "10.32.0.0/24")
	pay, other := uniq("pay"), uniq("other")
	for _, ns := range []string{pay, other} {
		if err := c.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"tier": ns}}}); err != nil {
			t.Fatal(err)
		}
	}
	e1 := &v1alpha1.Egress{ObjectMeta: metav1.ObjectMeta{Name: uniq("e1")}, Spec: v1alpha1.EgressSpec{
		AppliedTo:      v1alpha1.AppliedTo{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"tier": pay}}},
		ExternalIPPool: "none",
	}}
	if err := c.Create(ctx, e1); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), e1) })
	setStatus(t, c, e1.Name, "198.51.100.31", gw)

	// Pods created, scheduled to src, no status yet: the sandbox phase.
	mkSpecOnly := func(ns, name, node string) {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.invalid/c"}}}}
		if err := c.Create(ctx, p); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), p) })
	}
	mkSpecOnly(pay, "app", src)
	mkSpecOnly(other, "web", src)
	mkSpecOnly(pay, "elsewhere", gw)

	rec := &recordingDP{}
	mgr, err := agent.NewDatapathManager(env.Config, src, manager.Options{Metrics: metricsserver.Options{BindAddress: "0"}, HealthProbeBindAddress: "0"})
	if err != nil {
		t.Fatal(err)
	}
	r := &datapathsync.Reconciler{NodeName: src, DP: rec, ResyncPeriod: time.Hour}
	if err := r.SetupWithManager(mgr); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(t.TempDir(), "agent.sock")
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		return podstart.Run(ctx, podstart.Options{Socket: sock, Gate: r})
	})); err != nil {
		t.Fatal(err)
	}
	mctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
	poll.Until(t, 30*time.Second, "socket served", func() error { _, err := os.Stat(sock); return err })

	// The selected Pod: the ADD's return implies the State applied.
	out, err := cniAdd(bin, sock, pay, "app", 20, "10.31.0.7", "fd00:31::7")
	if err != nil {
		t.Fatalf("ADD of %s/app: %v: %s", pay, err, out)
	}
	st, _ := rec.last()
	e, ok := egressOf(st, e1.Name)
	want := []netip.Addr{netip.MustParseAddr("10.31.0.7")}
	if !ok || !slices.Equal(e.Local, want) {
		t.Fatalf("when the ADD returned, the applied State has e1 = %+v (present %v), want Local %v", e, ok, want)
	}
	if !strings.Contains(out, `"10.31.0.7/32"`) || !strings.Contains(out, `"fd00:31::7/128"`) {
		t.Errorf("the plugin did not pass the previous result on: %s", out)
	}

	// An unselected Pod: answered, no membership.
	if out, err := cniAdd(bin, sock, other, "web", 20, "10.31.0.8"); err != nil {
		t.Fatalf("ADD of %s/web: %v: %s", other, err, out)
	}
	st, _ = rec.last()
	if e, _ := egressOf(st, e1.Name); slices.Contains(e.Local, netip.MustParseAddr("10.31.0.8")) {
		t.Errorf("an unselected Pod became a member: %+v", e)
	}

	// Not in this agent's cache: the ADD fails after its timeout.
	start := time.Now()
	out, err = cniAdd(bin, sock, pay, "elsewhere", 1, "10.31.0.9")
	if err == nil || !strings.Contains(out, "not classified") {
		t.Errorf("ADD of a Pod of another Node: err %v, output %s; want a failure naming the cause", err, out)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the failing ADD took %v, beyond its 1 s timeout", d)
	}

	// The Pod's status arrives: the announcement is no longer needed, and
	// the membership stays.
	var p corev1.Pod
	if err := c.Get(ctx, types.NamespacedName{Namespace: pay, Name: "app"}, &p); err != nil {
		t.Fatal(err)
	}
	p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.31.0.7", PodIPs: []corev1.PodIP{{IP: "10.31.0.7"}, {IP: "fd00:31::7"}}}
	if err := c.Status().Update(ctx, &p); err != nil {
		t.Fatal(err)
	}
	poll.Until(t, 30*time.Second, "membership kept after the status", func() error {
		st, _ := rec.last()
		if e, ok := egressOf(st, e1.Name); !ok || !slices.Equal(e.Local, want) {
			return fmt.Errorf("e1 = %+v", e)
		}
		return nil
	})

	// No agent on the Node: the ADD passes the result on.
	if out, err := cniAdd(bin, filepath.Join(t.TempDir(), "absent.sock"), pay, "app", 1, "10.31.0.7"); err != nil || !strings.Contains(out, "10.31.0.7/32") {
		t.Errorf("ADD without an agent: %v: %s", err, out)
	}
}
