// Command demo runs egressip end to end on this machine (`make demo`): a local
// control plane, egressip-controller, and one egressip-agent per Node, each
// Node a network namespace on one bridge with Pods (namespaces behind it),
// plus a client namespace that checks what the network really sees and an
// external server that reports the source address of the Pods' connections. Run as root. Everything it creates is removed
// on exit, including on Ctrl-C.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/report"

	"github.com/egressip/egressip/test/e2e/harness"
)

func main() {
	// An own flag set: libraries register flags (such as --kubeconfig) on
	// the global one that mean nothing here.
	fs := flag.NewFlagSet("egressip-demo", flag.ExitOnError)
	nodes := fs.Int("nodes", 3, "number of Nodes (network namespaces), 2..9")
	keep := fs.Bool("keep", false, "keep the cluster running after the demo until Ctrl-C (prints the kubectl command to reach it)")
	verbose := fs.Bool("verbose", false, "show the logs of the controller and the agents")
	logDir := fs.String("log-dir", "", "write each process's log (controller, agents, kube-apiserver, etcd) to a file in this directory; with --keep and no --log-dir, a new directory under $TMPDIR")
	binDir := fs.String("bin-dir", "bin", "directory with egressip-controller and egressip-agent")
	samples := fs.String("samples", "config/samples", "directory with the sample pools and Egresses")
	kubectl := fs.String("kubectl", "", "kubectl binary that shows the objects (default: bin/k8s/*/kubectl, else kubectl on PATH)")
	_ = fs.Parse(os.Args[1:])
	if *nodes < 2 || *nodes > 9 {
		fmt.Fprintln(os.Stderr, "demo: --nodes must be 2..9")
		os.Exit(2)
	}
	abs := func(p string) string { a, _ := filepath.Abs(p); return a }
	if err := harness.ReexecInNetNS("egdemo"); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer cancel()
	d := &demo{ctx: ctx, kubectl: *kubectl}
	var logw io.Writer
	if *verbose {
		logw = os.Stderr
	}
	dir := *logDir
	if dir == "" && *keep {
		var err error
		if dir, err = os.MkdirTemp("", "egressip-demo-logs-"); err != nil {
			fmt.Fprintln(os.Stderr, "demo:", err)
			os.Exit(1)
		}
	}
	if dir != "" {
		dir = abs(dir)
	}
	err := d.run(harness.Config{Prefix: "egdemo", Nodes: *nodes, BinDir: abs(*binDir), Log: logw, LogDir: dir, Datapath: true, Pods: demoPods}, abs(*samples), *keep)
	switch {
	case err != nil && ctx.Err() != nil:
		fmt.Fprintln(os.Stderr, "demo: interrupted; everything it started is removed")
		os.Exit(130)
	case err != nil:
		fmt.Fprintln(os.Stderr, "demo: FAILED:", err)
		os.Exit(1)
	}
}

type demo struct {
	ctx     context.Context
	c       *harness.Cluster
	kubectl string
	step    int
	// cordoned is the Node the planned-move step cordoned.
	cordoned *harness.Node
}

func (d *demo) say(format string, args ...any) {
	d.step++
	fmt.Printf("\n== %d. %s\n", d.step, fmt.Sprintf(format, args...))
}

