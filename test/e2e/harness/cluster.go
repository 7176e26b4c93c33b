package harness

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/egressip/egressip/internal/testenv"
	"github.com/egressip/egressip/internal/testutil/netnstest"
	dp "github.com/egressip/egressip/test/datapath"
)

// Addresses of the bridge (the control plane's side), the Nodes and the
// client: all in the documentation ranges.
var (
	BridgeV4 = netip.MustParseAddr("192.0.2.1")
	BridgeV6 = netip.MustParseAddr("2001:db8::1")
	ClientV4 = netip.MustParseAddr("192.0.2.50")
	ClientV6 = netip.MustParseAddr("2001:db8::50")
)

// Where the processes serve plain-HTTP metrics: the controller on the
// control-plane namespace's loopback, each agent on its Node's addresses.
const (
	ControllerMetricsAddr = "127.0.0.1:8080"
	AgentMetricsPort      = 9447
)

// NodeLabel marks the Nodes the sample pools select.
const NodeLabel = "egress.example/gateway"

// Config describes the cluster to start.
type Config struct {
	// Prefix names everything: the control-plane namespace is Prefix, Nodes
	// are Prefix-n1.., the client is Prefix-client. At most 8 characters.
	Prefix string
	// Nodes is the number of Nodes (1..9).
	Nodes int
	// BinDir holds egressip-controller and egressip-agent.
	BinDir string
	// Log receives the processes' output; nil discards it.
	Log io.Writer
	// LogDir, when set, also receives each process's standard output and
	// error in a file of its own (see LogFiles): the controller, every
	// agent, kube-apiserver and etcd. The files are appended to across
	// restarts and outlive the cluster.
	LogDir string
	// ControllerArgs are extra flags for egressip-controller.
	ControllerArgs []string
	// Datapath runs the agents with --datapath=true (Pod CIDRs from the
	// Nodes, Service CIDRs ServiceRangeV4/V6).
	Datapath bool
	// Pods are run on every Node, behind a stand-in CNI, with an external
	// server (ExtV4, ExtV6) that reports the source address it sees.
	Pods []PodTemplate
	// RecordNodes are the numbers (1..Nodes) of the Nodes whose agent runs
	// in forced-fallback mode (--address-ownership=record: as on a kernel
	// without IFA_PROTO); the others run in the default mode, auto. Every
	// agent has an ownership record of its own (Node.Record).
	RecordNodes []int
}

// Node is one Node: a network namespace with an agent.
type Node struct {
	Name string // also the namespace name
	IPv4 netip.Addr
	IPv6 netip.Addr
	MAC  net.HardwareAddr
	// Record is the path of the agent's ownership record.
	Record string
	// ForcedFallback: the agent runs with --address-ownership=record
	// (Config.RecordNodes).
	ForcedFallback bool
	// Kubeconfig, when set, is the kubeconfig the agent starts with instead
	// of the cluster's agent kubeconfig (an API server reached through an
	// APIProxy, see RouteAgentVia).
	Kubeconfig string

	// kubeconfig is the agent's: the agents' user with this Node's
	// node-name extra (agentCredentials).
	kubeconfig string

	mu        sync.Mutex
	agent     *exec.Cmd
	agentDone chan struct{} // closed when the agent has exited
}

// Cluster is a running local cluster.
type Cluster struct {
	Config     Config
	Env        *testenv.Env
	Client     client.Client
	Kubeconfig string // admin kubeconfig, for kubectl
	Nodes      []*Node
	ClientNS   string

	// Pods are the stand-in Pods (Config.Pods on every Node); Ext is the
	// external server, in namespace Prefix-ext on the bridge.
	Pods  []*Pod
	Ext   *dp.Server
	extNS *dp.NS

	dir            string
	logMu          sync.Mutex
	logFiles       map[string]*os.File
	mu             sync.Mutex
	controller     *exec.Cmd
	controllerDone chan struct{}
}

