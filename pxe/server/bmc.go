package server

import (
	"log/slog"
	"path/filepath"

	"github.com/gpurack/gpurack/pxe/bmc"
	"github.com/gpurack/gpurack/pxe/enroll"
)

// loadBMCAccess loads gpuboot's BMC accounts (STATEDIR/bmc-credentials.yaml) for power
// control. A missing file is no accounts; a file that does not load is logged and
// kept as the reason every power action gives, so that booting machines never waits
// on it.
func loadBMCAccess(stateDir string, log *slog.Logger) enroll.BMCAccess {
	path := filepath.Join(stateDir, bmc.CredentialsFile)
	c, err := bmc.LoadCredentials(path)
	switch {
	case bmc.IsNotExist(err):
		return enroll.BMCAccess{}
	case err != nil:
		log.Error("BMC credentials not loaded: power control through BMCs is off until the file is fixed and gpuboot restarted", "file", path, "err", err)
		return enroll.BMCAccess{Unavailable: err}
	}
	log.Info("BMC credentials loaded", "file", path)
	return enroll.BMCAccess{Credentials: c}
}
