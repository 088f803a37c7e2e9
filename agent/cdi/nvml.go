package cdi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi"
	"github.com/NVIDIA/nvidia-container-toolkit/pkg/nvcdi/transform"
	specs "tags.cncf.io/container-device-interface/specs-go"
)

// HookPath is where GPU images ship nvidia-cdi-hook, built from the same pinned
// nvidia-container-toolkit module as pkg/nvcdi (imagebuilder); the spec's hooks run it.
const HookPath = "/usr/bin/nvidia-cdi-hook"

// NVMLOptions configure the real GPUs' spec.
type NVMLOptions struct {
	// Dir is the spec directory; empty: Dir.
	Dir string
	// NVML is the library to query, already loaded (the agent's own, so that
	// --nvml-library is honoured); nvcdi calls Init and Shutdown on it in pairs.
	NVML nvml.Interface
	// DriverRoot is where the driver's files are found; empty: "/". DevRoot is where
	// its device nodes are; empty: DriverRoot.
	DriverRoot, DevRoot string
	// LibrarySearchPaths are extra directories for the driver's libraries (for
	// example the one --nvml-library names).
	LibrarySearchPaths []string
	// HookPath is nvidia-cdi-hook's path in the spec's hooks; empty: HookPath.
	HookPath string
	// SimDevDir is refused in the spec (CheckReal); empty: SimDevDir.
	SimDevDir string
	Log       *slog.Logger
}

// GenerateNVML asks nvcdi (mode nvml) for the spec of every GPU NVML reports, named by
// UUID and by index, with the "all" device. It writes nothing.
func GenerateNVML(o NVMLOptions) (*specs.Spec, error) {
	if o.NVML == nil {
		return nil, errors.New("CDI spec: no NVML library (NVML is not loaded on this node)")
	}
	root := o.DriverRoot
	if root == "" {
		root = "/"
	}
	hook := o.HookPath
	if hook == "" {
		hook = HookPath
	}
	byUUID, err := nvcdi.NewDeviceNamer(nvcdi.DeviceNameStrategyUUID)
	if err != nil {
		return nil, err
	}
	byIndex, err := nvcdi.NewDeviceNamer(nvcdi.DeviceNameStrategyIndex)
	if err != nil {
		return nil, err
	}
	opts := []nvcdi.Option{
		nvcdi.WithMode(nvcdi.ModeNvml),
		nvcdi.WithNvmlLib(o.NVML),
		nvcdi.WithDeviceNamers(byUUID, byIndex),
		// "all", as nvidia-ctk cdi generate makes it.
		nvcdi.WithMergedDeviceOptions(transform.WithName("all"), transform.WithSkipIfExists(true)),
		nvcdi.WithVendor(Vendor),
		nvcdi.WithClass(Class),
		nvcdi.WithDriverRoot(root),
		nvcdi.WithNVIDIACDIHookPath(hook),
		// The driver's nvsandboxutils is not shipped in gpurack images; NVML answers
		// what nvcdi asks it for.
		nvcdi.WithFeatureFlags(nvcdi.FeatureDisableNvsandboxUtils),
		nvcdi.WithLogger(slogLogger{orDiscard(o.Log)}),
	}
	if o.DevRoot != "" {
		opts = append(opts, nvcdi.WithDevRoot(o.DevRoot))
	}
	if len(o.LibrarySearchPaths) > 0 {
		opts = append(opts, nvcdi.WithLibrarySearchPaths(o.LibrarySearchPaths))
	}
	lib, err := nvcdi.New(opts...)
	if err != nil {
		return nil, fmt.Errorf("CDI spec: nvcdi: %w", err)
	}
	s, err := lib.GetSpec()
	if err != nil {
		return nil, fmt.Errorf("CDI spec: nvcdi could not describe this node's GPUs and driver (driver root %s): %w", root, err)
	}
	raw := s.Raw()
	if raw == nil || len(raw.Devices) == 0 {
		return nil, fmt.Errorf("CDI spec: nvcdi found no GPU device (driver root %s)", root)
	}
	if err := CheckReal(raw, o.SimDevDir); err != nil {
		return nil, err
	}
	return raw, nil
}

// WriteNVML generates the real GPUs' spec (GenerateNVML) and writes it to
// Dir/nvidia.yaml, removing a simulated spec left in Dir. It returns the path.
func WriteNVML(_ context.Context, o NVMLOptions) (string, error) {
	spec, err := GenerateNVML(o)
	if err != nil {
		return "", err
	}
	dir := o.Dir
	if dir == "" {
		dir = Dir
	}
	path := filepath.Join(dir, NVIDIAFile)
	if _, err := write(path, spec); err != nil {
		return "", err
	}
	// A simulated spec beside it would offer the same device names.
	if err := os.Remove(filepath.Join(dir, SimulatedFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("remove the stale simulated CDI spec: %w", err)
	}
	return path, nil
}

func orDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// slogLogger is nvcdi's logger interface over slog.
type slogLogger struct{ l *slog.Logger }

func (s slogLogger) Tracef(string, ...any)          {}
func (s slogLogger) Debugf(f string, args ...any)   { s.l.Debug("nvcdi: " + fmt.Sprintf(f, args...)) }
func (s slogLogger) Infof(f string, args ...any)    { s.l.Debug("nvcdi: " + fmt.Sprintf(f, args...)) }
func (s slogLogger) Warningf(f string, args ...any) { s.l.Warn("nvcdi: " + fmt.Sprintf(f, args...)) }
func (s slogLogger) Errorf(f string, args ...any)   { s.l.Error("nvcdi: " + fmt.Sprintf(f, args...)) }
