package manifests

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/interpolation"
	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/schema"
	"github.com/compose-spec/compose-go/v2/template"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"
)

// composeProject is the part of a Compose file the cross-reference checks read, after
// the schema has validated the whole. It takes the forms deploy/compose uses (mapping
// environment and depends_on, short volume syntax, list commands): another form fails
// to decode, which the error says.
type composeProject struct {
	Services map[string]composeService  `json:"services"`
	Volumes  map[string]json.RawMessage `json:"volumes"`
	Secrets  map[string]struct {
		File string `json:"file"`
	} `json:"secrets"`
}

type composeService struct {
	Image string `json:"image"`
	Build *struct {
		Context    string `json:"context"`
		Dockerfile string `json:"dockerfile"`
	} `json:"build"`
	Command     []string       `json:"command"`
	Entrypoint  []string       `json:"entrypoint"`
	Environment map[string]any `json:"environment"`
	Volumes     []string       `json:"volumes"`
	Secrets     []string       `json:"secrets"`
	DependsOn   map[string]struct {
		Condition string `json:"condition"`
	} `json:"depends_on"`
	Healthcheck *struct {
		Test    []string `json:"test"`
		Disable bool     `json:"disable"`
	} `json:"healthcheck"`
	Restart  string `json:"restart"`
	Hostname string `json:"hostname"`
}

func (s composeService) env(name string) string {
	v, ok := s.Environment[name]
	if !ok || v == nil {
		return ""
	}
	return fmt.Sprint(v)
}

func (s composeService) healthy() bool {
	return s.Healthcheck != nil && !s.Healthcheck.Disable && len(s.Healthcheck.Test) > 0
}

// oneShot services run to completion (migrate, key bootstrap): restart "no".
func (s composeService) oneShot() bool { return s.Restart == "no" }

// mount is one short-syntax volume entry: SOURCE:TARGET[:MODE].
type mount struct{ source, target, mode string }

func (s composeService) mounts() []mount {
	var out []mount
	for _, v := range s.Volumes {
		p := strings.SplitN(v, ":", 3)
		m := mount{source: p[0]}
		if len(p) > 1 {
			m.target = p[1]
		}
		if len(p) > 2 {
			m.mode = p[2]
		}
		out = append(out, m)
	}
	return out
}

func (m mount) bind() bool {
	return strings.HasPrefix(m.source, ".") || strings.HasPrefix(m.source, "/")
}

// composeGo is the version of github.com/compose-spec/compose-go/v2 that go.mod requires
// (a test binary's build information lists no dependencies): its schema package embeds
// the Compose Specification's JSON schema, and its loader is what `docker compose config`
// runs.
func composeGo(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "go.mod"))
	require.NoError(t, err)
	m := regexp.MustCompile(`(?m)^\s*(?:require\s+)?github\.com/compose-spec/compose-go/v2 (v\S+)`).FindSubmatch(b)
	require.NotNil(t, m, "go.mod does not require github.com/compose-spec/compose-go/v2")
	assert.NotRegexp(t, `(?m)^\s*(?:replace\s+)?github\.com/compose-spec/compose-go/v2\b.*=>`, string(b), "go.mod replaces compose-go")
	return string(m[1])
}

// placeholder is the value every variable compose.yaml interpolates without a default
// gets when compose-go loads it: the test checks the file, not an environment.
const placeholder = "placeholder"

