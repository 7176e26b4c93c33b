package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/egressip/egressip/internal/agent"
	"github.com/egressip/egressip/internal/agent/bind"
	"github.com/egressip/egressip/internal/agent/conflict"
	"github.com/egressip/egressip/internal/agent/datapath"
	"github.com/egressip/egressip/internal/agent/fence"
	"github.com/egressip/egressip/internal/agentcert"
	"github.com/egressip/egressip/internal/podstart/cniapi"
	"github.com/egressip/egressip/internal/report"
)

// agentFlags is the agent's command line as given: bindFlags registers
// every field on a flag set, options checks them and turns them into the
// agent's options.
type agentFlags struct {
	// o holds the flags that are agent options as they stand.
	o agent.RunOptions
	// nodeName is --node-name; empty falls back to $NODE_NAME.
	nodeName string
	// conflictInterval is --conflict-check-interval; 0 turns the checks off.
	conflictInterval time.Duration
	// takeoverGuard is --takeover-guard; 0 turns the guard off.
	takeoverGuard time.Duration
	// reportTLS, caNamespace and certLifetime are the agent's identity:
	// --report-tls, --agent-ca-namespace, --certificate-lifetime.
	reportTLS    bool
	caNamespace  string
	certLifetime time.Duration
	// ownership and recordPath are --address-ownership and --ownership-record.
	ownership, recordPath string
	// fence holds the self-fencing timings (--fence-timeout and friends).
	fence fence.Config
	// peerSelector is --peer-node-selector, not yet parsed.
	peerSelector string
	// dp holds the --datapath flags.
	dp datapathFlags
	// zap holds the logging flags (--zap-log-level, ...).
	zap zap.Options
}

// datapathFlags are the flags of the datapath (--datapath and the
// --datapath-*, --cni-* and *-cidrs flags); startDatapath uses them.
type datapathFlags struct {
	enabled                                  bool
	clusterCIDRs, serviceCIDRs, excludeCIDRs cidrList
	uplink                                   string
	rejectQueue                              int
	drainTimeout                             time.Duration
	hostStackCheck                           bool
	poolRouting                              bool
	cniSocket, cniConfDir                    string
	cniKeep                                  bool
	cniTimeout                               time.Duration
}

// bindFlags registers every flag of the agent on fs, with its default,
// and returns where the parsed values land.
func bindFlags(fs *flag.FlagSet) *agentFlags {
	f := &agentFlags{fence: fence.DefaultConfig()}
	f.bindAgentFlags(fs)
	f.dp.bind(fs)
	f.bindFenceFlags(fs)
	// --kubeconfig, as every controller-runtime binary has it (registered
	// on the default flag set by controller-runtime's config package).
	if kf := flag.CommandLine.Lookup("kubeconfig"); kf != nil {
		fs.Var(kf.Value, kf.Name, kf.Usage)
	}
	f.zap.BindFlags(fs)
	return f
}

