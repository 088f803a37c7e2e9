package registryauth

import (
	"slices"
	"strings"
	"testing"
)

func TestParseScope(t *testing.T) {
	for _, tc := range []struct {
		raw     string
		want    Scope
		wantErr string
	}{
		{raw: "repository:team-a/train:pull,push", want: Scope{TypeRepository, "team-a/train", []string{"pull", "push"}}},
		{raw: "repository:team-a/a.b/c__d/e---f:pull", want: Scope{TypeRepository, "team-a/a.b/c__d/e---f", []string{"pull"}}},
		{raw: "repository:team-a/x:push,pull,push", want: Scope{TypeRepository, "team-a/x", []string{"push", "pull"}}},
		{raw: "repository:team-a/x:*", want: Scope{TypeRepository, "team-a/x", []string{"*"}}},
		{raw: "registry:catalog:*", want: Scope{TypeRegistry, "catalog", []string{"*"}}},
		{raw: "repository:team-a/x", wantErr: "want TYPE:NAME:ACTIONS"},
		{raw: "repository:host:5000/team-a/x:pull", wantErr: "want TYPE:NAME:ACTIONS"},
		{raw: "repository(plugin):team-a/x:pull", wantErr: `resource type "repository(plugin)"`},
		{raw: "registry:other:*", wantErr: "only registry resource is catalog"},
		{raw: "repository:Team-A/x:pull", wantErr: "lowercase letters and digits"},
		{raw: "repository:team-a//x:pull", wantErr: "lowercase letters and digits"},
		{raw: "repository:team-a/x/:pull", wantErr: "lowercase letters and digits"},
		{raw: "repository:/x:pull", wantErr: "lowercase letters and digits"},
		{raw: "repository:team-a/-x:pull", wantErr: "lowercase letters and digits"},
		{raw: "repository:team-a/x..y:pull", wantErr: "lowercase letters and digits"},
		{raw: "repository::pull", wantErr: "empty repository name"},
		{raw: "repository:team-a/x:", wantErr: `action ""`},
		{raw: "repository:team-a/x:pull,,push", wantErr: `action ""`},
		{raw: "repository:team-a/x:PULL", wantErr: `action "PULL"`},
		{raw: "repository:team-a/x:pull,push,delete,*,pull", wantErr: "5 actions, at most 4"},
		{raw: "repository:" + strings.Repeat("a", 256) + ":pull", wantErr: "at most 255"},
		{raw: "repository:a/x:pull\n", wantErr: `action "pull\n"`},
		{raw: strings.Repeat("a", MaxScopeLen+1), wantErr: "at most 512"},
	} {
		got, err := ParseScope(tc.raw)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseScope(%q) = %+v, %v; want an error with %q", tc.raw, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got.Type != tc.want.Type || got.Name != tc.want.Name || !slices.Equal(got.Actions, tc.want.Actions) {
			t.Errorf("ParseScope(%q) = %+v, %v; want %+v", tc.raw, got, err, tc.want)
		}
	}
}

func TestParseScopes(t *testing.T) {
	got, err := ParseScopes([]string{"repository:a/x:pull repository:a/y:push", "", "registry:catalog:*"})
	if err != nil || len(got) != 3 || got[1].Name != "a/y" || got[2].Type != TypeRegistry {
		t.Errorf("several scopes: %+v %v", got, err)
	}
	many := make([]string, MaxScopes+1)
	for i := range many {
		many[i] = "repository:a/x:pull"
	}
	if _, err := ParseScopes(many); err == nil || !strings.Contains(err.Error(), "more than 16 scopes") {
		t.Errorf("17 scopes: %v", err)
	}
	if _, err := ParseScopes([]string{"repository:a/x:pull", "repository:a/x:pul"}); err == nil {
		t.Error("a bad scope among good ones was accepted")
	}
}

// FuzzParseScope: whatever the input, ParseScope does not panic, and what it accepts
// is a known type, a name of the reference grammar within the limits, and known
// actions, and parses again to itself.
func FuzzParseScope(f *testing.F) {
	for _, s := range []string{"repository:team-a/train:pull,push", "registry:catalog:*", "repository:a:b:c", "repository:a__b/c:*,delete", ":::", "repository:a/\x00:pull"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		s, err := ParseScope(raw)
		if err != nil {
			return
		}
		if s.Type != TypeRepository && s.Type != TypeRegistry {
			t.Fatalf("%q: type %q", raw, s.Type)
		}
		if s.Type == TypeRepository && checkRepoName(s.Name) != nil {
			t.Fatalf("%q: name %q", raw, s.Name)
		}
		if strings.ContainsAny(s.Name, ": \t\r\n\x00") {
			t.Fatalf("%q: name %q holds a separator or control character", raw, s.Name)
		}
		for _, a := range s.Actions {
			if !slices.Contains([]string{ActionPull, ActionPush, ActionDelete, ActionAll}, a) {
				t.Fatalf("%q: action %q", raw, a)
			}
		}
		again, err := ParseScope(s.String())
		if err != nil || again.String() != s.String() {
			t.Fatalf("%q: %q does not parse to itself: %+v %v", raw, s.String(), again, err)
		}
	})
}
