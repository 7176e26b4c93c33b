package selection

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// StripPod is a cache transform (cache.TransformFunc) that keeps of a Pod
// only what member selection reads: name, namespace, UID, resource
// version, labels, timestamps, spec.nodeName, spec.hostNetwork and the
// status phase and IPs. Everything else (containers, volumes, conditions,
// managed fields) is dropped, so a cache of every Pod of a large cluster
// stays small. Objects that are not Pods are returned unchanged.
func StripPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	return &corev1.Pod{
		TypeMeta: p.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, Namespace: p.Namespace, UID: p.UID, ResourceVersion: p.ResourceVersion,
			Labels: p.Labels, CreationTimestamp: p.CreationTimestamp, DeletionTimestamp: p.DeletionTimestamp,
		},
		Spec: corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork},
		Status: corev1.PodStatus{
			Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs,
			HostIP: p.Status.HostIP, HostIPs: p.Status.HostIPs,
		},
	}, nil
}

// PodChanged reports whether a Pod update can change selection: labels,
// Node, host network, phase or IPs (status-only churn such as container
// restarts or conditions does not).
func PodChanged(o, n *corev1.Pod) bool {
	return !equality.Semantic.DeepEqual(o.Labels, n.Labels) || o.Spec.NodeName != n.Spec.NodeName ||
		o.Spec.HostNetwork != n.Spec.HostNetwork || o.Status.Phase != n.Status.Phase ||
		o.Status.PodIP != n.Status.PodIP || !equality.Semantic.DeepEqual(o.Status.PodIPs, n.Status.PodIPs) ||
		o.Status.HostIP != n.Status.HostIP || !equality.Semantic.DeepEqual(o.Status.HostIPs, n.Status.HostIPs)
}