func (d *demo) run(cfg harness.Config, samples string, keep bool) error {
	d.say("Starting a control plane, egressip-controller and %d Nodes (network namespaces on bridge br0)", cfg.Nodes)
	start := time.Now()
	c, err := harness.Start(d.ctx, cfg)
	if err != nil {
		return err
	}
	d.c = c
	defer c.Stop()
	d.findKubectl()
	for _, n := range c.Nodes {
		fmt.Printf("   Node %-10s %-12s %-14s MAC %s (agent running in its namespace)\n", n.Name, n.IPv4, n.IPv6, n.MAC)
	}
	fmt.Printf("   client     %-12s %-14s namespace %s\n", harness.ClientV4, harness.ClientV6, c.ClientNS)
	fmt.Printf("   external   %-12s %-14s namespace %s-ext (a server that reports the source address it sees)\n", harness.ExtV4, harness.ExtV6, cfg.Prefix)
	for _, p := range c.Pods {
		fmt.Printf("   Pod %-32s %-14s %-18s behind Node %s\n", p.Namespace+"/"+p.Name, p.IPv4, p.IPv6, p.Node.Name)
	}
	fmt.Printf("   up in %v\n", time.Since(start).Round(time.Millisecond))
	if cfg.LogDir != "" {
		fmt.Printf("   logs of every process in %s (controller.log, kube-apiserver.log, etcd.log, one per agent: %s.log, ...)\n", cfg.LogDir, c.Nodes[0].Name)
	}

	d.say("Applying the sample pools and Egresses from %s", samples)
	var created time.Time
	for _, f := range []string{"egressip_v1alpha1_externalippool.yaml", "egressip_v1alpha1_egress.yaml"} {
		created = time.Now() // the Egresses are in the last file
		names, err := c.ApplyFile(d.ctx, filepath.Join(samples, f))
		if err != nil {
			return err
		}
		for _, n := range names {
			fmt.Printf("   created %s\n", n)
		}
	}
	egresses := []string{"payments", "analytics", "payments-v6"}
	if _, err := c.WaitReady(d.ctx, 30*time.Second, egresses...); err != nil {
		return err
	}
	fmt.Printf("   all three Ready %v after the Egresses were created\n", time.Since(created).Round(time.Millisecond))
	d.show()

	d.say("Checking from the client namespace: each egress IP answers ping, from the MAC of the Node in its status")
	for _, name := range egresses {
		if err := d.verify(name); err != nil {
			return err
		}
	}

	d.say("Connecting from every Pod to the external server: the source address it sees")
	if err := d.sources(nil); err != nil {
		return err
	}

	d.say("Simulating a crash of the Node holding payments: agent killed, link down")
	crashed, err := d.crash("payments")
	if err != nil {
		return err
	}
	d.say("The Pods again, after the failover (the crashed Node's Pods are down with it)")
	if err := d.sources(crashed); err != nil {
		return err
	}

	d.say("Cordoning the Node holding analytics: a planned move of its Egresses (release, then acquire)")
	if err := d.cordon("analytics"); err != nil {
		return err
	}
	d.say("The Pods again, after the planned move")
	if err := d.sources(crashed); err != nil {
		return err
	}

	d.say("failurePolicy: an Egress for namespace shop whose pool no Node may hold")
	if err := d.failurePolicy(crashed); err != nil {
		return err
	}

	d.say("Several IPs per Egress: egress/batch asks for 2 IPs of office-egress, each held by its own Node")
	if crashed, err = d.multiIP(samples, crashed); err != nil {
		return err
	}

	if keep {
		d.say("The cluster stays up until Ctrl-C. Try:")
		fmt.Printf("   ip netns exec egdemo %s --kubeconfig %s get egress -o wide\n", d.kubectlPath(), c.Kubeconfig)
		fmt.Printf("   (the API server listens on %s inside namespace egdemo)\n", harness.BridgeV4)
		d.endpoints(crashed)
		<-d.ctx.Done()
		if cfg.LogDir != "" {
			fmt.Printf("\n   the logs stay in %s\n", cfg.LogDir)
		}
	}
	d.say("Cleaning up (processes, namespaces, bridge)")
	return nil
}

