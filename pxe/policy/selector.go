package policy

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	"github.com/gpurack/gpurack/internal/disksel"
)

// Selector maps machines whose labels match to an image, like a matchbox group.
type Selector struct {
	// Name identifies the selector in messages.
	Name string `yaml:"name"`
	// Match lists label terms that must all equal the machine's labels. Keys: rack,
	// slot, sku, machine (matches the machine's id, boot MAC, serial or node name) or
	// any inventory label. Empty: matches every machine (a default).
	Match map[string]string `yaml:"match"`
	// Image is the image id (CONTRACTS §7) the machine boots.
	Image string `yaml:"image"`
	// Profile names the profile the image was built from, for display.
	Profile string `yaml:"profile"`
	// Labels are added to the machine's inventory labels.
	Labels map[string]string `yaml:"labels"`
	// NodeLabels and NodeTaints go into the JoinBundle: kubelet registers the Node with
	// the taints (registerWithTaints), and the agent puts the labels on it once kubelet
	// has registered it (CONTRACTS §4, §5). Taints are written "key[=value]:Effect".
	NodeLabels map[string]string `yaml:"nodeLabels"`
	NodeTaints []string          `yaml:"nodeTaints"`
	// DataDisks, when set, replace the image profile's storage.dataDisks for the
	// machines this selector matches: which local disks their agents may prepare as
	// data disks (docs/storage.md). They go into the JoinBundle.
	DataDisks []disksel.RuleSpec `yaml:"dataDisks"`
}

// Taint is a parsed NodeTaints entry.
type Taint struct{ Key, Value, Effect string }

// ParseTaint parses "key[=value]:Effect" with Effect NoSchedule, PreferNoSchedule or
// NoExecute.
func ParseTaint(s string) (Taint, error) {
	kv, effect, ok := strings.Cut(s, ":")
	switch effect {
	case "NoSchedule", "PreferNoSchedule", "NoExecute":
	default:
		ok = false
	}
	k, v, _ := strings.Cut(kv, "=")
	if !ok || k == "" {
		return Taint{}, fmt.Errorf("taint %q: write key[=value]:NoSchedule|PreferNoSchedule|NoExecute", s)
	}
	return Taint{Key: k, Value: v, Effect: effect}, nil
}

// Labels are a machine's selector inputs.
type Labels map[string]string

// Label keys gpuboot sets on every machine for selectors.
const (
	LabelRack   = "rack"
	LabelSlot   = "slot"
	LabelSKU    = "sku"
	LabelMAC    = "mac"
	LabelSerial = "serial"
	LabelID     = "id"
	LabelNode   = "node"
)

var imageIDPattern = regexp.MustCompile(`^[0-9a-f]{40}$`)

// IsImageID reports whether s is an image id: 40 lowercase hex characters (CONTRACTS §7).
func IsImageID(s string) bool { return imageIDPattern.MatchString(s) }

// ValidateSelectors checks a selector list: names unique and set, images valid ids.
func ValidateSelectors(ss []Selector) error {
	seen := map[string]bool{}
	for i, s := range ss {
		if s.Name == "" {
			return fmt.Errorf("selector %d: name is required", i+1)
		}
		if seen[s.Name] {
			return fmt.Errorf("selector %q: name used twice", s.Name)
		}
		seen[s.Name] = true
		if !imageIDPattern.MatchString(s.Image) {
			return fmt.Errorf("selector %q: image %q is not an image id (40 lowercase hex characters, CONTRACTS §7)", s.Name, s.Image)
		}
		for _, t := range s.NodeTaints {
			if _, err := ParseTaint(t); err != nil {
				return fmt.Errorf("selector %q: nodeTaints: %w", s.Name, err)
			}
		}
		if _, err := disksel.ParseSelector("dataDisks", s.DataDisks); err != nil {
			return fmt.Errorf("selector %q: %w", s.Name, err)
		}
	}
	return nil
}

// Select returns the selector for a machine with labels (Explain says why).
func Select(ss []Selector, labels Labels) (Selector, bool) {
	e := Explain(ss, labels)
	return e.Selector, e.Matched
}

