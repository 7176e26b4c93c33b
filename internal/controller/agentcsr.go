package controller

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/recorder"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/agentcert"
)

// The signer's permissions: it watches CertificateSigningRequests and
// approves and signs those of the signer egressip.io/agent only (the
// signers resource is named). It keeps the agent CA in a Secret and
// publishes its certificate in a ConfigMap of its own namespace (a Role,
// config/rbac/agent_ca_role.yaml, not generated: markers cannot restrict
// a namespace's Secrets by name).
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests,verbs=get;list;watch
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=certificatesigningrequests/approval;certificatesigningrequests/status,verbs=update
// +kubebuilder:rbac:groups=certificates.k8s.io,resources=signers,resourceNames=egressip.io/agent,verbs=approve;sign

// agentCSRs counts agent certificate requests the controller decided.
var agentCSRs = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "egressip_controller_agent_certificates_total",
	Help: "CertificateSigningRequests for the signer egressip.io/agent, by result: issued, or denied (the requester or the request broke a rule).",
}, []string{"result"})

func init() {
	metrics.Registry.MustRegister(agentCSRs)
	agentCSRs.WithLabelValues("issued")
	agentCSRs.WithLabelValues("denied")
}

// DefaultAgentCertLifetime is the longest validity of an agent
// certificate the controller signs.
const DefaultAgentCertLifetime = 24 * time.Hour

// AgentCSRReconciler approves and signs the agents' certificate requests
// (signer agentcert.SignerName) that agentcert.Check accepts, and denies
// the others with the rule they break; it leaves every other signer's
// requests alone.
type AgentCSRReconciler struct {
	Client   client.Client
	Recorder recorder.EventRecorder
	// CA signs.
	CA *agentcert.CA
	// AgentUser is the agent's service-account user name.
	AgentUser string
	// Lifetime caps the validity of an issued certificate (the request's
	// spec.expirationSeconds may ask for less). 0 means
	// DefaultAgentCertLifetime.
	Lifetime time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

func csrCondition(csr *certificatesv1.CertificateSigningRequest, t certificatesv1.RequestConditionType) bool {
	for _, c := range csr.Status.Conditions {
		if c.Type == t {
			return true
		}
	}
	return false
}

// Reconcile decides one request: a request already denied or failed, or
// already signed, is left alone; an approved one is signed once it passes
// the check again (someone else may have approved it); a pending one is
// approved and signed, or denied.
func (r *AgentCSRReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var csr certificatesv1.CertificateSigningRequest
	if err := r.Client.Get(ctx, req.NamespacedName, &csr); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	if csr.Spec.SignerName != agentcert.SignerName || len(csr.Status.Certificate) > 0 ||
		csrCondition(&csr, certificatesv1.CertificateDenied) || csrCondition(&csr, certificatesv1.CertificateFailed) {
		return ctrl.Result{}, nil
	}
	logger := log.FromContext(ctx).WithValues("csr", klog.KObj(&csr))
	accepted, err := agentcert.Check(&csr, r.AgentUser)
	if denied, ok := errors.AsType[*agentcert.DenyError](err); ok {
		if csrCondition(&csr, certificatesv1.CertificateApproved) {
			// Approved by someone else, but not ours to sign: fail it.
			csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
				Type: certificatesv1.CertificateFailed, Status: corev1.ConditionTrue, Reason: v1.ReasonAgentCSRDenied,
				Message: denied.Error(), LastUpdateTime: metav1.Now(),
			})
			return ctrl.Result{}, r.write(ctx, &csr, "status", "denied", denied)
		}
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateDenied, Status: corev1.ConditionTrue, Reason: v1.ReasonAgentCSRDenied,
			Message: denied.Error(), LastUpdateTime: metav1.Now(),
		})
		return ctrl.Result{}, r.write(ctx, &csr, "approval", "denied", denied)
	}
	if err != nil {
		return ctrl.Result{}, err
	}
	if !csrCondition(&csr, certificatesv1.CertificateApproved) {
		csr.Status.Conditions = append(csr.Status.Conditions, certificatesv1.CertificateSigningRequestCondition{
			Type: certificatesv1.CertificateApproved, Status: corev1.ConditionTrue, Reason: v1.ReasonAgentNodeIdentity,
			Message: "the agent of Node " + accepted.Node + " asks for its own identity", LastUpdateTime: metav1.Now(),
		})
		if err := r.Client.SubResource("approval").Update(ctx, &csr); err != nil {
			return ctrl.Result{}, fmt.Errorf("approve %s: %w", csr.Name, err)
		}
	}
	now := time.Now
	if r.Now != nil {
		now = r.Now
	}
	lifetime := r.Lifetime
	if lifetime <= 0 {
		lifetime = DefaultAgentCertLifetime
	}
	if s := csr.Spec.ExpirationSeconds; s != nil && time.Duration(*s)*time.Second < lifetime {
		lifetime = time.Duration(*s) * time.Second
	}
	certPEM, err := r.CA.SignAgent(accepted, now(), lifetime)
	if err != nil {
		return ctrl.Result{}, err
	}
	csr.Status.Certificate = certPEM
	if err := r.write(ctx, &csr, "status", "issued", nil); err != nil {
		return ctrl.Result{}, err
	}
	logger.Info("agent certificate issued", "node", klog.KRef("", accepted.Node), "lifetime", lifetime)
	return ctrl.Result{}, nil
}

