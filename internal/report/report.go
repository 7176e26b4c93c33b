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
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
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
	// Acquires is set by agents that take a poll's acquire instructions
	// (Acquire): the controller sends them, and holds a failover's move
	// back for them, only to such agents.
	Acquires bool `json:"acquires,omitempty"`
	// Datapath is the agent's finding on whether its datapath can carry
	// the Node's Pod traffic; nil when the agent runs no datapath, has the
	// check turned off, or has not checked yet. The controller mirrors it
	// in the Node condition EgressDatapathSupported.
	Datapath *DatapathStatus `json:"datapath,omitempty"`
	// Refused lists the egress IPs assigned to the Node that the agent does
	// not hold, each with why, sorted by IP: the controller shows the
	// reason in the Ready condition of the Egresses asking for the IP
	// instead of waiting for a binding that will not come.
	Refused []RefusedIP `json:"refused,omitempty"`
	// Ownership is how the agent knows which addresses are its own and
	// whether its ownership record is healthy; nil from agents that do
	// not report it. The controller mirrors it in the Node condition
	// EgressIPOwnershipKnown.
	Ownership *OwnershipStatus `json:"ownership,omitempty"`
	// Refused lists the Egresses whose part of the datapath the Node's
	// kernel refuses (the agent programs every other Egress), sorted by
	// name, at most MaxRefusedEgresses. The controller turns each one not
	// Ready, naming the Node.
	RefusedEgresses []RefusedEgress `json:"refusedEgresses,omitempty"`
	// Kernel is what the agent's start-up probe of kernel features found
	// (internal/agent/kernel); nil when it did not probe. The controller
	// mirrors it in the Node condition EgressKernelFeatures.
	Kernel *KernelStatus `json:"kernel,omitempty"`
	// Fence is the agent's self-fencing state (internal/agent/fence);
	// nil while it has not fenced since it started, or fencing is off.
	Fence *FenceStatus `json:"fence,omitempty"`
	// VLANs is the state of the VLAN sub-interfaces the agent keeps for
	// the egress IPs assigned to its Node (--create-vlans); nil when it
	// keeps none or has not synced yet. The controller mirrors it in the
	// Node condition EgressVLANLinksReady.
	VLANs *VLANStatus `json:"vlans,omitempty"`
	// Conflicts lists, sorted by IP, the egress IPs bound on the Node that
	// something else answered for in the agent's last duplicate-IP probe
	// (an ARP probe or a DAD-style Neighbor Solicitation, package
	// internal/agent/conflict); at most one entry per bound IP. An entry
	// stays until a probe round sees no foreign answer. The controller sets
	// the Egress condition Conflict from it.
	Conflicts []ConflictIP `json:"conflicts,omitempty"`
	// MACs are the hardware addresses of the Node's interfaces that are up
	// and have an address (canonical, sorted, at most MaxMACs), so that the
	// controller can name the Node a conflicting MAC belongs to.
	MACs []string `json:"macs,omitempty"`
	// NICs are the hardware addresses of the Node's network devices, in
	// any state (on a cloud instance, one per attached network interface;
	// canonical, sorted, at most MaxMACs); nil from agents that do not
	// report them. A cloud controller re-reads the Node's interfaces when
	// they differ from what the cloud last said, so that an interface
	// attached or detached by someone else is seen within seconds.
	NICs []string `json:"nics,omitempty"`
}

// FenceStatus is whether an agent has released its Node's egress IPs on
// its own because it lost the controller, the API server and its peers'
// support (docs/failover.md, "Fencing a cut-off Node").
type FenceStatus struct {
	// Fenced is true while the agent holds no egress IP for that reason.
	Fenced bool `json:"fenced"`
	// Rejoining is true after the fence was lifted until the agent's
	// cache agrees with a consistent read of its Egresses: meanwhile it
	// binds only what both show assigned to the Node.
	Rejoining bool `json:"rejoining,omitempty"`
	// Reason is the fence package's reason for the last change (for
	// example PeersLost, ControllerPollsOthers, Polled).
	Reason string `json:"reason"`
	// Message says why, at most MaxDatapathMessage bytes.
	Message string `json:"message,omitempty"`
	// Since is when the state last changed (the agent's clock).
	Since time.Time `json:"since"`
	// FencedAt is when the last fence began (the agent's clock); it is
	// kept after the fence is lifted, so that the controller, which cannot
	// poll a fenced agent, learns of the fence once the Node is back.
	FencedAt time.Time `json:"fencedAt,omitzero"`
	// FenceReason and FenceMessage are the decision that began the last
	// fence (Reason and Message at FencedAt), kept likewise.
	FenceReason  string `json:"fenceReason,omitempty"`
	FenceMessage string `json:"fenceMessage,omitempty"`
}

