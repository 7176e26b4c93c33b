package agent

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	v1alpha1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agent/datapathsync"
	"github.com/egressip/egressip/internal/agent/fence"
	"github.com/egressip/egressip/internal/agentcert"
	"github.com/egressip/egressip/internal/podstart"
	"github.com/egressip/egressip/internal/report"
	"github.com/egressip/egressip/internal/selection"
)

// ControllerName names the agent's controller in logs and in
// controller-runtime's metrics.
const ControllerName = "egressip-agent"

// NodeNameEnv is the environment variable holding the Node name when
// --node-name is not given (set from spec.nodeName by the downward API).
const NodeNameEnv = "NODE_NAME"

// PodNamespaceEnv is the environment variable holding the agent's
// namespace, where the agent CA's ConfigMap is (set from
// metadata.namespace by the downward API).
const PodNamespaceEnv = "POD_NAMESPACE"

// ResolveNodeName returns flagValue when it is set, else the value of
// NodeNameEnv looked up with getenv. It fails when both are empty.
func ResolveNodeName(flagValue string, getenv func(string) string) (string, error) {
	if flagValue != "" {
		return flagValue, nil
	}
	if v := getenv(NodeNameEnv); v != "" {
		return v, nil
	}
	return "", fmt.Errorf("node name unknown: pass --node-name or set %s (in a DaemonSet: env %s from fieldRef spec.nodeName)", NodeNameEnv, NodeNameEnv)
}

// NewScheme returns a scheme with the built-in Kubernetes types and
// egressip.io/v1alpha1. It fails only if registering a type fails.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(s); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(s); err != nil {
		return nil, err
	}
	return s, nil
}

// CacheOptions restricts the cache to what the agent of node may read:
// every Egress (an Egress with spec.ips names its holders in
// status.ips[*].node, which no field selector can select, so the binding
// loop reads the cache through HolderIndex instead), unrestricted, the
// ExternalIPPools, and the Nodes (stripped). Reading any type without a
// registered informer fails instead of silently starting a cluster-wide
// informer. managedFields are dropped from cached objects
// (docs/architecture.md, "How an agent finds its IPs").
func CacheOptions(node string) cache.Options {
	_ = node // every Egress is cached; the holder index selects this Node's
	return cache.Options{
		ByObject: map[client.Object]cache.ByObject{
			// The fencer's peer candidates (started only with fencing on).
			&corev1.Node{}: {Transform: stripNode},
		},
		ReaderFailOnMissingInformer: true,
		DefaultTransform:            cache.TransformStripManagedFields(),
	}
}

// DatapathCacheOptions is CacheOptions for an agent that also programs
// the datapath (package datapathsync's Reconciler): every Egress (their status gives the
// roles: which Node holds each IP), the pools, every Namespace, every Node
// (addresses and Pod CIDRs only), the EgressMemberSlices, and this Node's
// Pods alone (listed and watched with the field selector
// spec.nodeName=<node>, reduced by selection.StripPod), so no agent holds
// the cluster's Pods. All slices are cached rather than those of the
// Egresses this Node holds: a failover then needs no new List before the
// new egress Node can return remote members' traffic, and a slice carries
// only {podIP, hostIP} pairs of selected Pods (about 60 bytes each).
func DatapathCacheOptions(node string) cache.Options {
	return cache.Options{
		ByObject: map[client.Object]cache.ByObject{
			&corev1.Pod{}:  {Field: fields.OneTermEqualSelector("spec.nodeName", node), Transform: selection.StripPod},
			&corev1.Node{}: {Transform: stripNode},
		},
		ReaderFailOnMissingInformer: true,
		DefaultTransform:            cache.TransformStripManagedFields(),
	}
}

// stripNode keeps of a Node its name, labels (the fencer's peer selector),
// resource version, Pod CIDRs and addresses (a cache transform).
func stripNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil
	}
	return &corev1.Node{
		TypeMeta:   n.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion, Labels: n.Labels},
		Spec:       corev1.NodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs},
		Status:     corev1.NodeStatus{Addresses: n.Status.Addresses},
	}, nil
}

// RESTMapper maps the only kinds the agent reads, Egress, ExternalIPPool
// and Node (the fencer's peers), all cluster-scoped, without asking the API server. The
// default mapper runs discovery when the manager is created, which would
// make the agent fail to start, and so stop serving its report, while the
// API server is unreachable. Reading any other kind fails with a "no
// matches for kind" error.
func RESTMapper() meta.RESTMapper {
	return restMapper(false)
}

