// Package fence decides when an egressip-agent must release the egress IPs
// of its Node on its own (self-fencing), and gathers what that decision
// needs: the time of the controller's last poll, whether the API server
// answers, and what a small set of peer agents say.
//
// The problem (docs/failover.md, "Fencing a cut-off Node"): the controller
// declares an agent dead after --agent-dead-after without an answer and
// assigns its IPs to other Nodes. A Node that is only cut off from the
// control plane, and still on the clients' L2 segment, would keep answering
// ARP / ND for those IPs: two Nodes would answer. The agent therefore
// unbinds its IPs before the controller can move them, but only when the
// evidence says that the controller is alive and cannot reach this Node, or
// that this Node is alone:
//
//   - no controller poll for Config.Timeout, and
//   - no answer from the API server since the polls stopped (it is probed
//     only then, so it costs nothing in steady state), and
//   - either fewer than a majority of the peer set answer (this Node is
//     isolated, or on the minority side of a partition), or a majority of
//     the peers that answer were polled by the controller after this
//     Node's last poll (the controller is alive, polls others, and will
//     declare this Node dead).
//
// When the peers that answer were not polled either, the controller is down
// (a crash, or an API-server outage that cost the leader its lease) and
// nothing can move the IPs: nothing is fenced. A controller crash leaves
// the API server reachable, so it fences nothing either way.
//
// Decide is the rule as a pure function; Fencer runs it every
// Config.ProbeInterval once polls are late, and PeerHandler / PeerClient are
// the two ends of the peer probe (GET /peer on the agent's report port).
package fence
