// lockctl console: polls /api/state, renders the held locks with their leases counting down
// between polls, the recent events, and (with --allow-unlock) a force-unlock button behind a
// confirmation. Every text from Redis goes into the page as text (textContent), never as HTML:
// lock keys, instance names and request ids can come from request input.
//
// Data that may be out of date is shown as such: when the server's last refresh failed, when
// its list is older than two refresh intervals, or when the console itself stops answering,
// a banner says since when, the status dot is not green and the rows are dimmed.
"use strict";

const $ = (id) => document.getElementById(id);
let pollMs = 1000;
let allowUnlock = false;
let pending = null; // {kind, key} waiting for confirmation
let lastState = null; // the last answer of /api/state
let lastReceived = 0; // performance.now() when it arrived
let consoleDownSince = null; // ms since the epoch: the first poll of the console that failed
// the console puts a token into its page; an unlock without it is refused
const unlockToken = () => document.querySelector('meta[name="lockctl-token"]')?.content || "";

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

const known = (v) => v !== null && v !== undefined;

function formatLeft(ms) {
  if (ms <= 0) return "expired";
  if (ms < 60000) return (ms / 1000).toFixed(1) + "s";
  const s = Math.floor(ms / 1000);
  if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  return Math.floor(s / 3600) + "h" + String(Math.floor(s / 60) % 60).padStart(2, "0") + "m";
}

// How long a hold has lasted: 45s, 13m 05s, 2h 13m, 3d 4h.
function formatAge(ms) {
  const s = Math.max(0, Math.floor(ms / 1000));
  if (s < 60) return s + "s";
  if (s < 3600) return Math.floor(s / 60) + "m " + String(s % 60).padStart(2, "0") + "s";
  if (s < 86400) return Math.floor(s / 3600) + "h " + Math.floor(s / 60) % 60 + "m";
  return Math.floor(s / 86400) + "d " + Math.floor(s / 3600) % 24 + "h";
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour12: false });
}

// Leases count down and ages up from when the answer arrived: the server says how old its list
// is (now_ms - taken_ms, both on its clock), so the browser's clock does not matter.
function tick() {
  const now = performance.now();
  for (const span of document.querySelectorAll(".lease[data-deadline]")) {
    const left = Number(span.dataset.deadline) - now;
    span.textContent = formatLeft(left);
    span.classList.toggle("low", left > 0 && left < 5000);
    span.classList.toggle("gone", left <= 0);
  }
  for (const span of document.querySelectorAll(".age[data-since]")) {
    span.textContent = "held " + formatAge(now - Number(span.dataset.since));
  }
  showFreshness();
}

// ---- which locks, in which order ------------------------------------------------------------

const view = { filter: "", sort: "key" };

// A glob (`*` any run, `?` one character) as a regular expression matching a whole key.
function globRegExp(glob) {
  const body = glob.replace(/[.+^${}()|[\]\\]/g, "\\$&").replace(/\*/g, ".*").replace(/\?/g, ".");
  return new RegExp("^" + body + "$", "i");
}

// The filter: a glob when it has `*` or `?`, else text found anywhere in the key.
function keyMatcher(filter) {
  const text = filter.trim();
  if (!text) return () => true;
  if (/[*?]/.test(text)) {
    const re = globRegExp(text);
    return (key) => re.test(key);
  }
  const lower = text.toLowerCase();
  return (key) => key.toLowerCase().includes(lower);
}

// When the oldest hold of `lock` was granted (ms since the epoch, the server's clock);
// Infinity when unknown. Each lock is read at its own moment of a list, so the grant times
// order the holds where the ages might not.
function lockGranted(lock) {
  return lock.holders.reduce((m, h) => Math.min(m, known(h.granted_at_ms) ? h.granted_at_ms : Infinity), Infinity);
}

// Callers waiting for `lock`: per service when the services report it, else the services.
function lockWaiting(lock) {
  if (lock.waiters && lock.waiters.length) {
    return lock.waiters.reduce((n, w) => n + (known(w.waiting) ? w.waiting : 1), 0);
  }
  return lock.waiting_services || 0;
}

const compare = (x, y) => (x < y ? -1 : x > y ? 1 : 0);
const byKey = (a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : a.kind < b.kind ? -1 : a.kind > b.kind ? 1 : 0);
const sorts = {
  key: byKey,
  age: (a, b) => compare(lockGranted(a), lockGranted(b)) || byKey(a, b),
  waiters: (a, b) => lockWaiting(b) - lockWaiting(a) || byKey(a, b),
};

function visibleLocks(state) {
  const matches = keyMatcher(view.filter);
  return state.locks.filter((l) => matches(l.key)).sort(sorts[view.sort] || byKey);
}