// DatapathRESTMapper is RESTMapper plus the kinds the datapath reconciler
// (package datapathsync) reads: EgressMemberSlice, Node, Namespace and ServiceCIDR
// (cluster-scoped) and Pod (namespaced).
func DatapathRESTMapper() meta.RESTMapper {
	return restMapper(true)
}

func restMapper(withDatapath bool) meta.RESTMapper {
	m := meta.NewDefaultRESTMapper([]schema.GroupVersion{v1alpha1.GroupVersion, corev1.SchemeGroupVersion, networkingv1.SchemeGroupVersion})
	for _, kind := range []string{"Egress", "ExternalIPPool"} {
		m.Add(v1alpha1.GroupVersion.WithKind(kind), meta.RESTScopeRoot)
	}
	// Nodes: the fencer's peer candidates, and the datapath's tunnel peers.
	m.Add(corev1.SchemeGroupVersion.WithKind("Node"), meta.RESTScopeRoot)
	if withDatapath {
		m.Add(v1alpha1.GroupVersion.WithKind("EgressMemberSlice"), meta.RESTScopeRoot)
		m.Add(corev1.SchemeGroupVersion.WithKind("Namespace"), meta.RESTScopeRoot)
		m.Add(corev1.SchemeGroupVersion.WithKind("Pod"), meta.RESTScopeNamespace)
		// Only watched once discovery shows it is served (watchServiceCIDRs).
		m.Add(networkingv1.SchemeGroupVersion.WithKind("ServiceCIDR"), meta.RESTScopeRoot)
	}
	return m
}

// NewManager returns a controller-runtime manager for the agent of node: the
// egressip scheme (unless opts.Scheme is set), the cache of CacheOptions,
// RESTMapper (unless opts.MapperProvider is set), so creating it needs no
// API server, and no leader election (every Node runs its own agent).
// opts.Cache is replaced but for its DefaultWatchErrorHandler (pass
// Agent.WatchErrorHandler, so that arrivals after a watch error are seen).
// Other fields of opts
// (metrics, health probes, logger) are used as given. It fails when the
// scheme cannot be built or the manager cannot be created from cfg.
func NewManager(cfg *rest.Config, node string, opts manager.Options) (manager.Manager, error) {
	return newManager(cfg, node, false, opts)
}

// NewDatapathManager is NewManager with DatapathCacheOptions and
// DatapathRESTMapper, for an agent that runs the datapath reconciler
// (package datapathsync) too.
func NewDatapathManager(cfg *rest.Config, node string, opts manager.Options) (manager.Manager, error) {
	return newManager(cfg, node, true, opts)
}

func newManager(cfg *rest.Config, node string, withDatapath bool, opts manager.Options) (manager.Manager, error) {
	if opts.Scheme == nil {
		s, err := NewScheme()
		if err != nil {
			return nil, fmt.Errorf("build scheme: %w", err)
		}
		opts.Scheme = s
	}
	weh := opts.Cache.DefaultWatchErrorHandler // the one field of opts.Cache kept (Agent.WatchErrorHandler)
	opts.Cache = CacheOptions(node)
	if withDatapath {
		opts.Cache = DatapathCacheOptions(node)
	}
	opts.Cache.DefaultWatchErrorHandler = weh
	opts.LeaderElection = false
	if opts.MapperProvider == nil {
		opts.MapperProvider = func(*rest.Config, *http.Client) (meta.RESTMapper, error) { return restMapper(withDatapath), nil }
	}
	mgr, err := ctrl.NewManager(cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("create manager: %w", err)
	}
	return mgr, nil
}

