package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent/bind"
	"github.com/egressip/egressip/internal/agent/kernel"
	"github.com/egressip/egressip/internal/report"
	"github.com/egressip/egressip/internal/testenv"
	"github.com/egressip/egressip/internal/testutil/netnstest"
	"github.com/egressip/egressip/internal/testutil/poll"
)

// runMainEnv makes the test binary act as egressip-agent (see TestMain), so
// the tests run the real main path, signal handling included.
const runMainEnv = "EGRESSIP_AGENT_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		os.Exit(run(os.Args[1:], os.Stderr))
	}
	os.Exit(m.Run())
}

// syncBuffer is a bytes.Buffer safe for the exec copier and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type agentProc struct {
	cmd    *exec.Cmd
	stderr *syncBuffer
	done   chan struct{}
	err    error
}

// startAgentProc starts the agent as a child process with args and env
// (NODE_NAME is removed from the inherited environment); it is killed in
// t.Cleanup if still running.
func startAgentProc(t *testing.T, env []string, args ...string) *agentProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "NODE_NAME=") && !strings.HasPrefix(kv, runMainEnv+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, runMainEnv+"=1")
	cmd.Env = append(cmd.Env, env...)
	p := &agentProc{cmd: cmd, stderr: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = p.stderr
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatalf("start agent: %v", err)
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("agent stderr:\n%s", p.stderr.String())
		}
	})
	return p
}

// wait returns the exit code, failing the test after timeout.
func (p *agentProc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
	case <-time.After(timeout):
		t.Fatalf("agent still running after %s", timeout)
	}
	if ee, ok := errors.AsType[*exec.ExitError](p.err); ok {
		return ee.ExitCode()
	}
	if p.err != nil {
		t.Fatalf("wait for agent: %v", p.err)
	}
	return 0
}

func TestMissingNodeNameFails(t *testing.T) {
	p := startAgentProc(t, nil, "--report-bind-address", "127.0.0.1:0")
	if code := p.wait(t, 30*time.Second); code != 2 {
		t.Fatalf("exit code %d, want 2", code)
	}
	for _, want := range []string{"node name unknown", "--node-name", "NODE_NAME"} {
		if !strings.Contains(p.stderr.String(), want) {
			t.Errorf("stderr does not mention %q:\n%s", want, p.stderr.String())
		}
	}
}

func TestBadFlagFails(t *testing.T) {
	p := startAgentProc(t, []string{"NODE_NAME=n1"}, "--announce-interval", "soon")
	if code := p.wait(t, 30*time.Second); code != 2 {
		t.Fatalf("exit code %d, want 2", code)
	}
	if !strings.Contains(p.stderr.String(), "announce-interval") {
		t.Errorf("stderr does not name the bad flag:\n%s", p.stderr.String())
	}
}

// TestReportTLSFlagsChecked: the mutual-TLS report (the default) needs
// the namespace of the agent CA and a lifetime the CSR API accepts; each
// refusal exits 2 naming the flag.
func TestReportTLSFlagsChecked(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "--agent-ca-namespace"},
		{[]string{"--agent-ca-namespace", "egressip-system", "--certificate-lifetime", "5m"}, "--certificate-lifetime"},
	} {
		p := startAgentProc(t, []string{"NODE_NAME=n1"}, tc.args...)
		if code := p.wait(t, 30*time.Second); code != 2 {
			t.Fatalf("%v: exit code %d, want 2", tc.args, code)
		}
		if !strings.Contains(p.stderr.String(), tc.want) {
			t.Errorf("%v: stderr %q does not name %s", tc.args, p.stderr.String(), tc.want)
		}
	}
}

func TestBadCIDRFlagFails(t *testing.T) {
	for _, v := range []string{"10.0.0.0/33", "10.1.2.3/8", "banana"} {
		p := startAgentProc(t, []string{"NODE_NAME=n1"}, "--service-cidrs", "10.96.0.0/12,"+v)
		if code := p.wait(t, 30*time.Second); code != 2 {
			t.Fatalf("--service-cidrs ...,%s: exit code %d, want 2", v, code)
		}
		if !strings.Contains(p.stderr.String(), "service-cidrs") || !strings.Contains(p.stderr.String(), v) {
			t.Errorf("stderr does not name the flag and the bad value %q:\n%s", v, p.stderr.String())
		}
	}
}