// Start brings the cluster up. It must run inside the control-plane
// namespace (see ReexecInNetNS). On error everything started is stopped.
func Start(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	if cfg.Nodes < 1 || cfg.Nodes > 9 {
		return nil, fmt.Errorf("nodes must be 1..9, got %d", cfg.Nodes)
	}
	c := &Cluster{Config: cfg, ClientNS: cfg.Prefix + "-client"}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	c.dir, err = os.MkdirTemp("", "egressip-"+cfg.Prefix+"-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	if err := c.network(); err != nil {
		return nil, err
	}
	if cfg.LogDir != "" {
		if err := os.MkdirAll(cfg.LogDir, 0o755); err != nil {
			return nil, fmt.Errorf("log directory: %w", err)
		}
	}
	c.Env, err = testenv.Start(testenv.WithWebhooks(), testenv.WithAPIServerAddress(BridgeV4.String()),
		testenv.WithControlPlaneOutput(c.output(LogAPIServer), c.output(LogEtcd)))
	if err != nil {
		return nil, err
	}
	c.Client = c.Env.Client
	if err := c.credentials(ctx); err != nil {
		return nil, err
	}
	for _, n := range c.Nodes {
		if err := c.registerNode(ctx, n); err != nil {
			return nil, err
		}
	}
	if cfg.Datapath || len(cfg.Pods) > 0 {
		if err := c.setupPods(ctx); err != nil {
			return nil, err
		}
	}
	if err := c.StartController(); err != nil {
		return nil, err
	}
	for _, n := range c.Nodes {
		if err := c.StartAgent(n); err != nil {
			return nil, err
		}
	}
	if err := c.WaitLeader(ctx, 30*time.Second); err != nil {
		return nil, err
	}
	return c, nil
}

// LeaseName is the controller's leader-election Lease (namespace default).
const LeaseName = "egressip-controller.egressip.io"

// WaitLeader waits until a controller holds the leader Lease and its
// scheduling pass has run once (the pass is what a user waits for).
func (c *Cluster) WaitLeader(ctx context.Context, timeout time.Duration) error {
	ok := WaitFor(ctx, timeout, func() bool {
		var l coordinationv1.Lease
		if err := c.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: LeaseName}, &l); err != nil {
			return false
		}
		return l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" && l.Spec.RenewTime != nil && time.Since(l.Spec.RenewTime.Time) < 5*time.Second
	})
	if !ok {
		return fmt.Errorf("no controller took the leader Lease within %v", timeout)
	}
	return nil
}

// network creates the bridge in the control-plane namespace, one namespace
// per Node and the client namespace, each joined by a veth pair.
func (c *Cluster) network() error {
	steps := [][]string{
		{"link", "set", "lo", "up"},
		{"link", "add", "br0", "type", "bridge"},
		{"addr", "add", BridgeV4.String() + "/24", "dev", "br0"},
		{"addr", "add", BridgeV6.String() + "/64", "dev", "br0", "nodad"},
		{"link", "set", "br0", "up"},
	}
	for _, s := range steps {
		if err := run("ip", s...); err != nil {
			return err
		}
	}
	for i := 1; i <= c.Config.Nodes; i++ {
		n := &Node{
			Name: fmt.Sprintf("%s-n%d", c.Config.Prefix, i),
			IPv4: netip.AddrFrom4([4]byte{192, 0, 2, byte(10 + i)}),
			IPv6: netip.MustParseAddr(fmt.Sprintf("2001:db8::%d", 10+i)),
		}
		mac, err := c.host(n.Name, fmt.Sprintf("veth%d", i), n.IPv4, n.IPv6)
		if err != nil {
			return err
		}
		n.MAC = mac
		n.Record = filepath.Join(c.dir, n.Name+"-ownership.json")
		n.ForcedFallback = slices.Contains(c.Config.RecordNodes, i)
		c.Nodes = append(c.Nodes, n)
	}
	_, err := c.host(c.ClientNS, "vethc", ClientV4, ClientV6)
	return err
}

// host creates namespace ns with eth0 (v4/24, v6/64, default routes via the
// bridge) whose peer, named peer, is a port of br0. It returns eth0's MAC.
func (c *Cluster) host(ns, peer string, v4, v6 netip.Addr) (net.HardwareAddr, error) {
	if err := netnstest.Add(ns); err != nil {
		return nil, err
	}
	if err := netnstest.Veth("", peer, ns, "eth0"); err != nil {
		return nil, err
	}
	steps := [][]string{
		{"ip", "link", "set", peer, "master", "br0", "up"},
		{"ip", "-n", ns, "link", "set", "lo", "up"},
		{"ip", "-n", ns, "addr", "add", v4.String() + "/24", "dev", "eth0"},
		{"ip", "-n", ns, "addr", "add", v6.String() + "/64", "dev", "eth0", "nodad"},
		{"ip", "-n", ns, "link", "set", "eth0", "up"},
		{"ip", "-n", ns, "route", "add", "default", "via", BridgeV4.String()},
		{"ip", "-n", ns, "-6", "route", "add", "default", "via", BridgeV6.String()},
	}
	for _, s := range steps {
		if err := run(s[0], s[1:]...); err != nil {
			return nil, err
		}
	}
	return linkMAC(ns, "eth0")
}

// credentials writes an admin kubeconfig (for kubectl and the controller)
// and one for the agents, whose user is bound to the agent's read-only role.
func (c *Cluster) credentials(ctx context.Context) error {
	admin, err := c.Env.AddUser(envtest.User{Name: "demo-admin", Groups: []string{"system:masters"}})
	if err != nil {
		return fmt.Errorf("add admin user: %w", err)
	}
	if c.Kubeconfig, err = c.writeKubeconfig("admin.kubeconfig", admin); err != nil {
		return err
	}
	return c.agentCredentials(ctx)
}

