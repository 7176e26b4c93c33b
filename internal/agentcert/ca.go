package agentcert

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// pemCertificate is the PEM block type of a certificate.
const pemCertificate = "CERTIFICATE"

// CALifetime is the validity of a CA the controller creates: 10 years. The
// CA is not rotated by the controller (docs/security.md says how to by
// hand).
const CALifetime = 10 * 365 * 24 * time.Hour

// CA is the certificate authority of the agent channel.
type CA struct {
	// Cert is the CA certificate.
	Cert *x509.Certificate
	// CertPEM is Cert in PEM form, as published to the agents.
	CertPEM []byte
	key     crypto.Signer
}

// NewCA creates a CA (ECDSA P-256, valid CALifetime from now) and returns
// it with its certificate and key in PEM form. It fails only when the
// random source does.
func NewCA(now time.Time) (*CA, []byte, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("generate CA key: %w", err)
	}
	serial, err := newSerial()
	if err != nil {
		return nil, nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "egressip-agent-ca", Organization: []string{Organization}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CALifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("create CA certificate: %w", err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("encode CA key: %w", err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: pemCertificate, Bytes: der})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	ca, err := ParseCA(certPEM, keyPEM)
	return ca, certPEM, keyPEM, err
}

// ParseCA reads a CA from its PEM certificate and key (PKCS#8, SEC 1 or
// PKCS#1). It fails when either does not parse, the certificate is not a
// CA, or the key is not the certificate's.
func ParseCA(certPEM, keyPEM []byte) (*CA, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("CA key pair: %w", err)
	}
	if !pair.Leaf.IsCA {
		return nil, errors.New("CA key pair: the certificate is not a CA")
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("CA key pair: key type %T cannot sign", pair.PrivateKey)
	}
	block, _ := pem.Decode(certPEM)
	return &CA{Cert: pair.Leaf, CertPEM: pem.EncodeToMemory(&pem.Block{Type: pemCertificate, Bytes: block.Bytes}), key: signer}, nil
}

// Pool is a certificate pool holding the CA alone.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

func newSerial() (*big.Int, error) {
	s, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	return s, nil
}

// backdate is how far before now a certificate starts, for clocks slightly
// behind: a tenth of its lifetime, at most 5 minutes.
func backdate(lifetime time.Duration) time.Duration { return min(lifetime/10, 5*time.Minute) }

