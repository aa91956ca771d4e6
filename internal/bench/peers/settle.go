package peers

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Background work of one system (GlusterFS healing, a metadata log
// compacting, a chunkserver testing chunks) must not be charged to the system
// measured next. Before each system's turn at a workload the run waits
// until the machine is quiet: two consecutive settleWindow windows with at
// most settleBusy of the CPUs busy and no disk busy more than
// settleDiskBusy of the time, for at most settleMax. A system's own
// background work inside its turn still counts against it.
const (
	settleWindow   = 250 * time.Millisecond
	settleBusy     = 0.15
	settleDiskBusy = 0.10
	settleMax      = 15 * time.Second
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

// parseDiskTicks reads the milliseconds each whole disk spent doing I/O
// (io_ticks) from a /proc/diskstats text; disks is the set of names to
// keep (whole, physical disks: see wholeDisks).
func parseDiskTicks(stats string, disks map[string]bool) map[string]uint64 {
	out := map[string]uint64{}
	for _, line := range strings.Split(stats, "\n") {
		f := strings.Fields(line)
		if len(f) < 13 || !disks[f[2]] {
			continue
		}
		if v, err := strconv.ParseUint(f[12], 10, 64); err == nil {
			out[f[2]] = v
		}
	}
	return out
}

// diskBusy is the largest share of the window any disk spent doing I/O.
func diskBusy(a, b map[string]uint64, window time.Duration) float64 {
	worst := 0.0
	for d, tb := range b {
		if ta, ok := a[d]; ok && tb > ta {
			worst = max(worst, float64(tb-ta)/float64(window.Milliseconds()))
		}
	}
	return worst
}

// wholeDisks lists the block devices that are disks (not loop, ram, zram
// or device-mapper devices).
func wholeDisks() map[string]bool {
	out := map[string]bool{}
	ents, _ := os.ReadDir("/sys/block")
	for _, e := range ents {
		n := e.Name()
		if strings.HasPrefix(n, "loop") || strings.HasPrefix(n, "ram") || strings.HasPrefix(n, "zram") || strings.HasPrefix(n, "dm-") {
			continue
		}
		out[n] = true
	}
	return out
}

func readDisks(disks map[string]bool) map[string]uint64 {
	b, err := os.ReadFile("/proc/diskstats")
	if err != nil {
		return nil // no disk figures: judge by the CPU alone
	}
	return parseDiskTicks(string(b), disks)
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
	disks := wholeDisks()
	prevDisk := readDisks(disks)
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
		curDisk := readDisks(disks)
		diskQuiet := diskBusy(prevDisk, curDisk, settleWindow) <= settleDiskBusy
		prevDisk = curDisk
		if busyShare(prev, cur) <= settleBusy && diskQuiet {
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
