// Package podstart is the agent's side of the Pod-start path: it serves the
// egressip-cni plugin on a unix socket (protocol in package cniapi) and
// installs the plugin into the Node's CNI network configuration list. The
// classification itself is the Gate's (the agent's datapath reconciler).
// See docs/datapath.md, "Pod start".
package podstart

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/egressip/egressip/internal/podstart/cniapi"
)

// Gate classifies Pods for the plugin.
type Gate interface {
	// PodAdded returns once the Node's datapath classifies every IP of
	// the Pod in req (as a member of the Egresses it names, or as no
	// member); it returns an error when ctx ends first or the Pod cannot
	// be classified.
	PodAdded(ctx context.Context, req cniapi.Request) ([]string, error)
	// PodDeleted forgets what PodAdded learnt of the Pod.
	PodDeleted(ctx context.Context, req cniapi.Request) error
}

// Handler serves the plugin's requests from g.
func Handler(g Gate) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+cniapi.PathAdd, func(w http.ResponseWriter, r *http.Request) {
		serve(w, r, "add", func(ctx context.Context, req cniapi.Request) (cniapi.Response, error) {
			if err := req.Validate(true); err != nil {
				return cniapi.Response{}, badRequest{err}
			}
			egs, err := g.PodAdded(ctx, req)
			return cniapi.Response{Egresses: egs}, err
		})
	})
	mux.HandleFunc("POST "+cniapi.PathDel, func(w http.ResponseWriter, r *http.Request) {
		serve(w, r, "del", func(ctx context.Context, req cniapi.Request) (cniapi.Response, error) {
			if err := req.Validate(false); err != nil {
				return cniapi.Response{}, badRequest{err}
			}
			return cniapi.Response{}, g.PodDeleted(ctx, req)
		})
	})
	return mux
}

// badRequest marks an error of the request itself (HTTP 400).
type badRequest struct{ error }

func (b badRequest) Unwrap() error { return b.error }

func serve(w http.ResponseWriter, r *http.Request, op string, fn func(context.Context, cniapi.Request) (cniapi.Response, error)) {
	start := time.Now()
	var req cniapi.Request
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err == nil {
		err = json.Unmarshal(b, &req)
	}
	var res cniapi.Response
	code := http.StatusOK
	if err != nil {
		code, res.Error = http.StatusBadRequest, fmt.Sprintf("decode request: %v", err)
	} else if res, err = fnWithin(r.Context(), req, fn); err != nil {
		code, res.Error = http.StatusServiceUnavailable, err.Error()
		if _, ok := errors.AsType[badRequest](err); ok {
			code = http.StatusBadRequest
		}
	}
	result := "ok"
	if code != http.StatusOK {
		result = "error"
		log.FromContext(r.Context()).Error(err, "pod-start request failed", "op", op, "pod", klog.KRef(req.Namespace, req.Name))
	}
	requests.WithLabelValues(op, result).Inc()
	if op == "add" {
		waits.WithLabelValues(result).Observe(time.Since(start).Seconds())
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(res)
}

// fnWithin runs fn bounded by 90% of the plugin's own timeout, so that
// the agent's reason reaches the plugin before the plugin gives up.
func fnWithin(ctx context.Context, req cniapi.Request, fn func(context.Context, cniapi.Request) (cniapi.Response, error)) (cniapi.Response, error) {
	if req.TimeoutMillis > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.TimeoutMillis)*time.Millisecond*9/10)
		defer cancel()
	}
	return fn(ctx, req)
}

// Serve listens on the unix socket at path (its directory is created,
// mode 0700; a stale socket file is replaced; the socket is mode 0600) and
// serves h until ctx ends. On return it removes the socket file unless
// keep is set or another process has replaced it meanwhile (a surge
// rolling update's newer agent); owned reports whether the file was still
// this process's. ready, when not nil, is called once the socket accepts
// connections. It fails when the socket cannot be created.
func Serve(ctx context.Context, path string, h http.Handler, keep bool, ready func()) (owned bool, err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return false, fmt.Errorf("pod-start socket directory: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("remove the stale pod-start socket %s: %w", path, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return false, fmt.Errorf("listen on the pod-start socket %s: %w", path, err)
	}
	ul := l.(*net.UnixListener)
	// The socket file stays when this process exits with keep set (the
	// plugin then sees ECONNREFUSED and fails, rather than ENOENT).
	ul.SetUnlinkOnClose(false)
	if err := os.Chmod(path, 0o600); err != nil {
		_ = l.Close()
		return false, fmt.Errorf("pod-start socket mode: %w", err)
	}
	mine, err := os.Stat(path)
	if err != nil {
		_ = l.Close()
		return false, fmt.Errorf("pod-start socket: %w", err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second,
		BaseContext: func(net.Listener) context.Context { return ctx }}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	if ready != nil {
		ready()
	}
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	if now, err := os.Stat(path); err == nil && sameFile(mine, now) {
		owned = true
		if !keep {
			_ = os.Remove(path)
		}
	}
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return owned, fmt.Errorf("serve the pod-start socket: %w", err)
	}
	return owned, nil
}

// Options configure Run.
type Options struct {
	// Socket is the path of the socket the plugin asks.
	Socket string
	// ConfDir is the CNI configuration directory (/etc/cni/net.d) the
	// plugin is chained into; empty: the plugin is installed by hand.
	ConfDir string
	// Timeout is the plugin's wait for the agent (0: its default).
	Timeout time.Duration
	// Period is how often the entry is checked and restored; default 10s.
	Period time.Duration
	// Keep leaves the socket file and the entry in place when Run ends,
	// so that Pods starting while the agent is away fail their sandbox
	// (and are retried by the kubelet) instead of starting unclassified.
	Keep bool
	// Gate classifies the Pods.
	Gate Gate
}

// Run serves the plugin and keeps it installed until ctx ends: the socket
// first, then the entry (so the plugin never runs without an agent to
// ask). At the end it removes the entry and the socket, unless o.Keep is
// set or a newer agent has taken the socket over (a surge rolling update:
// the newer agent keeps both). It fails when the socket cannot be served.
func Run(ctx context.Context, o Options) error {
	if o.Period <= 0 {
		o.Period = 10 * time.Second
	}
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	installed := make(chan error, 1)
	started := make(chan struct{})
	go func() {
		select {
		case <-started:
		case <-sctx.Done():
			installed <- nil
			return
		}
		if o.ConfDir == "" {
			installed <- nil
			return
		}
		installed <- RunInstaller(sctx, o.ConfDir, Entry{Socket: o.Socket, TimeoutSeconds: int(o.Timeout / time.Second)}, o.Period)
	}()
	owned, err := Serve(ctx, o.Socket, Handler(o.Gate), o.Keep, func() { close(started) })
	stop()
	ierr := <-installed
	if o.ConfDir != "" && owned && !o.Keep {
		files, uerr := Uninstall(o.ConfDir)
		if len(files) > 0 {
			conflistChanges.WithLabelValues("uninstall").Inc()
			log.FromContext(ctx).Info("egressip-cni removed from the CNI configuration", "files", files)
		}
		ierr = errors.Join(ierr, uerr)
	}
	return errors.Join(err, ierr)
}

// sameFile reports whether two stats describe the same file (device and
// inode).
func sameFile(a, b os.FileInfo) bool {
	sa, ok1 := a.Sys().(*syscall.Stat_t)
	sb, ok2 := b.Sys().(*syscall.Stat_t)
	return ok1 && ok2 && sa.Ino == sb.Ino && sa.Dev == sb.Dev
}
