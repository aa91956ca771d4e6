package test

import (
	"flag"
	"os"
	"testing"

	"github.com/stratafs/strata/internal/testutil/history"
)

// Worker modes: the test binary re-executes itself to act as a separate
// process on a mount (N-to-1 writers, lock holders).
func TestMain(m *testing.M) {
	switch os.Getenv("STRATA_TEST_WORKER") {
	case "nto1":
		os.Exit(nto1Worker())
	case "lock":
		os.Exit(lockWorker())
	case "lockrepro":
		os.Exit(lockReproWorker())
	case "lockcount":
		os.Exit(lockCountWorker())
	case "tmpfile":
		os.Exit(tmpfileWorker())
	case "nfsfuse":
		os.Exit(nfsFUSEWorker())
	case "nfswrite":
		os.Exit(nfsWriteWorker())
	case "history":
		os.Exit(history.Worker())
	}
	flag.Parse()
	// The strata processes of the tests keep their runtime records (how
	// strata status finds a running cluster) apart from the machine's.
	rt, err := os.MkdirTemp("", "strata-test-runtime.")
	if err != nil {
		panic(err)
	}
	os.Setenv("STRATA_RUNTIME_DIR", rt)
	code := m.Run()
	os.RemoveAll(rt)
	os.Exit(code)
}
