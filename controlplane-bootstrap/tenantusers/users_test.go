package tenantusers

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
)

func TestStoreRoundTripAndStates(t *testing.T) {
	path := filepath.Join(t.TempDir(), StoreFile)
	s, err := LoadStore(path)
	if err != nil || len(s.Credentials) != 0 {
		t.Fatalf("a missing store: %v %+v", err, s)
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rev := now.Add(-time.Minute)
	s.Credentials = []Credential{
		{User: "ann", ID: "00000001", NotAfter: now.Add(time.Hour)},
		{User: "ann", ID: "00000002", NotAfter: now.Add(time.Hour), RevokedAt: &rev},
		{User: "bob", ID: "00000003", NotAfter: now},
	}
	if err := s.Save(path); err != nil {
		t.Fatal(err)
	}
	again, err := LoadStore(path)
	if err != nil {
		t.Fatal(err)
	}
	var states []string
	for _, c := range again.Credentials {
		states = append(states, c.State(now))
	}
	if got := strings.Join(states, ","); got != "active,revoked,expired" {
		t.Errorf("states %s", got)
	}
	if act := again.Active("ann", now); len(act) != 1 || act[0].ID != "00000001" {
		t.Errorf("active credentials of ann: %+v", act)
	}
}

func TestAddRefusesBadInputBeforeTouchingTheCluster(t *testing.T) {
	now := time.Now()
	s := &Store{Credentials: []Credential{{User: "ann", Tenant: "a", ID: "1", NotAfter: now.Add(time.Hour)}}}
	for _, tc := range []struct {
		opts AddOptions
		want string
	}{
		{AddOptions{User: "Ann", Tenant: "a", Role: RoleUser, TTL: time.Hour}, `user name "Ann"`},
		{AddOptions{User: "x:y", Tenant: "a", Role: RoleUser, TTL: time.Hour}, `user name "x:y"`},
		{AddOptions{User: "bob", Tenant: "a", Role: "root", TTL: time.Hour}, `role "root": use user or admin`},
		{AddOptions{User: "bob", Tenant: "a", Role: RoleUser}, "ttl 0s: give a positive duration"},
		{AddOptions{User: "ann", Tenant: "a", Role: RoleUser, TTL: time.Hour, Now: now}, "already holds credential 1"},
		{AddOptions{User: "bob", Tenant: "a", Role: RoleUser, TTL: time.Hour, WorkSize: resource.MustParse("-1Gi")}, "work size -1Gi: give a size such as 50Gi"},
	} {
		// A nil client and PKI: Add must fail before it needs them.
		_, err := Add(t.Context(), nil, nil, s, tc.opts)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v; want %q", tc.opts, err, tc.want)
		}
	}
	if got := CredentialGroup("ann", "0a1b2c3d"); got != "gpurack:user:ann:0a1b2c3d" {
		t.Errorf("credential group %s", got)
	}
}

func TestWorkNamespaceAndLines(t *testing.T) {
	for _, tc := range []struct {
		tenant string
		nss    []string
		want   string
	}{
		{"vision", []string{"vision", "vision-dev"}, "vision"},
		{"vision", []string{"a-vision", "vision"}, "vision"},
		{"vision", []string{"cv-dev", "cv-prod"}, "cv-dev"},
	} {
		if got := workNamespace(tc.tenant, tc.nss); got != tc.want {
			t.Errorf("workNamespace(%s, %v) = %s; want %s", tc.tenant, tc.nss, got, tc.want)
		}
	}
	w := WorkDir{State: WorkMade, Namespace: "vision", Claim: WorkClaimName("ann"), Class: "gpurack-shared", Size: resource.MustParse(DefaultWorkSize)}
	if got, want := w.String(), "work directory: PVC vision/work-ann (gpurack-shared, 50Gi); mount it in a pod as claimName: work-ann"; got != want {
		t.Errorf("line %q; want %q", got, want)
	}
}
