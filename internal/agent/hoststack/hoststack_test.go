package hoststack

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/egressip/egressip/internal/testutil/netnstest"
)

// passProgram loads a tc classifier that returns TC_ACT_OK (0): it lets
// every packet through, which is all the detection needs to see.
func passProgram(t *testing.T) *ebpf.Program {
	t.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         "egx_test_ok",
		Type:         ebpf.SchedCLS,
		License:      "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 0), asm.Return()},
	})
	if err != nil {
		t.Fatalf("load a BPF program: %v", err)
	}
	t.Cleanup(func() { _ = prog.Close() })
	return prog
}

func detect(t *testing.T, d *Detector, ips ...netip.Addr) Finding {
	t.Helper()
	f, err := d.Detect(ips)
	if err != nil {
		t.Fatalf("Detect: %v", err)
	}
	t.Logf("finding: bypass=%v devices=%d evidence=%q", f.Bypass, f.Devices, f.Message())
	return f
}

// TestDetect: a Pod behind a veth is seen as crossing the host stack until
// its host-side device gets a direct-action tc BPF program or a tcx
// program on ingress, or a known BPF dataplane device appears; a
// classifier-mode filter and a Pod IP without route are no evidence.
func TestDetect(t *testing.T) {
	netnstest.RequireRoot(t)
	p := netnstest.NewPair(t) // Node = the host, Peer = the Pod
	pod4, pod6 := netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("fd00:10:244:1::2")
	p.Peer.MustIP(t, "addr", "add", pod4.String()+"/32", "dev", p.PeerIf)
	p.Node.MustIP(t, "route", "add", pod4.String()+"/32", "dev", p.NodeIf)
	p.Node.MustIP(t, "-6", "route", "add", pod6.String()+"/128", "dev", p.NodeIf)
	h := p.Node.Netlink(t)
	l, err := h.LinkByName(p.NodeIf)
	if err != nil {
		t.Fatal(err)
	}
	d, err := NewDetector(p.Node.Handle)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })

	if f := detect(t, d, pod4, pod6); f.Bypass || f.Devices != 1 {
		t.Fatalf("plain veth: bypass=%v over %d devices, want none over 1 (both IPs route to %s)", f.Bypass, f.Devices, p.NodeIf)
	}
	// 10.99.0.1 has no route (no default route in the namespace): skipped.
	if f := detect(t, d, netip.MustParseAddr("10.99.0.1")); f.Bypass || f.Devices != 0 {
		t.Fatalf("unrouted IP: bypass=%v over %d devices, want none over 0", f.Bypass, f.Devices)
	}

	prog := passProgram(t)
	if err := h.QdiscAdd(&netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}); err != nil {
		t.Fatalf("add clsact: %v", err)
	}
	filter := func(da bool) *netlink.BpfFilter {
		return &netlink.BpfFilter{
			FilterAttrs: netlink.FilterAttrs{LinkIndex: l.Attrs().Index, Parent: netlink.HANDLE_MIN_INGRESS,
				Handle: netlink.MakeHandle(0, 1), Protocol: unix.ETH_P_ALL, Priority: 1},
			Fd: prog.FD(), Name: "egx_test_ok", DirectAction: da,
		}
	}
	// Classifier mode: the program only picks a class; no redirect.
	if err := h.FilterAdd(filter(false)); err != nil {
		t.Fatalf("add classifier-mode filter: %v", err)
	}
	if f := detect(t, d, pod4); f.Bypass {
		t.Fatalf("classifier-mode filter taken as a bypass: %q", f.Message())
	}
	if err := h.FilterDel(filter(false)); err != nil {
		t.Fatal(err)
	}
	if err := h.FilterAdd(filter(true)); err != nil {
		t.Fatalf("add direct-action filter: %v", err)
	}
	f := detect(t, d, pod6)
	if !f.Bypass || !strings.Contains(f.Message(), "direct-action") || !strings.Contains(f.Message(), p.NodeIf) || !strings.Contains(f.Message(), pod6.String()) {
		t.Fatalf("direct-action filter: bypass=%v evidence %q, want the device %s and Pod %s named", f.Bypass, f.Message(), p.NodeIf, pod6)
	}
	if err := h.QdiscDel(&netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}); err != nil {
		t.Fatalf("delete clsact: %v", err)
	}
	if f := detect(t, d, pod4); f.Bypass {
		t.Fatalf("finding did not clear after the filter went: %q", f.Message())
	}

	// tcx (Linux 6.6+): attached by a link, invisible to tc filter dumps.
	var tcx link.Link
	if err := p.Node.Do(func() (err error) {
		tcx, err = link.AttachTCX(link.TCXOptions{Interface: l.Attrs().Index, Program: prog, Attach: ebpf.AttachTCXIngress})
		return err
	}); err != nil {
		t.Fatalf("attach tcx: %v", err)
	}
	f = detect(t, d, pod4)
	if !f.Bypass || !strings.Contains(f.Message(), "tcx") {
		t.Errorf("tcx program: bypass=%v evidence %q", f.Bypass, f.Message())
	}
	if err := tcx.Close(); err != nil {
		t.Fatal(err)
	}
	if f := detect(t, d, pod4); f.Bypass {
		t.Fatalf("finding did not clear after the tcx link closed: %q", f.Message())
	}

	// A known BPF dataplane device, whatever the Pods' devices carry.
	p.Node.MustIP(t, "link", "add", "cilium_host", "type", "veth", "peer", "name", "cilium_net")
	if f := detect(t, d); !f.Bypass || !strings.Contains(f.Message(), "cilium_host") {
		t.Errorf("cilium_host present: bypass=%v evidence %q", f.Bypass, f.Message())
	}
}
