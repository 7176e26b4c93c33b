package controller

// The controller's permissions (config/rbac/role.yaml is generated from
// these markers): it reads Egresses, pools and Nodes, writes the status of
// Egresses and pools and the pools' deletion finalizer, patches two Node
// conditions (EgressDatapathSupported and EgressIPOwnershipKnown, relayed
// from the agents, which have no write verbs), records Events, and publishes EgressMemberSlices from
// the Pods and Namespaces it watches.

// +kubebuilder:rbac:groups=egressip.io,resources=egresses,verbs=get;list;watch
// +kubebuilder:rbac:groups=egressip.io,resources=externalippools,verbs=get;list;watch;patch;update
// +kubebuilder:rbac:groups=egressip.io,resources=egresses/status;externalippools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups="",resources=nodes/status,verbs=patch
// +kubebuilder:rbac:groups="",resources=pods;namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups=egressip.io,resources=egressmemberslices,verbs=get;list;watch;create;update;patch;delete
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
