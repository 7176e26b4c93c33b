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

	// ReasonReleaseTimedOut is the reason of the Warning Event recorded
	// when a planned move assigns an Egress's IP to its new Node although
	// the old Node still reports it bound: the controller told that Node's
	// agent to release it in every poll for --release-timeout, and now
	// counts the Node as not releasing the IP, as if it were dead. The
	// Assigned condition's message says the same.
	ReasonReleaseTimedOut = "ReleaseTimedOut"

	// ReasonSelfFenced is the reason of the Node condition
	// EgressSelfFenced while the Node's agent holds none of its egress IPs
	// because it fenced itself (it lost the controller's polls, the API
	// server and its peers' support; docs/failover.md), and of the Warning
	// Event recorded on the Node when the controller learns of a fence,
	// which is mostly once the Node is back: a fenced agent is not polled.
	ReasonSelfFenced = "SelfFenced"

	// ReasonFenceLifted is the reason of the Node condition
	// EgressSelfFenced after that agent's last fence was lifted (it is
	// polled again); the message says when the fence began and ended.
	ReasonFenceLifted = "FenceLifted"

	// ReasonAgentUnreachable is the reason of the Node condition
	// EgressAgentReachable when the controller has declared the Node's
	// agent dead (it failed --agent-failure-threshold polls in a row and
	// has not answered for --agent-dead-after: its egress IPs are moved),
	// and of the Warning Event recorded on the Node then.
	ReasonAgentUnreachable = "AgentUnreachable"

	// ReasonAgentAnswers is the reason of the Node condition
	// EgressAgentReachable while the Node's agent answers the controller's
	// polls, and of the Normal Event recorded when it answers again.
	ReasonAgentAnswers = "AgentAnswers"
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

// The CloudInterfaces condition of a cloud-backed pool in interface mode
// OwnInterfaces, and its reasons (docs/cloud-aws.md says what to do for
// each). Nothing already attached is detached while it is False.
const (
	// ConditionCloudInterfaces is True while the controller can create and
	// attach the pool's own network interfaces.
	ConditionCloudInterfaces = "CloudInterfaces"
	// ReasonInterfacesReady: it can.
	ReasonInterfacesReady = "InterfacesReady"
	// ReasonInterfaceFailed: creating, attaching or deleting an interface
	// failed (a missing IAM permission, named in the message; a security
	// group that does not exist; ...).
	ReasonInterfaceFailed = "InterfaceFailed"
	// ReasonSubnetUnusable: the pool's subnet does not exist or lies in a
	// VPC or availability zone where no Node runs.
	ReasonSubnetUnusable = "SubnetUnusable"
	// ReasonInterfaceLimit: Nodes that need another interface for the
	// pool are at their instance type's interface limit or at the pool's
	// maxInterfacesPerNode.
	ReasonInterfaceLimit = "InterfaceLimitReached"
)

// Reasons of the Egress condition Conflict (duplicate-IP detection; see
// docs/troubleshooting.md).
const (
	// ReasonDuplicateIP is the Conflict=True reason, and the Warning Event
	// reason, while the agent of the egress Node sees another host answer
	// for the Egress's IP (an RFC 5227 ARP probe or a DAD-style Neighbor
	// Solicitation). The message names the other MACs and, for a MAC of a
	// Node of this cluster, that Node.
	ReasonDuplicateIP = "DuplicateIP"
	// ReasonNoConflict is the Conflict=False reason once the agent's probes
	// no longer see another host answer for the IP.
	ReasonNoConflict = "NoConflict"
)

// Reasons of cloud-backed pools (docs/cloud-aws.md).
const (
	// ReasonAddressHeld is the IPAllocated=False reason, and the Warning
	// Event reason, while the address an Egress names (spec.egressIP) is
	// held by a network interface that is not egressip's: a Pod IP of the
	// VPC CNI, a load balancer's interface, another instance's interface.
	// The controller never takes it; the message names the holder
	// (interface ID, instance, description, requester). An Egress whose
	// allocated address was taken gets the Event and another address.
	ReasonAddressHeld = "AddressHeld"
)

// The ElasticIPs condition of a cloud-backed pool with
// spec.cloud.aws.elasticIPs, and its reasons (docs/cloud-aws.md).
const (
	// ConditionElasticIPs is True when every Egress of the pool that is
	// assigned has an Elastic IP associated and every named allocation is
	// usable.
	ConditionElasticIPs = "ElasticIPs"
	// ReasonElasticIPsAssociated: ElasticIPs=True.
	ReasonElasticIPsAssociated = "Associated"
	// ReasonElasticIPUnusable: an allocation the pool names does not exist
	// or is associated with an address that is not egressip's; the
	// message names it and says what to do. It is never touched, and
	// working associations stay.
	ReasonElasticIPUnusable = "ElasticIPUnusable"
	// ReasonElasticIPsExhausted: more Egresses than usable allocations;
	// the message says how many wait.
	ReasonElasticIPsExhausted = "ElasticIPsExhausted"
	// ReasonElasticIPsUnreadable: the allocations could not be read (the
	// message carries the cloud's error, such as a missing
	// ec2:DescribeAddresses permission).
	ReasonElasticIPsUnreadable = "ElasticIPsUnreadable"
)

// The Egress condition Shadowed and its reasons (issue 21; see
// docs/troubleshooting.md): whether the Egress carries any traffic although
// its appliedTo matches Pods. Absent on Egresses never shadowed.
const (
	// ConditionShadowed is True while every Pod the Egress's appliedTo
	// matches sends all its destinations through other Egresses (older
	// ones, or ones whose destinationCIDRs match with a longer prefix):
	// the Egress carries no traffic, and its failurePolicy affects
	// nobody. False once it carries some again.
	ConditionShadowed = "Shadowed"
	// ReasonDestinationsTaken is the Shadowed=True reason; the message
	// names the Egresses that took the destinations.
	ReasonDestinationsTaken = "DestinationsTaken"
	// ReasonCarriesTraffic is the Shadowed=False reason.
	ReasonCarriesTraffic = "CarriesTraffic"
)
