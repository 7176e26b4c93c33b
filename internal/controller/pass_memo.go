package controller

import (
	"net/netip"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/report"
	"github.com/egressip/egressip/internal/scheduler"
)

// The incremental Egress status phase (issue 22 goal 4). In steady state
// a pass decides for almost every Egress what the pass before decided:
// same object, same address, same Node, same report from that Node's
// agent. Rebuilding its conditions and messages, and comparing the result
// with the status read, was three quarters of such a pass
// (BenchmarkPass). egressMemo keeps, per Egress UID, the change the last
// computation produced with the inputs it was computed from (memoKey, and
// the lists compared beside it); a pass whose inputs for that Egress are
// the same replays the change and its effects on the pass's output
// (Awaited, Conflicts) instead of recomputing it.
//
// The full computation (egressStatus) stays the reference: plan without a
// memo (passInput.Memo nil) computes every Egress, and
// TestIncrementalPassMatchesReference checks, over randomized sequences of
// passes, that the memo changes nothing in the output.
//
// A replayed change keeps the transition times it was computed with: after
// a failed or deferred write, the write carries the time the condition
// first changed rather than the time of the pass that retries it (the
// differential test compares statuses with those times set aside). The
// pass reads each agent once (agentSnapshot), so a key's agent facts are
// those the status was computed from.
//
// Only the common case is remembered, and everything else is recomputed
// in every pass: the Egress has a single IP in a valid L2 pool (no cloud
// provider in the pass), an address that is no Node's, and its Node
// stays the one its status names (no move, no release wait, no release
// timeout, no clock), and its Node's agent reports no duplicate-IP
// conflict for the address.

// egressMemo remembers the Egress status phase's outcome per Egress UID
// across passes. A nil memo remembers nothing (the reference). The pass
// worker alone uses it (not safe for concurrent use).
type egressMemo struct {
	entries map[types.UID]*memoEntry
	// pass counts the passes that ended; memoEntry.pass says in which one
	// an entry was last used.
	pass uint64
	// hits counts the statuses replayed from the memo since it was made.
	hits uint64
}

// memoEntry is one Egress's remembered outcome.
type memoEntry struct {
	key memoKey
	// holders are the Nodes whose agents reported the address bound,
	// refusals the Nodes refusing the Egress's datapath, shadowedBy the
	// status.shadowedBy the pass read (the overlay of the member
	// publication): inputs that are lists, compared beside key.
	holders    []string
	refusals   []nodeRefusal
	shadowedBy []string
	// ch is the change computed, without status.sharedWith (set across
	// Egresses after the phase); awaited and conflict its effects on the
	// pass's output.
	ch       egressChange
	awaited  []string
	conflict bool
	// same says whether ch.Status, sharedWith aside, is semantically equal
	// to the status read (from the API server, before the member
	// publication's overlay): unknown until egressWrites first compares
	// them. The read status is a function of key (resource version and
	// overlay), so the answer holds as long as the entry.
	same memoSame
	pass uint64
}

// memoSame is what egressWrites knows of an entry's status against the
// status read.
type memoSame uint8

const (
	sameUnknown memoSame = iota
	sameYes
	sameNo
)

// memoKey holds the comparable inputs of one Egress's status: the object
// read (UID and resource version name one version of it: the API server
// changes the resource version with every write of spec or status) and
// what the member publication's overlay put into its status; what
// allocation and scheduling decided for it; the release timeout its
// messages quote; and its Node's agent's report about its address.
type memoKey struct {
	resourceVersion string
	selected        int32
	hasSelected     bool
	// alloc is what allocation decided, whole: a field added to
	// egressAlloc is in the key without a change here (its conflict is
	// always nil: memoKeyOf serves no Egress with one).
	alloc          egressAlloc
	placed         scheduler.Placement
	moveReason     string
	releaseTimeout time.Duration
	agent          agentFacts
}

// agentFacts is what the status of an Egress with address ip on a Node
// reads of that Node's agent (readyCondition, conflictCondition): whether
// it answered and lives, the report's entries for ip, and its ownership
// finding.
type agentFacts struct {
	known, dead  bool
	bound        report.BoundIP
	boundOK      bool
	refusedMsg   string
	refusedOK    bool
	ownership    report.OwnershipStatus
	hasOwnership bool
	conflictOK   bool
}

