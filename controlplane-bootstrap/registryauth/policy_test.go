package registryauth

import (
	"reflect"
	"strings"
	"testing"
)

func scopes(t *testing.T, raw ...string) []Scope {
	t.Helper()
	s, err := ParseScopes(raw)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestDecide(t *testing.T) {
	alice := Principal{Name: "alice", Tenant: "team-a", Role: RoleUser}
	ann := Principal{Name: "ann", Tenant: "team-a", Role: RoleAdmin}
	robot := Principal{Name: RobotUser("team-a"), Tenant: "team-a", Role: RoleRobot}
	for _, tc := range []struct {
		name   string
		p      Principal
		scopes []string
		want   []Access
		denial string
	}{
		{"login", alice, nil, []Access{}, ""},
		{"push and pull own", alice, []string{"repository:team-a/train:pull,push"},
			[]Access{{TypeRepository, "team-a/train", []string{"pull", "push"}}}, ""},
		{"user star", alice, []string{"repository:team-a/x/y:*"},
			[]Access{{TypeRepository, "team-a/x/y", []string{"pull", "push"}}}, ""},
		{"user delete and pull gets pull", alice, []string{"repository:team-a/x:delete,pull"},
			[]Access{{TypeRepository, "team-a/x", []string{"pull"}}}, ""},
		{"user delete only", alice, []string{"repository:team-a/x:delete"}, nil,
			"user alice of tenant team-a may not delete team-a/x; it may push and pull under team-a/"},
		{"admin delete", ann, []string{"repository:team-a/x:delete"},
			[]Access{{TypeRepository, "team-a/x", []string{"delete"}}}, ""},
		{"admin star", ann, []string{"repository:team-a/x:*"},
			[]Access{{TypeRepository, "team-a/x", []string{"pull", "push", "delete"}}}, ""},
		{"other tenant", alice, []string{"repository:team-b/train:pull,push"}, nil,
			"user alice of tenant team-a may push and pull only under team-a/; team-b/train is outside it"},
		{"prefix lookalike", alice, []string{"repository:team-ab/x:pull"}, nil,
			"may push and pull only under team-a/; team-ab/x is outside it"},
		{"bare tenant name", alice, []string{"repository:team-a:pull"}, nil, "team-a is outside it"},
		{"one bad scope refuses all", alice, []string{"repository:team-a/x:pull", "repository:team-b/x:pull"}, nil,
			"team-b/x is outside it"},
		{"catalog", ann, []string{"registry:catalog:*"}, nil,
			"admin ann of tenant team-a may not list the registry's catalog (registry:catalog:*); it may push, pull and delete only under team-a/"},
		{"robot pull", robot, []string{"repository:team-a/x:pull,push"},
			[]Access{{TypeRepository, "team-a/x", []string{"pull"}}}, ""},
		{"robot push", robot, []string{"repository:team-a/x:push"}, nil,
			"the pull credential of tenant team-a may not push team-a/x; it may pull under team-a/"},
		{"robot other tenant", robot, []string{"repository:team-b/x:pull"}, nil,
			"the pull credential of tenant team-a may pull only under team-a/; team-b/x is outside it"},
		{"no role", Principal{Name: "x", Tenant: "team-a", Role: "root"}, nil, nil, "has no registry role"},
		{"no tenant", Principal{Name: "x", Role: RoleAdmin}, nil, nil, "has no registry role"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, d := Decide(tc.p, scopes(t, tc.scopes...))
			if tc.denial != "" {
				if d == nil || !strings.Contains(d.Message, tc.denial) || got != nil {
					t.Fatalf("got %+v, %v; want a denial with %q", got, d, tc.denial)
				}
				return
			}
			if d != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %+v, %v; want %+v", got, d, tc.want)
			}
		})
	}
}
