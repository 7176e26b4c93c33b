package agentcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"slices"
	"strings"

	certificatesv1 "k8s.io/api/certificates/v1"
)

// SignerName is the CertificateSigningRequest signer of agent
// certificates (spec.signerName). Only the egressip controller approves and
// signs for it (its RBAC names this signer in resourceNames).
const SignerName = "egressip.io/agent"

// Names of the objects in the controller's namespace.
const (
	// CASecretName is the Secret (type kubernetes.io/tls) holding the CA
	// certificate and key; created once by the first controller replica,
	// read by every replica.
	CASecretName = "egressip-agent-ca"
	// CAConfigMapName is the ConfigMap publishing the CA certificate under
	// CAConfigMapKey, read by every agent.
	CAConfigMapName = "egressip-agent-ca"
	// CAConfigMapKey is the ConfigMap key holding the PEM CA bundle.
	CAConfigMapKey = "ca.crt"
)

// NodeNameExtra is the user-info extra key under which the API server
// records the Node a Pod-bound service-account token belongs to
// (Kubernetes 1.30+, the ServiceAccountTokenPodNodeInfo feature); the
// signer accepts a request only for the Node in that extra.
const NodeNameExtra = "authentication.kubernetes.io/node-name"

// Subject names.
const (
	// Organization is the subject organization of every certificate the
	// CA issues.
	Organization = "egressip.io"
	// agentCNPrefix starts the common name of an agent certificate; the
	// Node name follows. ':' is not allowed in a Node name, so no Node
	// name can be mistaken for another identity.
	agentCNPrefix = "egressip-agent:"
	// ControllerCN is the common name of the controller's client
	// certificate.
	ControllerCN = "egressip-controller"
	// MetricsServerName is a DNS name every agent certificate carries
	// besides its Node's: the agents' metrics are scraped at Pod
	// addresses, one TLS server name for all of them lets Prometheus
	// verify that it talks to an agent (chained to the agent CA) before it
	// sends its bearer token. Identities are read from the common name,
	// never from this name.
	MetricsServerName = "agent-metrics.egressip.io"
)

// Usages are the key usages of an agent certificate: it serves the report
// (server auth) and authenticates the agent to its peers (client auth).
var Usages = []certificatesv1.KeyUsage{
	certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth, certificatesv1.UsageClientAuth,
}

// AgentCN is the common name of the certificate of node's agent.
func AgentCN(node string) string { return agentCNPrefix + node }

// Template is the certificate request of node's agent: common name
// AgentCN(node), organization Organization, and the DNS names node (so
// tools that check host names see the Node) and MetricsServerName.
func Template(node string) *x509.CertificateRequest {
	return &x509.CertificateRequest{
		Subject:  pkix.Name{CommonName: AgentCN(node), Organization: []string{Organization}},
		DNSNames: agentDNSNames(node),
	}
}

func agentDNSNames(node string) []string { return []string{node, MetricsServerName} }

// Identity is who a verified certificate belongs to.
type Identity struct {
	// Node is the Node of an agent certificate; empty for the controller.
	Node string
	// Controller is true for the controller's client certificate.
	Controller bool
}

// String names the identity for logs and errors.
func (i Identity) String() string {
	if i.Controller {
		return "controller"
	}
	return "agent of Node " + i.Node
}

// identityOf reads the identity of a certificate the CA issued: an agent
// certificate has the common name AgentCN(node) and the DNS names of
// Template(node); the controller's has ControllerCN and no names. Anything else is no
// identity (ok false).
func identityOf(c *x509.Certificate) (Identity, bool) {
	if !slices.Equal(c.Subject.Organization, []string{Organization}) ||
		len(c.IPAddresses) > 0 || len(c.URIs) > 0 || len(c.EmailAddresses) > 0 {
		return Identity{}, false
	}
	if c.Subject.CommonName == ControllerCN && len(c.DNSNames) == 0 {
		return Identity{Controller: true}, true
	}
	node, ok := strings.CutPrefix(c.Subject.CommonName, agentCNPrefix)
	if !ok || node == "" || !slices.Equal(c.DNSNames, agentDNSNames(node)) {
		return Identity{}, false
	}
	return Identity{Node: node}, true
}

