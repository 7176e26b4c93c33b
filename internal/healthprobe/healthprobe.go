// Package healthprobe asks one egressip-agent process for its health over
// the unix socket it serves (--health-probe-socket). It imports only the
// standard library, so the DaemonSet's exec probes (cmd/agent-probe) start
// in a few megabytes instead of loading the agent's Kubernetes clients.
package healthprobe

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// DefaultSocket is where the DaemonSet's agent serves its per-process
// health probes: an emptyDir of its own Pod, so two agents of one Node
// (a surge rolling update) each answer for themselves.
const DefaultSocket = "/run/egressip-agent/health.sock"

// Probe asks the agent process serving the unix socket at socket for
// /healthz or /readyz (check "healthz" or "readyz") and returns nil when it
// answers 200 OK. Errors: the socket cannot be reached within timeout, or
// the answer is not 200 (the error holds the body, which names failed
// checks).
func Probe(ctx context.Context, socket, check string, timeout time.Duration) error {
	if check != "healthz" && check != "readyz" {
		return fmt.Errorf("unknown check %q (want healthz or readyz)", check)
	}
	c := &http.Client{Timeout: timeout, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://agent/"+check, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("%s: %w", check, err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: HTTP %d: %s", check, resp.StatusCode, body)
	}
	return nil
}

// Main is the command line of egressip-agent-probe (the DaemonSet's exec
// probe) and of `egressip-agent probe`: `[--socket path] [--timeout d]
// healthz|readyz`. It returns the exit code: 0 when the check passes, 1
// when it fails or the socket cannot be reached, 2 on bad usage.
func Main(name string, args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	socket := fs.String("socket", DefaultSocket, "Unix socket of the agent (its --health-probe-socket).")
	timeout := fs.Duration("timeout", 3*time.Second, "Give up after this long.")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 1 {
		_, _ = fmt.Fprintf(stderr, "usage: %s [--socket path] [--timeout d] healthz|readyz\n", name)
		return 2
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	if err := Probe(ctx, *socket, fs.Arg(0), *timeout); err != nil {
		_, _ = fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 1
	}
	return 0
}
