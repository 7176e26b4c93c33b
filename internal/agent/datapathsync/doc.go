// Package datapathsync is the node agent's second reconciler: it keeps the
// kernel datapath of one Node (package datapath's nftables table and policy
// routes) in step with the cluster. The first reconciler, package agent's
// Agent, binds and announces egress IPs; both run in one manager, built by
// agent.NewDatapathManager, whose cache (agent.DatapathCacheOptions) holds
// every Egress, ExternalIPPool, Namespace, Node (addresses and Pod CIDRs)
// and EgressMemberSlice, and this Node's Pods alone.
//
// # How to read it
//
//   - state.go: computeState, a pure function from what the cache holds
//     (stateInput) to the Node's datapath.State: each Egress's role on this
//     Node (egress, source, failed), its local and remote members, and the
//     destinations that never take an egress path (CIDRs). The rules live
//     here; everything else is plumbing.
//   - reconciler.go: Reconciler lists the cache, calls computeState and
//     applies the State when it changed or ResyncPeriod passed (faster
//     while the engine drains flows); Egresses the kernel refuses are
//     reported (OnRefused), the others programmed. It also runs the
//     host-stack check (package hoststack) and hands its finding to
//     OnFinding.
//   - podstart.go: the Gate of package podstart: a Pod the egressip-cni
//     plugin announces is classified with the IPs the plugin gives before
//     its status shows them (docs/datapath.md, "Pod start").
//   - servicecidr.go: finds the Service CIDRs from networking.k8s.io/v1
//     ServiceCIDR objects when --service-cidrs is not given.
//   - engine.go: NewEngine and NewHostCheck open the kernel datapath and
//     the host-stack check in a network namespace for cmd/agent.
//   - metrics.go: egressip_agent_datapath_applies_total,
//     egressip_agent_packets_rejected_total and
//     egressip_agent_source_guard_dropped_total (docs/metrics.md).
//
// The name says what the package does (it syncs the datapath with the
// cluster) without the "dp" file prefix it had inside package agent, and
// clashes neither with package datapath (the engine it programs) nor with
// controller-runtime's reconcile. It imports nothing of package agent;
// package agent imports it to wire the Reconciler into Run.
package datapathsync
