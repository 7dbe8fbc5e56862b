package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/bandplane/bandplane/deploy/stacktest"
	"github.com/bandplane/bandplane/schema"
	"github.com/bandplane/bandplane/schema/kafka"
	"github.com/bandplane/bandplane/schema/keys"
)

// TestIntegrationBoard opens the live work board of a real `bandplane serve` in
// headless Chromium, enters a viewer key, and produces a task in progress and a
// request for a human to Kafka: both appear on the page (the test logs how soon; `bandplane
// bench query` measures the live latency), the question as text (it carries markup),
// with no script error or CSP violation.
func TestIntegrationBoard(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium is not on PATH (%v): install it with deploy/local/chromium.sh install (make test does)", err)
	}
	s := newStack(t)
	viewer := s.key(t, "board-viewer", "org-acme", keys.RoleViewer)
	srv := s.serve(t)

	p, err := kafka.NewProducer(kafka.ProducerConfig{Brokers: stacktest.Brokers(), Topic: s.topic})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	ctx := context.Background()
	tag := fmt.Sprintf("%d", time.Now().UnixNano())
	room, taskID := "room-board-"+tag, "task-board-"+tag
	event := func(id, typ string, actor schema.Party, subject *schema.Party, data any) schema.Event {
		b, err := json.Marshal(data)
		require.NoError(t, err)
		e := schema.Event{ID: id + "-" + tag, Type: typ, Time: time.Now().UTC(), OrgID: "org-acme", Actor: actor, Subject: subject,
			Source: "board-test", SchemaVersion: schema.Version, Data: b}
		if !strings.HasSuffix(typ, ".registered") {
			e.RoomID = room
		}
		require.NoError(t, e.Validate(), "%s", id)
		return e
	}
	agent := schema.Party{ID: "a-board-coder", Type: schema.ActorAgent, Handle: "acme/coder"}
	alice := schema.Party{ID: "u-board-alice", Type: schema.ActorUser, Handle: "alice"}
	// The directory first: names for the page, and a warm producer for the timings.
	require.NoError(t, p.Produce(ctx, []schema.Event{
		event("reg-alice", schema.TypeUserRegistered, schema.Party{ID: "system", Type: schema.ActorSystem}, &alice, schema.UserData{Handle: "alice", Name: "Alice"}),
		event("reg-coder", schema.TypeAgentRegistered, alice, &agent, map[string]any{"handle": "acme/coder", "owner_id": alice.ID, "listed": true}),
	}))

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium),
		chromedp.Flag("headless", "new"), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1400, 900))
	actx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(actx)
	defer cancelBrowser()
	bctx, cancel := context.WithTimeout(bctx, 3*time.Minute)
	defer cancel()

	// Script errors and CSP violations reach the DevTools log and the runtime.
	var mu sync.Mutex
	var problems []string
	require.NoError(t, chromedp.Listen(bctx, func(ev any) {
		mu.Lock()
		defer mu.Unlock()
		switch e := ev.(type) {
		case *runtime.EventExceptionThrown:
			problems = append(problems, fmt.Sprintf("exception: %s %v", e.ExceptionDetails.Text, e.ExceptionDetails.Exception))
		case *log.EventEntryAdded:
			if !strings.HasSuffix(e.Entry.URL, "/favicon.ico") { // the board has none: 404
				problems = append(problems, fmt.Sprintf("%s (%s): %s %s", e.Entry.Level, e.Entry.Source, e.Entry.Text, e.Entry.URL))
			}
		}
	}), "cannot start chromium (%s)", chromium)
	text := func(sel string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.TextContent(chromedp.CSS(sel)))
		require.NoError(t, err, sel)
		return v
	}
	page := func() string { // what the page says, for failure messages
		v, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.getElementById("status").textContent + " | " + document.getElementById("error").textContent`))
		return v
	}

	require.NoError(t, chromedp.Do(bctx,
		chromedp.Navigate(srv.url+"/"),
		chromedp.WaitVisible(chromedp.ID("key-input")),
		chromedp.SendKeys(chromedp.ID("key-input"), viewer),
		chromedp.Click(chromedp.ID("key-submit")),
		chromedp.WaitVisible(chromedp.ID("board")),
	))
	live := time.Now().Add(30 * time.Second)
	for text("#status") != "live" {
		if time.Now().After(live) {
			t.Fatalf("the board is not live after 30 s: %s\nserve:\n%s", page(), tail(srv.log.String(), 4000))
		}
		time.Sleep(50 * time.Millisecond)
	}
	stored, err := chromedp.Run(bctx, chromedp.Evaluate[string](`sessionStorage.getItem("bandplane.board.key")`))
	require.NoError(t, err)
	assert.Equal(t, viewer, stored, "the key is kept in the tab's sessionStorage")

	// show produces one event and waits until sel is on the page, and logs the time
	// from the produce call to the element.
	show := func(what string, e schema.Event, sel string) {
		t.Helper()
		start := time.Now()
		require.NoError(t, p.Produce(ctx, []schema.Event{e}))
		acked := time.Since(start)
		wctx, cancel := context.WithTimeout(bctx, 30*time.Second)
		defer cancel()
		if err := chromedp.Do(wctx, chromedp.WaitVisible(chromedp.CSS(sel))); err != nil {
			t.Fatalf("%s: %s never appeared (%v): %s\nserve:\n%s", what, sel, err, page(), tail(srv.log.String(), 4000))
		}
		d := time.Since(start)
		t.Logf("%s: on the page %s after the produce call (Kafka acknowledged it after %s)", what, d.Round(time.Millisecond), acked.Round(time.Millisecond))
	}
	roomSel := `section.room[data-room-id="` + room + `"]`

	show("task.created", event("task", schema.TypeTaskCreated, agent, nil,
		schema.TaskData{TaskID: taskID, Title: "Ship the <i>release</i> notes", Status: "in_progress", Assignee: agent.ID}),
		roomSel+` tr.task[data-task-id="`+taskID+`"][data-status="in_progress"]`)
	assert.Contains(t, text(roomSel+` tr.task[data-task-id="`+taskID+`"] .task-title`), "Ship the <i>release</i> notes")

	question := "@alice Deploy <b>now</b>? <img src=x onerror=\"document.title='pwned'\">"
	show("event.attention", event("ask", schema.TypeAttention, agent, nil,
		schema.MessageData{Content: question, MessageType: "attention", Mentions: []schema.Mention{{ID: alice.ID, Handle: "alice"}}}),
		roomSel+` li.attention[data-attention-id]`)
	assert.Equal(t, question, text(roomSel+` li.attention .question`), "the question is shown as text")
	markup, err := chromedp.Run(bctx, chromedp.Evaluate[int](`document.querySelectorAll("#rooms i, #rooms b, #rooms img").length`))
	require.NoError(t, err)
	assert.Zero(t, markup, "no element was made from chat content")
	waiting := text(roomSel + ` li.attention .waiting`)
	assert.True(t, strings.HasPrefix(waiting, "waiting "), "the request shows its age: %q", waiting)

	saveScreenshot(t, bctx, "board-"+tag, "the board")

	title, err := chromedp.Run(bctx, chromedp.Title())
	require.NoError(t, err)
	assert.NotEqual(t, "pwned", title)
	mu.Lock()
	assert.Empty(t, problems, "the browser reported errors")
	mu.Unlock()
	srv.alive()
}

// saveScreenshot keeps a screenshot of the page as name.png in $BANDPLANE_ARTIFACTS (CI
// keeps it), or in the test's temporary folder, and logs where.
func saveScreenshot(t *testing.T, bctx context.Context, name, what string) {
	t.Helper()
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	require.NoError(t, err)
	dir := os.Getenv("BANDPLANE_ARTIFACTS")
	if dir == "" {
		dir = t.TempDir()
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	shot := filepath.Join(dir, name+".png")
	require.NoError(t, os.WriteFile(shot, png, 0o644))
	t.Logf("screenshot of %s: %s", what, shot)
}