// Equal reports whether two fence statuses are equal (nil: none).
func (f *FenceStatus) Equal(o *FenceStatus) bool {
	if f == nil || o == nil {
		return f == o
	}
	return f.Fenced == o.Fenced && f.Rejoining == o.Rejoining && f.Reason == o.Reason && f.Message == o.Message &&
		f.Since.Equal(o.Since) && f.FencedAt.Equal(o.FencedAt) && f.FenceReason == o.FenceReason && f.FenceMessage == o.FenceMessage
}

// MaxMACs bounds Report.MACs and ConflictIP.MACs, in entries.
const MaxMACs = 32

// ConflictIP is an egress IP bound on the agent's Node that another host
// answers for on the wire.
type ConflictIP struct {
	// IP is the egress IP in canonical form.
	IP netip.Addr `json:"ip"`
	// Interface is the interface it was probed on.
	Interface string `json:"interface"`
	// MACs are the other hosts' MACs (canonical, sorted, at most MaxMACs)
	// seen answering in the last round that saw any.
	MACs []string `json:"macs"`
	// Since is when a probe round first saw this conflict.
	Since time.Time `json:"since"`
}

// LookupConflict returns the conflict reported for ip and whether there
// is one.
func (r *Report) LookupConflict(ip netip.Addr) (ConflictIP, bool) {
	i, ok := slices.BinarySearchFunc(r.Conflicts, ip, func(c ConflictIP, ip netip.Addr) int { return c.IP.Compare(ip) })
	if !ok {
		return ConflictIP{}, false
	}
	return r.Conflicts[i], true
}

// MaxRefusedMessage bounds RefusedIP.Message, in bytes.
const MaxRefusedMessage = 512

// RefusedIP is an egress IP assigned to the agent's Node that the agent does
// not bind, or could not bind.
type RefusedIP struct {
	// IP is the address in canonical form.
	IP netip.Addr `json:"ip"`
	// Egresses names the Egresses whose status asks for IP, sorted; empty
	// when the IP failed to bind for all of them alike.
	Egresses []string `json:"egresses,omitempty"`
	// Message says why, in words for the Egress's Ready condition, at most
	// MaxRefusedMessage bytes.
	Message string `json:"message"`
}

// LookupRefused returns the refusal for ip and whether the report lists
// one.
func (r *Report) LookupRefused(ip netip.Addr) (RefusedIP, bool) {
	i, ok := slices.BinarySearchFunc(r.Refused, ip, func(b RefusedIP, ip netip.Addr) int { return b.IP.Compare(ip) })
	if !ok {
		return RefusedIP{}, false
	}
	return r.Refused[i], true
}

// OwnershipStatus is how an agent keeps address ownership, and any problem.
type OwnershipStatus struct {
	// Mode is the configured mode (auto, proto or record).
	Mode string `json:"mode"`
	// Healthy is false while the record is unreadable, unwritable or
	// missing (Reason and Message say which and what to do).
	Healthy bool `json:"healthy"`
	// Reason is one of the ReasonOwnership* / ReasonRecord* constants.
	Reason string `json:"reason"`
	// Message is human-readable, at most MaxDatapathMessage bytes.
	Message string `json:"message,omitempty"`
}

// MaxRefusedEgresses bounds Report.RefusedEgresses, in entries (each
// RefusedEgress.Message is bounded by MaxRefusedMessage).
const MaxRefusedEgresses = 256

// RefusedEgress is one Egress whose datapath the agent cannot program.
type RefusedEgress struct {
	// Egress is the Egress's name.
	Egress string `json:"egress"`
	// Message is the kernel's error for the Egress's part, at most
	// MaxRefusedMessage bytes.
	Message string `json:"message"`
}