// loadCompose checks a Compose file the way Compose does and decodes the part the
// cross-reference checks read. First compose-go's schema package validates the file as
// written (YAML anchors and merge keys resolved) against the Compose Specification's JSON
// schema it embeds; an error there ends the checks. Then compose-go's loader loads it as
// `docker compose config` does (parsing with its own YAML library, which refuses a key
// given twice in one mapping but not one that overrides a merge key; interpolation, with
// a placeholder for every variable the file reads; validation after interpolation,
// normalization and its consistency checks), without a container engine, the
// environment's variables or the secret files. What the loader refuses, and every way its
// model differs from what the cross-reference checks decode, is returned in problems, so
// the cross-reference checks still run on a file it refuses.
func loadCompose(t *testing.T, dir string, raw []byte) (p composeProject, problems []string, err error) {
	t.Helper()
	j, err := yaml.YAMLToJSON(raw)
	if err != nil {
		return p, nil, fmt.Errorf("cannot read compose.yaml as YAML: %w", err)
	}
	var doc map[string]any
	if err := json.Unmarshal(j, &doc); err != nil {
		return p, nil, fmt.Errorf("compose.yaml is not a mapping: %w", err)
	}
	version := composeGo(t)
	if err := schema.Validate(doc); err != nil {
		return p, nil, fmt.Errorf("compose.yaml does not follow the Compose Specification (compose-go %s's schema): %w", version, err)
	}
	env := types.Mapping{}
	for name, v := range template.ExtractVariables(doc, nil) {
		if v.DefaultValue == "" {
			env[name] = placeholder
		}
	}
	// The cross-reference checks read the values Compose runs: $$ is a $.
	interpolated, err := interpolation.Interpolate(doc, interpolation.Options{LookupValue: env.Resolve})
	if err != nil {
		return p, nil, fmt.Errorf("compose.yaml: compose-go %s cannot interpolate it: %w", version, err)
	}
	if j, err = json.Marshal(interpolated); err != nil {
		return p, nil, err
	}
	if err := json.Unmarshal(j, &p); err != nil {
		return p, nil, fmt.Errorf("cannot decode compose.yaml for the cross-reference checks (the test reads the mapping form of environment and depends_on, short volume syntax, list commands): %w", err)
	}

	project, err := loader.LoadWithContext(context.Background(), types.ConfigDetails{
		WorkingDir:  dir,
		ConfigFiles: []types.ConfigFile{{Filename: filepath.Join(dir, "compose.yaml"), Content: raw}},
		Environment: env,
	}, func(o *loader.Options) {
		// The name when the file gives none, as `docker compose -p` would; name: wins.
		o.SetProjectName("bandplane", false)
		// No env_file is read, and no variable of this machine leaks in.
		o.SkipResolveEnvironment = true
	})
	if err != nil {
		return p, []string{fmt.Sprintf("compose-go %s's loader (docker compose config) refuses compose.yaml: %v", version, err)}, nil
	}
	return p, modelDifferences(dir, p, project), nil
}

// modelDifferences compares what the cross-reference checks decoded with compose-go's
// model of the same file, so that they read what Compose runs (the two YAML libraries
// resolve anchors and merge keys alike).
func modelDifferences(dir string, p composeProject, project *types.Project) []string {
	var out []string
	differ := func(what string, ours, compose any) {
		if fmt.Sprint(ours) != fmt.Sprint(compose) {
			out = append(out, fmt.Sprintf("%s: the cross-reference checks read %v, compose-go %v", what, ours, compose))
		}
	}
	differ("services", sortedKeys(p.Services), sortedKeys(project.Services))
	differ("volumes", sortedKeys(p.Volumes), sortedKeys(project.Volumes))
	differ("secrets", sortedKeys(p.Secrets), sortedKeys(project.Secrets))
	for _, name := range sortedKeys(p.Secrets) {
		if s, ok := project.Secrets[name]; ok {
			differ("secret "+name+" file", filepath.Join(dir, p.Secrets[name].File), s.File)
		}
	}
	for _, name := range sortedKeys(p.Services) {
		c, ok := project.Services[name]
		if !ok {
			continue
		}
		s := p.Services[name]
		differ(name+": image", s.Image, c.Image)
		differ(name+": build", s.Build != nil, c.Build != nil)
		differ(name+": command", s.Command, []string(c.Command))
		differ(name+": entrypoint", s.Entrypoint, []string(c.Entrypoint))
		differ(name+": restart", s.Restart, c.Restart)
		differ(name+": hostname", s.Hostname, c.Hostname)
		env := map[string]string{}
		for k, v := range c.Environment {
			if v != nil {
				env[k] = *v
			}
		}
		ours := map[string]string{}
		for k := range s.Environment {
			ours[k] = s.env(k)
		}
		differ(name+": environment", ours, env)
		deps := map[string]string{}
		for k, d := range c.DependsOn {
			deps[k] = d.Condition
		}
		ourDeps := map[string]string{}
		for k, d := range s.DependsOn {
			ourDeps[k] = d.Condition
		}
		differ(name+": depends_on", ourDeps, deps)
		var secrets, targets, ourTargets []string
		for _, sec := range c.Secrets {
			secrets = append(secrets, sec.Source)
		}
		differ(name+": secrets", s.Secrets, secrets)
		for _, v := range c.Volumes {
			targets = append(targets, v.Target)
		}
		for _, m := range s.mounts() {
			ourTargets = append(ourTargets, m.target)
		}
		differ(name+": volume targets", ourTargets, targets)
		hc := c.HealthCheck
		differ(name+": has a health check", s.healthy(), hc != nil && !hc.Disable && len(hc.Test) > 0 && hc.Test[0] != "NONE")
	}
	return out
}

