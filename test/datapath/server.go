package datapath

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// Server is a TCP and UDP server inside a namespace (listening on
// [::]:ServerPort, IPv4 peers as mapped addresses) that records the source
// address of every connection and datagram, and the arrival times of UDP
// probe streams.
//
// TCP protocol, one command line per connection:
//
//	WHO            -> the peer address, newline
//	ECHO           -> echoes every line until the peer closes
//	WHOECHO        -> the peer address, newline, then as ECHO
//	SINK <n>       -> reads n bytes, replies "<n>\n"
//	SOURCE <n>     -> writes n bytes, then closes
//
// UDP: every datagram is answered with the peer address; a datagram
// "probe <stream> <seq>" also records its arrival time under stream.
type Server struct {
	tcp net.Listener
	udp net.PacketConn

	mu      sync.Mutex
	sources map[netip.Addr]int
	probes  map[string][]time.Time
	seqs    map[string][]int
	wg      sync.WaitGroup
	// pin is the CPU each TCP connection is handled on (its goroutine
	// on a thread of its own, pinned: pinThread), -1 for any; set by
	// Cluster.SplitCPUs.
	pin atomic.Int32
}

// StartServer starts a Server in ns.
func StartServer(ns *NS) (*Server, error) {
	s := &Server{sources: map[netip.Addr]int{}, probes: map[string][]time.Time{}, seqs: map[string][]int{}}
	s.pin.Store(-1)
	if err := ns.Do(func() (err error) {
		if s.tcp, err = net.Listen("tcp", fmt.Sprintf("[::]:%d", ServerPort)); err != nil {
			return err
		}
		s.udp, err = net.ListenPacket("udp", fmt.Sprintf("[::]:%d", ServerPort))
		return err
	}); err != nil {
		return nil, fmt.Errorf("start server in %s: %w", ns.Name, err)
	}
	s.wg.Add(2)
	go s.serveTCP()
	go s.serveUDP()
	return s, nil
}

// Close stops the server.
func (s *Server) Close() {
	_ = s.tcp.Close()
	_ = s.udp.Close()
	s.wg.Wait()
}

func (s *Server) saw(a net.Addr) netip.Addr {
	ap, _ := netip.ParseAddrPort(a.String())
	ip := ap.Addr().Unmap()
	s.mu.Lock()
	s.sources[ip]++
	s.mu.Unlock()
	return ip
}

// Sources returns how many connections and datagrams each source address
// made so far.
func (s *Server) Sources() map[netip.Addr]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.sources)
}

// MaxGap returns the largest interval between consecutive arrivals of a
// probe stream, and how many probes arrived.
func (s *Server) MaxGap(stream string) (time.Duration, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := s.probes[stream]
	var max time.Duration
	for i := 1; i < len(ts); i++ {
		if d := ts[i].Sub(ts[i-1]); d > max {
			max = d
		}
	}
	return max, len(ts)
}

// Probes returns the arrival times of a probe stream's datagrams.
func (s *Server) Probes(stream string) []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.probes[stream])
}

// ProbeSeqs returns the sequence numbers of a probe stream's datagrams in
// their order of arrival.
func (s *Server) ProbeSeqs(stream string) []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.seqs[stream])
}

func (s *Server) serveTCP() {
	defer s.wg.Done()
	for {
		c, err := s.tcp.Accept()
		if err != nil {
			return
		}
		go s.handle(c)
	}
}

