package main

import (
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/spf13/pflag"

	"github.com/gpurack/gpurack/agent/facts"
	"github.com/gpurack/gpurack/agent/gpu"
	gpunvml "github.com/gpurack/gpurack/agent/gpu/nvml"
	"github.com/gpurack/gpurack/agent/gpu/sim"
	"github.com/gpurack/gpurack/internal/profile"
)

// DefaultProfilePath is where gpuimage installs the canonical profile (CONTRACTS §6).
const DefaultProfilePath = "/etc/gpurack/profile.json"

// backendFlags are shared by validate and run.
type backendFlags struct {
	profilePath string
	backend     string
	faults      []string
	nvmlLibrary string
	simSeed     string
	logLevel    string
	logFormat   string
}

func (f *backendFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&f.profilePath, "profile", DefaultProfilePath, "node profile (YAML or its canonical JSON) with the GPU expectations and thresholds")
	fs.StringVar(&f.backend, "gpu-backend", "", "GPU backend: nvml, or sim:MODEL with MODEL one of "+strings.Join(sim.Models(), ", ")+" (default: sim:MODEL where the profile's gpu.simulator names MODEL, else nvml)")
	fs.StringArrayVar(&f.faults, "fault", nil, "inject a simulator fault, repeatable: "+strings.ReplaceAll(strings.TrimSpace(sim.Grammar()), "\n", "\n"))
	fs.StringVar(&f.nvmlLibrary, "nvml-library", "", "path of libnvidia-ml.so.1 (default: the dynamic loader's search)")
	fs.StringVar(&f.simSeed, "sim-seed", "", "seed for simulated GPU UUIDs and serials (default: the hostname)")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.StringVar(&f.logFormat, "log-format", "text", "log format: text (journald adds the time) or json")
}

func (f *backendFlags) logger() (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(f.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: use debug, info, warn or error", f.logLevel)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch f.logFormat {
	case "text":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: use text or json", f.logFormat)
}

// loadProfile reads the profile; an error means the agent cannot run.
func (f *backendFlags) loadProfile() (*profile.Profile, error) {
	p, err := profile.Load(f.profilePath)
	if err != nil {
		if os.IsNotExist(err) || strings.Contains(err.Error(), "no such file") {
			return nil, fmt.Errorf("no profile at %s: pass --profile FILE (a profiles/NAME.yaml, or the image's %s)", f.profilePath, DefaultProfilePath)
		}
		return nil, err
	}
	return p, nil
}

// open is what every command starts with: the logger, the profile and the backend
// (with the simulator, nil for NVML). Each error is one the operator fixes (exit 2).
// The caller closes the backend.
func (f *backendFlags) open() (*slog.Logger, *profile.Profile, closableBackend, *sim.Sim, error) {
	log, err := f.logger()
	if err != nil {
		return nil, nil, nil, nil, &exitError{2, err}
	}
	p, err := f.loadProfile()
	if err != nil {
		return nil, nil, nil, nil, &exitError{2, err}
	}
	b, s, err := f.openBackend(p)
	if err != nil {
		return nil, nil, nil, nil, &exitError{2, err}
	}
	return log, p, b, s, nil
}

// defaultBackend is the backend when --gpu-backend is not given: the simulator model a
// simulated GPU image's profile names (gpu.simulator), else NVML.
func defaultBackend(p *profile.Profile) string {
	if p != nil && p.Simulated() {
		return "sim:" + p.GPU.Simulator
	}
	return "nvml"
}

// closer is what backends have besides gpu.Backend.
type closableBackend interface {
	gpu.Backend
	Close() error
}

// openBackend builds the backend the flags name and applies --fault. The simulator
// is returned too (nil for NVML) for fault injection.
func (f *backendFlags) openBackend(p *profile.Profile) (closableBackend, *sim.Sim, error) {
	if f.backend == "" {
		f.backend = defaultBackend(p)
	}
	switch {
	case f.backend == "nvml":
		if len(f.faults) > 0 {
			return nil, nil, fmt.Errorf("--fault works only with --gpu-backend sim:MODEL; real GPUs are not broken on purpose")
		}
		return gpunvml.Open(f.nvmlLibrary), nil, nil
	case strings.HasPrefix(f.backend, "sim:"):
		seed := f.simSeed
		if seed == "" {
			seed = facts.Hostname()
		}
		o := sim.Options{Seed: seed}
		if p != nil && p.GPU != nil {
			o.DriverVersion = p.GPU.Driver.Version
		}
		s, err := sim.New(strings.TrimPrefix(f.backend, "sim:"), o)
		if err != nil {
			return nil, nil, fmt.Errorf("--gpu-backend %s: %w", f.backend, err)
		}
		for _, spec := range f.faults {
			fault, err := sim.ParseFault(spec)
			if err != nil {
				return nil, nil, fmt.Errorf("--fault: %w", err)
			}
			if _, err := s.Inject(fault, 0); err != nil {
				return nil, nil, fmt.Errorf("--fault: %w", err)
			}
		}
		return s, s, nil
	}
	return nil, nil, fmt.Errorf("--gpu-backend %q: use nvml or sim:MODEL (%s)", f.backend, strings.Join(sim.Models(), ", "))
}
