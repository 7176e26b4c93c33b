/*
Copyright 2026 The egressip Authors.

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// EgressLabel is the label every EgressMemberSlice carries, whose value is
// the name of its Egress, so `kubectl get egressmemberslices -l
// egressip.io/egress=payments` lists one Egress's slices. Egress names longer
// than a label value allows (63 characters) get no label; the slice's
// egress field is authoritative.
const EgressLabel = "egressip.io/egress"

// MaxMembersPerSlice is the largest number of members one
// EgressMemberSlice holds, the EndpointSlice default (kube-controller-manager
// --max-endpoints-per-slice).
const MaxMembersPerSlice = 100

// EgressMember is one Pod that uses an Egress: one of its IPs, of the
// Egress's family, and the IP of its Node of the same family.
type EgressMember struct {
	// PodIP is the Pod's IP (from status.podIPs), in canonical form.
	// +required
	// +kubebuilder:validation:MinLength=2
	// +kubebuilder:validation:MaxLength=39
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="podIP must be an IPv4 or IPv6 address"
	// +kubebuilder:validation:XValidation:rule="!isIP(self) || ip.isCanonical(self)",message="podIP must be written in canonical form (RFC 5952 for IPv6)"
	PodIP string `json:"podIP"`

	// HostIP is the IP of the Pod's Node (from status.hostIPs) of the same
	// family as PodIP: where the egress Node tunnels return traffic.
	// +required
	// +kubebuilder:validation:MinLength=2
	// +kubebuilder:validation:MaxLength=39
	// +kubebuilder:validation:XValidation:rule="isIP(self)",message="hostIP must be an IPv4 or IPv6 address"
	// +kubebuilder:validation:XValidation:rule="!isIP(self) || ip.isCanonical(self)",message="hostIP must be written in canonical form (RFC 5952 for IPv6)"
	HostIP string `json:"hostIP"`
}

// EgressMemberSlice lists some of the Pods that use one Egress, so the egress
// Node learns where remote members run without watching every Pod of the
// cluster. The controller writes them, like the EndpointSlice controller:
// at most MaxMembersPerSlice members each, labelled with EgressLabel and
// owned by their Egress (deleted with it). A member stays in its slice while
// it exists, so one Pod's change rewrites one slice. Users do not write
// them.
//
// Cluster-scoped, like the Egress that owns it: a cluster-scoped owner can
// garbage-collect it, and agents read the slices without knowing the
// namespace the controller runs in.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=ems
// +kubebuilder:selectablefield:JSONPath=`.egress`
// +kubebuilder:printcolumn:name="Egress",type=string,JSONPath=`.egress`,description="The Egress these Pods use"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type EgressMemberSlice struct {
	metav1.TypeMeta `json:",inline"`

	// metadata is a standard object metadata
	// +optional
	metav1.ObjectMeta `json:"metadata,omitzero"`

	// Egress is the name of the Egress these members use. Selectable as a
	// field (egress=<name>).
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Egress string `json:"egress"`

	// Members are the Pods, at most 100, each PodIP at most once.
	// +optional
	// +listType=map
	// +listMapKey=podIP
	// +kubebuilder:validation:MaxItems=100
	Members []EgressMember `json:"members,omitempty"`
}

// EgressMemberSliceField is the field path of a slice's Egress name,
// selectable in list and watch requests (egress=payments).
const EgressMemberSliceField = "egress"

// +kubebuilder:object:root=true

// EgressMemberSliceList contains a list of EgressMemberSlice.
type EgressMemberSliceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitzero"`
	Items           []EgressMemberSlice `json:"items"`
}

func init() {
	SchemeBuilder.Register(func(s *runtime.Scheme) error {
		s.AddKnownTypes(SchemeGroupVersion, &EgressMemberSlice{}, &EgressMemberSliceList{})
		return nil
	})
}
