package layers

import (
	"bytes"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"unicode"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMarkdownLinksResolve: every relative link of every Markdown file of the
// repository (tracked, or new and not ignored) names a file or folder that exists, and
// an anchor into a Markdown file names one of its headings. The READMEs link to each
// other by topic, so a file moved or a heading renamed breaks a reader's path here
// first.
func TestMarkdownLinksResolve(t *testing.T) {
	dir := root(t)
	cmd := exec.Command("git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", "*.md")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "git ls-files: %s", stderr.String())
	var files []string
	for _, f := range strings.Split(string(out), "\x00") {
		if f == "" || vendored(f) {
			continue
		}
		if _, err := os.Stat(dir + "/" + f); err != nil { // deleted, not yet committed
			continue
		}
		files = append(files, f)
	}
	require.Contains(t, files, "README.md", "the walk found the front door")
	require.Greater(t, len(files), 5, "the walk found the folders' READMEs")

	problems, checked, err := brokenLinks(os.DirFS(dir), files)
	require.NoError(t, err)
	assert.Greater(t, checked, 100, "the parser finds the links the READMEs hold")
	for _, p := range problems {
		t.Error("broken link: " + p)
	}
}

// TestBrokenLinksFindsEveryKind: a fake tree with one link of each kind, good and
// broken; only the broken ones are reported, each at its file and line.
func TestBrokenLinksFindsEveryKind(t *testing.T) {
	tree := fstest.MapFS{
		"README.md": {Data: []byte("# Title\n\n" +
			"See [the guide](docs/guide.md), [its setup](docs/guide.md#set-up-the-tool), [the code](src/), [main](src/main.go#L3).\n" +
			"A [gone file](docs/missing.md) and a [gone anchor](docs/guide.md#no-such-heading).\n" +
			"Here: [top](#title), [nowhere](#nowhere), [spaced](docs/a%20b.md), [titled](docs/guide.md \"the guide\").\n" +
			"`[in code](not/checked.md)` and <https://example.com> and [web](https://example.com/x.md) and [mail](mailto:a@b).\n" +
			"```sh\n[in a fence](also/not/checked.md)\n```\n" +
			"~~~\n```\n[in a tilde fence](still/not.md)\n~~~\n" +
			"[escapes the tree](../outside.md) ![an image](img/missing.png) [empty]()\n\n" +
			"[ref]: docs/gone-too.md\n" +
			"[good ref]: <docs/guide.md#duplicate-1> \"title\"\n")},
		"docs/guide.md": {Data: []byte("# Guide\n\n## Set up the `tool`\n\n## Duplicate\n\n## Duplicate\n\n" +
			"Back to the [README](../README.md#title) and the [root](/README.md), [upward gone](../nope/).\n" +
			"   ## Indented heading ##\n\n    ## not a heading (indented code)\n")},
		"docs/a b.md": {Data: []byte("[guide indented heading](guide.md#indented-heading)\n" +
			"[not a heading](guide.md#not-a-heading-indented-code)\n")},
		"src/main.go": {Data: []byte("package main\n")},
	}
	got, checked, err := brokenLinks(tree, []string{"README.md", "docs/guide.md", "docs/a b.md"})
	require.NoError(t, err)
	assert.Equal(t, 22, checked, "every link outside code, web links included")
	assert.Equal(t, []string{
		"README.md:4: docs/missing.md: no such file or folder",
		"README.md:4: docs/guide.md#no-such-heading: no heading of docs/guide.md has the anchor no-such-heading",
		"README.md:5: #nowhere: no heading of README.md has the anchor nowhere",
		"README.md:14: ../outside.md: outside the repository",
		"README.md:14: img/missing.png: no such file or folder",
		"README.md:14: (empty): an empty link",
		"README.md:16: docs/gone-too.md: no such file or folder",
		"docs/a b.md:2: guide.md#not-a-heading-indented-code: no heading of docs/guide.md has the anchor not-a-heading-indented-code",
		"docs/guide.md:9: ../nope/: no such file or folder",
	}, got)

	_, _, err = brokenLinks(tree, []string{"docs/absent.md"})
	assert.ErrorContains(t, err, "docs/absent.md", "a listed file that cannot be read is an error, not a pass")
}

func TestSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"ClickHouse 18.16 and current releases":                     "clickhouse-1816-and-current-releases",
		"Tests (`make test-cluster`)":                               "tests-make-test-cluster",
		"Facts (`input.facts` of add_participant and send_message)": "facts-inputfacts-of-add_participant-and-send_message",
		"peer_visible — input `{agent, room?, candidate?}`":         "peer_visible--input-agent-room-candidate",
		"Kafka: three brokers":                                      "kafka-three-brokers",
		"1. Start it":                                               "1-start-it",
		"The [linked](x.md) **bold** *words*":                       "the-linked-bold-words",
		"Directory file (`LoadDirectoryFile`, `--directory FILE`)":  "directory-file-loaddirectoryfile---directory-file",
		"Grüße, Ünïcode":                                            "grüße-ünïcode",
		"A <code>tag</code>":                                        "a-tag",
	} {
		assert.Equal(t, want, slug(heading), "%q", heading)
	}
}

// vendored tells the files that are not the repository's own prose: copies of other
// projects' files, whose links point into their own trees.
func vendored(file string) bool {
	base := strings.ToUpper(path.Base(file))
	return strings.Contains("/"+file, "/vendor/") || strings.Contains("/"+file, "/node_modules/") ||
		strings.HasPrefix(base, "LICENSE") || strings.HasPrefix(base, "LICENCE") ||
		strings.HasPrefix(base, "COPYING") || strings.HasPrefix(base, "NOTICE")
}

var (
	// fence opens or closes a fenced code block: ``` or ~~~, indented as far as the list
	// item it belongs to.
	fence = regexp.MustCompile("^[ \t]*(`{3,}|~{3,})")
	// atxHeading is "# Heading" to "###### Heading", with optional closing #s.
	atxHeading = regexp.MustCompile(`^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$`)
	// inlineLink is [text](target "title") and ![alt](target); text may hold one level
	// of brackets, target may be in angle brackets or hold balanced parentheses.
	inlineLink = regexp.MustCompile(`!?\[((?:[^\[\]]|\[[^\[\]]*\])*)\]\(\s*(<[^<>\n]*>|(?:[^\s()]|\([^\s()]*\))*)(?:\s+(?:"[^"]*"|'[^']*'|\([^()]*\)))?\s*\)`)
	// refDefinition is "[label]: target", a link reference definition.
	refDefinition = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*(<[^<>]*>|\S+)`)
	// scheme starts an absolute URL (https:, mailto:), which is not checked.
	scheme = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]*:`)
	// htmlTag is an inline HTML tag, which a heading's anchor leaves out.
	htmlTag = regexp.MustCompile(`<[^>]*>`)
	// htmlAnchor is an explicit anchor: <a name="x"> or an id="x" attribute.
	htmlAnchor = regexp.MustCompile(`<[A-Za-z][^>]*\s(?:id|name)="([^"]+)"`)
)

// brokenLinks reads each Markdown file of fsys named in files and lists its relative
// links whose target does not exist, as "file:line: target: why", in file order, and
// how many links it checked.
// Absolute URLs are not fetched; links inside code spans and fenced blocks are not
// links. A target is relative to its file's folder (or, starting with "/", to the
// root of fsys, as on GitHub) and must stay inside fsys.
func brokenLinks(fsys fs.FS, files []string) (problems []string, checked int, err error) {
	docs := map[string]*markdown{}
	parse := func(name string) (*markdown, error) {
		if d, ok := docs[name]; ok {
			return d, nil
		}
		data, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, fmt.Errorf("cannot read %s: %w", name, err)
		}
		d := parseMarkdown(data)
		docs[name] = d
		return d, nil
	}
	sorted := slices.Clone(files)
	slices.Sort(sorted)
	for _, file := range sorted {
		doc, err := parse(file)
		if err != nil {
			return nil, 0, err
		}
		for _, l := range doc.links {
			checked++
			if why := checkLink(fsys, file, l.target, parse); why != "" {
				target := l.target
				if target == "" {
					target = "(empty)"
				}
				problems = append(problems, fmt.Sprintf("%s:%d: %s: %s", file, l.line, target, why))
			}
		}
	}
	return problems, checked, nil
}

