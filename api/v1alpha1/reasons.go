package v1alpha1

import corev1 "k8s.io/api/core/v1"

// This file holds every reason a user can see: the Reason of each condition
// egressip writes (Egress, ExternalIPPool, Node and
// CertificateSigningRequest conditions), the reason of each Event it
// records, and the values of the "reason" labels of its metrics
// (docs/metrics.md). Values are CamelCase, as Kubernetes asks of condition
// and Event reasons (metav1.Condition.Reason), and are part of the API:
// alerts, scripts and tests match them, so a value never changes.
// docs/troubleshooting.md says what to do for each.

// Reasons of the Egress condition IPAllocated, written by the controller's
// pass. Each is also the "reason" label of
// egressip_controller_unplaced_egresses for an Egress that has no IP.
const (
	// ReasonAllocated: IPAllocated=True; the Egress has an address of its
	// pool (the one spec.egressIP names, or the lowest free one).
	ReasonAllocated = "Allocated"
	// ReasonPoolNotFound: IPAllocated=False while spec.externalIPPool names
	// no ExternalIPPool. Also a scheduler Placement reason (an Egress whose
	// pool the scheduler was not given).
	ReasonPoolNotFound = "PoolNotFound"
	// ReasonPoolInvalid: IPAllocated=False while the Egress's pool is
	// invalid (its Ready condition says why). Also a scheduler Placement
	// reason (a pool listed twice or of no family).
	ReasonPoolInvalid = "PoolInvalid"
	// ReasonPoolExhausted: IPAllocated=False while every address of the
	// pool is allocated; the youngest Egresses wait. Always present in
	// egressip_controller_unplaced_egresses (0 when none waits).
	ReasonPoolExhausted = "PoolExhausted"
	// ReasonIPOutsidePool: IPAllocated=False while spec.egressIP is not an
	// address the pool can give (outside its ranges, excluded, reserved);
	// the message quotes the rule.
	ReasonIPOutsidePool = "IPOutsidePool"
	// ReasonWaitingForWarmIP: IPAllocated=False while a cloud-backed pool
	// attaches an address for the Egress (no warm address is available);
	// also the reason of such an IP in status.ips.
	ReasonWaitingForWarmIP = "WaitingForWarmIP"
	// ReasonPartlyAllocated: IPAllocated=True on an Egress with spec.ips
	// while some but not all of its IPs have an address; the message names
	// each entry that lacks one and why (PoolNotFound, PoolExhausted, ...,
	// also the reason of that IP in status.ips).
	ReasonPartlyAllocated = "PartlyAllocated"
	// ReasonNamedIPConflict: an address that spec.ips[].addresses names is
	// already used by an older Egress (named by it, or held in its
	// status): the younger Egress's IP gets no address. The reason of that
	// IP in status.ips, part of the IPAllocated message, and a Warning
	// Event when it appears.
	ReasonNamedIPConflict = "NamedIPConflict"
	// ReasonElasticIPsNotSupported: an entry of spec.ips names a
	// cloud-backed pool with Elastic IPs (spec.cloud.aws.elasticIPs):
	// Elastic IPs are associated per Egress (status.publicIP), not per IP,
	// so that entry's IPs get no address (the webhook refuses such an
	// Egress). Cloud pools without elasticIPs work in spec.ips.
	ReasonElasticIPsNotSupported = "ElasticIPsNotSupported"
)

// Reasons of the Egress condition Assigned, written by the controller's
// pass. The False ones are also the "reason" label of
// egressip_controller_unplaced_egresses.
const (
	// ReasonScheduled: Assigned=True; status.egressNode holds the IP.
	ReasonScheduled = "Scheduled"
	// ReasonWaitingForRelease: Assigned=False while a planned move waits
	// for the old Node's agent to release the IP (at most
	// --release-timeout; then ReasonReleaseTimedOut).
	ReasonWaitingForRelease = "WaitingForRelease"
	// ReasonNotAssigned: Assigned=False while the Egress has no IP; the
	// IPAllocated condition says why.
	ReasonNotAssigned = "NotAssigned"
	// ReasonAttaching: Assigned=False while the cloud attaches the
	// address to the chosen Node's interface; also the reason of such an
	// IP in status.ips, which names no Node until the attach is confirmed.
	ReasonAttaching = "Attaching"
)

