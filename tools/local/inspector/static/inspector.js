// The local inspector's page: plain JavaScript over /_local/api/ (api.py), no build step, no dependency.
// Views by URL fragment: #/orders, #/orders/<orderId>, #/queues. While "live" is ticked, the current view
// and the queue counts are fetched again every second; everything is rendered with textContent, so a
// message body is shown as text, never as markup.
"use strict";

const API = "/_local/api";
const POLL_MS = 1000;
const state = { filters: { status: "", customer: "" }, openMessages: new Set(), report: null, busy: false };

// --- small DOM helpers ---------------------------------------------------------------------------------
function h(tag, attributes, ...children) {
  const element = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (name === "class") element.className = value;
    else if (name.startsWith("on")) element.addEventListener(name.slice(2), value);
    else element.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return element;
}

const shortName = (logicalId) => (logicalId || "").replace(/Function$/, "") || logicalId;
// Ids (order ids, UUIDs, hex) of more than ID_KEEP + 4 characters are shown as their first ID_KEEP and an
// ellipsis; the element carrying the shortened text has the whole text as its title.
const ID_KEEP = 8;
const LONG_ID = /[A-Za-z]?-?[0-9a-f]{8}[0-9a-f-]{8,}/g;
const elideIds = (text) => String(text || "").replace(LONG_ID, (id) => (id.length > ID_KEEP + 4 ? `${id.slice(0, ID_KEEP)}…` : id));
// One line of text that never leaves its box: ids elided, and what is still too long for the box cut
// with an ellipsis (CSS); the whole value on hover.
function line(text, attributes) {
  const full = String(text || "");
  return h("span", { class: "line", title: full, ...(attributes || {}) }, elideIds(full));
}
const pad = (n, width) => String(n).padStart(width, "0");
function clock(ms) {
  if (!ms) return "";
  const d = new Date(ms);
  return `${pad(d.getHours(), 2)}:${pad(d.getMinutes(), 2)}:${pad(d.getSeconds(), 2)}.${pad(d.getMilliseconds(), 3)}`;
}
const duration = (ms) => (ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${Math.round(ms)} ms`);
const money = (cents, currency) => (typeof cents === "number" ? `${(cents / 100).toFixed(2)} ${currency || ""}` : "");

class ApiError extends Error {
  constructor(status, document) {
    const error = (document && document.error) || { code: `http_${status}`, message: `HTTP ${status}` };
    super(error.message);
    this.status = status;
    this.code = error.code;
    this.document = document;
  }
}

async function call(path, options) {
  const response = await fetch(`${API}${path}`, { cache: "no-store", ...options });
  let document = null;
  try {
    document = await response.json();
  } catch {
    document = null;
  }
  if (!response.ok) throw new ApiError(response.status, document);
  return document;
}

function showError(error) {
  const banner = document.getElementById("error");
  if (!error) {
    banner.hidden = true;
    banner.replaceChildren();
    return;
  }
  banner.replaceChildren(h("strong", {}, error.code || "error"), " ", error.message);
  banner.dataset.code = error.code || "";
  banner.hidden = false;
}

// --- routing and polling -------------------------------------------------------------------------------
function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  if (parts[0] === "orders" && parts[1]) return { view: "order", orderId: parts[1] };
  if (parts[0] === "queues") return { view: "queues" };
  return { view: "orders" };
}

let refreshing = false;
let queuesShown = "";  // what the queue view last drew (renderQueues)
async function refresh() {
  if (refreshing) return;
  refreshing = true;
  const current = route();
  document.querySelectorAll("nav a").forEach((a) => {
    a.classList.toggle("active", a.dataset.view === (current.view === "order" ? "orders" : current.view));
  });
  try {
    if (current.view === "orders") await renderOrders();
    else if (current.view === "order") await renderOrder(current.orderId);
    else await renderQueues();
    if (current.view !== "queues") await renderBadge(await call("/queues?messages=0"));
    await renderHealth();
    document.getElementById("updated").textContent = `updated ${clock(Date.now())}`;
  } catch (error) {
    showError(error instanceof ApiError ? error : { code: "unreachable", message: `the local stack does not answer: ${error}` });
  } finally {
    refreshing = false;
  }
}

// --- the stack's threads (GET /_local/api/health; a stack without that endpoint answers 404) -------------
async function renderHealth() {
  const banner = document.getElementById("health");
  let result;
  try {
    result = await call("/health");
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) {
      banner.hidden = true;  // this stack does not report its threads
      return;
    }
    throw error;
  }
  const troubled = (result.threads || []).filter((t) => !t.alive || t.restarts > 0);
  banner.hidden = troubled.length === 0;
  banner.replaceChildren(
    h("strong", {}, troubled.some((t) => !t.alive) ? "The stack is not running whole" : "Part of the stack restarted"),
    h("ul", {}, troubled.map((t) => h("li", { "data-testid": "health-thread", "data-thread": t.name, "data-alive": String(t.alive) },
      h("span", { class: "mono" }, t.name), " ",
      t.alive ? `restarted ${t.restarts} time(s)` : "stopped" + (t.restarts ? ` after ${t.restarts} restart(s)` : ""),
      t.error ? h("span", { class: "dim" }, ` — last error: ${t.error}`) : null))));
}

function renderBadge(document_) {
  const waiting = document_.queues
    .filter((q) => q.role !== "consumer queue")
    .reduce((sum, q) => sum + q.visible + q.inFlight, 0);
  const badge = document.getElementById("parked-badge");
  badge.textContent = String(waiting);
  badge.title = "messages in dead-letter queues and the relay poison queue";
  badge.hidden = waiting === 0;
}

// --- orders --------------------------------------------------------------------------------------------
function statusBadge(status) {
  return h("span", { class: `status status-${(status || "").toLowerCase()}`, "data-testid": "order-status" }, status);
}

function ordersFilterForm(statuses) {
  const select = h("select", { id: "status-filter", "aria-label": "status", onchange: (e) => { state.filters.status = e.target.value; refresh(); } },
    h("option", { value: "" }, "every status"),
    statuses.map((s) => h("option", { value: s, selected: s === state.filters.status }, s)));
  const customer = h("input", {
    id: "customer-filter", type: "search", placeholder: "customer id contains…", value: state.filters.customer, "aria-label": "customer",
    oninput: (e) => { state.filters.customer = e.target.value; refresh(); },
  });
  const lookup = h("form", { class: "lookup", onsubmit: (e) => {
    e.preventDefault();
    const id = e.target.elements.orderId.value.trim();
    if (id) location.hash = `#/orders/${encodeURIComponent(id)}`;
  } }, h("input", { name: "orderId", id: "order-lookup", placeholder: "order id", "aria-label": "order id" }), h("button", {}, "Open"));
  return h("div", { class: "filters" }, select, customer, lookup);
}