// SetupWithManager registers the agent's controller with mgr, whose cache
// must have been built with CacheOptions (NewManager does so). Every
// Egress and ExternalIPPool event, a start-up trigger and the periodic
// resync all map to one work key, so reconciles of this Node never overlap
// and bursts of events coalesce. The controller's workers start only once
// both informers have completed their first List, and the controller waits
// for that without a practical time limit (it does not give up and exit
// during an outage): the agent never acts on an unsynced cache. It fails
// when the controller cannot be built.
//
// The informers are deliberately not registered before the manager starts:
// controller-runtime v0.25's manager spins in Start, never returning, when
// its context is cancelled while it waits for informers registered that
// early to sync (as during an outage at start-up); the controller's own
// wait ends cleanly on cancellation.
func (a *Agent) SetupWithManager(mgr manager.Manager) error {
	a.reader = mgr.GetCache()
	a.indexer = mgr.GetFieldIndexer()
	a.apiReader = mgr.GetAPIReader()
	a.log = mgr.GetLogger().WithName("agent").WithValues("node", klog.KRef("", a.cfg.NodeName))

	key := reconcile.Request{NamespacedName: types.NamespacedName{Name: a.cfg.NodeName}}
	toNode := handler.EnqueueRequestsFromMapFunc(func(context.Context, client.Object) []reconcile.Request {
		return []reconcile.Request{key}
	})
	// One reconcile at start-up even when nothing is assigned to this Node,
	// so owned addresses no longer assigned are removed.
	kick := source.Func(func(_ context.Context, q workqueue.TypedRateLimitingInterface[reconcile.Request]) error {
		q.Add(key)
		return nil
	})
	if err := mgr.Add(manager.RunnableFunc(a.runConflictChecks)); err != nil {
		return fmt.Errorf("add the duplicate-IP checker: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named(ControllerName).
		Watches(&v1alpha1.Egress{}, a.egressEvents(key)).
		Watches(&v1alpha1.ExternalIPPool{}, toNode).
		WatchesRawSource(kick).
		WatchesRawSource(source.Channel(a.kick, toNode)).
		WithOptions(controller.Options{
			MaxConcurrentReconciles: 1,
			RateLimiter: workqueue.NewTypedItemExponentialFailureRateLimiter[reconcile.Request](
				100*time.Millisecond, a.cfg.ResyncPeriod),
			// Several agents share a process in tests; names need not be unique.
			SkipNameValidation: new(true),
			// Wait for the first List for as long as it takes, rather
			// than exit (and stop serving the report) during an outage.
			CacheSyncTimeout: 100 * 365 * 24 * time.Hour,
		}).
		WithLogConstructor(func(*reconcile.Request) logr.Logger {
			return mgr.GetLogger().WithValues("controller", ControllerName, "node", klog.KRef("", a.cfg.NodeName))
		}).
		Complete(a)
}

// Handler is everything the agent serves on its report port: the report
// the controller polls (report.Path; each GET is noted as a controller poll,
// see LastControllerPoll, and its release instructions taken, see onPoll) and the peer probe of other agents' fencers
// (fence.Path). It is the one place the report port's handler is built.
func (a *Agent) Handler() http.Handler {
	var peer, poll http.Handler
	peer = fence.PeerHandler(a.cfg.NodeName, a.lastPollOrStart, a.Fenced, nil)
	// onPoll notes each poll (LastControllerPoll) and takes its release
	// instructions.
	poll = report.PollHandler(a.onPoll)
	if a.certs != nil {
		// Over mutual TLS only the controller may poll (a poll carries
		// release instructions and counts as the controller's), and
		// only other agents may ask the fencing question.
		peer = agentcert.Authorize(peer, agentcert.AnyAgent)
		poll = agentcert.Authorize(poll, agentcert.OnlyController)
	}
	mux := http.NewServeMux()
	mux.Handle(fence.Path, peer)
	mux.Handle("/", poll)
	return mux
}

// ServeReport serves the agent's report (package report) on ln until ctx is
// done, then shuts the server down (waiting up to 5 s for open requests). It
// returns nil after a shutdown caused by ctx, else the server's error.
//
// With certificates (SetCertificates) it first waits for the agent's
// certificate and CA bundle, then serves over mutual TLS (the controller's
// client certificate required for the report); until then connections wait
// in the listen queue, so a poll meanwhile times out as for an absent agent
// instead of seeing a failed handshake.
func (a *Agent) ServeReport(ctx context.Context, ln net.Listener) error {
	if a.certs != nil {
		if err := a.certs.WaitReady(ctx); err != nil {
			return nil // ctx done before a certificate came
		}
		ln = tls.NewListener(ln, a.certs.ServerConfig())
	}
	srv := &http.Server{
		Handler:           a.Handler(),
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      10 * time.Second,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve report on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("shut down report server: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serve report on %s: %w", ln.Addr(), err)
	}
	return nil
}

// startCertificates starts the agent's identity (agentcert.Source) of
// cfg and makes the report server use it; nil cfg does nothing.
func (a *Agent) startCertificates(ctx context.Context, cfg *agentcert.SourceConfig) error {
	if cfg == nil {
		return nil
	}
	log := logr.FromContextOrDiscard(ctx)
	src, err := agentcert.NewSource(*cfg)
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	if err := src.Start(logr.NewContext(ctx, log)); err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	a.SetCertificates(src)
	return nil
}

// readyChecks are the agent's readiness checks: a reconcile completed and,
// with certificates, the certificate and CA bundle are there (so a surge
// update stops the old agent only once this one can answer the
// controller).
func (a *Agent) readyChecks() map[string]healthz.Checker {
	ready := map[string]healthz.Checker{"reconciled": a.ReadyCheck}
	if a.certs != nil {
		ready["certificate"] = func(*http.Request) error {
			if !a.certs.Ready() {
				return errors.New("no agent certificate or CA bundle yet (waiting for the CertificateSigningRequest to be signed)")
			}
			return nil
		}
	}
	return ready
}

// SetCertificates makes the report server use mutual TLS with the
// identity of src (call before ServeReport).
func (a *Agent) SetCertificates(src *agentcert.Source) { a.certs = src }

// RunOptions configure Run.
type RunOptions struct {
	Config
	// REST reaches the API server. Required.
	REST *rest.Config
	// ReportBindAddress is the listen address of the report server;
	// empty means ":9445" (report.DefaultPort).
	ReportBindAddress string
	// ReportListener, when set, is used instead of ReportBindAddress.
	// Run closes it.
	ReportListener net.Listener
	// MetricsBindAddress is the listen address of the metrics server; "0"
	// or empty turns it off.
	MetricsBindAddress string
	// MetricsSecure serves the metrics over HTTPS with authentication and
	// authorization (controller-runtime's filters.WithAuthenticationAndAuthorization:
	// a bearer token checked with a TokenReview, GET /metrics allowed by a
	// SubjectAccessReview, as the controller's), with the agent's own
	// certificate when Certificates is set. false serves plain HTTP.
	MetricsSecure bool
	// Certificates, when set, is the agent's identity (agentcert): the
	// report is served over mutual TLS to the controller alone. nil serves
	// it over plain HTTP, which egressip-controller refuses (tests only).
	Certificates *agentcert.SourceConfig
	// HealthProbeBindAddress serves /healthz and /readyz; "0" or empty
	// turns it off.
	HealthProbeBindAddress string
	// HealthProbeSocket, when set, is the path of a unix socket serving
	// /healthz and /readyz of this process alone (`egressip-agent probe`
	// reads it from an exec probe): unlike the host-network port, which
	// two agents share during a surge rolling update, it tells the kubelet
	// whether this Pod's agent is ready. A stale socket file is replaced.
	HealthProbeSocket string
	// Datapath, when set, is the engine a datapath reconciler (package
	// datapathsync) programs beside the bindings (the manager then caches
	// what it needs, see DatapathCacheOptions); nil runs the bindings alone.
	Datapath datapathsync.Datapath
	// CIDRs are the destinations kept off egress paths (Datapath only).
	CIDRs datapathsync.CIDRs
	// PoolRoutes, when set with Datapath, routes the egress IPs held on a
	// non-default link through that link (Engine.NewPoolRouting).
	PoolRoutes *datapathsync.PoolRouting
	// HostCheck, when set with Datapath, checks on every datapath
	// reconcile whether the CNI bypasses the host stack; the finding is
	// served in the report (report.Report.Datapath).
	HostCheck datapathsync.HostStackCheck
	// PodStart, when set with Datapath, serves the egressip-cni plugin
	// (and installs it when PodStart.ConfDir is set) so that a new Pod is
	// classified before it can send; its Gate is the datapath reconciler.
	PodStart *podstart.Options
	// Kernel, when set, is the start-up kernel feature finding
	// (RecordKernel) served in the report.
	Kernel *report.KernelStatus
	// Fence configures self-fencing (package fence); a zero Timeout turns
	// it off. Run refuses a configuration that fails fence.Config.Validate.
	Fence fence.Config
	// PeerSelector selects the Nodes that run an agent, the candidates of
	// the fencer's peer set; nil means every Node.
	PeerSelector labels.Selector
}

// Run runs the agent until ctx is done: it creates the Agent (New), starts
// the report server at once (so the controller sees the agent alive and the
// addresses it already holds while the cache syncs), then runs the manager.
// When ctx is done it stops announcing and returns without unbinding
// anything. It returns nil after ctx is done, and an error when anything
// fails to start or the manager or the report server fails.
func Run(ctx context.Context, o RunOptions) (err error) {
	log := ctrl.Log.WithName("agent").WithValues("node", klog.KRef("", o.NodeName))
	// What Run starts logs through the context's logger (log.FromContext).
	ctx = logr.NewContext(ctx, log)
	if o.REST == nil {
		return errors.New("agent: no REST config")
	}
	ls, err := openListeners(ctx, o)
	if err != nil {
		return err
	}
	defer ls.close()

	a, err := New(o.Config)
	if err != nil {
		return err
	}
	a.SetKernelStatus(o.Kernel)
	if err := a.startCertificates(ctx, o.Certificates); err != nil {
		_ = a.Close()
		return err
	}
	defer func() {
		if cerr := a.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("agent: close: %w", cerr))
		}
		log.Info("stopped; egress IPs stay bound for the next agent instance")
	}()
	defer a.startRenewal(ctx)() // stopped before Close

	mgr, err := a.newRunManager(o, ls.reportAddr, log)
	if err != nil {
		return err
	}
	ready := a.readyChecks()
	if err := ls.addHealthServers(mgr, ready); err != nil {
		return err
	}

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The report is served until the manager has stopped, not only until
	// the SIGTERM: the addresses stay bound and renewed while the agent
	// exits, so the controller must go on seeing it alive. A shutdown that
	// outlasted --agent-dead-after with the report port already closed got
	// the IPs moved while this Node still held them (two Nodes answered in
	// TestAgentRestart, 2 of 20 e2e runs in the flake sweep).
	repCtx, repCancel := context.WithCancel(context.WithoutCancel(ctx))
	defer repCancel()
	repErr := make(chan error, 1)
	var lateHealth sync.WaitGroup // the health server a surge agent opens late
	defer func() { cancel(); lateHealth.Wait() }()
	go func() {
		repErr <- ls.serveReport(runCtx, repCtx, cancel, a, ready, &lateHealth)
	}()
	if ls.surge {
		log.Info("starting beside another agent of this Node (surge rolling update): the report and health ports open once reconciled", "instance", a.Instance())
	} else {
		log.Info("starting", "instance", a.Instance(), "report", ls.report.Addr().String())
	}
	mgrErr := mgr.Start(runCtx)
	cancel()
	repCancel()
	err = errors.Join(mgrErr, <-repErr)
	if err != nil && ctx.Err() != nil {
		// Shutting down as asked; a controller interrupted while waiting
		// for its first List reports that as an error.
		log.Info("error while stopping", "err", err)
		return nil
	}
	if err != nil {
		return fmt.Errorf("agent: %w", err)
	}
	return nil
}