// Reasons of the Egress condition Ready, written by the controller's pass
// from the agents' reports.
const (
	// ReasonAnnounced: Ready=True; the egress Node's agent reports the IP
	// bound and announced.
	ReasonAnnounced = "Announced"
	// ReasonBinding: Ready=False while the controller waits for the
	// egress Node's agent to report the IP bound and announced.
	ReasonBinding = "Binding"
	// ReasonNoEgressNode: Ready=False while no Node holds the Egress's IP
	// (none allocated or none assigned), and the Warning Event recorded
	// when it turns so; the selected Pods' traffic then follows
	// spec.failurePolicy.
	ReasonNoEgressNode = "NoEgressNode"
	// ReasonDatapathRefused: Ready=False, and the Warning Event, while
	// the kernel of some Node refuses to program the Egress's part of the
	// datapath: its Pods there do not leave with the egress IP. The agent
	// programs every other Egress of that Node.
	ReasonDatapathRefused = "DatapathRefused"
)

// Reasons of the Egress condition SelectorValid.
const (
	// ReasonInvalidSelector: SelectorValid=False, and the Warning Event,
	// while spec.appliedTo holds a selector that cannot be parsed.
	ReasonInvalidSelector = "InvalidSelector"
)

// Reasons of the ExternalIPPool condition Ready, written by the
// controller's pass.
const (
	// ReasonValid: Ready=True; the pool's spec is valid (the message
	// gives its usage).
	ReasonValid = "Valid"
	// ReasonInvalid: Ready=False while the pool's spec is invalid; the
	// message names the field and the rule.
	ReasonInvalid = "Invalid"
	// ReasonInUse: Ready=False while a pool being deleted waits for its
	// Egresses to go, or for its cloud addresses and interfaces to be
	// released.
	ReasonInUse = "InUse"
)

// Why an Egress has no Node: the reason of Assigned=False, and the
// "reason" label of egressip_controller_unplaced_egresses, set from the
// scheduler's Placement.Reason (internal/scheduler).
const (
	// ReasonDuplicateEgress: the Egress's name was given to the scheduler
	// twice (a bug of the caller; never seen from the API server).
	ReasonDuplicateEgress = "DuplicateEgress"
	// ReasonIPNotAllocated: the Egress has no IP yet.
	ReasonIPNotAllocated = "IPNotAllocated"
	// ReasonIPInvalid: the Egress's IP is not of its pool's family, or has
	// an IPv6 zone.
	ReasonIPInvalid = "IPInvalid"
	// ReasonNoEligibleNode: no Node of the pool is eligible with a
	// capacity above 0. Always present in
	// egressip_controller_unplaced_egresses (0 when none).
	ReasonNoEligibleNode = "NoEligibleNode"
	// ReasonCapacityExhausted: the pool has eligible Nodes but all of
	// them are full (with older Egresses, or ones that keep their Node).
	// Always present in egressip_controller_unplaced_egresses.
	ReasonCapacityExhausted = "CapacityExhausted"
	// ReasonFewerNodesThanIPs: one IP of an Egress with spec.ips has no
	// Node because every eligible Node of its pool (and zone) with room
	// already holds another IP of the Egress: a Node holds at most one IP
	// of any one Egress. Raising the pool's Nodes, or lowering the count,
	// places it. The Egress's other IPs are placed as usual.
	ReasonFewerNodesThanIPs = "FewerNodesThanIPs"
	// ReasonPartlyAssigned: Assigned=True on an Egress with spec.ips while
	// some but not all of its IPs have a Node; the message says how many
	// and why the others do not (their reasons are in status.ips).
	ReasonPartlyAssigned = "PartlyAssigned"
	// ReasonPartlyReady: Ready=True on an Egress with spec.ips while some
	// but not all of its IPs are Ready; the message reads "2 of 3 IPs
	// Ready". Traffic uses the Ready ones; failurePolicy applies only when
	// none is (Ready=False, ReasonNoEgressNode).
	ReasonPartlyReady = "PartlyReady"
)

