// Package alerts keeps the alerts Alertmanager reports to gpuboot, for the rack report:
// it parses Alertmanager's webhook notification (version 4), keeps the firing alerts by
// fingerprint, bounded in number, and persists them in gpuboot's state directory so a
// restart does not lose them until Alertmanager repeats its notifications.
//
// It is not an alerting system: it evaluates no rule, routes nothing and tells no one;
// Alertmanager does that (docs/monitoring.md, "Alert routing"). It does not know
// machines either: pxe/report places each alert on a machine by its labels.
package alerts

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
	"unicode/utf8"
)

// MaxBody is the largest notification gpuboot reads, in bytes (1 MiB). Alertmanager
// sends one group's alerts per notification; a larger group is refused with 413, and
// the receiver's max_alerts in alertmanager.yml bounds it.
const MaxBody = 1 << 20

// WebhookVersion is the version of Alertmanager's webhook payload this package reads
// (Alertmanager's notify/webhook.Message, "version": "4").
const WebhookVersion = "4"

// The two statuses of a notification and of an alert.
const (
	StatusFiring   = "firing"
	StatusResolved = "resolved"
)

// Notification is Alertmanager's webhook payload, the fields gpuboot reads. Alertmanager
// sends more (groupKey, groupLabels, commonLabels, externalURL, truncatedAlerts, …);
// they are ignored.
type Notification struct {
	Version  string  `json:"version"`
	Receiver string  `json:"receiver"`
	Status   string  `json:"status"`
	Alerts   []Alert `json:"alerts"`
}

// Alert is one alert of a notification: Alertmanager's template.Alert. EndsAt is zero
// ("0001-01-01T00:00:00Z") while an alert fires with no end known.
type Alert struct {
	Status      string            `json:"status"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations,omitempty"`
	StartsAt    time.Time         `json:"startsAt"`
	EndsAt      time.Time         `json:"endsAt"`
	Fingerprint string            `json:"fingerprint"`
}

// Name is the alert's alertname label.
func (a Alert) Name() string { return a.Labels["alertname"] }

// maxFingerprint bounds a fingerprint's length; Alertmanager's are 16 hex digits.
const maxFingerprint = 64

// ErrTooLarge is the error of a body over MaxBody (the HTTP handler answers 413).
var ErrTooLarge = fmt.Errorf("alert notification larger than %d bytes (1 MiB): lower max_alerts of gpuboot's receiver in alertmanager.yml", MaxBody)

// Parse reads a webhook notification. Every error names what is wrong, for the HTTP
// answer Alertmanager logs: bad JSON (with its offset), a version other than "4", a
// status other than firing or resolved, an alert without a fingerprint or an
// alertname. It never panics, whatever data holds (FuzzParse).
func Parse(data []byte) (*Notification, error) {
	if len(data) > MaxBody {
		return nil, ErrTooLarge
	}
	data = bytes.TrimSpace(data)
	if len(data) == 0 {
		return nil, errors.New("empty body: want Alertmanager's webhook JSON (version 4)")
	}
	var n Notification
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&n); err != nil {
		return nil, jsonError(err)
	}
	if dec.More() {
		return nil, errors.New("the body holds more than one JSON value: want one webhook notification")
	}
	if n.Version != WebhookVersion {
		return nil, fmt.Errorf("webhook version %q: gpuboot reads Alertmanager's webhook version %q (Alertmanager 0.x's webhook_configs)", n.Version, WebhookVersion)
	}
	if n.Status != StatusFiring && n.Status != StatusResolved {
		return nil, fmt.Errorf("notification status %q: want firing or resolved", n.Status)
	}
	for i, a := range n.Alerts {
		if err := checkAlert(a); err != nil {
			return nil, fmt.Errorf("alerts[%d]: %w", i, err)
		}
	}
	return &n, nil
}

// checkAlert checks what the store relies on: a status, a usable fingerprint, a name.
func checkAlert(a Alert) error {
	switch {
	case a.Status != StatusFiring && a.Status != StatusResolved:
		return fmt.Errorf("status %q: want firing or resolved", a.Status)
	case a.Fingerprint == "":
		return errors.New("no fingerprint")
	case len(a.Fingerprint) > maxFingerprint || !utf8.ValidString(a.Fingerprint) || strings.ContainsFunc(a.Fingerprint, isControl):
		return fmt.Errorf("fingerprint %q: want Alertmanager's (16 hex digits)", truncate(a.Fingerprint, maxFingerprint))
	case a.Name() == "":
		return fmt.Errorf("alert %s has no alertname label", a.Fingerprint)
	}
	return nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

// jsonError says where the JSON is wrong.
func jsonError(err error) error {
	var syntax *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syntax):
		return fmt.Errorf("not JSON at byte %d: %v", syntax.Offset, err)
	case errors.As(err, &typ):
		return fmt.Errorf("field %q at byte %d is a JSON %s, want %s", typ.Field, typ.Offset, typ.Value, typ.Type)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("truncated JSON: want one webhook notification")
	}
	return fmt.Errorf("not a webhook notification: %v", err)
}

// truncate shortens s to at most n bytes, on a rune boundary.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