async function renderOrders() {
  const query = new URLSearchParams();
  if (state.filters.status) query.set("status", state.filters.status);
  if (state.filters.customer) query.set("customer", state.filters.customer);
  const result = await call(`/orders?${query}`);
  showError(null);
  document.getElementById("stack").textContent = `orders on ${result.store} (${result.orderStore})`;
  const view = document.getElementById("view");
  // The filters stay in place across refreshes (re-creating them would take the focus from the input).
  if (view.dataset.view !== "orders") {
    view.replaceChildren(ordersFilterForm(result.statuses), h("div", { id: "orders-results" }));
    view.dataset.view = "orders";
  }
  const rows = result.orders.map((order) =>
    h("tr", { "data-testid": "order-row", "data-order-id": order.orderId },
      h("td", {}, h("a", { href: `#/orders/${encodeURIComponent(order.orderId)}`, class: "mono" }, order.orderId)),
      h("td", {}, order.customerId),
      h("td", {}, statusBadge(order.status)),
      h("td", { class: "num" }, money(order.totalAmount, order.currency)),
      h("td", { class: "dim" }, order.createdAt),
      h("td", { class: "dim" }, order.updatedAt)));
  const table = h("table", { class: "orders", "data-testid": "orders-table" },
    h("thead", {}, h("tr", {}, ["Order", "Customer", "Status", "Total", "Created", "Updated"].map((c) => h("th", {}, c)))),
    h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 6, class: "dim" }, "no order matches"))));
  const count = h("p", { class: "dim", "data-testid": "orders-count" }, `${result.matching} of ${result.total} orders, newest first`);
  document.getElementById("orders-results").replaceChildren(count, table);
}

