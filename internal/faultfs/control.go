package faultfs

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// The control protocol: a client connects to the unix socket and sends a
// mode's name on a line; the server switches and answers "ok MODE", or
// "error TEXT" for an unknown mode. An empty line asks for the current
// mode ("ok MODE"). One connection may send many lines.

// Serve answers control connections on ln until it is closed.
func Serve(ln net.Listener, f *FS) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		go serveConn(c, f)
	}
}

func serveConn(c net.Conn, f *FS) {
	defer c.Close()
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		m := Mode(strings.TrimSpace(sc.Text()))
		reply := ""
		if m == "" {
			reply = "ok " + string(f.Mode())
		} else if err := f.SetMode(m); err != nil {
			reply = "error " + err.Error()
		} else {
			reply = "ok " + string(m)
		}
		if _, err := fmt.Fprintln(c, reply); err != nil {
			return
		}
	}
}

// Send switches the fault file system served on the control socket sock
// to mode m ("" only asks) and returns its mode once the switch is made.
func Send(sock string, m Mode) (Mode, error) {
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		return "", fmt.Errorf("faultfs control %s: %w", sock, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintln(c, string(m)); err != nil {
		return "", fmt.Errorf("faultfs control %s: %w", sock, err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("faultfs control %s: no answer: %w", sock, err)
	}
	line = strings.TrimSpace(line)
	if rest, ok := strings.CutPrefix(line, "ok "); ok {
		return Mode(rest), nil
	}
	return "", fmt.Errorf("faultfs control %s: %s", sock, strings.TrimPrefix(line, "error "))
}
