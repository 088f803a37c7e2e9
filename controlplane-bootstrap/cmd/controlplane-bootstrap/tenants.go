package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/gpurack/gpurack/controlplane-bootstrap/controlplane"
	"github.com/gpurack/gpurack/controlplane-bootstrap/tenants"
	"github.com/gpurack/gpurack/controlplane-bootstrap/tenantusers"
	"github.com/gpurack/gpurack/internal/atomicfile"
)

func newTenantsCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "tenants", Short: "Apply tenants.yaml (namespaces, GPU quotas, roles, network policies) and show quota use"}
	cmd.AddCommand(newTenantsApplyCommand(), newTenantsDiffCommand(), newTenantsStatusCommand())
	return cmd
}

// tenantPlan computes what applying the tenants file at path to the control plane in
// dir would change.
func tenantPlan(ctx context.Context, dir, path string) (*tenants.Plan, dynamic.Interface, kubernetes.Interface, *controlplane.ControlPlane, error) {
	f, err := tenants.Load(path)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	cp, cs, dyn, err := adminClients(dir)
	if err != nil {
		return nil, nil, nil, nil, err
	}
	objs, err := tenants.ObjectsFor(f, tenants.Options{Queues: cp.Config.Queues.Enabled})
	if err != nil {
		return nil, nil, nil, nil, err
	}
	p, err := tenants.ComputePlan(ctx, dyn, objs)
	return p, dyn, cs, cp, err
}

func newTenantsApplyCommand() *cobra.Command {
	var dir, registry string
	var prune bool
	cmd := &cobra.Command{
		Use:   "apply --dir DIR FILE [--prune] [--registry HOST:PORT]",
		Short: "Create or update every tenant's objects; ask before deleting what the file no longer lists",
		Long: `apply reads FILE (see docs/examples/tenants.yaml) and applies, with server-side
apply, each tenant's namespaces, ResourceQuotas, LimitRange, PriorityClasses, Roles and
RoleBindings and default-deny-ingress NetworkPolicy; when the cluster runs job queues
(cluster.yaml's queues.enabled), also each tenant's ClusterQueue (its quota.gpus as
nominal quota, in the cohort gpurack) and a LocalQueue "default" in each namespace, and
a GPU limit in the ResourceQuotas that leaves room for what the queue may borrow (see
docs/tenants.md, "Queues"). Objects already as the file says are left alone, so running
it again changes nothing.

Objects that an earlier apply created and the file no longer asks for (a removed tenant,
namespace or tier) are deleted only with --prune or after typing 'yes'; they are named
first. Deleting a namespace deletes everything in it.

With the registry (cluster.yaml's registry.enabled, or --registry), each tenant also
gets a pull-only credential for the image registry, as the Secret gpurack-registry in
each of its namespaces, named by the namespace's default ServiceAccount (see
docs/tenants.md, "Registry credentials").`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, dyn, cs, cp, err := tenantPlan(cmd.Context(), dir, args[0])
			if err != nil {
				return err
			}
			reg, err := registryAddress(registry, cp)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			printPlan(out, p, false)
			confirmed := prune
			if del := p.Deletions(); len(del) > 0 && !prune {
				fmt.Fprintf(out, "%s no longer asks for these; apply would delete them:\n", args[0])
				for _, c := range del {
					fmt.Fprintf(out, "  %s\n", c.Describe())
				}
				fmt.Fprint(out, "Type 'yes' to delete them (anything else changes nothing): ")
				line, _ := bufio.NewReader(cmd.InOrStdin()).ReadString('\n')
				fmt.Fprintln(out)
				confirmed = strings.TrimSpace(line) == "yes"
			}
			if err := tenants.Execute(cmd.Context(), dyn, p, confirmed); err != nil {
				return err
			}
			store, err := tenantusers.LoadStore(userStorePath(cp))
			if err != nil {
				return err
			}
			if err := tenantusers.Rebind(cmd.Context(), cs, store, time.Now()); err != nil {
				return err
			}
			if reg != "" {
				if err := applyPullSecrets(cmd.Context(), out, cs, cp, reg); err != nil {
					return err
				}
			}
			fmt.Fprintln(out, "applied")
			return nil
		},
	}
	dirFlag(cmd, &dir)
	cmd.Flags().BoolVar(&prune, "prune", false, "delete, without asking, what earlier applies created and the file no longer lists")
	registryFlag(cmd, &registry)
	return cmd
}