// --- one order's timeline ------------------------------------------------------------------------------
async function renderOrder(orderId) {
  const view = document.getElementById("view");
  let result;
  try {
    result = await call(`/orders/${encodeURIComponent(orderId)}`);
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) {
      view.replaceChildren(h("p", { class: "dim" }, h("a", { href: "#/orders" }, "← orders")));
      view.dataset.view = "order";
    }
    throw error;
  }
  showError(null);
  document.getElementById("stack").textContent = `orders on ${result.store} (${result.orderStore})`;
  const order = result.order;
  const lines = (order.lines || []).map((l) => `${l.quantity} × ${l.sku} @ ${money(l.unitPrice, order.currency)}`).join(", ");
  const summary = h("section", { class: "order-summary" },
    h("p", {}, h("a", { href: "#/orders" }, "← orders")),
    h("h2", {}, h("span", { class: "mono", "data-testid": "order-id" }, order.orderId), " ", statusBadge(order.status)),
    h("p", {}, `customer ${order.customerId} · ${money(order.totalAmount, order.currency)} · version ${order.version} · created ${order.createdAt}`),
    lines ? h("p", { class: "dim" }, lines) : null);
  const note = result.note ? [h("p", { class: "note", "data-testid": "timeline-note" }, result.note)] : [];
  view.replaceChildren(summary, waterfall(result.hops), ...note);
  view.dataset.view = "order";
}

const COLUMNS = ["Hop", "What", "Start", "Duration", "Outcome", "Retries", "Event"];

function waterfall(hops) {
  if (!hops.length) return h("p", { class: "dim" }, "no hop recorded yet");
  const start = Math.min(...hops.map((hop) => hop.startMs));
  const end = Math.max(...hops.map((hop) => hop.startMs + hop.durationMs));
  const span = Math.max(end - start, 1);
  const rows = hops.map((hop) => {
    const left = ((hop.startMs - start) / span) * 100;
    const width = Math.max((hop.durationMs / span) * 100, 0.4);
    const what = [hop.detail || hop.eventType, hop.batchSize > 1 ? `batch of ${hop.batchSize}` : null].filter(Boolean).join(" · ");
    const linked = hop.relation === "linked";
    const ids = [hop.eventId && `event ${hop.eventId}`, hop.correlationId && `correlation ${hop.correlationId}`,
      hop.causationId && `caused by ${hop.causationId}`, hop.traceId && `trace ${hop.traceId}`].filter(Boolean).join("\n");
    return h("tr", {
      class: `hop outcome-${hop.outcome}`, "data-testid": "hop-row", "data-function": hop.function, "data-trigger": hop.trigger,
      "data-event-type": hop.eventType || "", "data-event-id": hop.eventId || "", "data-outcome": hop.outcome,
      "data-hop-id": hop.id, "data-parent": hop.parent || "", "data-depth": hop.depth, "data-relation": hop.relation || "",
    },
      h("td", { class: "hop-name", style: `padding-left: ${0.5 + hop.depth * 0.9}rem` },
        h("span", { class: "line" },
          hop.depth ? h("span", { class: "dim tree", title: linked ? "a trace of its own, linked to its parent's (as X-Ray links an SQS consumer)" : "continues its parent's trace" }, linked ? "┈ " : "└ ") : null,
          h("strong", { title: hop.function }, shortName(hop.function))),
        line(`${hop.trigger} · ${hop.source}`, { class: "line dim small" })),
      h("td", { class: "hop-what" },
        line(what, { "data-testid": "hop-what" }),
        hop.result ? line(`→ ${hop.result}`, { class: `line small hop-result outcome-${hop.outcome}`, "data-testid": "hop-result" }) : null,
        hop.error ? line(hop.error, { class: "line hop-error", "data-testid": "hop-error" }) : null),
      h("td", { class: "mono small" }, line(clock(hop.startMs)), line(`+${duration(hop.startMs - start)}`, { class: "line dim" })),
      h("td", { class: "num" }, duration(hop.durationMs), hop.coldStart ? h("span", { class: "cold", title: "cold start" }, " ❄") : null),
      h("td", {}, h("span", { class: `outcome outcome-${hop.outcome}`, "data-testid": "hop-outcome", title: hop.result || hop.error || hop.outcome }, hop.outcome)),
      h("td", { class: "num", "data-testid": "hop-retries" }, hop.trigger === "api" || hop.trigger === "sns" ? "–" : String(hop.retries)),
      h("td", { class: "mono small", title: ids }, hop.eventId ? `${hop.eventId.slice(0, 8)}…` : "–"),
      h("td", { class: "track", title: `${duration(hop.durationMs)} from +${duration(hop.startMs - start)}` },
        h("div", { class: "bar", style: `left: ${left}%; width: ${width}%` })));
  });
  const headers = [...COLUMNS, `Waterfall (${duration(span)})`].map((c) => h("th", { title: c }, c));
  return h("div", { class: "timeline-frame" },
    h("table", { class: "waterfall", "data-testid": "timeline" }, h("thead", {}, h("tr", {}, headers)), h("tbody", {}, rows)));
}

