package harness

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Replica is an egressip-controller process of its own beside the
// cluster's (StartController): same flags, its own metrics address and
// webhook port (the API server calls only the cluster's), so that a test
// can run two replicas and kill the leader.
type Replica struct {
	Name string
	// MetricsAddr is where it serves plain-HTTP metrics.
	MetricsAddr string

	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	log  bytes.Buffer
}

// StartReplica starts a controller replica named name (its log file is
// name.log), serving metrics on 127.0.0.1 and a free port.
func (c *Cluster) StartReplica(name string) (*Replica, error) {
	metrics, err := freeLoopbackPort()
	if err != nil {
		return nil, err
	}
	hook, err := freeLoopbackPort()
	if err != nil {
		return nil, err
	}
	r := &Replica{Name: name, MetricsAddr: "127.0.0.1:" + strconv.Itoa(metrics), done: make(chan struct{})}
	args := append([]string{
		"--kubeconfig", c.Kubeconfig,
		"--leader-elect", "--leader-election-namespace", "default",
		"--metrics-bind-address", r.MetricsAddr, "--metrics-secure=false", "--health-probe-bind-address", "0",
		"--webhook-cert-path", c.Env.WebhookOptions().CertDir, "--webhook-port", strconv.Itoa(hook),
		"--agent-ca-namespace", AgentNamespace,
	}, c.Config.ControllerArgs...)
	r.cmd = exec.Command(filepath.Join(c.Config.BinDir, "egressip-controller"), args...)
	r.cmd.Stdout = io.MultiWriter(c.output(name), r)
	r.cmd.Stderr = r.cmd.Stdout
	if err := r.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start controller replica %s: %w", name, err)
	}
	go func() { _ = r.cmd.Wait(); close(r.done) }()
	return r, nil
}

// Write keeps the replica's output for Logged.
func (r *Replica) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.log.Write(p)
}

// Logged reports whether the replica's output so far contains s (case
// insensitive).
func (r *Replica) Logged(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Contains(strings.ToLower(r.log.String()), strings.ToLower(s))
}

// Stop sends sig (SIGKILL: a crash; SIGTERM: a shutdown, which releases
// the Lease) and waits for the process to exit.
func (r *Replica) Stop(sig syscall.Signal) {
	_ = r.cmd.Process.Signal(sig)
	<-r.done
}

// Exited is closed when the process has exited.
func (r *Replica) Exited() <-chan struct{} { return r.done }

// PassCount is how many scheduling passes the controller serving metrics
// at addr has completed (the count of
// egressip_controller_schedule_pass_duration_seconds), or an error when it
// does not answer.
func PassCount(ctx context.Context, addr string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, "egressip_controller_schedule_pass_duration_seconds_count "); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, nil
}

// LeaseHolder is the holder identity of the controller's leader Lease
// ("" when none or unreadable).
func (c *Cluster) LeaseHolder(ctx context.Context) string {
	var l coordinationv1.Lease
	if err := c.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: LeaseName}, &l); err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func freeLoopbackPort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("free port: %w", err)
	}
	defer func() { _ = ln.Close() }() // only the number is wanted
	return ln.Addr().(*net.TCPAddr).Port, nil
}