var secretName = regexp.MustCompile(`PASSWORD|SECRET|TOKEN|_KEY$`)

// composeProblems checks what the schema cannot (compose-go's loader checks some of it
// too, in its own words, and stops at the first problem): that what one part of the file names
// exists (services, volumes, secrets, files of the repository), that every long-running
// service has a health check, images are pinned, no secret is written inline, every
// BANDPLANE_* variable and flag is bandplane's, and that the serve replicas agree on
// their ports, peers and audit key. dir is compose.yaml's folder, files its contents.
func composeProblems(t *testing.T, prog program, root, dir string, files map[string][]byte, p composeProject) []string {
	var out []string
	add := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }
	usedVolumes, usedSecrets := map[string]bool{}, map[string]bool{}
	writers := map[string]bool{} // named volumes a one-shot service writes
	selves := map[string]bool{}
	peerLists := map[string]bool{}
	var auditVolumes []string

	for _, name := range sortedKeys(p.Services) {
		s := p.Services[name]
		built := s.Build != nil
		if s.Image == "" {
			add("%s: no image", name)
		} else if pr := imageProblem(s.Image, built); pr != "" {
			add("%s: %s", name, pr)
		}
		if built {
			ctx := filepath.Join(dir, s.Build.Context)
			df := s.Build.Dockerfile
			if df == "" {
				df = "Dockerfile"
			}
			if st, err := os.Stat(ctx); err != nil || !st.IsDir() {
				add("%s: build context %s is not a folder", name, s.Build.Context)
			} else if _, err := os.Stat(filepath.Join(ctx, df)); err != nil {
				add("%s: Dockerfile %s does not exist in the build context %s", name, df, s.Build.Context)
			}
			for _, pr := range prog.flagProblems(s.Command) {
				add("%s: %s", name, pr)
			}
		}
		if !s.oneShot() {
			if s.Restart == "" {
				add("%s: a long-running service without a restart policy", name)
			}
			if !s.healthy() {
				add("%s: a long-running service without a health check", name)
			}
		}
		for _, dep := range sortedKeys(s.DependsOn) {
			d, ok := p.Services[dep]
			if !ok {
				add("%s depends on %s, which is not a service", name, dep)
				continue
			}
			switch cond := s.DependsOn[dep].Condition; cond {
			case "service_healthy":
				if !d.healthy() {
					add("%s waits for %s to be healthy, and %s has no health check", name, dep, dep)
				}
			case "service_completed_successfully":
				if !d.oneShot() {
					add("%s waits for %s to complete, and %s is not a one-shot service (restart: \"no\")", name, dep, dep)
				}
			default:
				add("%s depends on %s with condition %q: wait for health or completion", name, dep, cond)
			}
		}
		for _, m := range s.mounts() {
			switch {
			case m.target == "":
				add("%s: volume %q has no target", name, m.source)
			case strings.HasPrefix(m.source, "/"):
				add("%s: bind mount %s is an absolute host path: mount from the repository", name, m.source)
			case m.bind():
				host := filepath.Join(dir, m.source)
				rel, err := filepath.Rel(root, host)
				if err != nil || strings.HasPrefix(rel, "..") {
					add("%s: bind mount %s is outside the repository", name, m.source)
				} else if _, err := os.Stat(host); err != nil {
					add("%s: bind-mounted %s does not exist in the repository (%s)", name, m.source, filepath.ToSlash(rel))
				}
				if m.mode != "ro" {
					add("%s: bind mount %s of the repository is not read-only (:ro)", name, m.source)
				}
			default:
				usedVolumes[m.source] = true
				if _, ok := p.Volumes[m.source]; !ok {
					add("%s: volume %s is not declared under volumes", name, m.source)
				}
				if s.oneShot() && m.mode != "ro" {
					writers[m.source] = true
				}
			}
		}
		for _, sec := range s.Secrets {
			usedSecrets[sec] = true
			if _, ok := p.Secrets[sec]; !ok {
				add("%s: secret %s is not declared under secrets", name, sec)
			}
		}
		for _, k := range sortedKeys(s.Environment) {
			if pr := prog.envProblem(k); pr != "" {
				add("%s: %s", name, pr)
			}
			if v := s.env(k); secretName.MatchString(k) && v != "" && !strings.HasPrefix(v, "/") {
				add("%s: %s holds a value instead of naming a file: secrets come from Compose secrets or volumes", name, k)
			}
		}
		if !built || len(s.Command) == 0 || s.Command[0] != "serve" {
			continue
		}
		// A bandplane serve replica.
		port := listenPort(s.env("BANDPLANE_LISTEN"))
		if port == "" {
			add("%s: BANDPLANE_LISTEN is not host:port", name)
		}
		if s.healthy() {
			test := strings.Join(s.Healthcheck.Test, " ")
			for _, path := range []string{"/healthz", "/readyz"} {
				if !strings.Contains(test, "127.0.0.1:"+port+path) {
					add("%s: the health check does not ask %s on BANDPLANE_LISTEN's port %s", name, path, port)
				}
			}
		}
		if s.Hostname == "" {
			add("%s: no hostname: its policy consumer group (policy-<hostname>) would change with every new container", name)
		}
		self := s.env("BANDPLANE_POLICY_SELF")
		if u, err := url.Parse(self); err != nil || u.Hostname() != s.Hostname || u.Port() != port {
			add("%s: BANDPLANE_POLICY_SELF %q is not http://<hostname %s>:<listen port %s>", name, self, s.Hostname, port)
		}
		selves[self] = true
		peerLists[s.env("BANDPLANE_POLICY_PEERS")] = true
		key := s.env("BANDPLANE_AUDIT_KEY")
		found := false
		for _, m := range s.mounts() {
			if !m.bind() && strings.HasPrefix(key, strings.TrimSuffix(m.target, "/")+"/") {
				found = true
				auditVolumes = append(auditVolumes, m.source)
			}
		}
		if !found {
			add("%s: BANDPLANE_AUDIT_KEY %q is on no named volume of the service", name, key)
		}
	}

	if len(selves) < 2 {
		add("%d bandplane serve replicas, want at least two", len(selves))
	}
	if len(peerLists) > 1 {
		add("the serve replicas have different BANDPLANE_POLICY_PEERS: %v", sortedKeys(peerLists))
	}
	for list := range peerLists {
		peers := map[string]bool{}
		for _, p := range strings.Split(list, ",") {
			peers[strings.TrimSpace(p)] = true
		}
		if fmt.Sprint(sortedKeys(peers)) != fmt.Sprint(sortedKeys(selves)) {
			add("BANDPLANE_POLICY_PEERS %q does not list exactly the replicas' BANDPLANE_POLICY_SELF %v", list, sortedKeys(selves))
		}
	}
	for _, v := range auditVolumes {
		if !writers[v] {
			add("volume %s holds the audit key, and no one-shot service writes it (the key bootstrap)", v)
		}
	}
	for _, v := range sortedKeys(p.Volumes) {
		if !usedVolumes[v] {
			add("volume %s is declared and never mounted", v)
		}
	}
	for _, s := range sortedKeys(p.Secrets) {
		if !usedSecrets[s] {
			add("secret %s is declared and never used", s)
		}
		f := filepath.ToSlash(filepath.Clean(p.Secrets[s].File))
		if !strings.HasPrefix(f, "secrets/") {
			add("secret %s is read from %s, outside secrets/ (the folder git ignores)", s, p.Secrets[s].File)
		}
	}
	if len(p.Secrets) > 0 && !ignoresAll(t, files, "secrets") {
		add("secrets/.gitignore does not ignore every file of secrets/")
	}
	return out
}

