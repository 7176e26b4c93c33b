package agentcert

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/certificate"
	"k8s.io/klog/v2"
)

// DefaultRequestedLifetime is the lifetime an agent asks for (the signer
// may give less: the controller's --agent-cert-lifetime). The CSR API's
// minimum is 10 minutes.
const DefaultRequestedLifetime = 24 * time.Hour

// SourceConfig configures an agent's Source.
type SourceConfig struct {
	// Node is the agent's Node. Required.
	Node string
	// REST reaches the API server as the agent's service account.
	// Required.
	REST *rest.Config
	// Namespace holds the CA ConfigMap CAConfigMapName. Required.
	Namespace string
	// RequestedLifetime is spec.expirationSeconds of each request; 0
	// means DefaultRequestedLifetime.
	RequestedLifetime time.Duration
	// BundleRefresh is how often the CA bundle is read again; 0 means one
	// minute.
	BundleRefresh time.Duration
	// Registerer, when set, receives the rotation metrics.
	Registerer prometheus.Registerer
}

// Source is an agent's identity: a key made in memory (never written) and
// a certificate for it from the CSR API, renewed by client-go's
// certificate manager (the kubelet's: at a jittered 70 to 90 % of the
// lifetime, the old certificate kept until the new one is issued), and the
// CA bundle of the ConfigMap, retried quickly until first read, then read
// again every BundleRefresh. Servers and
// clients take both at every handshake (GetCertificate, Roots), so a
// renewal needs no restart and breaks no connection.
type Source struct {
	cfg  SourceConfig
	mc   *certificate.Config
	kube kubernetes.Interface

	mu    sync.RWMutex
	mgr   certificate.Manager // set by Start
	roots *x509.CertPool
}

// memStore keeps the key and certificate in memory only
// (certificate.Store).
type memStore struct {
	mu   sync.Mutex
	cert *tls.Certificate
}

func (s *memStore) Current() (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cert == nil {
		e := certificate.NoCertKeyError("no certificate issued yet")
		return nil, &e
	}
	return s.cert, nil
}

func (s *memStore) Update(certPEM, keyPEM []byte) (*tls.Certificate, error) {
	c, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("issued certificate: %w", err)
	}
	s.mu.Lock()
	s.cert = &c
	s.mu.Unlock()
	return &c, nil
}

var (
	rotationsOnce sync.Once
	rotations     = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "egressip_agent_certificate_rotation_seconds",
		Help:    "Age in seconds of the agent's certificate when a renewed one replaced it.",
		Buckets: prometheus.ExponentialBuckets(60, 2, 14),
	})
	renewFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "egressip_agent_certificate_renewal_failures_total",
		Help: "Failed attempts to obtain the agent's certificate (request, wait for signing, or storing it).",
	})
)

// NewSource prepares the Source; Start begins requesting. It fails on a
// missing field or a REST config that makes no client.
func NewSource(cfg SourceConfig) (*Source, error) {
	if cfg.Node == "" || cfg.REST == nil || cfg.Namespace == "" {
		return nil, errors.New("agent certificate: Node, REST and Namespace are required")
	}
	if cfg.RequestedLifetime == 0 {
		cfg.RequestedLifetime = DefaultRequestedLifetime
	}
	if cfg.BundleRefresh <= 0 {
		cfg.BundleRefresh = time.Minute
	}
	kube, err := kubernetes.NewForConfig(cfg.REST)
	if err != nil {
		return nil, fmt.Errorf("agent certificate: client: %w", err)
	}
	s := &Source{cfg: cfg, kube: kube}
	mc := &certificate.Config{
		ClientsetFn:                  func(*tls.Certificate) (kubernetes.Interface, error) { return kube, nil },
		Template:                     Template(cfg.Node),
		SignerName:                   SignerName,
		RequestedCertificateLifetime: &cfg.RequestedLifetime,
		Usages:                       Usages,
		CertificateStore:             &memStore{},
		Name:                         "agent-certificate",
	}
	if cfg.Registerer != nil {
		rotationsOnce.Do(func() { cfg.Registerer.MustRegister(rotations, renewFailures) })
		mc.CertificateRotation, mc.CertificateRenewFailure = rotations, renewFailures
	}
	s.mc = mc
	return s, nil
}

// Start requests the first certificate and keeps renewing it, and keeps
// the CA bundle fresh, until ctx is done (logging to ctx's logger); it
// returns at once. It fails only when the certificate manager cannot be
// built.
func (s *Source) Start(ctx context.Context) error {
	log := logr.FromContextOrDiscard(ctx).WithName("certificate")
	mctx := klog.NewContext(ctx, log)
	mc := *s.mc
	mc.Ctx = &mctx
	mgr, err := certificate.NewManager(&mc)
	if err != nil {
		return fmt.Errorf("agent certificate: %w", err)
	}
	s.mu.Lock()
	s.mgr = mgr
	s.mu.Unlock()
	mgr.Start()
	go s.keepBundle(logr.NewContext(ctx, log))
	return nil
}

