// Package logquery turns the `controlplane-bootstrap logs` flags into LogsQL for the
// log store (VictoriaLogs, docs/monitoring.md "Logs"), and its answers into lines to
// print. Building and parsing are pure; Client does the one HTTP request.
//
// Every value from a flag is validated against what the field can hold (a node name,
// a unit name, 32 hex digits) and then quoted as a LogsQL string, so a flag cannot
// change the query's structure; only --query is LogsQL, and it is ANDed, in
// parentheses, to the flags' filters.
package logquery

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Filter is what the flags select; an empty field selects any value.
type Filter struct {
	Node, Unit, Namespace, Pod, Container string
	// Identifier is a journal line's SYSLOG_IDENTIFIER (journalctl -t), which names who
	// wrote lines whose unit is a pod's scope (logger in a container, kubectl debug).
	Identifier string
	// Boot is a boot_id: 32 hex digits, with or without the dashes of
	// /proc/sys/kernel/random/boot_id.
	Boot string
	// Source is journal or container.
	Source string
	// Extra is LogsQL ANDed to the rest (--query).
	Extra string
}

var (
	dnsSubdomain = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
	dnsLabel     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	// unitName is a systemd unit name or a syslog identifier as the agent stores it.
	unitName = regexp.MustCompile(`^[A-Za-z0-9:_.@\\-]+$`)
	hexBoot  = regexp.MustCompile(`^[0-9a-f]{32}$`)
)

// Validate checks every field and normalises Boot (lower case, no dashes). The error
// names the flag.
func (f *Filter) Validate() error {
	var errs []error
	check := func(flag, v string, re *regexp.Regexp, max int, what string) {
		if v != "" && (len(v) > max || !re.MatchString(v)) {
			errs = append(errs, fmt.Errorf("--%s %q is not %s", flag, v, what))
		}
	}
	check("node", f.Node, dnsSubdomain, 253, "a node name (a DNS subdomain: lowercase letters, digits, '-' and '.')")
	check("unit", f.Unit, unitName, 256, "a unit name or syslog identifier (letters, digits and :_.@\\-), such as kubelet.service")
	check("identifier", f.Identifier, unitName, 256, "a syslog identifier (letters, digits and :_.@\\-), such as gpurack-break-glass")
	check("namespace", f.Namespace, dnsLabel, 63, "a namespace (a DNS label)")
	check("pod", f.Pod, dnsSubdomain, 253, "a pod name (a DNS subdomain)")
	check("container", f.Container, dnsLabel, 63, "a container name (a DNS label)")
	if f.Boot != "" {
		b := strings.ToLower(strings.ReplaceAll(f.Boot, "-", ""))
		if !hexBoot.MatchString(b) {
			errs = append(errs, fmt.Errorf("--boot %q is not a boot ID: 32 hex digits (see --boots for a node's)", f.Boot))
		}
		f.Boot = b
	}
	if f.Source != "" && f.Source != "journal" && f.Source != "container" {
		errs = append(errs, fmt.Errorf("--source %q: write journal or container", f.Source))
	}
	if len(f.Extra) > 4096 {
		errs = append(errs, fmt.Errorf("--query is %d bytes, over 4096", len(f.Extra)))
	}
	return errors.Join(errs...)
}

// Quote is v as a LogsQL string literal: VictoriaLogs reads a double-quoted token with
// strconv.Unquote (lib/logstorage's lexer).
func Quote(v string) string { return strconv.Quote(v) }

// LogsQL is the filter part of the query: an exact match per set field, ANDed, and
// Extra in parentheses; `*` when nothing is set.
func (f Filter) LogsQL() string {
	var parts []string
	for _, fv := range []struct{ field, v string }{
		{"node", f.Node}, {"source", f.Source}, {"unit", f.Unit}, {"identifier", f.Identifier}, {"namespace", f.Namespace},
		{"pod", f.Pod}, {"container", f.Container}, {"boot_id", f.Boot},
	} {
		if fv.v != "" {
			parts = append(parts, fv.field+":="+Quote(fv.v))
		}
	}
	if strings.TrimSpace(f.Extra) != "" {
		parts = append(parts, "("+f.Extra+")")
	}
	if len(parts) == 0 {
		return "*"
	}
	return strings.Join(parts, " AND ")
}

// BootsQuery lists the boots among f's lines: per node and boot_id, the first and last
// line's time and the number of lines, oldest boot first.
func BootsQuery(f Filter) string {
	return f.LogsQL() + " | stats by (node, boot_id) min(_time) as first, max(_time) as last, count() as lines | sort by (first)"
}