// checkLink says why target, a link of file, does not resolve ("" when it does).
func checkLink(fsys fs.FS, file, target string, parse func(string) (*markdown, error)) string {
	if target == "" {
		return "an empty link"
	}
	if scheme.MatchString(target) || strings.HasPrefix(target, "//") {
		return ""
	}
	ref, anchor, _ := strings.Cut(target, "#")
	ref, _, _ = strings.Cut(ref, "?")
	name := file
	if ref != "" {
		p, err := url.PathUnescape(ref)
		if err != nil {
			return "not a valid path: " + err.Error()
		}
		if strings.HasPrefix(p, "/") {
			p = path.Clean(strings.TrimLeft(p, "/"))
		} else {
			p = path.Join(path.Dir(file), p)
		}
		if p == ".." || strings.HasPrefix(p, "../") {
			return "outside the repository"
		}
		if _, err := fs.Stat(fsys, p); err != nil {
			return "no such file or folder"
		}
		name = p
	}
	if anchor == "" || !strings.HasSuffix(strings.ToLower(name), ".md") {
		return "" // line anchors of code and the like are GitHub's to resolve
	}
	doc, err := parse(name)
	if err != nil {
		return err.Error()
	}
	a, err := url.PathUnescape(anchor)
	if err != nil {
		a = anchor
	}
	if !doc.anchors[strings.ToLower(a)] {
		return fmt.Sprintf("no heading of %s has the anchor %s", name, a)
	}
	return ""
}

// markdown is what the check needs of one file: its links and its anchors.
type markdown struct {
	links   []link
	anchors map[string]bool
}

type link struct {
	line   int
	target string
}

// parseMarkdown finds the links and the heading anchors of a Markdown file. It knows
// the CommonMark that matters for links: fenced code blocks, code spans, ATX headings
// and indented code after a blank line; setext headings are not used here.
func parseMarkdown(data []byte) *markdown {
	doc := &markdown{anchors: map[string]bool{}}
	seen := map[string]int{}
	var inFence string // the fence that opened the block, while in one
	blank := true      // the line before was blank (or the file's start)
	for i, line := range strings.Split(string(data), "\n") {
		n := i + 1
		if m := fence.FindStringSubmatch(line); m != nil {
			switch {
			case inFence == "":
				inFence = m[1]
			case m[1][0] == inFence[0] && len(m[1]) >= len(inFence) && strings.TrimSpace(line) == m[1]:
				inFence = ""
			}
			blank = false
			continue
		}
		if inFence != "" {
			continue
		}
		if blank && strings.HasPrefix(strings.ReplaceAll(line, "\t", "    "), "    ") {
			continue // indented code (but for a list item's continuation, which follows text)
		}
		blank = strings.TrimSpace(line) == ""
		text := withoutCodeSpans(line)
		for _, m := range htmlAnchor.FindAllStringSubmatch(text, -1) {
			doc.anchors[strings.ToLower(m[1])] = true
		}
		if m := atxHeading.FindStringSubmatch(line); m != nil {
			s := slug(m[2])
			if k := seen[s]; k > 0 {
				doc.anchors[s+"-"+strconv.Itoa(k)] = true
			} else {
				doc.anchors[s] = true
			}
			seen[s]++
		}
		if m := refDefinition.FindStringSubmatch(text); m != nil {
			doc.links = append(doc.links, link{n, strings.Trim(m[1], "<>")})
			continue
		}
		for _, m := range inlineLink.FindAllStringSubmatch(text, -1) {
			doc.links = append(doc.links, link{n, strings.Trim(m[2], "<>")})
		}
	}
	return doc
}

// withoutCodeSpans blanks the code spans of a line (a run of backticks up to the next
// run of the same length), so that a link written in code is no link.
func withoutCodeSpans(line string) string {
	var b strings.Builder
	for i := 0; i < len(line); {
		if line[i] != '`' {
			b.WriteByte(line[i])
			i++
			continue
		}
		j := i
		for j < len(line) && line[j] == '`' {
			j++
		}
		run := line[i:j]
		end := -1
		for k := j; k < len(line); {
			if line[k] != '`' {
				k++
				continue
			}
			m := k
			for m < len(line) && line[m] == '`' {
				m++
			}
			if m-k == len(run) {
				end = m
				break
			}
			k = m
		}
		if end < 0 { // no closing run: the backticks are text
			b.WriteString(run)
			i = j
			continue
		}
		b.WriteString(strings.Repeat(" ", end-i))
		i = end
	}
	return b.String()
}

// slug is the anchor GitHub gives a heading: the heading's text (link targets and HTML
// tags left out) lowercased, with every character but letters, digits, marks, '_', '-'
// and ' ' dropped (backticks and '*' emphasis with them) and each space made '-'.
func slug(heading string) string {
	text := inlineLink.ReplaceAllString(heading, "$1")
	text = htmlTag.ReplaceAllString(text, "")
	var b strings.Builder
	for _, r := range strings.ToLower(text) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.IsMark(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
