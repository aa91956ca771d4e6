package history

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// Recorders in a process of their own.
//
// A test that restarts a daemon (fork and exec) must not hold files open
// on a FUSE mount whose daemon waits for that daemon: the child of the fork
// closes its copies of the descriptors at exec (O_CLOEXEC), each close of a
// FUSE file is a FLUSH that the mount answers only after it reached the
// metadata service, and the exec, and so the restart, waits for them. So
// a test that kills and restarts the metadata service runs its recorders
// in another process: Start runs a program (typically the test binary
// again) that calls Worker.

// Environment of a worker process.
const (
	envConfig = "STRATA_HISTORY_CONFIG" // JSON of Config
	envOut    = "STRATA_HISTORY_OUT"    // where Worker writes the operations (JSON)
)

// Child is a recorder process started by Start.
type Child struct {
	cmd  *exec.Cmd
	out  string
	done chan error
}

// Start runs argv (with env added to this process's environment) as a
// recorder process for cfg; the program must call Worker (test binaries:
// from TestMain, selected by something in env). Its stderr goes to
// dir/history-worker.log.
func Start(cfg Config, dir string, env []string, argv ...string) (*Child, error) {
	cfg.Pause = nil
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil, fmt.Errorf("history worker config: %w", err)
	}
	c := &Child{out: filepath.Join(dir, fmt.Sprintf("history-%d.json", time.Now().UnixNano())), done: make(chan error, 1)}
	logf, err := os.OpenFile(filepath.Join(dir, "history-worker.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("history worker log: %w", err)
	}
	c.cmd = exec.Command(argv[0], argv[1:]...)
	c.cmd.Env = append(append(os.Environ(), env...), envConfig+"="+string(b), envOut+"="+c.out)
	c.cmd.Stdout, c.cmd.Stderr = logf, logf
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start history worker: %w", err)
	}
	go func() {
		c.done <- c.cmd.Wait()
		logf.Close()
	}()
	return c, nil
}

// Wait waits up to d for the recorder process and returns its operations.
// A process that does not end in time is killed.
func (c *Child) Wait(d time.Duration) ([]Op, error) {
	var werr error
	select {
	case werr = <-c.done:
	case <-time.After(d):
		_ = c.cmd.Process.Kill()
		<-c.done
		return nil, fmt.Errorf("history worker still running after %v: killed", d)
	}
	ops, err := LoadOps(c.out)
	if err != nil {
		return nil, errors.Join(werr, err)
	}
	if werr != nil {
		return ops, fmt.Errorf("history worker: %w", werr)
	}
	return ops, nil
}

// Worker is the body of a recorder process (see Start): it runs the
// Config in its environment, writes the operations, and returns the exit
// code. Operations stuck when Run gives up are recorded as Unknown; the
// process then exits with them still blocked.
func Worker() int {
	var cfg Config
	if err := json.Unmarshal([]byte(os.Getenv(envConfig)), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "history worker: config %s: %v\n", envConfig, err)
		return 2
	}
	h, err := Run(cfg)
	code := 0
	if err != nil {
		fmt.Fprintf(os.Stderr, "history worker: %v\n", err)
		code = 1
	}
	if h != nil {
		if err := SaveOps(os.Getenv(envOut), h.Ops()); err != nil {
			fmt.Fprintf(os.Stderr, "history worker: %v\n", err)
			return 1
		}
	}
	return code
}

// SaveOps writes ops as JSON to path.
func SaveOps(path string, ops []Op) error {
	b, err := json.Marshal(ops)
	if err != nil {
		return fmt.Errorf("encode history: %w", err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("write history: %w", err)
	}
	return nil
}

// LoadOps reads operations written by SaveOps.
func LoadOps(path string) ([]Op, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read history: %w", err)
	}
	var ops []Op
	if err := json.Unmarshal(b, &ops); err != nil {
		return nil, fmt.Errorf("decode history %s: %w", path, err)
	}
	return ops, nil
}