func TestBadOwnershipFlagsFail(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--address-ownership", "labels"}, "--address-ownership"},
		// With --netns there is no default record, and record mode needs one.
		{[]string{"--address-ownership=record", "--netns", "/run/netns/none"}, "--ownership-record"},
	} {
		p := startAgentProc(t, []string{"NODE_NAME=n1"}, tc.args...)
		if code := p.wait(t, 30*time.Second); code != 2 {
			t.Fatalf("%q: exit code %d, want 2", tc.args, code)
		}
		if !strings.Contains(p.stderr.String(), tc.want) {
			t.Errorf("%q: stderr does not mention %s:\n%s", tc.args, tc.want, p.stderr.String())
		}
	}
}

// TestBadLifetimeFlagsFail: address lifetimes that cannot work with the
// renew interval or the controller's dead-after are refused at start,
// naming both flags.
func TestBadLifetimeFlagsFail(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--address-lifetime=3s", "--address-renew-interval=2s"}, []string{"--address-lifetime 3s", "--address-renew-interval 2s"}},
		{[]string{"--address-lifetime=5s", "--controller-dead-after=3s"}, []string{"--address-lifetime 5s", "--controller-dead-after 3s"}},
		{[]string{"--address-lifetime=2500ms"}, []string{"--address-lifetime 2.5s", "whole seconds"}},
	} {
		p := startAgentProc(t, []string{"NODE_NAME=n1"}, tc.args...)
		if code := p.wait(t, 30*time.Second); code != 2 {
			t.Fatalf("%q: exit code %d, want 2", tc.args, code)
		}
		for _, w := range tc.want {
			if !strings.Contains(p.stderr.String(), w) {
				t.Errorf("%q: stderr does not mention %q:\n%s", tc.args, w, p.stderr.String())
			}
		}
	}
}

// TestFenceTimingsRefused: fencing timings that cannot work together are
// refused at start (exit code 2) with a message naming both flags.
func TestFenceTimingsRefused(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--fence-timeout=3s"}, []string{"--fence-timeout", "--controller-dead-after"}},
		{[]string{"--controller-dead-after=1500ms", "--address-lifetime=1s"}, []string{"--fence-timeout", "--controller-dead-after"}},
		{[]string{"--peer-probe-interval=1s"}, []string{"--fence-timeout", "--peer-probe-interval"}},
		{[]string{"--fence-timeout=1200ms"}, []string{"--fence-timeout", "--controller-poll-interval"}},
		{[]string{"--controller-poll-interval=1s", "--controller-dead-after=3s", "--address-lifetime=2s"}, []string{"--fence-timeout 1.4s is less than twice --controller-poll-interval 1s"}},
		{[]string{"--peers=0"}, []string{"--peers"}},
		{[]string{"--peer-node-selector=a b"}, []string{"--peer-node-selector"}},
	} {
		p := startAgentProc(t, []string{"NODE_NAME=n1"}, tc.args...)
		if code := p.wait(t, 30*time.Second); code != 2 {
			t.Fatalf("%q: exit code %d, want 2", tc.args, code)
		}
		for _, w := range tc.want {
			if !strings.Contains(p.stderr.String(), w) {
				t.Errorf("%q: stderr does not name %s:\n%s", tc.args, w, p.stderr.String())
			}
		}
	}
}

func TestCIDRList(t *testing.T) {
	var c cidrList
	if c.list != nil {
		t.Fatal("an unset flag must read as nil (use the Nodes' podCIDRs)")
	}
	if err := c.Set(" 10.0.0.0/8, fd00::/48 ,"); err != nil {
		t.Fatal(err)
	}
	if got := c.String(); got != "10.0.0.0/8,fd00::/48" {
		t.Errorf("String() = %q", got)
	}
	if err := c.Set(""); err != nil || c.list == nil || len(c.list) != 0 {
		t.Errorf("an empty value must give an empty, non-nil list: %v %v", c.list, err)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }() // only the free port number is wanted
	return ln.Addr().(*net.TCPAddr).Port
}

