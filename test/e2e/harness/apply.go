package harness

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/internal/testutil/poll"
)

// ApplyFile creates every object of a multi-document YAML file.
func (c *Cluster) ApplyFile(ctx context.Context, path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var names []string
	for {
		var u unstructured.Unstructured
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return names, nil
			}
			return names, fmt.Errorf("decode %s: %w", path, err)
		}
		if len(u.Object) == 0 {
			continue
		}
		if err := c.Client.Create(ctx, &u); err != nil {
			return names, fmt.Errorf("create %s %s from %s: %w", u.GetKind(), u.GetName(), filepath.Base(path), err)
		}
		names = append(names, strings.ToLower(u.GetKind())+"/"+u.GetName())
	}
}

// WaitReady waits until every named Egress is Ready and returns them. It
// checks every 20 ms (poll.Wait), all the Egresses within timeout.
func (c *Cluster) WaitReady(ctx context.Context, timeout time.Duration, names ...string) (map[string]*v1.Egress, error) {
	deadline := time.Now().Add(timeout)
	out := map[string]*v1.Egress{}
	for _, n := range names {
		var e v1.Egress
		err := poll.Wait(ctx, 20*time.Millisecond, max(time.Until(deadline), 0), func() error {
			e = v1.Egress{}
			if err := c.Client.Get(ctx, client.ObjectKey{Name: n}, &e); err != nil {
				return err
			}
			if !meta.IsStatusConditionTrue(e.Status.Conditions, v1.ConditionReady) {
				return errors.New("not Ready")
			}
			return nil
		})
		switch {
		case ctx.Err() != nil:
			return out, ctx.Err()
		case err != nil:
			return out, fmt.Errorf("egress %s not Ready after %v: %s", n, timeout, Describe(&e))
		}
		out[n] = &e
	}
	return out, nil
}

// WaitFor checks cond every 10 ms (poll.Wait; the failover figures are
// measured with it, so the interval is finer than tests use) until it is
// true, and reports whether it became true within timeout (a last check
// at the timeout included; false at once when ctx ends).
func WaitFor(ctx context.Context, timeout time.Duration, cond func() bool) bool {
	if poll.Wait(ctx, 10*time.Millisecond, timeout, poll.Cond(cond)) == nil {
		return true
	}
	return ctx.Err() == nil && cond()
}

// Egress returns the current Egress named name.
func (c *Cluster) Egress(ctx context.Context, name string) (*v1.Egress, error) {
	var e v1.Egress
	err := c.Client.Get(ctx, client.ObjectKey{Name: name}, &e)
	return &e, err
}

// Cordon marks a Node unschedulable (or schedulable again).
func (c *Cluster) Cordon(ctx context.Context, name string, on bool) error {
	var n corev1.Node
	if err := c.Client.Get(ctx, client.ObjectKey{Name: name}, &n); err != nil {
		return err
	}
	p := client.MergeFrom(n.DeepCopy())
	n.Spec.Unschedulable = on
	return c.Client.Patch(ctx, &n, p)
}

// Describe is a one-line summary of an Egress's status.
func Describe(e *v1.Egress) string {
	s := fmt.Sprintf("%s ip=%q node=%q", e.Name, e.Status.EgressIP, e.Status.EgressNode)
	conds := make([]string, 0, len(e.Status.Conditions))
	for _, c := range e.Status.Conditions {
		conds = append(conds, fmt.Sprintf("%s=%s(%s)", c.Type, c.Status, c.Reason))
	}
	slices.Sort(conds)
	return s + " " + strings.Join(conds, " ")
}
