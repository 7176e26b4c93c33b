package controller

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"

	v1 "github.com/egressip/egressip/api/v1alpha1"
)

// selectorMemo remembers, across passes, what selectorError said for each
// Egress spec: an Egress's appliedTo can change only with its spec, and
// every spec change bumps metadata.generation (the Kubernetes convention
// for resources with a status subresource), so the pair (UID, generation)
// names one appliedTo. Parsing both selectors of every Egress in every pass
// (metav1.LabelSelectorAsSelector validates each key and value with
// regular expressions) was a sixth of a pass over 5,000 Egresses
// (BenchmarkPass).
//
// Entries not asked for during a pass are dropped at its end (endPass),
// so the memo holds the Egresses of the last pass. A nil memo computes
// every time. Safe for concurrent use.
type selectorMemo struct {
	mu      sync.Mutex
	entries map[types.UID]*selectorEntry
	// pass counts the passes that ended; entry.pass says in which one an
	// entry was last asked for.
	pass uint64
}

// selectorEntry is selectorError's answer for one spec of one Egress.
type selectorEntry struct {
	gen  int64
	err  error
	pass uint64
}

// err is selectorError(e), from the memo when e's spec was seen before.
// An Egress without a UID or generation (built in a test, never stored by
// an API server) is not remembered.
func (m *selectorMemo) err(e *v1.Egress) error {
	if m == nil || e.UID == "" || e.Generation == 0 {
		return selectorError(e)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if en := m.entries[e.UID]; en != nil && en.gen == e.Generation {
		en.pass = m.pass
		return en.err
	}
	if m.entries == nil {
		m.entries = map[types.UID]*selectorEntry{}
	}
	en := &selectorEntry{gen: e.Generation, err: selectorError(e), pass: m.pass}
	m.entries[e.UID] = en
	return en.err
}

// endPass forgets the Egresses the pass that ends did not ask for.
func (m *selectorMemo) endPass() {
	if m == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for uid, en := range m.entries {
		if en.pass != m.pass {
			delete(m.entries, uid)
		}
	}
	m.pass++
}
