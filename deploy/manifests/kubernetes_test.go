package manifests

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/kustomize/api/krusty"
	kusttypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// newObject returns an empty typed object for an apiVersion and kind: the kinds
// deploy/kubernetes may hold.
func newObject(apiVersion, kind string) (any, bool) {
	switch apiVersion + " " + kind {
	case "v1 Namespace":
		return &corev1.Namespace{}, true
	case "v1 ServiceAccount":
		return &corev1.ServiceAccount{}, true
	case "v1 Service":
		return &corev1.Service{}, true
	case "v1 ConfigMap":
		return &corev1.ConfigMap{}, true
	case "v1 Secret":
		return &corev1.Secret{}, true
	case "apps/v1 StatefulSet":
		return &appsv1.StatefulSet{}, true
	case "apps/v1 Deployment":
		return &appsv1.Deployment{}, true
	case "batch/v1 Job":
		return &batchv1.Job{}, true
	case "batch/v1 CronJob":
		return &batchv1.CronJob{}, true
	case "policy/v1 PodDisruptionBudget":
		return &policyv1.PodDisruptionBudget{}, true
	case "networking.k8s.io/v1 NetworkPolicy":
		return &networkingv1.NetworkPolicy{}, true
	case "autoscaling/v2 HorizontalPodAutoscaler":
		return &autoscalingv2.HorizontalPodAutoscaler{}, true
	}
	return nil, false
}

