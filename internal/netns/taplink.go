package netns

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// tapLink is a host's link to the bridge made of two TAP devices, eth0 in
// the host's namespace and the peer on the bridge, whose Ethernet frames
// this process copies from one to the other: a cable whose delay it
// controls. Frames from the host wait delay (like netem on the host's
// eth0); frames to it go at once. A full queue drops frames, as a link
// does.
type tapLink struct {
	host, bridge *os.File
	delay        atomic.Int64 // nanoseconds
	wg           sync.WaitGroup
}

// tapQueue bounds the frames in flight in one direction.
const tapQueue = 4096

// newTapLink makes the two devices (eth0 in hostNS, peer in bridgeNS,
// both down and unaddressed) and starts forwarding.
func newTapLink(hostNS, bridgeNS, peer string) (*tapLink, error) {
	h, err := openTap(hostNS, "eth0")
	if err != nil {
		return nil, err
	}
	b, err := openTap(bridgeNS, peer)
	if err != nil {
		h.Close()
		return nil, err
	}
	l := &tapLink{host: h, bridge: b}
	l.forward(h, b, &l.delay)
	l.forward(b, h, new(atomic.Int64))
	return l, nil
}

// openTap creates the TAP device name in namespace ns and returns its
// descriptor (non-blocking, so that Close ends a pending read).
func openTap(ns, name string) (*os.File, error) {
	var f *os.File
	err := inNetns(ns, func() error {
		fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		if err != nil {
			return fmt.Errorf("open /dev/net/tun: %w", err)
		}
		ifr, err := unix.NewIfreq(name)
		if err != nil {
			unix.Close(fd)
			return err
		}
		ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
			unix.Close(fd)
			return fmt.Errorf("create tap %s: %w", name, err)
		}
		f = os.NewFile(uintptr(fd), name)
		return nil
	})
	return f, err
}

// forward copies frames from src to dst, each held until delay after it
// was read. The delay is read while the frame waits, so a frame read
// under a delay goes at once when the delay is lifted (Heal): a healed
// link carries no frames still paced by the fault.
func (l *tapLink) forward(src, dst *os.File, delay *atomic.Int64) {
	type frame struct {
		read time.Time
		data []byte
	}
	q := make(chan frame, tapQueue)
	l.wg.Add(2)
	go func() {
		defer l.wg.Done()
		defer close(q)
		buf := make([]byte, 65536)
		for {
			n, err := src.Read(buf)
			if err != nil {
				if errors.Is(err, os.ErrClosed) {
					return
				}
				if errors.Is(err, unix.EIO) { // device down: no frames
					time.Sleep(10 * time.Millisecond)
					continue
				}
				return
			}
			select {
			case q <- frame{time.Now(), append([]byte(nil), buf[:n]...)}:
			default: // queue full: dropped
			}
		}
	}()
	go func() {
		defer l.wg.Done()
		for fr := range q {
			for {
				d := time.Until(fr.read.Add(time.Duration(delay.Load())))
				if d <= 0 {
					break
				}
				time.Sleep(min(d, 5*time.Millisecond))
			}
			_, _ = dst.Write(fr.data) // a down device refuses: the frame is lost
		}
	}()
}

// close ends the forwarding; the devices go with their descriptors.
func (l *tapLink) close() {
	l.host.Close()
	l.bridge.Close()
	l.wg.Wait()
}