// The filter and the order live in the address (#filter=goods:*&sort=age): a link to the
// console shows the same view.
function readView() {
  const params = new URLSearchParams(location.hash.slice(1));
  view.filter = params.get("filter") || "";
  view.sort = sorts[params.get("sort")] ? params.get("sort") : "key";
  $("filter").value = view.filter;
  $("sort").value = view.sort;
}

function writeView() {
  const params = new URLSearchParams();
  if (view.filter) params.set("filter", view.filter);
  if (view.sort !== "key") params.set("sort", view.sort);
  const hash = params.toString();
  history.replaceState(null, "", hash ? "#" + hash : location.pathname);
  if (lastState) renderLocks(lastState, lastReceived);
}

// ---- the locks ------------------------------------------------------------------------------

function holderNode(holder, receivedAt, age) {
  const row = el("div", "holder");
  row.append(el("span", "mode", holder.mode));
  if (holder.instance_name) row.append(el("span", "instance", holder.instance_name));
  row.append(el("span", "owner", holder.owner));
  const request = el("span", "request", holder.request_id || "no request id");
  if (!holder.request_id) request.classList.add("none");
  row.append(request);
  if (known(holder.permits)) {
    row.append(el("span", "permits", holder.permits + (holder.permits === 1 ? " permit" : " permits")));
  }
  if (holder.hold_count > 1) row.append(el("span", "permits", "×" + holder.hold_count));
  if (known(holder.held_for_ms)) {
    const held = el("span", "age", "held " + formatAge(holder.held_for_ms + age));
    held.dataset.since = String(receivedAt - holder.held_for_ms - age);
    row.append(held);
  }
  const lease = el("span", "lease", "-");
  if (known(holder.lease_left_ms)) {
    lease.dataset.deadline = String(receivedAt + holder.lease_left_ms - age);
  }
  row.append(lease);
  return row;
}

// A lock released under its minimum hold: done, but kept on Redis until it runs out.
function keptNode(lock, takenMs) {
  const row = el("div", "holder kept-note");
  row.append(el("span", "done", "done, kept until " + clock(takenMs + lock.kept.left_ms)));
  const h = lock.kept.holder;
  if (h) {
    const by = [h.instance_name, h.owner].filter(known).join(" · ");
    row.append(el("span", "muted", "released by " + by));
  }
  return row;
}

// The key, breakable after each `:` (a long key wraps between its parts, not inside one).
function keyNode(key) {
  const cell = el("td", "key");
  key.split(/(?<=:)/).forEach((part, i) => {
    if (i > 0) cell.append(document.createElement("wbr"));
    cell.append(part);
  });
  return cell;
}

function waitingNode(lock) {
  const cell = el("td", "waiting");
  cell.dataset.label = "waiting";
  if (lock.waiters && lock.waiters.length) {
    for (const w of lock.waiters) {
      const line = el("div", "waiter");
      line.append(el("span", "waiter-count", known(w.waiting) ? w.waiting : "?"));
      line.append(el("span", "waiter-service", w.instance_name || w.service));
      line.title = known(w.waiting) ? w.waiting + " callers of " + w.service + " wait"
        : w.service + " waits (it does not say how many callers)";
      cell.append(line);
    }
  } else if (lock.waiting_services) {
    cell.append(el("span", "waiter-count", lock.waiting_services));
    cell.append(el("span", "muted", lock.waiting_services === 1 ? " service" : " services"));
  } else {
    cell.append(el("span", "muted", "none"));
  }
  return cell;
}

function kindLabel(lock) {
  if (lock.kind !== "semaphore") return lock.kind;
  const used = lock.holders.reduce((n, h) => n + (h.permits || 0), 0);
  return lock.permits === null ? "semaphore" : "semaphore " + used + "/" + lock.permits;
}

// What the table shows apart from the leases and ages: while it stays the same, the rows are
// kept (a button is not replaced under the pointer) and only the countdowns move.
function tableSignature(shown) {
  return JSON.stringify([allowUnlock, view, shown.map((l) => [
    l.key, l.kind, l.hold_count, l.fence, l.waiting_services, l.permits, l.waiters,
    l.kept && l.kept.holder && l.kept.holder.owner,
    l.holders.map((h) => [h.owner, h.instance_name, h.mode, h.request_id, h.permits, h.hold_count]),
  ])]);
}
let shownTable = null;

