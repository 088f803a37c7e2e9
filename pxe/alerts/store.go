package alerts

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/gpurack/gpurack/internal/atomicfile"
)

// DefaultLimit is how many alerts a Store keeps; past it, the oldest go (Dropped).
const DefaultLimit = 10000

// StaleAfter is how long a Store keeps a firing alert Alertmanager has not sent again:
// three times the shipped receiver's repeat_interval (4 h), since Alertmanager sends
// every firing alert of a group again at least that often. It forgets alerts whose
// resolution it missed (gpuboot was down past Alertmanager's retries) or that a
// silence or an inhibition now holds back (Alertmanager sends no resolution for them).
const StaleAfter = 12 * time.Hour

// What a kept alert holds at most, so that the limit bounds memory and the state file
// too (an alert that says more is cut; its fingerprint still identifies it):
// labelsMax labels and the annotations in keptAnnotations, each name up to nameMax
// bytes, each label value up to labelValueMax and each annotation up to annotationMax.
const (
	labelsMax     = 32
	nameMax       = 64
	labelValueMax = 256
	annotationMax = 1024
)

// keptAnnotations are the annotations the rack report shows; others are not kept.
var keptAnnotations = []string{"summary", "description", "runbook_url"}

// Change is what one notification did to the kept alerts.
type Change struct {
	// Firing alerts added or updated, Resolved ones removed, Expired ones ignored or
	// removed because their endsAt had passed, Dropped ones removed to stay within the
	// limit (the oldest by startsAt), Stale ones forgotten because Alertmanager had not
	// sent them for StaleAfter.
	Firing, Resolved, Expired, Dropped, Stale int
	// Active is how many alerts are kept after it.
	Active int
}

// apply is the one step of the store, pure: active (by fingerprint) after n at now,
// holding at most limit alerts. It reports whether active changed.
func apply(active map[string]Alert, n *Notification, now time.Time, limit int) (Change, bool) {
	var c Change
	changed := false
	for _, a := range n.Alerts {
		old, had := active[a.Fingerprint]
		switch {
		case a.Status == StatusResolved:
			c.Resolved++
			if had {
				delete(active, a.Fingerprint)
				changed = true
			}
		case expired(a, now):
			c.Expired++
			if had {
				delete(active, a.Fingerprint)
				changed = true
			}
		default:
			c.Firing++
			a = trim(a)
			if !had || !same(old, a) {
				active[a.Fingerprint] = a
				changed = true
			}
		}
	}
	c.Dropped = dropOldest(active, limit)
	c.Active = len(active)
	return c, changed || c.Dropped > 0
}

// expired reports whether a's endsAt is set and has passed at now.
func expired(a Alert, now time.Time) bool { return !a.EndsAt.IsZero() && !a.EndsAt.After(now) }

// dropOldest removes the alerts that started earliest (then by fingerprint) until at
// most limit remain, and returns how many it removed.
func dropOldest(active map[string]Alert, limit int) int {
	over := len(active) - limit
	if over <= 0 {
		return 0
	}
	all := make([]Alert, 0, len(active))
	for _, a := range active {
		all = append(all, a)
	}
	sortAlerts(all)
	for _, a := range all[:over] {
		delete(active, a.Fingerprint)
	}
	return over
}

// sortAlerts orders by startsAt, then fingerprint.
func sortAlerts(as []Alert) {
	sort.Slice(as, func(i, j int) bool {
		if !as[i].StartsAt.Equal(as[j].StartsAt) {
			return as[i].StartsAt.Before(as[j].StartsAt)
		}
		return as[i].Fingerprint < as[j].Fingerprint
	})
}

// same reports whether a and b say the same (a repeated notification changes nothing).
func same(a, b Alert) bool {
	return a.Status == b.Status && a.StartsAt.Equal(b.StartsAt) && a.EndsAt.Equal(b.EndsAt) &&
		maps.Equal(a.Labels, b.Labels) && maps.Equal(a.Annotations, b.Annotations)
}