// firstBundleBackoff spaces the reads of the CA bundle until the first
// succeeds: 200 ms, doubling (10 % jitter), capped at BundleRefresh. An
// agent often starts before the controller has published the bundle (a
// fresh install starts both at once); until the agent has it, it serves no
// report, and the controller declares an agent that never answered dead
// after --agent-dead-after (3 s). So the first read is retried within a
// fraction of that, not once per BundleRefresh.
var firstBundleBackoff = wait.Backoff{Duration: 200 * time.Millisecond, Factor: 2, Jitter: 0.1, Steps: 1 << 30}

// keepBundle reads the CA bundle (logging to ctx's logger) until the first read succeeds (spaced by
// firstBundleBackoff), then again every BundleRefresh, until ctx is done.
// Failures are logged: the first one and every one after the first read,
// when the previous bundle is kept.
func (s *Source) keepBundle(ctx context.Context) {
	log := logr.FromContextOrDiscard(ctx)
	b := firstBundleBackoff
	b.Cap = s.cfg.BundleRefresh
	failures := 0
	_ = wait.ExponentialBackoffWithContext(ctx, b, func(ctx context.Context) (bool, error) {
		err := s.loadBundle(ctx)
		switch {
		case err == nil:
			if failures > 0 {
				log.Info("agent CA bundle read", "failedReads", failures)
			}
			return true, nil
		case failures == 0:
			log.Error(err, "cannot read the agent CA bundle yet; retrying (the controller publishes it when it starts)")
		default:
			log.V(1).Info("cannot read the agent CA bundle yet", "err", err, "failedReads", failures+1)
		}
		failures++
		return false, nil
	})
	// The first read succeeded (or the backoff reached its cap: the
	// refresh below then goes on trying every BundleRefresh).
	select {
	case <-ctx.Done():
		return
	case <-time.After(s.cfg.BundleRefresh):
	}
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		if err := s.loadBundle(ctx); err != nil {
			log.Error(err, "cannot read the agent CA bundle; keeping the previous one")
		}
	}, s.cfg.BundleRefresh)
}

func (s *Source) loadBundle(ctx context.Context) error {
	cm, err := s.kube.CoreV1().ConfigMaps(s.cfg.Namespace).Get(ctx, CAConfigMapName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get ConfigMap %s/%s: %w", s.cfg.Namespace, CAConfigMapName, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM([]byte(cm.Data[CAConfigMapKey])) {
		return fmt.Errorf("ConfigMap %s/%s: no PEM certificate under %s", s.cfg.Namespace, CAConfigMapName, CAConfigMapKey)
	}
	s.mu.Lock()
	s.roots = pool
	s.mu.Unlock()
	return nil
}

// Roots is the current CA bundle (an empty pool before the first read:
// nothing verifies).
func (s *Source) Roots() *x509.CertPool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.roots == nil {
		return x509.NewCertPool()
	}
	return s.roots
}

// Current is the current certificate, nil before the first is issued or
// once it expired.
func (s *Source) Current() *tls.Certificate {
	s.mu.RLock()
	mgr := s.mgr
	s.mu.RUnlock()
	if mgr == nil {
		return nil
	}
	return mgr.Current()
}

var errNoCertificate = errors.New("no agent certificate yet (waiting for the CertificateSigningRequest to be signed)")

// GetCertificate serves the current certificate (tls.Config).
func (s *Source) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	if c := s.Current(); c != nil {
		return c, nil
	}
	return nil, errNoCertificate
}

// GetClientCertificate presents the current certificate as a client
// certificate (peer probes); none before one is issued.
func (s *Source) GetClientCertificate(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	if c := s.Current(); c != nil {
		return c, nil
	}
	return &tls.Certificate{}, nil
}

// Ready reports whether both a certificate and a CA bundle are there.
func (s *Source) Ready() bool {
	s.mu.RLock()
	haveRoots := s.roots != nil
	s.mu.RUnlock()
	return haveRoots && s.Current() != nil
}

// WaitReady waits until Ready or ctx is done (then it returns ctx's
// error).
func (s *Source) WaitReady(ctx context.Context) error {
	return wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(context.Context) (bool, error) {
		return s.Ready(), nil
	})
}

// ServerConfig is the report server's TLS configuration (ServerConfig with
// this Source's certificate and bundle).
func (s *Source) ServerConfig() *tls.Config { return ServerConfig(s.Roots, s.GetCertificate) }
