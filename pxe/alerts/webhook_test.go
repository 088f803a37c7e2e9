package alerts

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// sample is a notification as Alertmanager 0.35 sends it (fields gpuboot ignores too).
const sample = `{"receiver":"gpuboot","status":"firing","alerts":[{"status":"firing",
"labels":{"Hostname":"gpu-0001","alertname":"GpurackXIDFatal","gpu_index":"3","severity":"critical"},
"annotations":{"summary":"Fatal XID on gpu-0001 GPU 3","runbook_url":"https://docs.example/operations.md#xid"},
"startsAt":"2026-12-04T19:05:21.358767769Z","endsAt":"0001-01-01T00:00:00Z","generatorURL":"","fingerprint":"1cee2732d28febcb"}],
"notification_reason":"first notification","groupLabels":{"alertname":"GpurackXIDFatal"},"commonLabels":{},"commonAnnotations":{},
"routeLabels":{},"externalURL":"http://am:9093","version":"4","groupKey":"{}:{}","truncatedAlerts":0}`

func TestParse(t *testing.T) {
	n, err := Parse([]byte(sample))
	if err != nil {
		t.Fatal(err)
	}
	if n.Receiver != "gpuboot" || n.Status != StatusFiring || len(n.Alerts) != 1 {
		t.Fatalf("Parse = %+v", n)
	}
	a := n.Alerts[0]
	if a.Name() != "GpurackXIDFatal" || a.Fingerprint != "1cee2732d28febcb" || a.Labels["Hostname"] != "gpu-0001" ||
		a.Annotations["runbook_url"] == "" || !a.EndsAt.IsZero() || a.StartsAt.Year() != 2026 {
		t.Errorf("alert = %+v", a)
	}
}

// TestParseRefuses: each bad body gets an error that names what is wrong.
func TestParseRefuses(t *testing.T) {
	ok := func(alert string) string {
		return `{"version":"4","status":"firing","receiver":"gpuboot","alerts":[` + alert + `]}`
	}
	const good = `{"status":"firing","labels":{"alertname":"A"},"fingerprint":"f","startsAt":"2026-01-01T00:00:00Z"}`
	for _, tt := range []struct{ name, body, want string }{
		{"empty", "  ", "empty body"},
		{"not JSON", "hello", "not JSON at byte 1"},
		{"truncated", `{"version":"4","alerts":[`, "truncated JSON"},
		{"two values", ok(good) + ok(good), "more than one JSON value"},
		{"wrong type", `{"version":4}`, `field "version"`},
		{"version 3", `{"version":"3","status":"firing"}`, `webhook version "3"`},
		{"no version", `{"status":"firing"}`, `webhook version ""`},
		{"bad status", `{"version":"4","status":"burning"}`, `notification status "burning"`},
		{"alert status", ok(`{"status":"x","labels":{"alertname":"A"},"fingerprint":"f"}`), `alerts[0]: status "x"`},
		{"no fingerprint", ok(`{"status":"firing","labels":{"alertname":"A"}}`), "alerts[0]: no fingerprint"},
		{"long fingerprint", ok(`{"status":"firing","labels":{"alertname":"A"},"fingerprint":"` + strings.Repeat("f", 65) + `"}`), "fingerprint"},
		{"no alertname", ok(`{"status":"firing","labels":{"a":"b"},"fingerprint":"f"}`), "no alertname label"},
		{"bad time", ok(`{"status":"firing","labels":{"alertname":"A"},"fingerprint":"f","startsAt":"yesterday"}`), "yesterday"},
		{"second alert", ok(good + `,{"status":"firing","labels":{}}`), "alerts[1]: no fingerprint"},
	} {
		_, err := Parse([]byte(tt.body))
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Parse = %v, want an error containing %q", tt.name, err, tt.want)
		}
	}
	if _, err := Parse(make([]byte, MaxBody+1)); !errors.Is(err, ErrTooLarge) {
		t.Errorf("a body over 1 MiB: %v, want ErrTooLarge", err)
	}
}

// FuzzParse: whatever the body, Parse returns a notification it checked or an error,
// never panics; what it accepts, the store takes without panicking.
func FuzzParse(f *testing.F) {
	f.Add([]byte(sample))
	f.Add([]byte(`{"version":"4","status":"resolved","alerts":[{"status":"resolved","labels":{"alertname":"A"},"fingerprint":"f"}]}`))
	f.Add([]byte(`{"version":"4","status":"firing","alerts":[{"status":"firing","labels":{"alertname":"A"},"fingerprint":"f","endsAt":"2000-01-01T00:00:00Z"}]}`))
	f.Add([]byte(`{"version":"4"`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := Parse(data)
		if err != nil {
			if n != nil || err.Error() == "" {
				t.Fatalf("Parse returned %v with error %q", n, err)
			}
			return
		}
		if n.Version != WebhookVersion {
			t.Fatalf("accepted version %q", n.Version)
		}
		active := map[string]Alert{}
		c, _ := apply(active, n, time.Unix(1e9, 0), 2)
		if len(active) > 2 || c.Active != len(active) {
			t.Fatalf("apply kept %d alerts (limit 2), reported %d", len(active), c.Active)
		}
		for fp, a := range active {
			if fp != a.Fingerprint || a.Name() == "" || len(a.Labels) > labelsMax {
				t.Fatalf("kept %q as %+v", fp, a)
			}
		}
	})
}