func newTenantsDiffCommand() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "diff --dir DIR FILE",
		Short: "Print what apply would create, update and delete (server-side dry run); changes nothing",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			p, _, _, _, err := tenantPlan(cmd.Context(), dir, args[0])
			if err != nil {
				return err
			}
			printPlan(cmd.OutOrStdout(), p, true)
			return nil
		},
	}
	dirFlag(cmd, &dir)
	return cmd
}

func newTenantsStatusCommand() *cobra.Command {
	var dir, textfile string
	cmd := &cobra.Command{
		Use:   "status --dir DIR",
		Short: "Print each tenant's quota use against its quota (GPUs, CPU, memory, pods, storage) and, with queues, its queue's; --textfile writes gauges",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cp, cs, dyn, err := adminClients(dir)
			if err != nil {
				return err
			}
			us, err := tenants.Status(cmd.Context(), cs)
			if err != nil {
				return err
			}
			var queues map[string]tenants.QueueUsage
			if cp.Config.Queues.Enabled {
				if queues, err = tenants.QueueStatus(cmd.Context(), dyn); err != nil {
					return err
				}
			}
			printStatus(cmd.OutOrStdout(), us, queues)
			if textfile != "" {
				if err := prometheus.WriteToTextfile(textfile, tenants.Registry(us)); err != nil {
					return fmt.Errorf("write %s: %w", textfile, err)
				}
			}
			return nil
		},
	}
	dirFlag(cmd, &dir)
	cmd.Flags().StringVar(&textfile, "textfile", "", "also write the figures as Prometheus gauges to this file (node_exporter's textfile collector format)")
	return cmd
}

func printPlan(out io.Writer, p *tenants.Plan, all bool) {
	counts := map[tenants.Action]int{}
	for _, c := range p.Changes {
		counts[c.Action]++
		if c.Action == tenants.Unchanged && !all {
			continue
		}
		if c.Action == tenants.Delete {
			continue // listed with the question
		}
		fmt.Fprintf(out, "%-9s %s\n", c.Action, c.Object.Key())
	}
	if all {
		for _, c := range p.Deletions() {
			fmt.Fprintf(out, "%-9s %s\n", c.Action, c.Describe())
		}
	}
	fmt.Fprintf(out, "%d to create, %d to update, %d unchanged, %d to delete\n",
		counts[tenants.Create], counts[tenants.Update], counts[tenants.Unchanged], counts[tenants.Delete])
}

// printStatus writes the quota table; with queues (non-nil), a QUEUE column: the
// tenant's ClusterQueue's admitted and pending Workloads and GPUs held and borrowed.
func printStatus(out io.Writer, us []tenants.Usage, queues map[string]tenants.QueueUsage) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	head := "TENANT\tNAMESPACES\tGPUS\tCPU\tMEMORY\tPODS\tSTORAGE\tBY CLASS\tTIER GPUS"
	if queues != nil {
		head += "\tQUEUE"
	}
	fmt.Fprintln(tw, head)
	for _, u := range us {
		cell := func(name string) string {
			hard, ok := u.Hard[corev1.ResourceName(name)]
			used := u.Used[corev1.ResourceName(name)]
			if !ok {
				return "-"
			}
			return used.String() + "/" + hard.String()
		}
		var tiers []string
		for t, q := range u.TierGPUs {
			tiers = append(tiers, fmt.Sprintf("%s %s/%s", t, q[0].String(), q[1].String()))
		}
		sort.Strings(tiers)
		byClass := strings.Join(u.StorageClasses(), ", ")
		if byClass == "" {
			byClass = "-"
		}
		row := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", u.Tenant, strings.Join(u.Namespaces, ","),
			cell(string(tenants.QuotaGPU)), cell("requests.cpu"), cell("requests.memory"), cell("pods"), cell("requests.storage"),
			byClass, strings.Join(tiers, ", "))
		if queues != nil {
			q, ok := queues[u.Tenant]
			row += "\t" + map[bool]string{true: q.String(), false: "-"}[ok]
		}
		fmt.Fprintln(tw, row)
	}
	tw.Flush()
}