// strictJSON decodes as the API server does in strict mode (kubectl --validate=strict):
// field names are case-sensitive, and an unknown or duplicate field is an error that
// names its path (spec.template.spec.containers[0].readinesProbe).
func strictJSON(j []byte, v any) error {
	strict, err := sigsjson.UnmarshalStrict(j, v, sigsjson.DisallowDuplicateFields, sigsjson.DisallowUnknownFields)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// decodeStrict decodes one YAML document into the k8s.io/api type its apiVersion and
// kind name.
func decodeStrict(doc []byte) (any, error) {
	j, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return nil, err
	}
	var tm metav1.TypeMeta
	if err := json.Unmarshal(j, &tm); err != nil {
		return nil, err
	}
	obj, ok := newObject(tm.APIVersion, tm.Kind)
	if !ok {
		return nil, fmt.Errorf("apiVersion %q kind %q is not a kind deploy/manifests knows (add it to newObject)", tm.APIVersion, tm.Kind)
	}
	if err := strictJSON(j, obj); err != nil {
		return nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	return obj, nil
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// splitDocs splits a multi-document YAML file, leaving out documents of comments only.
func splitDocs(b []byte) [][]byte {
	var out [][]byte
	for _, d := range docSeparator.Split(string(b), -1) {
		for _, l := range strings.Split(d, "\n") {
			if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
				out = append(out, []byte(d))
				break
			}
		}
	}
	return out
}

// placeholderSecrets stand in for the files an operator makes in secrets/: the test
// renders the kustomization with these, never with whatever a checkout holds there.
var placeholderSecrets = map[string]string{
	"secrets/clickhouse.env": "password=placeholder-not-a-secret\n",
	"secrets/audit.key":      "placeholder: not a key\n",
}

// kubeFiles reads deploy/kubernetes, leaving out secrets/ but its .gitignore.
func kubeFiles(t *testing.T) map[string][]byte {
	t.Helper()
	files := readTree(t, filepath.Join(repoRoot(t), "deploy", "kubernetes"))
	for k := range files {
		if strings.HasPrefix(k, "secrets/") && k != "secrets/.gitignore" {
			delete(files, k)
		}
	}
	return files
}

// render runs kustomize (its Go API, as `kustomize build` and `kubectl apply -k` do) on
// an in-memory copy of files plus the placeholder secrets, and decodes every object it
// outputs strictly.
func render(files map[string][]byte) ([]any, error) {
	fs := filesys.MakeFsInMemory()
	write := func(rel string, b []byte) error {
		p := "/bandplane/" + rel
		if err := fs.MkdirAll(path.Dir(p)); err != nil {
			return err
		}
		return fs.WriteFile(p, b)
	}
	for rel, b := range files {
		if err := write(rel, b); err != nil {
			return nil, err
		}
	}
	for rel, s := range placeholderSecrets {
		if err := write(rel, []byte(s)); err != nil {
			return nil, err
		}
	}
	rm, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(fs, "/bandplane")
	if err != nil {
		return nil, fmt.Errorf("kustomize build: %w", err)
	}
	var objs []any
	for _, r := range rm.Resources() {
		y, err := r.AsYAML()
		if err != nil {
			return nil, err
		}
		obj, err := decodeStrict(y)
		if err != nil {
			return nil, fmt.Errorf("rendered %s: %w", r.CurId(), err)
		}
		objs = append(objs, obj)
	}
	return objs, nil
}

// workload is a pod template of a StatefulSet, Deployment, Job or CronJob.
type workload struct {
	kind, name  string
	labels      labels.Set
	spec        corev1.PodSpec
	longRunning bool
}

func (w workload) String() string { return w.kind + " " + w.name }

// cluster is the rendered objects, by kind.
type cluster struct {
	namespaces      []*corev1.Namespace
	serviceAccounts map[string]*corev1.ServiceAccount
	configMaps      map[string]*corev1.ConfigMap
	secrets         map[string]*corev1.Secret
	services        []*corev1.Service
	statefulSets    []*appsv1.StatefulSet
	pdbs            []*policyv1.PodDisruptionBudget
	netpols         []*networkingv1.NetworkPolicy
	workloads       []workload
	namespaced      []metav1.Object
}

func newCluster(objs []any) *cluster {
	c := &cluster{serviceAccounts: map[string]*corev1.ServiceAccount{}, configMaps: map[string]*corev1.ConfigMap{}, secrets: map[string]*corev1.Secret{}}
	for _, o := range objs {
		if m, ok := o.(metav1.Object); ok {
			if _, isNS := o.(*corev1.Namespace); !isNS {
				c.namespaced = append(c.namespaced, m)
			}
		}
		switch o := o.(type) {
		case *corev1.Namespace:
			c.namespaces = append(c.namespaces, o)
		case *corev1.ServiceAccount:
			c.serviceAccounts[o.Name] = o
		case *corev1.ConfigMap:
			c.configMaps[o.Name] = o
		case *corev1.Secret:
			c.secrets[o.Name] = o
		case *corev1.Service:
			c.services = append(c.services, o)
		case *appsv1.StatefulSet:
			c.statefulSets = append(c.statefulSets, o)
			c.workloads = append(c.workloads, workload{"StatefulSet", o.Name, o.Spec.Template.Labels, o.Spec.Template.Spec, true})
		case *appsv1.Deployment:
			c.workloads = append(c.workloads, workload{"Deployment", o.Name, o.Spec.Template.Labels, o.Spec.Template.Spec, true})
		case *batchv1.Job:
			c.workloads = append(c.workloads, workload{"Job", o.Name, o.Spec.Template.Labels, o.Spec.Template.Spec, false})
		case *batchv1.CronJob:
			c.workloads = append(c.workloads, workload{"CronJob", o.Name, o.Spec.JobTemplate.Spec.Template.Labels, o.Spec.JobTemplate.Spec.Template.Spec, false})
		case *policyv1.PodDisruptionBudget:
			c.pdbs = append(c.pdbs, o)
		case *networkingv1.NetworkPolicy:
			c.netpols = append(c.netpols, o)
		}
	}
	return c
}

// selects: the workloads whose pods a label selector picks.
func (c *cluster) selects(sel labels.Selector) []workload {
	var out []workload
	for _, w := range c.workloads {
		if sel.Matches(w.labels) {
			out = append(out, w)
		}
	}
	return out
}

// env is a container's environment as the kubelet makes it: envFrom ConfigMaps first,
// then env, with $(VAR) expanded from what is defined before it. A value from a field
// or a secret is known only in the pod: it stays $(NAME), and so do references to it.
func (c *cluster) env(ct corev1.Container) map[string]string {
	out := map[string]string{}
	for _, ef := range ct.EnvFrom {
		if ef.ConfigMapRef != nil {
			if cm, ok := c.configMaps[ef.ConfigMapRef.Name]; ok {
				for k, v := range cm.Data {
					out[ef.Prefix+k] = v
				}
			}
		}
	}
	for _, e := range ct.Env {
		if e.ValueFrom != nil {
			out[e.Name] = "$(" + e.Name + ")"
			continue
		}
		out[e.Name] = expandEnv(e.Value, out)
	}
	return out
}

var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

func expandEnv(s string, vars map[string]string) string {
	return envRef.ReplaceAllStringFunc(s, func(m string) string {
		if v, ok := vars[m[2:len(m)-1]]; ok {
			return v
		}
		return m
	})
}

// portDeclared: a probe's or Service's port, by name or number, is one the container
// declares.
func portDeclared(ct corev1.Container, p intstr.IntOrString) bool {
	for _, cp := range ct.Ports {
		if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
			return true
		}
	}
	return false
}

