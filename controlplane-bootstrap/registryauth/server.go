// Package registryauth is the token issuer of the cluster's image registry: the
// Docker/distribution token protocol's authorization service
// (https://distribution.github.io/distribution/spec/auth/token/). The registry sends an
// unauthenticated client here (its realm, https://ADVERTISE:5001/token); the client
// asks with HTTP Basic credentials for a token for scopes such as
// repository:team-a/train:pull,push, and gets an ES256 JWT whose access claim grants
// what the policy (Decide) allows: a tenant's users act only under the tenant's
// prefix, T/.
//
// The credentials are the tenant users' (a registry password per `users add`
// credential, hashed in users/credentials.json, so `users revoke` ends it) and each
// tenant's pull credential (RobotsFile, put in the tenant's namespaces as an image
// pull Secret by ApplyPullSecrets). It reads both files on every request: they are
// small, and a revocation takes effect at once.
//
// It is not the registry (the registry server is the pinned distribution binary) and
// it does not make the signing certificate's trust: the registry's configuration
// names SigningCertFile as its rootcertbundle. See docs/contracts.md, "Image registry
// tokens", and decision 0698.
package registryauth

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gpurack/gpurack/controlplane-bootstrap/tenantusers"
)

// Handler serves /token and /healthz.
type Handler struct {
	// Service is the only service tokens are issued for (Service).
	Service string
	// UsersFile and RobotsFile are the stores, read on each request.
	UsersFile, RobotsFile string
	Minter                *Minter
	// Now is the clock; nil is time.Now.
	Now func() time.Time
	// Logf reports every grant and refusal; nil discards.
	Logf func(format string, args ...any)
}

// registryError is the registry's error body, which clients such as skopeo print.
type registryError struct {
	Errors []errorEntry `json:"errors"`
}

type errorEntry struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, status int, code, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(registryError{Errors: []errorEntry{{Code: code, Message: message}}})
}

func (h *Handler) logf(format string, args ...any) {
	if h.Logf != nil {
		h.Logf(format, args...)
	}
}

func (h *Handler) now() time.Time {
	if h.Now != nil {
		return h.Now()
	}
	return time.Now()
}

// ServeHTTP answers GET /token and GET /healthz.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/healthz":
		w.Write([]byte("ok"))
		return
	case "/token":
	default:
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", http.MethodGet)
		writeError(w, http.StatusMethodNotAllowed, "UNSUPPORTED", "use GET")
		return
	}
	h.token(w, r)
}

func (h *Handler) token(w http.ResponseWriter, r *http.Request) {
	from := r.RemoteAddr
	name, password, ok := ParseBasic(r.Header.Get("Authorization"))
	if !ok {
		h.logf("refused %s: no valid Basic credentials", from)
		h.unauthorized(w)
		return
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil || len(q["service"]) != 1 || q.Get("service") != h.Service {
		h.logf("refused %q from %s: service %q, want %q", name, from, q["service"], h.Service)
		writeError(w, http.StatusBadRequest, "UNSUPPORTED", fmt.Sprintf("this issuer signs tokens for service %s only", h.Service))
		return
	}
	if acct := q["account"]; len(acct) > 1 || (len(acct) == 1 && acct[0] != name) {
		h.logf("refused %q from %s: account %q is not the user authenticating", name, from, acct)
		writeError(w, http.StatusBadRequest, "UNSUPPORTED", "account must be the user name of the credentials")
		return
	}
	scopes, err := ParseScopes(q["scope"])
	if err != nil {
		h.logf("refused %q from %s: %v", name, from, err)
		writeError(w, http.StatusBadRequest, "UNSUPPORTED", err.Error())
		return
	}
	users, err := tenantusers.LoadStore(h.UsersFile)
	var robots *RobotStore
	if err == nil {
		robots, err = LoadRobots(h.RobotsFile)
	}
	if err != nil {
		h.logf("cannot read the credentials for %q from %s: %v", name, from, err)
		writeError(w, http.StatusInternalServerError, "UNKNOWN", "the issuer cannot read its credentials; see its log")
		return
	}
	now := h.now()
	p, ok, reason := Authenticate(users, robots, name, password, now)
	if !ok {
		h.logf("refused %q from %s: %s", name, from, reason)
		h.unauthorized(w)
		return
	}
	access, denial := Decide(p, scopes)
	if denial != nil {
		h.logf("denied %q (tenant %s, %s) from %s scopes %v: %s", name, p.Tenant, p.Role, from, scopes, denial.Message)
		writeError(w, http.StatusForbidden, "DENIED", denial.Message)
		return
	}
	resp, err := h.Minter.Mint(p.Name, h.Service, access, now)
	if err != nil {
		h.logf("token for %q: %v", name, err)
		writeError(w, http.StatusInternalServerError, "UNKNOWN", "cannot sign the token; see the issuer's log")
		return
	}
	h.logf("granted %q (tenant %s, %s) from %s: %v", name, p.Tenant, p.Role, from, access)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	json.NewEncoder(w).Encode(resp)
}

// unauthorized says only that the credentials were not accepted: not whether the
// user exists, the password was wrong or the credential is revoked or expired.
func (h *Handler) unauthorized(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", `Basic realm="`+h.Service+`"`)
	writeError(w, http.StatusUnauthorized, "UNAUTHORIZED", "authentication required: give the user name and registry password of a gpurack credential (the auth file `users add` wrote)")
}

// MaxAuthorizationLen bounds the Authorization header ParseBasic reads.
const MaxAuthorizationLen = 1024

var errBasic = errors.New("not Basic credentials")

// ParseBasic parses an Authorization header of the Basic scheme (RFC 7617): the
// scheme, case-insensitive, one space, and base64 (standard, padded) of
// "user:password". It refuses an empty user, a user with a control character or
// invalid UTF-8, and a header over MaxAuthorizationLen.
func ParseBasic(header string) (user, password string, ok bool) {
	u, p, err := parseBasic(header)
	return u, p, err == nil
}

func parseBasic(header string) (string, string, error) {
	if len(header) > MaxAuthorizationLen {
		return "", "", errBasic
	}
	scheme, enc, found := strings.Cut(header, " ")
	if !found || !strings.EqualFold(scheme, "Basic") {
		return "", "", errBasic
	}
	raw, err := base64.StdEncoding.Strict().DecodeString(enc)
	if err != nil {
		return "", "", errBasic
	}
	s := string(raw)
	user, password, found := strings.Cut(s, ":")
	if !found || user == "" || !utf8.ValidString(s) {
		return "", "", errBasic
	}
	if strings.IndexFunc(s, unicode.IsControl) >= 0 {
		return "", "", errBasic
	}
	return user, password, nil
}