func writeKubeconfig(t *testing.T, cfg *rest.Config) string {
	t.Helper()
	kc := clientcmdapi.NewConfig()
	kc.Clusters["test"] = &clientcmdapi.Cluster{Server: cfg.Host, CertificateAuthorityData: cfg.CAData}
	kc.AuthInfos["test"] = &clientcmdapi.AuthInfo{ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData, Token: cfg.BearerToken}
	kc.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	kc.CurrentContext = "test"
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

func nodePair(t *testing.T) (*netnstest.Pair, *bind.Binder) {
	t.Helper()
	p := netnstest.NewPair(t)
	p.Node.MustIP(t, "addr", "add", "192.0.2.2/24", "dev", p.NodeIf)
	p.Peer.MustIP(t, "addr", "add", "192.0.2.1/24", "dev", p.PeerIf)
	b, err := bind.New(p.Node.Handle, bind.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return p, b
}

func owns(t *testing.T, b *bind.Binder, ip netip.Addr) bool {
	t.Helper()
	bs, err := b.Owned()
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range bs {
		if x.Addr == ip {
			return true
		}
	}
	return false
}

func getReport(port int) (report.Report, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return report.NewClient(port, 2*time.Second).Get(ctx, netip.MustParseAddr("127.0.0.1"), report.Poll{})
}

func httpGet(url string) (int, string, error) {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }() // the body was read to the end or failed already
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestSIGTERMLeavesAddressesBound runs egressip-agent against a real API
// server, binding in a network namespace; SIGTERM makes it exit 0 and
// leaves the egress IP bound and owned. Readiness and metrics are checked
// on the way. Before that, other agents of the same Node start on the same
// ports, as in a surge rolling update (DaemonSet maxSurge 1): one that
// cannot reach the API server never joins the ports (only the first agent
// answers) and `egressip-agent probe readyz` on its own socket fails; a
// healthy one joins once reconciled (both answer, SO_REUSEPORT), the first
// exits on SIGTERM, and the second keeps reporting the IP announced and
// ready.
func TestSIGTERMLeavesAddressesBound(t *testing.T) {
	netnstest.RequireRoot(t)
	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	pair, check := nodePair(t)
	node := "sigterm-node"
	ctx := context.Background()
	// The agent binds only addresses of the Egress's pool.
	office := &v1alpha1.ExternalIPPool{ObjectMeta: metav1.ObjectMeta{Name: "office"},
		Spec: v1alpha1.ExternalIPPoolSpec{IPRanges: []v1alpha1.IPRange{{CIDR: "192.0.2.0/24"}}}}
	if err := env.Client.Create(ctx, office); err != nil {
		t.Fatal(err)
	}
	eg := &v1alpha1.Egress{
		ObjectMeta: metav1.ObjectMeta{Name: "sigterm"},
		Spec: v1alpha1.EgressSpec{
			AppliedTo:      v1alpha1.AppliedTo{PodSelector: &metav1.LabelSelector{}},
			ExternalIPPool: "office",
		},
	}
	if err := env.Client.Create(ctx, eg); err != nil {
		t.Fatal(err)
	}
	eg.Status = v1alpha1.EgressStatus{EgressIP: "192.0.2.70", EgressNode: node}
	if err := env.Client.Status().Update(ctx, eg); err != nil {
		t.Fatal(err)
	}

	rep, health, metrics := freePort(t), freePort(t), freePort(t)
	sockDir := t.TempDir()
	agentArgs := func(kubeconfig, socket string) []string {
		return []string{"--kubeconfig", kubeconfig,
			"--netns", pair.Node.Path,
			"--report-bind-address", "127.0.0.1:" + strconv.Itoa(rep),
			"--health-probe-bind-address", "127.0.0.1:" + strconv.Itoa(health),
			"--metrics-bind-address", "127.0.0.1:" + strconv.Itoa(metrics), "--metrics-secure=false",
			// The report over plain HTTP: no controller signs certificates here.
			"--report-tls=false",
			"--health-probe-socket", filepath.Join(sockDir, socket)}
	}
	probe := func(socket, check string) int {
		return run([]string{"probe", "--socket", filepath.Join(sockDir, socket), "--timeout", "2s", check}, io.Discard)
	}
	kubeconfig := writeKubeconfig(t, env.Config)
	p := startAgentProc(t, []string{"NODE_NAME=" + node}, agentArgs(kubeconfig, "a.sock")...)
	ip := netip.MustParseAddr("192.0.2.70")
	poll.Until(t, 30*time.Second, "report lists the IP as announced", func() error {
		r, err := getReport(rep)
		if err != nil {
			return err
		}
		if r.Node != node {
			return fmt.Errorf("report of node %q", r.Node)
		}
		if b, ok := r.Lookup(ip); !ok || !b.Announced || b.Interface != pair.NodeIf {
			return fmt.Errorf("report %+v", r)
		}
		return nil
	})
	poll.Until(t, 10*time.Second, "ready", func() error {
		code, body, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/readyz", health))
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("readyz: HTTP %d: %s", code, body)
		}
		return err
	})
	if code := probe("a.sock", "readyz"); code != 0 {
		t.Fatalf("egressip-agent probe readyz on the agent's socket: exit %d, want 0", code)
	}
	if code := probe("a.sock", "healthz"); code != 0 {
		t.Fatalf("egressip-agent probe healthz on the agent's socket: exit %d, want 0", code)
	}
	code, body, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/metrics", metrics))
	if err != nil || code != http.StatusOK {
		t.Fatalf("metrics: HTTP %d: %v", code, err)
	}
	for _, want := range []string{
		`egressip_agent_bound_ips{family="ipv4"} 1`,
		`egressip_agent_announcements_total{family="ipv4"}`,
		"egressip_agent_reconcile_duration_seconds_count",
		"egressip_agent_bind_errors_total 0",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}

	// Surge: a second agent on the same ports while the first runs. One
	// that cannot reach the API server never reconciles, so it never joins
	// the report and health ports (every poll and probe there is answered
	// by the first agent, ready), and its own socket says it is not ready.
	first, err := getReport(rep)
	if err != nil {
		t.Fatal(err)
	}
	down := rest.CopyConfig(env.Config)
	down.Host = "https://127.0.0.1:" + strconv.Itoa(freePort(t))
	stuck := startAgentProc(t, []string{"NODE_NAME=" + node}, agentArgs(writeKubeconfig(t, down), "stuck.sock")...)
	unreconciledStaysOut(t, stuck, first.Instance, rep, health, func(check string) int { return probe("stuck.sock", check) })
	p2 := startAgentProc(t, []string{"NODE_NAME=" + node}, agentArgs(kubeconfig, "b.sock")...)
	var second string
	poll.Until(t, 30*time.Second, "the second agent answers the report too", func() error {
		r, err := getReport(rep)
		if err != nil {
			return err
		}
		if r.Instance == first.Instance {
			return errors.New("answered by the first agent")
		}
		if b, ok := r.Lookup(ip); !ok || !b.Announced {
			return fmt.Errorf("second agent's report %+v", r)
		}
		second = r.Instance
		return nil
	})
	stopLeavesBound(t, p, check, ip)
	for range 10 {
		r, err := getReport(rep)
		if err != nil || r.Instance != second {
			t.Fatalf("after the first agent's exit: report %+v, %v; want the second agent's (%s)", r, err, second)
		}
		if b, ok := r.Lookup(ip); !ok || !b.Announced {
			t.Fatalf("after the first agent's exit: report %+v lacks the IP announced", r)
		}
	}
	if code, body, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/readyz", health)); err != nil || code != http.StatusOK {
		t.Fatalf("second agent readyz: HTTP %d %s: %v", code, body, err)
	}
	if code := probe("b.sock", "readyz"); code != 0 {
		t.Fatalf("second agent: probe readyz exit %d, want 0", code)
	}
	p = p2
	stopLeavesBound(t, p, check, ip)
	if !strings.Contains(p.stderr.String(), "stay bound") {
		t.Errorf("shutdown not logged:\n%s", p.stderr.String())
	}
}

