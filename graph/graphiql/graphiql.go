// Package graphiql owns GraphiQL, the in-browser IDE a person opens at GET /graphql: its
// page and the pinned GraphiQL and React releases it runs, embedded in the binary so that
// the page works on a machine without internet access and loads nothing from another
// host. README.md beside this file says where the releases come from and how to update
// them.
//
// It may import ingest/, policy/, query/, schema/ and its own folder's packages, never
// deploy/ or cmd/ (deploy/layers).
package graphiql

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/base64"
	"encoding/hex"
	"html/template"
	"net/http"
	"path"
	"strings"
	"time"

	"github.com/bandplane/bandplane/schema/keys"
)

// The pinned releases. Their files live in vendor/<package>-<version>/ and are served
// under the same names, so a new version is a new URL and no browser pairs a cached old
// file with a new page.
const (
	GraphiQLVersion = "4.1.2"
	ReactVersion    = "18.3.1" // react and react-dom, which are released together
)

// AssetsPath is where Assets answers: below the API's own path, so that whatever routes
// /graphql to this server (a mux, a reverse proxy) can route the page's files with it.
const AssetsPath = "/graphql/assets/"

// Endpoint is the API the page talks to: its own origin's /graphql, over HTTP for
// queries and mutations and over a WebSocket for subscriptions.
const Endpoint = "/graphql"

// CSP is the page's Content-Security-Policy, for the nonce of its response: scripts,
// styles and connections of its own origin only ('self' covers the WebSocket to the
// same host and port in CSP Level 3 browsers), so markup that reaches the page (a
// schema description is rendered as Markdown) can neither run code nor send the key
// elsewhere. GraphiQL's stylesheet carries its fonts and icons as data: URLs. Its
// dialogs write a <style> element when they open (a scroll lock whose content depends
// on the scrollbar's width, so no hash can admit it): the nonce admits that one, and
// the page's script hands it to GraphiQL. form-action 'none' keeps any form from
// submitting the key as a navigation.
func CSP(nonce string) string {
	return "default-src 'none'; script-src 'self'; style-src 'self' 'nonce-" + nonce + "'; img-src 'self' data:; font-src data:; " +
		"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
}

// assetCSP is the files' policy: they are no documents, and a licence opened in a tab
// needs nothing.
const assetCSP = "default-src 'none'; frame-ancestors 'none'"

// The embedded files, named one by one: nothing else in this folder (the page's
// template, the Go files) is in the binary, and each release's licence travels with it.
//
//go:embed page.html page.js page.css
//go:embed vendor/graphiql-4.1.2/graphiql.min.js vendor/graphiql-4.1.2/graphiql.min.css vendor/graphiql-4.1.2/LICENSE
//go:embed vendor/react-18.3.1/react.production.min.js vendor/react-18.3.1/LICENSE
//go:embed vendor/react-dom-18.3.1/react-dom.production.min.js vendor/react-dom-18.3.1/LICENSE
var files embed.FS

var pageTemplate = template.Must(template.ParseFS(files, "page.html"))

// immutable is the caching of a file whose URL changes whenever its content does.
const immutable = "public, max-age=31536000, immutable"

type asset struct {
	contentType string
	body        []byte
	etag        string
}

// UI is GraphiQL's page and its files, read from the embedded files once.
type UI struct {
	page   pageData
	assets map[string]*asset // by URL path below AssetsPath
}

// pageData fills page.html: the URLs of the files, and each response's own nonce.
type pageData struct {
	Endpoint, Nonce                                       string
	React, ReactDOM, GraphiQLJS, GraphiQLCSS, Page, Style string
}

