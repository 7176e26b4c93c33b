//go:build cloudfigures

package controller

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/egressip/egressip/internal/cloud/aws/ec2emu"
	"github.com/egressip/egressip/internal/testutil/poll"
)

// TestEmuFigures measures, on an emulator with 200 ms per call and 20
// calls/s: the time until 100 Egresses created at once are Ready, and the
// EC2 calls spent, for warm targets 0, 10 and 50; and the calls to fill
// one c5.4xlarge (8 interfaces x 30 addresses) one address at a time
// versus one call per interface. It takes minutes, so it is built only with
// the cloudfigures tag:
//
//	go test -tags cloudfigures -count=1 -run TestEmuFigures -v ./internal/controller/ | grep FIGURE
func TestEmuFigures(t *testing.T) {
	cfg := ec2emu.Config{Latency: map[string]time.Duration{"*": 200 * time.Millisecond}, Rate: 20, Burst: 20}
	for i, warmTarget := range []int32{0, 10, 50} {
		t.Run("warm="+strconv.Itoa(int(warmTarget)), func(t *testing.T) {
			ec := newEmuCloud(t, cfg, fmt.Sprintf("10.%d.0.0/22", 10+i))
			prefix := fmt.Sprintf("fig%d", warmTarget)
			cl := newEmuCluster(t, prefix, 5, 29, ec, "c5.4xlarge")
			cl.pool(prefix, emuPool(ec, warmTarget, 0))
			if warmTarget > 0 {
				cl.waitWarm(prefix, warmTarget)
			}
			time.Sleep(2 * time.Second)
			ec.emu.ResetCounts()
			egs := names(prefix, 100)
			start := time.Now()
			var wg sync.WaitGroup
			for _, e := range egs {
				wg.Add(1)
				go func() { defer wg.Done(); cl.egress(e, prefix, "") }()
			}
			wg.Wait()
			if err := poll.Wait(context.Background(), 100*time.Millisecond, 3*time.Minute, func() error {
				n := 0
				for _, e := range egs {
					if ready(cl.get(e)) {
						n++
					}
				}
				if n != len(egs) {
					return fmt.Errorf("only %d of 100 Ready", n)
				}
				return nil
			}); err != nil {
				t.Fatalf("after 3 min: %v", err)
			}
			took := time.Since(start)
			counts := ec.emu.Counts()
			mut := ec.emu.Calls("AssignPrivateIpAddresses") + ec.emu.Calls("UnassignPrivateIpAddresses")
			t.Logf("FIGURE warm=%d: 100 Egresses Ready in %v; EC2 calls %d (Assign/Unassign %d): %v", warmTarget, took.Round(10*time.Millisecond), ec.emu.Calls(""), mut, counts)
		})
	}
	t.Run("controller-fill-primary-eni", func(t *testing.T) {
		// Through the controller, warm target 0: one c5.4xlarge Node's
		// primary interface (29 secondary slots) filled by Egresses
		// created one at a time (each waits for the previous one to be
		// Ready) versus all at once.
		for i, oneByOne := range []bool{true, false} {
			t.Run(fmt.Sprintf("oneByOne=%v", oneByOne), func(t *testing.T) {
				ec := newEmuCloud(t, cfg, fmt.Sprintf("10.%d.0.0/24", 30+i))
				prefix := fmt.Sprintf("figfill%d", i)
				cl := newEmuCluster(t, prefix, 1, 29, ec, "c5.4xlarge")
				cl.pool(prefix, emuPool(ec, 0, 0))
				time.Sleep(2 * time.Second)
				ec.emu.ResetCounts()
				egs := names(prefix, 29)
				start := time.Now()
				if oneByOne {
					for _, e := range egs {
						cl.egress(e, prefix, "")
						cl.waitReady(e)
					}
				} else {
					for _, e := range egs {
						cl.egress(e, prefix, "")
					}
					cl.waitReady(egs...)
				}
				t.Logf("FIGURE controller, 29 Egresses on one primary ENI, one at a time=%v: %d AssignPrivateIpAddresses calls, %v",
					oneByOne, ec.emu.Calls("AssignPrivateIpAddresses"), time.Since(start).Round(10*time.Millisecond))
			})
		}
	})
	t.Run("fill-c5.4xlarge", func(t *testing.T) {
		ec := newEmuCloud(t, cfg, "10.20.0.0/22")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		instance := func() []string {
			in, err := ec.emu.AddInstance(ec2emu.Instance{Type: "c5.4xlarge", SubnetID: ec.subnet})
			if err != nil {
				t.Fatal(err)
			}
			enis := []string{in.PrimaryInterface}
			for range 7 {
				id, err := ec.emu.AddInterface(in.ID, ec2emu.InterfaceOptions{})
				if err != nil {
					t.Fatal(err)
				}
				enis = append(enis, id)
			}
			return enis
		}
		// 30 addresses per interface, the primary included: 29 secondaries.
		one, batch := instance(), instance()
		ec.emu.ResetCounts()
		start := time.Now()
		for _, eni := range one {
			for range 29 {
				if _, err := ec.p.AssignCount(ctx, eni, 1); err != nil {
					t.Fatal(err)
				}
			}
		}
		oneTook, oneCalls := time.Since(start), ec.emu.Calls("AssignPrivateIpAddresses")
		ec.emu.ResetCounts()
		start = time.Now()
		for _, eni := range batch {
			if _, err := ec.p.AssignCount(ctx, eni, 29); err != nil {
				t.Fatal(err)
			}
		}
		batchTook, batchCalls := time.Since(start), ec.emu.Calls("AssignPrivateIpAddresses")
		t.Logf("FIGURE fill one c5.4xlarge, 8 ENIs x 29 secondary IPs: one IP per call %d calls in %v; one call per ENI %d calls in %v",
			oneCalls, oneTook.Round(10*time.Millisecond), batchCalls, batchTook.Round(10*time.Millisecond))
		for _, eni := range append(one, batch...) {
			st, _ := ec.emu.Interface(eni)
			if len(st.Secondary) != 29 {
				t.Fatalf("%s holds %d secondaries, want 29", eni, len(st.Secondary))
			}
		}
	})
}
