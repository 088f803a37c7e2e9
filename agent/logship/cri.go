package logship

import (
	"bytes"
	"path/filepath"
	"strings"
	"time"
)

// criLine is one line of a container log file in the CRI format kubelet and containerd
// write (the CRI's "Container Logging" design, kubernetes/design-proposals
// node/kubelet-cri-logging.md):
//
//	TIMESTAMP STREAM TAGS MESSAGE
//
// TIMESTAMP is RFC 3339 with nanoseconds; STREAM is stdout or stderr; TAGS is P (a
// partial line: the runtime split a long line, the next P or F continues it) or F
// (full: the line ends here), possibly followed by further ":"-separated tags.
type criLine struct {
	Time    time.Time
	Stream  string
	Partial bool
	Msg     []byte
}

// parseCRILine parses one line (without its newline). ok is false when it is not in the
// CRI format; the caller then ships the raw line. Msg aliases line.
func parseCRILine(line []byte) (c criLine, ok bool) {
	ts, rest, found := bytes.Cut(line, []byte(" "))
	if !found {
		return c, false
	}
	t, err := time.Parse(time.RFC3339Nano, string(ts))
	if err != nil {
		return c, false
	}
	stream, rest, found := bytes.Cut(rest, []byte(" "))
	if !found || (string(stream) != "stdout" && string(stream) != "stderr") {
		return c, false
	}
	tags, msg, found := bytes.Cut(rest, []byte(" "))
	if !found {
		// "TIME STREAM F" with an empty message has no space after the tag.
		tags, msg = rest, nil
	}
	tag, _, _ := bytes.Cut(tags, []byte(":"))
	switch string(tag) {
	case "P":
		c.Partial = true
	case "F":
	default:
		return c, false
	}
	c.Time, c.Stream, c.Msg = t, string(stream), msg
	return c, true
}

// podLog is who wrote a container log file, from its path.
type podLog struct {
	Namespace, Pod, UID, Container string
}

// parsePodLogPath reads namespace, pod and container from a path
// ROOT/<namespace>_<pod>_<uid>/<container>/<n>.log, kubelet's layout under
// /var/log/pods. Namespace and pod names are DNS labels and subdomains, the uid a UUID:
// none holds "_", so the directory splits in exactly three. ok is false otherwise.
func parsePodLogPath(path string) (p podLog, ok bool) {
	file := filepath.Base(path)
	dir := filepath.Dir(path)
	container := filepath.Base(dir)
	pod := filepath.Base(filepath.Dir(dir))
	if !strings.HasSuffix(file, ".log") || container == "" || container == "." || container == "/" {
		return p, false
	}
	parts := strings.Split(pod, "_")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return p, false
	}
	return podLog{Namespace: parts[0], Pod: parts[1], UID: parts[2], Container: container}, true
}
