// Package hoststack tells whether the Pods of a Node send their traffic
// through the host's IP stack, where egressip's datapath (nftables hooks,
// policy routing) acts on it, or whether the CNI steers it past that stack
// with eBPF (Cilium with BPF host routing, Calico's eBPF dataplane).
//
// The heuristic, and its limits (docs/datapath.md, "Supported CNIs"):
//
//   - For each local Pod IP, the device of the host's route to it is the
//     host side of the Pod's link (a veth or netkit peer, or a CNI device
//     such as cilium_host). Packets the Pod sends are received on that
//     device, so its ingress hook is where a CNI can redirect them
//     (bpf_redirect, bpf_redirect_neigh/peer) before the host stack sees
//     them.
//   - Evidence of a bypass on such a device: a tc BPF filter in
//     direct-action mode on its ingress (clsact or ingress qdisc), a BPF
//     program attached with tcx (Linux 6.6+) to its ingress, or a netkit
//     device (programmable only with BPF).
//   - Known devices of BPF dataplanes are evidence on their own: cilium_host
//     (Cilium), bpfin.cali / bpfnatin (Calico eBPF).
//
// Querying tcx needs the bpf() system call, which a container's default
// seccomp profile refuses without CAP_BPF or CAP_SYS_ADMIN (the agent has
// neither); the finding then lists tcx as unexamined.
//
// A direct-action program may also return TC_ACT_OK and let packets reach
// the stack (Cilium with bpf.hostLegacyRouting=true does so for traffic
// leaving the cluster), which this check cannot tell apart from a
// redirect: the finding is then a false positive and the operator turns
// the check off on the agent (--datapath-host-stack-check=false). BPF
// programs attached elsewhere (XDP, cgroup hooks, socket-level load
// balancing) are not examined.
package hoststack

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// MaxDevices bounds the devices one Detect examines (the first ones in
// Pod IP order), so a Node with hundreds of Pods costs at most a few dozen
// netlink requests per check.
const MaxDevices = 16

// KnownDevices are device names that only BPF dataplanes create, with the
// dataplane they reveal.
var KnownDevices = map[string]string{
	"cilium_host": "Cilium",
	"bpfin.cali":  "Calico eBPF",
	"bpfnatin":    "Calico eBPF",
}

// Finding is the result of one check.
type Finding struct {
	// Bypass is true when some evidence was found.
	Bypass bool
	// Evidence holds one sentence per piece of evidence, sorted; empty
	// when Bypass is false.
	Evidence []string
	// Devices is the number of Pod-side host devices examined.
	Devices int
	// Unexamined names checks that could not run, such as the tcx query
	// when the bpf() system call is not permitted (a container's default
	// seccomp profile allows it only with CAP_BPF or CAP_SYS_ADMIN).
	Unexamined []string
}

// Message is the evidence joined for a condition message ("" without).
func (f Finding) Message() string { return strings.Join(f.Evidence, "; ") }

// Detector examines one network namespace (the host's).
type Detector struct {
	ns netns.NsHandle
	nl *netlink.Handle
	// unexamined is set by examine when a check could not run.
	unexamined string
}

// NewDetector opens a detector on the namespace ns (netns.None(): the
// current one). It fails when the netlink socket cannot be opened.
func NewDetector(ns netns.NsHandle) (*Detector, error) {
	var (
		h   *netlink.Handle
		err error
	)
	if ns.IsOpen() {
		h, err = netlink.NewHandleAt(ns)
	} else {
		h, err = netlink.NewHandle()
	}
	if err != nil {
		return nil, fmt.Errorf("host stack check: open netlink: %w", err)
	}
	return &Detector{ns: ns, nl: h}, nil
}

// Close releases the netlink socket (not the namespace handle).
func (d *Detector) Close() error {
	d.nl.Close()
	return nil
}

