package scheduler

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"
)

func cpuNow() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(1, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
func TestTmpPhases(t *testing.T) {
	runtime.LockOSThread()
	for _, sc := range benchScenarios[:1] {
		cold := benchInput(sc)
		warm := applyResult(cold, Schedule(cold))
		for _, in := range []Input{cold, warm} {
			var d [8]time.Duration
			const N = 3000
			for k := 0; k < N; k++ {
				t0 := cpuNow()
				s := &state{in: &in, c: 1.25}
				s.indexNodes()
				t1 := cpuNow()
				s.indexPools()
				t2 := cpuNow()
				byName := s.sortNames()
				t3 := cpuNow()
				s.buildUnits(byName)
				t4 := cpuNow()
				s.keep()
				s.place()
				t5 := cpuNow()
				s.result(byName)
				t6 := cpuNow()
				d[0] += t1 - t0
				d[1] += t2 - t1
				d[2] += t3 - t2
				d[3] += t4 - t3
				d[4] += t5 - t4
				d[5] += t6 - t5
			}
			var tot time.Duration
			for i, n := range []string{"nodes", "pools", "names", "units", "keep+place", "result"} {
				fmt.Printf("%-10s %v\n", n, d[i]/N)
				tot += d[i] / N
			}
			fmt.Println("total", tot)
		}
	}
}