function renderLocks(state, receivedAt) {
  const age = Math.max(0, state.now_ms - state.taken_ms);
  const shown = visibleLocks(state);
  const signature = tableSignature(shown);
  if (signature === shownTable) {
    const leases = document.querySelectorAll("#lock-rows .lease");
    const ages = document.querySelectorAll("#lock-rows .age");
    const holders = shown.flatMap((l) => l.holders);
    holders.forEach((h, i) => {
      if (leases[i] && known(h.lease_left_ms)) {
        leases[i].dataset.deadline = String(receivedAt + h.lease_left_ms - age);
      }
    });
    holders.filter((h) => known(h.held_for_ms)).forEach((h, i) => {
      if (ages[i]) ages[i].dataset.since = String(receivedAt - h.held_for_ms - age);
    });
    tick();
    return;
  }
  shownTable = signature;
  const rows = $("lock-rows");
  const fresh = document.createDocumentFragment();
  for (const lock of shown) {
    const tr = el("tr", "lock");
    tr.dataset.key = lock.key;
    tr.dataset.kind = lock.kind;
    if (lock.kept && !lock.holders.length) tr.classList.add("kept");
    tr.append(keyNode(lock.key));
    const kind = el("td", "kind-cell");
    kind.append(el("span", "kind", kindLabel(lock)));
    tr.append(kind);
    const holders = el("td", "holders");
    for (const h of lock.holders) holders.append(holderNode(h, receivedAt, age));
    if (lock.kept) holders.append(keptNode(lock, state.taken_ms));
    tr.append(holders);
    tr.append(waitingNode(lock));
    const fence = el("td", "num fence", lock.fence === null ? "-" : lock.fence);
    fence.dataset.label = "fence";
    tr.append(fence);
    if (allowUnlock) {
      const cell = el("td", "actions");
      const button = el("button", "unlock", "Force unlock");
      button.type = "button";
      button.addEventListener("click", () => askUnlock(lock));
      cell.append(button);
      tr.append(cell);
    }
    fresh.append(tr);
  }
  rows.replaceChildren(fresh);
  const all = state.locks.length;
  $("empty").hidden = shown.length > 0;
  $("empty").textContent = all ? "No held lock matches the filter." : "No locks held.";
  $("count").textContent = shown.length === all ? "(" + all + ")" : "(" + shown.length + " of " + all + ")";
  $("actions-head").hidden = !allowUnlock;
  tick();
}

// ---- events ---------------------------------------------------------------------------------

const eventLabels = {
  acquired: "acquired",
  released: "released",
  expired: "expired",
  "force-unlocked": "force-unlocked",
  lost: "lost",
};
const eventHints = {
  expired: "its lease ran out before it was released",
  "force-unlocked": "removed by a force-unlock; its holders lose it",
  lost: "a holder learned that it no longer held the lock",
};

let shownEvents = null;

function renderEvents(events) {
  const signature = events.length ? events[0].id + "/" + events.length : "";
  if (signature === shownEvents) return;
  shownEvents = signature;
  const list = $("events");
  const fresh = document.createDocumentFragment();
  for (const e of events) {
    const li = el("li", "event event-" + e.event);
    li.append(el("span", "event-time", clock(e.at_ms)));
    const label = el("span", "event-name", eventLabels[e.event] || e.event);
    if (eventHints[e.event]) label.title = eventHints[e.event];
    li.append(label);
    let text = e.kind + " " + e.key;
    const who = [e.mode, e.instance_name, e.owner].filter(known).join(" ");
    if (who) text += " · " + who;
    if (e.request_id) text += " (request " + e.request_id + ")";
    // how long the hold had lasted when last seen
    if (e.held_ms && e.event !== "acquired") text += " after " + formatAge(e.held_ms);
    if (e.by) text += " · by " + e.by;
    if (e.detail) text += " · " + e.detail;
    li.append(el("span", "event-text", text));
    fresh.append(li);
  }
  list.replaceChildren(fresh);
  $("no-events").hidden = events.length > 0;
}

// ---- the header: topology and freshness -----------------------------------------------------

function renderNodes(state) {
  const redis = state.redis || { mode: state.mode, nodes: [] };
  const list = $("nodes");
  const fresh = document.createDocumentFragment();
  const mode = el("li", "node-mode", "redis " + redis.mode + (redis.master_name ? " " + redis.master_name : ""));
  fresh.append(mode);
  for (const n of redis.nodes) {
    const item = el("li", "node " + (n.healthy === true ? "up" : n.healthy === false ? "down" : "unknown"));
    item.append(el("span", "node-address", n.address));
    item.append(el("span", "node-role", n.role));
    if (known(n.latency_ms)) {
      item.append(el("span", "node-latency", n.latency_ms.toFixed(n.latency_ms < 10 ? 1 : 0) + " ms"));
    }
    if (n.detail && !n.healthy) item.append(el("span", "node-detail", n.detail));
    let title = n.address + ": " + n.role + (n.replica_of ? " of " + n.replica_of : "") + ", " +
      (n.healthy ? "healthy" : n.healthy === false ? "unhealthy" : "unknown");
    if (redis.health === "refresh") title += " (as the console's last refresh found it)";
    if (redis.health === "probe" && redis.probed_ms) title += " (probed at " + clock(redis.probed_ms) + ")";
    if (n.detail) title += " - " + n.detail;
    item.title = title;
    fresh.append(item);
  }
  list.replaceChildren(fresh);
}

