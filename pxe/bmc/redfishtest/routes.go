package redfishtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"time"
)

const (
	root         = "/redfish/v1"
	sessionsPath = root + "/SessionService/Sessions"
	systemsPath  = root + "/Systems"
	tasksPath    = root + "/TaskService/Tasks"
	monitorsPath = root + "/TaskService/TaskMonitors"
)

// routes is the service's URI tree (DSP0266 "Resource URI patterns").
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /redfish", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"v1": root + "/"})
	})
	mux.HandleFunc("GET /redfish/v1", s.serviceRoot)
	mux.HandleFunc("GET /redfish/v1/{$}", s.serviceRoot)
	mux.HandleFunc("POST "+sessionsPath, s.login)
	mux.HandleFunc("GET "+root+"/SessionService", s.authed(s.sessionService))
	mux.HandleFunc("GET "+sessionsPath, s.authed(s.sessionList))
	mux.HandleFunc("GET "+sessionsPath+"/{id}", s.authed(s.sessionGet))
	mux.HandleFunc("DELETE "+sessionsPath+"/{id}", s.authed(s.logout))
	mux.HandleFunc("GET "+systemsPath, s.authed(s.systemList))
	mux.HandleFunc("GET "+systemsPath+"/{id}", s.authed(s.systemGet))
	mux.HandleFunc("POST "+systemsPath+"/{id}/Actions/ComputerSystem.Reset", s.authed(s.reset))
	mux.HandleFunc("GET "+root+"/TaskService", s.authed(s.taskService))
	mux.HandleFunc("GET "+tasksPath+"/{id}", s.authed(s.taskGet))
	mux.HandleFunc("GET "+monitorsPath+"/{id}", s.authed(s.taskMonitor))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "Base.1.18.ResourceMissingAtURI", fmt.Sprintf("The resource at the URI %s was not found.", r.URL.Path))
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.requested = append(s.requested, r.Method+" "+r.URL.Path)
		s.mu.Unlock()
		w.Header().Set("OData-Version", "4.0")
		mux.ServeHTTP(w, r)
	})
}

// authed admits a request with a live X-Auth-Token or the account's basic-auth
// credentials (DSP0266 "Authentication"), and answers others 401.
func (s *Server) authed(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		_, tokenOK := s.sessions[r.Header.Get("X-Auth-Token")]
		user, pass, basic := r.BasicAuth()
		ok := tokenOK || (basic && user == s.cfg.Username && pass == s.cfg.Password)
		if !ok {
			s.refusals++
		}
		s.mu.Unlock()
		if !ok {
			w.Header().Set("WWW-Authenticate", `Basic realm="redfishtest"`)
			writeError(w, http.StatusUnauthorized, "Base.1.18.NoValidSession", "There is no valid session established with the implementation.")
			return
		}
		next(w, r)
	}
}

func (s *Server) serviceRoot(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"@odata.type":    "#ServiceRoot.v1_15_0.ServiceRoot",
		"@odata.id":      root + "/",
		"Id":             "RootService",
		"Name":           "Root Service",
		"RedfishVersion": "1.17.0",
		"UUID":           "92384634-2938-2342-8820-489239905423",
		"Vendor":         "gpurack",
		"Product":        "redfishtest",
		"Systems":        link(systemsPath),
		"SessionService": link(root + "/SessionService"),
		"Tasks":          link(root + "/TaskService"),
		"Links":          map[string]any{"Sessions": link(sessionsPath)},
	})
}

func (s *Server) sessionService(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"@odata.type":    "#SessionService.v1_1_8.SessionService",
		"@odata.id":      root + "/SessionService",
		"Id":             "SessionService",
		"Name":           "Session Service",
		"ServiceEnabled": true,
		"SessionTimeout": 1800,
		"Sessions":       link(sessionsPath),
	})
}

// login creates a session from {"UserName", "Password"}: 201 with X-Auth-Token and
// the session's Location, or 401.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	var creds struct{ UserName, Password string }
	if err := json.NewDecoder(r.Body).Decode(&creds); err != nil {
		writeError(w, http.StatusBadRequest, "Base.1.18.MalformedJSON", "The request body submitted was malformed JSON.")
		return
	}
	s.mu.Lock()
	if creds.UserName != s.cfg.Username || creds.Password != s.cfg.Password {
		s.refusals++
		s.mu.Unlock()
		writeError(w, http.StatusUnauthorized, "Base.1.18.ResourceAtUriUnauthorized", "While accessing the resource at "+sessionsPath+", the service received an authorization error: invalid user name or password.")
		return
	}
	id, token := s.newID(), newToken()
	s.sessions[token] = id
	s.logins++
	s.mu.Unlock()
	w.Header().Set("X-Auth-Token", token)
	w.Header().Set("Location", sessionsPath+"/"+id)
	writeJSON(w, http.StatusCreated, s.sessionBody(id, creds.UserName))
}