// KernelStatus is the outcome of the agent's kernel feature probe.
type KernelStatus struct {
	// Release is the kernel release (uname -r).
	Release string `json:"release"`
	// Missing names the features found missing (the "feature" label of
	// egressip_agent_kernel_feature); empty when all were found.
	Missing []string `json:"missing,omitempty"`
	// Reason is v1alpha1.ReasonKernelFeaturesPresent or v1alpha1.ReasonKernelFeatureMissing.
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

// MaxVLANProblems bounds VLANStatus.Problems, in entries (each Message
// is bounded by MaxRefusedMessage).
const MaxVLANProblems = 16

// VLANStatus is the outcome of the agent's last sync of its VLAN
// sub-interfaces (package internal/agent/poolroute, VLANs.Sync).
type VLANStatus struct {
	// Links are the names of the sub-interfaces in place for the IPs
	// assigned here, sorted; empty when none is needed.
	Links []string `json:"links,omitempty"`
	// Problems are the VLAN sub-interfaces that cannot be had, sorted by
	// IP, at most MaxVLANProblems; empty when every one is in place.
	Problems []VLANProblem `json:"problems,omitempty"`
	// More counts the problems left out of Problems by MaxVLANProblems.
	More int `json:"more,omitempty"`
}

// VLANProblem is one egress IP whose VLAN sub-interface cannot be had
// (the IP is then not bound, and listed in Report.Refused too).
type VLANProblem struct {
	// IP is the egress IP in canonical form.
	IP netip.Addr `json:"ip"`
	// VLAN is its pool's subnetInfo.vlan.
	VLAN int `json:"vlan"`
	// Parent is the parent interface wanted (empty when none was found).
	Parent string `json:"parent,omitempty"`
	// Link is the foreign link holding the VLAN ID (ReasonVLANForeignLink).
	Link string `json:"link,omitempty"`
	// Reason is one of v1alpha1.ReasonVLANParentMissing,
	// ReasonVLANForeignLink, ReasonVLANConflict, ReasonVLANLinkFailed.
	Reason string `json:"reason"`
	// Message is the agent's error, at most MaxRefusedMessage bytes.
	Message string `json:"message"`
}

// Equal reports whether two VLAN statuses are equal (nil: none).
func (v *VLANStatus) Equal(o *VLANStatus) bool {
	if v == nil || o == nil {
		return v == o
	}
	return v.More == o.More && slices.Equal(v.Links, o.Links) && slices.Equal(v.Problems, o.Problems)
}

// MaxDatapathMessage bounds DatapathStatus.Message, in bytes.
const MaxDatapathMessage = 1024

// DatapathStatus is whether the agent's datapath can work on its Node.
type DatapathStatus struct {
	// Supported is false when the check found evidence that Pod traffic
	// bypasses the host's IP stack.
	Supported bool `json:"supported"`
	// Reason is v1alpha1.ReasonHostStack or v1alpha1.ReasonHostStackBypass (CamelCase, as a
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

// Sort orders Bound, Refused and Conflicts by IP, as Lookup,
// LookupRefused and LookupConflict require.
func (r *Report) Sort() {
	slices.SortFunc(r.Conflicts, func(a, b ConflictIP) int { return a.IP.Compare(b.IP) })
	slices.SortFunc(r.Bound, func(a, b BoundIP) int { return a.IP.Compare(b.IP) })
	slices.SortFunc(r.Refused, func(a, b RefusedIP) int { return a.IP.Compare(b.IP) })
}

// Handler serves the report returned by current on GET Path, ignoring
// what the poll carries.
func Handler(current func() Report) http.Handler {
	return PollHandler(func(Poll) Report { return current() })
}

// ReleaseParam is the query parameter of a poll that carries one Release
// (repeated, one per Release): "ip,uid,resourceVersion,name".
const ReleaseParam = "release"

// MaxReleases bounds the Releases one poll carries (the query of one GET
// stays a few tens of KiB); the controller sends the rest in later polls.
const MaxReleases = 512

// Release is the controller's instruction, carried by a poll, that the
// polled Node must give up IP: the controller's view of Egress UID at
// ResourceVersion no longer assigns IP to that Node (status.egressNode was
// cleared or names another Node), while the Node still reports IP bound.
// The agent releases IP even when its own cache, older than
// ResourceVersion, still assigns it, and does not bind it again for that
// Egress until its cache shows the Egress at ResourceVersion or newer
// (resource versions of one resource compare as integers, KEP-5504).
type Release struct {
	// IP is the egress IP to release, in canonical form.
	IP netip.Addr
	// UID is the Egress's metadata.uid.
	UID string
	// ResourceVersion is the Egress's metadata.resourceVersion in the
	// controller's view (a status no longer naming the Node).
	ResourceVersion string
	// Egress is the Egress's name (for logs).
	Egress string
}

// String is the Release in its query form.
func (r Release) String() string {
	return r.IP.String() + "," + r.UID + "," + r.ResourceVersion + "," + r.Egress
}

// parseRelease parses the query form of a Release.
func parseRelease(s string) (Release, error) {
	f := strings.Split(s, ",")
	if len(f) != 4 {
		return Release{}, fmt.Errorf("release %q: want ip,uid,resourceVersion,name", s)
	}
	ip, err := netip.ParseAddr(f[0])
	if err != nil {
		return Release{}, fmt.Errorf("release %q: %w", s, err)
	}
	if f[1] == "" || f[2] == "" {
		return Release{}, fmt.Errorf("release %q: empty uid or resourceVersion", s)
	}
	return Release{IP: ip.Unmap(), UID: f[1], ResourceVersion: f[2], Egress: f[3]}, nil
}

// AcquireParam is the query parameter of a poll that carries one Acquire
// (repeated, one per Acquire), in the form of a Release.
const AcquireParam = "acquire"

// Acquire is the controller's instruction, carried by a poll, that the
// polled Node bind IP for Egress UID before the Egress's status says so:
// the Egress's Node is dead, the pass has chosen the polled Node for it,
// and the controller holds back the status patch of the move until the
// polled Node reports IP bound and announced, so that the move and Ready
// are one patch instead of two (docs/failover.md, "Failover at scale").
// ResourceVersion is the Egress's version in the controller's view: the
// agent takes the instruction only while its cache shows the Egress at
// that version (with status.egressIP IP) and drops it once a poll no
// longer carries it, or once its cache shows a newer version (the status
// written, which then decides alone).
type Acquire struct {
	// IP is the egress IP to bind, in canonical form.
	IP netip.Addr
	// UID is the Egress's metadata.uid.
	UID string
	// ResourceVersion is the Egress's metadata.resourceVersion in the
	// controller's view (a status still naming the dead Node).
	ResourceVersion string
	// Egress is the Egress's name.
	Egress string
}

// String is the Acquire in its query form.
func (a Acquire) String() string { return Release(a).String() }

// Poll is what one poll of the report carries from the controller.
type Poll struct {
	// Releases are the IPs the controller waits for this Node to release.
	Releases []Release
	// Acquires are the IPs the controller asks this Node to bind before
	// it writes their move (at most MaxReleases).
	Acquires []Acquire
}

// ParsePoll reads a poll's query. It fails for a malformed Release or
// Acquire, or more than MaxReleases of either.
func ParsePoll(q url.Values) (Poll, error) {
	rs, as := q[ReleaseParam], q[AcquireParam]
	if len(rs) > MaxReleases {
		return Poll{}, fmt.Errorf("%d releases in one poll, at most %d", len(rs), MaxReleases)
	}
	if len(as) > MaxReleases {
		return Poll{}, fmt.Errorf("%d acquires in one poll, at most %d", len(as), MaxReleases)
	}
	var p Poll
	for _, s := range rs {
		r, err := parseRelease(s)
		if err != nil {
			return Poll{}, err
		}
		p.Releases = append(p.Releases, r)
	}
	for _, s := range as {
		r, err := parseRelease(s)
		if err != nil {
			return Poll{}, fmt.Errorf("acquire: %w", err)
		}
		if r.Egress == "" {
			return Poll{}, fmt.Errorf("acquire %q: empty Egress name", s)
		}
		p.Acquires = append(p.Acquires, Acquire(r))
	}
	return p, nil
}

// PollHandler serves the report returned by current on GET Path; current
// receives what the poll carries (Poll). A malformed poll gets HTTP 400.
func PollHandler(current func(Poll) Report) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+Path, func(w http.ResponseWriter, req *http.Request) {
		p, err := ParsePoll(req.URL.Query())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r := current(p)
		r.Sort()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(r)
	})
	return mux
}

