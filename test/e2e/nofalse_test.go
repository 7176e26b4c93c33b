//go:build stress

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	v1 "github.com/egressip/egressip/api/v1alpha1"
	"github.com/egressip/egressip/test/e2e/harness"
)

// The stress build tag gives the cluster of this package five Nodes, for
// TestNoFalseFailover; `make test` builds without it and keeps three.
func init() { clusterNodes = 5 }

// stressDuration is how long TestNoFalseFailover saturates the CPUs: 5
// minutes (issue 22), or E2E_STRESS_DURATION (a Go duration) for a short
// trial run.
func stressDuration(t *testing.T) time.Duration {
	t.Helper()
	v := os.Getenv("E2E_STRESS_DURATION")
	if v == "" {
		return 5 * time.Minute
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("E2E_STRESS_DURATION=%q: want a positive Go duration", v)
	}
	return d
}

// TestNoFalseFailover (issue 22 goal 1): 5 Nodes hold 20 Egresses (10 IPv4,
// 10 IPv6) while every core is saturated by CPU-burning processes
// (2 × runtime.NumCPU() shell loops, started here and killed at the end)
// for stressDuration, at the default liveness flags. Not one Egress may
// move: the test reads every Egress every 100 ms and counts changes of
// status.egressNode and of the Ready condition, and also compares the
// controller's egressip_controller_moves_total and the Nodes'
// AgentUnreachable Events before and after. Run it outside `make test`:
//
//	go test -tags stress -v -count=1 -timeout 20m -run TestNoFalseFailover ./test/e2e/
func TestNoFalseFailover(t *testing.T) {
	ctx := context.Background()
	if n := len(c.Nodes); n != 5 {
		t.Fatalf("%d Nodes, want 5 (build with -tags stress)", n)
	}
	var names []string
	for i := range 20 {
		pool := "office-egress"
		if i%2 == 1 {
			pool = "office-egress-v6"
		}
		name := fmt.Sprintf("steady-%02d", i)
		newEgress(t, name, pool, "")
		names = append(names, name)
	}
	placed := waitReady(t, names...)
	holders := map[string]int{}
	for _, e := range placed {
		holders[e.Status.EgressNode]++
	}
	t.Logf("20 Egresses Ready on %d Nodes: %v", len(holders), holders)
	movesBefore, err := c.ControllerMetricSum(ctx, "egressip_controller_moves_total")
	if err != nil {
		t.Fatal(err)
	}
	deadBefore := unreachableEvents(ctx, t)
	failedBefore, err := c.ControllerMetric(ctx, "egressip_controller_agent_polls_total", `result="failed"`)
	if err != nil {
		t.Fatal(err)
	}
	okBefore, err := c.ControllerMetric(ctx, "egressip_controller_agent_polls_total", `result="ok"`)
	if err != nil {
		t.Fatal(err)
	}

	stop := burnCPUs(t, 2*runtime.NumCPU())
	d := stressDuration(t)
	t.Logf("%d CPU burners for %v", 2*runtime.NumCPU(), d)
	var moves, unready, reads int
	var report []string
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		reads++
		for _, name := range names {
			e, err := c.Egress(ctx, name)
			if err != nil {
				t.Fatalf("read %s: %v", name, err)
			}
			want := placed[name]
			if e.Status.EgressNode != want.Status.EgressNode {
				moves++
				report = append(report, fmt.Sprintf("%s: %s moved from %q to %q",
					time.Now().Format(time.StampMilli), name, want.Status.EgressNode, e.Status.EgressNode))
				placed[name] = e
			}
			if !meta.IsStatusConditionTrue(e.Status.Conditions, v1.ConditionReady) {
				unready++
				report = append(report, fmt.Sprintf("%s: %s not Ready: %s", time.Now().Format(time.StampMilli), name, harness.Describe(e)))
			}
		}
	}
	load := loadAverage()
	stop()
	movesAfter, err := c.ControllerMetricSum(ctx, "egressip_controller_moves_total")
	if err != nil {
		t.Fatal(err)
	}
	deadAfter := unreachableEvents(ctx, t)
	failedAfter, err := c.ControllerMetric(ctx, "egressip_controller_agent_polls_total", `result="failed"`)
	if err != nil {
		t.Fatal(err)
	}
	okAfter, err := c.ControllerMetric(ctx, "egressip_controller_agent_polls_total", `result="ok"`)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("CPU saturation for %v (load average at the end: %s): %d reads of 20 Egresses, %d moves, %d not-Ready readings, "+
		"moves metric %v -> %v, AgentUnreachable Events %d -> %d, agent polls meanwhile: %v answered, %v failed",
		d, load, reads, moves, unready, movesBefore, movesAfter, deadBefore, deadAfter, okAfter-okBefore, failedAfter-failedBefore)
	for _, r := range report {
		t.Log(r)
	}
	if moves != 0 || movesAfter != movesBefore || deadAfter != deadBefore {
		t.Errorf("false failover under CPU saturation: %d Egress moves seen, moves metric +%v, AgentUnreachable Events +%d",
			moves, movesAfter-movesBefore, deadAfter-deadBefore)
	}
	if unready != 0 {
		t.Errorf("%d readings of an Egress not Ready under CPU saturation", unready)
	}
}

// unreachableEvents counts the AgentUnreachable Events on every Node.
func unreachableEvents(ctx context.Context, t *testing.T) int {
	t.Helper()
	n := 0
	for _, node := range c.Nodes {
		evs, err := c.NodeEvents(ctx, node.Name, v1.ReasonAgentUnreachable)
		if err != nil {
			t.Fatal(err)
		}
		n += len(evs)
	}
	return n
}

// burnCPUs starts n processes that each spin a core (a shell loop), in a
// process group of their own, and returns the function that kills them
// (also run at cleanup).
func burnCPUs(t *testing.T, n int) func() {
	t.Helper()
	var cmds []*exec.Cmd
	for range n {
		cmd := exec.Command("sh", "-c", "while :; do :; done")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := cmd.Start(); err != nil {
			t.Fatalf("start a CPU burner: %v", err)
		}
		cmds = append(cmds, cmd)
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		for _, cmd := range cmds {
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			_ = cmd.Wait()
		}
	}
	t.Cleanup(stop)
	return stop
}

// loadAverage is the first three fields of /proc/loadavg.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	return strings.Join(f[:min(3, len(f))], " ")
}
