package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/gpurack/gpurack/internal/strictyaml"
	"github.com/gpurack/gpurack/pxe/config"
	"github.com/gpurack/gpurack/pxe/server"
)

func newConfigCommand() *cobra.Command {
	cfgCmd := &cobra.Command{Use: "config", Short: "Check gpuboot's configuration before a restart"}
	var path string
	var asJSON bool
	check := &cobra.Command{
		Use:   "check --config gpuboot.yaml [--json]",
		Short: "Check gpuboot.yaml, and everything it names, as gpuboot serve would at start, without serving",
		Long: `check loads the configuration exactly as "gpuboot serve" does and runs serve's start
checks, without serving, binding a port, opening the inventory (a running gpuboot holds
it), contacting the cluster or writing anything. It prints one line per check:

  LEVEL    CHECK       WHAT
  ok       allowlist   /etc/gpuboot/rack-r2.csv: 20 rows
  error    image       0123… (rack r2 defaultImage) is not in the image store /srv/images: …
  warning  enrollment  approval allowlist with identity mac-uuid-serial: …

It checks: the YAML and every setting; the state directory's CA and server certificate
(expired, expiring within 30 days, or not naming advertise); every policy.allowlist
file (rows counted per file) and their merge (a serial, MAC or EK in two files);
enrollment.ekRoots; each rack's gossip key (a missing one is made by serve at start);
cluster.kubeconfig (loaded, not contacted); images.trustedKeys and every image a
selector or a rack's defaultImage names (in images.store, its signature and artifacts
verified, as serve verifies before serving); racks no image reaches; STATEDIR/
bmc-credentials.yaml and manifest rows whose BMC no account covers; the operator tokens
file; the DHCP interfaces and the TFTP directory; and every warning serve logs at start.

An error is what serve refuses, or what keeps machines from booting or enrolling; a
warning is what serve logs at start. It exits 1 when any check is an error. Run it on
gpuboot's host, as the user gpuboot runs as, before "systemctl restart gpuboot".`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			findings := checkConfig(path)
			out := cmd.OutOrStdout()
			if asJSON {
				if err := printFindingsJSON(out, path, findings); err != nil {
					return err
				}
			} else {
				printFindings(out, findings)
			}
			if n := count(findings, server.LevelError); n > 0 {
				return fmt.Errorf("config check: %d errors in %s or what it names: fix the lines marked error before restarting gpuboot", n, path)
			}
			return nil
		},
	}
	check.Flags().StringVar(&path, "config", "/etc/gpuboot/gpuboot.yaml", "configuration file to check (what gpuboot serve --config reads)")
	check.Flags().BoolVar(&asJSON, "json", false, `print {"config", "errors", "warnings", "findings": [{"level", "check", "message"}]} instead of lines`)
	cfgCmd.AddCommand(check)
	return cfgCmd
}

// checkConfig loads path as gpuboot serve does and, when it loads, runs serve's start
// checks on it.
func checkConfig(path string) []server.Finding {
	cfg, err := config.Load(path)
	if err != nil {
		var es strictyaml.Errors
		if !errors.As(err, &es) {
			return []server.Finding{{Level: server.LevelError, Check: "config", Message: err.Error()}}
		}
		out := make([]server.Finding, len(es))
		for i, e := range es {
			out[i] = server.Finding{Level: server.LevelError, Check: "config", Message: e.Error()}
		}
		return out
	}
	return append([]server.Finding{{Level: server.LevelOK, Check: "config", Message: cfg.Source + ": parsed and valid"}}, server.Check(cfg)...)
}

func count(fs []server.Finding, level server.Level) int {
	n := 0
	for _, f := range fs {
		if f.Level == level {
			n++
		}
	}
	return n
}

func printFindings(w io.Writer, fs []server.Finding) {
	for _, f := range fs {
		fmt.Fprintf(w, "%-8s %-11s %s\n", f.Level, f.Check, f.Message)
	}
	errs, warns := count(fs, server.LevelError), count(fs, server.LevelWarning)
	switch {
	case errs > 0:
		fmt.Fprintf(w, "%d errors, %d warnings: gpuboot serve would refuse this configuration, or machines would not boot\n", errs, warns)
	default:
		fmt.Fprintf(w, "no errors, %d warnings: gpuboot serve can start with this configuration\n", warns)
	}
}

func printFindingsJSON(w io.Writer, path string, fs []server.Finding) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(struct {
		Config   string           `json:"config"`
		Errors   int              `json:"errors"`
		Warnings int              `json:"warnings"`
		Findings []server.Finding `json:"findings"`
	}{path, count(fs, server.LevelError), count(fs, server.LevelWarning), fs})
}
