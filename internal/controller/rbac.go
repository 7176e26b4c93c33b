package controller

// The controller's permissions (config/rbac/role.yaml is generated from
// these markers): it reads Egresses, pools and Nodes, writes only the status
// of Egresses and pools, and records Events.

// +kubebuilder:rbac:groups=egressip.io,resources=egresses;externalippools,verbs=get;list;watch
// +kubebuilder:rbac:groups=egressip.io,resources=egresses/status;externalippools/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