// SignAgent issues the certificate of an accepted request (Check), valid
// for lifetime from now (never past the CA's end), with the usages of
// Usages. It returns the certificate in PEM form.
func (ca *CA) SignAgent(req Request, now time.Time, lifetime time.Duration) ([]byte, error) {
	tmpl := &x509.Certificate{
		Subject:     Template(req.Node).Subject,
		DNSNames:    agentDNSNames(req.Node),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if _, rsaKey := req.CSR.PublicKey.(*rsa.PublicKey); rsaKey {
		tmpl.KeyUsage |= x509.KeyUsageKeyEncipherment
	}
	return ca.sign(tmpl, req.CSR.PublicKey, now, lifetime)
}

func (ca *CA) sign(tmpl *x509.Certificate, pub any, now time.Time, lifetime time.Duration) ([]byte, error) {
	serial, err := newSerial()
	if err != nil {
		return nil, err
	}
	tmpl.SerialNumber = serial
	tmpl.NotBefore = now.Add(-backdate(lifetime))
	tmpl.NotAfter = now.Add(lifetime)
	if tmpl.NotAfter.After(ca.Cert.NotAfter) {
		tmpl.NotAfter = ca.Cert.NotAfter
	}
	tmpl.BasicConstraintsValid = true
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, pub, ca.key)
	if err != nil {
		return nil, fmt.Errorf("sign certificate: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: pemCertificate, Bytes: der}), nil
}

// ClientCertificate issues the controller's client certificate (common
// name ControllerCN, client auth only) with a fresh key, valid for
// lifetime from now.
func (ca *CA) ClientCertificate(now time.Time, lifetime time.Duration) (*tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("generate client key: %w", err)
	}
	certPEM, err := ca.sign(&x509.Certificate{
		Subject:     pkix.Name{CommonName: ControllerCN, Organization: []string{Organization}},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, key.Public(), now, lifetime)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(certPEM)
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("parse client certificate: %w", err)
	}
	return &tls.Certificate{Certificate: [][]byte{block.Bytes}, PrivateKey: key, Leaf: leaf}, nil
}

// ClientCertificates hands out the controller's client certificate,
// issuing a new one once two thirds of the current one's lifetime have
// passed (so a long-running controller never presents an expired one). It
// is safe for concurrent use.
type ClientCertificates struct {
	// CA issues the certificates.
	CA *CA
	// Lifetime of each certificate.
	Lifetime time.Duration
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	mu      sync.Mutex
	current *tls.Certificate
}

// Get returns the current certificate (tls.Config.GetClientCertificate).
func (c *ClientCertificates) Get(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	t := now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur := c.current; cur != nil {
		renewAt := cur.Leaf.NotBefore.Add(cur.Leaf.NotAfter.Sub(cur.Leaf.NotBefore) * 2 / 3)
		if t.Before(renewAt) {
			return cur, nil
		}
	}
	cert, err := c.CA.ClientCertificate(t, c.Lifetime)
	if err != nil {
		return nil, err
	}
	c.current = cert
	return cert, nil
}

// EnsureCA returns the CA of the Secret CASecretName in namespace,
// creating it first when there is none (one replica's create wins; the
// others read the winner's), and publishes its certificate in the
// ConfigMap CAConfigMapName (created, or updated when it differs). c must
// read the API server directly (not a cache: the controller watches no
// Secrets). It fails when the API calls fail or the Secret holds no valid
// CA.
func EnsureCA(ctx context.Context, c client.Client, namespace string, now time.Time) (*CA, error) {
	key := client.ObjectKey{Namespace: namespace, Name: CASecretName}
	var sec corev1.Secret
	err := c.Get(ctx, key, &sec)
	if apierrors.IsNotFound(err) {
		_, certPEM, keyPEM, nerr := NewCA(now)
		if nerr != nil {
			return nil, nerr
		}
		sec = corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: CASecretName,
				Labels: map[string]string{"app.kubernetes.io/name": "egressip", "app.kubernetes.io/component": "agent-ca"}},
			Type: corev1.SecretTypeTLS,
			Data: map[string][]byte{corev1.TLSCertKey: certPEM, corev1.TLSPrivateKeyKey: keyPEM},
		}
		err = c.Create(ctx, &sec)
		if apierrors.IsAlreadyExists(err) {
			err = c.Get(ctx, key, &sec)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("agent CA Secret %s: %w", key, err)
	}
	ca, err := ParseCA(sec.Data[corev1.TLSCertKey], sec.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		return nil, fmt.Errorf("agent CA Secret %s: %w", key, err)
	}
	if err := publishCA(ctx, c, namespace, ca.CertPEM); err != nil {
		return nil, err
	}
	return ca, nil
}

func publishCA(ctx context.Context, c client.Client, namespace string, certPEM []byte) error {
	key := client.ObjectKey{Namespace: namespace, Name: CAConfigMapName}
	var cm corev1.ConfigMap
	err := c.Get(ctx, key, &cm)
	switch {
	case apierrors.IsNotFound(err):
		cm = corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: CAConfigMapName,
				Labels: map[string]string{"app.kubernetes.io/name": "egressip", "app.kubernetes.io/component": "agent-ca"}},
			Data: map[string]string{CAConfigMapKey: string(certPEM)},
		}
		err = c.Create(ctx, &cm)
		if apierrors.IsAlreadyExists(err) {
			return publishCA(ctx, c, namespace, certPEM)
		}
	case err == nil && !bytes.Equal([]byte(cm.Data[CAConfigMapKey]), certPEM):
		if cm.Data == nil {
			cm.Data = map[string]string{}
		}
		cm.Data[CAConfigMapKey] = string(certPEM)
		err = c.Update(ctx, &cm)
	}
	if err != nil {
		return fmt.Errorf("agent CA ConfigMap %s: %w", key, err)
	}
	return nil
}
