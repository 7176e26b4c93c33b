package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	"sigs.k8s.io/controller-runtime/pkg/healthz"

	"github.com/egressip/egressip/internal/healthprobe"
)

// reusePort is a listen configuration with SO_REUSEPORT (socket(7)): two
// agents of one Node, the old and the new Pod of a surge rolling update
// (DaemonSet maxSurge 1, maxUnavailable 0), listen on the same host-network
// ports at once and the kernel spreads connections over both, so the
// controller's polls and the kubelet's probes are answered throughout the
// hand-over. The kernel allows it only between sockets of the same
// effective user, both with the option set.
var reusePort = net.ListenConfig{
	Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		if err := c.Control(func(fd uintptr) {
			serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
		}); err != nil {
			return err
		}
		return serr
	},
}

// listenShared opens a TCP listener on addr with SO_REUSEPORT. Errors are
// the listen errors (address in use by a socket without the option, bad
// address).
func listenShared(ctx context.Context, addr string) (net.Listener, error) {
	return reusePort.Listen(ctx, "tcp", addr)
}

// serveHealth serves /healthz (liveness: the process answers) and /readyz
// (ready: the checks in ready pass) on ln until ctx is done, with
// controller-runtime's healthz handler, as the manager's own probe server
// would, but on a listener the agent opened with SO_REUSEPORT (the manager
// cannot be given one). It returns nil after ctx is done.
func serveHealth(ctx context.Context, ln net.Listener, ready map[string]healthz.Checker) error {
	mux := http.NewServeMux()
	live := &healthz.Handler{Checks: map[string]healthz.Checker{"ping": healthz.Ping}}
	rd := &healthz.Handler{Checks: ready}
	mux.Handle("/healthz", http.StripPrefix("/healthz", live))
	mux.Handle("/healthz/", http.StripPrefix("/healthz", live))
	mux.Handle("/readyz", http.StripPrefix("/readyz", rd))
	mux.Handle("/readyz/", http.StripPrefix("/readyz", rd))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	stop := context.AfterFunc(ctx, func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	defer stop()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("health probes: %w", err)
	}
	return nil
}

// DefaultHealthProbeSocket is where the DaemonSet's agent serves its
// per-process health probes (an emptyDir of its own Pod); see package
// healthprobe.
const DefaultHealthProbeSocket = healthprobe.DefaultSocket

// portTaken reports whether another socket is bound to the TCP address
// addr: a bind without SO_REUSEPORT fails with EADDRINUSE even against
// listeners that set it. The probe socket is closed at once.
func portTaken(addr string) bool {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return errors.Is(err, syscall.EADDRINUSE)
	}
	_ = l.Close()
	return false
}

// openWhenReady waits until the agent's first reconcile completed
// (Agent.ReadyCheck) and, with certificates, its certificate is issued,
// then opens the report listener on reportAddr and,
// when healthAddr is set, the health probe listener, both with
// SO_REUSEPORT beside the other agent's. It returns nil listeners and no
// error when ctx is done first, and the listen error otherwise.
func openWhenReady(ctx context.Context, a *Agent, reportAddr, healthAddr string) (report, health net.Listener, err error) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for a.ReadyCheck(nil) != nil || (a.certs != nil && !a.certs.Ready()) {
		select {
		case <-ctx.Done():
			return nil, nil, nil
		case <-t.C:
		}
	}
	if report, err = listenShared(ctx, reportAddr); err != nil {
		return nil, nil, fmt.Errorf("listen for the report: %w", err)
	}
	if healthAddr != "" {
		if health, err = listenShared(ctx, healthAddr); err != nil {
			_ = report.Close()
			return nil, nil, fmt.Errorf("listen for the health probes: %w", err)
		}
	}
	return report, health, nil
}

// listenUnix listens on the unix socket at path, creating its directory
// and replacing a stale socket file a previous process left.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	return net.Listen("unix", path)
}