func containerPort(ct corev1.Container, name string) string {
	for _, cp := range ct.Ports {
		if cp.Name == name {
			return strconv.Itoa(int(cp.ContainerPort))
		}
	}
	return ""
}

// egressAllows: some NetworkPolicy selecting the workload lets it out on port (TCP or
// UDP, by number).
func (c *cluster) egressAllows(w workload, port int32) bool {
	for _, np := range c.netpols {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil || !sel.Matches(w.labels) || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) {
			continue
		}
		for _, r := range np.Spec.Egress {
			if len(r.Ports) == 0 {
				return true
			}
			for _, p := range r.Ports {
				if p.Port != nil && p.Port.Type == intstr.Int && p.Port.IntVal == port {
					return true
				}
			}
		}
	}
	return false
}

// hostPorts are the ports of a comma-separated host:port list.
func hostPorts(list string) []int32 {
	var out []int32
	for _, a := range strings.Split(list, ",") {
		if n, err := strconv.Atoi(listenPort(strings.TrimSpace(a))); err == nil {
			out = append(out, int32(n))
		}
	}
	return out
}

// partitions is what a serve container's --partitions says, or serve's default.
func partitions(args []string) int {
	for i, a := range args {
		v, ok := strings.CutPrefix(a, "--partitions=")
		if !ok && a == "--partitions" && i+1 < len(args) {
			v, ok = args[i+1], true
		}
		if n, err := strconv.Atoi(v); ok && err == nil {
			return n
		}
	}
	return serveDefaultPartitions
}

// kustomizationProblems: kustomization.yaml decodes strictly, lists exactly the
// manifests of the folder, and its generators read files that exist or, for secrets,
// that git ignores.
func kustomizationProblems(t *testing.T, files map[string][]byte) (*kusttypes.Kustomization, []string) {
	var out []string
	add := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }
	var k kusttypes.Kustomization
	j, err := yaml.YAMLToJSONStrict(files["kustomization.yaml"])
	if err == nil {
		err = strictJSON(j, &k)
	}
	if err != nil {
		return nil, []string{"kustomization.yaml: " + err.Error()}
	}
	listed := map[string]bool{}
	for _, r := range k.Resources {
		listed[r] = true
		if _, ok := files[r]; !ok {
			add("kustomization.yaml lists %s, which does not exist", r)
		}
	}
	for _, f := range sortedKeys(files) {
		if !strings.Contains(f, "/") && (strings.HasSuffix(f, ".yaml") || strings.HasSuffix(f, ".yml")) && f != "kustomization.yaml" && !listed[f] {
			add("%s is not in kustomization.yaml's resources", f)
		}
	}
	source := func(s string) string {
		if _, p, ok := strings.Cut(s, "="); ok {
			return p
		}
		return s
	}
	for _, g := range k.ConfigMapGenerator {
		for _, f := range append(slices.Clone(g.EnvSources), g.FileSources...) {
			if _, ok := files[source(f)]; !ok {
				add("configMapGenerator %s reads %s, which does not exist", g.Name, source(f))
			}
		}
	}
	for _, g := range k.SecretGenerator {
		if len(g.LiteralSources) > 0 {
			add("secretGenerator %s has literals: secret values never go in kustomization.yaml", g.Name)
		}
		for _, f := range append(slices.Clone(g.EnvSources), g.FileSources...) {
			if !strings.HasPrefix(source(f), "secrets/") {
				add("secretGenerator %s reads %s, outside secrets/ (the folder git ignores)", g.Name, source(f))
			}
		}
	}
	if len(k.SecretGenerator) > 0 && !ignoresAll(t, files, "secrets") {
		add("secrets/.gitignore does not ignore every file of secrets/")
	}
	if k.Namespace == "" {
		add("kustomization.yaml sets no namespace")
	}
	return &k, out
}