func (s *Server) sessionBody(id, user string) map[string]any {
	return map[string]any{
		"@odata.type": "#Session.v1_7_0.Session",
		"@odata.id":   sessionsPath + "/" + id,
		"Id":          id,
		"Name":        "User Session",
		"UserName":    user,
	}
}

func (s *Server) sessionList(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	var ids []string
	for _, id := range s.sessions {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	slices.Sort(ids)
	writeJSON(w, http.StatusOK, collection("#SessionCollection.SessionCollection", sessionsPath, "Session Collection", ids))
}

func (s *Server) sessionGet(w http.ResponseWriter, r *http.Request) {
	if _, ok := s.sessionToken(r.PathValue("id")); !ok {
		writeError(w, http.StatusNotFound, "Base.1.18.ResourceNotFound", "The requested session was not found.")
		return
	}
	writeJSON(w, http.StatusOK, s.sessionBody(r.PathValue("id"), s.cfg.Username))
}

// logout deletes a session (DSP0266 "Session termination").
func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	token, ok := s.sessionToken(r.PathValue("id"))
	if !ok {
		writeError(w, http.StatusNotFound, "Base.1.18.ResourceNotFound", "The requested session was not found.")
		return
	}
	s.mu.Lock()
	delete(s.sessions, token)
	s.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// sessionToken finds the token of session id.
func (s *Server) sessionToken(id string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for token, sid := range s.sessions {
		if sid == id {
			return token, true
		}
	}
	return "", false
}

func (s *Server) systemList(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, collection("#ComputerSystemCollection.ComputerSystemCollection", systemsPath, "Computer System Collection", s.cfg.SystemIDs))
}

// systemGet is a ComputerSystem as DMTF's public-rackmount1 mockup shows one, cut
// to what power control reads.
func (s *Server) systemGet(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	s.mu.Lock()
	sys, ok := s.systems[id]
	var state string
	if ok {
		state = sys.current(time.Now())
	}
	s.mu.Unlock()
	if !ok {
		writeError(w, http.StatusNotFound, "Base.1.18.ResourceNotFound", "The requested system "+id+" was not found.")
		return
	}
	body := map[string]any{
		"@odata.type":  "#ComputerSystem.v1_20_0.ComputerSystem",
		"@odata.id":    systemsPath + "/" + id,
		"Id":           id,
		"Name":         "System " + id,
		"SystemType":   "Physical",
		"Manufacturer": "gpurack",
		"Model":        "redfishtest",
		"SerialNumber": "RFT-" + id,
		"PowerState":   state,
		"Status":       map[string]string{"State": "Enabled", "Health": "OK"},
		"Actions":      map[string]any{},
	}
	if !s.cfg.NoResetAction {
		body["Actions"] = map[string]any{"#ComputerSystem.Reset": map[string]any{
			"target":                            systemsPath + "/" + id + "/Actions/ComputerSystem.Reset",
			"ResetType@Redfish.AllowableValues": s.cfg.AllowedResetTypes,
		}}
	}
	writeJSON(w, http.StatusOK, body)
}

func link(uri string) map[string]string { return map[string]string{"@odata.id": uri} }

// collection is a Redfish resource collection of the members under base.
func collection(odataType, base, name string, ids []string) map[string]any {
	members := make([]map[string]string, len(ids))
	for i, id := range ids {
		members[i] = link(base + "/" + id)
	}
	return map[string]any{
		"@odata.type":         odataType,
		"@odata.id":           base,
		"Name":                name,
		"Members@odata.count": len(ids),
		"Members":             members,
	}
}

func writeJSON(w http.ResponseWriter, status int, body any) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(body)
}

// writeError is a Redfish error response (DSP0266 "Error responses").
func writeError(w http.ResponseWriter, status int, messageID, message string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{
		"code":    messageID,
		"message": message,
		"@Message.ExtendedInfo": []map[string]any{{
			"@odata.type": "#Message.v1_1_1.Message",
			"MessageId":   messageID,
			"Message":     message,
			"Severity":    "Critical",
		}},
	}})
}