func (c *Cluster) writeKubeconfig(name string, u *envtest.AuthenticatedUser) (string, error) {
	b, err := u.KubeConfig()
	if err != nil {
		return "", fmt.Errorf("kubeconfig %s: %w", name, err)
	}
	p := filepath.Join(c.dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		return "", fmt.Errorf("write %s: %w", p, err)
	}
	return p, nil
}

// registerNode creates the Node object: labelled, Ready, with its address.
func (c *Cluster) registerNode(ctx context.Context, n *Node) error {
	v4, v6 := n.PodCIDRs()
	obj := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: map[string]string{
		NodeLabel: "true", corev1.LabelOSStable: "linux", corev1.LabelHostname: n.Name}},
		Spec: corev1.NodeSpec{PodCIDR: v4.String(), PodCIDRs: []string{v4.String(), v6.String()}}}
	if err := c.Client.Create(ctx, obj); err != nil {
		return fmt.Errorf("create Node %s: %w", n.Name, err)
	}
	now := metav1.Now()
	obj.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}}
	obj.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: n.IPv4.String()}, {Type: corev1.NodeInternalIP, Address: n.IPv6.String()}, {Type: corev1.NodeHostName, Address: n.Name}}
	if err := c.Client.Status().Update(ctx, obj); err != nil {
		return fmt.Errorf("set status of Node %s: %w", n.Name, err)
	}
	return nil
}

// StartController starts egressip-controller (leader election on, webhook
// served where the API server expects it).
func (c *Cluster) StartController() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	wo := c.Env.WebhookOptions()
	args := append([]string{
		"--kubeconfig", c.Kubeconfig,
		"--leader-elect", "--leader-election-namespace", "default",
		"--metrics-bind-address", ControllerMetricsAddr, "--metrics-secure=false", "--health-probe-bind-address", "0",
		"--webhook-cert-path", wo.CertDir, "--webhook-port", strconv.Itoa(wo.Port),
		"--agent-ca-namespace", AgentNamespace,
	}, c.Config.ControllerArgs...)
	cmd := exec.Command(filepath.Join(c.Config.BinDir, "egressip-controller"), args...)
	cmd.Stdout = c.output(LogController)
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start egressip-controller: %w", err)
	}
	done := make(chan struct{})
	c.controller, c.controllerDone = cmd, done
	go func() { _ = cmd.Wait(); close(done) }()
	return nil
}

// StopController kills the controller (SIGKILL: a crash).
func (c *Cluster) StopController() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.controller != nil {
		_ = c.controller.Process.Kill()
		<-c.controllerDone
		c.controller, c.controllerDone = nil, nil
	}
}

// StartAgent starts n's agent inside n's namespace.
func (c *Cluster) StartAgent(n *Node) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	kubeconfig := n.kubeconfig
	if n.Kubeconfig != "" {
		kubeconfig = n.Kubeconfig
	}
	cmd := exec.Command("ip", "netns", "exec", n.Name, filepath.Join(c.Config.BinDir, "egressip-agent"),
		"--kubeconfig", kubeconfig, "--node-name", n.Name, "--health-probe-bind-address", "0",
		"--agent-ca-namespace", AgentNamespace,
		"--metrics-bind-address", fmt.Sprintf(":%d", AgentMetricsPort), "--metrics-secure=false")
	cmd.Args = append(cmd.Args, "--ownership-record="+n.Record)
	if n.ForcedFallback {
		cmd.Args = append(cmd.Args, "--address-ownership=record")
	}
	if c.Config.Datapath {
		cmd.Args = append(cmd.Args, "--datapath=true", "--service-cidrs="+ServiceRangeV4.String()+","+ServiceRangeV6.String())
	}
	cmd.Stdout = c.output(n.Name)
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start agent of %s: %w", n.Name, err)
	}
	done := make(chan struct{})
	n.agent, n.agentDone = cmd, done
	go func() { _ = cmd.Wait(); close(done) }()
	return nil
}

// SurgeAgent replaces n's agent the way a surge rolling update does
// (DaemonSet maxSurge 1, maxUnavailable 0): it starts a new agent beside
// the running one, lets both run for overlap, then stops the old one with
// SIGTERM. The new agent is n's agent afterwards.
func (c *Cluster) SurgeAgent(n *Node, overlap time.Duration) error {
	n.mu.Lock()
	old, oldDone := n.agent, n.agentDone
	n.agent, n.agentDone = nil, nil
	n.mu.Unlock()
	if err := c.StartAgent(n); err != nil {
		return err
	}
	time.Sleep(overlap)
	if old == nil {
		return nil
	}
	_ = old.Process.Signal(syscall.SIGTERM)
	select {
	case <-oldDone:
	case <-time.After(10 * time.Second):
		_ = old.Process.Kill()
		<-oldDone
	}
	return nil
}