// kubeProblems is everything the tests check of deploy/kubernetes, each problem one line.
func kubeProblems(t *testing.T, prog program, files map[string][]byte) []string {
	k, out := kustomizationProblems(t, files)
	if k == nil {
		return out
	}
	add := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }
	// Every manifest, as written, decodes strictly.
	for _, r := range k.Resources {
		for i, d := range splitDocs(files[r]) {
			if _, err := decodeStrict(d); err != nil {
				add("%s (document %d): %v", r, i+1, err)
			}
		}
	}
	objs, err := render(files)
	if err != nil {
		return append(out, err.Error())
	}
	c := newCluster(objs)

	if len(c.namespaces) != 1 || c.namespaces[0].Name != k.Namespace {
		add("want the Namespace %s among the manifests", k.Namespace)
	}
	for _, o := range c.namespaced {
		if o.GetNamespace() != k.Namespace {
			add("%s is in namespace %q, not %q", o.GetName(), o.GetNamespace(), k.Namespace)
		}
	}
	for _, w := range c.workloads {
		out = append(out, c.workloadProblems(prog, w, k.Namespace)...)
	}
	for _, ss := range c.statefulSets {
		out = append(out, c.statefulSetProblems(ss)...)
	}
	for _, s := range c.services {
		if len(s.Spec.Selector) == 0 {
			add("Service %s has no selector", s.Name)
			continue
		}
		picked := c.selects(labels.SelectorFromSet(s.Spec.Selector))
		if len(picked) == 0 {
			add("Service %s selects no pod", s.Name)
		}
		for _, w := range picked {
			for _, p := range s.Spec.Ports {
				ok := false
				for _, ct := range w.spec.Containers {
					ok = ok || portDeclared(ct, p.TargetPort)
				}
				if !ok {
					add("Service %s port %s: target port %s is not a port %s declares", s.Name, p.Name, p.TargetPort.String(), w)
				}
			}
		}
	}
	for _, w := range c.workloads {
		if !w.longRunning {
			continue
		}
		covered := false
		for _, pdb := range c.pdbs {
			sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
			covered = covered || (err == nil && sel.Matches(w.labels))
		}
		if !covered {
			add("%s: no PodDisruptionBudget selects its pods", w)
		}
	}
	for _, pdb := range c.pdbs {
		sel, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || len(c.selects(sel)) == 0 {
			add("PodDisruptionBudget %s selects no pod", pdb.Name)
		}
		if pdb.Spec.MaxUnavailable == nil && pdb.Spec.MinAvailable == nil {
			add("PodDisruptionBudget %s sets neither maxUnavailable nor minAvailable", pdb.Name)
		}
	}
	out = append(out, c.networkPolicyProblems()...)
	return out
}