// endpoints prints where the processes' metrics, reports and logs are.
// The metrics are plain HTTP in the demo (the agents run with
// --metrics-secure=false), reachable from namespace egdemo (the bridge):
// the controller's on its loopback, each agent's (AgentMetricsPort) on its
// Node's address. Each agent's report (report.DefaultPort, what the
// controller polls) is mutual TLS only, so it is named, not offered as a
// URL to curl. docs/metrics.md and docs/security.md describe them.
func (d *demo) endpoints(down *harness.Node) {
	fmt.Println("\n   Metrics (plain HTTP in this demo; run from namespace egdemo, e.g. ip netns exec egdemo curl -s URL):")
	fmt.Printf("   %-16s metrics http://%s/metrics\n", "controller", harness.ControllerMetricsAddr)
	for _, n := range d.c.Nodes {
		note := ""
		if n == down {
			note = "  (crashed above: link down, no agent)"
		}
		fmt.Printf("   %-16s metrics http://%s/metrics%s\n", "agent "+n.Name, netip.AddrPortFrom(n.IPv4, harness.AgentMetricsPort), note)
	}
	fmt.Printf("   The agents' reports (port %d) answer only the controller, over mutual TLS (docs/security.md);\n"+
		"   kubectl get egress and the Node conditions show what they say.\n", report.DefaultPort)
	fmt.Println("   for example: ip netns exec egdemo curl -s http://" + harness.ControllerMetricsAddr + "/metrics | grep ^egressip_controller_egresses")
	files := d.c.LogFiles()
	if files == nil {
		return
	}
	fmt.Println("\n   Logs (standard output and error of each process; tail -f to follow):")
	for _, name := range append([]string{harness.LogController, harness.LogAPIServer, harness.LogEtcd}, nodeNames(d.c)...) {
		label := name
		if !slices.Contains([]string{harness.LogController, harness.LogAPIServer, harness.LogEtcd}, name) {
			label = "agent " + name
		}
		fmt.Printf("   %-16s %s\n", label, files[name])
	}
}

func nodeNames(c *harness.Cluster) []string {
	names := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		names[i] = n.Name
	}
	return names
}