// Explanation is which selector a machine gets and why.
type Explanation struct {
	// Selector is the winner; Matched is false when no selector matches.
	Selector Selector
	Matched  bool
	// Why says in a sentence why the winner won.
	Why string
	// Lost names each other matching selector and why it lost, in list order.
	Lost []string
}

// Explain picks the selector for a machine with labels among those all of whose terms
// match. Precedence, in order (decision 0687):
//  1. a selector with a machine term (it names this one machine) beats every one
//     without, so a canary always wins over a rack-wide or SKU selector;
//  2. then the one with the most terms;
//  3. then the first listed.
//
// The machine term matches the labels id, mac, serial or node.
func Explain(ss []Selector, labels Labels) Explanation {
	best := -1
	for i, s := range ss {
		if matches(s, labels) && (best < 0 || outranks(s, ss[best])) {
			best = i
		}
	}
	if best < 0 {
		return Explanation{Why: "no selector matches"}
	}
	w := ss[best]
	e := Explanation{Selector: w, Matched: true, Why: fmt.Sprintf("selector %q matches (%s)", w.Name, describeMatch(w))}
	for i, s := range ss {
		if i == best || !matches(s, labels) {
			continue
		}
		var why string
		switch {
		case names(w) && !names(s):
			why = fmt.Sprintf("%q names the machine", w.Name)
		case len(w.Match) > len(s.Match):
			why = fmt.Sprintf("%q has more terms (%d to %d)", w.Name, len(w.Match), len(s.Match))
		default:
			why = fmt.Sprintf("%q is listed first", w.Name)
		}
		e.Lost = append(e.Lost, fmt.Sprintf("selector %q (%s) also matches and loses: %s", s.Name, describeMatch(s), why))
	}
	return e
}

// outranks reports whether a wins over b, both matching and b listed first.
func outranks(a, b Selector) bool {
	if names(a) != names(b) {
		return names(a)
	}
	return len(a.Match) > len(b.Match)
}

// names reports whether s has a machine term.
func names(s Selector) bool {
	_, ok := s.Match["machine"]
	return ok
}

// describeMatch writes s's terms as "rack=r1, sku=X", sorted, or "matches every
// machine".
func describeMatch(s Selector) string {
	if len(s.Match) == 0 {
		return "no terms: matches every machine"
	}
	terms := make([]string, 0, len(s.Match))
	for k, v := range s.Match {
		terms = append(terms, k+"="+v)
	}
	sort.Strings(terms)
	return strings.Join(terms, ", ")
}

func matches(s Selector, labels Labels) bool {
	for k, v := range s.Match {
		if k == "machine" {
			v = strings.ToLower(v)
			if !(strings.ToLower(labels[LabelID]) == v || labels[LabelMAC] == v ||
				strings.ToLower(labels[LabelSerial]) == v || labels[LabelNode] == v) || v == "" {
				return false
			}
			continue
		}
		if labels[k] != v {
			return false
		}
	}
	return true
}

// SKU returns the sku label for a machine's GPUs: the product name of its GPUs
// sanitised the way GPU feature discovery does (characters outside [A-Za-z0-9._-]
// dropped, spaces to '-', CONTRACTS §5), e.g. "NVIDIA-H100-80GB-HBM3"; mixed products
// are joined with '_' in sorted order; "" for no GPUs.
func SKU(products []string) string {
	set := map[string]bool{}
	for _, p := range products {
		if s := SanitizeLabelValue(p); s != "" {
			set[s] = true
		}
	}
	var out []string
	for s := range set {
		out = append(out, s)
	}
	sort.Strings(out)
	v := strings.Join(out, "_")
	if len(v) > 63 {
		v = strings.Trim(v[:63], "-_.")
	}
	return v
}

// SanitizeLabelValue drops characters outside [A-Za-z0-9._-] after turning spaces into
// '-', and trims to a valid Kubernetes label value.
func SanitizeLabelValue(s string) string {
	var b strings.Builder
	for _, r := range strings.TrimSpace(s) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '_', r == '-':
			b.WriteRune(r)
		}
	}
	v := b.String()
	if len(v) > 63 {
		v = v[:63]
	}
	return strings.Trim(v, "-_.")
}