// trim cuts a to what a kept alert holds at most (the limits above).
func trim(a Alert) Alert {
	labels := map[string]string{"alertname": truncate(a.Name(), labelValueMax)}
	names := make([]string, 0, len(a.Labels))
	for k := range a.Labels {
		if k != "alertname" && len(k) <= nameMax {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	for _, k := range names[:min(len(names), labelsMax-1)] {
		labels[k] = truncate(a.Labels[k], labelValueMax)
	}
	a.Labels = labels
	var ann map[string]string
	for _, k := range keptAnnotations {
		if v, ok := a.Annotations[k]; ok {
			if ann == nil {
				ann = map[string]string{}
			}
			ann[k] = truncate(v, annotationMax)
		}
	}
	a.Annotations = ann
	return a
}

// Store keeps the active alerts in memory and in its file, which it replaces whole
// (atomicfile) after every notification that changed them. It is safe for
// concurrent use.
type Store struct {
	path  string
	limit int
	log   *slog.Logger

	mu     sync.Mutex
	active map[string]Alert
	// seen is when each kept alert last came in a notification (or when the file
	// was read); it is not written to the file.
	seen    map[string]time.Time
	dropped uint64
	// unsaved: the last write failed, so the next notification writes even if it
	// changes nothing.
	unsaved bool
}

// stateFile is the file's content.
type stateFile struct {
	// Version is 1.
	Version int     `json:"version"`
	Alerts  []Alert `json:"alerts"`
}

// Open returns a Store kept in path (gpuboot's STATEDIR/alerts.json), holding at most
// limit alerts (DefaultLimit when limit <= 0), with the alerts path holds. A missing
// file is an empty store. A file that cannot be read or parsed is reported on log and
// ignored: the store starts empty and the next notification replaces the file, since
// Alertmanager sends every firing alert again within its repeat_interval.
func Open(path string, limit int, log *slog.Logger) *Store { return open(path, limit, log, time.Now()) }

// open is Open at now: the kept alerts count as seen then.
func open(path string, limit int, log *slog.Logger, now time.Time) *Store {
	if limit <= 0 {
		limit = DefaultLimit
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Store{path: path, limit: limit, log: log, active: map[string]Alert{}, seen: map[string]time.Time{}}
	kept, err := load(path)
	if err != nil {
		log.Warn("alerts: ignoring the kept alerts; the rack reports show none until Alertmanager sends them again (its repeat_interval)", "file", path, "err", err)
		return s
	}
	for _, a := range kept {
		s.active[a.Fingerprint] = trim(a)
		s.seen[a.Fingerprint] = now
	}
	if n := dropOldest(s.active, limit); n > 0 {
		s.dropped += uint64(n)
	}
	return s
}

// load reads path's alerts; none when it does not exist.
func load(path string) ([]Alert, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var f stateFile
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("corrupt: %w", err)
	}
	if f.Version != 1 {
		return nil, fmt.Errorf("version %d: this gpuboot reads version 1", f.Version)
	}
	for i, a := range f.Alerts {
		if err := checkAlert(a); err != nil {
			return nil, fmt.Errorf("corrupt: alerts[%d]: %w", i, err)
		}
	}
	return f.Alerts, nil
}

// Receive applies a parsed notification at now and writes the file when the alerts
// changed. An error is the file's: the alerts in memory are updated all the same,
// and Alertmanager, told of the failure, sends the notification again.
func (s *Store) Receive(n *Notification, now time.Time) (Change, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, changed := apply(s.active, n, now, s.limit)
	for _, a := range n.Alerts {
		if _, ok := s.active[a.Fingerprint]; ok {
			s.seen[a.Fingerprint] = now
		}
	}
	if c.Stale = s.forgetStale(now); c.Stale > 0 {
		changed = true
		c.Active = len(s.active)
	}
	s.dropped += uint64(c.Dropped)
	if c.Dropped > 0 {
		s.log.Warn("alerts: over the limit, the oldest dropped", "limit", s.limit, "dropped", c.Dropped, "dropped_total", s.dropped)
	}
	if !changed && !s.unsaved {
		return c, nil
	}
	err := s.save()
	s.unsaved = err != nil
	return c, err
}

// forgetStale removes the alerts not seen for StaleAfter at now, and the times of
// alerts no longer kept; it returns how many alerts it removed. s.mu is held.
func (s *Store) forgetStale(now time.Time) int {
	n := 0
	for fp, at := range s.seen {
		_, kept := s.active[fp]
		if kept && stale(at, now) {
			delete(s.active, fp)
			n++
		}
		if !kept || stale(at, now) {
			delete(s.seen, fp)
		}
	}
	return n
}

func stale(seen, now time.Time) bool { return now.Sub(seen) > StaleAfter }

// save writes the file; s.mu is held.
func (s *Store) save() error {
	f := stateFile{Version: 1, Alerts: make([]Alert, 0, len(s.active))}
	for _, a := range s.active {
		f.Alerts = append(f.Alerts, a)
	}
	sortAlerts(f.Alerts)
	data, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("alerts: %w", err)
	}
	if err := atomicfile.Write(s.path, data, 0o600); err != nil {
		return fmt.Errorf("alerts: keep the active alerts: %w", err)
	}
	return nil
}

// Active returns the alerts firing at now, oldest first: those whose endsAt has
// passed, or that Alertmanager has not sent for StaleAfter, are left out (and
// forgotten at the next notification).
func (s *Store) Active(now time.Time) []Alert {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Alert, 0, len(s.active))
	for fp, a := range s.active {
		if !expired(a, now) && !stale(s.seen[fp], now) {
			out = append(out, a)
		}
	}
	sortAlerts(out)
	return out
}

// Dropped is how many alerts were dropped to stay within the limit since Open.
func (s *Store) Dropped() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dropped
}

// Len is how many alerts are kept (expired ones not yet forgotten included).
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.active)
}