// Client polls agents.
type Client struct {
	// HTTP is the client of plain-HTTP polls (TLS nil); its Timeout bounds
	// one poll.
	HTTP *http.Client
	// Port is the agent's report port on every Node.
	Port int
	// TLS, when set, returns the TLS configuration of a poll of a Node's
	// agent (agentcert.ClientConfig: mutual TLS, the server verified as
	// that Node's agent); polls then go over HTTPS, one connection pool
	// per Node. nil polls over plain HTTP (tests of the controller alone;
	// the controller binary always sets it).
	TLS func(node string) *tls.Config

	timeout time.Duration
	mu      sync.Mutex
	perNode map[string]*nodeClient
}

// nodeClient is the HTTPS client of one Node's agent at one address: a
// connection verified for that Node is never reused for another.
type nodeClient struct {
	host netip.Addr
	http *http.Client
}

// NewClient returns a client whose polls time out after timeout.
func NewClient(port int, timeout time.Duration) *Client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: timeout}).DialContext,
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     30 * time.Second,
	}
	return &Client{HTTP: &http.Client{Timeout: timeout, Transport: tr}, Port: port, timeout: timeout}
}

// Get fetches the report of the agent at host (a Node IP) over plain
// HTTP, carrying p in the query (at most MaxReleases Releases and as many
// Acquires; agents that
// predate Poll ignore it). It returns an error when the agent does not
// answer in time or answers something else than a report.
func (c *Client) Get(ctx context.Context, host netip.Addr, p Poll) (Report, error) {
	return c.get(ctx, c.HTTP, "http", host, p)
}

