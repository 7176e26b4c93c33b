package scheduler

import (
	"fmt"
	"runtime"
	"testing"
	"time"
)

func TestTmpRing(t *testing.T) {
	runtime.LockOSThread()
	in := benchInput(benchScenarios[0])
	var d [3]time.Duration
	const N = 3000
	for k := 0; k < N; k++ {
		s := &state{in: &in, c: 1.25}
		s.indexNodes()
		s.indexPools()
		byName := s.sortNames()
		s.buildUnits(byName)
		s.keep()
		t0 := cpuNow()
		r := s.buildRing(0)
		t1 := cpuNow()
		s.pools[0].ring = r
		s.place()
		t2 := cpuNow()
		d[0] += t1 - t0
		d[1] += t2 - t1
	}
	fmt.Println("build", d[0]/N, "place", d[1]/N)
}
