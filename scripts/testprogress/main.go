// Command testprogress reads `go test -json` on stdin and prints progress:
// each package as it starts, failing tests' output, every minute the tests
// still running, and go test's usual closing line per package (see
// internal/testutil/testprogress). scripts/test.sh pipes the suite into it.
package main

import (
	"fmt"
	"os"
	"time"

	"github.com/stratafs/strata/internal/testutil/testprogress"
)

func main() {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	failed, err := testprogress.Format(os.Stdin, os.Stdout, t.C, time.Minute)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testprogress: %v\n", err)
		os.Exit(1)
	}
	if failed {
		os.Exit(1)
	}
}
