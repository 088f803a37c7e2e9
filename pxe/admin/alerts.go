package admin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"time"

	"github.com/gpurack/gpurack/pxe/alerts"
)

// AlertStore keeps the alerts Alertmanager reports, for the rack report; a
// pxe/alerts.Store implements it.
type AlertStore interface {
	// Receive applies a parsed notification at now; an error means it was not kept
	// durably (Alertmanager should send it again).
	Receive(n *alerts.Notification, now time.Time) (alerts.Change, error)
	// Active returns the alerts firing at now.
	Active(now time.Time) []alerts.Alert
}

// alertsReply is the answer to a notification: what it did (Alertmanager ignores it;
// it is for a person trying the route with curl).
type alertsReply struct {
	Firing   int `json:"firing"`
	Resolved int `json:"resolved"`
	Expired  int `json:"expired"`
	Dropped  int `json:"dropped"`
	Active   int `json:"active"`
}

// apiAlerts is POST /api/v1/alerts: Alertmanager's webhook (docs/monitoring.md,
// "Alert routing"), for the alert-sender level only. The body is bounded (413 over
// alerts.MaxBody); a body that is not a version 4 notification is refused with 400 and
// what is wrong, which Alertmanager logs; a notification that could not be kept
// durably is answered 500, so Alertmanager sends it again.
func (s *Server) apiAlerts(w http.ResponseWriter, r *http.Request) {
	if s.alerts == nil {
		http.Error(w, "this gpuboot keeps no alerts", http.StatusNotImplemented)
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			http.Error(w, fmt.Sprintf("Content-Type %q: send Alertmanager's webhook JSON as application/json", ct), http.StatusUnsupportedMediaType)
			return
		}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, alerts.MaxBody))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		http.Error(w, alerts.ErrTooLarge.Error(), http.StatusRequestEntityTooLarge)
		return
	case err != nil:
		http.Error(w, "read the alert notification: "+err.Error(), http.StatusBadRequest)
		return
	}
	n, err := alerts.Parse(body)
	if err != nil {
		http.Error(w, "alert notification: "+err.Error(), http.StatusBadRequest)
		return
	}
	c, err := s.alerts.Receive(n, s.now())
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(alertsReply{Firing: c.Firing, Resolved: c.Resolved, Expired: c.Expired, Dropped: c.Dropped, Active: c.Active})
}