// runListeners are the listeners Run serves the report and the health
// probes on, opened before anything else so that a port already taken
// fails the start at once.
type runListeners struct {
	// reportAddr and healthAddr are the report's and the health probes'
	// listen addresses (healthAddr empty: no health port).
	reportAddr, healthAddr string
	// surge: another agent of this Node (the old Pod of a surge rolling
	// update) serves the report. This one then opens its report and health
	// ports only once it has reconciled (serveReport), so that the
	// controller's polls never reach an agent that has not yet adopted and
	// announced the Node's IPs; until then the old agent answers them all.
	surge bool
	// report, health and socket are the report's, the health port's and
	// the health socket's listeners; nil when not opened (yet).
	report, health, socket net.Listener
}

// openListeners opens the report and health listeners of o (none of the
// host-network ones in a surge), and the health socket. The error names
// the listener that failed; the ones opened before it are closed again.
func openListeners(ctx context.Context, o RunOptions) (_ *runListeners, err error) {
	ls := &runListeners{reportAddr: o.ReportBindAddress, healthAddr: o.HealthProbeBindAddress}
	defer func() {
		if err != nil {
			ls.close() // what opened before the failure (and o.ReportListener, as on success)
		}
	}()
	if ls.reportAddr == "" {
		ls.reportAddr = fmt.Sprintf(":%d", report.DefaultPort)
	}
	if ls.healthAddr == "0" {
		ls.healthAddr = ""
	}
	ls.surge = o.ReportListener == nil && portTaken(ls.reportAddr)
	ls.report = o.ReportListener
	if !ls.surge {
		if ls.report == nil {
			if ls.report, err = listenShared(ctx, ls.reportAddr); err != nil {
				return nil, fmt.Errorf("agent: listen for the report: %w", err)
			}
		}
		if ls.healthAddr != "" {
			if ls.health, err = listenShared(ctx, ls.healthAddr); err != nil {
				return nil, fmt.Errorf("agent: listen for the health probes: %w", err)
			}
		}
	}
	if o.HealthProbeSocket != "" {
		if ls.socket, err = listenUnix(o.HealthProbeSocket); err != nil {
			return nil, fmt.Errorf("agent: listen for the health probes: %w", err)
		}
	}
	return ls, nil
}

