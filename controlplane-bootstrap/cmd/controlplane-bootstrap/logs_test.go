package main

import (
	"strings"
	"testing"
	"time"
)

// TestLogsTimeRange: --since in Go durations or days, --from/--until in RFC 3339, and
// each mistake refused naming its flag.
func TestLogsTimeRange(t *testing.T) {
	now := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		lf          logsFlags
		start, end  time.Time
		wantErrPart string
	}{
		{logsFlags{}, now.Add(-time.Hour), now, ""},
		{logsFlags{since: "30m"}, now.Add(-30 * time.Minute), now, ""},
		{logsFlags{since: "7d"}, now.Add(-7 * 24 * time.Hour), now, ""},
		{logsFlags{from: "2026-12-04T08:00:00Z", until: "2026-12-04T09:00:00Z"}, now.Add(-4 * time.Hour), now.Add(-3 * time.Hour), ""},
		{logsFlags{since: "-1h"}, time.Time{}, time.Time{}, "--since"},
		{logsFlags{since: "0d"}, time.Time{}, time.Time{}, "--since"},
		{logsFlags{since: "1h", from: "2026-12-04T08:00:00Z"}, time.Time{}, time.Time{}, "not both"},
		{logsFlags{from: "yesterday"}, time.Time{}, time.Time{}, "--from"},
		{logsFlags{until: "2026-12-04"}, time.Time{}, time.Time{}, "--until"},
		{logsFlags{from: "2026-12-04T10:00:00Z", until: "2026-12-04T09:00:00Z"}, time.Time{}, time.Time{}, "not before"},
	} {
		start, end, err := tc.lf.timeRange(now)
		if tc.wantErrPart != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErrPart) {
				t.Errorf("%+v: %v, want an error with %q", tc.lf, err, tc.wantErrPart)
			}
			continue
		}
		if err != nil || !start.Equal(tc.start) || !end.Equal(tc.end) {
			t.Errorf("%+v: %s to %s (%v), want %s to %s", tc.lf, start, end, err, tc.start, tc.end)
		}
	}
}
