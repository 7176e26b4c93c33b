package datapath_test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/egressip/egressip/internal/agent/datapath"
	"github.com/egressip/egressip/internal/destinations"
	dp "github.com/egressip/egressip/test/datapath"
)

// destFam is one family of TestDestinations: A's destinations (they hold
// the external server's own address), B's exclusion, and the addresses
// probed. The 203.0.113.10 lies in the harness's Pod range
// (203.0.113.0/26), which never takes an egress path, so the Node-IP probe
// is 203.0.113.100, in B's excluded 203.0.113.0/25 all the same.
type destFam struct {
	fam
	aDst, bExcl, aMoved netip.Prefix
	toB, toNode         netip.Addr
}

var destFamilies = []destFam{
	{fam: families[0], aDst: netip.MustParsePrefix("198.51.100.0/24"), bExcl: netip.MustParsePrefix("203.0.113.0/25"),
		aMoved: netip.MustParsePrefix("203.0.113.192/26"),
		toB:    netip.MustParseAddr("203.0.113.200"), toNode: netip.MustParseAddr("203.0.113.100")},
	{fam: families[1], aDst: netip.MustParsePrefix("2001:db8:ff::/64"), bExcl: netip.MustParsePrefix("2001:db8:71::/49"),
		aMoved: netip.MustParsePrefix("2001:db8:71:8000::/49"),
		toB:    netip.MustParseAddr("2001:db8:71:8000::200"), toNode: netip.MustParseAddr("2001:db8:71::10")},
}

// addExternal gives the external server's namespace the probed addresses
// and routes them there from the router.
func addExternal(t *testing.T, c *dp.Cluster, fm destFam) {
	t.Helper()
	fl, via, bits, nodad := "-4", dp.ExtV4.String(), "/32", []string(nil)
	if fm.v6 {
		fl, via, bits, nodad = "-6", dp.ExtV6.String(), "/128", []string{"nodad"}
	}
	for _, a := range []netip.Addr{fm.toB, fm.toNode} {
		add := append([]string{fl, "addr", "add", a.String() + bits, "dev", "eth0"}, nodad...)
		if out, err := c.Ext.IP(add...); err != nil {
			t.Fatalf("ext: ip %v: %v %s", add, err, out)
		}
		route := []string{fl, "route", "add", a.String() + bits, "via", via}
		if out, err := c.Rtr.IP(route...); err != nil {
			t.Fatalf("rtr: ip %v: %v %s", route, err, out)
		}
	}
}

// claims are A's and B's destinations as the Egresses would say them:
// B is older (created first), A names aDst, B excludes bExcl.
func destClaims(fm destFam, aDst netip.Prefix) []destinations.Claim {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	return []destinations.Claim{
		{Egress: "a", Created: t0.Add(time.Minute), Destinations: []netip.Prefix{aDst}, Some: true},
		{Egress: "b", Created: t0, Excluded: []netip.Prefix{fm.bExcl}},
	}
}

// destSplits gives each Node the Splits the agent would compute for the
// specs: P's Node divides P's destinations between A and B by
// destinations.Resolve; a Node holding both A and B divides P's tunnelled
// flows between them the same way.
func destSplits(p *dp.Pod, v6 bool, claims func() []destinations.Claim) func(n *dp.Node, specs []spec) []datapath.Split {
	return func(n *dp.Node, specs []spec) []datapath.Split {
		var held []destinations.Claim
		for _, c := range claims() {
			for _, s := range specs {
				if s.name == c.Egress && s.node == n && p.Node != n {
					held = append(held, c)
				}
			}
		}
		switch {
		case p.Node == n:
			return []datapath.Split{{IPs: []netip.Addr{p.IP(v6)}, Spans: destinations.Resolve(v6, claims())}}
		case len(held) > 1:
			return []datapath.Split{{IPs: []netip.Addr{p.IP(v6)}, Remote: true, Spans: destinations.Resolve(v6, held)}}
		}
		return nil
	}
}

// who returns the sources the external server saw for a TCP connection
// and a UDP datagram from p to dst (20 s at most each).
func who(t *testing.T, p *dp.Pod, dst netip.Addr) (tcp, udp netip.Addr) {
	t.Helper()
	ctx := ctxT(t, 20*time.Second)
	tcp, err := dp.TCPWho(ctx, &p.NS, dst)
	if err != nil {
		t.Errorf("TCP %s -> %s: %v", p.Name, dst, err)
	}
	udp, err = dp.UDPWho(ctx, &p.NS, dst)
	if err != nil {
		t.Errorf("UDP %s -> %s: %v", p.Name, dst, err)
	}
	return tcp, udp
}

// TestDestinations: Pod P on n1 is selected by Egress A (destinations
// 198.51.100.0/24 or 2001:db8:ff::/64, egress IP a) and by the older
// Egress B (every destination but 203.0.113.0/25 or 2001:db8:71::/49,
// egress IP b). P's flows to A's destinations leave from a, to B's from
// b, to what B excludes and A does not name from n1's Node IP; TCP and
// UDP, both families, with A and B held by different Nodes and by the
// same Node (which then divides P's tunnelled flows itself).
func TestDestinations(t *testing.T) {
	for _, fm := range destFamilies {
		for _, layout := range []string{"apart", "together"} {
			t.Run(fm.name+"/"+layout, func(t *testing.T) {
				f := newFixture(t)
				addExternal(t, f.c, fm)
				n1, n2, n3 := f.c.Nodes[0], f.c.Nodes[1], f.c.Nodes[2]
				bNode := n3
				if layout == "together" {
					bNode = n2
				}
				p := n1.Pods[0]
				f.splits = destSplits(p, fm.v6, func() []destinations.Claim { return destClaims(fm, fm.aDst) })
				f.apply([]spec{
					{name: "a", ip: fm.eip, node: n2, members: []*dp.Pod{p}},
					{name: "b", ip: fm.eip2, node: bNode, members: []*dp.Pod{p}},
				})
				for _, tc := range []struct {
					dst  netip.Addr
					want netip.Addr
				}{
					{fm.ext, fm.eip},
					{fm.toB, fm.eip2},
					{fm.toNode, n1.NodeIP(fm.v6)},
				} {
					tcp, udp := who(t, p, tc.dst)
					if tcp != tc.want || udp != tc.want {
						t.Errorf("P -> %s: server saw TCP %v, UDP %v; want %s", tc.dst, tcp, udp, tc.want)
					}
				}
			})
		}
	}
}