// close closes the listeners opened by openListeners.
func (ls *runListeners) close() {
	for _, l := range []net.Listener{ls.report, ls.health, ls.socket} {
		if l != nil {
			_ = l.Close() // usually already closed by its server
		}
	}
}

// addHealthServers adds to mgr a server of the ready checks on the health
// port and on the health socket, for each that is open.
func (ls *runListeners) addHealthServers(mgr manager.Manager, ready map[string]healthz.Checker) error {
	for _, l := range []net.Listener{ls.health, ls.socket} {
		if l == nil {
			continue
		}
		if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
			return serveHealth(ctx, l, ready)
		})); err != nil {
			return fmt.Errorf("agent: add the health probe server: %w", err)
		}
	}
	return nil
}

// serveReport serves a's report until repCtx is done. In a surge it first
// waits until a has reconciled, then opens the report port and the health
// port (served under lateHealth until runCtx is done); it returns nil at
// once when runCtx ends before. On a failure it calls cancel (stopping the
// manager too) and returns the error. It logs through runCtx's logger.
func (ls *runListeners) serveReport(runCtx, repCtx context.Context, cancel context.CancelFunc, a *Agent,
	ready map[string]healthz.Checker, lateHealth *sync.WaitGroup) error {
	log := logr.FromContextOrDiscard(runCtx)
	l := ls.report
	if ls.surge {
		var (
			hl  net.Listener
			err error
		)
		if l, hl, err = openWhenReady(runCtx, a, ls.reportAddr, ls.healthAddr); err != nil || l == nil {
			if err != nil {
				cancel()
			}
			return err
		}
		if hl != nil {
			lateHealth.Go(func() {
				if err := serveHealth(runCtx, hl, ready); err != nil {
					log.Error(err, "health probe server stopped")
				}
			})
		}
		log.Info("reconciled: serving the report and health probes beside the other agent of this Node", "report", ls.reportAddr)
	}
	err := a.ServeReport(repCtx, l)
	if err != nil {
		cancel() // stop the manager too
	}
	return err
}

