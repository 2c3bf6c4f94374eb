// lockctl console: polls /api/state, renders the held locks with their leases counting down
// between polls, the recent events, and (with --allow-unlock) a force-unlock button behind a
// confirmation. Every text from Redis goes into the page as text (textContent), never as HTML:
// lock keys and request ids can come from request input.
"use strict";

const $ = (id) => document.getElementById(id);
let pollMs = 1000;
let lastOk = 0;
let allowUnlock = false;
let pending = null; // {kind, key} waiting for confirmation
// the console puts a token into its page; an unlock without it is refused
const unlockToken = () => document.querySelector('meta[name="lockctl-token"]')?.content || "";

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function formatLeft(ms) {
  if (ms <= 0) return "expired";
  if (ms < 60000) return (ms / 1000).toFixed(1) + "s";
  const s = Math.floor(ms / 1000);
  if (s < 3600) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  return Math.floor(s / 3600) + "h" + String(Math.floor(s / 60) % 60).padStart(2, "0") + "m";
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour12: false });
}

// Leases are counted down from when the answer arrived: the server says how old its list is
// (now_ms - taken_ms, both on its clock), so the browser's clock does not matter.
function tickLeases() {
  const now = performance.now();
  for (const span of document.querySelectorAll(".lease[data-deadline]")) {
    const left = Number(span.dataset.deadline) - now;
    span.textContent = formatLeft(left);
    span.classList.toggle("low", left > 0 && left < 5000);
    span.classList.toggle("gone", left <= 0);
  }
}

function holderNode(holder, receivedAt, age) {
  const row = el("div", "holder");
  row.append(el("span", "mode", holder.mode));
  row.append(el("span", "owner", holder.owner));
  const request = el("span", "request", holder.request_id || "no request id");
  if (!holder.request_id) request.classList.add("none");
  row.append(request);
  if (holder.permits !== null && holder.permits !== undefined) {
    row.append(el("span", "permits", holder.permits + (holder.permits === 1 ? " permit" : " permits")));
  }
  const lease = el("span", "lease", "-");
  if (holder.lease_left_ms !== null && holder.lease_left_ms !== undefined) {
    lease.dataset.deadline = String(receivedAt + holder.lease_left_ms - age);
  }
  row.append(lease);
  if (holder.hold_count > 1) row.append(el("span", "permits", "×" + holder.hold_count));
  return row;
}

function kindLabel(lock) {
  if (lock.kind !== "semaphore") return lock.kind;
  const used = lock.holders.reduce((n, h) => n + (h.permits || 0), 0);
  return lock.permits === null ? "semaphore" : "semaphore " + used + "/" + lock.permits;
}

// What the table shows apart from the leases: while it stays the same, the rows are kept (a
// button is not replaced under the pointer) and only the leases' deadlines move.
function tableSignature(state) {
  return JSON.stringify([allowUnlock, state.locks.map((l) => [
    l.key, l.kind, l.hold_count, l.fence, l.waiting_services, l.permits,
    l.holders.map((h) => [h.owner, h.mode, h.request_id, h.permits, h.hold_count]),
  ])]);
}
let shownTable = null;

function renderLocks(state, receivedAt) {
  const age = Math.max(0, state.now_ms - state.taken_ms);
  const signature = tableSignature(state);
  if (signature === shownTable) {
    const spans = document.querySelectorAll("#lock-rows .lease");
    const holders = state.locks.flatMap((l) => l.holders);
    holders.forEach((h, i) => {
      if (spans[i] && h.lease_left_ms !== null && h.lease_left_ms !== undefined) {
        spans[i].dataset.deadline = String(receivedAt + h.lease_left_ms - age);
      }
    });
    tickLeases();
    return;
  }
  shownTable = signature;
  const rows = $("lock-rows");
  const fresh = document.createDocumentFragment();
  for (const lock of state.locks) {
    const tr = el("tr", "lock");
    tr.dataset.key = lock.key;
    tr.dataset.kind = lock.kind;
    tr.append(el("td", "key", lock.key));
    const kind = el("td");
    kind.append(el("span", "kind", kindLabel(lock)));
    tr.append(kind);
    const holders = el("td", "holders");
    for (const h of lock.holders) holders.append(holderNode(h, receivedAt, age));
    tr.append(holders);
    tr.append(el("td", "num holds", lock.hold_count));
    tr.append(el("td", "num fence", lock.fence === null ? "-" : lock.fence));
    tr.append(el("td", "num waiting", lock.waiting_services));
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
  $("empty").hidden = state.locks.length > 0;
  $("count").textContent = "(" + state.locks.length + ")";
  $("actions-head").hidden = !allowUnlock;
  tickLeases();
}

let shownEvents = null;

function renderEvents(events) {
  const newest = events.length ? events[0].id : -1;
  if (newest === shownEvents) return;
  shownEvents = newest;
  const list = $("events");
  const fresh = document.createDocumentFragment();
  for (const e of events) {
    const li = el("li", "event event-" + e.event);
    li.append(el("span", "event-time", clock(e.at_ms)));
    li.append(el("span", "event-name", e.event));
    let text = e.kind + " " + e.key + " · " + e.mode + " " + e.owner;
    if (e.request_id) text += " (request " + e.request_id + ")";
    li.append(el("span", "event-text", text));
    fresh.append(li);
  }
  list.replaceChildren(fresh);
  $("no-events").hidden = events.length > 0;
}

async function poll() {
  try {
    const response = await fetch("/api/state", { cache: "no-store" });
    if (!response.ok) throw new Error("HTTP " + response.status);
    const state = await response.json();
    const receivedAt = performance.now();
    allowUnlock = state.allow_unlock;
    pollMs = Math.max(200, state.interval_ms || 1000);
    $("source").textContent = "redis " + state.mode + " · prefix " + state.prefix +
      (state.pattern ? " · keys " + state.pattern : "") +
      " · force-unlock " + (allowUnlock ? "on" : "off");
    renderLocks(state, receivedAt);
    renderEvents(state.events);
    $("error").hidden = !state.error;
    $("error").textContent = state.error ? "Last refresh failed: " + state.error : "";
    lastOk = Date.now();
    $("status").textContent = "updated " + clock(state.taken_ms);
    $("status").className = "status ok";
  } catch (err) {
    $("status").textContent = "console unreachable (" + err.message + ")";
    $("status").className = "status stale";
  } finally {
    setTimeout(poll, pollMs);
  }
}

function askUnlock(lock) {
  pending = { kind: lock.kind, key: lock.key };
  $("confirm").returnValue = "";
  const who = lock.holders.map((h) => h.owner + (h.request_id ? " (request " + h.request_id + ")" : ""));
  $("confirm-text").textContent = "Remove the " + lock.kind + " lock “" + lock.key + "” held by " +
    who.join(", ") + "?";
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
  $("confirm-yes").addEventListener("click", () => $("confirm").close("unlock"));
  $("confirm-cancel").addEventListener("click", () => $("confirm").close("cancel"));
  $("confirm").addEventListener("close", () => {
    if ($("confirm").returnValue === "unlock") unlockConfirmed();
    else pending = null;
  });
  setInterval(tickLeases, 100);
  poll();
});