// Request is an accepted certificate request.
type Request struct {
	// Node is the Node the certificate is for.
	Node string
	// CSR is the parsed PKCS#10 request, its signature checked.
	CSR *x509.CertificateRequest
}

// DenyError says why a request is refused; its message goes into the
// CertificateSigningRequest's Denied condition.
type DenyError struct{ msg string }

func (e *DenyError) Error() string { return e.msg }

func deny(format string, args ...any) error { return &DenyError{msg: fmt.Sprintf(format, args...)} }

// Check decides whether the CA may sign csr, a request for SignerName: it
// must come from agentUser (the agent's service account,
// system:serviceaccount:<namespace>:<name>) with a token bound to a Node
// (the extra NodeNameExtra, one value), and ask exactly for that Node's
// identity (Template) with the key usages Usages (key encipherment may be
// added, as RSA clients do) and a key of at least 2048 bits (RSA) or 256
// (ECDSA P-256, P-384). The rule is the one kubelet serving certificates
// follow, with the Node taken from the token instead of the user name. It
// returns a *DenyError for a request to refuse.
func Check(csr *certificatesv1.CertificateSigningRequest, agentUser string) (Request, error) {
	if csr.Spec.SignerName != SignerName {
		return Request{}, deny("signer %q is not %s", csr.Spec.SignerName, SignerName)
	}
	if csr.Spec.Username != agentUser {
		return Request{}, deny("requested by %q, not by the agent's service account %s", csr.Spec.Username, agentUser)
	}
	nodes := csr.Spec.Extra[NodeNameExtra]
	if len(nodes) != 1 || nodes[0] == "" {
		return Request{}, deny("the requester's token is not bound to one Node (user extra %s: %q)", NodeNameExtra, []string(nodes))
	}
	node := nodes[0]
	block, _ := pem.Decode(csr.Spec.Request)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return Request{}, deny("spec.request is not a PEM CERTIFICATE REQUEST")
	}
	req, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return Request{}, deny("spec.request: %v", err)
	}
	if err := req.CheckSignature(); err != nil {
		return Request{}, deny("spec.request signature: %v", err)
	}
	want := Template(node)
	if req.Subject.CommonName != want.Subject.CommonName || !slices.Equal(req.Subject.Organization, want.Subject.Organization) ||
		len(req.Subject.OrganizationalUnit) > 0 || !slices.Equal(req.DNSNames, want.DNSNames) ||
		len(req.IPAddresses) > 0 || len(req.URIs) > 0 || len(req.EmailAddresses) > 0 {
		return Request{}, deny("the request for Node %s must name exactly that Node (CN %q, O %q, DNS %q), got CN %q, O %q, DNS %q, IPs %v, URIs %v",
			node, want.Subject.CommonName, Organization, want.DNSNames, req.Subject.CommonName, req.Subject.Organization, req.DNSNames, req.IPAddresses, req.URIs)
	}
	if err := checkUsages(csr.Spec.Usages); err != nil {
		return Request{}, err
	}
	if err := checkKey(req.PublicKey); err != nil {
		return Request{}, err
	}
	return Request{Node: node, CSR: req}, nil
}

func checkUsages(us []certificatesv1.KeyUsage) error {
	seen := map[certificatesv1.KeyUsage]bool{}
	for _, u := range us {
		switch u {
		case certificatesv1.UsageDigitalSignature, certificatesv1.UsageServerAuth, certificatesv1.UsageClientAuth, certificatesv1.UsageKeyEncipherment:
			seen[u] = true
		default:
			return deny("key usage %q is not allowed (want %q)", u, Usages)
		}
	}
	for _, u := range Usages {
		if !seen[u] {
			return deny("key usage %q is missing (want %q)", u, Usages)
		}
	}
	return nil
}

func checkKey(pub any) error {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			return deny("ECDSA curve %s is not allowed (want P-256 or P-384)", k.Curve.Params().Name)
		}
	case *rsa.PublicKey:
		if k.N.BitLen() < 2048 {
			return deny("RSA key of %d bits is too short (want at least 2048)", k.N.BitLen())
		}
	default:
		return deny("public key type %T is not allowed (want ECDSA or RSA)", pub)
	}
	return nil
}

// errNoIdentity: a certificate chains to the CA but names nobody.
var errNoIdentity = errors.New("certificate names no egressip identity")