// newRunManager creates the agent's manager (with the datapath's cache
// when o.Datapath is set) and sets up in it the agent (setupAgent), the
// datapath reconciler with the CNI plugin's server, and the reject queue.
func (a *Agent) newRunManager(o RunOptions, reportAddr string, log logr.Logger) (manager.Manager, error) {
	off := func(s string) string {
		if s == "" {
			return "0"
		}
		return s
	}
	newMgr := NewManager
	if o.Datapath != nil {
		newMgr = NewDatapathManager
	}
	// Every listener on the host network is opened with SO_REUSEPORT so
	// that a surge rolling update can run two agents on one Node (see
	// reusePort); the health probes are served by serveHealth for that
	// reason, not by the manager.
	mgr, err := newMgr(o.REST, o.NodeName, manager.Options{
		Metrics:                MetricsOptions(off(o.MetricsBindAddress), o.MetricsSecure, a.certs),
		HealthProbeBindAddress: "0",
		Cache:                  cache.Options{DefaultWatchErrorHandler: a.WatchErrorHandler},
	})
	if err != nil {
		return nil, fmt.Errorf("agent: %w", err)
	}
	if err := setupAgent(mgr, a, o, reportAddr, log); err != nil {
		return nil, err
	}
	if o.Datapath != nil {
		dr := &datapathsync.Reconciler{NodeName: o.NodeName, DP: o.Datapath, CIDRs: o.CIDRs, ResyncPeriod: o.ResyncPeriod, OnRefused: a.SetRefusedEgresses,
			PoolRoutes: o.PoolRoutes}
		if o.HostCheck != nil {
			dr.HostCheck, dr.OnFinding = o.HostCheck, a.SetDatapathStatus
		}
		if err := dr.SetupWithManager(mgr); err != nil {
			return nil, fmt.Errorf("agent: set up datapath controller: %w", err)
		}
		if err := addPodStart(mgr, o.PodStart, dr, log); err != nil {
			return nil, err
		}
	}
	if err := addRejectQueue(mgr, o.Datapath); err != nil {
		return nil, err
	}
	return mgr, nil
}

// startRenewal runs a.RenewAddresses until the returned function is
// called; that function waits for it to end and, with a finite lifetime,
// renews once more, so the next instance (a rolling update) has the whole
// lifetime to adopt the addresses. Renewal goes on after ctx is done (a
// SIGTERM): the manager's shutdown can take longer than the lifetime (5 s
// was seen in CI against a 3 s lifetime), and addresses must not expire
// while the agent is still exiting.
func (a *Agent) startRenewal(ctx context.Context) func() {
	log := logr.FromContextOrDiscard(ctx)
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	var renewing sync.WaitGroup
	renewing.Go(func() { a.RenewAddresses(ctx) })
	return func() {
		cancel()
		renewing.Wait()
		if a.cfg.AddressLifetime > 0 {
			if _, err := a.binder.Renew(); err != nil {
				log.Error(err, "cannot renew the lifetime of the egress IPs on exit")
			}
		}
	}
}

