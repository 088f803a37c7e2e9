package xid

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"golang.org/x/sys/unix"

	gpunvml "github.com/gpurack/gpurack/agent/gpu/nvml"
)

// EventLibrary is the part of NVML the event watch uses.
type EventLibrary interface {
	EventSetCreate() (nvml.EventSet, nvml.Return)
	DeviceGetCount() (int, nvml.Return)
	DeviceGetHandleByIndex(int) (nvml.Device, nvml.Return)
	Extensions() nvml.ExtendedInterface
}

// NVMLEvent is one event from an NVML event set.
type NVMLEvent struct {
	GPU      int
	PCIBusID string
	// Type is the nvmlEventType bit (EventTypeXidCriticalError, …).
	Type uint64
	// Data is the XID code for XID events.
	Data uint64
}

// watchedEvents are registered where the GPU supports them: XIDs (the device plugin's
// health signal), ECC events (a reason to re-read counters at once), and, where
// present, GPU-unavailable and recovery-action events.
const watchedEvents = nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError |
	nvml.EventTypeSingleBitEccError | nvml.EventTypeGpuUnavailableError | nvml.EventTypeGpuRecoveryAction

// WatchNVML registers every GPU for watchedEvents and calls emit for each event until
// ctx ends. It waits at most 1 s at a time, so it returns within about a second of
// ctx ending; the caller must not shut NVML down before it returned.
func WatchNVML(ctx context.Context, lib EventLibrary, log *slog.Logger, emit func(NVMLEvent)) error {
	ext := lib.Extensions()
	for _, sym := range []string{"nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventSetWait", "nvmlEventSetFree", "nvmlDeviceGetSupportedEventTypes"} {
		if err := ext.LookupSymbol(sym); err != nil {
			return fmt.Errorf("NVML events: driver lacks %s", sym)
		}
	}
	set, ret := lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("NVML events: nvmlEventSetCreate: %s", ret.Error())
	}
	defer set.Free()
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("NVML events: nvmlDeviceGetCount: %s", ret.Error())
	}
	buses := map[int]string{}
	for i := 0; i < n; i++ {
		d, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			log.Warn("NVML events: no handle", "gpu", i, "error", ret.Error())
			continue
		}
		sup, ret := d.GetSupportedEventTypes()
		if ret != nvml.SUCCESS {
			log.Warn("NVML events: supported event types", "gpu", i, "error", ret.Error())
			continue
		}
		if ret := d.RegisterEvents(sup&watchedEvents, set); ret != nvml.SUCCESS {
			log.Warn("NVML events: register", "gpu", i, "error", ret.Error())
		}
		if p, ret := d.GetPciInfo(); ret == nvml.SUCCESS {
			buses[i] = gpunvml.BusID(p)
		}
	}
	for ctx.Err() == nil {
		e, ret := set.Wait(1000)
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_TIMEOUT:
			continue
		default:
			// ERROR_GPU_IS_LOST and friends: the snapshot adapter sees the lost GPU on
			// its next read; here, avoid a busy loop.
			log.Warn("NVML events: wait", "error", ret.Error())
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		ev := NVMLEvent{GPU: -1, Type: e.EventType, Data: e.EventData}
		if e.Device != nil {
			if idx, ret := e.Device.GetIndex(); ret == nvml.SUCCESS {
				ev.GPU = idx
				ev.PCIBusID = buses[idx]
			}
		}
		emit(ev)
	}
	return nil
}

// KmsgPath is the kernel log device.
const KmsgPath = "/dev/kmsg"

// WatchKmsg reads kernel log records from r (normally /dev/kmsg, opened with
// OpenKmsg, which yields every record still in the ring buffer and then blocks for new
// ones) and calls emit for each NVRM Xid line, until r returns io.EOF or another
// error than EPIPE (a record overwritten while we read; skipped, as dmesg does). A
// malformed Xid line is logged and skipped. Close r to stop it.
func WatchKmsg(r io.Reader, log *slog.Logger, emit func(Record)) error {
	buf := make([]byte, 16*1024)
	var carry []byte
	for {
		n, err := r.Read(buf)
		if n > 0 {
			data := append(carry, buf[:n]...)
			for {
				i := bytes.IndexByte(data, '\n')
				if i < 0 {
					break
				}
				line := string(data[:i])
				data = data[i+1:]
				rec, ok, perr := ParseKmsg(line)
				switch {
				case perr != nil:
					log.Warn("kernel log: unparsable Xid line", "error", perr)
				case ok:
					emit(rec)
				}
			}
			carry = append(carry[:0], data...)
			if len(carry) > 64*1024 {
				carry = carry[:0]
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, syscall.EPIPE):
			continue
		case errors.Is(err, io.EOF), errors.Is(err, os.ErrClosed):
			return nil
		default:
			return fmt.Errorf("read kernel log: %w", err)
		}
	}
}

// OpenKmsg opens the kernel log for reading from the start of the ring buffer. The
// returned file's Read blocks in Go's poller, so Close unblocks it.
func OpenKmsg(path string) (*os.File, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w (the agent runs as root to read it)", path, err)
	}
	return os.NewFile(uintptr(fd), path), nil
}

// BootTime is when the system booted by CLOCK_MONOTONIC, to turn kmsg timestamps into
// wall-clock time.
func BootTime() time.Time {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return time.Time{}
	}
	return time.Now().Add(-time.Duration(ts.Nano()))
}

// DrainKmsg reads the records still in the kernel log once, without waiting for new
// ones, and calls emit for each Xid line.
func DrainKmsg(path string, log *slog.Logger, emit func(Record)) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w (reading it needs root)", path, err)
	}
	defer unix.Close(fd)
	buf := make([]byte, 16*1024)
	for {
		n, err := unix.Read(fd, buf)
		switch {
		case err == unix.EPIPE || err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return nil
		case err != nil:
			return fmt.Errorf("read %s: %w", path, err)
		case n == 0:
			return nil
		}
		for _, line := range bytes.Split(buf[:n], []byte{'\n'}) {
			rec, ok, perr := ParseKmsg(string(line))
			switch {
			case perr != nil:
				log.Warn("kernel log: unparsable Xid line", "error", perr)
			case ok:
				emit(rec)
			}
		}
	}
}