func (c *cluster) workloadProblems(prog program, w workload, namespace string) []string {
	var out []string
	add := func(format string, a ...any) { out = append(out, fmt.Sprintf("%s: %s", w, fmt.Sprintf(format, a...))) }
	ps := w.spec
	if ps.SecurityContext == nil || ps.SecurityContext.RunAsNonRoot == nil || !*ps.SecurityContext.RunAsNonRoot {
		add("the pod does not set runAsNonRoot: true")
	}
	if ps.SecurityContext == nil || ps.SecurityContext.SeccompProfile == nil || ps.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		add("the pod does not set the RuntimeDefault seccomp profile")
	}
	if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		add("the pod mounts a service account token it has no use for")
	}
	if _, ok := c.serviceAccounts[ps.ServiceAccountName]; ps.ServiceAccountName != "" && !ok {
		add("service account %s does not exist", ps.ServiceAccountName)
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range ps.Volumes {
		volumes[v.Name] = v
		if v.Secret != nil {
			if _, ok := c.secrets[v.Secret.SecretName]; !ok {
				add("volume %s: Secret %s does not exist", v.Name, v.Secret.SecretName)
			}
		}
	}
	for _, ct := range ps.Containers {
		cadd := func(format string, a ...any) { add("container %s: %s", ct.Name, fmt.Sprintf(format, a...)) }
		if pr := imageProblem(ct.Image, false); pr != "" {
			cadd("%s", pr)
		}
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			if q, ok := ct.Resources.Requests[r]; !ok || q.IsZero() {
				cadd("no %s request", r)
			}
			if q, ok := ct.Resources.Limits[r]; !ok || q.IsZero() {
				cadd("no %s limit", r)
			}
		}
		sc := ct.SecurityContext
		if sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			cadd("the root file system is not read-only (readOnlyRootFilesystem: true)")
		}
		if sc == nil || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			cadd("allowPrivilegeEscalation is not false")
		}
		if sc == nil || sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") {
			cadd("capabilities are not all dropped")
		}
		for _, m := range ct.VolumeMounts {
			if _, ok := volumes[m.Name]; !ok {
				cadd("volume mount %s names no volume of the pod", m.Name)
			}
		}
		for _, pr := range prog.flagProblems(ct.Args) {
			cadd("%s", pr)
		}
		for _, ef := range ct.EnvFrom {
			if ef.ConfigMapRef != nil {
				if _, ok := c.configMaps[ef.ConfigMapRef.Name]; !ok {
					cadd("envFrom: ConfigMap %s does not exist", ef.ConfigMapRef.Name)
				}
			}
			if ef.SecretRef != nil {
				if _, ok := c.secrets[ef.SecretRef.Name]; !ok {
					cadd("envFrom: Secret %s does not exist", ef.SecretRef.Name)
				}
			}
		}
		defined := map[string]bool{}
		for _, e := range ct.Env {
			for _, m := range envRef.FindAllStringSubmatch(e.Value, -1) {
				if !defined[m[1]] {
					cadd("%s refers to $(%s), which is not defined before it", e.Name, m[1])
				}
			}
			defined[e.Name] = true
			if e.ValueFrom == nil {
				continue
			}
			if r := e.ValueFrom.SecretKeyRef; r != nil {
				if s, ok := c.secrets[r.Name]; !ok {
					cadd("%s: Secret %s does not exist", e.Name, r.Name)
				} else if _, ok := s.Data[r.Key]; !ok {
					cadd("%s: Secret %s has no key %s", e.Name, r.Name, r.Key)
				}
			}
			if r := e.ValueFrom.ConfigMapKeyRef; r != nil {
				if cm, ok := c.configMaps[r.Name]; !ok {
					cadd("%s: ConfigMap %s does not exist", e.Name, r.Name)
				} else if _, ok := cm.Data[r.Key]; !ok {
					cadd("%s: ConfigMap %s has no key %s", e.Name, r.Name, r.Key)
				}
			}
		}
		env := c.env(ct)
		for _, name := range sortedKeys(env) {
			if pr := prog.envProblem(name); pr != "" {
				cadd("%s", pr)
			}
		}
		if key := env["BANDPLANE_AUDIT_KEY"]; key != "" && slices.Contains(ct.Args, "serve") {
			ok := false
			for _, m := range ct.VolumeMounts {
				v := volumes[m.Name]
				if v.Secret != nil && path.Dir(key) == path.Clean(m.MountPath) {
					_, ok = c.secrets[v.Secret.SecretName].Data[path.Base(key)]
				}
			}
			if !ok {
				cadd("BANDPLANE_AUDIT_KEY %s is no key of a Secret mounted at %s", key, path.Dir(key))
			}
		}
		if !w.longRunning {
			continue
		}
		for _, p := range []struct {
			name  string
			probe *corev1.Probe
			want  string
		}{{"startupProbe", ct.StartupProbe, "/healthz"}, {"readinessProbe", ct.ReadinessProbe, "/readyz"}, {"livenessProbe", ct.LivenessProbe, "/healthz"}} {
			if p.probe == nil || p.probe.HTTPGet == nil {
				cadd("no %s (HTTP GET %s)", p.name, p.want)
				continue
			}
			if p.probe.HTTPGet.Path != p.want {
				cadd("%s asks %s, want %s", p.name, p.probe.HTTPGet.Path, p.want)
			}
			if !portDeclared(ct, p.probe.HTTPGet.Port) {
				cadd("%s port %s is not a port the container declares", p.name, p.probe.HTTPGet.Port.String())
			}
		}
		for _, l := range []struct{ env, port string }{{"BANDPLANE_LISTEN", "http"}, {"BANDPLANE_METRICS_LISTEN", "metrics"}} {
			if got, want := listenPort(env[l.env]), containerPort(ct, l.port); got != want {
				cadd("%s listens on port %q, the container's port %s is %q", l.env, got, l.port, want)
			}
		}
		// What serve must reach: ClickHouse, Kafka, DNS.
		for _, port := range append(append(hostPorts(env["BANDPLANE_CLICKHOUSE"]), hostPorts(env["BANDPLANE_KAFKA"])...), 53) {
			if !c.egressAllows(w, port) {
				cadd("no NetworkPolicy lets it out to port %d", port)
			}
		}
	}
	if !w.longRunning {
		// A migrate job: ClickHouse and DNS only.
		for _, ct := range ps.Containers {
			env := c.env(ct)
			for _, port := range append(hostPorts(env["BANDPLANE_CLICKHOUSE"]), 53) {
				if !c.egressAllows(w, port) {
					add("no NetworkPolicy lets it out to port %d", port)
				}
			}
		}
	}
	return out
}

