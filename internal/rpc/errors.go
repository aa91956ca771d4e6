package rpc

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
)

// Error is an errno answered by the peer, with the peer's explanation.
// errors.Is(err, syscall.ENOENT) works on it.
type Error struct {
	Errno syscall.Errno
	Msg   string
}

func (e *Error) Error() string {
	if e.Msg == "" {
		return e.Errno.Error()
	}
	return e.Msg
}

func (e *Error) Unwrap() error { return e.Errno }

// Errorf builds an *Error carrying errno and a formatted explanation.
func Errorf(errno syscall.Errno, format string, args ...any) error {
	return &Error{Errno: errno, Msg: fmt.Sprintf(format, args...)}
}

// ErrnoOf extracts the errno a handler error should be answered with:
// an *Error's, a wrapped syscall.Errno's, or EIO.
func ErrnoOf(err error) syscall.Errno {
	var re *Error
	if errors.As(err, &re) {
		return re.Errno
	}
	var en syscall.Errno
	if errors.As(err, &en) {
		return en
	}
	return syscall.EIO
}

// leaderHintPrefix marks, in the text of a "not the leader" answer, the
// rpc address of the metadata voter that leads (as far as the answering
// voter knows): the text ends with "[leader=ADDR]". The hint rides in the
// error text, which every wire version carries, so no message changes.
const leaderHintPrefix = " [leader="

// NotLeader builds the answer of a metadata voter that cannot serve a
// request: ENOTCONN (callers retry the same request elsewhere), the
// explanation, and, when leader is not empty, the leader's rpc address for
// LeaderHint.
func NotLeader(leader string, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if leader != "" {
		msg += leaderHintPrefix + leader + "]"
	}
	return &Error{Errno: syscall.ENOTCONN, Msg: msg}
}

// LeaderHint returns the leader address a NotLeader answer names, or "".
func LeaderHint(err error) string {
	var re *Error
	if !errors.As(err, &re) || re.Errno != syscall.ENOTCONN {
		return ""
	}
	i := strings.LastIndex(re.Msg, leaderHintPrefix)
	if i < 0 || !strings.HasSuffix(re.Msg, "]") {
		return ""
	}
	return re.Msg[i+len(leaderHintPrefix) : len(re.Msg)-1]
}
