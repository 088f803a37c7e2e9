package gpucompute

import (
	"encoding/json"
	"fmt"
	"io"
)

// GPUOutcome is one GPU's judged result.
type GPUOutcome struct {
	Index    int    `json:"index"`
	PCIBusID string `json:"pciBusId,omitempty"`
	Name     string `json:"name,omitempty"`
	// Status is pass, warn or fail (an error counts as fail).
	Status  Verdict  `json:"status"`
	Metrics []Metric `json:"metrics,omitempty"`
	Figures *Figures `json:"figures,omitempty"`
	Message string   `json:"message,omitempty"`
}

// Outcome is a Report judged against expectations; what compute-check prints.
type Outcome struct {
	// Status is the worst GPU's status; "simulated" for simulated GPUs and "error"
	// when nothing could be measured.
	Status           string       `json:"status"`
	Library          string       `json:"library,omitempty"`
	DriverAPIVersion int          `json:"driverApiVersion,omitempty"`
	MinRatio         float64      `json:"minRatio"`
	Message          string       `json:"message,omitempty"`
	GPUs             []GPUOutcome `json:"gpus,omitempty"`
}

// StatusSimulated and StatusError are the Outcome statuses besides the verdicts.
const (
	StatusSimulated = "simulated"
	StatusError     = "error"
)

// Judge evaluates every GPU of r.
func Judge(r *Report, e Expect, minRatio float64) Outcome {
	if minRatio <= 0 {
		minRatio = DefaultMinRatio
	}
	o := Outcome{Library: r.Library, DriverAPIVersion: r.DriverAPIVersion, MinRatio: minRatio}
	switch {
	case r.Simulated:
		o.Status, o.Message = StatusSimulated, "simulated GPUs: no kernel ran, so there are no figures"
		return o
	case r.Err != "":
		o.Status, o.Message = StatusError, r.Err
		return o
	}
	worst := VerdictPass
	for _, g := range r.GPUs {
		out := GPUOutcome{Index: g.Index, PCIBusID: g.PCIBusID, Name: g.Name, Figures: g.Figures}
		if g.Figures == nil {
			out.Status, out.Message = VerdictFail, g.Err
		} else {
			out.Status, out.Metrics = Evaluate(*g.Figures, e, minRatio)
			out.Message = g.Figures.VerifyError
		}
		if rank(out.Status) > rank(worst) {
			worst = out.Status
		}
		o.GPUs = append(o.GPUs, out)
	}
	o.Status = string(worst)
	return o
}

func rank(v Verdict) int {
	switch v {
	case VerdictFail:
		return 2
	case VerdictWarn:
		return 1
	}
	return 0
}

// WriteJSON writes the outcome as indented JSON.
func (o Outcome) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(o)
}

// WriteText writes the outcome for people: one block per GPU, each figure with its
// expectation and ratio.
func (o Outcome) WriteText(w io.Writer) error {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	switch o.Status {
	case StatusSimulated:
		p("compute check: simulated\n  %s\n", o.Message)
		return nil
	case StatusError:
		p("compute check: error\n  %s\n", o.Message)
		return nil
	}
	p("compute check: %s (%s, CUDA driver API %d.%d; warn below %g of an expected figure)\n",
		o.Status, o.Library, o.DriverAPIVersion/1000, o.DriverAPIVersion%1000/10, o.MinRatio)
	for _, g := range o.GPUs {
		p("GPU %d %s (%s): %s\n", g.Index, g.Name, g.PCIBusID, g.Status)
		for _, m := range g.Metrics {
			exp := "no expectation set"
			if m.Expected > 0 {
				exp = fmt.Sprintf("expected %g, ratio %.2f", m.Expected, m.Ratio)
				if m.Low {
					exp += " LOW"
				}
			}
			p("  %-15s %10.2f %-6s %s\n", m.Name, m.Measured, m.Unit, exp)
		}
		if f := g.Figures; f != nil {
			p("  SGEMM N=%d, %d entries checked against the CPU, max relative error %.2g (verified %t); device copy verified %t\n",
				f.SGEMMN, f.SGEMMSamples, f.SGEMMMaxError, f.SGEMMVerified, f.CopyVerified)
		}
		if g.Message != "" {
			p("  %s\n", g.Message)
		}
	}
	return nil
}