// MetricsOptions serve the agent's metrics on addr, with SO_REUSEPORT
// (reusePort), over HTTPS behind controller-runtime's authentication and
// authorization filter when secure (filters.WithAuthenticationAndAuthorization:
// the bearer token is checked with a TokenReview and GET /metrics with a
// SubjectAccessReview, as on the controller), with the certificate of certs
// when set, else controller-runtime's self-signed one. HTTP/2 is off (its
// rapid-reset CVEs), as on the controller.
func MetricsOptions(addr string, secure bool, certs *agentcert.Source) metricsserver.Options {
	o := metricsserver.Options{BindAddress: addr, ListenConfig: reusePort}
	if !secure {
		return o
	}
	o.SecureServing = true
	o.FilterProvider = filters.WithAuthenticationAndAuthorization
	o.TLSOpts = []func(*tls.Config){func(c *tls.Config) {
		c.NextProtos = []string{"http/1.1"}
		c.MinVersion = tls.VersionTLS12
		if certs != nil {
			c.GetCertificate = certs.GetCertificate
		}
	}}
	return o
}

// addRejectQueue adds the reject queue's server to mgr when dp has one.
func addRejectQueue(mgr manager.Manager, dp datapathsync.Datapath) error {
	rq, ok := dp.(rejectQueue)
	if !ok {
		return nil
	}
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		serveRejectQueue(ctx, rq)
		return nil
	})); err != nil {
		return fmt.Errorf("agent: add the reject queue: %w", err)
	}
	return nil
}

// rejectQueue is the part of the kernel datapath that serves its reject
// queue (datapath.Datapath.ServeRejectQueue).
type rejectQueue interface {
	ServeRejectQueue(ctx context.Context) error
	RejectQueueForm() string
}

// rejectQueueRetry spaces the attempts to (re)bind the reject queue: 1 s
// doubling to 8 s. During a surge rolling update the old agent holds the
// queue (EPERM) until it exits, so the new one takes it over within 8 s.
var rejectQueueRetry = wait.Backoff{Duration: time.Second, Factor: 2, Cap: 8 * time.Second, Steps: math.MaxInt32}

// serveRejectQueue runs rq until ctx is done, binding the queue again
// after a failure (rejectQueueRetry). Meanwhile the ruleset's bypass
// rejects synchronously, so Fail still holds, with IPv6 connects failing
// only on the retransmitted SYN.
func serveRejectQueue(ctx context.Context, rq rejectQueue) {
	log := ctrl.Log.WithName("datapath")
	if rq.RejectQueueForm() == rejectQueueNone {
		log.Info("no reject queue (turned off, or the kernel has neither nft_queue nor nft_compat with xt_NFQUEUE): failurePolicy Fail rejects without it")
		return
	}
	log.Info("serving the reject queue", "form", rq.RejectQueueForm())
	ctx = logr.NewContext(ctx, log)
	b := rejectQueueRetry
	for {
		err := rq.ServeRejectQueue(ctx)
		if ctx.Err() != nil || err == nil {
			return
		}
		d := b.Step()
		log.Info("reject queue unavailable (another agent of this Node may still hold it); failurePolicy Fail rejects without it meanwhile, IPv6 connects then failing on the retransmitted SYN after about 1 s",
			"err", err, "retryIn", d)
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
	}
}

// addPodStart adds the pod-start server (package podstart) to mgr with dr
// as its Gate; a nil o adds nothing.
func addPodStart(mgr manager.Manager, o *podstart.Options, dr *datapathsync.Reconciler, log logr.Logger) error {
	if o == nil {
		return nil
	}
	ps := *o
	ps.Gate = dr
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		return podstart.Run(ctrllog.IntoContext(ctx, log.WithName("podstart")), ps)
	})); err != nil {
		return fmt.Errorf("agent: add the pod-start server: %w", err)
	}
	return nil
}

