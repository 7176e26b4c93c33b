package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	dp "github.com/egressip/egressip/test/datapath"
)

// Flow is one long-lived TCP connection from a Pod to the external server
// (its WHOECHO command): Source is the address the server saw when it
// opened, and every Interval the flow sends one numbered line and waits for
// its echo, recording when each echo came back. A connection whose source
// changed on the way, was reset, or stopped getting its echoes for
// flowTimeout fails, and keeps its first error.
type Flow struct {
	Pod    *Pod
	Source netip.Addr
	// Opened is when the server's first answer arrived.
	Opened time.Time

	conn net.Conn
	stop chan struct{}
	done chan struct{}

	mu     sync.Mutex
	echoes []time.Time
	err    error
	failed time.Time
}

// flowTimeout is how long a flow waits for one echo before it counts the
// connection as broken (longer than any failover the tests measure, so a
// flow through a failed IP shows as a gap, then either recovers or fails).
const flowTimeout = 15 * time.Second

// OpenFlow opens a Flow from Pod p to the external server (IPv6 when v6),
// sending a line every interval. It returns an error when the connection
// or the server's first answer fails within 3 s.
func (c *Cluster) OpenFlow(ctx context.Context, p *Pod, v6 bool, interval time.Duration) (*Flow, error) {
	dst := ExtV4
	if v6 {
		dst = ExtV6
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	conn, err := dp.Dial(ctx, p.ns, "tcp", dst, dp.ServerPort)
	if err != nil {
		return nil, fmt.Errorf("%s: dial %s: %w", p, dst, err)
	}
	dl, _ := ctx.Deadline()
	_ = conn.SetDeadline(dl)
	r := bufio.NewReader(conn)
	line := ""
	if _, err = fmt.Fprint(conn, "WHOECHO\n"); err == nil {
		line, err = r.ReadString('\n')
	}
	src, perr := netip.ParseAddr(strings.TrimSpace(line))
	if err != nil || perr != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("%s: first answer %q: %w", p, line, errors.Join(err, perr))
	}
	f := &Flow{Pod: p, Source: src.Unmap(), Opened: time.Now(), conn: conn, stop: make(chan struct{}), done: make(chan struct{})}
	f.echoes = []time.Time{f.Opened}
	go f.run(r, interval)
	return f, nil
}

func (f *Flow) run(r *bufio.Reader, interval time.Duration) {
	defer close(f.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for seq := 0; ; seq++ {
		select {
		case <-f.stop:
			return
		case <-t.C:
		}
		_ = f.conn.SetDeadline(time.Now().Add(flowTimeout))
		want := strconv.Itoa(seq)
		line := ""
		_, err := fmt.Fprint(f.conn, want+"\n")
		if err == nil {
			line, err = r.ReadString('\n')
		}
		if err == nil && strings.TrimSpace(line) != want {
			err = fmt.Errorf("echo %q, want %s", strings.TrimSpace(line), want)
		}
		select {
		case <-f.stop:
			return // Close ended the read; not the connection's fault
		default:
		}
		f.mu.Lock()
		if err != nil {
			f.err, f.failed = fmt.Errorf("%s from %s: line %d: %w", f.Pod, f.Source, seq, err), time.Now()
			f.mu.Unlock()
			return
		}
		f.echoes = append(f.echoes, time.Now())
		f.mu.Unlock()
	}
}

// Err returns the flow's first error, nil while it works.
func (f *Flow) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

// MaxGap returns the largest interval between consecutive echoes that
// ends after since, counting the silence from the last echo until now (or
// until the flow failed) as an interval too.
func (f *Flow) MaxGap(since time.Time) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	end := time.Now()
	if f.err != nil {
		end = f.failed
	}
	ts := append(slices.Clip(f.echoes), end)
	var gap time.Duration
	for i := 1; i < len(ts); i++ {
		if ts[i].After(since) {
			gap = max(gap, ts[i].Sub(ts[i-1]))
		}
	}
	return gap
}

// Echoes returns how many echoes came back after since.
func (f *Flow) Echoes(since time.Time) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, t := range f.echoes {
		if t.After(since) {
			n++
		}
	}
	return n
}

// Close stops the flow and closes its connection; it returns the flow's
// first error (nil when the connection worked to the end).
func (f *Flow) Close() error {
	select {
	case <-f.stop:
	default:
		close(f.stop)
	}
	_ = f.conn.Close()
	<-f.done
	return f.Err()
}
