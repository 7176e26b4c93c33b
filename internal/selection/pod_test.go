package selection

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestStripPod(t *testing.T) {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Labels: map[string]string{"a": "b"}, Annotations: map[string]string{"big": "x"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}},
		Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{{Name: "c", Image: "i"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}}, HostIPs: []corev1.HostIP{{IP: "192.0.2.11"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady}}},
	}
	out, err := StripPod(p)
	if err != nil {
		t.Fatal(err)
	}
	want := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", Labels: map[string]string{"a": "b"}},
		Spec:       corev1.PodSpec{NodeName: "n1"},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}}, HostIPs: []corev1.HostIP{{IP: "192.0.2.11"}}},
	}
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("StripPod (-want +got):\n%s", diff)
	}
	if o, _ := StripPod("not a pod"); o != "not a pod" {
		t.Errorf("StripPod changed a non-Pod: %v", o)
	}
}

func TestPodChanged(t *testing.T) {
	base := pod("ns", "p", "n1", map[string]string{"a": "b"}, "10.0.0.1")
	for name, mut := range map[string]func(*corev1.Pod){
		"labels":  func(p *corev1.Pod) { p.Labels = map[string]string{"a": "c"} },
		"phase":   func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed },
		"pod IPs": func(p *corev1.Pod) { p.Status.PodIPs = append(p.Status.PodIPs, corev1.PodIP{IP: "fd00::1"}) },
		"host IP": func(p *corev1.Pod) { p.Status.HostIPs = []corev1.HostIP{{IP: "192.0.2.99"}} },
	} {
		n := base.DeepCopy()
		mut(n)
		if !PodChanged(&base, n) {
			t.Errorf("%s change not seen", name)
		}
	}
	n := base.DeepCopy()
	n.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	n.Annotations = map[string]string{"x": "y"}
	if PodChanged(&base, n) {
		t.Error("a conditions or annotations change counted as a selection change")
	}
}