// failurePolicy creates a pool whose nodeSelector matches no Node and an
// Egress for namespace shop in it: with failurePolicy Fail the shop Pods'
// external connections fail at once (EHOSTUNREACH); switched to Ignore,
// they leave with their Node IP again. Pods on Node down are left out.
func (d *demo) failurePolicy(down *harness.Node) error {
	pool := &v1alpha1.ExternalIPPool{ObjectMeta: metav1.ObjectMeta{Name: "nowhere"}, Spec: v1alpha1.ExternalIPPoolSpec{
		IPRanges:     []v1alpha1.IPRange{{CIDR: "192.0.2.200/29"}},
		NodeSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"egress.example/none": "true"}},
	}}
	eg := &v1alpha1.Egress{ObjectMeta: metav1.ObjectMeta{Name: "shop"}, Spec: v1alpha1.EgressSpec{
		ExternalIPPool: "nowhere",
		FailurePolicy:  v1alpha1.FailurePolicyFail,
		AppliedTo: v1alpha1.AppliedTo{NamespaceSelector: &metav1.LabelSelector{
			MatchLabels: map[string]string{"kubernetes.io/metadata.name": "shop"}}},
	}}
	for _, o := range []client.Object{pool, eg} {
		if err := d.c.Client.Create(d.ctx, o); err != nil {
			return err
		}
	}
	fmt.Println("   created externalippool/nowhere (nodeSelector egress.example/none=true: no Node) and egress/shop (failurePolicy Fail)")
	var shop []*harness.Pod
	for _, p := range d.c.PodsIn("shop") {
		if p.Node != down {
			shop = append(shop, p)
		}
	}
	for _, p := range shop {
		var took time.Duration
		var err error
		harness.WaitFor(d.ctx, 20*time.Second, func() bool {
			start := time.Now()
			_, err = d.c.Who(d.ctx, p, false)
			took = time.Since(start)
			return errors.Is(err, syscall.EHOSTUNREACH)
		})
		if !errors.Is(err, syscall.EHOSTUNREACH) {
			return fmt.Errorf("%s under failurePolicy Fail: %v, want EHOSTUNREACH", p, err)
		}
		fmt.Printf("   %-28s connect to the external server: %q after %v\n", p.Namespace+"/"+p.Name, "no route to host", took.Round(time.Microsecond))
	}
	d.show()
	if e, err := d.c.Egress(d.ctx, "shop"); err == nil {
		for _, t := range []string{"Ready", "Assigned"} {
			if c := meta.FindStatusCondition(e.Status.Conditions, t); c != nil {
				fmt.Printf("   egress/shop %s=%s %s: %s\n", t, c.Status, c.Reason, c.Message)
			}
		}
	}
	patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"failurePolicy":"Ignore"}}`))
	if err := d.c.Client.Patch(d.ctx, &v1alpha1.Egress{ObjectMeta: metav1.ObjectMeta{Name: "shop"}}, patch); err != nil {
		return err
	}
	fmt.Println("   egress/shop switched to failurePolicy Ignore:")
	for _, p := range shop {
		var got netip.Addr
		var err error
		harness.WaitFor(d.ctx, 20*time.Second, func() bool {
			got, err = d.c.Who(d.ctx, p, false)
			return err == nil && got == p.Node.IPv4
		})
		if err != nil || got != p.Node.IPv4 {
			return fmt.Errorf("%s under failurePolicy Ignore: server saw %v (%v), want the Node IP %s", p, got, err, p.Node.IPv4)
		}
		fmt.Printf("   %-28s server sees %s (Node IP)\n", p.Namespace+"/"+p.Name, got)
	}
	return nil
}

// verify pings the Egress's IP from the client and checks which MAC the
// client's neighbour table resolved it to.
func (d *demo) verify(name string) error {
	e, err := d.c.Egress(d.ctx, name)
	if err != nil {
		return err
	}
	ip := netip.MustParseAddr(e.Status.EgressIP)
	node := d.c.Node(e.Status.EgressNode)
	if node == nil {
		return fmt.Errorf("%s: unknown Node %q", name, e.Status.EgressNode)
	}
	d.c.FlushNeighbour(ip)
	if err := d.c.Ping(ip, 2*time.Second); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	mac, err := d.c.Neighbour(ip)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	proto := "ARP"
	if ip.Is6() {
		proto = "NDP"
	}
	ok := "OK"
	if mac.String() != node.MAC.String() {
		ok = "WRONG"
	}
	fmt.Printf("   %-12s %-16s ping OK, %s -> %s = %s (%s) %s\n", name, ip, proto, mac, node.MAC, node.Name, ok)
	if ok != "OK" {
		return fmt.Errorf("%s resolves to %s, but its Node %s has %s", ip, mac, node.Name, node.MAC)
	}
	return nil
}

func (d *demo) crash(name string) (*harness.Node, error) {
	f, err := d.c.CrashAndWait(d.ctx, name, 30*time.Second)
	if err != nil {
		return nil, err
	}
	fmt.Printf("   %s crashed; %s was on it\n", f.From.Name, f.IP)
	fmt.Printf("   failover: %s answers ARP from %s (%s) %v after the crash\n", f.IP, f.To.MAC, f.To.Name, f.Took.Round(time.Millisecond))
	d.show()
	return f.From, nil
}

// demoPods run on every Node: payments Pods use the payments (IPv4) and
// payments-v6 Egresses of the samples, the analytics exporter uses
// analytics (IPv4 only), the shop Pods no Egress, and the batch Pods none
// until the last step creates the multi-IP Egress batch.
var demoPods = []harness.PodTemplate{
	{Namespace: "payments", NamespaceLabels: map[string]string{"team": "payments"}, Name: "checkout", Labels: map[string]string{"app": "checkout"}},
	{Namespace: "analytics", NamespaceLabels: map[string]string{"team": "analytics"}, Name: "exporter", Labels: map[string]string{"app": "exporter"}},
	{Namespace: "shop", NamespaceLabels: map[string]string{"team": "shop"}, Name: "web", Labels: map[string]string{"app": "web"}},
	{Namespace: "batch", NamespaceLabels: map[string]string{"team": "batch"}, Name: "job", Labels: map[string]string{"app": "job"}},
}

// sources connects from every Pod (except those of Node down) to the
// external server over IPv4 and IPv6 and prints the source address it saw,
// waiting up to 15 s for each to be the expected one: the egress IP of the
// Pod's Egress of that family, else its Node's IP.
func (d *demo) sources(down *harness.Node) error {
	eip := map[string]netip.Addr{}
	for ns, egs := range map[string][]string{"payments": {"payments", "payments-v6"}, "analytics": {"analytics"}} {
		for _, name := range egs {
			e, err := d.c.Egress(d.ctx, name)
			if err != nil {
				return err
			}
			ip, err := netip.ParseAddr(e.Status.EgressIP)
			if err != nil {
				return fmt.Errorf("%s has no egress IP yet", name)
			}
			fam := "v4"
			if ip.Is6() {
				fam = "v6"
			}
			eip[ns+fam] = ip
		}
	}
	fmt.Printf("   %-28s %-10s %-30s %s\n", "Pod", "Node", "server sees (IPv4)", "server sees (IPv6)")
	for _, p := range d.c.Pods {
		if p.Node == down {
			fmt.Printf("   %-28s %-10s (Node down)\n", p.Namespace+"/"+p.Name, p.Node.Name)
			continue
		}
		var cols []string
		for _, v6 := range []bool{false, true} {
			fam, want, what := "v4", p.Node.IPv4, "Node IP"
			if v6 {
				fam, want = "v6", p.Node.IPv6
			}
			if ip, ok := eip[p.Namespace+fam]; ok {
				want, what = ip, "egress IP"
			}
			var got netip.Addr
			var err error
			harness.WaitFor(d.ctx, 15*time.Second, func() bool {
				got, err = d.c.Who(d.ctx, p, v6)
				return err == nil && got == want
			})
			if err != nil {
				return fmt.Errorf("%s over IPv%s: no connection reached the server (want it seen from the %s %s): %w", p, fam[1:], what, want, err)
			}
			if got != want {
				return fmt.Errorf("%s over IPv%s: the server saw %v, want the %s %s", p, fam[1:], got, what, want)
			}
			cols = append(cols, fmt.Sprintf("%s (%s)", got, what))
		}
		fmt.Printf("   %-28s %-10s %-30s %s\n", p.Namespace+"/"+p.Name, p.Node.Name, cols[0], cols[1])
	}
	return nil
}

func (d *demo) cordon(name string) error {
	// The other Egresses on that Node move too.
	var others []string
	if e, err := d.c.Egress(d.ctx, name); err == nil {
		var all v1alpha1.EgressList
		if err := d.c.Client.List(d.ctx, &all); err == nil {
			for _, o := range all.Items {
				if o.Name != name && o.Status.EgressNode == e.Status.EgressNode && o.Status.EgressNode != "" {
					others = append(others, fmt.Sprintf("%s (%s)", o.Name, o.Status.EgressIP))
				}
			}
		}
	}
	m, err := d.c.CordonAndWait(d.ctx, name, 30*time.Second)
	if err != nil {
		return err
	}
	d.cordoned = m.From
	fmt.Printf("   cordoned %s; %s (%s) was on it\n", m.From.Name, name, m.IP)
	if len(others) > 0 {
		fmt.Printf("   also on it, and moved the same way: %s\n", strings.Join(others, ", "))
	}
	fmt.Printf("   planned move %s -> %s done %v after the cordon; ARP silent for %v between the last answer from %s and the first from %s\n",
		m.From.Name, m.To.Name, m.Took.Round(time.Millisecond), m.Gap.Round(time.Millisecond), m.From.Name, m.To.Name)
	fmt.Printf("   no answer from %s after the move (checked %d ARP replies)\n", m.From.Name, m.Replies)
	d.show()
	return nil
}

func (d *demo) findKubectl() {
	if d.kubectl != "" {
		return
	}
	matches, _ := filepath.Glob("bin/k8s/*/kubectl")
	if len(matches) > 0 {
		d.kubectl, _ = filepath.Abs(matches[len(matches)-1])
		return
	}
	if p, err := exec.LookPath("kubectl"); err == nil {
		d.kubectl = p
	}
}

func (d *demo) kubectlPath() string {
	if d.kubectl == "" {
		return "kubectl"
	}
	return d.kubectl
}

// show prints what kubectl shows.
func (d *demo) show() {
	if d.kubectl == "" {
		fmt.Println("   (no kubectl found; skipping the kubectl view)")
		return
	}
	for _, args := range [][]string{{"get", "egress", "-o", "wide"}, {"get", "eip"}} {
		cmd := exec.Command(d.kubectl, append([]string{"--kubeconfig", d.c.Kubeconfig}, args...)...)
		out, err := cmd.CombinedOutput()
		fmt.Printf("\n   $ kubectl %s\n", strings.Join(args, " "))
		for l := range strings.SplitSeq(strings.TrimRight(string(out), "\n"), "\n") {
			fmt.Printf("   %s\n", l)
		}
		if err != nil {
			fmt.Printf("   (kubectl: %v)\n", err)
		}
	}
}
