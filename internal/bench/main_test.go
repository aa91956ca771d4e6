package bench

import (
	"os"
	"testing"
)

// TestMain doubles as the worker process: the runner re-executes the test
// binary with STRATA_BENCH_WORKER=1, as the strata binary re-executes
// itself with `bench worker`.
func TestMain(m *testing.M) {
	if os.Getenv("STRATA_BENCH_WORKER") == "1" {
		if err := WorkerMain(os.Stdin, os.Stdout); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// testConfig is a tiny suite on dir whose workers are this test binary.
func testConfig(t *testing.T, dir string) Config {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	c := QuickConfig()
	c.Path = dir
	c.System = "tmp"
	c.Threads = []int{1, 2}
	c.SeqBytes = 8 << 20
	c.RandomFileBytes = 1 << 20
	c.RandomRuntime = 200e6
	c.SharedBytes = 8 << 20
	c.TransferBytes = 1 << 20
	c.FilesPerDir = 40
	c.DirsPerThread = 2
	c.SmallFilesPerThread = 30
	c.FioBytes = 8 << 20
	c.FioRuntime = 300e6
	c.WorkerCommand = []string{exe}
	c.WorkerEnv = []string{"STRATA_BENCH_WORKER=1"}
	return c
}
