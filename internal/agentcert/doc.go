// Package agentcert holds the identities of the channel between the
// controller and the agents (docs/security.md, "The agent channel").
//
// Every agent holds a certificate naming its Node, issued through the
// Kubernetes CertificateSigningRequest API under the signer SignerName by a
// CA the controller keeps in a Secret of its namespace; the CA certificate
// is published in a ConfigMap the agents read. The controller polls each
// agent over mutual TLS 1.3: it accepts a report only from a server whose
// certificate chains to that CA and names exactly the Node it polls, and it
// presents a client certificate of its own, issued from the same CA, so an
// agent answers only the controller (and, with its own certificate as a
// client certificate, other agents).
//
// The package has the pure parts (names, the check of a request, the
// verification of a peer) and the TLS configurations built from them; the
// signing controller lives in internal/controller, the agent's rotating
// certificate in Source.
package agentcert
