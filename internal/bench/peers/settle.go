package peers

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Background work of one system (MooseFS deleting chunks, GlusterFS
// healing, a metadata log compacting) must not be charged to the system
// measured next. Before each system's turn at a workload the run waits
// until the machine is quiet: two consecutive settleWindow windows with at
// most settleBusy of the CPUs busy, for at most settleMax. A system's own
// background work inside its turn still counts against it.
const (
	settleWindow = 250 * time.Millisecond
	settleBusy   = 0.15
	settleMax    = 15 * time.Second
)

// cpuTimes is the aggregate "cpu" line of /proc/stat: busy and total jiffies.
type cpuTimes struct{ busy, total uint64 }

// parseCPU reads the aggregate cpu line of a /proc/stat text.
func parseCPU(stat string) (cpuTimes, error) {
	for _, line := range strings.Split(stat, "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || f[0] != "cpu" {
			continue
		}
		var t cpuTimes
		for i, s := range f[1:] {
			v, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				return cpuTimes{}, fmt.Errorf("/proc/stat cpu field %d %q: %w", i+1, s, err)
			}
			t.total += v
			if i != 3 && i != 4 { // idle, iowait
				t.busy += v
			}
		}
		return t, nil
	}
	return cpuTimes{}, fmt.Errorf("/proc/stat has no aggregate cpu line")
}

// busyShare is the share of CPU time spent busy between a and b.
func busyShare(a, b cpuTimes) float64 {
	if b.total <= a.total {
		return 0
	}
	return float64(b.busy-a.busy) / float64(b.total-a.total)
}

func readCPU() (cpuTimes, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuTimes{}, err
	}
	return parseCPU(string(b))
}

// settle waits until the machine is quiet (see settleBusy) and returns how
// long it waited and whether it got quiet before settleMax.
func settle(ctx context.Context) (time.Duration, bool, error) {
	start := time.Now()
	prev, err := readCPU()
	if err != nil {
		return 0, false, err
	}
	quiet := 0
	for time.Since(start) < settleMax {
		select {
		case <-ctx.Done():
			return time.Since(start), false, ctx.Err()
		case <-time.After(settleWindow):
		}
		cur, err := readCPU()
		if err != nil {
			return time.Since(start), false, err
		}
		if busyShare(prev, cur) <= settleBusy {
			quiet++
			if quiet == 2 {
				return time.Since(start), true, nil
			}
		} else {
			quiet = 0
		}
		prev = cur
	}
	return time.Since(start), false, nil
}