// TestDestinationsChange: while a TCP connection from P to the external
// server (one of A's destinations) is open, A's destinations change to
// a part of what B excludes. The open connection keeps going (its
// source stays a: a new source would break it); the first new
// connection after the Apply follows the new rule (to the server from b,
// to the moved range from a), and the time that took is logged.
func TestDestinationsChange(t *testing.T) {
	for _, fm := range destFamilies {
		t.Run(fm.name, func(t *testing.T) {
			f := newFixture(t)
			addExternal(t, f.c, fm)
			n1, n2, n3 := f.c.Nodes[0], f.c.Nodes[1], f.c.Nodes[2]
			p := n1.Pods[0]
			aDst := fm.aDst
			f.splits = destSplits(p, fm.v6, func() []destinations.Claim { return destClaims(fm, aDst) })
			specs := []spec{
				{name: "a", ip: fm.eip, node: n2, members: []*dp.Pod{p}},
				{name: "b", ip: fm.eip2, node: n3, members: []*dp.Pod{p}},
			}
			f.apply(specs)
			ctx := ctxT(t, 30*time.Second)
			before := f.c.Server.Sources()[fm.eip]
			c, err := dp.Dial(ctx, &p.NS, "tcp", fm.ext, dp.ServerPort)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = c.Close() }()
			if dl, ok := ctx.Deadline(); ok {
				_ = c.SetDeadline(dl)
			}
			r := bufio.NewReader(c)
			echo := func(msg string) error {
				if _, err := io.WriteString(c, msg+"\n"); err != nil {
					return err
				}
				line, err := r.ReadString('\n')
				if err != nil {
					return err
				}
				if strings.TrimSpace(line) != msg {
					return fmt.Errorf("echo %q, want %q", line, msg)
				}
				return nil
			}
			if _, err := io.WriteString(c, "ECHO\n"); err != nil {
				t.Fatal(err)
			}
			if err := echo("before"); err != nil {
				t.Fatalf("echo before the change: %v", err)
			}
			if got := f.c.Server.Sources()[fm.eip]; got != before+1 {
				t.Fatalf("the open connection did not come from a (%s): %d connections from it, want %d", fm.eip, got, before+1)
			}

			aDst = fm.aMoved
			start := time.Now()
			f.apply(specs)
			applied := time.Since(start)
			tcp, udp := who(t, p, fm.ext)
			took := time.Since(start)
			if tcp != fm.eip2 || udp != fm.eip2 {
				t.Errorf("first new flows to %s after the change came from TCP %v, UDP %v; want b (%s)", fm.ext, tcp, udp, fm.eip2)
			}
			if tcp, udp := who(t, p, fm.toB); tcp != fm.eip || udp != fm.eip {
				t.Errorf("new flows to %s (now A's) came from TCP %v, UDP %v; want a (%s)", fm.toB, tcp, udp, fm.eip)
			}
			t.Logf("Apply of the change on every Node: %v; Apply start to the first new TCP and UDP answers: %v", applied, took)
			if err := echo("after"); err != nil {
				t.Errorf("the connection opened before the change broke: %v", err)
			}
		})
	}
}

// TestDestinationsFailurePolicy: A has failurePolicy Fail and no Node.
// Only A's destinations are rejected (TCP connect fails with
// EHOSTUNREACH); B's traffic flows from b, and what neither carries from
// the Node IP.
func TestDestinationsFailurePolicy(t *testing.T) {
	for _, fm := range destFamilies {
		t.Run(fm.name, func(t *testing.T) {
			f := newFixture(t)
			addExternal(t, f.c, fm)
			n1, n3 := f.c.Nodes[0], f.c.Nodes[2]
			p := n1.Pods[0]
			f.splits = destSplits(p, fm.v6, func() []destinations.Claim { return destClaims(fm, fm.aDst) })
			f.apply([]spec{
				{name: "a", policy: datapath.FailurePolicyFail, v6: fm.v6, members: []*dp.Pod{p}},
				{name: "b", ip: fm.eip2, node: n3, members: []*dp.Pod{p}},
			})
			ctx := ctxT(t, 20*time.Second)
			if got, err := dp.TCPWho(ctx, &p.NS, fm.ext); !errors.Is(err, unix.EHOSTUNREACH) {
				t.Errorf("P -> %s (A's, Fail without a Node): saw %v, error %v; want EHOSTUNREACH", fm.ext, got, err)
			}
			for _, tc := range []struct {
				dst, want netip.Addr
			}{{fm.toB, fm.eip2}, {fm.toNode, n1.NodeIP(fm.v6)}} {
				if tcp, udp := who(t, p, tc.dst); tcp != tc.want || udp != tc.want {
					t.Errorf("P -> %s: server saw TCP %v, UDP %v; want %s", tc.dst, tcp, udp, tc.want)
				}
			}
			counts, err := f.dps[n1].Counters(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if counts["a"] == 0 || counts["b"] != 0 {
				t.Errorf("rejected packets: a %d, b %d; want a > 0, b 0", counts["a"], counts["b"])
			}
		})
	}
}