// bindAgentFlags registers the flags of the bindings, the report, the
// metrics and health endpoints and the address ownership.
func (f *agentFlags) bindAgentFlags(fs *flag.FlagSet) {
	fs.StringVar(&f.nodeName, "node-name", "",
		"Name of this Node. Defaults to $"+agent.NodeNameEnv+" (set it from spec.nodeName with the downward API).")
	fs.BoolVar(&f.o.CreateVLANs, "create-vlans", false,
		"Create the VLAN sub-interface a pool's subnetInfo.vlan names (egv<parent index>.<VLAN ID>, marked with the "+
			"alias egressip:vlan, rp_filter 2 and arp_ignore 1 on it only) and delete it when no bound IP needs it. "+
			"A VLAN link of that ID on the parent that egressip did not create is then refused, not used. "+
			"Off: the sub-interface must exist, as before.")
	fs.StringVar(&f.o.VLANParent, "vlan-parent", "",
		"With --create-vlans, the parent interface of every VLAN sub-interface; "+
			"empty: the interface the IP would be bound on without the VLAN (the one carrying the untagged subnet).")
	fs.StringVar(&f.o.Interface, "interface", "",
		"Interface to bind every egress IP on (a pool's subnetInfo.vlan still picks its VLAN sub-interface). "+
			"Empty: per IP, the interface with a connected subnet holding the IP (or the pool's subnet), "+
			"else that of the default route.")
	fs.DurationVar(&f.o.AnnounceInterval, "announce-interval", 0,
		"Re-announce every bound egress IP this often after its initial burst (0 s, 1 s, 2 s, 4 s). 0 turns it off.")
	fs.DurationVar(&f.conflictInterval, "conflict-check-interval", conflict.DefaultInterval,
		"Probe every bound egress IP this often for another host answering for it on the wire (an RFC 5227 ARP "+
			"probe, a DAD-style IPv6 Neighbor Solicitation), besides at start and after each bind; a conflict is "+
			"reported (the Egress condition Conflict), the address is kept. 0 turns the checks off.")
	fs.DurationVar(&f.takeoverGuard, "takeover-guard", agent.DefaultTakeoverGuard,
		"Before binding an egress IP this Node does not hold, probe for it (ARP probe, DAD-style Neighbor "+
			"Solicitation; 30 ms) and, while another host answers, wait for it to stop, at most this long, "+
			"then bind anyway: a cut-off Node that fences late never answers together with this one. 0 turns it off.")
	fs.DurationVar(&f.o.ResyncPeriod, "resync-period", agent.DefaultResyncPeriod,
		"Re-check the bindings this often without any change (restores addresses removed by hand); "+
			"also the longest retry backoff.")
	fs.StringVar(&f.o.ReportBindAddress, "report-bind-address", fmt.Sprintf(":%d", report.DefaultPort),
		"Address the report the controller polls is served on (mutual TLS, host network).")
	fs.StringVar(&f.o.MetricsBindAddress, "metrics-bind-address", "0",
		"Address the Prometheus metrics are served on, for example :9447. 0 turns it off.")
	fs.BoolVar(&f.o.MetricsSecure, "metrics-secure", true,
		"Serve the metrics over HTTPS with authentication and authorization (a bearer token allowed to GET /metrics, "+
			"as the controller's). false serves plain HTTP without either.")
	fs.BoolVar(&f.reportTLS, "report-tls", true,
		"Serve the report over mutual TLS with a certificate naming this Node, issued through the "+
			"CertificateSigningRequest API "+
			"(signer "+agentcert.SignerName+"). false serves plain HTTP, which egressip-controller refuses: for tests only.")
	fs.StringVar(&f.caNamespace, "agent-ca-namespace", "",
		"Namespace of the ConfigMap "+agentcert.CAConfigMapName+" holding the agent CA (the controller's namespace). "+
			"Defaults to $"+agent.PodNamespaceEnv+".")
	fs.DurationVar(&f.certLifetime, "certificate-lifetime", agentcert.DefaultRequestedLifetime,
		"Lifetime asked for the agent's certificate (at least 10m; the controller's --agent-cert-lifetime may shorten it). "+
			"It is renewed at 70 to 90 % of its lifetime, without a restart.")
	fs.StringVar(&f.o.HealthProbeBindAddress, "health-probe-bind-address", ":9446",
		"Address /healthz and /readyz are served on. 0 turns it off.")
	fs.StringVar(&f.o.HealthProbeSocket, "health-probe-socket", "",
		"Unix socket path on which this process alone serves /healthz and /readyz, "+
			"for `egressip-agent probe` in an exec probe (the health port is shared with "+
			"the other agent during a surge rolling update). Empty turns it off; the "+
			"DaemonSet uses "+agent.DefaultHealthProbeSocket+".")
	fs.StringVar(&f.ownership, "address-ownership", string(bind.OwnershipAuto),
		"How the agent knows which addresses it added: auto (the address protocol attribute IFA_PROTO, kept by "+
			"Linux 5.18+, and the ownership record; works on every kernel), proto (IFA_PROTO alone: refuses to bind "+
			"where the kernel drops it) or record (the ownership record alone, IFA_PROTO neither written nor read).")
	fs.StringVar(&f.recordPath, "ownership-record", "",
		"Ownership record file, written before each bind and after each unbind (its directory must exist: in the "+
			"DaemonSet a hostPath volume). Default "+agent.DefaultRecordPath+", or none with --netns. "+
			"Agents in different network namespaces need different files.")
	fs.DurationVar(&f.o.AddressLifetime, "address-lifetime", agent.DefaultAddressLifetime,
		"Valid lifetime of the egress addresses (whole seconds): the agent renews it every --address-renew-interval, "+
			"and the kernel removes the addresses of an agent gone for that long; "+
			"at most --controller-dead-after, 0 for forever.")
	fs.DurationVar(&f.o.RenewInterval, "address-renew-interval", agent.DefaultRenewInterval,
		"How often the agent renews the lifetime of its egress addresses; at most half of --address-lifetime.")
	fs.StringVar(&f.o.NetNSPath, "netns", "",
		"Bind and announce in the network namespace at this path (e.g. /run/netns/node1) "+
			"instead of the agent's own. For tests and the local end-to-end setup.")
}

