// Package report renders a checklist for people and programs: an aligned text table
// for a terminal, Markdown for tickets and the rack report, JSON (the protojson form of
// gpurack.machine.v1.Checklist) for tools.
package report

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/gpurack/gpurack/agent/checks"
	"github.com/gpurack/gpurack/agent/facts"
	"github.com/gpurack/gpurack/agent/monitor"
	"github.com/gpurack/gpurack/agent/protoconv"
	"github.com/gpurack/gpurack/internal/pbjson"
)

// Formats lists the supported formats.
var Formats = []string{"text", "json", "md"}

// Write renders c in format to w.
func Write(w io.Writer, format string, c *monitor.Checklist, id facts.Identity, imageID string) error {
	switch format {
	case "text":
		return text(w, c)
	case "md":
		return markdown(w, c)
	case "json":
		b, err := pbjson.Marshal(protoconv.Checklist(c, id, imageID, ""))
		if err != nil {
			return err
		}
		_, err = w.Write(b)
		return err
	}
	return fmt.Errorf("unknown format %q; use %s", format, strings.Join(Formats, ", "))
}

func gpuCol(r checks.Result) string {
	if r.GPU < 0 {
		return "-"
	}
	return fmt.Sprint(r.GPU)
}

func header(c *monitor.Checklist) string {
	s := c.Snapshot
	drv := s.Driver.Version
	if !s.Driver.Loaded {
		drv = "not loaded"
	}
	return fmt.Sprintf("gpurack checklist: profile %s, backend %s, driver %s, %d GPUs, %s",
		c.Profile, s.Backend, drv, len(s.GPUs), c.FinishedAt.Sub(c.StartedAt).Round(1e5))
}

// text prints one line per node-level result and per GPU result that is not a pass
// (passing per-GPU results are folded into one line per check), then the remedies.
func text(w io.Writer, c *monitor.Checklist) error {
	fmt.Fprintln(w, header(c))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STATUS\tCHECK\tGPU\tOBSERVED\tEXPECTED")
	for _, r := range fold(c.Results) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", strings.ToUpper(r.Status.String()), r.ID, r.gpus, cut(r.Observed, 60), cut(r.Expected, 40))
	}
	tw.Flush()
	remedies(w, c.Results, "- ")
	fmt.Fprintf(w, "overall: %s\n", strings.ToUpper(c.Overall.String()))
	return nil
}

func markdown(w io.Writer, c *monitor.Checklist) error {
	fmt.Fprintf(w, "## %s\n\n", header(c))
	fmt.Fprintln(w, "| status | check | GPU | observed | expected |")
	fmt.Fprintln(w, "|---|---|---|---|---|")
	esc := func(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
	for _, r := range fold(c.Results) {
		fmt.Fprintf(w, "| %s | `%s` | %s | %s | %s |\n", r.Status, r.ID, r.gpus, esc(r.Observed), esc(r.Expected))
	}
	fmt.Fprintln(w)
	remedies(w, c.Results, "- ")
	fmt.Fprintf(w, "\n**Overall: %s**\n", c.Overall)
	return nil
}

type row struct {
	checks.Result
	gpus string
}

// fold merges a check's per-GPU results that have the same status and observation.
func fold(rs []checks.Result) []row {
	var out []row
	for _, r := range rs {
		if n := len(out); n > 0 && r.GPU >= 0 {
			last := &out[n-1]
			if last.ID == r.ID && last.Status == r.Status && last.Observed == r.Observed && last.GPU >= 0 {
				if i := strings.LastIndex(last.gpus, "-"); i >= 0 && last.gpus[i+1:] == fmt.Sprint(r.GPU-1) {
					last.gpus = last.gpus[:i+1] + fmt.Sprint(r.GPU)
				} else if last.gpus == fmt.Sprint(r.GPU-1) {
					last.gpus += "-" + fmt.Sprint(r.GPU)
				} else {
					last.gpus += "," + fmt.Sprint(r.GPU)
				}
				continue
			}
		}
		out = append(out, row{r, gpuCol(r)})
	}
	return out
}

func remedies(w io.Writer, rs []checks.Result, bullet string) {
	// Consecutive problems with the same status, message and remedy (every check after a
	// driver that does not load, say) are printed once, with their ids.
	type group struct {
		r     checks.Result
		names []string
	}
	var groups []group
	for _, r := range rs {
		if r.Status != checks.Fail && r.Status != checks.Warn && r.Status != checks.Unknown {
			continue
		}
		name := string(r.ID)
		if r.GPU >= 0 {
			name += fmt.Sprintf(" [gpu%d]", r.GPU)
		}
		if n := len(groups); n > 0 {
			g := &groups[n-1]
			if g.r.Status == r.Status && g.r.Message == r.Message && g.r.Remedy == r.Remedy {
				g.names = append(g.names, name)
				continue
			}
		}
		groups = append(groups, group{r, []string{name}})
	}
	if len(groups) == 0 {
		return
	}
	fmt.Fprintln(w, "\nproblems:")
	for _, g := range groups {
		fmt.Fprintf(w, "%s%s %s: %s", bullet, strings.ToUpper(g.r.Status.String()), strings.Join(g.names, ", "), g.r.Message)
		if g.r.Remedy != "" {
			fmt.Fprintf(w, " Remedy: %s", g.r.Remedy)
		}
		fmt.Fprintln(w)
	}
}

func cut(s string, n int) string {
	if len([]rune(s)) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}
