package report

import (
	"bytes"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	bootv1 "github.com/gpurack/gpurack/api/boot/v1"
	machinev1 "github.com/gpurack/gpurack/api/machine/v1"
	"github.com/gpurack/gpurack/internal/testreq"
)

// hostile is text an agent, a stranger or a manifest could put in a report field, each
// piece something a Markdown renderer would turn into markup or a link.
var hostile = []string{
	"[click](http://evil.example/x)", "![img](http://evil.example/i.png)", "<img src=x onerror=alert(1)>",
	"<http://evil.example>", "http://evil.example/a", "www.evil.example", "mail me@evil.example",
	"*em* **strong** _u_ ~~del~~ `code`", "&lt;script&gt;", "a | b", "line\nbreak", `back\slash`,
}

// TestMarkdownEscapesUntrustedText renders a report whose agent-reported and manifest
// fields hold hostile text with cmark-gfm (GitHub's renderer, with its table, autolink,
// strikethrough and tagfilter extensions) and requires plain text out: no link, image,
// emphasis, code, strikethrough or HTML tag, each table row with its 12 cells, and the
// text readable as sent.
func TestMarkdownEscapesUntrustedText(t *testing.T) {
	cmark := testreq.Tool(t, "cmark-gfm", "apt-get install cmark-gfm (hack/deps.sh installs it)")
	var ms []*bootv1.Machine
	for i, h := range hostile {
		ms = append(ms, &bootv1.Machine{Id: "m" + string(rune('a'+i)), Rack: "r1", Slot: h, NodeName: h,
			State:    bootv1.MachineState_MACHINE_STATE_QUARANTINED,
			Identity: &machinev1.MachineIdentity{BootMac: h, Serial: h},
			Checklist: &machinev1.Checklist{ImageId: h, DriverVersion: h, Results: []*machinev1.CheckResult{
				{Id: h, Status: machinev1.CheckStatus_CHECK_STATUS_FAIL, Message: h}}},
			DataDisks: &machinev1.DataDisks{Disks: []*machinev1.DataDisk{
				{Path: h, Serial: h, Detail: h, State: machinev1.DataDiskState_DATA_DISK_STATE_REFUSED}}},
		})
	}
	ms = append(ms, &bootv1.Machine{Id: "ready", Rack: "r1", State: bootv1.MachineState_MACHINE_STATE_READY,
		GpuAllocation: &machinev1.GPUAllocation{Holders: []*machinev1.GPUHolder{{GpuUuid: "GPU-1", Namespace: hostile[0], Pod: "p", Tenant: hostile[1]}}}})
	d := Build("r1", ms, time.Unix(1764400000, 0))
	d.QuotaError = hostile[2]
	md, _, _, err := Render(d, bootv1.ReportFormat_REPORT_FORMAT_MARKDOWN)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(cmark, "--extension", "table", "--extension", "autolink", "--extension", "strikethrough", "--extension", "tagfilter")
	cmd.Stdin = bytes.NewReader(md)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("cmark-gfm: %v", err)
	}
	html := string(out)
	// The only tags the renderer may produce are the document's own: headings,
	// paragraphs, lists and tables.
	allowed := map[string]bool{"h1": true, "h2": true, "p": true, "ul": true, "li": true, "table": true, "thead": true, "tbody": true, "tr": true, "th": true, "td": true}
	for _, m := range regexp.MustCompile(`<(/?)([a-zA-Z0-9]+)`).FindAllStringSubmatch(html, -1) {
		if !allowed[strings.ToLower(m[2])] {
			t.Errorf("the rendered report has a <%s> tag: hostile text became markup\n%s", m[2], html)
			break
		}
	}
	if n := strings.Count(html, "<tr>"); n < len(hostile)+2 {
		t.Errorf("%d table rows rendered, want at least %d", n, len(hostile)+2)
	}
	for _, row := range regexp.MustCompile(`(?s)<tr>(.*?)</tr>`).FindAllStringSubmatch(html, -1) {
		cells := strings.Count(row[1], "<td") + strings.Count(row[1], "<th")
		if cells != 12 && cells != 5 && cells != 6 {
			t.Errorf("a table row has %d cells (a | or a line break split it): %s", cells, row[1])
		}
	}
	// What a reader sees is what was sent (HTML-escaped by the renderer; the '@' is
	// followed by a zero-width space).
	text := strings.NewReplacer("&lt;", "<", "&gt;", ">", "&amp;", "&", "&quot;", `"`, "\u200b", "").Replace(html)
	for _, h := range hostile {
		if want := strings.ReplaceAll(h, "\n", " "); !strings.Contains(text, want) {
			t.Errorf("the rendered report does not show %q as text", want)
		}
	}
}

func FuzzMarkdownEscape(f *testing.F) {
	for _, h := range hostile {
		f.Add(h)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e := mdEscape(s)
		if strings.ContainsAny(e, "\n\r") {
			t.Fatalf("mdEscape(%q) = %q keeps a line break", s, e)
		}
		// Every '|' (which ends a table cell) is escaped.
		for i := 0; i < len(e); i++ {
			if e[i] == '\\' {
				i++
				continue
			}
			if strings.ContainsRune("|[]<>`*_", rune(e[i])) {
				t.Fatalf("mdEscape(%q) = %q leaves %q unescaped", s, e, e[i])
			}
		}
	})
}