// TestSIGTERMDuringStartupOutage: started while the API server is
// unreachable, the agent serves its report (what the kernel holds, not yet
// announced), removes nothing, and exits 0 on SIGTERM.
func TestSIGTERMDuringStartupOutage(t *testing.T) {
	netnstest.RequireRoot(t)
	pair, check := nodePair(t)
	ip := netip.MustParseAddr("192.0.2.71")
	if _, err := check.Bind(ip); err != nil {
		t.Fatal(err)
	}
	rep := freePort(t)
	p := startAgentProc(t, nil,
		"--node-name", "outage-node", "--report-tls=false",
		"--kubeconfig", writeKubeconfig(t, &rest.Config{Host: "https://127.0.0.1:" + strconv.Itoa(freePort(t))}),
		"--netns", pair.Node.Path,
		"--report-bind-address", "127.0.0.1:"+strconv.Itoa(rep),
		"--health-probe-bind-address", "0",
	)
	poll.Until(t, 30*time.Second, "report served", func() error {
		r, err := getReport(rep)
		if err != nil {
			return err
		}
		if b, ok := r.Lookup(ip); !ok || b.Announced {
			return fmt.Errorf("report %+v, want %s listed, not announced", r, ip)
		}
		return nil
	})
	time.Sleep(3 * time.Second)
	if !owns(t, check, ip) {
		t.Fatal("owned address removed although the Egresses were never read")
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	if !owns(t, check, ip) {
		t.Fatal("owned address removed on SIGTERM")
	}
}

// unreconciledStaysOut checks a surge agent that cannot reconcile (stuck):
// its own probe socket answers healthz but not readyz, and for 20 polls the
// shared report and health ports are answered by the first agent
// (instance first) only, ready. Then it stops stuck with SIGTERM.
func unreconciledStaysOut(t *testing.T, stuck *agentProc, first string, rep, health int, probe func(check string) int) {
	t.Helper()
	poll.Until(t, 10*time.Second, "the stuck agent's socket answers, not ready", func() error {
		if code := probe("healthz"); code != 0 {
			return fmt.Errorf("probe healthz: exit %d", code)
		}
		if code := probe("readyz"); code != 1 {
			return fmt.Errorf("probe readyz: exit %d, want 1", code)
		}
		return nil
	})
	for range 20 {
		r, err := getReport(rep)
		if err != nil || r.Instance != first {
			t.Fatalf("report during the overlap with an unreconciled agent: %+v, %v; want only the first agent's (%s)", r, err, first)
		}
		if code, body, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/readyz", health)); err != nil || code != http.StatusOK {
			t.Fatalf("health port during the overlap: HTTP %d %s: %v", code, body, err)
		}
	}
	if err := stuck.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := stuck.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("stuck agent: exit code %d after SIGTERM, want 0", code)
	}
}

