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
	"net/netip"
	"os"
	"strings"
	"time"

	// Client auth plugins (OIDC, exec, ...) for out-of-cluster kubeconfigs.
	_ "k8s.io/client-go/plugin/pkg/client/auth"

	"github.com/vishvananda/netns"
	"k8s.io/apimachinery/pkg/labels"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/egressip/egressip/internal/agent"
	"github.com/egressip/egressip/internal/agent/bind"
	"github.com/egressip/egressip/internal/agent/conflict"
	"github.com/egressip/egressip/internal/agent/datapath"
	"github.com/egressip/egressip/internal/agent/datapathsync"
	"github.com/egressip/egressip/internal/agent/fence"
	"github.com/egressip/egressip/internal/agent/kernel"
	"github.com/egressip/egressip/internal/agentcert"
	"github.com/egressip/egressip/internal/healthprobe"
	"github.com/egressip/egressip/internal/podstart"
	"github.com/egressip/egressip/internal/podstart/cniapi"
	"github.com/egressip/egressip/internal/report"
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
	var (
		o        agent.RunOptions
		nodeFlag string
	)
	fs.StringVar(&nodeFlag, "node-name", "",
		"Name of this Node. Defaults to $"+agent.NodeNameEnv+" (set it from spec.nodeName with the downward API).")
	fs.BoolVar(&o.CreateVLANs, "create-vlans", false,
		"Create the VLAN sub-interface a pool's subnetInfo.vlan names (egv<parent index>.<VLAN ID>, marked with the "+
			"alias egressip:vlan, rp_filter 2 and arp_ignore 1 on it only) and delete it when no bound IP needs it. "+
			"A VLAN link of that ID on the parent that egressip did not create is then refused, not used. "+
			"Off: the sub-interface must exist, as before.")
	fs.StringVar(&o.VLANParent, "vlan-parent", "",
		"With --create-vlans, the parent interface of every VLAN sub-interface; "+
			"empty: the interface the IP would be bound on without the VLAN (the one carrying the untagged subnet).")
	fs.StringVar(&o.Interface, "interface", "",
		"Interface to bind every egress IP on (a pool's subnetInfo.vlan still picks its VLAN sub-interface). "+
			"Empty: per IP, the interface with a connected subnet holding the IP (or the pool's subnet), "+
			"else that of the default route.")
	fs.DurationVar(&o.AnnounceInterval, "announce-interval", 0,
		"Re-announce every bound egress IP this often after its initial burst (0 s, 1 s, 2 s, 4 s). 0 turns it off.")
	var conflictInterval time.Duration
	fs.DurationVar(&conflictInterval, "conflict-check-interval", conflict.DefaultInterval,
		"Probe every bound egress IP this often for another host answering for it on the wire (an RFC 5227 ARP "+
			"probe, a DAD-style IPv6 Neighbor Solicitation), besides at start and after each bind; a conflict is "+
			"reported (the Egress condition Conflict), the address is kept. 0 turns the checks off.")
	fs.DurationVar(&o.ResyncPeriod, "resync-period", agent.DefaultResyncPeriod,
		"Re-check the bindings this often without any change (restores addresses removed by hand); "+
			"also the longest retry backoff.")
	fs.StringVar(&o.ReportBindAddress, "report-bind-address", fmt.Sprintf(":%d", report.DefaultPort),
		"Address the report the controller polls is served on (mutual TLS, host network).")
	fs.StringVar(&o.MetricsBindAddress, "metrics-bind-address", "0",
		"Address the Prometheus metrics are served on, for example :9447. 0 turns it off.")
	fs.BoolVar(&o.MetricsSecure, "metrics-secure", true,
		"Serve the metrics over HTTPS with authentication and authorization (a bearer token allowed to GET /metrics, "+
			"as the controller's). false serves plain HTTP without either.")
	var (
		reportTLS    bool
		caNamespace  string
		certLifetime time.Duration
	)
	fs.BoolVar(&reportTLS, "report-tls", true,
		"Serve the report over mutual TLS with a certificate naming this Node, issued through the "+
			"CertificateSigningRequest API "+
			"(signer "+agentcert.SignerName+"). false serves plain HTTP, which egressip-controller refuses: for tests only.")
	fs.StringVar(&caNamespace, "agent-ca-namespace", "",
		"Namespace of the ConfigMap "+agentcert.CAConfigMapName+" holding the agent CA (the controller's namespace). "+
			"Defaults to $"+agent.PodNamespaceEnv+".")
	fs.DurationVar(&certLifetime, "certificate-lifetime", agentcert.DefaultRequestedLifetime,
		"Lifetime asked for the agent's certificate (at least 10m; the controller's --agent-cert-lifetime may shorten it). "+
			"It is renewed at 70 to 90 % of its lifetime, without a restart.")
	fs.StringVar(&o.HealthProbeBindAddress, "health-probe-bind-address", ":9446",
		"Address /healthz and /readyz are served on. 0 turns it off.")
	fs.StringVar(&o.HealthProbeSocket, "health-probe-socket", "",
		"Unix socket path on which this process alone serves /healthz and /readyz, "+
			"for `egressip-agent probe` in an exec probe (the health port is shared with "+
			"the other agent during a surge rolling update). Empty turns it off; the "+
			"DaemonSet uses "+agent.DefaultHealthProbeSocket+".")
	var ownership, recordPath string
	fs.StringVar(&ownership, "address-ownership", string(bind.OwnershipAuto),
		"How the agent knows which addresses it added: auto (the address protocol attribute IFA_PROTO, kept by "+
			"Linux 5.18+, and the ownership record; works on every kernel), proto (IFA_PROTO alone: refuses to bind "+
			"where the kernel drops it) or record (the ownership record alone, IFA_PROTO neither written nor read).")
	fs.StringVar(&recordPath, "ownership-record", "",
		"Ownership record file, written before each bind and after each unbind (its directory must exist: in the "+
			"DaemonSet a hostPath volume). Default "+agent.DefaultRecordPath+", or none with --netns. "+
			"Agents in different network namespaces need different files.")
	fs.DurationVar(&o.AddressLifetime, "address-lifetime", agent.DefaultAddressLifetime,
		"Valid lifetime of the egress addresses (whole seconds): the agent renews it every --address-renew-interval, "+
			"and the kernel removes the addresses of an agent gone for that long; "+
			"at most --controller-dead-after, 0 for forever.")
	fs.DurationVar(&o.RenewInterval, "address-renew-interval", agent.DefaultRenewInterval,
		"How often the agent renews the lifetime of its egress addresses; at most half of --address-lifetime.")
	fs.StringVar(&o.NetNSPath, "netns", "",
		"Bind and announce in the network namespace at this path (e.g. /run/netns/node1) "+
			"instead of the agent's own. For tests and the local end-to-end setup.")
	var (
		withDatapath                  bool
		clusterCIDRs, svcCIDRs, excls cidrList
		dpUplink                      string
		rejectQueue                   int
		drainTimeout                  time.Duration
		hostStackCheck                bool
		poolRouting                   bool
		cniSocket, cniConfDir         string
		cniKeep                       bool
		cniTimeout                    time.Duration
	)
	fs.BoolVar(&withDatapath, "datapath", false,
		"Also program the datapath that makes selected Pods' traffic leave with their Egress's IP (a VXLAN-GPE "+
			"tunnel device, an nftables table and policy routing of egressip's own). The chart turns it on.")
	fs.Var(&clusterCIDRs, "cluster-cidrs",
		"Comma-separated Pod CIDRs, never sent through an egress IP. Default: every Node's spec.podCIDRs.")
	fs.Var(&svcCIDRs, "service-cidrs",
		"Comma-separated Service CIDRs, never sent through an egress IP. Default: the cluster's ServiceCIDR objects "+
			"(networking.k8s.io/v1, Kubernetes 1.33+). They matter where a ClusterIP is not DNATed before routing "+
			"(kube-proxy in IPVS mode), for Services without endpoints, and for external endpoints.")
	fs.Var(&excls, "exclude-cidrs",
		"Comma-separated further destinations never sent through an "+
			"egress IP (for example a corporate network reached without NAT).")
	fs.BoolVar(&hostStackCheck, "datapath-host-stack-check", true,
		"With --datapath, check whether the CNI steers Pod traffic past the host's IP stack with eBPF "+
			"(direct-action tc or tcx programs on Pods' host devices, netkit, Cilium or Calico eBPF devices) and report it"+
			" in the Node condition EgressDatapathSupported. "+
			"Turn it off where such programs let traffic reach the stack (Cilium with bpf.hostLegacyRouting=true).")
	fs.BoolVar(&poolRouting, "datapath-pool-routing", true,
		"With --datapath, send the traffic of an egress IP bound on a link other than the default-route link "+
			"through that link, to its pool's subnetInfo.gateway (policy routing tables 49900-49963, rules at "+
			"priorities 1110 and 1111, see docs/datapath.md); false leaves it to the main table.")
	fs.IntVar(&rejectQueue, "datapath-reject-queue", datapath.DefaultConfig().RejectQueue,
		"Netfilter queue number (1-65535) through which the first packet of a connection that failurePolicy Fail "+
			"rejects takes a round trip to the agent, "+
			"so that TCP connects fail at once with EHOSTUNREACH (IPv6 otherwise waits for the retransmitted SYN, about 1 s). "+
			"-1 turns it off. "+
			"Change it if other software on the Node uses that queue.")
	fs.DurationVar(&drainTimeout, "datapath-drain-timeout", datapath.DefaultDrainTimeout,
		"How long at most the open flows of a Pod that leaves an Egress (its labels or the Egress's selectors changed) "+
			"keep the path of that Egress when they do not end by themselves; then their conntrack entries are deleted. "+
			"A negative value turns draining off: such flows are cut when the Pod leaves.")
	fs.StringVar(&cniSocket, "cni-socket", "",
		"With --datapath, serve the egressip-cni plugin on this unix socket (the DaemonSet uses "+cniapi.DefaultSocket+
			"): a new Pod is classified before its sandbox's network setup returns, so its first packet already "+
			"leaves with its egress IP. Empty turns it off.")
	fs.StringVar(&cniConfDir, "cni-conf-dir", "",
		"With --cni-socket, chain egressip-cni into the first network configuration list of this directory "+
			"(/etc/cni/net.d), keep it there, and remove it when the agent stops (see --cni-keep-on-exit). "+
			"Empty: the plugin is chained by hand.")
	fs.BoolVar(&cniKeep, "cni-keep-on-exit", false,
		"Leave the plugin's entry and socket in place when the agent stops: Pods that start while no agent runs "+
			"then fail their sandbox setup and are retried by the kubelet, instead of starting unclassified. "+
			"Remove the entry by hand when uninstalling.")
	fs.DurationVar(&cniTimeout, "cni-timeout", cniapi.DefaultTimeout,
		"How long the plugin waits for the agent to classify a Pod before failing its sandbox setup (whole seconds).")
	fs.StringVar(&dpUplink, "datapath-uplink", "",
		"Interface toward the other Nodes, whose MTU sizes the tunnel. "+
			"Default: --interface, else the interface of the default route.")
	fc := fence.DefaultConfig()
	fs.DurationVar(&fc.Timeout, "fence-timeout", fc.Timeout,
		"Self-fencing: release every egress IP of this Node after this long without a controller poll, when the API "+
			"server does not answer either and the peer agents say this Node is isolated or the controller polls them "+
			"but not this Node (docs/failover.md). Must fit --controller-dead-after. 0 turns fencing off.")
	fs.DurationVar(&fc.ProbeInterval, "peer-probe-interval", fc.ProbeInterval,
		"How often the API server and the peer agents are probed while the controller's polls are late "+
			"(never in steady state).")
	fs.IntVar(&fc.Peers, "peers", fc.Peers,
		"Size of this agent's peer set (fewer in smaller clusters), chosen among the Nodes matching --peer-node-selector.")
	fs.DurationVar(&fc.ControllerPollInterval, "controller-poll-interval", fc.ControllerPollInterval,
		"The controller's --agent-poll-interval (checked against --fence-timeout at start; the chart sets both).")
	fs.DurationVar(&fc.ControllerDeadAfter, "controller-dead-after", fc.ControllerDeadAfter,
		"The controller's --agent-dead-after (--fence-timeout must end before it; the chart sets both).")
	var peerSelector string
	fs.StringVar(&peerSelector, "peer-node-selector", "kubernetes.io/os=linux",
		"Label selector of the Nodes that run an agent (the DaemonSet's nodeSelector): the peer candidates.")
	// --kubeconfig, as every controller-runtime binary has it (registered
	// on the default flag set by controller-runtime's config package).
	if kf := flag.CommandLine.Lookup("kubeconfig"); kf != nil {
		fs.Var(kf.Value, kf.Name, kf.Usage)
	}
	zopts := zap.Options{}
	zopts.BindFlags(fs)
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
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&zopts), zap.WriteTo(stderr)))
	log := ctrl.Log.WithName("setup")

	node, err := agent.ResolveNodeName(nodeFlag, os.Getenv)
	if err != nil {
		_, _ = fmt.Fprintf(stderr, "egressip-agent: %v\n", err)
		return 2
	}
	o.NodeName = node
	switch {
	case conflictInterval < 0:
		_, _ = fmt.Fprintf(stderr, "egressip-agent: --conflict-check-interval %v is negative (0 turns the checks off)\n",
			conflictInterval)
		return 2
	case conflictInterval == 0:
		o.ConflictInterval = -1 // off
	default:
		o.ConflictInterval = conflictInterval
	}
	if o.Ownership, err = bind.ParseOwnership(ownership); err != nil {
		_, _ = fmt.Fprintf(stderr, "egressip-agent: --address-ownership: %v\n", err)
		return 2
	}
	o.RecordPath = recordPath
	if recordPath == "" && o.NetNSPath == "" {
		o.RecordPath = agent.DefaultRecordPath
	}
	if o.Ownership == bind.OwnershipRecord && o.RecordPath == "" {
		_, _ = fmt.Fprintln(stderr, "egressip-agent: --address-ownership=record needs --ownership-record")
		return 2
	}

	// One flag, --controller-dead-after, carries the controller's
	// --agent-dead-after for both checks: the address lifetime and fencing
	// must each end before the controller moves the Node's IPs.
	o.ControllerDeadAfter = fc.ControllerDeadAfter
	if err := agent.CheckLifetime(o.AddressLifetime, o.RenewInterval, o.ControllerDeadAfter); err != nil {
		_, _ = fmt.Fprintf(stderr, "egressip-agent: %v\n", err)
		return 2
	}
	if err := fc.Validate(); err != nil {
		_, _ = fmt.Fprintf(stderr, "egressip-agent: fencing timings: %v\n", err)
		return 2
	}
	o.Fence = fc
	if o.PeerSelector, err = labels.Parse(peerSelector); err != nil {
		_, _ = fmt.Fprintf(stderr, "egressip-agent: --peer-node-selector %q: %v\n", peerSelector, err)
		return 2
	}
	caNS := cmp.Or(caNamespace, os.Getenv(agent.PodNamespaceEnv))
	if reportTLS && caNS == "" {
		_, _ = fmt.Fprintf(stderr, "egressip-agent: --report-tls needs --agent-ca-namespace or $%s "+
			"(in a DaemonSet: env %s from fieldRef metadata.namespace)\n",
			agent.PodNamespaceEnv, agent.PodNamespaceEnv)
		return 2
	}
	if reportTLS && certLifetime < 10*time.Minute {
		_, _ = fmt.Fprintf(stderr, "egressip-agent: --certificate-lifetime %s: "+
			"want at least 10m (the CertificateSigningRequest API's minimum)\n", certLifetime)
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
	if reportTLS {
		o.Certificates = &agentcert.SourceConfig{Node: node, REST: cfg, Namespace: caNS,
			RequestedLifetime: certLifetime, Registerer: metrics.Registry}
	}
	// Kernel features, probed before anything is programmed (package
	// kernel; docs/agent.md has the table). A missing datapath feature
	// keeps the datapath off; the bindings still run.
	kc, err := probeKernel(o.NetNSPath, withDatapath)
	if err != nil {
		log.Error(err, "cannot probe the kernel")
		return 1
	}
	if withDatapath && kc.Decision().Refused(kernel.PartDatapath) {
		withDatapath = false
	}
	if withDatapath {
		dc := datapath.DefaultConfig()
		dc.Uplink = cmp.Or(dpUplink, o.Interface)
		if rejectQueue == 0 || rejectQueue < -1 || rejectQueue > 65535 {
			_, _ = fmt.Fprintf(stderr,
				"egressip-agent: --datapath-reject-queue %d: want 1..65535, or -1 for none\n", rejectQueue)
			return 2
		}
		dc.RejectQueue = rejectQueue
		dc.DrainTimeout = drainTimeout
		if drainTimeout == 0 {
			dc.DrainTimeout = -1
		}
		eng, pr, err := openEngine(o.NetNSPath, dc, poolRouting)
		if err != nil {
			log.Error(err, "cannot start the datapath")
			return 1
		}
		defer func() { _ = eng.Close() }()
		defer pr.Close()
		o.Datapath, o.PoolRoutes = eng, pr
		if dc.RejectQueue >= 0 {
			kc.SetRejectQueueForm(eng.RejectQueueForm())
		}
		if hostStackCheck {
			hc, err := datapathsync.NewHostCheck(o.NetNSPath)
			if err != nil {
				log.Error(err, "cannot start the host stack check")
				return 1
			}
			defer func() { _ = hc.Close() }()
			o.HostCheck = hc
		}
		o.CIDRs = datapathsync.CIDRs{ClusterCIDRs: clusterCIDRs.list, ServiceCIDRs: svcCIDRs.list, ExcludeCIDRs: excls.list}
		if cniSocket != "" {
			if cniTimeout < time.Second {
				_, _ = fmt.Fprintf(stderr, "egressip-agent: --cni-timeout %s: want at least 1s\n", cniTimeout)
				return 2
			}
			o.PodStart = &podstart.Options{Socket: cniSocket, ConfDir: cniConfDir, Keep: cniKeep, Timeout: cniTimeout}
		}
		log.Info("datapath on",
			"uplink", eng.Config().Uplink, "rejectQueue", eng.Config().RejectQueue,
			"rejectQueueForm", eng.RejectQueueForm(), "uplinkMTU", eng.Config().UplinkMTU,
			"clusterCIDRs", cmp.Or(clusterCIDRs.String(), "Nodes' podCIDRs"),
			"serviceCIDRs", cmp.Or(svcCIDRs.String(), "ServiceCIDR objects"), "excludeCIDRs", excls.String(),
			"cniSocket", cniSocket, "cniConfDir", cniConfDir)
	}
	o.Kernel = agent.RecordKernel(ctrl.Log.WithName("kernel"), kc.Decision())
	if err := agent.Run(ctrl.SetupSignalHandler(), o); err != nil {
		log.Error(err, "agent failed")
		return 1
	}
	return 0
}

// probeKernel probes the kernel features of the agent's parts in the
// namespace at nsPath (empty: the agent's own). It fails only when the
// namespace cannot be opened.
// openEngine opens the datapath engine and, when poolRouting is set, its
// pool routing (nil otherwise). It fails when either cannot be opened,
// leaving nothing open.
func openEngine(netnsPath string, dc datapath.Config, poolRouting bool) (*datapathsync.Engine, *datapathsync.PoolRouting, error) {
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

// cidrList is a flag holding comma-separated CIDRs; a nil list means the
// flag was not given. Host bits must be zero (10.0.0.0/8, not 10.1.2.3/8).
type cidrList struct{ list []netip.Prefix }

func (c *cidrList) String() string {
	if c == nil {
		return ""
	}
	s := make([]string, len(c.list))
	for i, p := range c.list {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

func (c *cidrList) Set(v string) error {
	c.list = []netip.Prefix{}
	for f := range strings.SplitSeq(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return fmt.Errorf("%q is not a CIDR: %w", f, err)
		}
		if p != p.Masked() {
			return fmt.Errorf("%q has host bits set (did you mean %s?)", f, p.Masked())
		}
		c.list = append(c.list, p)
	}
	return nil
}