// bind registers the datapath flags.
func (d *datapathFlags) bind(fs *flag.FlagSet) {
	fs.BoolVar(&d.enabled, "datapath", false,
		"Also program the datapath that makes selected Pods' traffic leave with their Egress's IP (a VXLAN-GPE "+
			"tunnel device, an nftables table and policy routing of egressip's own). The chart turns it on.")
	fs.Var(&d.clusterCIDRs, "cluster-cidrs",
		"Comma-separated Pod CIDRs, never sent through an egress IP. Default: every Node's spec.podCIDRs.")
	fs.Var(&d.serviceCIDRs, "service-cidrs",
		"Comma-separated Service CIDRs, never sent through an egress IP. Default: the cluster's ServiceCIDR objects "+
			"(networking.k8s.io/v1, Kubernetes 1.33+). They matter where a ClusterIP is not DNATed before routing "+
			"(kube-proxy in IPVS mode), for Services without endpoints, and for external endpoints.")
	fs.Var(&d.excludeCIDRs, "exclude-cidrs",
		"Comma-separated further destinations never sent through an "+
			"egress IP (for example a corporate network reached without NAT).")
	fs.BoolVar(&d.hostStackCheck, "datapath-host-stack-check", true,
		"With --datapath, check whether the CNI steers Pod traffic past the host's IP stack with eBPF "+
			"(direct-action tc or tcx programs on Pods' host devices, netkit, Cilium or Calico eBPF devices) and report it"+
			" in the Node condition EgressDatapathSupported. "+
			"Turn it off where such programs let traffic reach the stack (Cilium with bpf.hostLegacyRouting=true).")
	fs.BoolVar(&d.poolRouting, "datapath-pool-routing", true,
		"With --datapath, send the traffic of an egress IP bound on a link other than the default-route link "+
			"through that link, to its pool's subnetInfo.gateway (policy routing tables 49900-49963, rules at "+
			"priorities 1110 and 1111, see docs/datapath.md); false leaves it to the main table.")
	fs.IntVar(&d.rejectQueue, "datapath-reject-queue", datapath.DefaultConfig().RejectQueue,
		"Netfilter queue number (1-65535) through which the first packet of a connection that failurePolicy Fail "+
			"rejects takes a round trip to the agent, "+
			"so that TCP connects fail at once with EHOSTUNREACH (IPv6 otherwise waits for the retransmitted SYN, about 1 s). "+
			"-1 turns it off. "+
			"Change it if other software on the Node uses that queue.")
	fs.DurationVar(&d.drainTimeout, "datapath-drain-timeout", datapath.DefaultDrainTimeout,
		"How long at most the open flows of a Pod that leaves an Egress (its labels or the Egress's selectors changed) "+
			"keep the path of that Egress when they do not end by themselves; then their conntrack entries are deleted. "+
			"A negative value turns draining off: such flows are cut when the Pod leaves.")
	fs.StringVar(&d.cniSocket, "cni-socket", "",
		"With --datapath, serve the egressip-cni plugin on this unix socket (the DaemonSet uses "+cniapi.DefaultSocket+
			"): a new Pod is classified before its sandbox's network setup returns, so its first packet already "+
			"leaves with its egress IP. Empty turns it off.")
	fs.StringVar(&d.cniConfDir, "cni-conf-dir", "",
		"With --cni-socket, chain egressip-cni into the first network configuration list of this directory "+
			"(/etc/cni/net.d), keep it there, and remove it when the agent stops (see --cni-keep-on-exit). "+
			"Empty: the plugin is chained by hand.")
	fs.BoolVar(&d.cniKeep, "cni-keep-on-exit", false,
		"Leave the plugin's entry and socket in place when the agent stops: Pods that start while no agent runs "+
			"then fail their sandbox setup and are retried by the kubelet, instead of starting unclassified. "+
			"Remove the entry by hand when uninstalling.")
	fs.DurationVar(&d.cniTimeout, "cni-timeout", cniapi.DefaultTimeout,
		"How long the plugin waits for the agent to classify a Pod before failing its sandbox setup (whole seconds).")
	fs.StringVar(&d.uplink, "datapath-uplink", "",
		"Interface toward the other Nodes, whose MTU sizes the tunnel. "+
			"Default: --interface, else the interface of the default route.")
}