// write updates csr's subresource and counts the result; a denial is
// logged and recorded as a Warning Event on the request.
func (r *AgentCSRReconciler) write(ctx context.Context, csr *certificatesv1.CertificateSigningRequest, sub, result string, denied error) error {
	if err := r.Client.SubResource(sub).Update(ctx, csr); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return client.IgnoreNotFound(err)
		}
		return fmt.Errorf("%s of %s: %w", sub, csr.Name, err)
	}
	agentCSRs.WithLabelValues(result).Inc()
	if denied != nil {
		log.FromContext(ctx).Info("agent certificate request denied", "csr", klog.KObj(csr), "requester", csr.Spec.Username, "why", denied.Error())
		if r.Recorder != nil {
			r.Recorder.Eventf(csr, nil, corev1.EventTypeWarning, v1.ReasonAgentCSRDenied, "Sign", "%s", denied.Error())
		}
	}
	return nil
}

// SetupWithManager watches the requests of agentcert.SignerName.
func (r *AgentCSRReconciler) SetupWithManager(mgr ctrl.Manager) error {
	ours := predicate.NewPredicateFuncs(func(o client.Object) bool {
		csr, ok := o.(*certificatesv1.CertificateSigningRequest)
		return ok && csr.Spec.SignerName == agentcert.SignerName
	})
	return ctrl.NewControllerManagedBy(mgr).
		Named("egressip-agent-certificates").
		For(&certificatesv1.CertificateSigningRequest{}, builder.WithPredicates(ours)).
		Complete(r)
}

// AgentTLSOptions configure the agent channel's certificates.
type AgentTLSOptions struct {
	// Namespace holds the CA Secret and ConfigMap (the controller's).
	Namespace string
	// AgentUser is the agent's service-account user name, the only
	// requester whose certificate requests are signed.
	AgentUser string
	// Lifetime caps the lifetime of agent certificates and is the lifetime
	// of the controller's client certificates; 0 means
	// DefaultAgentCertLifetime.
	Lifetime time.Duration
}

// setupAgentTLS ensures the agent CA (agentcert.EnsureCA, through a client
// that reads the API server directly), registers the certificate signer
// and returns the poll's TLS configuration.
func setupAgentTLS(mgr ctrl.Manager, o AgentTLSOptions, rec recorder.EventRecorder) (func(node string) *tls.Config, error) {
	if o.Namespace == "" || o.AgentUser == "" {
		return nil, errors.New("agent TLS: the namespace and the agent's user name are required")
	}
	direct, err := client.New(mgr.GetConfig(), client.Options{Scheme: mgr.GetScheme(), Mapper: mgr.GetRESTMapper()})
	if err != nil {
		return nil, fmt.Errorf("agent TLS: client: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ca, err := agentcert.EnsureCA(ctx, direct, o.Namespace, time.Now())
	if err != nil {
		return nil, fmt.Errorf("agent TLS: %w", err)
	}
	lifetime := o.Lifetime
	if lifetime <= 0 {
		lifetime = DefaultAgentCertLifetime
	}
	signer := &AgentCSRReconciler{Client: mgr.GetClient(), Recorder: rec, CA: ca, AgentUser: o.AgentUser, Lifetime: lifetime}
	if err := signer.SetupWithManager(mgr); err != nil {
		return nil, fmt.Errorf("agent TLS: set up the signer: %w", err)
	}
	pool := ca.Pool()
	roots := func() *x509.CertPool { return pool }
	certs := &agentcert.ClientCertificates{CA: ca, Lifetime: lifetime}
	return func(node string) *tls.Config { return agentcert.ClientConfig(roots, certs.Get, node) }, nil
}