func newUsersCommand() *cobra.Command {
	cmd := &cobra.Command{Use: "users", Short: "Issue, list and revoke tenant users' kubeconfigs (client certificates)"}
	cmd.AddCommand(newUsersAddCommand(), newUsersListCommand(), newUsersRevokeCommand())
	return cmd
}

// userStorePath is where the control plane in cp keeps its tenant users' credentials.
func userStorePath(cp *controlplane.ControlPlane) string {
	return filepath.Join(cp.Layout.Dir, tenantusers.StoreFile)
}

func newUsersAddCommand() *cobra.Command {
	var dir, tenant, role, out, registry, workSize string
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "add --dir DIR NAME --tenant T --role user|admin [--ttl 720h] [--out FILE] [--registry HOST:PORT] [--work-size 50Gi]",
		Short: "Write a kubeconfig for NAME with a client certificate that has tenant T's role",
		Long: `add issues a client certificate from the cluster CA (CN NAME, groups
gpurack:user:NAME:ID and gpurack:tenant-cert:T:users|admins), binds the credential's own group
to the tenant's Role in each of its namespaces, records it in DIR/users/credentials.json and
writes the kubeconfig to --out (default NAME.kubeconfig). With the registry (cluster.yaml's
registry.enabled, or --registry) it also issues
the credential a password for the image registry (stored only as a hash) and writes it
beside the kubeconfig as NAME.registry-auth.json, a containers auth file for
skopeo --authfile.

When the cluster has the gpurack-shared StorageClass (storage.nfs in cluster.yaml),
NAME also gets a work directory: the PersistentVolumeClaim work-NAME (gpurack-shared,
ReadWriteMany, --work-size, labelled gpurack.io/tenant and gpurack.io/user) in the
tenant's namespace named like the tenant, or else its first by name. It counts against
the tenant's storage quota. A claim of that name that is there already is left as it
is; users revoke keeps it, with its data. --work-size 0 makes none. See docs/tenants.md.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			size, err := resource.ParseQuantity(workSize)
			if err != nil {
				return fmt.Errorf("--work-size %q: give a size such as %s, or 0 for no work directory", workSize, tenantusers.DefaultWorkSize)
			}
			cp, cs, _, err := adminClients(dir)
			if err != nil {
				return err
			}
			reg, err := registryAddress(registry, cp)
			if err != nil {
				return err
			}
			store, err := tenantusers.LoadStore(userStorePath(cp))
			if err != nil {
				return err
			}
			issued, err := tenantusers.Add(cmd.Context(), cs, cp.PKI, store, tenantusers.AddOptions{
				User: args[0], Tenant: tenant, Role: role, TTL: ttl,
				ClusterName: cp.Config.ClusterName, Server: cp.Config.EndpointURL(),
				WorkSize: size,
			})
			if err != nil {
				return err
			}
			kc, cred := issued.Kubeconfig, &issued.Credential
			if out == "" {
				out = args[0] + ".kubeconfig"
			}
			if err := atomicfile.WriteMkdirAll(out, kc, 0o600, 0o700); err != nil {
				return err
			}
			authFile := ""
			if reg != "" {
				if authFile, err = writeRegistryAuth(store, cred.ID, cred.User, out, reg); err != nil {
					return err
				}
			}
			if err := store.Save(userStorePath(cp)); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %s, %s of tenant %s, credential %s, serial %s, valid until %s\n",
				out, cred.User, cred.Role, cred.Tenant, cred.ID, cred.Serial, cred.NotAfter.Format(time.RFC3339))
			if authFile != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "wrote %s: %s's password for the registry %s, under %s/ (skopeo --authfile %s)\n",
					authFile, cred.User, reg, cred.Tenant, authFile)
			}
			fmt.Fprintln(cmd.OutOrStdout(), issued.Work.String())
			return nil
		},
	}
	dirFlag(cmd, &dir)
	cmd.Flags().StringVar(&tenant, "tenant", "", "the tenant (as named in tenants.yaml)")
	cmd.MarkFlagRequired("tenant")
	cmd.Flags().StringVar(&role, "role", tenantusers.RoleUser, "user or admin")
	cmd.Flags().DurationVar(&ttl, "ttl", tenantusers.DefaultTTL, "how long the certificate is valid")
	cmd.Flags().StringVar(&out, "out", "", "where to write the kubeconfig (default NAME.kubeconfig)")
	cmd.Flags().StringVar(&workSize, "work-size", tenantusers.DefaultWorkSize, "size of NAME's work directory, the gpurack-shared claim work-NAME; 0 for none")
	registryFlag(cmd, &registry)
	return cmd
}

func newUsersListCommand() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "list --dir DIR",
		Short: "List every credential issued, with its state (active, revoked, expired)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cp, err := controlplane.Open(dir)
			if err != nil {
				return err
			}
			store, err := tenantusers.LoadStore(userStorePath(cp))
			if err != nil {
				return err
			}
			now := time.Now()
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "USER\tTENANT\tROLE\tCREDENTIAL\tSERIAL\tEXPIRES\tSTATE")
			for _, c := range store.Credentials {
				state := c.State(now)
				if c.RevokedAt != nil {
					state += " " + c.RevokedAt.Format(time.RFC3339)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.User, c.Tenant, c.Role, c.ID, c.Serial, c.NotAfter.Format(time.RFC3339), state)
			}
			return tw.Flush()
		},
	}
	dirFlag(cmd, &dir)
	return cmd
}

func newUsersRevokeCommand() *cobra.Command {
	var dir string
	cmd := &cobra.Command{
		Use:   "revoke --dir DIR NAME",
		Short: "Remove every binding of NAME's credentials; waits until the apiserver denies them",
		Long: `revoke deletes every RoleBinding and ClusterRoleBinding that grants NAME's
credentials anything, marks them revoked in DIR/users/credentials.json and waits until
the apiserver denies them. NAME's work directory (the claim work-NAME that users add
made) is kept, with its data: delete it with kubectl delete pvc once its data is saved.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cp, cs, _, err := adminClients(dir)
			if err != nil {
				return err
			}
			store, err := tenantusers.LoadStore(userStorePath(cp))
			if err != nil {
				return err
			}
			deleted, err := tenantusers.Revoke(cmd.Context(), cs, store, args[0], time.Now())
			if saveErr := store.Save(userStorePath(cp)); saveErr != nil && err == nil {
				err = saveErr
			}
			for _, d := range deleted {
				fmt.Fprintf(cmd.OutOrStdout(), "deleted %s\n", d)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked %s: its certificates still authenticate but are granted nothing\n", args[0])
			work, err := tenantusers.WorkClaims(cmd.Context(), cs, args[0])
			if err != nil {
				return err
			}
			for _, w := range work {
				ns, name, _ := strings.Cut(w, "/")
				fmt.Fprintf(cmd.OutOrStdout(), "%s kept; delete it with kubectl delete pvc -n %s %s once its data is saved\n", name, ns, name)
			}
			return nil
		},
	}
	dirFlag(cmd, &dir)
	return cmd
}
