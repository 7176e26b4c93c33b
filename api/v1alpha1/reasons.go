package v1alpha1

// Condition reasons and Event reasons users see for the rules that keep
// Node addresses, special-purpose addresses and hand-written statuses from
// becoming egress IPs (docs/troubleshooting.md lists what to do for each).
const (
	// ReasonNodeAddressConflict is the Assigned=False reason, and the
	// Warning Event reason, while an Egress's IP is an InternalIP or
	// ExternalIP of a Node (status.addresses): the Node wins, the Egress is
	// bound nowhere and recovers by itself when the Node gives the address
	// up. The message names the Node.
	ReasonNodeAddressConflict = "NodeAddressConflict"

	// ReasonBindRefused is the Ready=False reason, and the Warning Event
	// reason, while the agent of the egress Node reports that it refuses or
	// fails to bind the Egress's IP (an address already on the Node and
	// not egressip's, an address no Egress of this pool may hold, ...). The
	// message names the Node and carries the agent's explanation.
	ReasonBindRefused = "BindRefused"

	// ReasonStatusIPRejected is the reason of the Warning Event recorded
	// when an Egress's status.egressIP (written by someone other than the
	// controller) is not an address its pool can give it; the controller
	// replaces it and no agent binds it.
	ReasonStatusIPRejected = "StatusIPRejected"

	// ReasonAgentReportRefused is the reason of the Warning Event recorded
	// on a Node when the controller refuses a poll of its report port
	// because the server there is not that Node's agent: plain HTTP, a
	// certificate not issued by the agent CA (a spoofed server or a man in
	// the middle), an invalid one, or another Node's. Such a poll counts
	// as failed: it never keeps the Node alive nor makes an IP Ready. At
	// most one Event per Node every 5 minutes; the metric
	// egressip_controller_agent_reports_refused_total counts every one.
	ReasonAgentReportRefused = "AgentReportRefused"

	// ReasonAgentCSRDenied is the reason of the Warning Event recorded on
	// a CertificateSigningRequest for the signer egressip.io/agent that
	// the controller denies (the message says which rule it breaks).
	ReasonAgentCSRDenied = "AgentCertificateDenied"
)

// Reasons of ExternalIPPoolStatus.Excluded: why addresses of a pool's
// ranges are never allocated.
const (
	// ExcludedNodeAddress: the address is an InternalIP or ExternalIP of a
	// Node.
	ExcludedNodeAddress = "NodeAddress"
	// ExcludedSpecialPurpose: the address is loopback, link-local,
	// multicast, "this network", limited broadcast, unspecified or
	// IPv4-mapped (the blocks of ipam.SpecialBlocks).
	ExcludedSpecialPurpose = "SpecialPurpose"
	// ExcludedReserved: the address is the gateway, or the network,
	// broadcast or Subnet-Router anycast address of a CIDR or of the
	// subnet.
	ExcludedReserved = "Reserved"
)
