// Package scheduler decides which Node holds each egress IP.
//
// It is pure Go over plain values: no Kubernetes types, no clock, no
// randomness, no I/O. The controller gathers the pools, the Nodes (with their
// eligibility and capacity) and the Egresses (with the Node each one is on
// now) from its cache, calls [Schedule] once per pass, and writes the
// [Result] into the Egress statuses. [ParseCapacity] validates the
// egressip.io/max-egress-ips Node annotation that feeds [Node.Capacity].
//
// # The pass
//
// Egresses that name the same IP in the same pool are one unit: they go to
// the same Node and count once against its capacity. A unit's priority is
// that of its oldest member: earlier creation time first, then smaller name.
// A pass has two phases over the units, each in priority order:
//
//  1. Keep. A unit stays on its current Node (the current Node of its
//     oldest member that names a Node still fit for the unit's pool) while
//     that Node has room. Room is counted in priority order, so when a
//     Node's capacity drops, its newest units are the ones that leave.
//     Keeping never evicts anyone, so a Node that becomes eligible again
//     takes nothing back, and adding a Node moves nothing.
//  2. Place. Every other unit goes to a Node by consistent hashing with
//     bounded loads (Mirrokni, Thorup and Zadimoghaddam, "Consistent Hashing
//     with Bounded Loads", 2016, arXiv:1608.01350). Each pool has a
//     ring of hash points, a few per eligible Node; a unit's hash picks a
//     point and the unit takes the first Node clockwise from there whose
//     load in the pool is below ceil(c·k/n), where n is the number of
//     eligible Nodes of the pool, k is the number of the pool's units
//     placed so far in this pass counting this one (kept units included),
//     and c is [Input.BalanceFactor]. This is the paper's bound with m = k,
//     so a unit's placement never depends on newer units. Only when every
//     Node with room is at the bound (which takes Nodes filled by other
//     pools: with one pool and c >= 1 some Node is always below it) does
//     the unit go past it, to the first Node clockwise among those with
//     room that hold the fewest units of the pool; so no unit is left out
//     while an eligible Node has room, and a Node never goes past the
//     bound while another Node with room holds fewer of the pool's units.
//
// A Node is fit for a pool when it is in [Input.Nodes] with Eligible set and
// a Capacity above 0, and its name is in the pool's EligibleNodes. A Node
// never holds more units than its [Node.Capacity], counted across all
// pools. A unit whose pool has no eligible Node with room is reported
// unplaced; that check is a counter per pool, so a full pool costs O(1) per
// unit, not a walk around the ring.
//
// # Multi-IP Egresses
//
// An Egress with [Egress.Slots] asks for several IPs. Each slot is a unit
// as above (slots and single-IP Egresses that name the same pool and IP
// share one), with the Egress's priority and, within the Egress, slot
// order, and every rule above holds per IP: keep, place, the bound and the
// capacity count IPs. One rule is added: a Node holds at most one IP of
// any one Egress. In phase 1 a unit does not keep a Node that a unit of the
// same Egress keeps already (v1alpha1.MoveDistinctNodes); in phase 2 the
// Nodes of the units of its Egresses placed so far are closed to it, and
// when they are the only Nodes of its pool with room it stays unplaced
// with v1alpha1.ReasonFewerNodesThanIPs. The answers per slot are in
// [Result.Slots]. multi.go flattens such Egresses into one entry per slot
// and folds the Result back; an input without Slots skips it entirely.
//
// # Determinism
//
// The result depends only on the input values, never on the order of any
// input slice, on map iteration order, or on the process: hashes are a
// fixed function (8-byte words mixed by MurmurHash3's 64-bit finalizer, with
// no per-process seed), and every sort has a total order (ties in hash
// values are broken by Node name). Equal inputs give equal results, byte for
// byte.
//
// # Cost
//
// For E Egresses, N Nodes and M entries in all the pools' EligibleNodes
// lists, a pass costs:
//
//   - O(N + M) to index the Nodes and the pools' members;
//   - O(E) per varying key byte to order the Egresses by name and by
//     priority (LSD radix sorts on 16-byte keys that skip the bytes all keys
//     share; creation times that span fewer than 2E seconds take one
//     counting pass), plus a comparison sort among names that agree on the
//     16 bytes after their common prefix;
//   - O(E) expected to group Egresses into units (an open-addressing table
//     on the unit's ring hash);
//   - for a pool that has units to place: O(n·p) to build its ring (n
//     Nodes, p points each, bucket-sorted by position), then per unit an
//     O(1) expected lookup of its position, a scan of at most 64 points
//     clockwise for the first fitting Node and, only when that scan finds
//     none, an O(log n) segment-tree search (the tree is built, in O(n·p),
//     the first time a pass needs it; updates then cost O(p log n), O(p)
//     before).
//
// A pass whose units all keep their Node builds no ring. Allocations are a
// fixed number of slices and maps per pass, plus one message string per
// invalid Egress.
//
// # How to read this package
//
// The rules above fit in under 300 lines, and reference_test.go has them
// that way: referenceSchedule, a plain restatement with maps, sorts and
// linear scans, one method per step (index, static, group, keep, place,
// result, moveReason). Read it first. [Schedule] gives the same Result
// (TestDifferential* compare the two on random, wide, benchmark and named
// inputs); it is longer only because it is fast.
//
// Where each rule lives in Schedule (schedule.go unless named):
//
//   - Repeated Node names, merged to the most restrictive view:
//     state.indexNodes.
//   - Pools: repeated names and unknown families are invalid; a pool's
//     members are its listed Nodes that are eligible with capacity > 0:
//     state.indexPools.
//   - Repeated Egress names (DuplicateEgress): state.sortNames.
//   - The other reasons an Egress cannot be scheduled (PoolNotFound,
//     PoolInvalid, IPNotAllocated, IPInvalid), the fitness of its current
//     Node and of its Preferred Node: state.buildUnits.
//   - Priority order (creation time, then name): priorityKeys, sorted in
//     state.buildUnits.
//   - Units of Egresses sharing an IP, with the Node to keep and the
//     Preferred Node of the oldest member that names a fit one:
//     groupUnits.
//   - Phase 1, keep: state.keep.
//   - Phase 2, place, with Preferred Nodes and the unplaced reasons
//     (NoEligibleNode, CapacityExhausted): state.place; the bound
//     ceil(c·k/n): state.boundAt; the first Node clockwise below the bound,
//     or else the first with the fewest units of the pool among those with
//     room: ring.pick (ring.go).
//   - The ring: hashString, pointHash and unitHash (ring.go) place the
//     points and units; state.buildRing orders points by position, ties by
//     Node name.
//   - Placements, their messages and the Moves with their reasons:
//     state.result, state.poolMessage, ipInvalidMessage, state.moves,
//     state.moveReason.
//   - The capacity annotation: ParseCapacity (capacity.go).
//
// The rest is speed machinery, which decides nothing: the radix sorts of
// sort.go (radixSort and its helpers) and the key layout of nameKey and
// priorityKeys; the open-addressing tables of state.lookupNode and
// groupUnits; the flat pool-member slots (slotNode, state.slotsByNode,
// state.slotOf); the pool's room counter in state.place, which stands for
// a scan of its members; the bound cache (state.bound, state.nextBound);
// the ring's bucket index (ring.lowerBound), the probe of the first
// probeLimit points in ring.pick and the segment tree behind it
// (ring.ensureTree, ring.update, ring.firstBelow); the ring's build loops
// (ringValues, ringPositions, prefixSum, ringScatter, ringLeaves, kept out
// of line with //go:noinline); the message caches (state.moveReasons,
// poolRec.msg); and the recycled working memory (statePool, grow, reuse).
//
// The tests, by what they show: check_test.go is an independent checker
// of the rules (checkResult, checkOrderIndependent), shown able to fail by
// TestChecker*; property_test.go draws random clusters (genInput) for it
// and for TestDifferential*; schedule_test.go has the named cases and
// golden_test.go a few whole Results written out; fuzz_test.go decodes
// arbitrary bytes into inputs for both the checker and the reference;
// bench_test.go holds the speed targets. A change to the rules changes
// reference_test.go and check_test.go first; TestDifferential* then shows
// where Schedule still differs.
package scheduler