// New reads the embedded files and checks that the page renders. It panics when a file
// is missing or the template is broken, which is a build mistake (a version constant
// that does not match vendor/, say), so that the process stops at start, not at the
// first visitor.
func New() *UI {
	ui := &UI{assets: map[string]*asset{}}
	vendor := func(pkg, version, file string) string {
		name := pkg + "-" + version + "/" + file
		ui.add(name, "vendor/"+name)
		return AssetsPath + name
	}
	// The page's own script and styles change with bandplane, not with a release: their
	// URLs carry a hash of their content instead.
	own := func(file string) string {
		b := ui.read(file)
		sum := sha256.Sum256(b)
		ext := path.Ext(file)
		name := strings.TrimSuffix(file, ext) + "." + hex.EncodeToString(sum[:6]) + ext
		ui.add(name, file)
		return AssetsPath + name
	}
	ui.page = pageData{
		Endpoint:    Endpoint,
		React:       vendor("react", ReactVersion, "react.production.min.js"),
		ReactDOM:    vendor("react-dom", ReactVersion, "react-dom.production.min.js"),
		GraphiQLJS:  vendor("graphiql", GraphiQLVersion, "graphiql.min.js"),
		GraphiQLCSS: vendor("graphiql", GraphiQLVersion, "graphiql.min.css"),
		Page:        own("page.js"),
		Style:       own("page.css"),
	}
	for _, pkg := range []string{"graphiql-" + GraphiQLVersion, "react-" + ReactVersion, "react-dom-" + ReactVersion} {
		ui.add(pkg+"/LICENSE", "vendor/"+pkg+"/LICENSE")
	}
	if _, err := ui.render("nonce"); err != nil {
		panic("graphiql: cannot render the page: " + err.Error()) // a mistake in page.html
	}
	return ui
}

func (ui *UI) render(nonce string) ([]byte, error) {
	data := ui.page
	data.Nonce = nonce
	var page bytes.Buffer
	err := pageTemplate.Execute(&page, data)
	return page.Bytes(), err
}

func (ui *UI) read(file string) []byte {
	b, err := files.ReadFile(file)
	if err != nil {
		panic("graphiql: file missing from the embedded files: " + err.Error()) // a build mistake
	}
	return b
}

func (ui *UI) add(name, file string) {
	b := ui.read(file)
	types := map[string]string{".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
	ct, ok := types[path.Ext(file)]
	if !ok {
		ct = "text/plain; charset=utf-8" // the licences
	}
	sum := sha256.Sum256(b)
	ui.assets[name] = &asset{contentType: ct, body: b, etag: `"` + hex.EncodeToString(sum[:16]) + `"`}
}

// Page serves GraphiQL's page, whatever the request's path, with a nonce of its own
// (see CSP). No other site may frame it (clickjacking), and no cache keeps it: a new
// release's page must not pair with old files, and only the page names them.
func (ui *UI) Page() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := make([]byte, 16)
		_, _ = rand.Read(b) // crypto/rand.Read never fails
		nonce := base64.RawURLEncoding.EncodeToString(b)
		page, err := ui.render(nonce)
		if err != nil {
			keys.WriteError(w, http.StatusInternalServerError, "internal", "cannot render GraphiQL's page: "+err.Error())
			return
		}
		h := w.Header()
		securityHeaders(h)
		h.Set("Content-Security-Policy", CSP(nonce))
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("Cache-Control", "no-store")
		if r.Method == http.MethodHead {
			return
		}
		_, _ = w.Write(page)
	})
}

// Assets serves the page's scripts, styles and the releases' licences at their paths
// below AssetsPath, to anyone: they are public files, and the page that loads them asks
// for no key either. Only GET and HEAD are answered (405 otherwise); a path that does not
// name one of them exactly is 404.
func (ui *UI) Assets() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		securityHeaders(h)
		// The path is looked up whole among the embedded files' names: nothing reaches a
		// file system or an fs.FS, so no "..", encoded slash or directory names anything
		// else, and there is no listing.
		name, ok := strings.CutPrefix(r.URL.Path, AssetsPath)
		a := ui.assets[name]
		if !ok || a == nil {
			h.Set("Cache-Control", "no-store")
			keys.WriteError(w, http.StatusNotFound, "not_found", "no such file: GraphiQL's page is at "+Endpoint)
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			h.Set("Allow", "GET, HEAD")
			keys.WriteError(w, http.StatusMethodNotAllowed, "method_not_allowed", "GraphiQL's files answer only GET and HEAD")
			return
		}
		h.Set("Content-Type", a.contentType)
		h.Set("Cache-Control", immutable)
		h.Set("ETag", a.etag)
		// ServeContent answers HEAD, If-None-Match (304) and ranges.
		http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(a.body))
	})
}

func securityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", assetCSP)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	h.Set("Cross-Origin-Resource-Policy", "same-origin")
}
