// Package tenants turns tenants.yaml into the Kubernetes objects that give
// each team on a gpurack cluster its own namespaces, GPU and storage quota, LimitRange
// defaults, priority tiers, roles and a default-deny-ingress NetworkPolicy,
// and applies them to the apiserver idempotently with server-side apply.
//
// Parsing and object building are pure (Parse, Objects); Plan and Apply talk
// to the apiserver. It does not issue user credentials (package tenantusers)
// and does not enforce NetworkPolicies on nodes (that is the node agent's
// job); see docs/tenants.md.
package tenants

import (
	"fmt"
	"maps"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/gpurack/gpurack/internal/strictyaml"
)

// APIVersion and Kind identify a tenants.yaml document.
const (
	APIVersion = "gpurack.io/v1alpha1"
	Kind       = "TenantList"
)

// File is tenants.yaml.
type File struct {
	APIVersion string   `yaml:"apiVersion"`
	Kind       string   `yaml:"kind"`
	Tenants    []Tenant `yaml:"tenants"`
}

// Tenant is one team.
type Tenant struct {
	// Name is a DNS label; it names the tenant's groups
	// (gpurack:tenant:NAME:admins|users) and prefixes its PriorityClasses.
	Name string `yaml:"name"`
	// Namespaces the tenant owns; default: one named like the tenant.
	Namespaces []string `yaml:"namespaces"`
	// Quota is applied to each of the tenant's namespaces (Kubernetes has
	// no quota across namespaces).
	Quota Quota `yaml:"quota"`
	// Defaults are the LimitRange's default requests for containers that
	// give none, so that quota counts them.
	Defaults Defaults `yaml:"defaults"`
	// Tiers become PriorityClasses named NAME-TIER.
	Tiers []Tier `yaml:"tiers"`
	// AllowFrom lists namespaces (of other tenants or shared services)
	// whose pods may connect to this tenant's pods.
	AllowFrom []string `yaml:"allowFrom"`
	// PodSecurity is the Pod Security Standard enforced in the tenant's
	// namespaces: baseline (default), restricted or privileged.
	PodSecurity string `yaml:"podSecurity"`
	// Queue limits the tenant's borrowing and lending of GPUs in the cohort
	// when the cluster's job queues are on (cluster.yaml's queues.enabled;
	// docs/tenants.md "Queues").
	Queue QueueLimits `yaml:"queue"`
}

// QueueLimits bound what a tenant's ClusterQueue borrows from the others'
// idle GPUs and lends of its own, whole GPUs; empty means no limit.
type QueueLimits struct {
	// BorrowingLimit caps the GPUs it may use above its quota.gpus.
	BorrowingLimit string `yaml:"borrowingLimit"`
	// LendingLimit caps how many of its idle quota.gpus others may use.
	LendingLimit string `yaml:"lendingLimit"`
}

// Quota is the hard limits of the ResourceQuota, as Kubernetes quantities.
// An empty field sets no limit on that resource.
type Quota struct {
	GPUs   string `yaml:"gpus"`
	CPU    string `yaml:"cpu"`
	Memory string `yaml:"memory"`
	Pods   string `yaml:"pods"`
	// Storage caps the requested size of all the namespace's claims
	// together, whatever their StorageClass (requests.storage).
	Storage string `yaml:"storage"`
	// StorageClasses caps the claims of each StorageClass, keyed by the
	// class's name; a class not listed is limited only by Storage.
	StorageClasses map[string]StorageQuota `yaml:"storageClasses"`
}

// StorageQuota limits a namespace's PersistentVolumeClaims of one
// StorageClass. At least one field is set; an empty one sets no limit.
type StorageQuota struct {
	// Requests caps the sum of the claims' requested sizes, a Kubernetes
	// quantity such as 2Ti (CLASS.storageclass.storage.k8s.io/requests.storage).
	Requests string `yaml:"requests"`
	// Claims caps how many claims of the class there may be, a whole
	// number; 0 keeps the tenant off the class
	// (CLASS.storageclass.storage.k8s.io/persistentvolumeclaims).
	Claims string `yaml:"claims"`
}

// Defaults are container default requests.
type Defaults struct {
	CPU    string `yaml:"cpu"`
	Memory string `yaml:"memory"`
}

// Tier is one priority tier of a tenant.
type Tier struct {
	Name string `yaml:"name"`
	// Priority is the PriorityClass value; at most 1000000000 (higher is
	// reserved for system classes).
	Priority int64 `yaml:"priority"`
	// Preempt lets pods of this tier evict lower-priority pods
	// (PreemptLowerPriority); default false (Never). See docs/tenants.md for
	// why preemption cannot be confined to one tenant.
	Preempt bool `yaml:"preempt"`
	// GPUs caps this tier's GPU requests per namespace (a ResourceQuota
	// scoped to the tier's PriorityClass); empty means the tenant's quota.
	GPUs string `yaml:"gpus"`
}