// --- queues and the redrive buttons --------------------------------------------------------------------
// An action is "redrive", "redrive-poison" or "redrive-dlq/<dead-letter queue>": its command is the first part.
const commandOf = (action) => action.split("/")[0];
function actionLabel(queue) {
  const command = commandOf(queue.action);
  if (command === "redrive-dlq") return `Redrive to ${queue.deadLetterFor}`;
  return command === "redrive-poison" ? "Redrive poison" : "Redrive";
}

// What the stack saw of a dead-lettered message: its receive count and why it last failed.
function deliveryFields(message) {
  const fields = [];
  if (message.receiveCount !== null && message.receiveCount !== undefined) fields.push(["received", `${message.receiveCount} time(s)`]);
  if (message.invokeCount !== null && message.invokeCount !== undefined) fields.push(["invoked", `${message.invokeCount} time(s)`]);
  return fields.map(([k, v]) => h("span", { class: "field", "data-testid": `message-${k}` }, h("span", { class: "dim" }, `${k} `), v));
}

function messageCard(queue, message) {
  const details = h("details", { "data-message-id": message.messageId, "data-testid": "queue-message",
    ontoggle: (e) => (e.target.open ? state.openMessages.add(message.messageId) : state.openMessages.delete(message.messageId)) },
    h("summary", {}, h("span", { class: "mono small" }, clock(message.sentAtMs)), " ",
      Object.entries(message.summary).filter(([, v]) => v !== null && v !== undefined && typeof v !== "object")
        .map(([k, v]) => h("span", { class: "field" }, h("span", { class: "dim" }, `${k} `), String(v))),
      deliveryFields(message),
      queue.role === "consumer dead-letter queue" || queue.role === "relay dead-letter queue"
        ? h("span", { class: "block hop-error small", "data-testid": "message-last-error" },
            message.lastError ? `last error: ${message.lastError}` : h("span", { class: "dim" }, "last error: not seen by this stack"))
        : null),
    h("pre", {}, typeof message.body === "string" ? message.body : JSON.stringify(message.body, null, 2)));
  details.open = state.openMessages.has(message.messageId);
  return details;
}

async function renderQueues() {
  const result = await call("/queues");
  showError(null);
  renderBadge(result);
  const view = document.getElementById("view");
  // Redrawn only when what it shows changed: a redraw replaces the buttons, and a click whose press and
  // release straddle it is lost (the press on the old button, the release on the new one).
  const shown = JSON.stringify([result, state.report, state.busy]);
  if (view.dataset.view === "queues" && shown === queuesShown) return;
  queuesShown = shown;
  const cards = result.queues.map((queue) => {
    const total = queue.visible + queue.inFlight + queue.delayed;
    const header = h("header", {},
      h("h3", {}, queue.logicalId), h("span", { class: "dim" }, queue.role),
      queue.consumer ? h("span", { class: "dim" }, ` → ${shortName(queue.consumer)}`) : null,
      queue.deadLetterFor ? h("span", { class: "dim" }, ` (dead letters of ${queue.deadLetterFor})`) : null);
    const counts = h("p", { class: "counts", "data-testid": "queue-counts" },
      h("span", { "data-testid": "queue-visible" }, String(queue.visible)), " waiting · ", String(queue.inFlight), " in flight · ", String(queue.delayed), " delayed");
    // A button only where there is something to redrive (in flight: a redrive running, say).
    const action = queue.action && total > 0
      ? h("button", { class: "primary", "data-testid": `action-${commandOf(queue.action)}`, disabled: state.busy,
          title: `python -m operations ${commandOf(queue.action)}`, onclick: () => confirmAction(queue, total) }, actionLabel(queue))
      : null;
    const messages = queue.peeked ? queue.messages.map((message) => messageCard(queue, message)) : [];
    const more = queue.peeked && queue.visible > queue.messages.length
      ? h("p", { class: "dim" }, `the first ${queue.messages.length} of ${queue.visible} shown`) : null;
    const note = !queue.peeked && queue.role === "consumer queue"
      ? h("p", { class: "dim small" }, "counts only: reading a consumer's queue would count towards its maxReceiveCount") : null;
    return h("section", { class: `queue ${total ? "has-messages" : ""}`, "data-testid": "queue-card", "data-queue": queue.logicalId, "data-role": queue.role },
      header, counts, action, messages, more, note);
  });
  const report = state.report ? actionReport(state.report) : null;
  view.replaceChildren(...(report ? [report] : []), h("div", { class: "queues" }, cards));
  view.dataset.view = "queues";
}