// bindFenceFlags registers the self-fencing flags (docs/failover.md).
func (f *agentFlags) bindFenceFlags(fs *flag.FlagSet) {
	fs.DurationVar(&f.fence.Timeout, "fence-timeout", f.fence.Timeout,
		"Self-fencing: release every egress IP of this Node after this long without a controller poll, when the API "+
			"server does not answer either and the peer agents say this Node is isolated or the controller polls them "+
			"but not this Node (docs/failover.md). Must fit --controller-dead-after. 0 turns fencing off.")
	fs.DurationVar(&f.fence.ProbeInterval, "peer-probe-interval", f.fence.ProbeInterval,
		"How often the API server and the peer agents are probed while the controller's polls are late "+
			"(never in steady state).")
	fs.IntVar(&f.fence.Peers, "peers", f.fence.Peers,
		"Size of this agent's peer set (fewer in smaller clusters), chosen among the Nodes matching --peer-node-selector.")
	fs.DurationVar(&f.fence.ControllerPollInterval, "controller-poll-interval", f.fence.ControllerPollInterval,
		"The controller's --agent-poll-interval (checked against --fence-timeout at start; the chart sets both).")
	fs.DurationVar(&f.fence.ControllerDeadAfter, "controller-dead-after", f.fence.ControllerDeadAfter,
		"The controller's --agent-dead-after (--fence-timeout must end before it; the chart sets both).")
	fs.StringVar(&f.peerSelector, "peer-node-selector", "kubernetes.io/os=linux",
		"Label selector of the Nodes that run an agent (the DaemonSet's nodeSelector): the peer candidates.")
}

// options checks the flags and returns the agent's options, with the Node
// name, the ownership record and the agent CA's namespace defaulted from
// getenv, and o.Certificates lacking only its REST configuration. The
// error says which flag is wrong (the exit code 2); the datapath flags are
// checked later, by startDatapath, once the kernel has been probed.
func (f *agentFlags) options(getenv func(string) string) (agent.RunOptions, error) {
	o := f.o
	node, err := agent.ResolveNodeName(f.nodeName, getenv)
	if err != nil {
		return o, err
	}
	o.NodeName = node
	if o.ConflictInterval, err = zeroIsOff("--conflict-check-interval", f.conflictInterval); err != nil {
		return o, err
	}
	if o.TakeoverGuard, err = zeroIsOff("--takeover-guard", f.takeoverGuard); err != nil {
		return o, err
	}
	if o.Ownership, err = bind.ParseOwnership(f.ownership); err != nil {
		return o, fmt.Errorf("--address-ownership: %w", err)
	}
	o.RecordPath = f.recordPath
	if f.recordPath == "" && o.NetNSPath == "" {
		o.RecordPath = agent.DefaultRecordPath
	}
	if o.Ownership == bind.OwnershipRecord && o.RecordPath == "" {
		return o, errors.New("--address-ownership=record needs --ownership-record")
	}

	// One flag, --controller-dead-after, carries the controller's
	// --agent-dead-after for both checks: the address lifetime and fencing
	// must each end before the controller moves the Node's IPs.
	o.ControllerDeadAfter = f.fence.ControllerDeadAfter
	if err := agent.CheckLifetime(o.AddressLifetime, o.RenewInterval, o.ControllerDeadAfter); err != nil {
		return o, err
	}
	if err := f.fence.Validate(); err != nil {
		return o, fmt.Errorf("fencing timings: %w", err)
	}
	o.Fence = f.fence
	if o.PeerSelector, err = labels.Parse(f.peerSelector); err != nil {
		return o, fmt.Errorf("--peer-node-selector %q: %w", f.peerSelector, err)
	}
	caNS := cmp.Or(f.caNamespace, getenv(agent.PodNamespaceEnv))
	if f.reportTLS && caNS == "" {
		return o, fmt.Errorf("--report-tls needs --agent-ca-namespace or $%s "+
			"(in a DaemonSet: env %s from fieldRef metadata.namespace)",
			agent.PodNamespaceEnv, agent.PodNamespaceEnv)
	}
	if f.reportTLS && f.certLifetime < 10*time.Minute {
		return o, fmt.Errorf("--certificate-lifetime %s: "+
			"want at least 10m (the CertificateSigningRequest API's minimum)", f.certLifetime)
	}
	if f.reportTLS {
		o.Certificates = &agentcert.SourceConfig{Node: node, Namespace: caNS,
			RequestedLifetime: f.certLifetime, Registerer: metrics.Registry}
	}
	return o, nil
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

// zeroIsOff maps a duration flag where 0 turns a feature off to the
// agent.Config form, where 0 means the default and a negative value off.
// It fails for a negative value, naming the flag (name).
func zeroIsOff(name string, v time.Duration) (time.Duration, error) {
	switch {
	case v < 0:
		return 0, fmt.Errorf("%s %v is negative (0 turns it off)", name, v)
	case v == 0:
		return -1, nil
	}
	return v, nil
}