// checkCompose is everything the tests check of deploy/compose: the schema, then
// compose-go's loader and the cross-references; nil when all is well.
func checkCompose(t *testing.T, prog program, root, dir string, files map[string][]byte) error {
	p, pr, err := loadCompose(t, dir, files["compose.yaml"])
	if err != nil {
		return err
	}
	if pr = append(pr, composeProblems(t, prog, root, dir, files, p)...); len(pr) > 0 {
		return errors.New(strings.Join(pr, "\n"))
	}
	return nil
}

func composeFixture(t *testing.T) (program, string, string, map[string][]byte) {
	t.Helper()
	root := repoRoot(t)
	dir := filepath.Join(root, "deploy", "compose")
	return readProgram(t, root), root, dir, readTree(t, dir)
}

func TestComposeFile(t *testing.T) {
	prog, root, dir, files := composeFixture(t)
	require.NoError(t, checkCompose(t, prog, root, dir, files))
	for name, b := range files {
		assert.False(t, secretLooking.Match(b), "%s holds what looks like a token or a private key", name)
	}
}

// TestComposeBrokenCopiesFail breaks one thing at a time in a copy of compose.yaml:
// each must fail, saying where.
func TestComposeBrokenCopiesFail(t *testing.T) {
	prog, root, dir, files := composeFixture(t)
	for _, c := range []struct {
		name, old, new string
		want           []string
	}{
		{"typo'd key", "    healthcheck:\n      test: [\"CMD-SHELL\", \"/opt/kafka", "    healthchek:\n      test: [\"CMD-SHELL\", \"/opt/kafka",
			[]string{"services.kafka additional properties 'healthchek' not allowed"}},
		{"wrong type", "      retries: 6\n      start_period: 60s\n      start_interval: 2s\n\n  clickhouse:", "      retries: [6]\n      start_period: 60s\n      start_interval: 2s\n\n  clickhouse:",
			[]string{"services.kafka.healthcheck.retries must be a number or string"}},
		{"unknown condition", "      migrate:\n        condition: service_completed_successfully\n      kafka:", "      migrate:\n        condition: service_done\n      kafka:",
			[]string{"services.keys.depends_on.migrate.condition value must be one of"}},
		{"dependency on a missing service", "      migrate:\n        condition: service_completed_successfully\n      kafka:", "      migrat:\n        condition: service_completed_successfully\n      kafka:",
			[]string{`service "keys" depends on undefined service "migrat"`, "keys depends on migrat, which is not a service"}},
		{"latest image", "grafana/grafana:11.6.0", "grafana/grafana:latest", []string{"grafana: image grafana/grafana:latest is tagged latest"}},
		{"missing host path", "../grafana/dashboards:", "../grafana/dashbaords:", []string{"grafana: bind-mounted ../grafana/dashbaords does not exist"}},
		{"undeclared volume", "      - kafka-data:/var/lib/kafka/data", "      - kafka-dat:/var/lib/kafka/data",
			[]string{`service "kafka" refers to undefined volume kafka-dat`, "kafka: volume kafka-dat is not declared", "volume kafka-data is declared and never mounted"}},
		{"unknown BANDPLANE variable", "BANDPLANE_LOG_LEVEL: info", "BANDPLANE_LOGLEVEL: info", []string{"BANDPLANE_LOGLEVEL is not a variable cmd/bandplane reads"}},
		{"inline secret", "CLICKHOUSE_PASSWORD_FILE: /run/secrets/clickhouse_password", "BANDPLANE_CLICKHOUSE_PASSWORD: hunter2",
			[]string{"BANDPLANE_CLICKHOUSE_PASSWORD holds a value instead of naming a file"}},
		{"health check on another port", "127.0.0.1:8080/readyz", "127.0.0.1:8081/readyz", []string{"bandplane-1: the health check does not ask /readyz on BANDPLANE_LISTEN's port 8080"}},
		{"no health check", "      test: [\"CMD-SHELL\", \"wget -q -O /dev/null http://127.0.0.1:3000/api/health\"]", "      disable: true",
			[]string{"grafana: a long-running service without a health check"}},
		{"replica missing from the peers", "BANDPLANE_POLICY_SELF: http://bandplane-2:8080", "BANDPLANE_POLICY_SELF: http://bandplane-3:8080",
			[]string{"bandplane-2: BANDPLANE_POLICY_SELF \"http://bandplane-3:8080\" is not http://<hostname bandplane-2>", "does not list exactly the replicas"}},
		{"duplicate key", "    hostname: kafka\n", "    hostname: kafka\n    hostname: broker\n", []string{`mapping key "hostname" already defined at line`}},
		{"undefined network", "    hostname: kafka\n", "    hostname: kafka\n    networks: [backend]\n", []string{`service "kafka" refers to undefined network backend`}},
		{"broken interpolation", "BANDPLANE_LOG_LEVEL: info", "BANDPLANE_LOG_LEVEL: ${LOG_LEVEL", []string{"invalid interpolation format for ", ".environment.BANDPLANE_LOG_LEVEL"}},
		{"unknown serve flag", "command: [\"serve\"]", "command: [\"serve\", \"--partitons=8\"]", []string{"flag --partitons=8 is not a flag cmd/bandplane defines"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := checkCompose(t, prog, root, dir, mutate(t, files, "compose.yaml", c.old, c.new))
			require.Error(t, err)
			t.Logf("%s", err)
			for _, w := range c.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

// TestComposeGoIsTheRecordedOne: deploy/compose/README.md names the compose-go release
// whose schema and loader the tests check compose.yaml with.
func TestComposeGoIsTheRecordedOne(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy", "compose", "README.md"))
	require.NoError(t, err)
	v := composeGo(t)
	assert.Contains(t, string(readme), "compose-go "+v, "deploy/compose/README.md does not name compose-go %s, the release go.mod requires", v)
	assert.Contains(t, schema.Schema, `"$schema"`, "compose-go's schema package embeds no JSON schema")
}

// TestComposeConfigFromTheRepository: the stack runs the repository's own settings and
// provisioning, mounted where the programs read them.
func TestComposeConfigFromTheRepository(t *testing.T) {
	_, root, dir, files := composeFixture(t)
	p, pr, err := loadCompose(t, dir, files["compose.yaml"])
	require.NoError(t, err)
	require.Empty(t, pr)

	targets := func(service string) map[string]string {
		out := map[string]string{}
		for _, m := range p.Services[service].mounts() {
			out[m.source] = m.target
		}
		return out
	}

	// Every ClickHouse drop-in of deploy/clickhouse/current, in the same folder of the
	// server's configuration.
	ch := targets("clickhouse")
	current := readTree(t, filepath.Join(root, "deploy", "clickhouse", "current"))
	require.NotEmpty(t, current)
	for rel := range current {
		assert.Equal(t, "/etc/clickhouse-server/"+rel, ch["../clickhouse/current/"+rel], "deploy/clickhouse/current/%s is not mounted into the server's configuration", rel)
	}

	// Grafana: the generated dashboards where the dashboard provider looks, the alert
	// rules and the provider from deploy/grafana, and a data source for this stack that
	// is deploy/grafana's but for the address.
	g := targets("grafana")
	var provider struct {
		Providers []struct {
			Options struct {
				Path string `json:"path"`
			} `json:"options"`
		} `json:"providers"`
	}
	readYAML(t, filepath.Join(root, "deploy", "grafana", "provisioning", "dashboards", "bandplane.yaml"), &provider)
	require.Len(t, provider.Providers, 1)
	assert.Equal(t, provider.Providers[0].Options.Path, g["../grafana/dashboards"])
	assert.Equal(t, "/etc/grafana/provisioning/dashboards", g["../grafana/provisioning/dashboards"])
	assert.Equal(t, "/etc/grafana/provisioning/alerting", g["../grafana/provisioning/alerting"])
	assert.Equal(t, "/etc/grafana/provisioning/datasources", g["./grafana/datasources"])

	type datasources struct {
		Datasources []struct {
			UID            string            `json:"uid"`
			Type           string            `json:"type"`
			JSONData       map[string]any    `json:"jsonData"`
			SecureJSONData map[string]string `json:"secureJsonData"`
		} `json:"datasources"`
	}
	var local, stack datasources
	readYAML(t, filepath.Join(root, "deploy", "grafana", "provisioning", "datasources", "clickhouse.yaml"), &local)
	readYAML(t, filepath.Join(root, "deploy", "compose", "grafana", "datasources", "clickhouse.yaml"), &stack)
	require.Len(t, local.Datasources, 1)
	require.Len(t, stack.Datasources, 1)
	l, s := local.Datasources[0], stack.Datasources[0]
	assert.Equal(t, l.UID, s.UID, "the alert rules name the data source by its uid")
	assert.Equal(t, l.Type, s.Type)
	for _, k := range []string{"protocol", "defaultDatabase", "secure"} {
		assert.Equal(t, l.JSONData[k], s.JSONData[k], "jsonData.%s", k)
	}
	serve := p.Services["bandplane-1"]
	assert.Equal(t, "clickhouse", s.JSONData["host"])
	assert.Contains(t, p.Services, s.JSONData["host"])
	assert.Equal(t, fmt.Sprint(s.JSONData["host"], ":", s.JSONData["port"]), serve.env("BANDPLANE_CLICKHOUSE"))
	assert.Equal(t, serve.env("BANDPLANE_CLICKHOUSE_USER"), s.JSONData["username"])
	assert.Equal(t, serve.env("BANDPLANE_CLICKHOUSE_USER"), p.Services["clickhouse"].env("CLICKHOUSE_USER"))
	assert.Equal(t, serve.env("BANDPLANE_CLICKHOUSE_DB"), s.JSONData["defaultDatabase"])
	assert.Equal(t, "$BANDPLANE_CLICKHOUSE_PASSWORD", s.SecureJSONData["password"])
	assert.Contains(t, strings.Join(p.Services["grafana"].Entrypoint, " "), "export BANDPLANE_CLICKHOUSE_PASSWORD=")
	assert.Contains(t, p.Services["grafana"].Secrets, "clickhouse_password")

	// The ClickHouse plugin at the version deploy/grafana pins.
	readme, err := os.ReadFile(filepath.Join(root, "deploy", "grafana", "README.md"))
	require.NoError(t, err)
	pin := regexp.MustCompile(`GF_PLUGINS_PREINSTALL=(grafana-clickhouse-datasource@\d+\.\d+\.\d+)`).FindSubmatch(readme)
	require.NotNil(t, pin, "deploy/grafana/README.md no longer pins the plugin as GF_PLUGINS_PREINSTALL=grafana-clickhouse-datasource@X.Y.Z")
	assert.Equal(t, string(pin[1]), p.Services["grafana"].env("GF_PLUGINS_PREINSTALL"))
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, yaml.Unmarshal(b, v), path)
}

// TestDockerfile: the image is built from pinned base images with at least go.mod's Go,
// runs as a non-root user, and copies only what exists.
func TestDockerfile(t *testing.T) {
	root := repoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "deploy", "compose", "Dockerfile"))
	require.NoError(t, err)
	var lines []string
	sc := bufio.NewScanner(bytes.NewReader(b))
	cur := ""
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(l, "#") {
			continue
		}
		if cont, ok := strings.CutSuffix(l, "\\"); ok {
			cur += cont + " "
			continue
		}
		if cur+l != "" {
			lines = append(lines, cur+l)
		}
		cur = ""
	}
	args := map[string]string{}
	stages := map[string]bool{}
	var froms []string
	lastUser := ""
	for _, l := range lines {
		f := strings.Fields(l)
		switch strings.ToUpper(f[0]) {
		case "ARG":
			if k, v, ok := strings.Cut(f[1], "="); ok {
				args[k] = v
			}
		case "FROM":
			img := os.Expand(f[1], func(k string) string { return args[k] })
			if !stages[img] {
				froms = append(froms, img)
				assert.Empty(t, imageProblem(img, false), "FROM %s", f[1])
			}
			if len(f) >= 4 && strings.EqualFold(f[2], "AS") {
				stages[f[3]] = true
			}
			lastUser = ""
		case "USER":
			lastUser = f[1]
		case "COPY":
			fromStage := false
			var srcs []string
			for _, a := range f[1 : len(f)-1] {
				if strings.HasPrefix(a, "--from=") {
					fromStage = true
				}
				if !strings.HasPrefix(a, "--") {
					srcs = append(srcs, a)
				}
			}
			if !fromStage {
				for _, s := range srcs {
					_, err := os.Stat(filepath.Join(root, s))
					assert.NoError(t, err, "COPY %s: not in the build context (the repository root)", s)
				}
			}
		}
	}
	require.NotEmpty(t, froms)
	uid, _, _ := strings.Cut(lastUser, ":")
	assert.Regexp(t, `^[1-9][0-9]*$`, uid, "the final stage must run as a numeric non-root USER (Kubernetes' runAsNonRoot checks the number)")
	goVersion := versionNumbers(args["GO_VERSION"])
	require.NotNil(t, goVersion, "ARG GO_VERSION=X.Y.Z is missing")
	assert.True(t, versionAtLeast(goVersion, goDirective(t, root)), "the Dockerfile builds with Go %s, older than go.mod's go directive", args["GO_VERSION"])
	assert.Contains(t, froms[0], "golang:"+args["GO_VERSION"])
	assert.FileExists(t, filepath.Join(root, "deploy", "compose", "Dockerfile.dockerignore"))
}
