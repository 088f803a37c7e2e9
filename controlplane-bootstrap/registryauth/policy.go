package registryauth

import (
	"fmt"
	"slices"
	"strings"
)

// Roles of a Principal: a tenant user's (tenantusers.RoleUser, RoleAdmin) or the
// tenant's pull credential.
const (
	RoleUser  = "user"
	RoleAdmin = "admin"
	RoleRobot = "robot"
)

// Principal is who a request authenticated as.
type Principal struct {
	// Name is the Basic user name: a tenant user's name, or RobotUser(tenant).
	Name   string
	Tenant string
	Role   string
}

// describe names the principal in refusals: "user alice of tenant team-a".
func (p Principal) describe() string {
	if p.Role == RoleRobot {
		return "the pull credential of tenant " + p.Tenant
	}
	return p.Role + " " + p.Name + " of tenant " + p.Tenant
}

// allowed is what the principal may do under its tenant's prefix.
func (p Principal) allowed() []string {
	switch p.Role {
	case RoleAdmin:
		return []string{ActionPull, ActionPush, ActionDelete}
	case RoleUser:
		return []string{ActionPull, ActionPush}
	case RoleRobot:
		return []string{ActionPull}
	}
	return nil
}

// Prefix is the part of the registry's namespace that belongs to tenant: "T/".
func Prefix(tenant string) string { return tenant + "/" }

// Access is one entry of a token's access claim.
type Access struct {
	Type    string   `json:"type"`
	Name    string   `json:"name"`
	Actions []string `json:"actions"`
}

// Denial is why a request's scopes are refused; Message is shown to the client.
type Denial struct{ Message string }

func (d *Denial) Error() string { return d.Message }

// Decide is the registry's policy: a principal of tenant T may act only on
// repositories named T/...; a user may pull and push, a tenant admin also delete, the
// tenant's pull credential only pull. Any scope outside the prefix, or on the
// registry's catalog, refuses the whole request with a Denial naming the prefix and
// the tenant, so that the client's error says what to change. Inside the prefix the
// actions asked for are granted as far as the role allows ("*" is all of them); a
// scope of which nothing may be granted is refused too, so that a push without the
// right fails here with the reason rather than later with the registry's bare 401.
// No scopes (a login) grant an empty access list.
func Decide(p Principal, scopes []Scope) ([]Access, *Denial) {
	allowed := p.allowed()
	if p.Tenant == "" || len(allowed) == 0 {
		return nil, &Denial{fmt.Sprintf("%s has no registry role", p.describe())}
	}
	verbs := joinActions(allowed)
	access := []Access{}
	for _, s := range scopes {
		if s.Type != TypeRepository {
			return nil, &Denial{fmt.Sprintf("%s may not list the registry's catalog (%s); it may %s only under %s",
				p.describe(), s.String(), verbs, Prefix(p.Tenant))}
		}
		if !strings.HasPrefix(s.Name, Prefix(p.Tenant)) {
			return nil, &Denial{fmt.Sprintf("%s may %s only under %s; %s is outside it",
				p.describe(), verbs, Prefix(p.Tenant), s.Name)}
		}
		var granted []string
		for _, a := range allowed {
			if slices.Contains(s.Actions, a) || slices.Contains(s.Actions, ActionAll) {
				granted = append(granted, a)
			}
		}
		if len(granted) == 0 {
			return nil, &Denial{fmt.Sprintf("%s may not %s %s; it may %s under %s",
				p.describe(), joinActions(s.Actions), s.Name, verbs, Prefix(p.Tenant))}
		}
		access = append(access, Access{Type: TypeRepository, Name: s.Name, Actions: granted})
	}
	return access, nil
}

// joinActions writes actions as prose: "pull", "push and pull", "push, pull and
// delete". Push comes first, as people say it.
func joinActions(actions []string) string {
	order := []string{ActionPush, ActionPull, ActionDelete, ActionAll}
	var words []string
	for _, a := range order {
		if slices.Contains(actions, a) {
			if a == ActionAll {
				a = "do everything (*) on"
			}
			words = append(words, a)
		}
	}
	switch len(words) {
	case 0:
		return "nothing"
	case 1:
		return words[0]
	}
	return strings.Join(words[:len(words)-1], ", ") + " and " + words[len(words)-1]
}