// stopLeavesBound sends p SIGTERM and checks that it exits 0 and that ip is
// still bound and owned afterwards.
func stopLeavesBound(t *testing.T, p *agentProc, check *bind.Binder, ip netip.Addr) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("exit code %d after SIGTERM, want 0", code)
	}
	if !owns(t, check, ip) {
		t.Fatalf("%s is no longer bound after SIGTERM", ip)
	}
}

// TestKernelProbeAgentProcess: the real agent process, with --datapath in
// a Node namespace, probes the kernel at start: it logs that every feature
// was found, serves the finding in its report (the kernel release of
// uname, reason KernelFeaturesPresent) and exports
// egressip_agent_kernel_feature = 1 for each feature of the table.
func TestKernelProbeAgentProcess(t *testing.T) {
	netnstest.RequireRoot(t)
	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	pair, _ := nodePair(t)
	rep, health, metrics := freePort(t), freePort(t), freePort(t)
	p := startAgentProc(t, []string{"NODE_NAME=kprobe-node"},
		"--kubeconfig", writeKubeconfig(t, env.Config),
		"--netns", pair.Node.Path, "--datapath", "--datapath-uplink", pair.NodeIf,
		"--cluster-cidrs", "10.244.0.0/16", "--service-cidrs", "10.96.0.0/12",
		"--report-bind-address", "127.0.0.1:"+strconv.Itoa(rep),
		"--health-probe-bind-address", "127.0.0.1:"+strconv.Itoa(health),
		"--metrics-bind-address", "127.0.0.1:"+strconv.Itoa(metrics), "--metrics-secure=false", "--report-tls=false")
	poll.Until(t, 30*time.Second, "report carries the kernel finding", func() error {
		r, err := getReport(rep)
		if err != nil {
			return err
		}
		if r.Kernel == nil || r.Kernel.Release != kernel.Release() || r.Kernel.Reason != v1alpha1.ReasonKernelFeaturesPresent || len(r.Kernel.Missing) != 0 {
			return fmt.Errorf("kernel finding %+v", r.Kernel)
		}
		return nil
	})
	// The metrics listener starts on its own, possibly after the report's
	// (a failure seen in CI: connection refused): wait for it.
	poll.Until(t, 30*time.Second, "metrics carry every kernel feature", func() error {
		_, body, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/metrics", metrics))
		if err != nil {
			return err
		}
		for _, s := range kernel.Specs {
			if want := fmt.Sprintf("egressip_agent_kernel_feature{feature=%q} 1", s.Feature); !strings.Contains(body, want) {
				return fmt.Errorf("metrics lack %s", want)
			}
		}
		return nil
	})
	if log := p.stderr.String(); !strings.Contains(log, "kernel has every feature probed") {
		t.Errorf("no kernel log line:\n%s", log)
	}
}
