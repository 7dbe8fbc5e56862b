// The live work board (graph/README.md, "The live work board"): the rooms of one
// organization with their tasks, the requests waiting for a human and the active
// agents, loaded with workStatus and kept current with workStatusChanged over a
// graphql-transport-ws WebSocket.
//
// Everything shown comes from chat rooms and is written by agents and people, so
// attackers control it: it reaches the page through textContent and data attributes
// only, never as markup (the page's Trusted Types policy makes any assignment of a
// string to an HTML sink throw in Chromium, see BoardCSP in board.go).
"use strict";

(function () {
  const KEY_ITEM = "bandplane.board.key"; // sessionStorage: this tab only, gone when it closes
  const API_URL = new URL("graphql", location.href).href;
  const WS_URL = (function () {
    const u = new URL(API_URL);
    u.protocol = u.protocol === "https:" ? "wss:" : "ws:";
    u.search = "";
    u.hash = "";
    return u.href;
  })();
  const READ_ROLES = "viewer (or manager, compliance, admin)";
  const BACKOFF_MIN_MS = 1000;
  const BACKOFF_MAX_MS = 30000;
  const PING_EVERY_MS = 20000; // a ping of ours every 20 s...
  const SILENCE_LIMIT_MS = 45000; // ...and a connection silent for 45 s is dead
  const RESYNC_EVERY_MS = 60000; // a full refetch now and then: today's figures, and anything missed
  const ROOM_REFETCH_MIN_MS = 5000; // AGENT_ACTIVE refetches a room at most this often
  const RECENT_MS = 5 * 60 * 1000; // an agent active in the last 5 minutes is "active now"
  const TOMBSTONE_MS = 60 * 60 * 1000;

  // The two operations, whole (board_test.go validates them against the schema).
  const BOARD_QUERY = `query Board($roomId: ID) {
  workStatus(roomId: $roomId) {
    truncated
    asOf
    rooms {
      roomId
      roomName
      tasks { id roomId title status assigneeId assigneeHandle assigneeName createdAt updatedAt lastActivity stuck stuckSince }
      attention { id roomId roomName askedBy askedByHandle askedByName addressedTo addressedToHandle addressedToName question since ageSeconds }
      agents { agentId agentHandle agentName lastActivity lastMessageAt lastMessage messagesToday costToday currency stopped stoppedSince stopReason }
    }
  }
}`;
  const LIVE_SUBSCRIPTION = `subscription Live {
  workStatusChanged {
    kind
    roomId
    time
    eventId
    agentId
    agentHandle
    stopped
    stopReason
    task { id roomId title status assigneeId assigneeHandle assigneeName createdAt updatedAt lastActivity stuck stuckSince }
    attention { id roomId roomName askedBy askedByHandle askedByName addressedTo addressedToHandle addressedToName question since ageSeconds }
  }
}`;

  const $ = (id) => document.getElementById(id);
  const ui = {
    status: $("status"),
    asOf: $("as-of"),
    forget: $("forget-key"),
    error: $("error"),
    form: $("key-form"),
    input: $("key-input"),
    keyError: $("key-error"),
    board: $("board"),
    truncated: $("truncated"),
    empty: $("empty"),
    rooms: $("rooms"),
  };

  // The board's state. Every entry remembers the subscription ("epoch") it arrived on,
  // or 0 when a snapshot brought it: a snapshot read from the database may lag behind
  // the live stream, so what arrived live since the current subscription started is
  // kept over a snapshot that does not have it yet.
  const state = {
    key: "",
    gen: 0, // bumps when the key changes: answers for an older key are dropped
    epoch: 0, // bumps on every new subscription
    rooms: new Map(), // roomId -> room
    order: [], // roomIds as the last full snapshot listed them (latest activity first)
    truncated: false,
    clockOffset: 0, // server time - local time, ms (from asOf)
    asOf: null,
    lastChange: null,
    closed: new Map(), // attention id -> local ms it closed (an attention never reopens)
    deleted: new Map(), // task id -> {at, version}
    fatal: false, // a FORBIDDEN or similar: stop retrying until a new key
    syncing: 0, // full refetches under way: a room refetch would only repeat them
  };

  const conn = {
    ws: null,
    acked: false,
    subId: "",
    attempt: 0,
    retryTimer: 0,
    retryAt: 0,
    pingTimer: 0,
    resyncTimer: 0,
    lastSeen: 0,
  };
  const roomRefetch = new Map(); // roomId -> {timer, last}

  // ---- errors ----

  class BoardError extends Error {
    constructor(code, message) {
      super(message);
      this.code = code;
    }
  }

  function showError(text) {
    ui.error.textContent = text;
    ui.error.hidden = !text;
  }

  // handleError decides what an error means for the board: a bad key goes back to the
  // key form, a key without the role stops the board and says which role it needs,
  // anything else is shown while the board keeps trying.
  function handleError(err, what) {
    if (err && err.code === "STALE") {
      return;
    }
    const code = (err && err.code) || "";
    const msg = (err && err.message) || String(err);
    if (code === "UNAUTHENTICATED") {
      signOut("The server refused this key: " + msg);
      return;
    }
    if (code === "FORBIDDEN") {
      stopLive();
      state.fatal = true;
      setStatus("error", "stopped");
      showError("This key may not read the work board (" + msg + "). The board needs a key with the role " +
        READ_ROLES + " of your organization: forget this key and enter another.");
      return;
    }
    if (code === "BAD_USER_INPUT") {
      stopLive();
      state.fatal = true;
      setStatus("error", "stopped");
      showError("The server refused the board's request (" + msg + "). A platform key must name an organization, " +
        "which the board does not: use a key of the organization.");
      return;
    }
    showError("Cannot " + what + ": " + msg + (code && code !== "NETWORK" && code !== "HTTP" ? " (" + code + ")" : ""));
  }

  // ---- the API over HTTP ----

  async function graphql(query, variables) {
    const gen = state.gen;
    let resp;
    try {
      resp = await fetch(API_URL, {
        method: "POST",
        headers: {
          "Content-Type": "application/json",
          Accept: "application/json",
          Authorization: "Bearer " + state.key,
        },
        body: JSON.stringify({ query: query, variables: variables || {} }),
        cache: "no-store",
        credentials: "omit",
        redirect: "error",
      });
    } catch (e) {
      throw new BoardError("NETWORK", "the server cannot be reached (" + e.message + ")");
    }
    let body = null;
    try {
      body = await resp.json();
    } catch (e) {
      body = null;
    }
    if (gen !== state.gen) {
      throw new BoardError("STALE", "answer for another key");
    }
    const said = body && typeof body.error === "string" ? body.error : "";
    if (resp.status === 401) {
      throw new BoardError("UNAUTHENTICATED", said || "401 Unauthorized");
    }
    if (resp.status === 403) {
      throw new BoardError("FORBIDDEN", said || "403 Forbidden");
    }
    if (body && Array.isArray(body.errors) && body.errors.length > 0) {
      const e = body.errors[0] || {};
      const code = (e.extensions && e.extensions.code) || "";
      throw new BoardError(code || "GRAPHQL", e.message || "error without a message");
    }
    if (!resp.ok || !body || !body.data) {
      throw new BoardError("HTTP", "the server answered " + resp.status + (said ? ": " + said : ""));
    }
    return body.data;
  }

  // ---- merging snapshots and changes ----

  const ms = (t) => {
    const v = t ? Date.parse(t) : NaN;
    return isNaN(v) ? 0 : v;
  };

  // taskVersion orders two states of a task: later activity, then later update, then
  // stuck over not (a task without activity only ever becomes stuck).
  function taskNewer(a, b) {
    const d1 = ms(a.lastActivity) - ms(b.lastActivity);
    if (d1 !== 0) {
      return d1 > 0;
    }
    const d2 = ms(a.updatedAt) - ms(b.updatedAt);
    if (d2 !== 0) {
      return d2 > 0;
    }
    return !!a.stuck && !b.stuck;
  }

  function newRoom(roomId, roomName) {
    return { roomId: roomId, roomName: roomName || null, tasks: new Map(), attention: new Map(), agents: new Map() };
  }

  // mergeRoom folds a snapshot of one room (null: the snapshot had none) into what the
  // board holds, and returns the room, or null when nothing of it is left.
  function mergeRoom(local, snap, roomId) {
    const room = newRoom(roomId, (snap && snap.roomName) || (local && local.roomName));
    const epoch = state.epoch;
    const snapTasks = (snap && snap.tasks) || [];
    for (const t of snapTasks) {
      const del = state.deleted.get(t.id);
      if (del && !taskNewer(t, del.version)) {
        continue;
      }
      const mine = local && local.tasks.get(t.id);
      room.tasks.set(t.id, mine && mine.epoch === epoch && !taskNewer(t, mine) ? mine : Object.assign({ epoch: 0 }, t));
    }
    const snapAttention = (snap && snap.attention) || [];
    for (const a of snapAttention) {
      if (!state.closed.has(a.id)) {
        room.attention.set(a.id, Object.assign({ epoch: 0 }, a));
      }
    }
    const snapAgents = (snap && snap.agents) || [];
    for (const g of snapAgents) {
      const mine = local && local.agents.get(g.agentId);
      const agent = Object.assign({ epoch: 0 }, g);
      if (mine && mine.epoch === epoch && ms(mine.lastActivity) > ms(g.lastActivity)) {
        agent.lastActivity = mine.lastActivity;
        agent.epoch = epoch;
      }
      if (mine && mine.epoch === epoch && mine.stopped && ms(mine.stoppedSince) > ms(g.stoppedSince) &&
          ms(mine.stoppedSince) > ms(g.lastMessageAt)) {
        // A stop that came live after the snapshot was read.
        agent.stopped = mine.stopped;
        agent.stoppedSince = mine.stoppedSince;
        agent.stopReason = mine.stopReason;
        agent.epoch = epoch;
      }
      room.agents.set(g.agentId, agent);
    }
    if (local) {
      // What came live on this subscription and the snapshot does not have yet.
      for (const [id, t] of local.tasks) {
        if (t.epoch === epoch && !room.tasks.has(id)) {
          room.tasks.set(id, t);
        }
      }
      for (const [id, a] of local.attention) {
        if (a.epoch === epoch && !room.attention.has(id)) {
          room.attention.set(id, a);
        }
      }
      for (const [id, g] of local.agents) {
        if (g.epoch === epoch && !room.agents.has(id)) {
          room.agents.set(id, g);
        }
      }
    }
    if (!snap && room.tasks.size === 0 && room.attention.size === 0 && room.agents.size === 0) {
      return null;
    }
    return room;
  }

  function noteServerTime(asOf) {
    const t = ms(asOf);
    if (t) {
      state.clockOffset = t - Date.now();
      state.asOf = asOf;
    }
  }

  function applySnapshot(ws) {
    noteServerTime(ws.asOf);
    state.truncated = !!ws.truncated;
    const next = new Map();
    const order = [];
    for (const snap of ws.rooms || []) {
      const room = mergeRoom(state.rooms.get(snap.roomId), snap, snap.roomId);
      if (room) {
        next.set(room.roomId, room);
        order.push(room.roomId);
      }
    }
    for (const [id, local] of state.rooms) {
      if (!next.has(id)) {
        const room = mergeRoom(local, null, id);
        if (room) {
          // Known only from changes (the snapshot lags behind them): its name and
          // agents come with a refetch of its own.
          next.set(id, room);
          order.unshift(id);
          scheduleRoomRefetch(id, false);
        }
      }
    }
    state.rooms = next;
    state.order = order;
    pruneTombstones();
    renderAll();
  }

  function applyRoomSnapshot(roomId, ws) {
    noteServerTime(ws.asOf);
    const snap = (ws.rooms || []).find((r) => r.roomId === roomId) || null;
    const room = mergeRoom(state.rooms.get(roomId), snap, roomId);
    if (room) {
      if (!state.rooms.has(roomId)) {
        state.order.unshift(roomId);
      }
      state.rooms.set(roomId, room);
    } else {
      state.rooms.delete(roomId);
    }
    markDirty(roomId);
  }

  function pruneTombstones() {
    const old = Date.now() - TOMBSTONE_MS;
    for (const [id, at] of state.closed) {
      if (at < old) {
        state.closed.delete(id);
      }
    }
    for (const [id, d] of state.deleted) {
      if (d.at < old) {
        state.deleted.delete(id);
      }
    }
  }

  // ensureRoom returns the room of a change; a room the board has not seen yet is
  // created and fetched (for its name and agents).
  function ensureRoom(roomId, roomName) {
    let room = state.rooms.get(roomId);
    if (!room) {
      room = newRoom(roomId, roomName);
      state.rooms.set(roomId, room);
      state.order.unshift(roomId);
      scheduleRoomRefetch(roomId, true);
    } else if (!room.roomName && roomName) {
      room.roomName = roomName;
    }
    return room;
  }

  function applyChange(c) {
    if (!c || typeof c.roomId !== "string") {
      return;
    }
    state.lastChange = c.time || new Date(Date.now() + state.clockOffset).toISOString();
    const epoch = state.epoch;
    switch (c.kind) {
      case "TASK":
      case "TASK_STUCK": {
        if (!c.task) {
          scheduleRoomRefetch(c.roomId, true);
          break;
        }
        const room = ensureRoom(c.roomId, null);
        const t = c.task;
        if (t.status === "deleted") {
          room.tasks.delete(t.id);
          state.deleted.set(t.id, { at: Date.now(), version: t });
          break;
        }
        const mine = room.tasks.get(t.id);
        if (!mine || !taskNewer(mine, t)) {
          room.tasks.set(t.id, Object.assign({ epoch: epoch }, t));
        }
        break;
      }
      case "ATTENTION_OPENED": {
        const a = c.attention;
        if (!a) {
          scheduleRoomRefetch(c.roomId, true);
          break;
        }
        const room = ensureRoom(c.roomId, a.roomName);
        if (!state.closed.has(a.id)) {
          room.attention.set(a.id, Object.assign({ epoch: epoch }, a));
        }
        break;
      }
      case "ATTENTION_CLOSED": {
        const a = c.attention;
        if (!a) {
          scheduleRoomRefetch(c.roomId, true);
          break;
        }
        state.closed.set(a.id, Date.now());
        const room = state.rooms.get(c.roomId);
        if (room) {
          room.attention.delete(a.id);
        }
        break;
      }
      case "AGENT_ACTIVE": {
        if (c.agentId) {
          const room = ensureRoom(c.roomId, null);
          const mine = room.agents.get(c.agentId);
          if (mine) {
            if (ms(c.time) > ms(mine.lastActivity)) {
              mine.lastActivity = c.time;
            }
            if (mine.stopped && ms(c.time) > ms(mine.stoppedSince)) {
              // It posted again: the policy let it, the stop is over.
              mine.stopped = mine.stoppedSince = mine.stopReason = null;
            }
            mine.epoch = epoch;
          } else {
            room.agents.set(c.agentId, {
              epoch: epoch, agentId: c.agentId, agentHandle: c.agentHandle || null, agentName: null,
              lastActivity: c.time, lastMessageAt: null, lastMessage: null, messagesToday: null, costToday: null, currency: null,
            });
          }
        }
        // The figures (messages and cost today, the last message) come with the room.
        scheduleRoomRefetch(c.roomId, false);
        break;
      }
      case "AGENT_STOPPED": {
        if (c.agentId) {
          const room = ensureRoom(c.roomId, null);
          let mine = room.agents.get(c.agentId);
          if (!mine) {
            mine = {
              agentId: c.agentId, agentHandle: c.agentHandle || null, agentName: null,
              lastActivity: c.time, lastMessageAt: null, lastMessage: null, messagesToday: null, costToday: null, currency: null,
            };
            room.agents.set(c.agentId, mine);
          }
          if (!mine.lastMessageAt || ms(c.time) > ms(mine.lastMessageAt)) {
            mine.stopped = c.stopped;
            mine.stoppedSince = c.time;
            mine.stopReason = c.stopReason || null;
          }
          mine.epoch = epoch;
        }
        break;
      }
      default:
        scheduleRoomRefetch(c.roomId, true); // a kind this page does not know yet
    }
    markDirty(c.roomId);
    renderHeader();
  }

  function scheduleRoomRefetch(roomId, soon) {
    if (state.syncing > 0) {
      return; // the full refetch under way brings this room, or applySnapshot asks for it
    }
    let r = roomRefetch.get(roomId);
    if (!r) {
      r = { timer: 0, last: 0 };
      roomRefetch.set(roomId, r);
    }
    if (r.timer) {
      return;
    }
    const wait = soon ? 0 : Math.max(0, r.last + ROOM_REFETCH_MIN_MS - Date.now());
    r.timer = setTimeout(() => {
      r.timer = 0;
      r.last = Date.now();
      graphql(BOARD_QUERY, { roomId: roomId })
        .then((d) => applyRoomSnapshot(roomId, d.workStatus))
        .catch((e) => handleError(e, "load room " + roomId));
    }, wait);
  }

  function clearRoomRefetches() {
    for (const r of roomRefetch.values()) {
      clearTimeout(r.timer);
    }
    roomRefetch.clear();
  }

  async function resync() {
    const gen = state.gen;
    state.syncing++;
    let d;
    try {
      d = await graphql(BOARD_QUERY, {});
    } catch (e) {
      if (gen === state.gen) {
        state.syncing--;
      }
      handleError(e, "load the work status");
      return false;
    }
    if (gen !== state.gen) {
      return false;
    }
    state.syncing--;
    applySnapshot(d.workStatus);
    showError("");
    return true;
  }

  // ---- the live connection (graphql-transport-ws) ----

  function send(ws, msg) {
    try {
      ws.send(JSON.stringify(msg));
    } catch (e) {
      // closing: onclose follows
    }
  }

  function connect() {
    clearTimeout(conn.retryTimer);
    conn.retryTimer = 0;
    if (state.fatal || !state.key) {
      return;
    }
    if (conn.ws) {
      const old = conn.ws;
      conn.ws = null; // its handlers ignore it from now on
      old.close(1000, "replaced");
    }
    const gen = state.gen;
    setStatus("connecting", conn.attempt === 0 ? "connecting…" : "reconnecting…");
    let ws;
    try {
      ws = new WebSocket(WS_URL, "graphql-transport-ws");
    } catch (e) {
      showError("Cannot open the live connection: " + e.message);
      retryLater();
      return;
    }
    conn.ws = ws;
    conn.acked = false;
    conn.lastSeen = Date.now();
    ws.onopen = () => {
      if (conn.ws !== ws) {
        return;
      }
      send(ws, { type: "connection_init", payload: { Authorization: "Bearer " + state.key } });
    };
    ws.onmessage = (ev) => {
      if (conn.ws !== ws || gen !== state.gen) {
        return;
      }
      conn.lastSeen = Date.now();
      let msg;
      try {
        msg = JSON.parse(ev.data);
      } catch (e) {
        return;
      }
      onMessage(ws, msg);
    };
    ws.onclose = (ev) => {
      if (conn.ws !== ws) {
        return;
      }
      const wasAcked = conn.acked;
      conn.ws = null;
      conn.acked = false;
      clearInterval(conn.pingTimer);
      clearInterval(conn.resyncTimer);
      if (gen !== state.gen || state.fatal) {
        return;
      }
      if (ev.code === 4401 || ev.code === 4403) {
        signOut("The server refused this key on the live connection: " + (ev.reason || "code " + ev.code));
        return;
      }
      if (!wasAcked) {
        // Refused at init (the server closes without a reason a page can read) or not
        // reachable: the HTTP API says which, and shows the last state meanwhile.
        resync().then(() => {
          if (gen === state.gen) {
            retryLater();
          }
        });
        return;
      }
      retryLater();
    };
  }

  function onMessage(ws, msg) {
    switch (msg.type) {
      case "connection_ack": {
        conn.acked = true;
        state.epoch++;
        conn.subId = "work-" + state.epoch;
        send(ws, { id: conn.subId, type: "subscribe", payload: { query: LIVE_SUBSCRIPTION, operationName: "Live" } });
        setStatus("loading", "loading…");
        // Subscribed first, then read: nothing that happens in between is missed.
        resync().then((ok) => {
          if (conn.ws === ws && conn.acked && ok) {
            conn.attempt = 0; // the back-off starts over only once the board is live again
            setStatus("live", "live");
          }
        });
        clearInterval(conn.pingTimer);
        conn.pingTimer = setInterval(() => {
          if (Date.now() - conn.lastSeen > SILENCE_LIMIT_MS) {
            ws.close(4408, "no answer to ping");
            return;
          }
          send(ws, { type: "ping" });
        }, PING_EVERY_MS);
        clearInterval(conn.resyncTimer);
        conn.resyncTimer = setInterval(() => {
          if (conn.ws === ws && conn.acked) {
            resync();
          }
        }, RESYNC_EVERY_MS);
        break;
      }
      case "next": {
        if (msg.id !== conn.subId || !msg.payload) {
          return;
        }
        const p = msg.payload;
        if (Array.isArray(p.errors) && p.errors.length > 0) {
          const e = p.errors[0] || {};
          handleError(new BoardError((e.extensions && e.extensions.code) || "GRAPHQL", e.message || "error"), "follow the changes");
        }
        if (p.data && p.data.workStatusChanged) {
          applyChange(p.data.workStatusChanged);
        }
        break;
      }
      case "error": {
        if (msg.id !== conn.subId) {
          return;
        }
        const errs = Array.isArray(msg.payload) ? msg.payload : [msg.payload || {}];
        const e = errs[0] || {};
        const err = new BoardError((e.extensions && e.extensions.code) || "GRAPHQL", e.message || "subscription refused");
        handleError(err, "follow the changes");
        if (!state.fatal && conn.ws === ws) {
          ws.close(1000, "subscription failed"); // and try again later
        }
        break;
      }
      case "complete":
        if (msg.id === conn.subId && conn.ws === ws) {
          ws.close(1000, "subscription completed"); // the server ended it: start over
        }
        break;
      case "ping":
        send(ws, { type: "pong" });
        break;
      default:
        // pong, and anything newer
        break;
    }
  }

  function retryLater() {
    if (state.fatal || !state.key || conn.retryTimer) {
      return;
    }
    const base = Math.min(BACKOFF_MAX_MS, BACKOFF_MIN_MS * Math.pow(2, conn.attempt));
    const wait = Math.round(base * (0.8 + Math.random() * 0.4));
    conn.attempt++;
    conn.retryAt = Date.now() + wait;
    conn.retryTimer = setTimeout(connect, wait);
    setStatus("reconnecting", "reconnecting… (next try in " + Math.ceil(wait / 1000) + " s)");
  }

  function stopLive() {
    clearTimeout(conn.retryTimer);
    clearInterval(conn.pingTimer);
    clearInterval(conn.resyncTimer);
    conn.retryTimer = conn.pingTimer = conn.resyncTimer = 0;
    clearRoomRefetches();
    const ws = conn.ws;
    conn.ws = null;
    conn.acked = false;
    if (ws) {
      try {
        ws.close(1000, "bye");
      } catch (e) {
        // already closed
      }
    }
  }

  // ---- the key ----

  function storedKey() {
    try {
      return sessionStorage.getItem(KEY_ITEM) || "";
    } catch (e) {
      return "";
    }
  }

  function storeKey(k) {
    try {
      if (k) {
        sessionStorage.setItem(KEY_ITEM, k);
      } else {
        sessionStorage.removeItem(KEY_ITEM);
      }
    } catch (e) {
      // storage is off: the key lives in this page only
    }
  }

  function resetBoard() {
    stopLive();
    state.gen++;
    state.key = "";
    state.fatal = false;
    state.rooms = new Map();
    state.order = [];
    state.closed.clear();
    state.deleted.clear();
    state.truncated = false;
    state.syncing = 0;
    state.asOf = state.lastChange = null;
    conn.attempt = 0;
    ui.rooms.replaceChildren();
    renderHeader();
  }

  function signOut(message) {
    resetBoard();
    storeKey("");
    showError("");
    ui.board.hidden = true;
    ui.forget.hidden = true;
    ui.form.hidden = false;
    ui.keyError.textContent = message || "";
    ui.keyError.hidden = !message;
    setStatus("key", "waiting for a key");
    ui.input.focus();
  }

  function start(key) {
    resetBoard();
    state.key = key;
    ui.form.hidden = true;
    ui.keyError.hidden = true;
    ui.board.hidden = false;
    ui.forget.hidden = false;
    showError("");
    renderAll();
    connect();
  }

  ui.form.addEventListener("submit", (ev) => {
    ev.preventDefault();
    let k = ui.input.value.trim().replace(/^bearer\s+/i, "");
    ui.input.value = "";
    if (!k) {
      ui.keyError.textContent = "Enter an API key.";
      ui.keyError.hidden = false;
      return;
    }
    if (!/^[\x21-\x7e]+$/.test(k)) {
      ui.keyError.textContent = "That is not an API key: a key is printable ASCII without spaces (bpk_…).";
      ui.keyError.hidden = false;
      return;
    }
    storeKey(k);
    start(k);
  });

  ui.forget.addEventListener("click", () => signOut(""));

  window.addEventListener("online", () => {
    if (state.key && !conn.ws && !state.fatal) {
      conn.attempt = 0;
      connect();
    }
  });

  // ---- rendering ----

  const dirty = new Set();
  let renderTimer = 0;
  const sections = new Map(); // roomId -> section element

  function markDirty(roomId) {
    dirty.add(roomId);
    if (!renderTimer) {
      // Changes in a burst are drawn together, still well within a second.
      renderTimer = setTimeout(render, 30);
    }
  }

  function renderAll() {
    for (const id of sections.keys()) {
      dirty.add(id);
    }
    for (const id of state.rooms.keys()) {
      dirty.add(id);
    }
    clearTimeout(renderTimer);
    renderTimer = 0;
    render();
  }

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) {
      e.className = cls;
    }
    if (text !== undefined && text !== null) {
      e.textContent = String(text);
    }
    return e;
  }

  function who(handle, name, id) {
    if (handle) {
      return "@" + handle + (name ? " (" + name + ")" : "");
    }
    return name || id || "nobody";
  }

  function serverNow() {
    return Date.now() + state.clockOffset;
  }

  function duration(sec) {
    sec = Math.max(0, Math.floor(sec));
    const pad = (n) => (n < 10 ? "0" + n : String(n));
    if (sec < 60) {
      return sec + "s";
    }
    if (sec < 3600) {
      return Math.floor(sec / 60) + "m " + pad(sec % 60) + "s";
    }
    if (sec < 86400) {
      return Math.floor(sec / 3600) + "h " + pad(Math.floor((sec % 3600) / 60)) + "m";
    }
    return Math.floor(sec / 86400) + "d " + Math.floor((sec % 86400) / 3600) + "h";
  }

  // age is an element whose text is the time since `since`, kept current by tick().
  function age(cls, since, prefix, suffix) {
    const e = el("span", "age " + cls);
    e.dataset.since = since || "";
    e.dataset.prefix = prefix || "";
    e.dataset.suffix = suffix || "";
    drawAge(e, serverNow());
    return e;
  }

  function drawAge(e, now) {
    const t = ms(e.dataset.since);
    e.textContent = t ? e.dataset.prefix + duration((now - t) / 1000) + e.dataset.suffix : "";
    e.title = t ? new Date(t).toLocaleString() : "";
  }

  function tick() {
    const now = serverNow();
    for (const e of ui.rooms.querySelectorAll(".age[data-since]")) {
      drawAge(e, now);
    }
    for (const li of ui.rooms.querySelectorAll("li.agent")) {
      const t = ms(li.dataset.lastActivity);
      li.classList.toggle("recent", t > 0 && now - t < RECENT_MS);
    }
  }

  const statusRank = { in_progress: 0, open: 1, blocked: 1, review: 1, done: 3, closed: 3, cancelled: 3, canceled: 3 };

  function sortedTasks(room) {
    return Array.from(room.tasks.values()).sort((a, b) => {
      if (!!a.stuck !== !!b.stuck) {
        return a.stuck ? -1 : 1;
      }
      const ra = a.status in statusRank ? statusRank[a.status] : 2;
      const rb = b.status in statusRank ? statusRank[b.status] : 2;
      if (ra !== rb) {
        return ra - rb;
      }
      return ms(b.lastActivity) - ms(a.lastActivity);
    });
  }

  function taskRow(t) {
    const tr = el("tr", "task" + (t.stuck ? " stuck" : ""));
    tr.dataset.taskId = t.id;
    tr.dataset.status = t.status || "";
    const title = el("td", "task-title", t.title || "(untitled)");
    title.title = "task " + t.id;
    const status = el("td", "task-status");
    status.append(el("span", "badge", (t.status || "unknown").replace(/_/g, " ")));
    if (t.stuck) {
      status.append(" ", age("stuck-for", t.stuckSince, "stuck ", ""));
    }
    const assignee = el("td", "task-assignee", t.assigneeId || t.assigneeHandle ? who(t.assigneeHandle, t.assigneeName, t.assigneeId) : "unassigned");
    const last = el("td", "task-activity");
    last.append(age("last", t.lastActivity, "", " ago"));
    tr.append(title, status, assignee, last);
    return tr;
  }

  function attentionItem(a) {
    const li = el("li", "attention");
    li.dataset.attentionId = a.id;
    li.append(el("p", "question", a.question || "(no question)"));
    const meta = el("p", "meta");
    const asker = who(a.askedByHandle, a.askedByName, a.askedBy);
    const to = a.addressedTo ? who(a.addressedToHandle, a.addressedToName, a.addressedTo) : "anyone";
    meta.append(el("span", "asked-by", asker), " asks ", el("span", "addressed-to", to), " · ");
    meta.append(age("waiting", a.since, "waiting ", ""));
    li.append(meta);
    return li;
  }

  function agentItem(g) {
    const li = el("li", "agent");
    li.dataset.agentId = g.agentId;
    li.dataset.lastActivity = g.lastActivity || "";
    const t = ms(g.lastActivity);
    if (t && serverNow() - t < RECENT_MS) {
      li.classList.add("recent");
    }
    const head = el("p", "agent-head");
    head.append(el("span", "agent-handle", g.agentHandle ? "@" + g.agentHandle : g.agentId));
    if (g.agentName) {
      head.append(" ", el("span", "agent-name", g.agentName));
    }
    head.append(" · ", age("active", g.lastActivity, "active ", " ago"));
    if (g.stopped) {
      // textContent only, like everything else here: the reason names chat ids.
      li.classList.add("stopped");
      const badge = el("span", "stopped-badge", "stopped: " + g.stopped);
      if (g.stopReason) {
        badge.title = g.stopReason;
      }
      head.append(" ", badge);
    }
    li.append(head);
    const figures = [];
    if (g.messagesToday !== null && g.messagesToday !== undefined) {
      figures.push(g.messagesToday + " message" + (String(g.messagesToday) === "1" ? "" : "s") + " today");
    }
    if (g.costToday) {
      figures.push(g.costToday + " " + (g.currency || ""));
    }
    if (figures.length) {
      li.append(el("p", "agent-figures", figures.join(" · ")));
    }
    if (g.lastMessage) {
      const m = el("p", "last-message", g.lastMessage);
      m.title = g.lastMessage;
      li.append(m);
    }
    return li;
  }

  function roomSection(room) {
    const sec = el("section", "room");
    sec.dataset.roomId = room.roomId;
    const tasks = sortedTasks(room);
    const stuck = tasks.filter((t) => t.stuck).length;
    const attention = Array.from(room.attention.values()).sort((a, b) => ms(a.since) - ms(b.since));
    const agents = Array.from(room.agents.values()).sort((a, b) => ms(b.lastActivity) - ms(a.lastActivity));
    if (stuck > 0) {
      sec.classList.add("has-stuck");
    }
    if (attention.length > 0) {
      sec.classList.add("has-attention");
    }

    const h = el("h2", "room-name", room.roomName || room.roomId);
    if (room.roomName) {
      h.append(" ", el("span", "room-id", room.roomId));
    }
    sec.append(h);

    const taskPanel = el("div", "panel tasks-panel");
    taskPanel.append(el("h3", null, "Tasks (" + tasks.length + (stuck ? ", " + stuck + " stuck" : "") + ")"));
    if (tasks.length) {
      const table = el("table", "tasks");
      const head = el("tr");
      for (const c of ["Task", "Status", "Assignee", "Last activity"]) {
        head.append(el("th", null, c));
      }
      const thead = el("thead");
      thead.append(head);
      const tbody = el("tbody");
      for (const t of tasks) {
        tbody.append(taskRow(t));
      }
      table.append(thead, tbody);
      taskPanel.append(table);
    } else {
      taskPanel.append(el("p", "none", "No tasks."));
    }

    const attPanel = el("div", "panel attention-panel");
    attPanel.append(el("h3", null, "Waiting for a human (" + attention.length + ")"));
    if (attention.length) {
      const ul = el("ul", "attention-list");
      for (const a of attention) {
        ul.append(attentionItem(a));
      }
      attPanel.append(ul);
    } else {
      attPanel.append(el("p", "none", "Nobody is waiting."));
    }

    const agentPanel = el("div", "panel agents-panel");
    agentPanel.append(el("h3", null, "Active agents (" + agents.length + ")"));
    if (agents.length) {
      const ul = el("ul", "agents");
      for (const g of agents) {
        ul.append(agentItem(g));
      }
      agentPanel.append(ul);
    } else {
      agentPanel.append(el("p", "none", "No agent active in the last 24 hours."));
    }

    const body = el("div", "room-body");
    body.append(attPanel, taskPanel, agentPanel);
    sec.append(body);
    return sec;
  }

  // displayOrder puts the rooms that need someone first (a request waiting, then a
  // stuck task, the oldest first), then the others as the server listed them.
  function displayOrder() {
    const pos = new Map(state.order.map((id, i) => [id, i]));
    const urgency = (room) => {
      let oldest = Infinity;
      for (const a of room.attention.values()) {
        oldest = Math.min(oldest, ms(a.since));
      }
      if (oldest !== Infinity) {
        return [0, oldest];
      }
      for (const t of room.tasks.values()) {
        if (t.stuck) {
          oldest = Math.min(oldest, ms(t.stuckSince) || 0);
        }
      }
      return oldest !== Infinity ? [1, oldest] : [2, 0];
    };
    return Array.from(state.rooms.values())
      .map((r) => ({ r: r, u: urgency(r), p: pos.has(r.roomId) ? pos.get(r.roomId) : -1 }))
      .sort((a, b) => a.u[0] - b.u[0] || a.u[1] - b.u[1] || a.p - b.p)
      .map((x) => x.r.roomId);
  }

  function render() {
    renderTimer = 0;
    for (const id of dirty) {
      const old = sections.get(id);
      const room = state.rooms.get(id);
      if (!room) {
        if (old) {
          old.remove();
        }
        sections.delete(id);
        continue;
      }
      const sec = roomSection(room);
      if (old) {
        old.replaceWith(sec);
      }
      sections.set(id, sec);
    }
    dirty.clear();
    const want = displayOrder().map((id) => sections.get(id)).filter(Boolean);
    const have = Array.from(ui.rooms.children);
    if (want.length !== have.length || want.some((s, i) => s !== have[i])) {
      ui.rooms.replaceChildren(...want);
    }
    ui.empty.hidden = !state.key || state.asOf === null || state.rooms.size > 0;
    ui.truncated.hidden = !state.truncated;
    renderHeader();
  }

  function renderHeader() {
    const parts = [];
    if (state.asOf) {
      parts.push("loaded " + new Date(ms(state.asOf)).toLocaleTimeString());
    }
    if (state.lastChange) {
      parts.push("last change " + new Date(ms(state.lastChange)).toLocaleTimeString());
    }
    ui.asOf.textContent = parts.join(" · ");
  }

  function setStatus(kind, text) {
    ui.status.dataset.state = kind;
    ui.status.textContent = text;
  }

  // ---- start ----

  setInterval(tick, 1000);
  const k = storedKey();
  if (k) {
    start(k);
  } else {
    signOut("");
  }
})();