function confirmAction(queue, total) {
  const dialog = document.getElementById("confirm");
  const command = commandOf(queue.action);
  const what = command === "redrive-dlq"
    ? `Each message is moved back to ${queue.deadLetterFor} (a new message with the same body and attributes, as SQS's DLQ redrive moves it) and deleted from ${queue.logicalId} once sent.`
    : "Each message is republished to the bus and deleted only when its report is complete.";
  document.getElementById("confirm-text").textContent =
    `Run "python -m operations ${command}" on ${queue.logicalId} (${total} message(s) there now)? ${what}`;
  dialog.returnValue = "";
  dialog.onclose = () => { if (dialog.returnValue === "yes") runAction(queue.action); };
  dialog.showModal();
}

async function runAction(action) {
  state.busy = true;
  state.report = { running: action };
  await renderQueues().catch(() => {});
  try {
    const result = await call(`/actions/${action.split("/").map(encodeURIComponent).join("/")}`,
      { method: "POST", headers: { "Content-Type": "application/json" }, body: "{}" });
    state.report = { ok: result.complete, result };
  } catch (error) {
    const code = error instanceof ApiError ? error.code : "unreachable";
    // Nothing to redrive (the queue emptied since the page drew the button) is no failure.
    state.report = { ok: false, nothing: code === "nothing_to_redrive",
      error: error instanceof ApiError ? { code: error.code, message: error.message } : { code, message: String(error) },
      result: error.document && error.document.report };
  } finally {
    state.busy = false;
  }
  await refresh();
}

function messageReport(m) {
  if (m.destination) {  // redrive-dlq: moved to its queue as a new message
    return h("li", {}, h("span", { class: "mono small" }, m.messageId || ""),
      m.complete ? ` moved as ${m.newMessageId}` : h("span", { class: "hop-error" }, ` ${m.error}`));
  }
  return h("li", {}, h("span", { class: "mono small" }, m.messageId || ""), ` found ${m.found}, published ${m.published}, complete ${m.complete}`,
    (m.missing || []).length ? h("ul", {}, m.missing.map((text) => h("li", { class: "hop-error" }, text))) : null);
}

function actionReport(report) {
  if (report.running) {
    return h("section", { class: "report running", "data-testid": "action-report", "data-state": "running" }, `running ${report.running} …`);
  }
  const result = report.result;
  const headline = report.error
    ? h("p", { "data-testid": "action-message" }, report.nothing ? null : h("strong", {}, report.error.code), report.nothing ? "" : " ", report.error.message)
    : h("p", { "data-testid": "action-message" }, result.message);
  const summary = result && result.summary
    ? h("p", { class: "counts", "data-testid": "action-summary" },
        `redriven ${result.summary.redriven} · kept ${result.summary.kept}` + ("parked" in result.summary ? ` · parked ${(result.summary.parked || []).length}` : ""))
    : null;
  const messages = result ? (result.messages || []).map(messageReport) : [];
  const errors = result ? (result.errors || []).map((e) => h("li", { class: "hop-error" }, `${e.messageId || ""} ${e.error}`)) : [];
  const [kind, state_] = report.nothing ? ["neutral", "nothing"] : report.ok ? ["ok", "complete"] : ["not-ok", "incomplete"];
  return h("section", { class: `report ${kind}`, "data-testid": "action-report", "data-state": state_ },
    h("button", { class: "close", title: "dismiss", onclick: () => { state.report = null; refresh(); } }, "×"),
    headline, summary,
    messages.length || errors.length ? h("ul", {}, messages, errors) : null,
    result ? h("p", { class: "dim small mono" }, `${result.command} → exit ${result.exitCode} in ${result.seconds} s`) : null,
    result && result.stderr ? h("details", {}, h("summary", {}, "stderr"), h("pre", {}, result.stderr)) : null);
}

// --- start ---------------------------------------------------------------------------------------------
window.addEventListener("hashchange", () => { showError(null); refresh(); });
window.addEventListener("DOMContentLoaded", () => {
  refresh();
  setInterval(() => { if (document.getElementById("live").checked) refresh(); }, POLL_MS);
});
