package failpoint

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

type opName uint8

func (o opName) String() string { return [...]string{"zero", "create", "unlink"}[o] }

func TestCountsAndActions(t *testing.T) {
	t.Cleanup(DisarmAll)
	if err := ArmSpec("a=3*error, b=2+error, c=error, d=sleep(30ms)"); err != nil {
		t.Fatal(err)
	}
	hits := func(name string, n int) (failed []int) {
		for i := 1; i <= n; i++ {
			if err := Eval(name); err != nil {
				if !errors.Is(err, ErrInjected) {
					t.Fatalf("%s: error %v does not wrap ErrInjected", name, err)
				}
				failed = append(failed, i)
			}
		}
		return failed
	}
	for _, c := range []struct {
		name string
		want string
	}{{"a", "[3]"}, {"b", "[2 3 4 5]"}, {"c", "[1 2 3 4 5]"}, {"unarmed", "[]"}} {
		if got := fmt.Sprint(hits(c.name, 5)); got != c.want {
			t.Errorf("%s failed on hits %s, want %s", c.name, got, c.want)
		}
	}
	start := time.Now()
	if err := Eval("d"); err != nil || time.Since(start) < 30*time.Millisecond {
		t.Errorf("sleep(30ms): err %v after %v", err, time.Since(start))
	}
	if got := Armed()["a"]; got != 5 {
		t.Errorf("a counted %d hits, want 5", got)
	}
	Disarm("c")
	if err := Eval("c"); err != nil {
		t.Errorf("disarmed c still fails: %v", err)
	}
}

func TestHitPanicsOnPanicAndError(t *testing.T) {
	t.Cleanup(DisarmAll)
	for _, act := range []string{"panic", "error"} {
		if err := Arm("p", act); err != nil {
			t.Fatal(err)
		}
		func() {
			defer func() {
				if r := recover(); r == nil {
					t.Errorf("Hit with %s did not panic", act)
				}
			}()
			Hit("p")
		}()
	}
}

func TestEvalSubPrefersTheSubName(t *testing.T) {
	t.Cleanup(DisarmAll)
	if err := Arm("meta/before-reply/create", "error"); err != nil {
		t.Fatal(err)
	}
	if err := EvalSub("meta/before-reply", opName(2)); err != nil {
		t.Errorf("unlink failed at a point armed for create only: %v", err)
	}
	if err := EvalSub("meta/before-reply", opName(1)); err == nil {
		t.Error("create did not fail at its armed point")
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("HitSub of create did not panic at an error point armed for create")
			}
		}()
		HitSub("meta/before-reply", opName(1))
	}()
	if err := Arm("meta/before-reply", "1*error"); err != nil {
		t.Fatal(err)
	}
	if err := EvalSub("meta/before-reply", opName(2)); err == nil {
		t.Error("unlink did not fail at the point armed for every op")
	}
}

func TestMalformedSpecArmsNothing(t *testing.T) {
	t.Cleanup(DisarmAll)
	for _, spec := range []string{"x=exit,y", "x=boom", "x=0*exit", "x=sleep(forever)", "=exit", "x=-1*error"} {
		if err := ArmSpec(spec); err == nil {
			t.Errorf("ArmSpec(%q) accepted", spec)
		}
		if n := len(Armed()); n != 0 {
			t.Errorf("ArmSpec(%q) armed %d points", spec, n)
		}
	}
}

func TestUnarmedCostsNoAllocation(t *testing.T) {
	DisarmAll()
	if n := testing.AllocsPerRun(1000, func() {
		Hit("x")
		_ = Eval("y")
		_ = EvalSub("z", opName(1))
		HitSub("z", opName(1))
	}); n != 0 {
		t.Errorf("%v allocations per unarmed call", n)
	}
}

// TestExitKillsTheProcessFromTheEnvironment runs this test binary again
// with STRATA_FAILPOINTS naming an exit point: the child must die of
// SIGKILL at the armed hit (its deferred output never printed), armed by
// the environment alone.
func TestExitKillsTheProcessFromTheEnvironment(t *testing.T) {
	if os.Getenv("FAILPOINT_CHILD") == "1" {
		for i := 1; i <= 3; i++ {
			os.Stdout.WriteString("hit\n")
			Hit("child/point")
		}
		os.Stdout.WriteString("survived\n")
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestExitKillsTheProcessFromTheEnvironment$")
	cmd.Env = append(os.Environ(), "FAILPOINT_CHILD=1", EnvVar+"=child/point=2*exit")
	out, err := cmd.Output()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("child: err %v, output %q; want it killed", err, out)
	}
	ws := ee.Sys().(syscall.WaitStatus)
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child ended with %v, want SIGKILL", ws)
	}
	if got := strings.Count(string(out), "hit"); got != 2 || strings.Contains(string(out), "survived") {
		t.Fatalf("child output %q: want killed at the second hit", out)
	}
}

// TestFileArmsAndDisarms: the file's points follow its content; a point
// armed otherwise is left alone.
func TestFileArmsAndDisarms(t *testing.T) {
	t.Cleanup(DisarmAll)
	if err := Arm("other", "error"); err != nil {
		t.Fatal(err)
	}
	path := t.TempDir() + "/failpoints"
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		watchFile(path, stop)
		close(done)
	}()
	defer func() {
		close(stop)
		<-done
	}()
	waitFor := func(what string, failing bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for (Eval("store/x") != nil) != failing {
			if time.Now().After(deadline) {
				t.Fatalf("%s: store/x failing is not %v after 5s", what, failing)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if err := os.WriteFile(path, []byte("store/x=error\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor("armed by the file", true)
	if err := os.WriteFile(path, []byte("store/x=bogus"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor("a malformed file", false)
	if err := os.WriteFile(path, []byte("store/x=2+error"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor("armed again", true)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	waitFor("the file removed", false)
	if Eval("other") == nil {
		t.Fatal("a point the file never named was disarmed")
	}
}
