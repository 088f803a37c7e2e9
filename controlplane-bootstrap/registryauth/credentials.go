package registryauth

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"time"

	"github.com/gpurack/gpurack/controlplane-bootstrap/tenantusers"
	"github.com/gpurack/gpurack/internal/atomicfile"
)

// RobotsFile is the record of the tenants' pull credentials, relative to the cluster
// directory. Like users/credentials.json it holds hashes only. It is not under
// DIR/registry, the registry's default storage root: credentials stay out of the
// images' folder and its backups.
const RobotsFile = "registry-auth/tenants.json"

// RobotUser is the Basic user name of tenant's pull credential. '+' is not allowed in
// a user name (`users add`), so it never names a user.
func RobotUser(tenant string) string { return "robot+" + tenant }

// NewPassword returns a registry password: 32 random bytes, base64url without
// padding (43 characters), and its hash as stored.
func NewPassword() (password, hash string, err error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", "", err
	}
	password = base64.RawURLEncoding.EncodeToString(b)
	return password, HashPassword(password), nil
}

// HashPassword is the stored form of a password: hex SHA-256. A password is 256
// random bits, so a plain hash is as hard to reverse as the password is to guess; a
// slow hash (bcrypt) would only slow every pull.
func HashPassword(password string) string {
	sum := sha256.Sum256([]byte(password))
	return hex.EncodeToString(sum[:])
}

// passwordMatches compares password with a stored hash in constant time.
func passwordMatches(password, hash string) bool {
	want, err := hex.DecodeString(hash)
	if err != nil || len(want) != sha256.Size {
		return false
	}
	got := sha256.Sum256([]byte(password))
	return subtle.ConstantTimeCompare(got[:], want) == 1
}

// IssueUserPassword gives the credential credID in s a new registry password and
// returns it; s keeps only its hash (the caller saves s). The password is shown once:
// written into the user's auth file (AuthFile).
func IssueUserPassword(s *tenantusers.Store, credID string) (string, error) {
	for i := range s.Credentials {
		if s.Credentials[i].ID == credID {
			password, hash, err := NewPassword()
			if err != nil {
				return "", err
			}
			s.Credentials[i].RegistryPasswordSHA256 = hash
			return password, nil
		}
	}
	return "", fmt.Errorf("no credential %s in the user store", credID)
}

// Robot is one tenant's pull credential.
type Robot struct {
	Tenant         string    `json:"tenant"`
	PasswordSHA256 string    `json:"passwordSHA256"`
	IssuedAt       time.Time `json:"issuedAt"`
}

// RobotStore is the file RobotsFile: the pull credentials of the tenants that exist.
// A removed tenant's robot is deleted, and so refused.
type RobotStore struct {
	Robots []Robot `json:"robots"`
}

// LoadRobots reads path; a missing file is an empty store.
func LoadRobots(path string) (*RobotStore, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return &RobotStore{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("registry pull credentials: %w", err)
	}
	var s RobotStore
	if err := json.Unmarshal(data, &s); err != nil {
		return nil, fmt.Errorf("registry pull credentials %s: %w; delete it and run `tenants apply` again (it issues new ones)", path, err)
	}
	return &s, nil
}

// Save writes the store atomically.
func (s *RobotStore) Save(path string) error {
	return atomicfile.WriteJSON(path, s, 0o600, 0o700)
}

// Find returns tenant's robot, or nil.
func (s *RobotStore) Find(tenant string) *Robot {
	for i := range s.Robots {
		if s.Robots[i].Tenant == tenant {
			return &s.Robots[i]
		}
	}
	return nil
}

// Authenticate checks a Basic user name and password against the stores at now. ok is
// false for an unknown user, a wrong password, a revoked or expired credential, or a
// removed tenant's robot; reason says which, for the issuer's log only (the client
// is told none of it).
func Authenticate(users *tenantusers.Store, robots *RobotStore, name, password string, now time.Time) (p Principal, ok bool, reason string) {
	if tenant, isRobot := strings.CutPrefix(name, "robot+"); isRobot {
		r := robots.Find(tenant)
		if r == nil {
			return Principal{}, false, "no pull credential for tenant " + tenant + " (not in the tenants file?)"
		}
		if !passwordMatches(password, r.PasswordSHA256) {
			return Principal{}, false, "wrong password"
		}
		return Principal{Name: name, Tenant: tenant, Role: RoleRobot}, true, ""
	}
	reason = "unknown user"
	for _, c := range users.Credentials {
		if c.User != name || c.RegistryPasswordSHA256 == "" {
			continue
		}
		if !passwordMatches(password, c.RegistryPasswordSHA256) {
			reason = "wrong password"
			continue
		}
		if st := c.State(now); st != "active" {
			return Principal{}, false, "credential " + c.ID + " is " + st
		}
		return Principal{Name: name, Tenant: c.Tenant, Role: c.Role}, true, ""
	}
	return Principal{}, false, reason
}

// AuthFile is a containers auth file (containers-auth.json(5), which `skopeo
// --authfile`, podman and docker read) holding name and password for the registry at
// registry (host:port).
func AuthFile(registry, name, password string) ([]byte, error) {
	return json.MarshalIndent(dockerConfig(registry, name, password), "", "  ")
}

// DockerConfigJSON is the .dockerconfigjson of a kubernetes.io/dockerconfigjson
// Secret, the form kubelet reads imagePullSecrets in.
func DockerConfigJSON(registry, name, password string) ([]byte, error) {
	return json.Marshal(dockerConfig(registry, name, password))
}

type authEntry struct {
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
	Auth     string `json:"auth"`
}

type dockerConfigFile struct {
	Auths map[string]authEntry `json:"auths"`
}

func dockerConfig(registry, name, password string) dockerConfigFile {
	return dockerConfigFile{Auths: map[string]authEntry{registry: {
		Username: name, Password: password,
		Auth: base64.StdEncoding.EncodeToString([]byte(name + ":" + password)),
	}}}
}

// PasswordIn returns the password of name for registry in a .dockerconfigjson (or a
// containers auth file), if it holds one.
func PasswordIn(data []byte, registry, name string) (string, bool) {
	var f dockerConfigFile
	if json.Unmarshal(data, &f) != nil {
		return "", false
	}
	e, ok := f.Auths[registry]
	if !ok || e.Username != name || e.Password == "" {
		return "", false
	}
	return e.Password, true
}