// Default LimitRange requests, used when a tenant gives none.
const (
	DefaultCPURequest    = "500m"
	DefaultMemoryRequest = "512Mi"
	DefaultPodSecurity   = "baseline"
)

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// reservedNamespaces may never belong to a tenant.
var reservedNamespaces = []string{"default", "kube-system", "kube-public", "kube-node-lease"}

// Load reads and parses the file at path; see Parse.
func Load(path string) (*File, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read tenants file: %w", err)
	}
	return Parse(path, data)
}

// Parse decodes tenants.yaml strictly (package strictyaml), applies defaults
// and validates it. name is used in errors, which are a strictyaml.Errors:
// every problem as "FILE:LINE: FIELD: what to fix".
func Parse(name string, data []byte) (*File, error) {
	f := &File{}
	pos, err := strictyaml.Decode(name, data, f)
	if err != nil {
		return nil, err
	}
	f.applyDefaults()
	var es strictyaml.Errors
	for _, fe := range f.Validate() {
		es = append(es, pos.At(name, fe.Field, fe.Msg))
	}
	if len(es) > 0 {
		return nil, es.Sorted()
	}
	return f, nil
}

func (f *File) applyDefaults() {
	for i := range f.Tenants {
		t := &f.Tenants[i]
		if len(t.Namespaces) == 0 && t.Name != "" {
			t.Namespaces = []string{t.Name}
		}
		if t.Defaults.CPU == "" {
			t.Defaults.CPU = DefaultCPURequest
		}
		if t.Defaults.Memory == "" {
			t.Defaults.Memory = DefaultMemoryRequest
		}
		if t.PodSecurity == "" {
			t.PodSecurity = DefaultPodSecurity
		}
	}
}

// FieldError is one invalid field: its dotted path and what to fix.
type FieldError struct {
	Field string
	Msg   string
}

// maxTenantName keeps NAME-TIER and the group names well inside the
// 63-character label limit of PriorityClass names used in label values.
const maxTenantName = 40

// Validate checks a defaulted file and returns every problem.
func (f *File) Validate() []FieldError {
	var errs []FieldError
	add := func(field, format string, args ...any) {
		errs = append(errs, FieldError{Field: field, Msg: fmt.Sprintf(format, args...)})
	}
	if f.APIVersion != APIVersion {
		add("apiVersion", "is %q; write %q", f.APIVersion, APIVersion)
	}
	if f.Kind != Kind {
		add("kind", "is %q; write %q", f.Kind, Kind)
	}
	tenantOf := map[string]string{} // namespace -> tenant
	names := map[string]bool{}
	classes := map[string]string{} // PriorityClass -> field
	for i, t := range f.Tenants {
		p := fmt.Sprintf("tenants[%d]", i)
		if !dnsLabel.MatchString(t.Name) || len(t.Name) > maxTenantName {
			add(p+".name", "%q is not a DNS label of at most %d characters (lowercase letters, digits, '-')", t.Name, maxTenantName)
		} else if names[t.Name] {
			add(p+".name", "tenant %q is given twice; keep one", t.Name)
		}
		names[t.Name] = true
		for j, ns := range t.Namespaces {
			np := fmt.Sprintf("%s.namespaces[%d]", p, j)
			switch {
			case !dnsLabel.MatchString(ns) || len(ns) > 63:
				add(np, "%q is not a namespace name (a DNS label: lowercase letters, digits, '-', at most 63)", ns)
			case slices.Contains(reservedNamespaces, ns) || strings.HasPrefix(ns, "kube-") || strings.HasPrefix(ns, "gpurack-"):
				add(np, "%q is a system namespace; give the tenant its own", ns)
			case tenantOf[ns] != "":
				add(np, "namespace %q already belongs to tenant %q; a namespace has one tenant", ns, tenantOf[ns])
			default:
				tenantOf[ns] = t.Name
			}
		}
		q := t.Quota
		for _, qf := range []struct{ field, v string }{
			{"gpus", q.GPUs}, {"cpu", q.CPU}, {"memory", q.Memory}, {"pods", q.Pods}, {"storage", q.Storage},
		} {
			if msg := checkQuantity(qf.v); msg != "" {
				add(p+".quota."+qf.field, "%s", msg)
			}
		}
		if q.GPUs != "" && !wholeNumber(q.GPUs) {
			add(p+".quota.gpus", "%q: GPUs are counted whole; write a whole number such as 8", q.GPUs)
		}
		if q.Pods != "" && !wholeNumber(q.Pods) {
			add(p+".quota.pods", "%q: write a whole number of pods", q.Pods)
		}
		errs = append(errs, validateStorageClasses(p+".quota.storageClasses", t.Name, q.StorageClasses)...)
		errs = append(errs, validateQueueLimits(p+".queue", t)...)
		for _, df := range []struct{ field, v string }{{"cpu", t.Defaults.CPU}, {"memory", t.Defaults.Memory}} {
			if msg := checkQuantity(df.v); msg != "" {
				add(p+".defaults."+df.field, "%s", msg)
			}
		}
		tiers := map[string]bool{}
		for j, tier := range t.Tiers {
			tp := fmt.Sprintf("%s.tiers[%d]", p, j)
			if !dnsLabel.MatchString(tier.Name) || len(tier.Name) > 20 {
				add(tp+".name", "%q is not a DNS label of at most 20 characters", tier.Name)
			} else if tiers[tier.Name] {
				add(tp+".name", "tier %q is given twice in tenant %q", tier.Name, t.Name)
			}
			tiers[tier.Name] = true
			if cls := PriorityClassName(t.Name, tier.Name); classes[cls] != "" {
				add(tp+".name", "PriorityClass %q is also made by %s; rename the tenant or the tier", cls, classes[cls])
			} else {
				classes[cls] = tp
			}
			if tier.Priority > 1_000_000_000 || tier.Priority < math.MinInt32 {
				add(tp+".priority", "%d is out of range: user PriorityClasses take -2147483648 to 1000000000", tier.Priority)
			}
			if tier.GPUs != "" {
				if msg := checkQuantity(tier.GPUs); msg != "" {
					add(tp+".gpus", "%s", msg)
				} else if !wholeNumber(tier.GPUs) {
					add(tp+".gpus", "%q: GPUs are counted whole; write a whole number", tier.GPUs)
				}
			}
		}
		for j, ns := range t.AllowFrom {
			if !dnsLabel.MatchString(ns) || len(ns) > 63 {
				add(fmt.Sprintf("%s.allowFrom[%d]", p, j), "%q is not a namespace name", ns)
			}
		}
		if !slices.Contains([]string{"baseline", "restricted", "privileged"}, t.PodSecurity) {
			add(p+".podSecurity", "%q is not a Pod Security level: write baseline, restricted or privileged", t.PodSecurity)
		}
	}
	return errs
}