// statefulSetProblems: the StatefulSet's pods are the policy peers, by their stable
// names behind its headless Service, and no more of them ingest than there are partitions.
func (c *cluster) statefulSetProblems(ss *appsv1.StatefulSet) []string {
	var out []string
	add := func(format string, a ...any) {
		out = append(out, fmt.Sprintf("StatefulSet %s: %s", ss.Name, fmt.Sprintf(format, a...)))
	}
	sel, err := metav1.LabelSelectorAsSelector(ss.Spec.Selector)
	if err != nil || !sel.Matches(labels.Set(ss.Spec.Template.Labels)) {
		add("its selector does not select its own pod template")
	}
	var governing *corev1.Service
	for _, s := range c.services {
		if s.Name == ss.Spec.ServiceName {
			governing = s
		}
	}
	switch {
	case governing == nil:
		add("serviceName %s is not a Service", ss.Spec.ServiceName)
	case governing.Spec.ClusterIP != corev1.ClusterIPNone:
		add("serviceName %s is not headless (clusterIP: None)", governing.Name)
	case !labels.SelectorFromSet(governing.Spec.Selector).Matches(labels.Set(ss.Spec.Template.Labels)):
		add("its Service %s does not select its pods", governing.Name)
	}
	replicas := 1
	if ss.Spec.Replicas != nil {
		replicas = int(*ss.Spec.Replicas)
	}
	for _, ct := range ss.Spec.Template.Spec.Containers {
		if !slices.Contains(ct.Args, "serve") {
			continue
		}
		if n := partitions(ct.Args); replicas > n {
			add("%d replicas share the ingest consumer group of a topic with %d partitions: the ones beyond get none", replicas, n)
		}
		env := c.env(ct)
		peers := strings.Split(env["BANDPLANE_POLICY_PEERS"], ",")
		if len(peers) != replicas {
			add("BANDPLANE_POLICY_PEERS lists %d peers for %d replicas", len(peers), replicas)
		}
		for i := 0; i < replicas; i++ {
			pod := fmt.Sprintf("%s-%d", ss.Name, i)
			self := expandEnv(env["BANDPLANE_POLICY_SELF"], map[string]string{"POD_NAME": pod, "POD_NAMESPACE": ss.Namespace})
			u, err := url.Parse(self)
			host := fmt.Sprintf("%s.%s.%s.svc.cluster.local", pod, ss.Spec.ServiceName, ss.Namespace)
			if err != nil || u.Hostname() != host || u.Port() != containerPort(ct, "http") {
				add("pod %s names itself %q, want http://%s:%s", pod, self, host, containerPort(ct, "http"))
			}
			if i >= len(peers) || strings.TrimSpace(peers[i]) != self {
				add("BANDPLANE_POLICY_PEERS does not have pod %s (%s) as peer %d", pod, self, i)
			}
		}
		for _, e := range ct.Env {
			if e.Name == "POD_NAME" || e.Name == "POD_NAMESPACE" {
				want := map[string]string{"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}[e.Name]
				if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != want {
					add("%s is not the pod's %s", e.Name, want)
				}
			}
		}
	}
	return out
}

// networkPolicyProblems: a default deny first; every other policy, and every pod
// selector in its rules, picks pods that exist; named ports are the picked pods'.
func (c *cluster) networkPolicyProblems() []string {
	var out []string
	add := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }
	deny := false
	for _, np := range c.netpols {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil {
			add("NetworkPolicy %s: %v", np.Name, err)
			continue
		}
		if sel.Empty() {
			deny = deny || (len(np.Spec.Ingress) == 0 && len(np.Spec.Egress) == 0 && len(np.Spec.PolicyTypes) == 2)
			continue
		}
		picked := c.selects(sel)
		if len(picked) == 0 {
			add("NetworkPolicy %s selects no pod", np.Name)
		}
		peersExist := func(peers []networkingv1.NetworkPolicyPeer) {
			for _, p := range peers {
				if p.PodSelector == nil || p.NamespaceSelector != nil || p.IPBlock != nil {
					continue // another namespace's pods, or addresses: not ours to check
				}
				ps, err := metav1.LabelSelectorAsSelector(p.PodSelector)
				if err != nil || len(c.selects(ps)) == 0 {
					add("NetworkPolicy %s: a rule's podSelector %s picks no pod of the namespace", np.Name, metav1.FormatLabelSelector(p.PodSelector))
				}
			}
		}
		for _, r := range np.Spec.Ingress {
			peersExist(r.From)
			for _, p := range r.Ports {
				if p.Port == nil || p.Port.Type != intstr.String {
					continue
				}
				for _, w := range picked {
					ok := false
					for _, ct := range w.spec.Containers {
						ok = ok || portDeclared(ct, *p.Port)
					}
					if !ok {
						add("NetworkPolicy %s: ingress port %s is not a port %s declares", np.Name, p.Port.StrVal, w)
					}
				}
			}
		}
		for _, r := range np.Spec.Egress {
			peersExist(r.To)
		}
	}
	if !deny {
		add("no default-deny NetworkPolicy (empty podSelector, Ingress and Egress, no rules)")
	}
	return out
}

