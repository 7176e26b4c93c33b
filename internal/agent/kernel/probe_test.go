package kernel

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/egressip/egressip/internal/testutil/netnstest"
)

// snapshot is what the probes could leave behind in a namespace: links,
// addresses, routes of every table, policy rules and the nftables ruleset.
func snapshot(t *testing.T, ns *netnstest.NS) string {
	t.Helper()
	var b strings.Builder
	for _, args := range [][]string{
		{"-o", "link"}, {"-o", "addr"}, {"-4", "route", "show", "table", "all"}, {"-6", "route", "show", "table", "all"},
		{"-4", "rule"}, {"-6", "rule"},
	} {
		b.WriteString(ns.MustIP(t, args...))
	}
	c, err := nftables.New(nftables.WithNetNSFd(int(ns.Handle)))
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTables()
	if err != nil {
		t.Fatalf("list nftables tables: %v", err)
	}
	for _, tb := range tables {
		fmt.Fprintf(&b, "nft table %d %s\n", tb.Family, tb.Name)
	}
	return b.String()
}

// TestKernelProbeRealKernel: on this kernel every probe of the datapath
// and of address ownership finds its feature, in a namespace of its own,
// and leaves the namespace as it found it (links, addresses, routes,
// rules, ruleset, sysctls). Probing twice works (no leftover blocks it).
func TestKernelProbeRealKernel(t *testing.T) {
	netnstest.RequireRoot(t)
	ns := netnstest.NewNS(t, "kprobe")
	ns.Sysctl(t, "net/ipv4/conf/default/rp_filter", "1")
	before := snapshot(t, ns)
	p := NewProber(ns.Handle, Options{})
	for range 2 {
		res := ProbeAll(p, FeaturesOf(PartDatapath, PartOwnership))
		for f, err := range res {
			if err != nil {
				t.Errorf("%s: %v", f, err)
			}
		}
		d := Decide(Release(), res)
		if len(d.Missing) != 0 || d.Refused(PartDatapath) || d.Degraded(PartOwnership) {
			t.Errorf("decision on this kernel: %+v", d)
		}
	}
	if after := snapshot(t, ns); after != before {
		t.Errorf("the probes left something behind:\nbefore:\n%s\nafter:\n%s", before, after)
	}
	if v := ns.ReadSysctl(t, "net/ipv4/conf/default/rp_filter"); v != "1" {
		t.Errorf("rp_filter default changed to %q", v)
	}
}

// TestKernelProbeStaleProbeLink: a probe link left by a crashed probe is
// replaced, not a reason to report the feature missing.
func TestKernelProbeStaleProbeLink(t *testing.T) {
	netnstest.RequireRoot(t)
	ns := netnstest.NewNS(t, "kstale")
	ns.MustIP(t, "link", "add", "egxprobe", "type", "vxlan", "id", "7", "dstport", "4789")
	ns.MustIP(t, "link", "add", "egxprobe0", "type", "veth", "peer", "name", "egxprobe1")
	p := NewProber(ns.Handle, Options{LinkName: "egxprobe"})
	for _, f := range []Feature{VXLANGPE, IFAProto} {
		if err := p.Probe(f); err != nil {
			t.Errorf("%s with a stale probe link: %v", f, err)
		}
	}
	if out := ns.MustIP(t, "-o", "link"); strings.Contains(out, "egxprobe") {
		t.Errorf("probe links left:\n%s", out)
	}
}

// absentKind probes the tunnel device with a link kind this kernel truly
// lacks (flow-based geneve on this machine), so the real probe meets a
// real refusal.
type absentKind struct {
	*NetNSProber
	kind string
}

func (a absentKind) Probe(f Feature) error {
	if f == VXLANGPE {
		return a.probeLinkKind(a.kind, func(data *nl.RtAttr) {
			if a.kind == "geneve" {
				data.AddRtAttr(nl.IFLA_GENEVE_COLLECT_METADATA, nil)
			}
		})
	}
	return a.NetNSProber.Probe(f)
}

// TestKernelProbeAbsentLinkKind: the link probe run for a kind this kernel
// does not have reports the kernel's error, the datapath is refused and
// the condition message names the feature, the kernel release and what
// the kernel said.
func TestKernelProbeAbsentLinkKind(t *testing.T) {
	netnstest.RequireRoot(t)
	ns := netnstest.NewNS(t, "kabsent")
	// Link kinds this machine lacks (docs: no geneve, gre, ipip, vrf here);
	// the first one the kernel refuses stands in for VXLAN-GPE.
	p := absentKind{NetNSProber: NewProber(ns.Handle, Options{})}
	for _, k := range []string{"geneve", "gretap", "ipip", "vrf", "bareudp"} {
		if err := p.probeLinkKind(k, nil); err != nil {
			p.kind = k
			t.Logf("kind %s refused: %v", k, err)
			break
		}
	}
	if p.kind == "" {
		t.Fatal("this kernel has every candidate link kind: no absent one to probe")
	}
	d := Decide(Release(), ProbeAll(p, FeaturesOf(PartDatapath, PartOwnership)))
	if !d.Refused(PartDatapath) || d.Degraded(PartOwnership) || len(d.Missing) != 1 || d.Missing[0].Feature != VXLANGPE {
		t.Fatalf("decision: %+v", d)
	}
	msg := d.ConditionMessage()
	for _, want := range []string{"kernel " + Release(), "datapath not started", "vxlan-gpe (create a " + p.kind + " link: "} {
		if !strings.Contains(msg, want) {
			t.Errorf("condition message %q lacks %q", msg, want)
		}
	}
	if out := ns.MustIP(t, "-o", "link"); strings.Contains(out, "egxp") {
		t.Errorf("probe link left:\n%s", out)
	}
}

