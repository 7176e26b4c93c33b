// Command egressip-agent is the egressip node agent: it binds the egress IPs
// the controller assigned to its Node and announces them. It runs on every
// Node as a DaemonSet pod in the host network. See docs/agent.md.
package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	// Client auth plugins (OIDC, exec, ...) for out-of-cluster kubeconfigs.
	_ "k8s.io/client-go/plugin/pkg/client/auth"

	"github.com/go-logr/logr"
	"github.com/vishvananda/netns"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/egressip/egressip/internal/agent"
	"github.com/egressip/egressip/internal/agent/datapath"
	"github.com/egressip/egressip/internal/agent/datapathsync"
	"github.com/egressip/egressip/internal/agent/kernel"
	"github.com/egressip/egressip/internal/healthprobe"
	"github.com/egressip/egressip/internal/podstart"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

// run parses args, runs the agent until SIGTERM or SIGINT and returns the
// process exit code: 0 after a signal, 1 when the agent failed, 2 for bad
// flags or a missing Node name.
func run(args []string, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "probe" {
		return healthprobe.Main("egressip-agent probe", args[1:], stderr)
	}
	fs := flag.NewFlagSet("egressip-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	f := bindFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		_, _ = fmt.Fprintf(stderr, "egressip-agent: unexpected arguments %q\n", fs.Args())
		return 2
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&f.zap), zap.WriteTo(stderr)))
	log := ctrl.Log.WithName("setup")

	o, err := f.options(os.Getenv)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "egressip-agent: %v\n", err)
		return 2
	}
	// Adopted addresses get this agent's lifetime before anything else
	// (the kernel probes take a while): a quick restart leaves no gap.
	if err := agent.RenewAtStart(o.Config); err != nil {
		log.Error(err, "cannot renew the lifetime of the egress IPs a previous agent bound; "+
			"the first reconcile binds them again if they expire")
	}

	cfg, err := ctrl.GetConfig()
	if err != nil {
		log.Error(err, "no API server configuration")
		return 1
	}
	o.REST = cfg
	if o.Certificates != nil {
		o.Certificates.REST = cfg
	}
	// Kernel features, probed before anything is programmed (package
	// kernel; docs/agent.md has the table). A missing datapath feature
	// keeps the datapath off; the bindings still run.
	kc, err := probeKernel(o.NetNSPath, f.dp.enabled)
	if err != nil {
		log.Error(err, "cannot probe the kernel")
		return 1
	}
	if f.dp.enabled && !kc.Decision().Refused(kernel.PartDatapath) {
		closeDatapath, code := startDatapath(&f.dp, &o, kc, log, stderr)
		defer closeDatapath()
		if code != 0 {
			return code
		}
	}
	o.Kernel = agent.RecordKernel(ctrl.Log.WithName("kernel"), kc.Decision())
	if err := agent.Run(ctrl.SetupSignalHandler(), o); err != nil {
		log.Error(err, "agent failed")
		return 1
	}
	return 0
}

// startDatapath checks the datapath flags, opens the datapath engine (and
// the host stack check) in the agent's namespace and sets them, the CIDRs
// kept off egress paths and the CNI plugin's server in o. It returns a
// function closing what it opened, to call when the agent stops (also
// after a failure), and 0, or the exit code: 2 for a bad flag, 1 when the
// engine or the check cannot start (both logged).
func startDatapath(d *datapathFlags, o *agent.RunOptions, kc *agent.KernelCheck,
	log logr.Logger, stderr io.Writer) (closeAll func(), code int) {
	var closers []func() error
	closeAll = func() {
		for _, c := range slices.Backward(closers) {
			_ = c()
		}
	}
	dc := datapath.DefaultConfig()
	dc.Uplink = cmp.Or(d.uplink, o.Interface)
	if d.rejectQueue == 0 || d.rejectQueue < -1 || d.rejectQueue > 65535 {
		_, _ = fmt.Fprintf(stderr,
			"egressip-agent: --datapath-reject-queue %d: want 1..65535, or -1 for none\n", d.rejectQueue)
		return closeAll, 2
	}
	if d.cniSocket != "" && d.cniTimeout < time.Second {
		_, _ = fmt.Fprintf(stderr, "egressip-agent: --cni-timeout %s: want at least 1s\n", d.cniTimeout)
		return closeAll, 2
	}
	dc.RejectQueue = d.rejectQueue
	dc.DrainTimeout = d.drainTimeout
	if d.drainTimeout == 0 {
		dc.DrainTimeout = -1
	}
	eng, pr, err := openEngine(o.NetNSPath, dc, d.poolRouting)
	if err != nil {
		log.Error(err, "cannot start the datapath")
		return closeAll, 1
	}
	closers = append(closers, eng.Close, func() error { pr.Close(); return nil })
	o.Datapath, o.PoolRoutes = eng, pr
	if dc.RejectQueue >= 0 {
		kc.SetRejectQueueForm(eng.RejectQueueForm())
	}
	if d.hostStackCheck {
		hc, err := datapathsync.NewHostCheck(o.NetNSPath)
		if err != nil {
			log.Error(err, "cannot start the host stack check")
			return closeAll, 1
		}
		closers = append(closers, hc.Close)
		o.HostCheck = hc
	}
	o.CIDRs = datapathsync.CIDRs{ClusterCIDRs: d.clusterCIDRs.list, ServiceCIDRs: d.serviceCIDRs.list,
		ExcludeCIDRs: d.excludeCIDRs.list}
	if d.cniSocket != "" {
		o.PodStart = &podstart.Options{Socket: d.cniSocket, ConfDir: d.cniConfDir, Keep: d.cniKeep,
			Timeout: d.cniTimeout}
	}
	log.Info("datapath on",
		"uplink", eng.Config().Uplink, "rejectQueue", eng.Config().RejectQueue,
		"rejectQueueForm", eng.RejectQueueForm(), "uplinkMTU", eng.Config().UplinkMTU,
		"clusterCIDRs", cmp.Or(d.clusterCIDRs.String(), "Nodes' podCIDRs"),
		"serviceCIDRs", cmp.Or(d.serviceCIDRs.String(), "ServiceCIDR objects"), "excludeCIDRs", d.excludeCIDRs.String(),
		"cniSocket", d.cniSocket, "cniConfDir", d.cniConfDir)
	return closeAll, 0
}

// openEngine opens the datapath engine and, when poolRouting is set, its
// pool routing (nil otherwise). It fails when either cannot be opened,
// leaving nothing open.
func openEngine(netnsPath string, dc datapath.Config,
	poolRouting bool) (*datapathsync.Engine, *datapathsync.PoolRouting, error) {
	eng, err := datapathsync.NewEngine(netnsPath, dc)
	if err != nil || !poolRouting {
		return eng, nil, err
	}
	pr, err := eng.NewPoolRouting()
	if err != nil {
		_ = eng.Close()
		return nil, nil, err
	}
	return eng, pr, nil
}

// probeKernel probes the kernel features of the agent's parts in the
// namespace at nsPath (empty: the agent's own). It fails only when the
// namespace cannot be opened.
func probeKernel(nsPath string, withDatapath bool) (*agent.KernelCheck, error) {
	ns := netns.None()
	if nsPath != "" {
		h, err := netns.GetFromPath(nsPath)
		if err != nil {
			return nil, fmt.Errorf("open network namespace %s: %w", nsPath, err)
		}
		defer func() { _ = h.Close() }()
		ns = h
	}
	return agent.ProbeKernel(kernel.NewProber(ns, kernel.Options{}), kernel.Release(), withDatapath), nil
}