// Why an egress IP leaves its Node: the "reason" label of
// egressip_controller_moves_total and the words in parentheses of the
// Moved and Releasing Events (the scheduler's Move.Reason).
const (
	// MoveNodeRemoved: the Node is gone.
	MoveNodeRemoved = "NodeRemoved"
	// MoveNodeIneligible: the Node cannot hold egress IPs any more; the
	// label is "NodeIneligible/" followed by one of the Ineligible*
	// reasons, or just "NodeIneligible" when the Node gives none.
	MoveNodeIneligible = "NodeIneligible"
	// MoveNodeNotInPool: the Node no longer matches the pool's
	// nodeSelector.
	MoveNodeNotInPool = "NodeNotInPool"
	// MoveCapacityReduced: the Node's capacity, filled in priority order,
	// has no room left for this Egress (the capacity was lowered, possibly
	// to 0, or older Egresses claim the room).
	MoveCapacityReduced = "CapacityReduced"
	// MoveSharedIP: the Egress follows the other Egresses that share its
	// IP to their Node.
	MoveSharedIP = "SharedIP"
	// MoveDistinctNodes: an IP of an Egress with spec.ips leaves a Node
	// that an older IP of the same Egress keeps (a Node holds at most one
	// IP of any one Egress).
	MoveDistinctNodes = "DistinctNodes"
)

// Why a Node cannot hold egress IPs: the part after "NodeIneligible/" of
// a move's reason, checked in this order.
const (
	// IneligibleDeleting: the Node has a deletionTimestamp.
	IneligibleDeleting = "Deleting"
	// IneligibleNotReady: the Node's Ready condition is not True.
	IneligibleNotReady = "NotReady"
	// IneligibleNetworkUnavailable: the Node's NetworkUnavailable
	// condition is True.
	IneligibleNetworkUnavailable = "NetworkUnavailable"
	// IneligibleNotLinux: the Node's kubernetes.io/os label is set and is
	// not linux.
	IneligibleNotLinux = "NotLinux"
	// IneligibleAgentDead: the controller declared the Node's agent dead
	// (see ReasonAgentUnreachable).
	IneligibleAgentDead = "AgentDead"
	// IneligibleCordoned: the Node is cordoned (spec.unschedulable).
	IneligibleCordoned = "Cordoned"
)

// Reasons of the Normal and Warning Events recorded on an Egress when its
// IP is placed or moved (the conditions above say the same at rest).
const (
	// EventAssigned (Normal): the IP was assigned to a Node.
	EventAssigned = "Assigned"
	// EventMoved (Normal): the IP moved from one Node to another; the
	// note gives the move's reason.
	EventMoved = "Moved"
	// EventReleasing (Normal): a planned move began; the old Node's agent
	// is told to release the IP first.
	EventReleasing = "Releasing"
	// EventUnassigned (Warning): the IP was removed from its Node and has
	// no other; the note says why and what the selected Pods' traffic
	// does now.
	EventUnassigned = "Unassigned"
	// EventAttachFailed (Warning): the cloud failed to attach the IP to
	// the chosen Node's interface; the note carries the cloud's error.
	EventAttachFailed = "AttachFailed"
	// EventEgressIPChanged (Warning): the egress IP of an Egress that had
	// one changed to another address: the selected Pods' traffic leaves
	// with the new address at once, so peers' allow-lists naming the old
	// one stop matching.
	EventEgressIPChanged = "EgressIPChanged"
)

// EventInvalidCapacity is the reason of the Warning Event recorded on a
// Node whose egressip.io/max-egress-ips annotation is not valid; the
// controller uses the default capacity for it.
const EventInvalidCapacity = "InvalidCapacity"

// ReasonAgentNodeIdentity is the reason of the Approved condition the
// controller sets on a CertificateSigningRequest for the signer
// egressip.io/agent that passes every rule (a Node's own identity); see
// ReasonAgentCSRDenied for the others.
const ReasonAgentNodeIdentity = "AgentNodeIdentity"