// maxStorageClassName keeps CLASS.storageclass.storage.k8s.io, the prefix
// of the class's quota resources, within a DNS subdomain's 253 characters.
const maxStorageClassName = validation.DNS1123SubdomainMaxLength - len(storageClassDomain)

// validateStorageClasses checks a tenant's quota per StorageClass, in
// sorted order of the classes. Fields are written as strictyaml locates map
// keys: PATH[CLASS].requests.
func validateStorageClasses(path, tenant string, classes map[string]StorageQuota) []FieldError {
	var errs []FieldError
	add := func(field, format string, args ...any) {
		errs = append(errs, FieldError{Field: field, Msg: fmt.Sprintf("tenant %q: ", tenant) + fmt.Sprintf(format, args...)})
	}
	for _, class := range slices.Sorted(maps.Keys(classes)) {
		sq := classes[class]
		cp := path + "[" + class + "]"
		if msgs := validation.IsDNS1123Subdomain(class); len(msgs) > 0 {
			add(cp, "%q is not a StorageClass name (a DNS subdomain: lowercase letters, digits, '-' and '.'): %s", class, strings.Join(msgs, "; "))
			continue
		}
		if len(class) > maxStorageClassName {
			add(cp, "StorageClass name %q is longer than %d characters, which a quota cannot name", class, maxStorageClassName)
			continue
		}
		if sq.Requests == "" && sq.Claims == "" {
			add(cp, "StorageClass %q sets no limit; give requests (such as 1Ti), claims (such as 20) or both, or remove it", class)
			continue
		}
		if sq.Requests != "" {
			if q, err := resource.ParseQuantity(sq.Requests); err != nil {
				add(cp+".requests", "%q is not a Kubernetes quantity; write a size such as 500Gi or 2Ti", sq.Requests)
			} else if q.Sign() <= 0 {
				add(cp+".requests", "%q is not a positive size; write one such as 500Gi (claims: 0 keeps the tenant off %s)", sq.Requests, class)
			}
		}
		if sq.Claims != "" {
			if n, err := strconv.ParseInt(sq.Claims, 10, 64); err != nil || n < 0 {
				add(cp+".claims", "%q is not a number of claims; write a whole number, 0 or more, such as 20 (0 keeps the tenant off %s)", sq.Claims, class)
			}
		}
	}
	return errs
}

func checkQuantity(v string) string {
	if v == "" {
		return ""
	}
	q, err := resource.ParseQuantity(v)
	if err != nil {
		return fmt.Sprintf("%q is not a Kubernetes quantity (for example 8, 500m, 64Gi)", v)
	}
	if q.Sign() < 0 {
		return fmt.Sprintf("%q is negative", v)
	}
	return ""
}

func wholeNumber(v string) bool {
	q, err := resource.ParseQuantity(v)
	return err == nil && q.MilliValue()%1000 == 0
}

// PriorityClassName is the PriorityClass of a tenant's tier.
func PriorityClassName(tenant, tier string) string { return tenant + "-" + tier }

// Tenant returns the tenant called name, or nil.
func (f *File) Tenant(name string) *Tenant {
	for i := range f.Tenants {
		if f.Tenants[i].Name == name {
			return &f.Tenants[i]
		}
	}
	return nil
}
