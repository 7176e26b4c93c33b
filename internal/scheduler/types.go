package scheduler

import (
	"net/netip"
	"strconv"
	"time"
)

// Family is the IP family of a pool: IPv4 or IPv6. A pool holds one family;
// a workload that needs both gets two Egresses.
type Family int

// The IP families. Any other Family value makes a pool invalid
// ([v1alpha1.ReasonPoolInvalid]).
const (
	IPv4 Family = 4
	IPv6 Family = 6
)

// String returns "IPv4", "IPv6" or "Family(n)".
func (f Family) String() string {
	switch f {
	case IPv4:
		return "IPv4"
	case IPv6:
		return "IPv6"
	}
	return "Family(" + strconv.Itoa(int(f)) + ")"
}

// Pool is one ExternalIPPool as the scheduler sees it.
type Pool struct {
	// Name is the pool's name; Egress.Pool refers to it. Names must be
	// unique: a name given twice makes that pool invalid.
	Name string
	// Family is the IP family of every address in the pool.
	Family Family
	// EligibleNodes are the names of the Nodes that match the pool's
	// nodeSelector. Order and repeats do not matter; names that are not in
	// Input.Nodes are ignored. A Node listed here still needs
	// Node.Eligible and Node.Capacity > 0 to hold IPs.
	EligibleNodes []string
}

// Node is one Kubernetes Node as the scheduler sees it.
type Node struct {
	// Name is the Node's name. A name given twice is merged: the Node is
	// eligible only if every entry is, with the smallest capacity given.
	Name string
	// Eligible is true when the Node may hold egress IPs at all: Ready, not
	// NetworkUnavailable, not cordoned or being deleted, agent alive, Linux.
	Eligible bool
	// Reason says why the Node is not eligible, in one CamelCase word
	// (NotReady, NetworkUnavailable, Cordoned, AgentDead, ...). It is copied
	// into the Reason of the Moves off this Node; it is ignored when
	// Eligible is true.
	Reason string
	// Capacity is the most egress IPs the Node may hold, across all pools:
	// the Node's egressip.io/max-egress-ips annotation if valid (see
	// ParseCapacity), else the controller's --max-egress-ips-per-node.
	// 0 or less means the Node takes no IPs.
	Capacity int
}

// Egress is one Egress object as the scheduler sees it.
type Egress struct {
	// Name is the Egress's name (Egresses are cluster-scoped, so names are
	// unique). A name given twice is reported as v1alpha1.ReasonDuplicateEgress and
	// none of its entries is scheduled.
	Name string
	// Created is the creation timestamp; older Egresses have priority when
	// capacity is short, ties broken by Name. The zero time sorts first.
	Created time.Time
	// Pool is the name of the Egress's ExternalIPPool.
	Pool string
	// IP is the Egress's allocated IP; the zero Addr means not allocated
	// yet. It must be of the pool's family and carry no IPv6 zone.
	// Egresses with the same Pool and IP are one unit: one Node, counted
	// once against its capacity.
	IP netip.Addr
	// CurrentNode is the Node that holds the IP now (status.egressNode),
	// or "" when none does.
	CurrentNode string
	// Preferred is a Node to try first when the Egress's unit is placed
	// (phase 2; a kept unit stays where it is): the unit takes it when it
	// is fit for the pool, has room, and holds fewer of the pool's units
	// than the balance bound; otherwise the ring decides as usual. A unit
	// follows its oldest member that names a fit Preferred Node. The
	// controller names the Node whose cloud interface already holds the
	// IP (a warm IP), so that placing it costs no cloud call. "" means no
	// preference.
	Preferred string
	// Slots, when not empty, makes the Egress a multi-IP Egress (spec.ips):
	// one slot per IP, in status order, and Pool, IP, CurrentNode and
	// Preferred above are ignored. Each slot is scheduled like the IP of a
	// single-IP Egress with the Egress's priority (slots of one Egress in
	// slot order), with one more rule: a Node holds at most one slot of any
	// one Egress. Slots whose pool and IP equal another Egress's are one
	// unit with it, as above; the unit then keeps every Egress's rule. The
	// Egress's name must contain no NUL byte (Kubernetes names never do).
	// At most 255 slots are scheduled; the others get ReasonIPInvalid.
	Slots []Slot
}

// Slot is one IP of a multi-IP Egress: the same fields as a single-IP
// Egress's, with the same meaning.
type Slot struct {
	Pool        string
	IP          netip.Addr
	CurrentNode string
	Preferred   string
}

// SlotPlacement is the scheduling decision for one slot of a multi-IP
// Egress; Node, Reason and Message mean what they mean in Placement.
type SlotPlacement struct {
	Node    string
	Reason  string
	Message string
}

// DefaultBalanceFactor is the balance factor c used when
// Input.BalanceFactor is unset or invalid.
const DefaultBalanceFactor = 1.25

// Input is everything one scheduling pass looks at.
type Input struct {
	Pools    []Pool
	Nodes    []Node
	Egresses []Egress
	// BalanceFactor is c in the bound ceil(c·k/n) of consistent hashing
	// with bounded loads (see the package documentation): the most units
	// of a pool a Node receives, as a multiple of the pool's average so
	// far. The bound is computed in float64 as math.Ceil(c*k/n), capped at
	// k. c must be at least 1; +Inf turns the bound off (plain consistent
	// hashing, capacity only). 0, NaN and values below 1 mean
	// DefaultBalanceFactor.
	BalanceFactor float64
}

// Placement is the scheduling decision for one Egress.
type Placement struct {
	// Egress is the Egress's name.
	Egress string
	// Node is the Node that holds the Egress's IP after this pass, or ""
	// when the Egress is not placed.
	Node string
	// Reason is "" when Node is set; otherwise one of the Reason*
	// constants, saying why the Egress has no Node.
	Reason string
	// Message is a sentence for humans that goes with Reason (for the
	// Assigned condition and the Event); "" when Node is set.
	Message string
}

// Move records that an Egress leaves the Node it is on now.
type Move struct {
	// Egress is the Egress's name.
	Egress string
	// From is the Egress's CurrentNode.
	From string
	// To is the Egress's new Node, or "" when it is left without one (the
	// Egress's Placement says why).
	To string
	// Reason is why the Egress left From: one of the Move* constants, or
	// v1alpha1.MoveNodeIneligible + "/" + Node.Reason, or, when the Egress cannot
	// be scheduled at all, its Placement.Reason; for a slot of a multi-IP
	// Egress also v1alpha1.MoveDistinctNodes.
	Reason string
	// Slot is the index in Egress.Slots of the slot that moves, for a
	// multi-IP Egress; 0 for a single-IP one. Moves are sorted by Egress
	// name, then Slot.
	Slot int
}

// Result is the outcome of one pass.
type Result struct {
	// Placements has one entry per distinct Egress name, sorted by name.
	// For a multi-IP Egress, Node is the Node of its first slot that has
	// one ("" when none has), and Reason and Message are those of its
	// first slot without a Node ("" when every slot has one): unlike a
	// single-IP Egress's, they can be set with Node.
	Placements []Placement
	// Slots has, for each multi-IP Egress (one with Egress.Slots and a
	// name given once), one SlotPlacement per slot; nil when the input has
	// none. It is beside Placements, not in them, so that a single-IP
	// pass returns what it returned before multi-IP Egresses existed.
	Slots map[string][]SlotPlacement
	// Moves has one entry per Egress whose CurrentNode is set and differs
	// from its new Node (including no Node), sorted by Egress name; nil
	// when nothing moves. Egresses with a duplicated name get no Move.
	Moves []Move
}