// factsOf reads node's agent state a for ip.
func factsOf(a *AgentState, ip netip.Addr) agentFacts {
	f := agentFacts{known: a.Known, dead: a.Dead}
	f.bound, f.boundOK = a.Report.Lookup(ip)
	r, ok := a.Report.LookupRefused(ip)
	f.refusedMsg, f.refusedOK = r.Message, ok
	if o := a.Report.Ownership; o != nil {
		f.ownership, f.hasOwnership = *o, true
	}
	_, f.conflictOK = a.Report.LookupConflict(ip.Unmap())
	return f
}

// memoKeyOf returns the memo key of Egress i, or ok false when the Egress is not one the memo serves (see above): its
// status is then computed in every pass.
func (p *pass) memoKeyOf(i int) (key memoKey, ok bool) {
	e := p.egs[i]
	a := &p.alloc[i]
	if p.cloud != nil || p.isMulti(i) || e.UID == "" || e.ResourceVersion == "" || a.conflict != nil || !a.ip.IsValid() {
		return memoKey{}, false
	}
	ps := p.pools[e.Spec.ExternalIPPool]
	if ps == nil || ps.err != nil {
		return memoKey{}, false
	}
	if _, l2 := ps.kind.(l2Pool); !l2 {
		return memoKey{}, false
	}
	pl := p.sched.placed[e.Name]
	if pl.Node == "" || pl.Node != e.Status.EgressNode {
		return memoKey{}, false
	}
	st := p.in.Agents(pl.Node)
	key = memoKey{
		resourceVersion: e.ResourceVersion,
		alloc:           *a,
		placed:          pl,
		moveReason:      p.sched.moveReason[e.Name],
		releaseTimeout:  p.in.Config.ReleaseTimeout,
		agent:           factsOf(&st, a.ip),
	}
	if key.agent.conflictOK && key.agent.known && !key.agent.dead {
		return memoKey{}, false // the Conflict message quotes other Nodes' MACs
	}
	if s := e.Status.SelectedPods; s != nil {
		key.selected, key.hasSelected = *s, true
	}
	return key, true
}

// lookup returns the entry of Egress i when its inputs are those of key
// and the lists the pass holds for it, marking it used; else nil.
func (m *egressMemo) lookup(p *pass, i int, key *memoKey) *memoEntry {
	e := p.egs[i]
	en := m.entries[e.UID]
	if en == nil || en.key != *key || !slices.Equal(en.holders, p.sched.holders[key.alloc.ip]) ||
		!slices.Equal(en.refusals, p.sched.refused[e.Name]) || !slices.Equal(en.shadowedBy, e.Status.ShadowedBy) {
		return nil
	}
	en.pass = m.pass
	m.hits++
	return en
}

// store remembers what the pass computed for Egress i under key: the
// change ch and its effects (awaited, conflict). It returns the entry.
func (m *egressMemo) store(p *pass, i int, key *memoKey, ch egressChange, awaited []string, conflict bool) *memoEntry {
	e := p.egs[i]
	if m.entries == nil {
		m.entries = map[types.UID]*memoEntry{}
	}
	en := &memoEntry{key: *key, holders: slices.Clone(p.sched.holders[key.alloc.ip]), refusals: slices.Clone(p.sched.refused[e.Name]),
		shadowedBy: slices.Clone(e.Status.ShadowedBy), ch: ch, awaited: slices.Clone(awaited), conflict: conflict, pass: m.pass}
	en.ch.memo = en
	m.entries[e.UID] = en
	return en
}

// endPass forgets the Egresses the pass that ends did not use.
func (m *egressMemo) endPass() {
	if m == nil {
		return
	}
	for uid, en := range m.entries {
		if en.pass != m.pass {
			delete(m.entries, uid)
		}
	}
	m.pass++
}

// statusEqualToRead reports whether the pass's status for an Egress
// (ch) equals the status read (read), in the sense of egressStatusEqual;
// with a memo entry it compares only status.sharedWith once the entry
// knows how the rest compares.
func statusEqualToRead(read *v1.EgressStatus, ch *egressChange) bool {
	en := ch.memo
	if en == nil {
		// A copy: egressStatusEqual's reflection makes what it is given
		// escape, and ch itself would then live on the heap in every
		// caller, memo entry or not.
		st := ch.Status
		return egressStatusEqual(read, &st)
	}
	if en.same == sameUnknown {
		a, b := *read, ch.Status
		a.SharedWith, b.SharedWith = nil, nil
		en.same = sameNo
		if egressStatusEqual(&a, &b) {
			en.same = sameYes
		}
	}
	// sharedWith is a list of names: nil and empty alike, as in
	// equality.Semantic.
	return en.same == sameYes && slices.Equal(read.SharedWith, ch.Status.SharedWith)
}
