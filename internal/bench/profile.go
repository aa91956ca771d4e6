package bench

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
)

// ProfileEnv names an environment variable: when it holds a directory, every
// worker process writes a CPU profile of its whole life (set-up, barrier
// wait and timed part) there as worker-<workload>-<phase>-<pid>.pprof. It is
// how the harness's own cost is found (go tool pprof -top).
const ProfileEnv = "STRATA_BENCH_CPUPROFILE"

func startProfile(dir string, t *task) (stop func(), err error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	name := filepath.Join(dir, fmt.Sprintf("worker-%s-%s-%d.pprof", t.Workload, t.Phase, os.Getpid()))
	f, err := os.Create(name)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}
