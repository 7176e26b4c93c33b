package agentcert_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/egressip/egressip/internal/agentcert"
	"github.com/egressip/egressip/internal/report"
)

// countingListener counts the bytes read and written on its connections
// (TCP payload, TLS records included).
type countingListener struct {
	net.Listener
	in, out *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{Conn: c, in: l.in, out: l.out}, nil
}

type countingConn struct {
	net.Conn
	in, out *atomic.Int64
}

func (c countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.in.Add(int64(n))
	return n, err
}

func (c countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.out.Add(int64(n))
	return n, err
}

// cpuTime is the CPU time (user and system) this process has used.
func cpuTime(b *testing.B) time.Duration {
	b.Helper()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchReport is a Node's report of the size the controller polls in a
// busy cluster: 5 bound IPs, 4 NICs, 2 MACs.
func benchReport() report.Report {
	r := report.Report{Node: "node-a", Instance: "0f6c5a1e-3b7d-4c11-9a55-d2f1c0a9b8e7",
		NICs: []string{"eth0", "eth1", "eth2", "eth3"}, MACs: []string{"02:00:00:00:00:01", "02:00:00:00:00:02"}}
	for i := range 5 {
		r.Bound = append(r.Bound, report.BoundIP{IP: netip.AddrFrom4([4]byte{192, 0, 2, byte(100 + i)}), Interface: "eth0", Announced: true})
	}
	return r
}

// benchPoller starts the agent's side (mutual TLS, the report handler
// authorized for the controller only) on 127.0.0.1 and returns the
// controller's client, as egressip-controller builds it, and the byte
// counters of the agent's side.
func benchPoller(b *testing.B) (*report.Client, *atomic.Int64, *atomic.Int64) {
	b.Helper()
	now := time.Now()
	ca, _, _, err := agentcert.NewCA(now)
	if err != nil {
		b.Fatal(err)
	}
	roots := func() *x509.CertPool { return ca.Pool() }
	cert := issued(b, ca, "node-a", now)
	rep := benchReport()
	h := agentcert.Authorize(report.PollHandler(func(report.Poll) report.Report { return rep }), agentcert.OnlyController)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	in, out := &atomic.Int64{}, &atomic.Int64{}
	cfg := agentcert.ServerConfig(roots, func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &cert, nil })
	srv := &http.Server{Handler: h, ReadHeaderTimeout: time.Second}
	go func() { _ = srv.Serve(tls.NewListener(countingListener{Listener: ln, in: in, out: out}, cfg)) }()
	b.Cleanup(func() { _ = srv.Close() })
	ctrlCerts := &agentcert.ClientCertificates{CA: ca, Lifetime: time.Hour}
	c := report.NewClient(ln.Addr().(*net.TCPAddr).Port, 2*time.Second)
	c.TLS = func(node string) *tls.Config { return agentcert.ClientConfig(roots, ctrlCerts.Get, node) }
	return c, in, out
}

// BenchmarkPollKeepAlive is one steady-state poll of one agent, as the
// controller makes DefaultPollInterval apart: HTTPS over mutual TLS on
// the kept-alive connection (no handshake), the report decoded. The time
// is both ends on one machine (the controller's client and the agent's
// server in this process); cpu-ns/op is the process's CPU time per poll,
// which a loaded machine does not inflate as it does the wall time;
// bytes/op is TCP payload both ways.
func BenchmarkPollKeepAlive(b *testing.B) {
	c, in, out := benchPoller(b)
	ctx := context.Background()
	host := netip.MustParseAddr("127.0.0.1")
	if _, err := c.Poll(ctx, "node-a", host, report.Poll{}); err != nil { // the handshake, outside the loop
		b.Fatal(err)
	}
	in.Store(0)
	out.Store(0)
	b.ReportAllocs()
	cpu := cpuTime(b)
	for b.Loop() {
		if _, err := c.Poll(ctx, "node-a", host, report.Poll{}); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpuTime(b)-cpu)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(in.Load()+out.Load())/float64(b.N), "bytes/op")
}

// BenchmarkPollHandshake is one poll on a new connection: the full mutual
// TLS handshake (ECDSA P-256 both ways, as the agent CA issues), which a
// poll pays only after a connection broke or idled out (30 s).
func BenchmarkPollHandshake(b *testing.B) {
	c, in, out := benchPoller(b)
	ctx := context.Background()
	host := netip.MustParseAddr("127.0.0.1")
	b.ReportAllocs()
	cpu := cpuTime(b)
	for b.Loop() {
		if _, err := c.Poll(ctx, "node-a", host, report.Poll{}); err != nil {
			b.Fatal(err)
		}
		c.Forget(nil)
	}
	b.ReportMetric(float64(cpuTime(b)-cpu)/float64(b.N), "cpu-ns/op")
	b.ReportMetric(float64(in.Load()+out.Load())/float64(b.N), "bytes/op")
}
