// Package agent is the egressip node agent's reconcile loop: it reads the
// Egresses that hold an IP on this Node (status.egressNode, or an entry of
// status.ips of an Egress with spec.ips), binds those egress IPs with
// package bind, announces them with package announce and serves what it
// holds to the controller with package report.
//
// # Watching
//
// The agent's cache holds every Egress (managedFields dropped): the IPs of
// an Egress with spec.ips name their Nodes in status.ips[*].node, which no
// field selector can select (a CRD selectable field is a scalar), so the
// binding loop reads the cache through an index by holder Node
// (HolderIndex, over status.egressNode and status.ips[*].node) instead of
// asking the API server for a filtered watch (docs/architecture.md, "How
// an agent finds its IPs"). It also caches every ExternalIPPool, which are
// few, for the subnetInfo hints used to choose an interface. Every event maps to one work key, the Node, so any number of
// changes coalesce into one reconcile that recomputes the whole desired set.
//
// With the datapath (RunOptions.Datapath, --datapath=true) the cache
// (DatapathCacheOptions) also holds this Node's Pods, the Namespaces, the
// Nodes and the EgressMemberSlices, since each Node's role for an Egress
// depends on which Node holds it; the binding reconcile still binds only
// the IPs whose status names this Node (HolderIndex, computeDesired). A
// second controller, package datapathsync's Reconciler, computes the Node's
// datapath.State from the Egresses, pools, this Node's Pods, the
// Namespaces, the Nodes and the EgressMemberSlices, and applies it when it
// changes; Run wires it into the same manager.
//
// # Reconciling
//
// One reconcile:
//
//  1. lists the cached Egresses holding an IP here (HolderIndex); desired =
//     the status.egressIP of the single-IP ones whose status.egressNode is
//     this Node and every status.ips[i].ip naming this Node of those with
//     spec.ips, each checked against its own pool (duplicates shared by
//     several Egresses are bound once). An Egress being
//     deleted that still names this Node stays bound until the controller
//     clears or changes its status: the controller, not the agent, decides
//     when an IP leaves a Node;
//  2. stops the announcements of IPs leaving the set, then calls
//     bind.Binder.Sync(desired), which removes owned addresses that are not
//     desired and binds the desired ones;
//  3. starts an announcement burst for every IP that was bound or moved, and
//     once for every desired IP after the agent starts (re-announcing IPs
//     adopted from a previous agent instance);
//  4. records, for the report, every owned address with its interface and
//     whether the first announcement of its burst went out.
//
// A reconcile also runs every Config.ResyncPeriod without any event, so an
// address removed by hand is bound again, and it is retried with a backoff
// capped at the same period when it fails.
//
// # Failures
//
// The agent changes nothing on the Node when it does not know the desired
// state: it never reconciles before the cache's first List has completed
// (the manager waits for it without a timeout), and a failing List leaves the
// addresses as they are. While the API server is unreachable the cache keeps
// its last state, so a control-plane outage removes nothing. When the agent
// stops (SIGTERM, context cancelled) it unbinds nothing: the next instance
// adopts the addresses through the kernel ownership mark (IFA_PROTO) or the
// ownership record (see package bind) and re-announces them. docs/agent.md describes what happens when only this
// Node is cut off from the control plane.
package agent
