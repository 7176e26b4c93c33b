package datapath_test

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/egressip/egressip/internal/agent/datapath"
	dp "github.com/egressip/egressip/test/datapath"
)

// heldPort is the port of heldServer.
const heldPort = 8081

// heldServer answers one request per TCP connection or UDP datagram with
// the source address it saw, but only once release is closed: the reply
// of a request made before a change arrives after it. got receives each
// request's source when it has been read.
type heldServer struct {
	tcp     net.Listener
	udp     net.PacketConn
	got     chan netip.Addr
	release chan struct{}
}

func startHeldServer(t *testing.T, ns *dp.NS) *heldServer {
	t.Helper()
	s := &heldServer{got: make(chan netip.Addr, 16), release: make(chan struct{})}
	if err := ns.Do(func() (err error) {
		if s.tcp, err = net.Listen("tcp", fmt.Sprintf("[::]:%d", heldPort)); err != nil {
			return err
		}
		s.udp, err = net.ListenPacket("udp", fmt.Sprintf("[::]:%d", heldPort))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.tcp.Close(); _ = s.udp.Close() })
	go func() {
		for {
			c, err := s.tcp.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				if _, err := bufio.NewReader(c).ReadString('\n'); err != nil {
					return
				}
				src := netip.MustParseAddrPort(c.RemoteAddr().String()).Addr().Unmap()
				s.got <- src
				<-s.release
				_, _ = fmt.Fprintf(c, "%s\n", src)
			}()
		}
	}()
	go func() {
		buf := make([]byte, 100)
		for {
			_, from, err := s.udp.ReadFrom(buf)
			if err != nil {
				return
			}
			src := netip.MustParseAddrPort(from.String()).Addr().Unmap()
			s.got <- src
			go func() {
				<-s.release
				_, _ = s.udp.WriteTo([]byte(src.String()+"\n"), from)
			}()
		}
	}()
	return s
}

// TestMoveBetweenEgresses (issue 23, fault 3, second half): Pod app on n1
// waits for a reply through Egress e1 (held by n2); e1 is edited so that
// app now uses e2 (held by n3); the reply arrives after the switch. The
// old path keeps serving the flow it carries (a drain: n1 keeps e1's mark
// on the entry, its rule and route to e1's IP; n2 keeps its SNAT entry and
// the return route to app, which its member slice no longer lists), so
// the socket gets its reply; app's new flows leave with e2's IP at once.
// The drain is bounded: for TCP it ends once the connection has closed
// (e1's ID, rule and route leave n1, the return route leaves n2); for UDP
// (whose entry outlives the exchange) by the drain timeout, 3 s here,
// after which the entries are gone too.
func TestMoveBetweenEgresses(t *testing.T) {
	for _, fm := range families {
		for _, proto := range []string{"tcp", "udp"} {
			t.Run(fm.name+"/"+proto, func(t *testing.T) {
				cfg := datapath.Config{}
				if proto == "udp" {
					cfg.DrainTimeout = 3 * time.Second
				}
				f := newFixtureWith(t, cfg)
				n1, n2, n3 := f.c.Nodes[0], f.c.Nodes[1], f.c.Nodes[2]
				app := n1.Pods[0]
				before := []spec{
					{name: "e1", ip: fm.eip, node: n2, members: []*dp.Pod{app}},
					{name: "e2", ip: fm.eip2, node: n3},
				}
				after := []spec{
					{name: "e1", ip: fm.eip, node: n2},
					{name: "e2", ip: fm.eip2, node: n3, members: []*dp.Pod{app}},
				}
				f.apply(before)
				srv := startHeldServer(t, f.c.Ext)
				ctx := ctxT(t, 60*time.Second)

				c, err := dp.Dial(ctx, &app.NS, proto, fm.ext, heldPort)
				if err != nil {
					t.Fatal(err)
				}
				defer func() { _ = c.Close() }()
				if _, err := fmt.Fprintf(c, "REQ\n"); err != nil {
					t.Fatal(err)
				}
				select {
				case src := <-srv.got:
					if src != fm.eip {
						t.Fatalf("the request reached the server from %s, want e1's %s", src, fm.eip)
					}
				case <-ctx.Done():
					t.Fatal("the request never reached the server")
				}
				id1 := f.dps[n1].IDs()["e1"]

				f.apply(after)
				if got, err := dp.TCPWho(ctx, &app.NS, fm.ext); err != nil || got != fm.eip2 {
					t.Errorf("a new connection after the switch left with %v (%v), want e2's %s", got, err, fm.eip2)
				}
				close(srv.release)
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				line, err := bufio.NewReader(c).ReadString('\n')
				switch {
				case err != nil:
					t.Errorf("the reply sent after the switch: %v (the socket hung: want the reply, or at once an error)", err)
				case strings.TrimSpace(line) != fm.eip.String():
					t.Errorf("reply %q, want the server to have seen %s", line, fm.eip)
				}
				if f.dps[n1].Draining() == 0 || f.dps[n2].Draining() == 0 {
					t.Errorf("drains in progress: n1 %d, n2 %d; want both", f.dps[n1].Draining(), f.dps[n2].Draining())
				}

				// The flow ends (TCP) or its drain times out (UDP): the
				// Nodes let go of the old path once re-applied.
				_ = c.Close()
				wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				tick := time.NewTicker(100 * time.Millisecond)
				defer tick.Stop()
				for f.dps[n1].Draining()+f.dps[n2].Draining() > 0 {
					select {
					case <-wctx.Done():
						t.Fatalf("drains still in progress: n1 %d, n2 %d", f.dps[n1].Draining(), f.dps[n2].Draining())
					case <-tick.C:
					}
					f.applyNode(n1, after)
					f.applyNode(n2, after)
				}
				if id, ok := f.dps[n1].IDs()["e1"]; ok {
					t.Errorf("n1 still gives e1 ID %d after the drain (want none: e1 has no member there)", id)
				}
				fam := "-4"
				if fm.v6 {
					fam = "-6"
				}
				if out, _ := n1.IP(fam, "rule"); strings.Contains(out, fmt.Sprintf("lookup %d", 50000+int(id1))) {
					t.Errorf("n1 still routes e1's mark after the drain:\n%s", out)
				}
				if out, _ := n2.IP(fam, "route", "show", "table", "49999"); strings.Contains(out, app.IP(fm.v6).String()) {
					t.Errorf("n2 still has a return route to app after the drain:\n%s", out)
				}
				if n := entriesFrom(t, n1, app.IP(fm.v6), uint32(id1)); n != 0 && proto == "udp" {
					t.Errorf("n1 still holds %d entries of app under e1 after the drain timed out", n)
				}
				if got, err := dp.UDPWho(ctx, &app.NS, fm.ext); err != nil || got != fm.eip2 {
					t.Errorf("after the drain app leaves with %v (%v), want %s", got, err, fm.eip2)
				}
			})
		}
	}
}
