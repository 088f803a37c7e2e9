package redfishtest

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"
)

// reset is POST #ComputerSystem.Reset: {"ResetType": ...}, checked against the
// allowed types, then the power change scheduled and answered 204, or 202 with a Task.
func (s *Server) reset(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	var body struct{ ResetType string }
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "Base.1.18.MalformedJSON", "The request body submitted was malformed JSON.")
		return
	}
	s.mu.Lock()
	sys, ok := s.systems[id]
	switch {
	case !ok || s.cfg.NoResetAction:
		s.mu.Unlock()
		writeError(w, http.StatusNotFound, "Base.1.18.ResourceMissingAtURI", "The resource at the URI "+r.URL.Path+" was not found.")
		return
	case body.ResetType == "":
		s.mu.Unlock()
		writeError(w, http.StatusBadRequest, "Base.1.18.ActionParameterMissing", "The action ComputerSystem.Reset requires the parameter ResetType to be present in the request body.")
		return
	case !slices.Contains(s.cfg.AllowedResetTypes, body.ResetType):
		s.mu.Unlock()
		writeError(w, http.StatusBadRequest, "Base.1.18.ActionParameterNotSupported",
			"The parameter ResetType for the action ComputerSystem.Reset is not supported on the target resource: allowed are "+strings.Join(s.cfg.AllowedResetTypes, ", ")+".")
		return
	}
	now := time.Now()
	if !s.cfg.PowerStuck {
		sys.apply(body.ResetType, now, s.cfg.PowerDelay)
	}
	s.resets = append(s.resets, body.ResetType)
	var t *task
	if s.cfg.AsyncTask {
		t = &task{id: s.newID(), created: now}
		s.tasks[t.id] = t
	}
	s.mu.Unlock()
	if s.cfg.OnReset != nil {
		s.cfg.OnReset(body.ResetType)
	}
	if t == nil {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	location := tasksPath + "/" + t.id
	if s.cfg.TaskMonitorLocation {
		location = monitorsPath + "/" + t.id
	}
	w.Header().Set("Location", location)
	writeJSON(w, http.StatusAccepted, s.taskBody(t, now))
}

// apply moves the system as resetType does (Redfish Resource.ResetType): on, off, or
// through off back to on for the restart and cycle types, taking delay.
func (sys *system) apply(resetType string, now time.Time, delay time.Duration) {
	state := sys.current(now)
	var target string
	switch resetType {
	case "On", "ForceOn":
		target = "On"
	case "ForceOff", "GracefulShutdown":
		target = "Off"
	case "PushPowerButton":
		target = "On"
		if state == "On" || state == "PoweringOn" {
			target = "Off"
		}
	case "PowerCycle", "ForceRestart", "GracefulRestart", "FullPowerCycle":
		sys.state, target = "Off", "On"
	default:
		return
	}
	if delay <= 0 {
		sys.state, sys.pending = target, ""
		return
	}
	sys.pending, sys.at = target, now.Add(delay)
}

func (s *Server) taskService(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"@odata.type":    "#TaskService.v1_2_0.TaskService",
		"@odata.id":      root + "/TaskService",
		"Id":             "TaskService",
		"Name":           "Task Service",
		"ServiceEnabled": true,
		"Tasks":          link(tasksPath),
	})
}

// taskGet is the Task resource: 200 with its TaskState, Running until TaskDelay has
// passed, then Completed or Exception.
func (s *Server) taskGet(w http.ResponseWriter, r *http.Request) {
	t, ok := s.task(r.PathValue("id"))
	if !ok {
		writeError(w, http.StatusNotFound, "Base.1.18.ResourceNotFound", "The requested task was not found.")
		return
	}
	writeJSON(w, http.StatusOK, s.taskBody(t, time.Now()))
}

// taskMonitor is the task monitor (DSP0266 "Asynchronous operations"): 202 with the
// Task while it runs, then the action's own response.
func (s *Server) taskMonitor(w http.ResponseWriter, r *http.Request) {
	t, ok := s.task(r.PathValue("id"))
	if !ok {
		writeError(w, http.StatusNotFound, "Base.1.18.ResourceNotFound", "The requested task monitor was not found.")
		return
	}
	now := time.Now()
	switch {
	case !s.taskDone(t, now):
		w.Header().Set("Location", monitorsPath+"/"+t.id)
		writeJSON(w, http.StatusAccepted, s.taskBody(t, now))
	case s.cfg.TaskFails:
		writeError(w, http.StatusBadRequest, "Base.1.18.InternalError", "The request failed due to an internal service error: the host did not respond to the power request.")
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

func (s *Server) task(id string) (*task, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tasks[id]
	return t, ok
}

func (s *Server) taskDone(t *task, now time.Time) bool {
	return !now.Before(t.created.Add(s.cfg.TaskDelay))
}

// taskBody is the Task resource at now, as DMTF's mockups show one.
func (s *Server) taskBody(t *task, now time.Time) map[string]any {
	state, status, percent := "Running", "OK", 50
	messages := []map[string]any{}
	if s.taskDone(t, now) {
		state, percent = "Completed", 100
		messages = append(messages, map[string]any{"MessageId": "TaskEvent.1.0.TaskCompletedOK", "Message": "The task with Id '" + t.id + "' has completed.", "Severity": "OK"})
		if s.cfg.TaskFails {
			state, status = "Exception", "Critical"
			messages = []map[string]any{{"MessageId": "TaskEvent.1.0.TaskAborted", "Message": "The task with Id '" + t.id + "' has been aborted: the host did not respond to the power request.", "Severity": "Critical"}}
		}
	}
	return map[string]any{
		"@odata.type":     "#Task.v1_7_0.Task",
		"@odata.id":       tasksPath + "/" + t.id,
		"Id":              t.id,
		"Name":            "Task " + t.id,
		"TaskState":       state,
		"TaskStatus":      status,
		"PercentComplete": percent,
		"StartTime":       t.created.UTC().Format(time.RFC3339),
		"TaskMonitor":     monitorsPath + "/" + t.id,
		"Messages":        messages,
	}
}
