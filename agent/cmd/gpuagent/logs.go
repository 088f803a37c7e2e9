package main

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/gpurack/gpurack/agent/logship"
	"github.com/gpurack/gpurack/agent/node"
)

// logFlags configure log shipping (agent/logship); where to ship comes in the
// JoinBundle (logs_endpoint).
type logFlags struct {
	podsDir, journalctl, stateFile  string
	maxLine, queueLines, queueBytes int
}

func registerLogFlags(fs *pflag.FlagSet, l *logFlags) {
	fs.StringVar(&l.podsDir, "logs-pods-dir", "/var/log/pods", "kubelet's pod log directory, whose container logs are shipped to the JoinBundle's logs endpoint; off: none shipped")
	fs.StringVar(&l.journalctl, "logs-journalctl", "journalctl", "journalctl program whose --output=json of this boot is shipped to the JoinBundle's logs endpoint; off: the journal is not shipped")
	fs.StringVar(&l.stateFile, "logs-state", node.DefaultLogStateFile, "where the journal cursor and container-log offsets the log store took are kept (under /run: an agent restart resumes, a reboot starts afresh)")
	fs.IntVar(&l.maxLine, "logs-max-line", logship.DefaultMaxLine, "longest log line shipped, in bytes; a longer one is cut and marked truncated=true")
	fs.IntVar(&l.queueLines, "logs-queue-lines", logship.DefaultQueueLines, "most log lines waiting to be shipped; past it new lines are dropped and counted (gpurack_logs_dropped_lines_total{reason=\"queue_full\"})")
	fs.IntVar(&l.queueBytes, "logs-queue-bytes", logship.DefaultQueueBytes, "most bytes of log lines waiting to be shipped; past it new lines are dropped and counted")
}

// config checks the flags: the bounds must hold at least one line of the longest kind.
func (l *logFlags) config() (node.LogShipping, error) {
	switch {
	case l.maxLine < 1024:
		return node.LogShipping{}, fmt.Errorf("--logs-max-line %d: give at least 1024 bytes (default %d)", l.maxLine, logship.DefaultMaxLine)
	case l.queueLines < 1:
		return node.LogShipping{}, fmt.Errorf("--logs-queue-lines %d: give at least 1 (default %d)", l.queueLines, logship.DefaultQueueLines)
	case l.queueBytes < 2*l.maxLine:
		return node.LogShipping{}, fmt.Errorf("--logs-queue-bytes %d: give at least twice --logs-max-line (%d), so that a long line fits (default %d)", l.queueBytes, 2*l.maxLine, logship.DefaultQueueBytes)
	}
	return node.LogShipping{PodsDir: l.podsDir, Journalctl: l.journalctl, StateFile: l.stateFile,
		MaxLine: l.maxLine, QueueLines: l.queueLines, QueueBytes: l.queueBytes}, nil
}
