package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/chromedp/chromedp/kb"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/keys"
)

// TestIntegrationGraphiQLOffline opens GraphiQL at /graphql of a real `bandplane serve`
// in headless Chromium that can reach 127.0.0.1 only (every other name is unresolvable
// and every other address goes to a proxy that is not there), so a script or style
// still loaded from a CDN fails the page. It runs a query without a key and sees
// UNAUTHENTICATED, types a viewer key into the Headers tab, runs the query again and
// sees the organization's agent, and finds the key in none of the browser's storage;
// no request leaves the server's origin and the browser reports no script error or CSP
// violation.
func TestIntegrationGraphiQLOffline(t *testing.T) {
	s := newStack(t)
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium is not on PATH (%v): install it with deploy/local/chromium.sh install (make test does)", err)
	}
	viewer := s.key(t, "graphiql-viewer", "org-acme", keys.RoleViewer)
	srv := s.serve(t)

	// An agent of the organization's directory, for the query to find.
	tag := fmt.Sprintf("%d", time.Now().UnixNano())
	handle := "acme/graphiql-" + tag
	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: s.topic})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	data, err := json.Marshal(map[string]any{"handle": handle, "owner_id": "u-graphiql-owner", "listed": true})
	require.NoError(t, err)
	reg := schema.Event{ID: "reg-graphiql-" + tag, Type: schema.TypeAgentRegistered, Time: time.Now().UTC(), OrgID: "org-acme",
		Actor: schema.Party{ID: "system", Type: schema.ActorSystem}, Subject: &schema.Party{ID: "a-graphiql-" + tag, Type: schema.ActorAgent, Handle: handle},
		Source: "graphiql-test", SchemaVersion: schema.Version, Data: data}
	require.NoError(t, reg.Validate())
	require.NoError(t, p.Produce(context.Background(), []schema.Event{reg}))
	const query = `{ agents { handle } }`
	body, err := json.Marshal(map[string]string{"query": query})
	require.NoError(t, err)
	var last []byte
	if !stacktest.Eventually(t, 60*time.Second, 100*time.Millisecond, func() bool {
		_, last = srv.do(http.MethodPost, "/graphql", viewer, "application/json", body)
		return strings.Contains(string(last), handle)
	}) {
		t.Fatalf("the API does not list %s after 60 s: %s\nserve:\n%s", handle, last, tail(srv.log.String(), 4000))
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium),
		chromedp.Flag("headless", "new"), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1400, 900),
		// No network but this machine's loopback: names other than 127.0.0.1 do not
		// resolve, and what would go by address goes to a closed port (loopback itself
		// is never proxied).
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"),
		chromedp.ProxyServer("http://"+freePort(t)))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	bctx, cancel := context.WithTimeout(bctx, 3*time.Minute)
	defer cancel()

	// Script errors, console errors and CSP violations reach the runtime and the DevTools
	// log; every request the page makes is recorded.
	var mu sync.Mutex
	var problems, requests []string
	require.NoError(t, chromedp.Listen(bctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *runtime.EventExceptionThrown:
			problems = append(problems, fmt.Sprintf("exception: %s %v", e.ExceptionDetails.Text, e.ExceptionDetails.Exception))
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.ConsoleAPICalledTypeError {
				var args []string
				for _, a := range e.Args {
					args = append(args, string(a.Value)+a.Description)
				}
				problems = append(problems, "console.error: "+strings.Join(args, " "))
			}
		case *log.EventEntryAdded:
			if !strings.HasSuffix(e.Entry.URL, "/favicon.ico") { // there is none: 404
				problems = append(problems, fmt.Sprintf("%s (%s): %s %s", e.Entry.Level, e.Entry.Source, e.Entry.Text, e.Entry.URL))
			}
		case *network.EventRequestWillBeSent:
			requests = append(requests, e.Request.URL)
		case *network.EventWebSocketCreated:
			requests = append(requests, e.URL)
		}
	}), "cannot start chromium (%s)", chromium)
	// The first tab starts the browser, so that the probe's tab opens beside it.
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate("about:blank")), "cannot start chromium (%s)", chromium)

	// The sandbox holds: the CDN the page once loaded from is out of reach.
	pctx, cancelProbe := chromedp.NewContext(bctx)
	err = chromedp.Do(pctx, chromedp.Navigate("https://cdn.jsdelivr.net/npm/graphiql@4.1.2/graphiql.min.js"))
	cancelProbe()
	require.Error(t, err, "Chromium reached a CDN: the test would not notice a page that needs one")
	require.Contains(t, err.Error(), "net::ERR_")

	// editor is the text of the CodeMirror editor inside sel (CodeMirror keeps its
	// instance on its element).
	editor := func(sel string) string {
		return `document.querySelector(` + jsString(sel+" .CodeMirror") + `).CodeMirror.getValue()`
	}
	// typeInto clicks into the editor inside sel, selects all and types text as keys.
	typeInto := func(sel, text string) {
		t.Helper()
		require.NoError(t, chromedp.Do(bctx,
			chromedp.Click(chromedp.CSS(sel+" .CodeMirror-lines")),
			chromedp.KeyEvent("a", chromedp.KeyModifiers(kb.ModifierCtrl)),
			chromedp.KeyEvent(text),
		), sel)
		got, err := chromedp.Run(bctx, chromedp.Evaluate[string](editor(sel)))
		require.NoError(t, err, sel)
		require.Equal(t, text, got, "what %s holds after typing", sel)
	}
	// run runs the query and waits until the response pane holds want.
	run := func(want string) string {
		t.Helper()
		require.NoError(t, chromedp.Do(bctx, chromedp.Click(chromedp.CSS(".graphiql-execute-button"))))
		got, err := chromedp.Run(bctx, chromedp.Poll[string](
			`(() => { const v = `+editor(".result-window")+`; return v.includes(`+jsString(want)+`) && v })()`,
			chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second)))
		if err != nil {
			shown, _ := chromedp.Run(bctx, chromedp.Evaluate[string](editor(".result-window")))
			t.Fatalf("the response pane does not show %q (%v): %q\nserve:\n%s", want, err, shown, tail(srv.log.String(), 4000))
		}
		return got
	}

	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate(srv.url+"/graphql")))
	wctx, cancelWait := context.WithTimeout(bctx, 30*time.Second)
	err = chromedp.Do(wctx, chromedp.WaitVisible(chromedp.CSS(".graphiql-query-editor .CodeMirror")))
	cancelWait()
	if err != nil {
		shown, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.body.innerText`))
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("GraphiQL did not start within 30 s (%v); the page shows %q; the browser reported:\n%s",
			err, shown, strings.Join(problems, "\n"))
	}
	typeInto(".graphiql-query-editor", query)
	answer := run("UNAUTHENTICATED")
	assert.NotContains(t, answer, handle)

	require.NoError(t, chromedp.Do(bctx,
		chromedp.Click(chromedp.Search(`//div[contains(@class, "graphiql-editor-tools")]//button[normalize-space() = "Headers"]`)),
		chromedp.WaitVisible(chromedp.CSS(".graphiql-editor-tool .graphiql-editor:not(.hidden) .CodeMirror")),
	))
	headers := `{"Authorization": "Bearer ` + viewer + `"}`
	typeInto(".graphiql-editor-tool .graphiql-editor:not(.hidden)", headers)
	answer = run(handle)
	var got struct {
		Data struct{ Agents []struct{ Handle string } }
	}
	require.NoError(t, json.Unmarshal([]byte(answer), &got), answer)
	assert.Contains(t, got.Data.Agents, struct{ Handle string }{handle})

	// The key typed into the Headers tab is in none of the browser's storage.
	stored, err := chromedp.Run(bctx, chromedp.Evaluate[string](
		`JSON.stringify([Object.entries(localStorage), Object.entries(sessionStorage), document.cookie])`))
	require.NoError(t, err)
	assert.NotContains(t, stored, viewer, "the API key is kept out of the browser's storage")
	assert.NotContains(t, stored, "Authorization")

	// A dialog writes a <style> element when it opens (its scroll lock): the response's
	// nonce must admit it, or the browser reports a CSP violation.
	require.NoError(t, chromedp.Do(bctx,
		chromedp.Click(chromedp.CSS(`button[aria-label="Open settings dialog"]`)),
		chromedp.WaitVisible(chromedp.CSS(`.graphiql-dialog`)),
	))
	styles, err := chromedp.Run(bctx, chromedp.Evaluate[int](`[...document.querySelectorAll("style")].filter(s => s.nonce).length`))
	require.NoError(t, err)
	assert.Positive(t, styles, "the open dialog's <style> element carries the nonce")
	require.NoError(t, chromedp.Do(bctx,
		chromedp.KeyEvent(kb.Escape),
		chromedp.WaitNotPresent(chromedp.CSS(`.graphiql-dialog`)),
	))

	saveScreenshot(t, bctx, "graphiql-"+tag, "GraphiQL")

	origin, err := url.Parse(srv.url)
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	var assets int
	for _, r := range requests {
		u, err := url.Parse(r)
		require.NoError(t, err, r)
		if u.Scheme == "data" {
			continue // GraphiQL's fonts and icons, inside its stylesheet
		}
		assert.Equal(t, origin.Host, u.Host, "the page requested %s", r)
		if strings.HasPrefix(u.Path, "/graphql/assets/") {
			assets++
		}
	}
	assert.Equal(t, 6, assets, "the page loads its six files from the server: %v", requests)
	assert.Empty(t, problems, "the browser reported errors")
	srv.alive()
}

// jsString quotes s as a JavaScript string literal.
func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