// Whether what the page shows is stale, and what to say about it.
function freshness() {
  if (!lastState) return null;
  const s = lastState;
  // the server's clock, moved on by the time since its answer
  const serverNow = s.now_ms + (performance.now() - lastReceived);
  const asOf = s.last_ok_ms ? " showing the locks as of " + clock(s.last_ok_ms) : " no locks read yet";
  if (consoleDownSince !== null) {
    return { since: consoleDownSince, text: "Console unreachable since " + clock(consoleDownSince) + ":" + asOf + "." };
  }
  const late = s.taken_ms + 2 * pollMs;
  if (s.stale || serverNow > late + pollMs) {
    const since = known(s.stale_since_ms) ? s.stale_since_ms : late;
    if (s.error) {
      return { since, text: "Redis unreachable, stale since " + clock(since) + ":" + asOf + ". " + s.error };
    }
    return { since, text: "Stale since " + clock(since) + ": no refresh succeeded since;" + asOf + "." };
  }
  return null;
}

function showFreshness() {
  const stale = freshness();
  document.body.classList.toggle("is-stale", !!stale);
  $("stale").hidden = !stale;
  if (stale) {
    $("stale").textContent = stale.text;
    $("status").textContent = "stale since " + clock(stale.since);
    $("status").className = "status stale";
  } else if (lastState) {
    $("status").textContent = "updated " + clock(lastState.taken_ms);
    $("status").className = "status ok";
  }
}

async function poll() {
  try {
    const response = await fetch("/api/state", { cache: "no-store" });
    if (!response.ok) throw new Error("HTTP " + response.status);
    const state = await response.json();
    const receivedAt = performance.now();
    consoleDownSince = null;
    lastState = state;
    lastReceived = receivedAt;
    allowUnlock = state.allow_unlock;
    pollMs = Math.max(200, state.interval_ms || 1000);
    $("source").textContent = "prefix " + state.prefix +
      (state.pattern ? " · keys " + state.pattern : "") +
      " · force-unlock " + (allowUnlock ? "on" : "off");
    renderNodes(state);
    renderLocks(state, receivedAt);
    renderEvents(state.events);
    const lastError = state.last_error;
    $("status").title = lastError
      ? "last failed refresh at " + clock(lastError.at_ms) + ": " + lastError.message
      : "no refresh has failed";
  } catch (err) {
    if (consoleDownSince === null) consoleDownSince = Date.now();
    $("status").textContent = "console unreachable (" + err.message + ")";
  } finally {
    showFreshness();
    setTimeout(poll, pollMs);
  }
}

// ---- force-unlock ---------------------------------------------------------------------------

function askUnlock(lock) {
  pending = { kind: lock.kind, key: lock.key };
  $("confirm").returnValue = "";
  const who = lock.holders.map((h) => (h.instance_name ? h.instance_name + " " : "") + h.owner +
    (h.request_id ? " (request " + h.request_id + ")" : ""));
  $("confirm-text").textContent = "Remove the " + lock.kind + " lock “" + lock.key + "”" +
    (who.length ? " held by " + who.join(", ") : "") + "?";
  $("confirm").showModal();
}

async function unlockConfirmed() {
  if (!pending) return;
  const target = pending;
  pending = null;
  try {
    const response = await fetch("/api/unlock", {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-Lockctl-Token": unlockToken() },
      body: JSON.stringify(target),
    });
    const answer = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(answer.error || "HTTP " + response.status);
  } catch (err) {
    $("error").hidden = false;
    $("error").textContent = "Force-unlock failed: " + err.message;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  readView();
  $("filter").addEventListener("input", () => { view.filter = $("filter").value; writeView(); });
  $("sort").addEventListener("change", () => { view.sort = $("sort").value; writeView(); });
  window.addEventListener("hashchange", () => { readView(); if (lastState) renderLocks(lastState, lastReceived); });
  $("confirm-yes").addEventListener("click", () => $("confirm").close("unlock"));
  $("confirm-cancel").addEventListener("click", () => $("confirm").close("cancel"));
  $("confirm").addEventListener("close", () => {
    if ($("confirm").returnValue === "unlock") unlockConfirmed();
    else pending = null;
  });
  setInterval(tick, 100);
  poll();
});