func (s *Server) handle(c net.Conn) {
	defer func() { _ = c.Close() }()
	if cpu := s.pin.Load(); cpu >= 0 {
		// The goroutine ends locked: the runtime then ends the thread.
		// If the thread cannot be pinned the connection is closed
		// unserved, so a measurement fails instead of running unpinned.
		if err := pinThread(int(cpu)); err != nil {
			return
		}
	}
	ip := s.saw(c.RemoteAddr())
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return
	}
	cmd, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
	n, _ := strconv.ParseInt(arg, 10, 64)
	switch cmd {
	case "WHO":
		_, _ = fmt.Fprintf(c, "%s\n", ip)
	case "ECHO":
		_, _ = io.Copy(c, r)
	case "WHOECHO": // the source, then ECHO: a connection's source for its life
		_, _ = fmt.Fprintf(c, "%s\n", ip)
		_, _ = io.Copy(c, r)
	case "SINK":
		got, _ := io.CopyN(io.Discard, r, n)
		_, _ = fmt.Fprintf(c, "%d\n", got)
	case "SOURCE":
		_, _ = io.CopyN(c, zeros{}, n)
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func (s *Server) serveUDP() {
	defer s.wg.Done()
	buf := make([]byte, 65536)
	// Answer from the address each datagram was sent to (IPV6_PKTINFO,
	// IP_PKTINFO for IPv4 on this dual-stack socket): a
	// namespace with several addresses would otherwise answer from the
	// one source selection prefers, which the client's connected socket
	// ignores.
	pc, pc4 := ipv6.NewPacketConn(s.udp), ipv4.NewPacketConn(s.udp)
	_ = pc.SetControlMessage(ipv6.FlagDst, true)
	for {
		n, cm, from, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		// x/net/ipv6 writes no IPv4 source; IP_PKTINFO carries it.
		write := func(b []byte) { _, _ = pc.WriteTo(b, nil, from) }
		if cm != nil && cm.Dst.To4() != nil {
			write = func(b []byte) { _, _ = pc4.WriteTo(b, &ipv4.ControlMessage{Src: cm.Dst.To4()}, from) }
		} else if cm != nil && cm.Dst != nil {
			write = func(b []byte) { _, _ = pc.WriteTo(b, &ipv6.ControlMessage{Src: cm.Dst}, from) }
		}
		now := time.Now()
		ip := s.saw(from)
		if f := strings.Fields(string(buf[:n])); len(f) == 3 && f[0] == "probe" {
			s.mu.Lock()
			s.probes[f[1]] = append(s.probes[f[1]], now)
			if seq, err := strconv.Atoi(f[2]); err == nil {
				s.seqs[f[1]] = append(s.seqs[f[1]], seq)
			}
			s.mu.Unlock()
		}
		write([]byte(ip.String()))
	}
}

// dialIn opens a connection from inside ns.
func dialIn(ctx context.Context, ns *NS, network string, dst netip.AddrPort) (net.Conn, error) {
	var c net.Conn
	err := ns.Do(func() (err error) {
		d := net.Dialer{}
		c, err = d.DialContext(ctx, network, dst.String())
		return err
	})
	return c, err
}

// TCPWho connects from ns to dst:ServerPort and returns the source address
// the server saw.
func TCPWho(ctx context.Context, ns *NS, dst netip.Addr) (netip.Addr, error) {
	return TCPWhoPort(ctx, ns, dst, ServerPort)
}

// TCPWhoPort is TCPWho on another port (80 reaches the ClusterIP).
func TCPWhoPort(ctx context.Context, ns *NS, dst netip.Addr, port uint16) (netip.Addr, error) {
	c, err := dialIn(ctx, ns, "tcp", netip.AddrPortFrom(dst, port))
	if err != nil {
		return netip.Addr{}, err
	}
	defer func() { _ = c.Close() }()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := io.WriteString(c, "WHO\n"); err != nil {
		return netip.Addr{}, err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return netip.Addr{}, fmt.Errorf("read WHO reply: %w", err)
	}
	return netip.ParseAddr(strings.TrimSpace(line))
}

// UDPWho sends one datagram from ns to dst (retrying a few times) and
// returns the source address the server saw. A socket error (an ICMP error
// the kernel reports on the connected socket, e.g. EHOSTUNREACH) ends it at
// once with that error.
func UDPWho(ctx context.Context, ns *NS, dst netip.Addr) (netip.Addr, error) {
	c, err := dialIn(ctx, ns, "udp", netip.AddrPortFrom(dst, ServerPort))
	if err != nil {
		return netip.Addr{}, err
	}
	defer func() { _ = c.Close() }()
	buf := make([]byte, 100)
	for range 5 {
		if _, err := c.Write([]byte("who")); err != nil {
			return netip.Addr{}, err
		}
		_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		n, err := c.Read(buf)
		if err == nil {
			return netip.ParseAddr(string(buf[:n]))
		}
		if ctx.Err() != nil {
			return netip.Addr{}, ctx.Err()
		}
		if ne, ok := errors.AsType[net.Error](err); !ok || !ne.Timeout() {
			return netip.Addr{}, err
		}
	}
	return netip.Addr{}, errors.New("no UDP reply")
}

// Bulk sends n bytes from ns to the server (SINK) or receives n bytes
// (SOURCE, when download) and returns the elapsed time.
func Bulk(ctx context.Context, ns *NS, dst netip.Addr, n int64, download bool) (time.Duration, error) {
	return BulkOn(ctx, ns, dst, n, download, -1)
}

// BulkOn is Bulk with the client's reads and writes on a thread pinned to
// cpu (any CPU when cpu < 0), as Cluster.SplitCPUs's Home expects.
func BulkOn(ctx context.Context, ns *NS, dst netip.Addr, n int64, download bool, cpu int) (time.Duration, error) {
	c, err := dialIn(ctx, ns, "tcp", netip.AddrPortFrom(dst, ServerPort))
	if err != nil {
		return 0, err
	}
	defer func() { _ = c.Close() }()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if cpu < 0 {
		return bulk(c, n, download)
	}
	type result struct {
		d   time.Duration
		err error
	}
	done := make(chan result, 1)
	go func() {
		// The goroutine ends locked: the runtime then ends the thread.
		if err := pinThread(cpu); err != nil {
			done <- result{err: err}
			return
		}
		d, err := bulk(c, n, download)
		done <- result{d, err}
	}()
	r := <-done
	return r.d, r.err
}

// bulk runs one SINK or SOURCE exchange of n bytes on c and returns its
// time from the command to the last byte (download) or to the server's
// count (upload).
func bulk(c net.Conn, n int64, download bool) (time.Duration, error) {
	start := time.Now()
	if download {
		if _, err := fmt.Fprintf(c, "SOURCE %d\n", n); err != nil {
			return 0, err
		}
		got, err := io.Copy(io.Discard, c)
		if err != nil || got != n {
			return 0, fmt.Errorf("downloaded %d of %d bytes: %v", got, n, err)
		}
		return time.Since(start), nil
	}
	if _, err := fmt.Fprintf(c, "SINK %d\n", n); err != nil {
		return 0, err
	}
	if _, err := io.CopyN(c, zeros{}, n); err != nil {
		return 0, err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || strings.TrimSpace(line) != strconv.FormatInt(n, 10) {
		return 0, fmt.Errorf("server got %q of %d bytes: %v", line, n, err)
	}
	return time.Since(start), nil
}

// Dial opens a connection from ns to dst:port.
func Dial(ctx context.Context, ns *NS, network string, dst netip.Addr, port uint16) (net.Conn, error) {
	return dialIn(ctx, ns, network, netip.AddrPortFrom(dst, port))
}