// Detect examines the known BPF dataplane devices and the host devices of
// the routes to podIPs (local, non-host-network Pods; at most MaxDevices
// distinct devices). Pod IPs without a route are skipped. It returns an
// error, with what it found so far, when a device's filters or programs
// cannot be listed. It is not safe for concurrent use.
func (d *Detector) Detect(podIPs []netip.Addr) (Finding, error) {
	var f Finding
	var errs []error
	d.unexamined = ""
	for name, what := range KnownDevices {
		if _, err := d.nl.LinkByName(name); err == nil {
			f.Evidence = append(f.Evidence, fmt.Sprintf("device %s of the %s BPF dataplane exists", name, what))
		}
	}
	ips := slices.Clone(podIPs)
	slices.SortFunc(ips, netip.Addr.Compare)
	seen := map[int]bool{}
	for _, ip := range slices.Compact(ips) {
		if len(seen) >= MaxDevices {
			break
		}
		rs, err := d.nl.RouteGet(ip.AsSlice())
		if err != nil || len(rs) == 0 || rs[0].LinkIndex <= 0 || seen[rs[0].LinkIndex] {
			continue
		}
		seen[rs[0].LinkIndex] = true
		l, err := d.nl.LinkByIndex(rs[0].LinkIndex)
		if err != nil {
			errs = append(errs, fmt.Errorf("link of the route to %s: %w", ip, err))
			continue
		}
		f.Devices++
		ev, err := d.examine(l, ip)
		f.Evidence = append(f.Evidence, ev...)
		if err != nil {
			errs = append(errs, err)
		}
	}
	slices.Sort(f.Evidence)
	f.Evidence = slices.Compact(f.Evidence)
	f.Bypass = len(f.Evidence) > 0
	if d.unexamined != "" {
		f.Unexamined = []string{d.unexamined}
	}
	return f, errors.Join(errs...)
}

// examine returns the evidence found on the ingress of l, the device of
// the route to Pod ip.
func (d *Detector) examine(l netlink.Link, ip netip.Addr) ([]string, error) {
	name := l.Attrs().Name
	var ev []string
	if l.Type() == "netkit" {
		ev = append(ev, fmt.Sprintf("Pod %s is behind netkit device %s (BPF-programmed)", ip, name))
	}
	var errs []error
	// clsact ingress (ffff:fff2) and the classic ingress qdisc (ffff:0000).
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_INGRESS} {
		fs, err := d.nl.FilterList(l, parent)
		if err != nil {
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
				continue // no such qdisc
			}
			errs = append(errs, fmt.Errorf("list tc filters of %s: %w", name, err))
			continue
		}
		for _, flt := range fs {
			if b, ok := flt.(*netlink.BpfFilter); ok && b.DirectAction {
				ev = append(ev, fmt.Sprintf("tc BPF program %q in direct-action mode on the ingress of %s (route to Pod %s)", b.Name, name, ip))
			}
		}
	}
	n, err := d.tcxIngress(l.Attrs().Index)
	switch {
	case errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES):
		d.unexamined = "tcx programs (bpf() not permitted)"
	case err != nil:
		errs = append(errs, fmt.Errorf("query tcx programs of %s: %w", name, err))
	case n > 0:
		ev = append(ev, fmt.Sprintf("%d tcx BPF program(s) on the ingress of %s (route to Pod %s)", n, name, ip))
	}
	return ev, errors.Join(errs...)
}

// tcxIngress counts the BPF programs attached with tcx to the ingress of
// the device ifindex. BPF_PROG_QUERY takes an interface index of the
// caller's namespace, so the query runs on a thread switched into d.ns.
// Kernels without tcx (before 6.6) count as none.
func (d *Detector) tcxIngress(ifindex int) (int, error) {
	query := func() (int, error) {
		r, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			if errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EINVAL) {
				return 0, nil
			}
			return 0, err
		}
		return len(r.Programs), nil
	}
	if !d.ns.IsOpen() {
		return query()
	}
	type result struct {
		n   int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// The thread is not unlocked: it dies with the goroutine rather
		// than return to the pool inside another namespace.
		runtime.LockOSThread()
		if err := netns.Set(d.ns); err != nil {
			ch <- result{err: fmt.Errorf("enter the host namespace: %w", err)}
			return
		}
		n, err := query()
		ch <- result{n, err}
	}()
	r := <-ch
	return r.n, r.err
}
