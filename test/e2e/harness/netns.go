// Package harness runs a local egressip cluster: a control plane
// (kube-apiserver and etcd from `make envtest-assets`), egressip-controller,
// and one egressip-agent per Node, each Node a network namespace on one Linux
// bridge. `make demo` and the end-to-end tests both use it.
//
// Everything lives in namespaces the harness creates: the calling process
// first re-executes itself in a fresh "control-plane" namespace (ReexecInNetNS)
// that holds the bridge, the API server and the controller; Nodes and the
// client are further namespaces joined to that bridge by veth pairs. Only the
// documentation ranges are used (192.0.2.0/24, RFC 5737; 2001:db8::/64,
// RFC 3849), so no packet can reach a real network.
package harness

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"

	"github.com/egressip/egressip/internal/testutil/netnstest"
)

// EnvNetNS is set in the re-executed child to the namespace it runs in.
const EnvNetNS = "EGRESSIP_HARNESS_NETNS"

// ReexecInNetNS makes the current process run inside a fresh network
// namespace named ns. In the parent it creates ns, runs this same program
// (same arguments) inside it, forwards SIGINT, SIGTERM and SIGHUP, and after the child ends kills every process the child left
// behind (its process group), deletes every namespace whose name starts with
// ns, and exits with the child's status. In the child (EnvNetNS == ns) it
// returns nil at once. It returns an error only when ns cannot be created.
func ReexecInNetNS(ns string) error {
	if os.Getenv(EnvNetNS) == ns {
		return nil
	}
	if os.Geteuid() != 0 {
		return errors.New("network namespaces need root: run as root (the agent binds addresses and sends ARP)")
	}
	if out, err := exec.Command("ip", "netns", "pids", ns).Output(); err == nil && len(strings.TrimSpace(string(out))) > 0 {
		return fmt.Errorf("namespace %s is in use by another run (processes %s); stop that run first", ns, strings.Join(strings.Fields(string(out)), " "))
	}
	CleanupNamespaces(ns)
	if err := netnstest.Add(ns); err != nil {
		return fmt.Errorf("create namespace %s: %w", ns, err)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable: %w", err)
	}
	// Start the child from a thread that has entered ns: it inherits that
	// network namespace, and (unlike `ip netns exec`) no private mount
	// namespace, so the namespaces it adds are usable from every shell.
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), EnvNetNS+"="+ns)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	if err := startInNetNS(ns, cmd); err != nil {
		CleanupNamespaces(ns)
		return fmt.Errorf("start %s in %s: %w", self, ns, err)
	}
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()
	err = cmd.Wait()
	signal.Stop(sigs)
	// Whatever the child started (API server, etcd, controller, agents)
	// shares its process group; none may outlive the run.
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	CleanupNamespaces(ns)
	code := 0
	if err != nil {
		code = 1
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() > 0 {
			code = ee.ExitCode()
		}
	}
	os.Exit(code)
	return nil
}

// CleanupNamespaces kills every process inside, then deletes, every network
// namespace whose name starts with prefix (left over from an interrupted run,
// or at the end of this one), with netnstest.DeletePrefix. Killing by
// namespace also catches processes that left the run's process group, such
// as etcd and kube-apiserver. It is best effort: errors are dropped.
func CleanupNamespaces(prefix string) {
	_ = netnstest.DeletePrefix(prefix)
}

// run runs a command and returns its error with its output.
func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// inNS runs an ip(8) command inside namespace ns.
func inNS(ns string, args ...string) error {
	return run("ip", append([]string{"-n", ns}, args...)...)
}

// startInNetNS starts cmd in namespace ns (netnstest's NS.Start).
func startInNetNS(ns string, cmd *exec.Cmd) error {
	n, err := netnstest.Open(ns)
	if err != nil {
		return err
	}
	defer func() { _ = n.Close() }()
	return n.Start(cmd)
}