// Poll fetches the report of node's agent at host: over mutual TLS when
// c.TLS is set (a handshake refused because the server is not node's agent
// returns an error wrapping *agentcert.RefusedError), else as Get. p
// rides in the query as for Get.
func (c *Client) Poll(ctx context.Context, node string, host netip.Addr, p Poll) (Report, error) {
	if c.TLS == nil {
		return c.Get(ctx, host, p)
	}
	return c.get(ctx, c.nodeHTTP(node, host), "https", host, p)
}

// Forget drops the connections of every Node not in keep.
func (c *Client) Forget(keep map[string]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for n, nc := range c.perNode {
		if !keep[n] {
			nc.http.CloseIdleConnections()
			delete(c.perNode, n)
		}
	}
}

func (c *Client) nodeHTTP(node string, host netip.Addr) *http.Client {
	c.mu.Lock()
	defer c.mu.Unlock()
	if nc, ok := c.perNode[node]; ok && nc.host == host {
		return nc.http
	} else if ok {
		nc.http.CloseIdleConnections()
	}
	timeout := c.timeout
	if timeout <= 0 {
		timeout = c.HTTP.Timeout
	}
	tr := &http.Transport{
		DialTLSContext:      dialTLS(c.TLS(node), timeout),
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     30 * time.Second,
	}
	nc := &nodeClient{host: host, http: &http.Client{Timeout: timeout, Transport: tr}}
	if c.perNode == nil {
		c.perNode = map[string]*nodeClient{}
	}
	c.perNode[node] = nc
	return nc.http
}

// dialTLS dials TCP, then completes the TLS handshake with cfg before any
// request is written, bounded by ctx.
func dialTLS(cfg *tls.Config, timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{Timeout: timeout}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		raw, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		conn := tls.Client(raw, cfg)
		if err := conn.HandshakeContext(ctx); err != nil {
			_ = raw.Close()
			return nil, fmt.Errorf("TLS handshake: %w", err)
		}
		return conn, nil
	}
}

func (c *Client) get(ctx context.Context, hc *http.Client, scheme string, host netip.Addr, p Poll) (Report, error) {
	u := scheme + "://" + net.JoinHostPort(host.String(), strconv.Itoa(c.Port)) + Path
	if len(p.Releases) > 0 || len(p.Acquires) > 0 {
		q := url.Values{}
		for _, r := range p.Releases[:min(len(p.Releases), MaxReleases)] {
			q.Add(ReleaseParam, r.String())
		}
		for _, a := range p.Acquires[:min(len(p.Acquires), MaxReleases)] {
			q.Add(AcquireParam, a.String())
		}
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return Report{}, fmt.Errorf("build report request: %w", err)
	}
	resp, err := hc.Do(req)
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
