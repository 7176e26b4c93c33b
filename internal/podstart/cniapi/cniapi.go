// Package cniapi is the small protocol between the egressip-cni plugin
// (cmd/cni), which the kubelet's container runtime runs while it wires a
// new Pod, and the egressip agent of the same Node: JSON over HTTP on a
// unix socket in a hostPath directory. It imports only the standard
// library, so that the plugin binary stays small.
package cniapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"time"
)

// DefaultSocket is the agent's socket for the plugin, in the hostPath
// directory the DaemonSet mounts at /run/egressip-cni.
const DefaultSocket = "/run/egressip-cni/agent.sock"

// PluginType is the plugin's "type" in a CNI network configuration list
// (the name of its binary in the CNI bin directory).
const PluginType = "egressip-cni"

// Paths served on the socket.
const (
	PathAdd = "/v1/pod-add"
	PathDel = "/v1/pod-del"
)

// Request names a Pod being wired or unwired on this Node. Namespace and
// Name come from CNI_ARGS (K8S_POD_NAMESPACE, K8S_POD_NAME, as the kubelet
// passes them), IPs from the previous plugin's result.
type Request struct {
	Namespace   string       `json:"namespace"`
	Name        string       `json:"name"`
	UID         string       `json:"uid,omitempty"`
	ContainerID string       `json:"containerID,omitempty"`
	IPs         []netip.Addr `json:"ips,omitempty"`
	// TimeoutMillis is how long the plugin waits for the answer, in
	// milliseconds: the agent answers with its reason a little before, so
	// that the runtime's error names the cause (0: no bound).
	TimeoutMillis int64 `json:"timeoutMillis,omitempty"`
}

// Validate reports a clear error for a request the agent cannot act on:
// no namespace or name, or (for an ADD) no IP.
func (r Request) Validate(add bool) error {
	var errs []error
	if r.Namespace == "" || r.Name == "" {
		errs = append(errs, errors.New("pod namespace and name are required (CNI_ARGS K8S_POD_NAMESPACE, K8S_POD_NAME)"))
	}
	if add && len(r.IPs) == 0 {
		errs = append(errs, errors.New("no IP address: the previous plugin's result has none"))
	}
	for _, ip := range r.IPs {
		if !ip.IsValid() || ip.Zone() != "" {
			errs = append(errs, fmt.Errorf("invalid pod IP %q", ip))
		}
	}
	return errors.Join(errs...)
}

// Response is the agent's answer to an ADD: it is sent only once the
// Node's datapath classifies every IP of the Pod.
type Response struct {
	// Egresses are the Egresses whose member the Pod is on this Node (none
	// for a Pod no Egress selects).
	Egresses []string `json:"egresses,omitempty"`
	// Error, when set, is why the agent could not classify the Pod.
	Error string `json:"error,omitempty"`
}

// ErrNoAgent is returned (wrapped) by Call when the socket file does not
// exist: no agent runs on this Node, or it was uninstalled. A socket that
// exists but refuses connections (an agent restarting) is another error.
var ErrNoAgent = errors.New("no egressip agent on the socket")

// Call sends req to the agent on socket at path (PathAdd or PathDel) and
// returns its answer. The deadline of ctx bounds the whole exchange. It
// returns an error wrapping ErrNoAgent when the socket is absent or
// refuses, the agent's own error for a request it refused, and a transport
// error otherwise.
func Call(ctx context.Context, socket, path string, req Request) (Response, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return Response{}, fmt.Errorf("encode request: %w", err)
	}
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableKeepAlives: true,
	}
	defer tr.CloseIdleConnections()
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://egressip-agent"+path, bytes.NewReader(body))
	if err != nil {
		return Response{}, fmt.Errorf("build request: %w", err)
	}
	hr.Header.Set("Content-Type", "application/json")
	res, err := (&http.Client{Transport: tr}).Do(hr)
	if err != nil {
		if errors.Is(err, errNotExist) {
			return Response{}, fmt.Errorf("%w %s: %w", ErrNoAgent, socket, err)
		}
		return Response{}, fmt.Errorf("ask the egressip agent on %s: %w", socket, err)
	}
	defer func() { _ = res.Body.Close() }()
	var out Response
	b, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return Response{}, fmt.Errorf("read the agent's answer: %w", err)
	}
	if err := json.Unmarshal(b, &out); err != nil {
		return Response{}, fmt.Errorf("decode the agent's answer (HTTP %d): %w", res.StatusCode, err)
	}
	if res.StatusCode != http.StatusOK {
		return out, fmt.Errorf("egressip agent: %s (HTTP %d)", out.Error, res.StatusCode)
	}
	return out, nil
}

// DefaultTimeout bounds an ADD when the plugin's configuration sets none:
// the agent answers within a few milliseconds once it has seen the Pod;
// past this the runtime's ADD fails and the kubelet retries the sandbox.
const DefaultTimeout = 10 * time.Second
