package rpc

import (
	"errors"
	"fmt"
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