// setupAgent sets up a's controller with mgr (SetupWithManager), then adds
// the self-fencing runner (package fence) to mgr when
// o.Fence is enabled: peers on the report port of reportAddr, chosen among
// the cached Nodes matching o.PeerSelector, the API server probed through
// o.REST, decisions applied by a.SetFence. It fails when the timings are
// invalid or the API-server probe cannot be built.
func setupAgent(mgr manager.Manager, a *Agent, o RunOptions, reportAddr string, log logr.Logger) error {
	if err := a.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("agent: set up controller: %w", err)
	}
	if !o.Fence.Enabled() {
		return nil
	}
	if err := o.Fence.Validate(); err != nil {
		return fmt.Errorf("agent: fencing: %w", err)
	}
	_, portStr, err := net.SplitHostPort(reportAddr)
	if err != nil {
		return fmt.Errorf("agent: fencing: report address %q: %w", reportAddr, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port <= 0 {
		return fmt.Errorf("agent: fencing: report port %q: want a fixed port (peers are probed there)", portStr)
	}
	probe, err := APIServerProbe(o.REST, o.Fence.ProbeTimeout())
	if err != nil {
		return fmt.Errorf("agent: fencing: %w", err)
	}
	sel := o.PeerSelector
	if sel == nil {
		sel = labels.Everything()
	}
	c := mgr.GetCache()
	f := fence.New(fence.Options{
		Config:     o.Fence,
		Node:       o.NodeName,
		Port:       port,
		LastPoll:   a.lastPollOrStart,
		Candidates: peerCandidates(c, sel),
		ProbeAPI:   probe,
		OnChange:   a.SetFence,
		TLS:        a.peerTLS(),
	})
	log.Info("self-fencing on", "fenceTimeout", o.Fence.Timeout, "peerProbeInterval", o.Fence.ProbeInterval, "peers", o.Fence.Peers,
		"controllerPollInterval", o.Fence.ControllerPollInterval, "controllerDeadAfter", o.Fence.ControllerDeadAfter, "peerSelector", sel.String())
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		// Start the Node informer now (it is not registered before the
		// manager starts, see SetupWithManager), so the peers are known
		// before any outage.
		if _, err := c.GetInformer(ctx, &corev1.Node{}, cache.BlockUntilSynced(false)); err != nil {
			log.Error(err, "fencing: cannot watch Nodes; no peer will be known, so this Node never fences")
		}
		return f.Start(ctrllog.IntoContext(ctx, log))
	})); err != nil {
		return fmt.Errorf("agent: add the fencer: %w", err)
	}
	return nil
}

// peerTLS is the fencer's TLS configuration per peer Node when the report
// port serves mutual TLS (the peer verified as that Node's agent, this
// agent's certificate as the client's), else nil (plain HTTP).
func (a *Agent) peerTLS() func(node string) *tls.Config {
	if a.certs == nil {
		return nil
	}
	return func(node string) *tls.Config { return agentcert.PeerClientConfig(a.certs, node) }
}

// peerCandidates returns the fencer's Candidates: the cached Nodes matching
// sel, each with its first InternalIP (as the controller polls agents);
// nil until the Node informer has synced.
func peerCandidates(c cache.Cache, sel labels.Selector) func(ctx context.Context) []fence.Candidate {
	return func(ctx context.Context) []fence.Candidate {
		inf, err := c.GetInformer(ctx, &corev1.Node{}, cache.BlockUntilSynced(false))
		if err != nil || !inf.HasSynced() {
			return nil
		}
		var nodes corev1.NodeList
		if err := c.List(ctx, &nodes, client.MatchingLabelsSelector{Selector: sel}); err != nil {
			return nil
		}
		out := make([]fence.Candidate, 0, len(nodes.Items))
		for i := range nodes.Items {
			for _, ad := range nodes.Items[i].Status.Addresses {
				if ad.Type != corev1.NodeInternalIP {
					continue
				}
				if ip, err := netip.ParseAddr(ad.Address); err == nil {
					out = append(out, fence.Candidate{Node: nodes.Items[i].Name, Addr: ip.Unmap()})
					break
				}
			}
		}
		return out
	}
}

// APIServerProbe returns the fencer's API-server probe: GET /readyz
// through cfg's credentials on a transport of its own (not the informers'
// shared connections), bounded by timeout. Any HTTP answer, whatever its
// status, counts as reached: the question is whether this Node can talk to
// the API server, not whether the API server is healthy. It fails when
// cfg cannot make a client.
func APIServerProbe(cfg *rest.Config, timeout time.Duration) (func(ctx context.Context) error, error) {
	c := rest.CopyConfig(cfg)
	c.Timeout = timeout
	// A Dial of our own makes client-go build a transport for this client
	// alone (its TLS transport cache skips configs with one).
	c.Dial = (&net.Dialer{Timeout: timeout}).DialContext
	hc, err := rest.HTTPClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("API-server probe client: %w", err)
	}
	base, _, err := rest.DefaultServerUrlFor(c)
	if err != nil {
		return nil, fmt.Errorf("API-server probe URL: %w", err)
	}
	u := base.JoinPath("/readyz").String()
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return fmt.Errorf("build API-server probe: %w", err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			return fmt.Errorf("probe the API server: %w", err)
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		_ = resp.Body.Close()
		return nil
	}, nil
}