// Reasons of the Node conditions the controller keeps from the agents'
// reports (EgressDatapathSupported, EgressIPOwnershipKnown,
// EgressKernelFeatures, EgressVLANLinksReady;
// internal/controller/nodecondition.go), which the
// agent sends in its report (internal/report).
const (
	// ReasonHostStack: the Pods' traffic crosses the host's IP stack,
	// where the datapath acts (no evidence of a BPF bypass).
	ReasonHostStack = "HostStackCrossed"
	// ReasonHostStackBypass: the CNI steers Pod traffic past the host's
	// IP stack with eBPF, so selected Pods would leave with their own
	// address; the message names the evidence. Also the Warning Event
	// recorded when the condition turns False.
	ReasonHostStackBypass = "HostStackBypass"
	// ReasonOwnershipMark: addresses are marked with IFA_PROTO (and
	// recorded, where a record is configured).
	ReasonOwnershipMark = "AddressProtocol"
	// ReasonOwnershipRecord: the ownership record alone (kernel before
	// 5.18, or forced with --address-ownership=record).
	ReasonOwnershipRecord = "OwnershipRecord"
	// ReasonRecordUnreadable: the record cannot be read or parsed; the
	// agent binds and unbinds nothing until it is fixed.
	ReasonRecordUnreadable = "OwnershipRecordUnreadable"
	// ReasonRecordUnwritable: the record cannot be written; addresses
	// that would need a record entry are not added.
	ReasonRecordUnwritable = "OwnershipRecordUnwritable"
	// ReasonRecordMissing: the record disappeared while it listed
	// addresses; they are left alone.
	ReasonRecordMissing = "OwnershipRecordMissing"
	// ReasonKernelFeaturesPresent: every kernel feature probed was found.
	ReasonKernelFeaturesPresent = "KernelFeaturesPresent"
	// ReasonKernelFeatureMissing: a kernel feature is missing; a part of
	// the agent is degraded or did not start, as the message says. Also
	// the Warning Event recorded when the condition turns False.
	ReasonKernelFeatureMissing = "KernelFeatureMissing"
	// ReasonVLANLinksReady: every VLAN sub-interface the egress IPs
	// assigned to the Node need is in place (or none is needed); the
	// message names them.
	ReasonVLANLinksReady = "VLANLinksReady"
	// ReasonVLANParentMissing: the parent interface of a VLAN
	// sub-interface (--vlan-parent, or the link that would carry the IP
	// without its VLAN) does not exist on the Node. Also the Warning
	// Event recorded when EgressVLANLinksReady turns False for it.
	ReasonVLANParentMissing = "VLANParentMissing"
	// ReasonVLANForeignLink: a link egressip did not create already holds
	// the VLAN ID on the parent (or the sub-interface's name); it is never
	// adopted, changed or deleted. The message names it.
	ReasonVLANForeignLink = "VLANForeignLink"
	// ReasonVLANConflict: two pools want the same VLAN ID on different
	// parents; the first pool by name keeps it.
	ReasonVLANConflict = "VLANConflict"
	// ReasonVLANLinkFailed: the kernel refused to create or prepare the
	// sub-interface (for example no 8021q module: "operation not
	// supported"); the message carries the kernel's error.
	ReasonVLANLinkFailed = "VLANLinkFailed"
)

// Reasons of the Events recorded on a Node when one of the conditions
// above turns True again or the ownership record fails.
const (
	// EventDatapathSupported (Normal): EgressDatapathSupported turned
	// True again.
	EventDatapathSupported = "DatapathSupported"
	// EventOwnershipRecordProblem (Warning): EgressIPOwnershipKnown
	// turned False.
	EventOwnershipRecordProblem = "OwnershipRecordProblem"
	// EventOwnershipKnown (Normal): EgressIPOwnershipKnown turned True
	// again.
	EventOwnershipKnown = "OwnershipKnown"
)

// Reasons of an agent's fence decision (internal/agent/fence): the
// "reason" label of egressip_agent_fence_events_total, the reason the
// agent serves in its report and logs, and the reason quoted in the
// message of the Node condition EgressSelfFenced (docs/failover.md).
const (
	// ReasonPolled: the controller polled this Node less than the fence
	// timeout ago.
	ReasonPolled = "Polled"
	// ReasonAPIServerReachable: polls are late but the API server
	// answers, so the agent's watch shows any move of its IPs at once.
	ReasonAPIServerReachable = "APIServerReachable"
	// ReasonNoPeers: polls and API server lost, but the agent knows no
	// peer (a one-Node cluster, or no Node list cached yet): nothing
	// tells a partition from a control-plane outage, so nothing is
	// fenced.
	ReasonNoPeers = "NoPeers"
	// ReasonControllerGone: the peers that answer were not polled after
	// this Node either: the controller is down or cut off from everyone,
	// so nothing can move the IPs and nothing is fenced.
	ReasonControllerGone = "ControllerGone"
	// ReasonPeersLost (fenced): fewer than a majority of the peer set
	// answer: this Node is isolated or on the minority side.
	ReasonPeersLost = "PeersLost"
	// ReasonControllerPollsOthers (fenced): a majority of the peers that
	// answer were polled after this Node's last poll: the controller is
	// alive, cannot reach this Node and will declare it dead.
	ReasonControllerPollsOthers = "ControllerPollsOthers"
)

