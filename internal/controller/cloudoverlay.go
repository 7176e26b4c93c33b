package controller

import (
	"net/netip"
	"slices"
	"time"

	"github.com/egressip/egressip/internal/cloud"
)

// Overlays for whole interfaces and Elastic IP associations.
//
// A re-read of the cloud (Refresh, refreshNodes, refreshElasticIPs) takes
// its snapshot at the provider call and writes it into the view later,
// under the lock. A call of ours that completed in between (an interface
// attached, an Elastic IP associated) recorded its result in the view,
// and the re-read then overwrote it with the older state: the next pass
// saw the allocation free again and associated it a second time (a second
// AssociateAddress call; TestElasticIPOwnInterfaces failed once under
// load), or saw the instance without the interface just attached and
// picked its device index again for the next create (the attach then
// failed). The address overlay (CloudActuator.overlay) already covered
// secondary addresses; these cover the rest.
//
// Each successful call takes a sequence number (writeSeq). An entry is
// applied over every re-read until a re-read that began after the call
// completed shows it (then the cloud has it and the entry is dropped),
// or until CloudConfig.Overlay passes (the cloud's reads lag its writes,
// or someone else changed it since; after that the cloud is believed).

// eniOverlayEntry is an interface one of our creates attached.
type eniOverlayEntry struct {
	node     string
	eni      cloud.ENI // InstanceID, DeviceIndex, AttachmentID and Tags set
	seq      uint64
	deadline time.Time
}

// eipOverlayEntry is an allocation's association as one of our Elastic IP
// calls left it (AssociationID "" after a disassociate).
type eipOverlayEntry struct {
	pool                       string
	associationID, interfaceID string
	private                    netip.Addr
	seq                        uint64
	deadline                   time.Time
}

// nextWriteSeq returns the sequence number of a call that just completed.
// Called with c.mu held.
func (c *CloudActuator) nextWriteSeq() uint64 {
	c.writeSeq++
	return c.writeSeq
}

// readSeq is the sequence number a re-read starting now compares the
// overlay entries with.
func (c *CloudActuator) readSeq() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.writeSeq
}

// attachedENI records an interface our create attached to node's
// instance. Called with c.mu held.
func (c *CloudActuator) attachedENI(node string, eni cloud.ENI, now time.Time) {
	c.eniOverlay[eni.ID] = eniOverlayEntry{node: node, eni: eni, seq: c.nextWriteSeq(), deadline: now.Add(c.cfg.Overlay)}
}

// overlayENIs puts the interfaces of eniOverlay that the re-read got
// (begun at sequence number seq) does not show into got (for the Nodes
// it read) and, when listed is set, into tagged (the listing by tag). It
// returns tagged. Called with c.mu held.
func (c *CloudActuator) overlayENIs(got map[string]cloud.Interface, tagged []cloud.ENI, listed bool, seq uint64, now time.Time) []cloud.ENI {
	for id, o := range c.eniOverlay {
		if now.After(o.deadline) {
			delete(c.eniOverlay, id)
			continue
		}
		ifc, ok := got[o.node]
		if !ok || ifc.InstanceID != o.eni.InstanceID {
			continue // not read this time, or the Node runs on another instance now
		}
		if slices.ContainsFunc(ifc.Others, func(e cloud.ENI) bool { return e.ID == id }) {
			if o.seq <= seq {
				delete(c.eniOverlay, id) // the cloud shows it
			}
		} else {
			e := o.eni
			e.Secondary = nil // the address overlay puts back ours
			ifc.Others = append(slices.Clone(ifc.Others), e)
			slices.SortFunc(ifc.Others, func(a, b cloud.ENI) int { return a.DeviceIndex - b.DeviceIndex })
			got[o.node] = ifc
		}
		if !listed {
			continue
		}
		switch i := slices.IndexFunc(tagged, func(e cloud.ENI) bool { return e.ID == id }); {
		case i < 0:
			tagged = append(tagged, o.eni)
		case tagged[i].InstanceID == "":
			// Listed between the create and the attach: without this the
			// collector would take it for a detached leftover.
			tagged[i].InstanceID, tagged[i].DeviceIndex, tagged[i].AttachmentID = o.eni.InstanceID, o.eni.DeviceIndex, o.eni.AttachmentID
		}
	}
	return tagged
}

// associated records the association one of our Elastic IP calls left
// (associationID "" for a disassociate). Called with c.mu held.
func (c *CloudActuator) associated(pool, allocation, associationID, iface string, private netip.Addr, now time.Time) {
	c.eipOverlay[allocation] = eipOverlayEntry{pool: pool, associationID: associationID, interfaceID: iface, private: private,
		seq: c.nextWriteSeq(), deadline: now.Add(c.cfg.Overlay)}
}

// overlayEIPs puts the associations of eipOverlay that the re-read views
// (begun at sequence number seq) does not show into it. Called with c.mu
// held.
func (c *CloudActuator) overlayEIPs(views map[string]eipView, seq uint64, now time.Time) {
	for id, o := range c.eipOverlay {
		if now.After(o.deadline) {
			delete(c.eipOverlay, id)
			continue
		}
		v, ok := views[o.pool]
		if !ok || v.Err != "" {
			continue
		}
		i := slices.IndexFunc(v.IPs, func(e cloud.ElasticIP) bool { return e.AllocationID == id })
		if i < 0 {
			delete(c.eipOverlay, id) // the pool no longer names it, or it was released
			continue
		}
		if e := v.IPs[i]; e.AssociationID == o.associationID && (o.associationID == "" || e.PrivateIP == o.private) {
			if o.seq <= seq {
				delete(c.eipOverlay, id) // the cloud shows it
			}
			continue
		}
		v.IPs = slices.Clone(v.IPs)
		v.IPs[i].AssociationID, v.IPs[i].InterfaceID, v.IPs[i].PrivateIP = o.associationID, o.interfaceID, o.private
		views[o.pool] = v
	}
}