// StopAgent stops n's agent with sig (SIGKILL for a crash, SIGTERM for a
// rolling update) and waits until it has exited.
func (c *Cluster) StopAgent(n *Node, sig syscall.Signal) {
	n.mu.Lock()
	cmd, done := n.agent, n.agentDone
	n.agent, n.agentDone = nil, nil
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// CrashNode simulates a power-off: the agent is killed and the Node's link
// goes down, so it neither answers the controller nor ARP.
func (c *Cluster) CrashNode(n *Node) error {
	c.StopAgent(n, syscall.SIGKILL)
	return inNS(n.Name, "link", "set", "eth0", "down")
}

// ReviveNode reboots a crashed Node: as after a power cycle its interface
// comes back with only the Node's own addresses (the egress IPs it held are
// gone with the kernel state), then its agent starts.
func (c *Cluster) ReviveNode(n *Node) error {
	steps := [][]string{
		{"addr", "flush", "dev", "eth0"},
		{"addr", "add", n.IPv4.String() + "/24", "dev", "eth0"},
		{"addr", "add", n.IPv6.String() + "/64", "dev", "eth0", "nodad"},
		{"link", "set", "eth0", "up"},
		{"route", "replace", "default", "via", BridgeV4.String()},
		{"-6", "route", "replace", "default", "via", BridgeV6.String()},
	}
	for _, s := range steps {
		if err := inNS(n.Name, s...); err != nil {
			return err
		}
	}
	return c.StartAgent(n)
}

// Node returns the Node named name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// Stop stops every process and removes the namespaces and files.
func (c *Cluster) Stop() {
	for _, n := range c.Nodes {
		c.StopAgent(n, syscall.SIGKILL)
	}
	c.StopController()
	if c.Ext != nil {
		c.Ext.Close()
	}
	for _, p := range c.Pods {
		_ = p.ns.Close()
	}
	if c.extNS != nil {
		_ = c.extNS.Close()
	}
	if c.Env != nil {
		_ = c.Env.Stop()
	}
	CleanupNamespaces(c.Config.Prefix + "-")
	_ = run("ip", "link", "del", "br0")
	if c.dir != "" {
		_ = os.RemoveAll(c.dir)
	}
	c.logMu.Lock()
	for _, f := range c.logFiles {
		_ = f.Close()
	}
	c.logFiles = nil
	c.logMu.Unlock()
}

// Names of the log files in Config.LogDir besides one per agent, named
// after its Node (<Node>.log).
const (
	LogController = "controller"
	LogAPIServer  = "kube-apiserver"
	LogEtcd       = "etcd"
)

// LogFiles returns the log file of each process by name (LogController,
// LogAPIServer, LogEtcd and each Node's name for its agent), or nil
// without Config.LogDir.
func (c *Cluster) LogFiles() map[string]string {
	if c.Config.LogDir == "" {
		return nil
	}
	m := map[string]string{}
	for _, name := range append([]string{LogController, LogAPIServer, LogEtcd}, c.nodeNames()...) {
		m[name] = c.logPath(name)
	}
	return m
}

func (c *Cluster) nodeNames() []string {
	names := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		names[i] = n.Name
	}
	return names
}

func (c *Cluster) logPath(name string) string {
	return filepath.Join(c.Config.LogDir, name+".log")
}

// output is where process name writes: Config.Log with a "[name] " prefix
// on each line, and its file in Config.LogDir when set (opened once, for
// appending, so a restarted agent continues its file). A file that cannot
// be opened is reported on Config.Log and skipped.
func (c *Cluster) output(name string) io.Writer {
	w := prefixed(c.Config.Log, name)
	if c.Config.LogDir == "" {
		return w
	}
	c.logMu.Lock()
	defer c.logMu.Unlock()
	f, ok := c.logFiles[name]
	if !ok {
		var err error
		f, err = os.OpenFile(c.logPath(name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			_, _ = fmt.Fprintf(c.Config.Log, "[%s] log file: %v\n", name, err)
			return w
		}
		if c.logFiles == nil {
			c.logFiles = map[string]*os.File{}
		}
		c.logFiles[name] = f
	}
	if w == io.Discard {
		return f
	}
	return io.MultiWriter(w, f)
}

// prefixed writes each line to w with "[name] " in front.
func prefixed(w io.Writer, name string) io.Writer {
	if w == io.Discard {
		return w
	}
	pr, pw := io.Pipe()
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			_, _ = fmt.Fprintf(w, "[%s] %s\n", name, sc.Text())
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	return pw
}