func TestKubernetesManifests(t *testing.T) {
	prog := readProgram(t, repoRoot(t))
	files := kubeFiles(t)
	require.Empty(t, kubeProblems(t, prog, files))
	for name, b := range files {
		assert.False(t, secretLooking.Match(b), "%s holds what looks like a token or a private key", name)
	}
	// The rendering holds what the brief of deploy/kubernetes asks for.
	objs, err := render(files)
	require.NoError(t, err)
	c := newCluster(objs)
	assert.Len(t, c.statefulSets, 1)
	assert.NotEmpty(t, c.pdbs)
	assert.GreaterOrEqual(t, len(c.netpols), 2)
	kinds := map[string]bool{}
	for _, w := range c.workloads {
		kinds[w.kind] = true
	}
	assert.True(t, kinds["Job"], "no migrate Job")
	for _, s := range c.secrets {
		for k, v := range s.Data {
			assert.True(t, strings.Contains(string(v), "placeholder"), "Secret %s key %s is not one of the test's placeholders", s.Name, k)
		}
	}
}

// TestKubernetesBrokenCopiesFail breaks one thing at a time in a copy of
// deploy/kubernetes: each must fail, saying where.
func TestKubernetesBrokenCopiesFail(t *testing.T) {
	prog := readProgram(t, repoRoot(t))
	files := kubeFiles(t)
	for _, c := range []struct {
		name, file, old, new string
		want                 []string
	}{
		{"typo'd field", "statefulset.yaml", "          readinessProbe:", "          readinesProbe:",
			[]string{`statefulset.yaml (document 1): StatefulSet: unknown field "spec.template.spec.containers[0].readinesProbe"`}},
		{"field in the wrong case", "statefulset.yaml", "              containerPort: 8080", "              containerport: 8080",
			[]string{`unknown field "spec.template.spec.containers[0].ports[0].containerport"`}},
		{"wrong type", "statefulset.yaml", "  replicas: 3", "  replicas: three", []string{"spec.replicas"}},
		{"duplicate key", "services.yaml", "  type: ClusterIP\n", "  type: ClusterIP\n  type: NodePort\n", []string{"services.yaml (document 1)", `"type"`}},
		{"typo'd kustomization key", "kustomization.yaml", "configMapGenerator:", "configMapGenerators:", []string{"kustomization.yaml", "configMapGenerators"}},
		{"Service selecting nothing", "services.yaml", "  type: ClusterIP\n  selector:\n    app.kubernetes.io/name: bandplane\n    app.kubernetes.io/component: serve",
			"  type: ClusterIP\n  selector:\n    app.kubernetes.io/name: bandplane\n    app.kubernetes.io/component: sever", []string{"Service bandplane selects no pod"}},
		{"Service on an undeclared port", "services.yaml", "    - name: metrics\n      port: 9090\n      targetPort: metrics", "    - name: metrics\n      port: 9090\n      targetPort: metric",
			[]string{"Service bandplane-peers port metrics: target port metric is not a port StatefulSet bandplane declares"}},
		{"PodDisruptionBudget on other pods", "pdb.yaml", "      app.kubernetes.io/component: serve", "      app.kubernetes.io/component: migrate",
			[]string{"StatefulSet bandplane: no PodDisruptionBudget selects its pods"}},
		{"probe on an undeclared port", "statefulset.yaml", "              path: /readyz\n              port: http", "              path: /readyz\n              port: web",
			[]string{"container bandplane: readinessProbe port web is not a port the container declares"}},
		{"readiness on the liveness path", "statefulset.yaml", "              path: /readyz", "              path: /healthz", []string{"readinessProbe asks /healthz, want /readyz"}},
		{"unknown variable", "config.env", "BANDPLANE_LOG_LEVEL=info", "BANDPLANE_LOGLEVEL=info", []string{"BANDPLANE_LOGLEVEL is not a variable cmd/bandplane reads"}},
		{"listen port not the container's", "config.env", "BANDPLANE_LISTEN=0.0.0.0:8080", "BANDPLANE_LISTEN=0.0.0.0:8000",
			[]string{`BANDPLANE_LISTEN listens on port "8000", the container's port http is "8080"`}},
		{"peers out of step with replicas", "statefulset.yaml", "  replicas: 3", "  replicas: 2", []string{"BANDPLANE_POLICY_PEERS lists 3 peers for 2 replicas"}},
		{"more replicas than partitions", "statefulset.yaml", "--partitions=4", "--partitions=2", []string{"3 replicas share the ingest consumer group of a topic with 2 partitions"}},
		{"unknown flag", "statefulset.yaml", "--partitions=4", "--partition=4", []string{"flag --partition=4 is not a flag cmd/bandplane defines"}},
		{"missing secret key", "statefulset.yaml", "                  key: password", "                  key: passwd", []string{"BANDPLANE_CLICKHOUSE_PASSWORD: Secret bandplane-clickhouse-", "has no key passwd"}},
		{"writable root file system", "statefulset.yaml", "readOnlyRootFilesystem: true", "readOnlyRootFilesystem: false", []string{"container bandplane: the root file system is not read-only"}},
		{"manifest left out", "kustomization.yaml", "  - pdb.yaml\n", "", []string{"pdb.yaml is not in kustomization.yaml's resources"}},
		{"manifest that does not exist", "kustomization.yaml", "  - pdb.yaml\n", "  - pdb.yaml\n  - hpa.yaml\n", []string{"kustomization.yaml lists hpa.yaml, which does not exist"}},
		{"NetworkPolicy for no pod", "networkpolicy.yaml", "      app.kubernetes.io/component: migrate\n  policyTypes", "      app.kubernetes.io/component: migrat\n  policyTypes",
			[]string{"NetworkPolicy bandplane-migrate selects no pod", "Job bandplane-migrate: no NetworkPolicy lets it out to port 9000"}},
		{"no way to Kafka", "networkpolicy.yaml", "        - port: 9092", "        - port: 9093", []string{"container bandplane: no NetworkPolicy lets it out to port 9092"}},
		{"secret literal", "kustomization.yaml", "    envs:\n      - secrets/clickhouse.env", "    literals:\n      - password=hunter2",
			[]string{"secretGenerator bandplane-clickhouse has literals"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			problems := kubeProblems(t, prog, mutate(t, files, c.file, c.old, c.new))
			require.NotEmpty(t, problems)
			all := strings.Join(problems, "\n")
			for _, w := range c.want {
				assert.Contains(t, all, w)
			}
		})
	}
}

func TestSplitDocs(t *testing.T) {
	docs := splitDocs([]byte("# only a comment\n---\na: 1\n---\n\n---\nb: 2\n--- \n# c\n"))
	require.Len(t, docs, 2)
	assert.True(t, bytes.Contains(docs[0], []byte("a: 1")))
	assert.True(t, bytes.Contains(docs[1], []byte("b: 2")))
}
