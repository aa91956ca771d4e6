package rpc

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
)

func TestLeaderHint(t *testing.T) {
	err := NotLeader("10.0.0.2:7400", "metadata node %s is not the leader", "10.0.0.1:7400")
	if !errors.Is(err, syscall.ENOTCONN) {
		t.Fatalf("NotLeader errno: %v", err)
	}
	if got := LeaderHint(fmt.Errorf("call: %w", err)); got != "10.0.0.2:7400" {
		t.Fatalf("LeaderHint = %q", got)
	}
	if got := LeaderHint(NotLeader("", "no leader elected yet")); got != "" {
		t.Fatalf("LeaderHint without a leader = %q", got)
	}
	if got := LeaderHint(Errorf(syscall.EIO, "x [leader=a:1]")); got != "" {
		t.Fatalf("LeaderHint of another errno = %q", got)
	}
}
