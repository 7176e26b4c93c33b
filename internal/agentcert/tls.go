package agentcert

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// RefusedReasons lists every reason, for metrics initialised at zero.
var RefusedReasons = []string{v1.RefusedNotTLS, v1.RefusedUntrusted, v1.RefusedInvalid, v1.RefusedWrongIdentity, v1.RefusedHandshake}

// RefusedError is a connection refused because the peer is not who it
// must be.
type RefusedError struct {
	// Reason is one of the Refused* constants.
	Reason string
	// Err is the underlying failure.
	Err error
}

func (e *RefusedError) Error() string { return e.Reason + ": " + e.Err.Error() }
func (e *RefusedError) Unwrap() error { return e.Err }

// Classify returns the refusal an error of a TLS connection attempt (a
// dial, a handshake, an HTTP request over it) stands for, and false for
// errors that say nothing about the peer's identity: refused or timed-out
// connections, cancelled contexts (an absent or slow agent is a failed
// poll, not a spoofed one).
func Classify(err error) (*RefusedError, bool) {
	if err == nil {
		return nil, false
	}
	if re, ok := errors.AsType[*RefusedError](err); ok {
		return re, true
	}
	reason := ""
	if _, ok := errors.AsType[tls.RecordHeaderError](err); ok {
		reason = v1.RefusedNotTLS
	} else if _, ok := errors.AsType[x509.UnknownAuthorityError](err); ok {
		reason = v1.RefusedUntrusted
	} else if _, ok := errors.AsType[x509.CertificateInvalidError](err); ok {
		reason = v1.RefusedInvalid
	} else if _, ok := errors.AsType[x509.HostnameError](err); ok {
		reason = v1.RefusedWrongIdentity
	} else if _, ok := errors.AsType[tls.AlertError](err); ok {
		reason = v1.RefusedHandshake
	} else if oe, ok := errors.AsType[*net.OpError](err); ok && oe.Op == "remote error" {
		// An alert from the server: it refused our certificate, or has none.
		reason = v1.RefusedHandshake
	}
	if reason == "" {
		return nil, false
	}
	return &RefusedError{Reason: reason, Err: err}, true
}

// verifyChain checks that certs (as sent, leaf first) chain to roots for
// usage at now, and returns the leaf's identity.
func verifyChain(certs []*x509.Certificate, roots *x509.CertPool, usage x509.ExtKeyUsage, now time.Time) (Identity, error) {
	if len(certs) == 0 {
		return Identity{}, &RefusedError{Reason: v1.RefusedHandshake, Err: errors.New("no certificate presented")}
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{usage}, CurrentTime: now})
	if err != nil {
		if _, ok := errors.AsType[x509.UnknownAuthorityError](err); ok {
			return Identity{}, &RefusedError{Reason: v1.RefusedUntrusted, Err: err}
		}
		return Identity{}, &RefusedError{Reason: v1.RefusedInvalid, Err: err}
	}
	id, ok := identityOf(certs[0])
	if !ok {
		return Identity{}, &RefusedError{Reason: v1.RefusedWrongIdentity, Err: errNoIdentity}
	}
	return id, nil
}

// VerifyAgent checks that certs are the serving certificate of node's
// agent: chained to roots, valid at now for server auth, and naming
// exactly node. It returns a *RefusedError otherwise.
func VerifyAgent(certs []*x509.Certificate, roots *x509.CertPool, node string, now time.Time) error {
	id, err := verifyChain(certs, roots, x509.ExtKeyUsageServerAuth, now)
	if err != nil {
		return err
	}
	if id.Controller || id.Node != node {
		return &RefusedError{Reason: v1.RefusedWrongIdentity, Err: fmt.Errorf("the server is the %s, not the agent of Node %s", id, node)}
	}
	return nil
}

// ClientConfig is the TLS configuration of a connection to node's agent:
// TLS 1.3, the server verified with VerifyAgent against roots() (called at
// each handshake, so a refreshed bundle applies to new connections), and
// the client certificate of getCert (the controller's, or for peer probes
// the agent's own).
//
// Go's own verification is replaced by VerifyAgent because the agent is
// reached at a Node address while its certificate names the Node: the
// usual host-name check has no name to compare (Node names may even look
// like IP addresses). VerifyConnection runs on every handshake, so nothing
// is accepted unverified.
func ClientConfig(roots func() *x509.CertPool, getCert func(*tls.CertificateRequestInfo) (*tls.Certificate, error), node string) *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		InsecureSkipVerify:   true, //nolint:gosec // replaced by VerifyAgent in VerifyConnection
		GetClientCertificate: getCert,
		VerifyConnection: func(cs tls.ConnectionState) error {
			return VerifyAgent(cs.PeerCertificates, roots(), node, time.Now())
		},
	}
}

// PeerClientConfig is the TLS configuration an agent uses to reach the
// agent of node (peer probes): ClientConfig with the agent's own
// certificate as the client certificate, so the peer sees an agent.
func PeerClientConfig(src *Source, node string) *tls.Config {
	return ClientConfig(src.Roots, src.GetClientCertificate, node)
}

// ServerConfig is the TLS configuration of an agent's report server: TLS
// 1.3, the certificate of getCert, and a client certificate required and
// verified against roots() (the controller's or another agent's); which
// identities may read what is the handler's decision (Authorize).
func ServerConfig(roots func() *x509.CertPool, getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)) *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: getCert,
		ClientAuth:     tls.RequireAnyClientCert,
		VerifyConnection: func(cs tls.ConnectionState) error {
			_, err := verifyChain(cs.PeerCertificates, roots(), x509.ExtKeyUsageClientAuth, time.Now())
			return err
		},
		NextProtos: []string{"http/1.1"},
	}
}

// PeerIdentity is the identity of the client of r, verified by
// ServerConfig's handshake; ok is false on a connection without TLS.
func PeerIdentity(r *http.Request) (Identity, bool) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return Identity{}, false
	}
	return identityOf(r.TLS.PeerCertificates[0])
}

// Authorize serves h to clients allow accepts, and 403 Forbidden to the
// others (and to connections without TLS).
func Authorize(h http.Handler, allow func(Identity) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok := PeerIdentity(r)
		if !ok || !allow(id) {
			http.Error(w, "forbidden", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// OnlyController allows the controller alone (the report).
func OnlyController(id Identity) bool { return id.Controller }

// AnyAgent allows the agent of any Node (peer probes for fencing).
func AnyAgent(id Identity) bool { return !id.Controller && id.Node != "" }
