package testprogress

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestFormat(t *testing.T) {
	t0 := "2026-11-25T10:00:00Z"
	in := strings.Join([]string{
		`{"Time":"` + t0 + `","Action":"start","Package":"m/internal/a"}`,
		`{"Time":"` + t0 + `","Action":"run","Package":"m/internal/a","Test":"TestGood"}`,
		`{"Time":"` + t0 + `","Action":"output","Package":"m/internal/a","Test":"TestGood","Output":"=== RUN   TestGood\n"}`,
		`{"Time":"` + t0 + `","Action":"output","Package":"m/internal/a","Test":"TestGood","Output":"chatter of a passing test\n"}`,
		`{"Time":"` + t0 + `","Action":"pass","Package":"m/internal/a","Test":"TestGood"}`,
		`{"Time":"` + t0 + `","Action":"run","Package":"m/internal/a","Test":"TestBad"}`,
		`{"Time":"` + t0 + `","Action":"output","Package":"m/internal/a","Test":"TestBad","Output":"    a_test.go:9: boom\n"}`,
		`{"Time":"` + t0 + `","Action":"output","Package":"m/internal/a","Test":"TestBad","Output":"--- FAIL: TestBad (0.00s)\n"}`,
		`{"Time":"` + t0 + `","Action":"fail","Package":"m/internal/a","Test":"TestBad"}`,
		`{"Time":"` + t0 + `","Action":"start","Package":"m/internal/b"}`,
		`{"Time":"` + t0 + `","Action":"run","Package":"m/internal/b","Test":"TestSlow"}`,
		"TICK",
		`{"Time":"` + t0 + `","Action":"output","Package":"m/internal/a","Output":"FAIL\n"}`,
		`{"Time":"` + t0 + `","Action":"output","Package":"m/internal/a","Output":"FAIL\tm/internal/a\t0.01s\n"}`,
		`{"Time":"` + t0 + `","Action":"fail","Package":"m/internal/a"}`,
		`{"Time":"` + t0 + `","Action":"pass","Package":"m/internal/b","Test":"TestSlow"}`,
		`{"Time":"` + t0 + `","Action":"output","Package":"m/internal/b","Output":"PASS\n"}`,
		`{"Time":"` + t0 + `","Action":"output","Package":"m/internal/b","Output":"ok  \tm/internal/b\t90.1s\n"}`,
		`{"Time":"` + t0 + `","Action":"pass","Package":"m/internal/b"}`,
		`{"ImportPath":"m/internal/c [m/internal/c.test]","Action":"build-output","Output":"internal/c/c.go:3:1: syntax error\n"}`,
		`go: some message of the go command`,
	}, "\n") + "\n"
	// Lines and ticks in a fixed order: the formatter itself, no reader.
	before, after, _ := strings.Cut(in, "TICK\n")
	var out bytes.Buffer
	f := &formatter{out: &out, buf: map[key][]string{}, started: map[key]time.Time{}}
	feed := func(s string) {
		for _, l := range strings.Split(strings.TrimSuffix(s, "\n"), "\n") {
			f.line(l)
		}
	}
	feed(before)
	start, _ := time.Parse(time.RFC3339, t0)
	f.stillRunning(start.Add(90*time.Second), time.Minute)
	feed(after)
	if !f.failed {
		t.Error("a failing package did not make the formatter report failure")
	}
	// Format over a reader gives the same, and the failure.
	var whole bytes.Buffer
	failed, err := Format(strings.NewReader(strings.Replace(in, "TICK\n", "", 1)), &whole, nil, time.Minute)
	if err != nil || !failed || !strings.Contains(whole.String(), "FAIL\tm/internal/a\t0.01s\n") {
		t.Errorf("Format: failed %v, err %v:\n%s", failed, err, whole.String())
	}
	got := out.String()
	for _, want := range []string{
		"run   m/internal/a\n", "run   m/internal/b\n",
		"    a_test.go:9: boom\n--- FAIL: TestBad (0.00s)\n",
		"still running: internal/a (1m30s), internal/b TestSlow (1m30s)\n",
		"FAIL\tm/internal/a\t0.01s\n", "ok  \tm/internal/b\t90.1s\n",
		"internal/c/c.go:3:1: syntax error\n", "go: some message of the go command\n",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
	for _, not := range []string{"chatter of a passing test", "PASS\n"} {
		if strings.Contains(got, not) {
			t.Errorf("output has %q:\n%s", not, got)
		}
	}
}

// TestFormatTimedOutTest: a package that fails while a test still runs (go
// test's timeout panics and prints every goroutine's stack in the test's
// output, and the test gets no fail event) shows that output.
func TestFormatTimedOutTest(t *testing.T) {
	t0 := "2026-11-25T10:00:00Z"
	in := strings.Join([]string{
		`{"Time":"` + t0 + `","Action":"start","Package":"m/internal/a"}`,
		`{"Time":"` + t0 + `","Action":"run","Package":"m/internal/a","Test":"TestHangs"}`,
		`{"Time":"` + t0 + `","Action":"output","Package":"m/internal/a","Test":"TestHangs","Output":"panic: test timed out after 20m0s\n"}`,
		`{"Time":"` + t0 + `","Action":"output","Package":"m/internal/a","Test":"TestHangs","Output":"goroutine 7 [chan receive]:\n"}`,
		`{"Time":"` + t0 + `","Action":"output","Package":"m/internal/a","Output":"FAIL\tm/internal/a\t1200.5s\n"}`,
		`{"Time":"` + t0 + `","Action":"fail","Package":"m/internal/a"}`,
	}, "\n") + "\n"
	var out bytes.Buffer
	failed, err := Format(strings.NewReader(in), &out, nil, time.Minute)
	if err != nil || !failed {
		t.Fatalf("Format: failed %v, err %v", failed, err)
	}
	if !strings.Contains(out.String(), "panic: test timed out after 20m0s\ngoroutine 7 [chan receive]:\n") {
		t.Fatalf("the timed-out test's stacks are not shown:\n%s", out.String())
	}
}
