package registryauth

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Actions on a repository (the token specification's "pull", "push", "delete", and
// "*" for all that the holder may do).
const (
	ActionPull   = "pull"
	ActionPush   = "push"
	ActionDelete = "delete"
	ActionAll    = "*"
)

// Resource types of a scope.
const (
	TypeRepository = "repository"
	TypeRegistry   = "registry"
)

// Limits on what a token request may ask for. A real client asks for one to three
// scopes; the limits bound the work an unauthenticated request can cause.
const (
	MaxScopes       = 16
	MaxScopeLen     = 512
	MaxRepoNameLen  = 255
	maxActionsCount = 4
)

// Scope is one parsed scope of a token request: resource type, name and the actions
// asked for, duplicates removed, in the order given.
type Scope struct {
	Type    string
	Name    string
	Actions []string
}

// String is the scope as a request writes it.
func (s Scope) String() string {
	return s.Type + ":" + s.Name + ":" + strings.Join(s.Actions, ",")
}

// repoComponent is one path component of a repository name, as distribution's
// reference grammar has it: lowercase alphanumerics separated by '.', '_', "__" or
// runs of '-'.
var repoComponent = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|[-]+)[a-z0-9]+)*$`)

// ParseScope parses one scope, "repository:NAME:ACTIONS" or "registry:catalog:*"
// (https://distribution.github.io/distribution/spec/auth/scope/), strictly: it
// refuses a resource class ("repository(plugin)"), a name with a host or port (this
// issuer serves one registry), an empty or unknown action, and anything over the
// limits above. The message says what is wrong; it quotes the input with %q, so that
// nothing untrusted reaches a log or a client unescaped.
func ParseScope(raw string) (Scope, error) {
	if len(raw) > MaxScopeLen {
		return Scope{}, fmt.Errorf("scope of %d bytes: at most %d", len(raw), MaxScopeLen)
	}
	parts := strings.Split(raw, ":")
	if len(parts) != 3 {
		return Scope{}, fmt.Errorf("scope %q: want TYPE:NAME:ACTIONS, such as repository:team-a/train:pull,push", raw)
	}
	s := Scope{Type: parts[0], Name: parts[1]}
	switch s.Type {
	case TypeRepository:
		if err := checkRepoName(s.Name); err != nil {
			return Scope{}, fmt.Errorf("scope %q: %w", raw, err)
		}
	case TypeRegistry:
		if s.Name != "catalog" {
			return Scope{}, fmt.Errorf("scope %q: the only registry resource is catalog", raw)
		}
	default:
		return Scope{}, fmt.Errorf("scope %q: resource type %q: want repository or registry", raw, s.Type)
	}
	actions := strings.Split(parts[2], ",")
	if len(actions) > maxActionsCount {
		return Scope{}, fmt.Errorf("scope %q: %d actions, at most %d", raw, len(actions), maxActionsCount)
	}
	for _, a := range actions {
		switch a {
		case ActionPull, ActionPush, ActionDelete, ActionAll:
		default:
			return Scope{}, fmt.Errorf("scope %q: action %q: want pull, push, delete or *", raw, a)
		}
		if !slices.Contains(s.Actions, a) {
			s.Actions = append(s.Actions, a)
		}
	}
	return s, nil
}

func checkRepoName(name string) error {
	if name == "" {
		return fmt.Errorf("empty repository name")
	}
	if len(name) > MaxRepoNameLen {
		return fmt.Errorf("repository name of %d bytes: at most %d", len(name), MaxRepoNameLen)
	}
	for _, c := range strings.Split(name, "/") {
		if !repoComponent.MatchString(c) {
			return fmt.Errorf("repository name %q: each /-separated part is lowercase letters and digits, separated by '.', '_', \"__\" or '-'", name)
		}
	}
	return nil
}

// ParseScopes parses the scope parameters of a request. Each may hold several scopes
// separated by spaces (as some clients send them); empty ones are ignored.
func ParseScopes(params []string) ([]Scope, error) {
	var out []Scope
	for _, p := range params {
		for _, raw := range strings.Split(p, " ") {
			if raw == "" {
				continue
			}
			if len(out) == MaxScopes {
				return nil, fmt.Errorf("more than %d scopes in one request", MaxScopes)
			}
			s, err := ParseScope(raw)
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		}
	}
	return out, nil
}
