// Package auditlog reads kube-apiserver's audit log (DIR/logs/audit.log and the
// backups the apiserver rotates beside it) for the break-glass record: who got onto a
// node or into a container, and when. Those are the requests that open a shell or a
// stream, not the ones that change objects:
//
//   - a kubectl debug node pod created (name node-debugger-NODE-xxxxx);
//   - exec, attach and port-forward into a pod, and an ephemeral container added
//     (kubectl debug POD);
//   - the node proxy (nodes/NAME/proxy: the kubelet API through the apiserver).
//
// The audit policy controlplane-bootstrap writes (components.AuditPolicy) logs each of
// them at Metadata level at least: user, groups, source addresses, user agent, the
// object, the response code and, for exec, the command in the request URI.
package auditlog

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Event is the part of an audit.k8s.io/v1 Event this package reads (the apiserver
// writes one JSON object a line with --audit-log-format=json, its default).
type Event struct {
	Kind       string `json:"kind"`
	APIVersion string `json:"apiVersion"`
	AuditID    string `json:"auditID"`
	Stage      string `json:"stage"`
	RequestURI string `json:"requestURI"`
	Verb       string `json:"verb"`
	User       struct {
		Username string   `json:"username"`
		Groups   []string `json:"groups"`
	} `json:"user"`
	ImpersonatedUser *struct {
		Username string `json:"username"`
	} `json:"impersonatedUser"`
	SourceIPs []string `json:"sourceIPs"`
	UserAgent string   `json:"userAgent"`
	ObjectRef *struct {
		Resource    string `json:"resource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
		Subresource string `json:"subresource"`
	} `json:"objectRef"`
	ResponseStatus *struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	RequestReceivedTimestamp time.Time `json:"requestReceivedTimestamp"`
}

// Access is one break-glass request, its stages merged.
type Access struct {
	Time     time.Time `json:"time"` // when the apiserver received it
	User     string    `json:"user"` // "ALICE as BOB" when impersonated
	Groups   []string  `json:"groups,omitempty"`
	Action   string    `json:"action"`            // debug-node-pod, exec, attach, port-forward, ephemeral-container, node-proxy
	Target   string    `json:"target"`            // NAMESPACE/POD, or the node
	Command  string    `json:"command,omitempty"` // exec's command, space-separated
	Code     int       `json:"code"`              // the response code (0: no response logged yet)
	SourceIP string    `json:"sourceIP,omitempty"`
	AuditID  string    `json:"auditID"`
}

// Stats counts what Read passed over.
type Stats struct {
	Files   []string // read, oldest first
	Events  int      // audit events read
	Skipped int      // lines that are not an audit event (or longer than MaxLine)
}

// MaxLine bounds one line: a longer one is skipped and counted, never held whole.
const MaxLine = 4 << 20

// Files returns the audit log in dir's logs/ and its rotated backups (the apiserver's
// audit-TIMESTAMP.log, and gzip-free backups only), oldest first; the live file last.
func Files(dir string) ([]string, error) {
	live := filepath.Join(dir, "logs", "audit.log")
	backups, err := filepath.Glob(filepath.Join(dir, "logs", "audit-*.log"))
	if err != nil {
		return nil, err
	}
	slices.Sort(backups) // the timestamp in the name sorts as time
	if _, err := os.Stat(live); err != nil {
		if len(backups) == 0 {
			return nil, fmt.Errorf("no audit log in %s: is DIR the cluster directory that init made (the apiserver writes logs/audit.log there)? %w", dir, err)
		}
		return backups, nil
	}
	return append(backups, live), nil
}

// Read returns the break-glass requests received at or after since in dir's audit
// logs, oldest first.
func Read(dir string, since time.Time) ([]Access, Stats, error) {
	files, err := Files(dir)
	if err != nil {
		return nil, Stats{}, err
	}
	st := Stats{Files: files}
	c := newCollector()
	for _, f := range files {
		if err := readFile(f, c, &st); err != nil {
			return nil, st, err
		}
	}
	return c.since(since), st, nil
}

func readFile(path string, c *collector, st *Stats) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return scan(f, c, st)
}

// scan feeds every line of r that parses as an audit event to c.
func scan(r io.Reader, c *collector, st *Stats) error {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := readLine(br)
		if len(line) > 0 {
			if e, ok := ParseLine(line); ok {
				st.Events++
				c.add(e)
			} else {
				st.Skipped++
			}
		}
		if errors.Is(err, errTooLong) {
			st.Skipped++
			continue
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

var errTooLong = errors.New("line longer than MaxLine")

// readLine returns the next line without its newline. A line over MaxLine is read to
// its end and dropped (errTooLong), so memory stays bounded.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(line)+len(chunk) > MaxLine {
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n')
			}
			if err != nil && err != io.EOF {
				return nil, err
			}
			return nil, errTooLong
		}
		line = append(line, chunk...)
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		return bytes.TrimRight(line, "\r\n"), err
	}
}

// ParseLine parses one audit log line. ok is false for anything that is not an
// audit.k8s.io Event with an id (a truncated last line, text format, garbage).
func ParseLine(line []byte) (Event, bool) {
	var e Event
	if err := json.Unmarshal(line, &e); err != nil {
		return Event{}, false
	}
	if e.Kind != "Event" || !strings.HasPrefix(e.APIVersion, "audit.k8s.io/") || e.AuditID == "" {
		return Event{}, false
	}
	return e, true
}

// Classify names the break-glass action e is, and its target; ok is false for every
// other request.
func Classify(e Event) (action, target string, ok bool) {
	o := e.ObjectRef
	if o == nil {
		return "", "", false
	}
	pod := o.Namespace + "/" + o.Name
	switch {
	case o.Resource == "pods" && o.Subresource == "" && e.Verb == "create" && strings.HasPrefix(o.Name, "node-debugger-"):
		return "debug-node-pod", pod, true
	case o.Resource == "pods" && o.Subresource == "exec":
		return "exec", pod, true
	case o.Resource == "pods" && o.Subresource == "attach":
		return "attach", pod, true
	case o.Resource == "pods" && o.Subresource == "portforward":
		return "port-forward", pod, true
	case o.Resource == "pods" && o.Subresource == "ephemeralcontainers" && (e.Verb == "update" || e.Verb == "patch"):
		return "ephemeral-container", pod, true
	case o.Resource == "nodes" && o.Subresource == "proxy":
		return "node-proxy", o.Name, true
	}
	return "", "", false
}

// collector merges the stages of each request by audit id.
type collector struct {
	byID  map[string]*Access
	order []string
}

func newCollector() *collector { return &collector{byID: map[string]*Access{}} }

func (c *collector) add(e Event) {
	action, target, ok := Classify(e)
	if !ok {
		return
	}
	a := c.byID[e.AuditID]
	if a == nil {
		a = &Access{Time: e.RequestReceivedTimestamp, User: e.User.Username, Groups: e.User.Groups,
			Action: action, Target: target, Command: execCommand(e.RequestURI), AuditID: e.AuditID}
		if e.ImpersonatedUser != nil && e.ImpersonatedUser.Username != "" {
			a.User += " as " + e.ImpersonatedUser.Username
		}
		if len(e.SourceIPs) > 0 {
			a.SourceIP = e.SourceIPs[0]
		}
		c.byID[e.AuditID] = a
		c.order = append(c.order, e.AuditID)
	}
	if e.ResponseStatus != nil && e.ResponseStatus.Code != 0 && (a.Code == 0 || e.Stage == "ResponseComplete" || e.Stage == "Panic") {
		a.Code = e.ResponseStatus.Code
	}
}

// since returns the requests received at or after t, oldest first.
func (c *collector) since(t time.Time) []Access {
	var out []Access
	for _, id := range c.order {
		if a := c.byID[id]; !a.Time.Before(t) {
			out = append(out, *a)
		}
	}
	slices.SortStableFunc(out, func(a, b Access) int { return a.Time.Compare(b.Time) })
	return out
}

// execCommand is the command an exec request runs (its command= parameters), or "".
func execCommand(uri string) string {
	u, err := url.ParseRequestURI(uri)
	if err != nil {
		return ""
	}
	return strings.Join(u.Query()["command"], " ")
}