// Why the controller refuses a poll of an agent's report port: the
// "reason" label of egressip_controller_agent_reports_refused_total and
// the words of the Node's AgentReportRefused Warning Event
// (internal/agentcert; docs/security.md).
const (
	// RefusedNotTLS: the server answered something other than TLS (a
	// plain-HTTP report, or another protocol).
	RefusedNotTLS = "NotTLS"
	// RefusedUntrusted: the server's certificate does not chain to the
	// agent CA (self-signed, another CA: a spoofed server or a man in the
	// middle).
	RefusedUntrusted = "UntrustedCertificate"
	// RefusedInvalid: the certificate chains to the CA but is not valid
	// now (expired, not yet valid) or not for serving.
	RefusedInvalid = "InvalidCertificate"
	// RefusedWrongIdentity: a valid agent certificate, but of another
	// Node (or of no Node).
	RefusedWrongIdentity = "WrongIdentity"
	// RefusedHandshake: the TLS handshake failed otherwise (the server
	// refused the controller's certificate, no common parameters, ...).
	RefusedHandshake = "HandshakeFailed"
)

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

// Node condition types. The controller keeps these conditions on each
// Node from the agent's report; their reasons are above.

// NodeConditionDatapath is the Node condition the controller keeps from
// each agent's host stack check: True when the Node's Pod traffic crosses
// the host's IP stack (the datapath works), False with reason
// ReasonHostStackBypass and the evidence when the CNI bypasses it.
const NodeConditionDatapath corev1.NodeConditionType = "EgressDatapathSupported"

// NodeConditionOwnership is the Node condition the controller keeps from
// each agent's ownership status (the agent report's Ownership): True while the
// agent knows which addresses it added (reason AddressProtocol or
// OwnershipRecord, the mechanism), False while its ownership record is
// unreadable, unwritable or missing, with what to do in the message.
const NodeConditionOwnership corev1.NodeConditionType = "EgressIPOwnershipKnown"

// NodeConditionKernel is the Node condition the controller keeps from each
// agent's kernel feature probe (the agent report's Kernel): True when every
// feature probed was found, False with reason
// ReasonKernelFeatureMissing and a message naming the kernel
// release, the missing features and the parts of the agent degraded or not
// started (docs/agent.md has the table).
const NodeConditionKernel corev1.NodeConditionType = "EgressKernelFeatures"

// NodeConditionAgentReachable is the Node condition the controller keeps
// from its polls of each agent that has answered once since it started:
// True (reason ReasonAgentAnswers) while the agent answers, False
// (ReasonAgentUnreachable) once it is declared dead and its IPs are
// moved, with a Warning Event; a Normal Event when it answers again.
const NodeConditionAgentReachable corev1.NodeConditionType = "EgressAgentReachable"

// NodeConditionFenced is the Node condition the controller keeps from each
// agent's fence status (the agent report's Fence), once that agent has fenced
// at least once: True with reason ReasonSelfFenced while it holds
// no egress IP because it fenced itself, False with reason
// ReasonFenceLifted after; the message says when and why the last
// fence began, and when it was lifted. A Warning Event marks each fence.
const NodeConditionFenced corev1.NodeConditionType = "EgressSelfFenced"

// NodeConditionVLANs is the Node condition the controller keeps from each
// agent started with --create-vlans (the agent report's VLANs): True
// (ReasonVLANLinksReady) while every VLAN sub-interface the egress IPs
// assigned to the Node need is in place, False while one cannot be had,
// with the reason of the first problem (ReasonVLANParentMissing,
// ReasonVLANForeignLink, ReasonVLANConflict or ReasonVLANLinkFailed) and a
// message naming, per problem, the egress IP, the parent, the VLAN ID and
// the foreign link. A Warning Event with that reason is recorded on the
// Node when it turns False, a Normal one when it is True again. The
// Egresses of those IPs are not Ready (ReasonBindRefused) meanwhile.
const NodeConditionVLANs corev1.NodeConditionType = "EgressVLANLinksReady"

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