// TestKernelProbeAbsentSysctl: the sysctl probe of a key this kernel does
// not have fails with the key's name and ENOENT.
func TestKernelProbeAbsentSysctl(t *testing.T) {
	netnstest.RequireRoot(t)
	ns := netnstest.NewNS(t, "ksysctl")
	err := NewProber(ns.Handle, Options{}).probeSysctl("net/ipv4/conf/default/egressip_no_such_key")
	if !errors.Is(err, unix.ENOENT) || !strings.Contains(err.Error(), "net.ipv4.conf.default.egressip_no_such_key") {
		t.Errorf("err = %v", err)
	}
}

// TestKernelProbeNftRefusal: an nftables rule the kernel refuses (an
// xtables target that does not exist, through nft_compat) is reported as
// missing with the kernel's error, and the batch leaves no table behind.
func TestKernelProbeNftRefusal(t *testing.T) {
	netnstest.RequireRoot(t)
	ns := netnstest.NewNS(t, "knft")
	p := NewProber(ns.Handle, Options{})
	err := p.probeNft(func(c *nftables.Conn, tb *nftables.Table) {
		ch := c.AddChain(&nftables.Chain{Name: "probe", Table: tb})
		info := make(xt.Unknown, 8)
		c.AddRule(&nftables.Rule{Table: tb, Chain: ch, Exprs: []expr.Any{&expr.Target{Name: "EGXNOSUCH", Rev: 0, Info: &info}}})
	})
	if err == nil || !strings.Contains(err.Error(), "nftables rejected it") {
		t.Errorf("err = %v, want the kernel's refusal", err)
	}
	d := Decide("6.18.0", map[Feature]error{NftTCPMSS: err})
	if !d.Refused(PartDatapath) || !strings.Contains(d.ConditionMessage(), "nft-tcpmss (nftables rejected it") {
		t.Errorf("decision %+v, message %q", d, d.ConditionMessage())
	}
	if s := snapshot(t, ns); strings.Contains(s, "nft table") {
		t.Errorf("table left:\n%s", s)
	}
}

// TestKernelProbeConcurrent: two agents probing one namespace at once (a
// surge rolling update) both find every feature.
func TestKernelProbeConcurrent(t *testing.T) {
	netnstest.RequireRoot(t)
	ns := netnstest.NewNS(t, "kconc")
	errs := make(chan string, 2)
	for range 2 {
		go func() {
			var bad []string
			p := NewProber(ns.Handle, Options{})
			for range 5 {
				for f, err := range ProbeAll(p, FeaturesOf(PartDatapath, PartOwnership)) {
					if err != nil {
						bad = append(bad, fmt.Sprintf("%s: %v", f, err))
					}
				}
			}
			errs <- strings.Join(bad, "; ")
		}()
	}
	for range 2 {
		if e := <-errs; e != "" {
			t.Errorf("concurrent probe: %s", e)
		}
	}
	if out := ns.MustIP(t, "-o", "link"); strings.Contains(out, "egxp") {
		t.Errorf("probe links left:\n%s", out)
	}
}

// TestKernelProbeBesideTheTunnel: on a Node where the datapath's
// flow-based VXLAN-GPE device already exists (an agent restart), the
// VXLAN-GPE probe still finds the feature (the kernel allows one such
// device per port) and leaves the device alone.
func TestKernelProbeBesideTheTunnel(t *testing.T) {
	netnstest.RequireRoot(t)
	ns := netnstest.NewNS(t, "ktun")
	ns.MustIP(t, "link", "add", "egx", "type", "vxlan", "external", "gpe", "nolearning", "dstport", "4790")
	ns.MustIP(t, "link", "set", "egx", "up")
	before := ns.MustIP(t, "-d", "link", "show", "egx")
	for range 3 {
		if err := NewProber(ns.Handle, Options{}).Probe(VXLANGPE); err != nil {
			t.Errorf("probe beside egx: %v", err)
		}
	}
	if after := ns.MustIP(t, "-d", "link", "show", "egx"); after != before {
		t.Errorf("egx changed:\n%s\n%s", before, after)
	}
}
