// Package report is the channel between an egressip-agent and the
// controller: the agent serves what it has bound over HTTP on its Node, and
// the controller polls every agent (by default once a second).
//
// One poll answers two questions at no cost to the API server: is the agent
// alive (it answered within the timeout), and which egress IPs are bound and
// announced on that Node. The controller turns an Egress Ready only when the
// report of its egress Node lists the IP as announced, and it releases an IP
// from a Node before assigning it elsewhere only when that Node's report no
// longer lists it (or the Node is declared dead). docs/failover.md explains
// the timings.
package report

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"time"
)

// Path is the HTTP path of the report on the agent.
const Path = "/report"

// DefaultPort is the TCP port the agent serves its report on (host network).
const DefaultPort = 9445

// BoundIP is one egress IP as the agent sees it on its Node.
type BoundIP struct {
	// IP is the egress IP in canonical form.
	IP netip.Addr `json:"ip"`
	// Interface is the name of the interface the IP is bound on.
	Interface string `json:"interface"`
	// Announced is true once the first gratuitous ARP (IPv4) or unsolicited
	// Neighbor Advertisement (IPv6) for this binding has been sent.
	Announced bool `json:"announced"`
}

// Report is what an agent serves.
type Report struct {
	// Node is the name of the agent's Node.
	Node string `json:"node"`
	// Instance identifies the agent process; it changes when the agent
	// restarts, so the controller can tell a restart from a steady state.
	Instance string `json:"instance"`
	// Bound lists the egress IPs bound on the Node, sorted by IP.
	Bound []BoundIP `json:"bound"`
	// Datapath is the agent's finding on whether its datapath can carry
	// the Node's Pod traffic; nil when the agent runs no datapath, has the
	// check turned off, or has not checked yet. The controller mirrors it
	// in the Node condition EgressDatapathSupported.
	Datapath *DatapathStatus `json:"datapath,omitempty"`
	// Kernel is what the agent's start-up probe of kernel features found
	// (internal/agent/kernel); nil when it did not probe. The controller
	// mirrors it in the Node condition EgressKernelFeatures.
	Kernel *KernelStatus `json:"kernel,omitempty"`
}

// Reasons of KernelStatus, also the reasons of the Node condition
// EgressKernelFeatures.
const (
	// ReasonKernelFeaturesPresent: every feature probed was found.
	ReasonKernelFeaturesPresent = "KernelFeaturesPresent"
	// ReasonKernelFeatureMissing: a feature is missing; a part of the
	// agent is degraded or did not start, as the message says.
	ReasonKernelFeatureMissing = "KernelFeatureMissing"
)

// KernelStatus is the outcome of the agent's kernel feature probe.
type KernelStatus struct {
	// Release is the kernel release (uname -r).
	Release string `json:"release"`
	// Missing names the features found missing (the "feature" label of
	// egressip_agent_kernel_feature); empty when all were found.
	Missing []string `json:"missing,omitempty"`
	// Reason is ReasonKernelFeaturesPresent or ReasonKernelFeatureMissing.
	Reason string `json:"reason"`
	// Message names the kernel release, each part degraded or not started
	// and its missing features, at most MaxDatapathMessage bytes.
	Message string `json:"message"`
}

// Equal reports whether two kernel findings are equal (nil: none).
func (k *KernelStatus) Equal(o *KernelStatus) bool {
	if k == nil || o == nil {
		return k == o
	}
	return k.Release == o.Release && k.Reason == o.Reason && k.Message == o.Message && slices.Equal(k.Missing, o.Missing)
}

// Reasons of DatapathStatus, also the reasons of the Node condition.
const (
	// ReasonHostStack: the Pods' traffic crosses the host's IP stack, where
	// the datapath acts (no evidence of a BPF bypass).
	ReasonHostStack = "HostStackCrossed"
	// ReasonHostStackBypass: the CNI steers Pod traffic past the host's
	// IP stack with eBPF, so selected Pods would leave with their own
	// address; the message names the evidence.
	ReasonHostStackBypass = "HostStackBypass"
)

// MaxDatapathMessage bounds DatapathStatus.Message, in bytes.
const MaxDatapathMessage = 1024

// DatapathStatus is whether the agent's datapath can work on its Node.
type DatapathStatus struct {
	// Supported is false when the check found evidence that Pod traffic
	// bypasses the host's IP stack.
	Supported bool `json:"supported"`
	// Reason is ReasonHostStack or ReasonHostStackBypass (CamelCase, as a
	// Kubernetes condition reason).
	Reason string `json:"reason"`
	// Message is a human-readable account of the evidence, at most
	// MaxDatapathMessage bytes.
	Message string `json:"message,omitempty"`
}

// Lookup returns the entry for ip and whether the report lists it.
func (r *Report) Lookup(ip netip.Addr) (BoundIP, bool) {
	i, ok := slices.BinarySearchFunc(r.Bound, ip, func(b BoundIP, ip netip.Addr) int { return b.IP.Compare(ip) })
	if !ok {
		return BoundIP{}, false
	}
	return r.Bound[i], true
}

// Sort orders Bound by IP, as Lookup requires.
func (r *Report) Sort() {
	slices.SortFunc(r.Bound, func(a, b BoundIP) int { return a.IP.Compare(b.IP) })
}

// Handler serves the report returned by current on GET Path.
func Handler(current func() Report) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+Path, func(w http.ResponseWriter, _ *http.Request) {
		r := current()
		r.Sort()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(r)
	})
	return mux
}

// Client polls agents.
type Client struct {
	// HTTP is the client used; its Timeout bounds one poll.
	HTTP *http.Client
	// Port is the agent's report port on every Node.
	Port int
}

// NewClient returns a client whose polls time out after timeout.
func NewClient(port int, timeout time.Duration) *Client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: timeout}).DialContext,
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     30 * time.Second,
	}
	return &Client{HTTP: &http.Client{Timeout: timeout, Transport: tr}, Port: port}
}

// Get fetches the report of the agent at host (a Node IP). It returns an
// error when the agent does not answer in time or answers something else
// than a report.
func (c *Client) Get(ctx context.Context, host netip.Addr) (Report, error) {
	url := "http://" + net.JoinHostPort(host.String(), strconv.Itoa(c.Port)) + Path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Report{}, fmt.Errorf("build report request: %w", err)
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return Report{}, fmt.Errorf("poll agent at %s: %w", host, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return Report{}, fmt.Errorf("poll agent at %s: HTTP %d", host, resp.StatusCode)
	}
	var r Report
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&r); err != nil {
		return Report{}, fmt.Errorf("decode report from %s: %w", host, err)
	}
	r.Sort()
	return r, nil
}
