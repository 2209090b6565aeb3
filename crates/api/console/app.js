// tank's web console. It is a client of the public HTTPS API and nothing else: every
// figure comes from a request of the API, every action is one, and the server decides
// what the caller may do (a refusal is shown as the server words it).
//
// Every element is built with textContent (see `h`): text from the server is never parsed
// as HTML. The hash names the page (#/pools, #/datasets/POOL/DS); a page renders into
// <main>, and its timers and streams end when another page opens.
"use strict";

const CSRF = document.querySelector('meta[name="csrf-token"]').content;
const main = document.getElementById("main");
let me = { caller: null, admin: false };
// The page on screen, and the number of the newest render (a slower, older render that
// finishes after a newer one is thrown away).
let shownView = null;
let generation = 0;

/** Ends `fn` (a timer, a stream) with the page `view`: when another page replaces it, or
 *  at once if it was already thrown away. */
function onLeave(view, fn) {
  if (view.dataset.dead) fn();
  else (view.leave || (view.leave = [])).push(fn);
}

function leave(view) {
  if (!view) return;
  view.dataset.dead = "1";
  for (const f of view.leave || []) f();
  view.leave = [];
}

// ---- DOM and formatting helpers ------------------------------------------------------

/** An element: props are attributes, `on*` handlers, or `text`; children are nodes,
 *  strings (as text), arrays, or null. */
function h(tag, props, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") el.textContent = String(v);
    else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "value") el.value = v;
    else if (k === "checked") el.checked = !!v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  add(el, kids);
  return el;
}

function add(el, kids) {
  for (const k of kids.flat(Infinity)) {
    if (k === null || k === undefined || k === false) continue;
    el.append(k instanceof Node ? k : document.createTextNode(String(k)));
  }
  return el;
}

function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

/** Bytes as zfs prints them: 1.50G, 512K. */
function size(n) {
  if (n === null || n === undefined || isNaN(n)) return "-";
  const units = ["B", "K", "M", "G", "T", "P", "E"];
  let i = 0;
  let v = Number(n);
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  if (i === 0) return v + "B";
  return (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2)) + units[i];
}

function rate(bps) { return size(bps) + "/s"; }

function duration(secs) {
  if (secs === null || secs === undefined || !isFinite(secs)) return "unknown";
  secs = Math.round(secs);
  const d = Math.floor(secs / 86400), hh = Math.floor((secs % 86400) / 3600);
  const m = Math.floor((secs % 3600) / 60), s = secs % 60;
  if (d) return d + "d " + hh + "h";
  if (hh) return hh + "h " + m + "m";
  if (m) return m + "m " + s + "s";
  return s + "s";
}

function when(secs) {
  if (!secs) return "-";
  return new Date(secs * 1000).toLocaleString();
}

function pct(part, whole) {
  return whole ? Math.min(100, (100 * part) / whole) : 0;
}

function stateBadge(state) {
  const s = String(state || "UNKNOWN");
  const cls = s === "ONLINE" ? "ok" : ["DEGRADED", "OFFLINE", "REMOVED", "SPARE", "INUSE", "AVAIL"].includes(s) ? "warn" : "bad";
  return h("span", { class: "badge " + cls, text: s });
}

function capacityBar(used, total, label) {
  const p = pct(used, total);
  return h("div", { class: "bar" + (p >= 90 ? " full" : p >= 80 ? " high" : ""), role: "meter",
    "aria-valuemin": 0, "aria-valuemax": 100, "aria-valuenow": Math.round(p), "aria-label": label },
    h("span", { "data-width": Math.round(p) }));
}

// Widths are set through the CSSOM (a style attribute would need 'unsafe-inline').
function applyWidths(root) {
  for (const el of root.querySelectorAll("[data-width]")) el.style.width = el.dataset.width + "%";
}

function toast(msg) {
  const t = document.getElementById("toast");
  const p = h("p", { text: msg });
  t.append(p);
  // The newest three at most.
  while (t.children.length > 3) t.firstElementChild.remove();
  setTimeout(() => p.remove(), 6000);
}

// ---- The API -------------------------------------------------------------------------

class ApiError extends Error {
  constructor(kind, message, status) { super(message); this.kind = kind; this.status = status; }
}

/** One request of the API: `op` with its fields; resolves to the response's `data`. */
async function api(op, fields, opts) {
  const headers = { "Content-Type": "application/json", "X-CSRF-Token": CSRF };
  if (opts && opts.background) headers["X-Tank-Background"] = "1";
  let r;
  try {
    r = await fetch("/api/v1/" + op, { method: "POST", headers, credentials: "same-origin",
      body: JSON.stringify(fields || {}) });
  } catch (e) {
    throw new ApiError("unreachable", "The server cannot be reached (" + e.message + "). Is the daemon running?", 0);
  }
  const body = await r.json().catch(() => null);
  if (r.status === 401) {
    location.replace("/login?why=expired");
    throw new ApiError("unauthenticated", "Your session has ended.", 401);
  }
  if (!body) throw new ApiError("failed", "The server answered " + r.status + " with no body.", r.status);
  if (body.error) throw new ApiError(body.error.kind, body.error.message, r.status);
  const resp = body.ok.response;
  for (const n of body.ok.notes || []) toast(n);
  return resp.data === undefined ? resp : resp.data;
}

/** Shows an error where it happened, as the server said it. */
function errorBox(e) {
  const msg = e instanceof ApiError ? e.message : String(e && e.message ? e.message : e);
  return h("p", { class: "error", role: "alert", text: msg });
}

/** A form's submit: runs `action`, shows its error in the form, disables the button meanwhile. */
function onSubmit(form, action) {
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    for (const old of form.querySelectorAll(".error")) old.remove();
    const buttons = form.querySelectorAll("button");
    buttons.forEach((b) => (b.disabled = true));
    try {
      await action(new FormData(form));
    } catch (e) {
      form.append(errorBox(e));
    } finally {
      buttons.forEach((b) => (b.disabled = false));
    }
  });
  return form;
}

function field(label, input, hint) {
  const id = input.id || "f-" + Math.random().toString(36).slice(2, 9);
  input.id = id;
  if (hint) input.setAttribute("aria-describedby", id + "-hint");
  return hint ? [h("label", { for: id, text: label }), h("p", { class: "hint", text: hint, id: id + "-hint" }), input]
    : [h("label", { for: id, text: label }), input];
}

function checkbox(name, label, checked) {
  const id = "c-" + Math.random().toString(36).slice(2, 9);
  return h("label", { class: "check", for: id }, h("input", { type: "checkbox", id, name, checked }), label);
}

/** Asks before a change; with `typed`, the user must type that name (destructive actions). */
function confirmAction({ title, lose, typed, verb, danger }) {
  return new Promise((resolve) => {
    const input = typed ? h("input", { autocomplete: "off", spellcheck: "false", "aria-describedby": "confirm-hint" }) : null;
    const ok = h("button", { type: "submit", class: "primary" + (danger ? " danger" : ""), text: verb || "Confirm", disabled: !!typed });
    const cancel = h("button", { type: "button", text: "Cancel" });
    const form = h("form", { method: "dialog", class: "stack" },
      h("h2", { text: title }),
      lose ? h("p", { text: lose }) : null,
      typed ? [h("label", { for: "confirm-typed", id: "confirm-hint", text: "Type " + typed + " to confirm" })] : null,
      input,
      h("div", { class: "row" }, ok, cancel));
    if (input) {
      input.id = "confirm-typed";
      input.addEventListener("input", () => (ok.disabled = input.value !== typed));
    }
    const dlg = h("dialog", { "aria-label": title }, form);
    document.body.append(dlg);
    let answered = false;
    const done = (v) => { if (!answered) { answered = true; dlg.close(); dlg.remove(); resolve(v); } };
    form.addEventListener("submit", (ev) => { ev.preventDefault(); if (!typed || input.value === typed) done(true); });
    cancel.addEventListener("click", () => done(false));
    dlg.addEventListener("cancel", () => done(false));
    dlg.showModal();
    (input || ok).focus();
  });
}

/** Asks for one value in a dialog; resolves to the text, or null if canceled. */
function askText({ title, label, hint, value, verb }) {
  return new Promise((resolve) => {
    const input = h("input", { id: "ask-text", value: value || "", autocomplete: "off", spellcheck: "false" });
    const form = h("form", { method: "dialog", class: "stack" },
      h("h2", { text: title }),
      h("label", { for: "ask-text", text: label }),
      hint ? h("p", { class: "hint", text: hint }) : null,
      input,
      h("div", { class: "row" }, h("button", { type: "submit", class: "primary", text: verb || "OK" }),
        h("button", { type: "button", text: "Cancel", onclick: () => done(null) })));
    const dlg = h("dialog", { "aria-label": title }, form);
    document.body.append(dlg);
    let answered = false;
    function done(v) { if (!answered) { answered = true; dlg.close(); dlg.remove(); resolve(v); } }
    form.addEventListener("submit", (ev) => { ev.preventDefault(); done(input.value.trim() || null); });
    dlg.addEventListener("cancel", () => done(null));
    dlg.showModal();
    input.focus();
  });
}

/** Shows the page again after a change made from `el`, unless another page has been
 *  opened meanwhile (`el` is no longer in it). */
function refresh(el) {
  if (el.isConnected) route();
}

/** Runs an action from a button: asks first if `confirm` is given, then reports. */
async function act(button, fn, confirm) {
  if (confirm && !(await confirm())) return;
  button.disabled = true;
  try {
    const r = await fn();
    if (r && r.message) toast(r.message);
    watchHealth();
    refresh(button);
  } catch (e) {
    button.after(errorBox(e));
  } finally {
    button.disabled = false;
  }
}

function table(headers, rows) {
  return h("div", { class: "scroll" }, h("table", {},
    h("thead", {}, h("tr", {}, headers.map((c) => h("th", { scope: "col", class: c.num ? "num" : null, text: c.label || c })))),
    h("tbody", {}, rows)));
}

/** Long lists: `render(slice)` for one page of `items`, with Previous/Next. */
function paged(items, per, render) {
  const box = h("div");
  let page = 0;
  const pages = Math.max(1, Math.ceil(items.length / per));
  const draw = () => {
    clear(box);
    box.append(render(items.slice(page * per, (page + 1) * per)));
    if (pages > 1) {
      box.append(h("div", { class: "row pager" },
        h("button", { type: "button", text: "Previous", disabled: page === 0, onclick: () => { page--; draw(); } }),
        h("span", { class: "muted", text: "Page " + (page + 1) + " of " + pages + " (" + items.length + ")" }),
        h("button", { type: "button", text: "Next", disabled: page >= pages - 1, onclick: () => { page++; draw(); } })));
    }
  };
  draw();
  return box;
}

// ---- The router ----------------------------------------------------------------------

const pages = {
  dashboard: pageDashboard,
  pools: pagePools,
  datasets: pageDatasets,
  shares: pageShares,
  users: pageUsers,
  account: pageAccount,
  tools: pageTools,
  browse: pageBrowse,
};

async function route() {
  const mine = ++generation;
  const parts = location.hash.replace(/^#\/?/, "").split("/").map(decodeURIComponent);
  const name = pages[parts[0]] ? parts[0] : "dashboard";
  for (const a of document.querySelectorAll("nav a")) {
    if (a.getAttribute("href") === "#/" + name) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  document.getElementById("nav").classList.remove("open");
  const view = h("div");
  try {
    await pages[name](view, parts.slice(1));
  } catch (e) {
    view.append(errorBox(e));
  }
  if (mine !== generation) {
    leave(view);
    return;
  }
  leave(shownView);
  shownView = view;
  clear(main).append(view);
  applyWidths(main);
  document.title = (view.querySelector("h1") ? view.querySelector("h1").textContent + " · " : "") + "tank";
}

// ---- Dashboard -----------------------------------------------------------------------

async function pageDashboard(view) {
  view.append(h("h1", { text: "Dashboard" }));
  const body = h("div");
  view.append(body);
  const charts = new Map();
  const draw = async () => {
    const [reports, summaries, cache, events] = await Promise.all([
      api("pool_status", {}, { background: true }),
      api("pool_list", {}, { background: true }),
      api("cache_stats", {}, { background: true }).catch(() => null),
      api("pool_events", {}, { background: true }).catch(() => []),
    ]);
    banner(reports);
    clear(body);
    if (!reports.length) {
      body.append(h("div", { class: "card" }, h("p", { text: "No pool is imported." }),
        me.admin ? h("p", {}, h("a", { href: "#/pools", text: "Create or import a pool" })) : null));
    }
    for (const r of reports) {
      const s = summaries.find((x) => x.name === r.name) || {};
      body.append(poolCard(r, s, cache, charts));
    }
    body.append(cacheCard(cache));
    body.append(eventsCard(events.slice(-15).reverse()));
    applyWidths(body);
  };
  await draw();
  const timer = setInterval(() => draw().catch(() => {}), 5000);
  onLeave(view, () => clearInterval(timer));
  // A pool event (an error, a state change, a scrub's start or end) shows at once.
  liveCharts(view, charts, () => draw().catch(() => {}));
}

/** Keeps the banner true on every page: the pools' health now, and every 10 s. */
function watchHealth() {
  api("pool_status", {}, { background: true }).then(banner).catch(() => {});
}

/** The red line over every page while a pool is not healthy. */
function banner(reports) {
  const b = document.getElementById("banner");
  const bad = reports.filter((r) => r.state !== "ONLINE" || deviceErrors(r.config) > 0);
  clear(b);
  b.hidden = bad.length === 0;
  for (const r of bad) {
    const errs = deviceErrors(r.config);
    b.append(h("p", {}, "Pool " + r.name + " is " + r.state + (errs ? " with " + errs + " device errors" : "") + ". ",
      r.action ? r.action + " " : "", h("a", { href: "#/dashboard", text: "See the pool" })));
  }
}

function deviceErrors(vdevs) {
  let n = 0;
  for (const v of vdevs || []) n += v.read_errors + v.write_errors + v.cksum_errors + deviceErrors(v.children);
  return n;
}

function poolCard(r, s, cache, charts) {
  const sick = r.state !== "ONLINE";
  const errs = deviceErrors(r.config) + r.sections.reduce((n, [, vs]) => n + deviceErrors(vs), 0);
  const card = h("section", { class: "card" + (sick ? " bad" : errs ? " warn" : ""), "aria-labelledby": "pool-" + r.name });
  card.append(h("div", { class: "spread" },
    h("h2", { id: "pool-" + r.name }, r.name + " ", stateBadge(r.state)),
    me.admin ? h("a", { href: "#/pools/" + encodeURIComponent(r.name), text: "Manage" }) : null));
  if (r.status) card.append(h("p", {}, h("b", { text: "status: " }), r.status));
  if (r.action) card.append(h("p", {}, h("b", { text: "action: " }), r.action));
  if (r.suspended) card.append(h("p", { class: "error", text: "I/O suspended: " + r.suspended }));
  const sp = r.space;
  card.append(h("div", { class: "grid" },
    h("div", { class: "stat" }, h("span", { class: "muted", text: "Used" }), h("b", { text: size(sp.allocated) + " of " + size(sp.size) }),
      capacityBar(sp.allocated, sp.size, "capacity of " + r.name)),
    h("div", { class: "stat" }, h("span", { class: "muted", text: "Free" }), h("b", { text: size(sp.free) })),
    h("div", { class: "stat" }, h("span", { class: "muted", text: "Usable for data" }), h("b", { text: size(sp.usable), title: "What the datasets can hold: parity and RAID-Z padding taken out, and the 1/32 kept for metadata (as zfs list counts)" })),
    h("div", { class: "stat" }, h("span", { class: "muted", text: "Fragmentation" }), h("b", { text: (s.fragmentation ?? sp.fragmentation) + "%" }))));
  card.append(scanBox(r));
  card.append(h("h3", { text: "Devices" }), vdevTable(r, false));
  if (r.errors && r.errors.length) {
    card.append(h("h3", { class: "error", text: "Permanent errors in these files" }), h("ul", {}, r.errors.map((f) => h("li", { class: "mono", text: f }))));
  }
  const l2 = cache && cache.l2arc ? cache.l2arc.find(([p]) => p === r.name) : null;
  if (l2) {
    const hits = Number(l2[1].l2_hits || 0), misses = Number(l2[1].l2_misses || 0);
    card.append(h("p", { class: "small" }, h("b", { text: "L2ARC: " }),
      (hits + misses ? (100 * hits / (hits + misses)).toFixed(1) + "% hits" : "no reads yet") + ", " + size(l2[1].l2_size || 0) + " cached"));
  }
  const zil = cache && cache.zil ? cache.zil.find(([p]) => p === r.name) : null;
  if (zil) {
    const z = zil[1];
    card.append(h("p", { class: "small" }, h("b", { text: "Intent log: " }),
      z.commits + " sync commits, " + size(z.bytes) + " written to " + z.device +
      (z.fallbacks ? ", " + z.fallbacks + " waited for a txg" : "") + (z.write_errors ? ", " + z.write_errors + " write errors" : "")));
  }
  let chart = charts.get(r.name);
  if (!chart) {
    chart = { box: h("div", { class: "grid" }), bw: null, ops: null, data: [[], [], [], [], []], week: null };
    charts.set(r.name, chart);
  }
  const c = chart;
  const range = h("select", { "aria-label": "chart range of " + r.name },
    h("option", { value: "hour", text: "last hour, live", selected: !c.week }), h("option", { value: "week", text: "last week, by the minute", selected: !!c.week }));
  range.addEventListener("change", async () => {
    if (range.value === "week") {
      try {
        const [hist] = await api("pool_iostat_history", { name: r.name }, { background: true });
        const m = hist ? hist.minutes : [];
        c.week = [m.map((x) => x.time), m.map((x) => x.read_bytes), m.map((x) => x.write_bytes), m.map((x) => x.read_ops), m.map((x) => x.write_ops)];
      } catch (e) {
        range.after(errorBox(e));
        return;
      }
    } else c.week = null;
    if (c.bw) {
      const d = c.week || c.data;
      c.bw.setData([d[0], d[1], d[2]]);
      c.ops.setData([d[0], d[3], d[4]]);
    }
  });
  card.append(h("div", { class: "spread" }, h("h3", { text: "Throughput and IOPS" }), range), chart.box);
  return card;
}

function scanBox(r) {
  const sc = r.scan || {};
  const box = h("div", { class: "scan" });
  const func = sc.func || "scan";
  if (sc.phase === "scanning") {
    // As zpool status: issued of what was allocated when the scan started.
    const total = Math.max(sc.to_examine || 0, sc.issued || 0, 1);
    const done = sc.issued || 0;
    const p = pct(done, total);
    const state = sc.paused ? "paused" : sc.running ? "in progress" : "waiting";
    box.append(h("h3", { text: func + " " + state + " since " + when(sc.start_time) }),
      h("progress", { max: 100, value: p.toFixed(1), "aria-label": func + " progress", class: "scan-progress" }),
      h("p", { class: "small" }, p.toFixed(1) + "% done: " + size(done) + " of " + size(total) + " issued, " + size(sc.examined || 0) + " scanned" +
        (sc.running && sc.rate ? ", " + rate(sc.rate) : "") + (sc.running && sc.eta_secs != null ? ", " + duration(sc.eta_secs) + " to go" : "") +
        ", " + size(sc.func === "resilver" ? sc.rebuilt_repaired || 0 : sc.repaired || 0) + (func === "resilver" ? " resilvered" : " repaired")));
    if (r.scan.runner === "none") box.append(h("p", { class: "error", text: "No process runs this " + func + ": start the daemon (tank serve) to go on with it." }));
  } else if (sc.phase === "finished" || sc.phase === "canceled") {
    box.append(h("p", { class: "small" }, h("b", { text: "Last " + func + ": " }), scanSummary(sc)));
  } else {
    box.append(h("p", { class: "small muted", text: "No scrub has run." }));
  }
  return box;
}

function scanSummary(sc) {
  if (sc.phase === "canceled") return "canceled " + when(sc.end_time);
  const repaired = sc.func === "resilver" ? sc.rebuilt_repaired || 0 : sc.repaired || 0;
  return (sc.func === "resilver" ? "resilvered " : "repaired ") + size(repaired) + " in " + duration(sc.active_secs) +
    " with " + sc.errors + " errors, finished " + when(sc.end_time);
}

/** The vdev tree, zpool status's way; with `actions`, the device buttons. */
function vdevTable(r, actions) {
  const rows = [];
  const walk = (v, depth, section, parent) => {
    const leaf = !v.children || v.children.length === 0;
    const errs = v.read_errors + v.write_errors + v.cksum_errors;
    rows.push(h("tr", { class: errs || (v.state !== "ONLINE" && v.state !== "AVAIL") ? "err" : null },
      h("td", { class: "tree-" + Math.min(depth, 5) + " mono", text: v.name }),
      h("td", {}, stateBadge(v.state)),
      h("td", { class: "num", text: v.read_errors }),
      h("td", { class: "num", text: v.write_errors }),
      h("td", { class: "num", text: v.cksum_errors }),
      h("td", { class: "small", text: v.note || "" }),
      actions ? h("td", {}, leaf && depth > 0 ? deviceActions(r, v, section, parent) : null) : null));
    for (const c of v.children || []) walk(c, depth + 1, section, v.name);
  };
  for (const v of r.config) walk(v, 0, "data", "");
  for (const [name, vs] of r.sections) {
    rows.push(h("tr", {}, h("td", { class: "mono", colspan: actions ? 7 : 6, text: name })));
    for (const v of vs) walk(v, 1, name, "");
  }
  const cols = ["NAME", "STATE", { label: "READ", num: true }, { label: "WRITE", num: true }, { label: "CKSUM", num: true }, ""];
  if (actions) cols.push("");
  return table(cols, rows);
}

function deviceActions(r, v, section, parent) {
  const pool = r.name;
  const dev = v.path || v.name;
  const wrap = h("div", { class: "row" });
  const b = (text, fn, confirm, danger) => {
    const btn = h("button", { type: "button", class: danger ? "danger" : null, text, "aria-label": text + " " + v.name });
    btn.addEventListener("click", () => act(btn, fn, confirm));
    wrap.append(btn);
  };
  if (v.state === "OFFLINE") b("Online", () => api("pool_online", { name: pool, device: dev }));
  else if (section === "data" || section === "logs") b("Offline", () => api("pool_offline", { name: pool, device: dev }),
    () => confirmAction({ title: "Take " + v.name + " offline?", lose: "The pool keeps working on its redundancy; without it, it may become unavailable.", verb: "Offline" }));
  if (v.read_errors + v.write_errors + v.cksum_errors) b("Clear", () => api("pool_clear", { name: pool, device: dev }));
  b("Replace", async () => {
    const to = await askText({ title: "Replace " + v.name, label: "New device", verb: "Replace",
      hint: "An absolute path: a block device, or a file (made at the old device's size). The resilver copies onto it; the old device leaves when it is done." });
    return to ? api("pool_replace", { name: pool, old: dev, new: to }) : null;
  });
  if (section === "data" && !/^(raidz|replacing|spare)/.test(parent)) {
    b("Attach", async () => {
      const to = await askText({ title: "Attach a mirror side to " + v.name, label: "New device", verb: "Attach",
        hint: "An absolute path; the device becomes (or joins) a mirror with " + v.name + " and is resilvered." });
      return to ? api("pool_attach", { name: pool, existing: dev, new: to }) : null;
    });
  }
  if (section === "cache" || section === "spares" || section === "logs") {
    b("Remove", () => api("pool_remove", { name: pool, devices: [dev] }),
      () => confirmAction({ title: "Remove " + v.name + " from " + pool + "?", verb: "Remove", danger: true }), true);
  } else if (/^(mirror|replacing|spare)/.test(parent)) {
    b("Detach", () => api("pool_detach", { name: pool, device: dev }),
      () => confirmAction({ title: "Detach " + v.name + " from its mirror?", lose: "Only a mirror's member can be detached; its copy of the data is no longer kept.", verb: "Detach", danger: true }), true);
  }
  return wrap;
}

function cacheCard(c) {
  const card = h("section", { class: "card", "aria-labelledby": "arc-h" }, h("h2", { id: "arc-h", text: "Caches" }));
  if (!c) return add(card, [h("p", { class: "muted", text: "Cache figures are not available." })]);
  const a = c.arc || {};
  const hits = Number(a.hits || 0), misses = Number(a.misses || 0);
  card.append(h("div", { class: "grid" },
    h("div", { class: "stat" }, h("span", { class: "muted", text: "ARC hit ratio" }), h("b", { text: hits + misses ? (100 * hits / (hits + misses)).toFixed(1) + "%" : "no reads yet" })),
    h("div", { class: "stat" }, h("span", { class: "muted", text: "ARC size" }), h("b", { text: size(a.size) + " of " + size(a.c_max || a.c) })),
    h("div", { class: "stat" }, h("span", { class: "muted", text: "Hits / misses" }), h("b", { text: hits + " / " + misses }))));
  return card;
}

function eventsCard(events) {
  const card = h("section", { class: "card", "aria-labelledby": "ev-h" }, h("h2", { id: "ev-h", text: "Recent events" }));
  if (!events.length) return add(card, [h("p", { class: "muted", text: "No events." })]);
  card.append(table(["Time", "Pool", "Class", "Device", "Detail"], events.map((e) => h("tr", { class: e.class.startsWith("ereport") ? "err" : null },
    h("td", { text: when(e.time) }), h("td", { text: e.pool }), h("td", { class: "mono small", text: e.class }),
    h("td", { class: "mono small", text: e.vdev || "" }), h("td", { class: "small", text: e.detail })))));
  return card;
}

/** Live charts of each pool's I/O from the API's event stream, seeded from the daemon's
 *  history of the last hour. */
function liveCharts(view, charts, onPoolEvent) {
  const opts = (title, series) => ({
    title, width: 520, height: 200,
    scales: { x: { time: true } },
    series: [{}].concat(series.map(([label, stroke, fmt]) => ({ label, stroke, width: 1.5, value: (u, v) => (v == null ? "-" : fmt(v)) }))),
    axes: [{}, { values: (u, vs) => vs.map((v) => series[0][2](v)), size: 70 }],
  });
  const ensure = (pool) => {
    const c = charts.get(pool);
    if (!c || c.bw || typeof uPlot === "undefined") return c;
    const width = Math.max(260, Math.min(560, c.box.clientWidth / 2 - 16 || 520));
    const bw = opts("Throughput", [["read", "#1f6feb", rate], ["write", "#cf6f00", rate]]);
    const ops = opts("IOPS", [["read", "#1f6feb", (v) => Math.round(v) + ""], ["write", "#cf6f00", (v) => Math.round(v) + ""]]);
    bw.width = ops.width = width;
    c.bw = new uPlot(bw, [c.data[0], c.data[1], c.data[2]], add(h("div", { class: "chart" }), []));
    c.ops = new uPlot(ops, [c.data[0], c.data[3], c.data[4]], add(h("div", { class: "chart" }), []));
    c.box.append(c.bw.root.parentNode || c.bw.root, c.ops.root.parentNode || c.ops.root);
    return c;
  };
  const push = (pool, t, rb, wb, ro, wo) => {
    const c = charts.get(pool);
    if (!c) return;
    c.data[0].push(t); c.data[1].push(rb); c.data[2].push(wb); c.data[3].push(ro); c.data[4].push(wo);
    if (c.data[0].length > 3600) c.data.forEach((a) => a.shift());
  };
  // The history the daemon keeps, then the live seconds.
  api("pool_iostat_history", {}, { background: true }).then((hist) => {
    for (const p of hist) {
      const c = charts.get(p.pool);
      if (!c || c.data[0].length) continue;
      for (const s of p.seconds) push(p.pool, s.time, s.read_bytes, s.write_bytes, s.read_ops, s.write_ops);
      redraw(p.pool);
    }
  }).catch(() => {});
  const redraw = (pool) => {
    const c = ensure(pool);
    if (!c || !c.bw || c.week) return;
    c.bw.setData([c.data[0], c.data[1], c.data[2]]);
    c.ops.setData([c.data[0], c.data[3], c.data[4]]);
  };
  const es = new EventSource("/api/v1/events");
  es.addEventListener("iostat", (ev) => {
    const d = JSON.parse(ev.data);
    const secs = d.interval_secs || 1;
    push(d.pool, Date.now() / 1000, d.read_bytes / secs, d.write_bytes / secs, d.read_ops / secs, d.write_ops / secs);
    redraw(d.pool);
  });
  es.addEventListener("pool_event", () => onPoolEvent());
  es.onerror = () => {
    // The stream ends with the session: find out whether that is why.
    if (es.readyState === EventSource.CLOSED) api("hello", {}, { background: true }).catch(() => {});
  };
  onLeave(view, () => es.close());
  // Charts need the card on the page to size themselves.
  const t = setInterval(() => { for (const k of charts.keys()) redraw(k); }, 1000);
  onLeave(view, () => clearInterval(t));
}

// ---- Pools ---------------------------------------------------------------------------

async function pagePools(view, args) {
  if (args[0]) return pagePool(view, args[0]);
  view.append(h("h1", { text: "Pools" }));
  const pools = await api("pool_list", {});
  view.append(h("section", { class: "card" }, pools.length ? table(
    ["Name", "State", { label: "Size", num: true }, { label: "Alloc", num: true }, { label: "Free", num: true }, { label: "Cap", num: true }, { label: "Frag", num: true }],
    pools.map((p) => h("tr", {},
      h("td", {}, h("a", { href: "#/pools/" + encodeURIComponent(p.name), text: p.name })),
      h("td", {}, stateBadge(p.health)),
      h("td", { class: "num", text: size(p.size) }), h("td", { class: "num", text: size(p.allocated) }),
      h("td", { class: "num", text: size(p.free) }), h("td", { class: "num", text: p.capacity + "%" }),
      h("td", { class: "num", text: p.fragmentation + "%" })))) : h("p", { class: "muted", text: "No pool is imported." })));
  view.append(createPoolWizard());
  view.append(await importCard());
}

function createPoolWizard() {
  const layout = h("select", { name: "layout" },
    ["raidz2", "raidz1", "raidz3", "mirror", "stripe"].map((l) => h("option", { value: l, text: l === "stripe" ? "stripe (no redundancy)" : l })));
  const devices = h("textarea", { name: "devices", rows: 4, required: true, spellcheck: "false" });
  const found = h("div", { class: "scroll" });
  const dirInput = h("input", { name: "dir", placeholder: "empty: the data directory's devices", spellcheck: "false" });
  const sizes = new Map();
  const listButton = h("button", { type: "button", text: "List devices" });
  listButton.addEventListener("click", async () => {
    clear(found);
    try {
      const dir = dirInput.value.trim();
      const devs = await api("device_list", dir ? { dir } : {});
      const free = devs.filter((d) => !d.in_use);
      const busy = devs.filter((d) => d.in_use);
      if (busy.length) found.append(h("p", { class: "hint", text: "In use, not offered: " + busy.map((d) => d.path + " (" + d.in_use + ")").join(", ") }));
      if (!free.length) return found.append(h("p", { class: "muted", text: "No free device there. Name new files below: they are made at the size given." }));
      found.append(table(["", "Device", "Kind", { label: "Size", num: true }, "Model"], free.map((d) => {
        sizes.set(d.path, d.size);
        const id = "dev-" + Math.random().toString(36).slice(2, 9);
        const cb = h("input", { type: "checkbox", id, "aria-label": "use " + d.path });
        cb.addEventListener("change", () => {
          const cur = devices.value.split(/\s+/).filter(Boolean).filter((x) => x !== d.path);
          if (cb.checked) cur.push(d.path);
          devices.value = cur.join("\n");
          preview();
        });
        return h("tr", {}, h("td", {}, cb), h("td", {}, h("label", { for: id, class: "mono", text: d.path })), h("td", { text: d.kind }),
          h("td", { class: "num", text: size(d.size) }), h("td", { text: d.model || "" }));
      })));
    } catch (e) {
      found.append(errorBox(e));
    }
  });
  const form = h("form", { class: "stack", "aria-labelledby": "create-h" },
    ...field("Pool name", h("input", { name: "name", required: true, autocomplete: "off", spellcheck: "false" }), "Letters, digits, - _ . : it names the pool in every command."),
    h("label", { text: "Devices the host offers", for: dirInput.id = "dev-dir" }),
    h("div", { class: "row" }, dirInput, listButton), found,
    ...field("Devices", devices, "One absolute path a line: block devices, or files (missing files are made at the size below)."),
    ...field("Size of new device files", h("input", { name: "size", value: "1G", spellcheck: "false" }), "For new files only, e.g. 1G, 512M."),
    ...field("Layout", layout),
    ...field("Disks per vdev", h("input", { name: "width", type: "number", min: 1, value: "" }), "Empty: every device in one vdev."),
    h("div", { class: "card", id: "plan", "aria-live": "polite" }, h("p", { class: "muted", text: "Choose devices to see the layout's capacity, reliability and speed." })),
    h("div", { class: "row" }, h("button", { type: "submit", class: "primary", text: "Create pool" })));
  const planBox = form.querySelector("#plan");
  const shape = (fd) => {
    const devs = String(fd.get("devices") || "").split(/\s+/).filter(Boolean);
    const l = String(fd.get("layout"));
    const w = l === "stripe" ? 1 : Math.min(devs.length, parseInt(fd.get("width"), 10) || devs.length);
    return { devs, l, w };
  };
  const spec = (fd) => {
    const { devs, l, w } = shape(fd);
    if (l === "stripe") return devs;
    const out = [];
    for (let i = 0; i < devs.length; i += w) out.push(l, ...devs.slice(i, i + w));
    return out;
  };
  let pending = 0;
  async function preview() {
    const fd = new FormData(form);
    const { devs, l, w } = shape(fd);
    if (!devs.length) return;
    const mine = ++pending;
    const known = devs.map((d) => sizes.get(d)).filter((x) => x);
    const each = known.length === devs.length ? Math.min(...known) : parseSize(fd.get("size"));
    const mixed = known.length > 1 && Math.min(...known) !== Math.max(...known);
    const extra = [];
    if (devs.length % w) extra.push(devs.length + " devices do not divide into vdevs of " + w + ": the last vdev would differ (mismatched replication level).");
    if (mixed) extra.push("mixed sizes: every device of a vdev counts as its smallest, " + size(each) + ".");
    const vdevs = Math.floor(devs.length / w) || 1;
    const least = { raidz1: 2, raidz2: 3, raidz3: 4, mirror: 2, stripe: 1 }[l];
    if (w < least) {
      clear(planBox).append(h("p", { class: "muted", text: "A " + l + " vdev takes at least " + least + " devices; " + w + " chosen." }));
      return;
    }
    try {
      const p = (await api("layout_plan", { disks: vdevs * w, disk_bytes: each || 0, layout: vdevs + "x" + w + " " + (l === "stripe" ? "stripe" : l) })).plan;
      if (mine !== pending) return;
      clear(planBox).append(planView(p.layouts[0], (p.warnings || []).concat(extra)));
    } catch (e) {
      if (mine === pending) clear(planBox).append(errorBox(e), extra.map((x) => h("p", { class: "error", text: "Warning: " + x })));
    }
  }
  form.addEventListener("change", preview);
  onSubmit(form, async (fd) => {
    const name = String(fd.get("name") || "").trim();
    const s = spec(fd);
    if (!name || !s.length) throw new Error("Give the pool a name and at least one device.");
    await api("pool_create", { name, spec: s, size: parseSize(fd.get("size")) });
    toast("Pool " + name + " created.");
    location.hash = "#/pools/" + encodeURIComponent(name);
  });
  return h("section", { class: "card" }, h("h2", { id: "create-h", text: "Create a pool" }), form);
}

function years(y) {
  if (!isFinite(y)) return "never";
  if (y >= 1e6) return (y / 1e6).toFixed(1) + " million years";
  if (y >= 1e3) return Math.round(y).toLocaleString() + " years";
  return y.toFixed(1) + " years";
}

function planView(a, warnings) {
  return h("div", { class: "plan" },
    h("h3", { text: a.name }),
    table(["", ""], [
      ["Usable capacity", size(a.usable_bytes) + " (" + Math.round(a.efficiency * 100) + "% of raw)"],
      ["Survives", a.failures_tolerated + " failed disk" + (a.failures_tolerated === 1 ? "" : "s") + (a.failures_best_case > a.failures_tolerated ? " (up to " + a.failures_best_case + ")" : "")],
      ["Mean time to data loss", years(a.mttdl_years)],
      ["Chance of loss in 5 years", (a.loss_probability_5y * 100).toFixed(3) + "%"],
      ["Resilver of one disk (half full)", a.resilver_hours.toFixed(1) + " h"],
      ["Expected sequential speed", "read " + rate(a.seq_read_bytes_per_s) + ", write " + rate(a.seq_write_bytes_per_s)],
      ["Expected random IOPS", "read " + Math.round(a.random_read_iops) + ", write " + Math.round(a.random_write_iops)],
    ].map(([k, v]) => h("tr", {}, h("th", { scope: "row", text: k }), h("td", { text: v })))),
    h("p", { class: "hint", text: "Estimates of tank plan's model for hard disks (docs/PLAN.md)." }),
    (warnings || []).map((w) => h("p", { class: "error warning", text: "Warning: " + w })));
}

function parseSize(s) {
  const m = String(s || "").trim().match(/^(\d+(?:\.\d+)?)\s*([KMGTP]?)i?B?$/i);
  if (!m) return null;
  const mult = { "": 1, K: 1 << 10, M: 1 << 20, G: 1 << 30, T: 2 ** 40, P: 2 ** 50 }[m[2].toUpperCase()];
  return Math.round(parseFloat(m[1]) * mult);
}

async function importCard() {
  const card = h("section", { class: "card" }, h("h2", { text: "Import a pool" }));
  const list = h("div");
  const form = h("form", { class: "row" },
    h("label", { for: "imp-dir", text: "Search directory" }),
    h("input", { id: "imp-dir", name: "dir", placeholder: "empty: the data directory", spellcheck: "false" }),
    h("button", { type: "submit", text: "Search" }));
  onSubmit(form, async (fd) => {
    const dir = String(fd.get("dir") || "").trim();
    const r = await api("pool_import", { dirs: dir ? [dir] : [] });
    clear(list);
    const found = r.pools || [];
    if (!found.length) return list.append(h("p", { class: "muted", text: "No pool to import was found there." }));
    list.append(table(["Name", "State", "Devices", ""], found.map((c) => {
      const btn = h("button", { type: "button", text: "Import", disabled: !c.importable, "aria-label": "Import " + c.name });
      btn.addEventListener("click", () => act(btn, () => api("pool_import", { name: c.name, dirs: dir ? [dir] : [] })));
      return h("tr", {}, h("td", { text: c.name }), h("td", { text: c.state + (c.missing.length ? " (missing: " + c.missing.join(", ") + ")" : "") }),
        h("td", { text: c.devices_found + " of " + c.devices_total }), h("td", {}, btn));
    })));
  });
  return add(card, [form, list]);
}

async function pagePool(view, name) {
  const [[r], props] = await Promise.all([api("pool_status", { name }), api("pool_get", { name })]);
  view.append(h("p", {}, h("a", { href: "#/pools", text: "← Pools" })));
  view.append(h("h1", {}, "Pool " + r.name + " ", stateBadge(r.state)));
  const scrub = h("section", { class: "card", "aria-labelledby": "scrub-h" }, h("h2", { id: "scrub-h", text: "Scrub" }), scanBox(r));
  const buttons = h("div", { class: "row" });
  const sc = r.scan || {};
  const scanning = sc.phase === "scanning" && !sc.paused;
  const btn = (text, action, cls) => {
    const b = h("button", { type: "button", text, class: cls || null });
    b.addEventListener("click", () => act(b, () => api("pool_scrub", { name, action })));
    buttons.append(b);
  };
  if (scanning) { btn("Pause scrub", "pause"); btn("Cancel scrub", "stop", "danger"); }
  else btn(sc.phase === "scanning" && sc.paused ? "Resume scrub" : "Start scrub", "start", "primary");
  scrub.append(buttons);
  view.append(scrub);
  // A scan's progress moves without a reload.
  if (scanning) {
    const t = setInterval(async () => {
      try {
        const [now] = await api("pool_status", { name }, { background: true });
        const fresh = scanBox(now);
        const old = scrub.querySelector(".scan");
        if (old) old.replaceWith(fresh);
        if (now.scan.phase !== "scanning" || now.scan.paused) route();
      } catch (e) { /* shown at the next full render */ }
    }, 1000);
    onLeave(view, () => clearInterval(t));
  }
  view.append(h("section", { class: "card" }, h("h2", { text: "Devices" }), vdevTable(r, true), addVdevForm(name)));
  view.append(h("section", { class: "card" }, h("h2", { text: "Properties" }),
    table(["Property", "Value", "Source", ""], props.map((p) => {
      const value = h("td", { class: "mono", text: /^(size|allocated|free)$/.test(p.property) ? size(Number(p.value)) : p.value, title: p.value });
      const cell = h("td");
      // Properties with a source are settable (ashift only at creation).
      if (p.source !== "-" && p.property !== "ashift") {
        const edit = h("button", { type: "button", class: "link", text: "edit", "aria-label": "edit " + p.property });
        edit.addEventListener("click", () => act(edit, async () => {
          const v = await askText({ title: "Set " + p.property + " of " + name, label: p.property, value: p.value, verb: "Set" });
          return v === null ? null : api("pool_set", { name, property: p.property, value: v });
        }));
        cell.append(edit);
      }
      return h("tr", {}, h("td", { class: "mono", text: p.property }), value, h("td", { class: "muted", text: p.source }), cell);
    }))));
  const danger = h("section", { class: "card" }, h("h2", { text: "Export or destroy" }));
  const exp = h("button", { type: "button", text: "Export " + name });
  exp.addEventListener("click", () => act(exp, async () => { const x = await api("pool_export", { name }); location.hash = "#/pools"; return x; },
    () => confirmAction({ title: "Export " + name + "?", lose: "Every share and mount of its datasets stops until it is imported again. No data is lost.", verb: "Export" })));
  const des = h("button", { type: "button", class: "danger", text: "Destroy " + name });
  des.addEventListener("click", () => act(des, async () => { const x = await api("pool_destroy", { name }); location.hash = "#/pools"; return x; },
    () => confirmAction({ title: "Destroy pool " + name + "?", lose: "Every dataset, volume, snapshot and share of " + name + " is lost, on every one of its devices. This cannot be undone.", typed: name, verb: "Destroy", danger: true })));
  view.append(add(danger, [h("div", { class: "row" }, exp, des)]));
}

function addVdevForm(pool) {
  const kind = h("select", { name: "kind" }, [["", "data"], ["log", "log (sync writes, an SSD)"], ["cache", "cache (L2ARC, an SSD)"], ["spare", "spare"]]
    .map(([v, t]) => h("option", { value: v, text: t })));
  const layout = h("select", { name: "layout" }, ["", "mirror", "raidz1", "raidz2", "raidz3"].map((l) => h("option", { value: l, text: l || "single devices" })));
  const form = h("form", { class: "stack" },
    h("h3", { text: "Add devices" }),
    ...field("Class", kind), ...field("Layout", layout),
    ...field("Devices", h("textarea", { name: "devices", rows: 2, spellcheck: "false" }), "Absolute paths, one a line."),
    ...field("Size of new device files", h("input", { name: "size", value: "1G" })),
    h("div", {}, h("button", { type: "submit", text: "Add" })));
  onSubmit(form, async (fd) => {
    const devs = String(fd.get("devices") || "").split(/\s+/).filter(Boolean);
    if (!devs.length) throw new Error("List at least one device.");
    const spec = [];
    if (fd.get("kind")) spec.push(String(fd.get("kind")));
    if (fd.get("layout")) spec.push(String(fd.get("layout")));
    spec.push(...devs);
    const r = await api("pool_add", { name: pool, spec, size: parseSize(fd.get("size")) });
    toast(r.message || "Added.");
    refresh(form);
  });
  return form;
}

// ---- Datasets and snapshots ----------------------------------------------------------

const SIZE_PROPS = new Set(["used", "available", "referenced", "quota", "reservation", "recordsize", "volsize",
  "volblocksize", "refquota", "refreservation", "usedbysnapshots", "usedbydataset", "usedbychildren",
  "usedbyrefreservation", "logicalused", "logicalreferenced", "written"]);
// Properties a dataset's owner sets (the rest are figures or identity).
const READ_ONLY_PROPS = new Set(["type", "creation", "used", "available", "referenced", "compressratio", "usedbysnapshots",
  "usedbydataset", "usedbychildren", "usedbyrefreservation", "logicalused", "logicalreferenced", "written", "origin",
  "guid", "receive_resume_token", "refcompressratio", "mounted", "createtxg", "volblocksize"]);

/** A property's value as a person reads it (the exact value stays in the title). */
function shown(p, v) {
  if (SIZE_PROPS.has(p) && /^\d+$/.test(v)) return v === "0" && /quota|reservation/.test(p) ? "none" : size(Number(v));
  if (p === "creation" && /^\d+$/.test(v)) return when(Number(v));
  return v;
}

function prop(d, name) {
  const p = d.props.find(([n]) => n === name);
  return p ? p[1] : "";
}

async function pageDatasets(view, args) {
  if (args.length) return pageDataset(view, args.join("/"));
  view.append(h("h1", { text: "Datasets" }));
  const r = await api("dataset_list", { recursive: true, types: ["filesystem", "volume"] });
  const fs = r.datasets || [];
  view.append(h("p", { class: "muted", text: fs.length + " filesystems and volumes." }));
  view.append(h("section", { class: "card" }, paged(fs, 200, (slice) => table(
    ["Name", "Kind", { label: "Used", num: true }, { label: "Avail", num: true }, { label: "Refer", num: true }, "Mountpoint"],
    slice.map((d) => h("tr", {},
      h("td", { class: "tree-" + Math.min(5, d.name.split("/").length - 1) }, h("a", { href: "#/datasets/" + d.name.split("/").map(encodeURIComponent).join("/"), text: d.name })),
      h("td", { text: d.kind }), h("td", { class: "num", text: size(prop(d, "used")) }),
      h("td", { class: "num", text: size(prop(d, "available")) }), h("td", { class: "num", text: size(prop(d, "referenced")) }),
      h("td", { class: "mono small", text: prop(d, "mountpoint") })))))));
  if (me.admin) view.append(createDatasetForm(fs.map((d) => d.name)));
}

function createDatasetForm(parents) {
  const kind = h("select", { name: "kind" }, h("option", { value: "filesystem", text: "filesystem" }), h("option", { value: "volume", text: "volume (a block device for iSCSI)" }));
  const form = h("form", { class: "stack" },
    ...field("Name", h("input", { name: "name", required: true, list: "ds-parents", spellcheck: "false", autocomplete: "off" }), "POOL/NAME, e.g. " + (parents[0] || "tank") + "/media"),
    h("datalist", { id: "ds-parents" }, parents.map((p) => h("option", { value: p + "/" }))),
    ...field("Kind", kind),
    ...field("Volume size", h("input", { name: "volsize", spellcheck: "false" }), "Volumes only, e.g. 10G."),
    ...field("Mountpoint", h("input", { name: "mountpoint", spellcheck: "false" }), "Filesystems only: an absolute directory where the host sees its files (optional; children inherit their parent's)."),
    ...field("Quota", h("input", { name: "quota", spellcheck: "false" }), "Optional, e.g. 100G."),
    ...field("Compression", h("select", { name: "compression" }, ["", "lz4", "zstd", "gzip", "off"].map((c) => h("option", { value: c, text: c || "inherit" })))),
    h("div", {}, h("button", { type: "submit", class: "primary", text: "Create" })));
  onSubmit(form, async (fd) => {
    const name = String(fd.get("name") || "").trim();
    const props = [];
    for (const k of ["volsize", "mountpoint", "quota", "compression"]) if (String(fd.get(k) || "").trim()) props.push([k, String(fd.get(k)).trim()]);
    await api("dataset_create", { name, kind: String(fd.get("kind")), props });
    toast("Created " + name + ".");
    location.hash = "#/datasets/" + name;
  });
  return h("section", { class: "card" }, h("h2", { text: "Create a dataset or volume" }), form);
}

async function pageDataset(view, name) {
  const [self, under] = await Promise.all([api("dataset_list", { names: [name] }),
    api("dataset_list", { names: [name], recursive: true, types: ["snapshot"] })]);
  const d = (self.datasets || [])[0];
  if (!d) throw new Error("There is no dataset " + name + ".");
  const snaps = (under.datasets || []).filter((x) => x.name.startsWith(name + "@"));
  view.append(h("p", {}, h("a", { href: "#/datasets", text: "← Datasets" })));
  view.append(h("h1", { text: d.name }));
  // Properties, with their sources; local ones can be inherited back.
  const rows = d.props.map(([p, v, src]) => {
    const valueCell = h("td", { class: "mono", title: v, text: shown(p, v) });
    const tr = h("tr", {}, h("td", { class: "mono", text: p }), valueCell, h("td", { class: "muted", text: src }));
    const acts = h("td", { class: "row" });
    if (me.admin && d.kind !== "snapshot" && !READ_ONLY_PROPS.has(p)) {
      const edit = h("button", { type: "button", class: "link", text: "edit", "aria-label": "edit " + p });
      edit.addEventListener("click", () => {
        const input = h("input", { value: v, "aria-label": "new value of " + p, spellcheck: "false" });
        const form = h("form", { class: "row" }, input, h("button", { type: "submit", text: "Save" }),
          h("button", { type: "button", text: "Cancel", onclick: () => route() }));
        onSubmit(form, async () => {
          await api("dataset_set", { name, props: [[p, input.value.trim()]] });
          toast(p + " set to " + input.value.trim() + ".");
          refresh(form);
        });
        clear(valueCell).append(form);
        input.focus();
      });
      acts.append(edit);
    }
    if (me.admin && src === "local") {
      const b = h("button", { type: "button", class: "link", text: "inherit", "aria-label": "inherit " + p });
      b.addEventListener("click", () => act(b, () => api("dataset_inherit", { name, property: p })));
      acts.append(b);
    }
    tr.append(acts);
    return tr;
  });
  const propCard = h("section", { class: "card" }, h("h2", { text: "Properties" }), table(["Property", "Value", "Source", ""], rows));
  view.append(snapshotsCard(name, snaps));
  if (me.admin && d.kind !== "snapshot") view.append(await scheduleCard(name));
  view.append(propCard);
  if (me.admin && name.includes("/")) {
    const del = h("button", { type: "button", class: "danger", text: "Destroy " + name });
    del.addEventListener("click", () => act(del, async () => { const x = await api("dataset_destroy", { name, recursive: true }); location.hash = "#/datasets"; return x; },
      () => confirmAction({ title: "Destroy " + name + "?", lose: "Its files, its snapshots (" + snaps.length + ") and its children are lost, and its shares stop. This cannot be undone.", typed: name, verb: "Destroy", danger: true })));
    view.append(h("section", { class: "card" }, h("h2", { text: "Destroy" }), del));
  }
}

function snapshotsCard(ds, snaps) {
  const card = h("section", { class: "card", "aria-labelledby": "snaps-h" }, h("h2", { id: "snaps-h", text: "Snapshots (" + snaps.length + ")" }));
  if (me.admin) {
    const form = h("form", { class: "row" },
      h("label", { for: "snap-name", text: "New snapshot" }),
      h("input", { id: "snap-name", name: "snap", placeholder: "name", spellcheck: "false", autocomplete: "off" }),
      checkbox("recursive", "with children"),
      h("button", { type: "submit", class: "primary", text: "Take snapshot" }));
    onSubmit(form, async (fd) => {
      const s = String(fd.get("snap") || "").trim();
      if (!s) throw new Error("Name the snapshot.");
      await api("snapshot", { names: [ds + "@" + s], recursive: fd.get("recursive") === "on" });
      toast("Snapshot " + ds + "@" + s + " taken.");
      refresh(form);
    });
    card.append(form);
  }
  if (!snaps.length) return add(card, [h("p", { class: "muted", text: "No snapshots." })]);
  const newestFirst = snaps.slice().sort((a, b) => Number(prop(b, "createtxg")) - Number(prop(a, "createtxg")));
  card.append(paged(newestFirst, 100, (slice) => table(["Name", "Created", { label: "Used", num: true }, { label: "Refer", num: true }, ""],
    slice.map((s) => {
      const short = s.name.slice(ds.length);
      const acts = h("div", { class: "row" });
      if (me.admin) {
        const rb = h("button", { type: "button", text: "Roll back", "aria-label": "Roll back to " + s.name });
        rb.addEventListener("click", () => act(rb, () => api("rollback", { snapshot: s.name, destroy_later: true }),
          () => confirmAction({ title: "Roll " + ds + " back to " + short + "?", lose: "Every change made to " + ds + " since " + short + " is lost, and the snapshots taken after it are destroyed.", typed: short.slice(1), verb: "Roll back", danger: true })));
        const cl = h("button", { type: "button", text: "Clone", "aria-label": "Clone " + s.name });
        cl.addEventListener("click", () => act(cl, async () => {
          const target = await askText({ title: "Clone " + s.name, label: "New dataset", value: ds + "-clone", verb: "Clone",
            hint: "POOL/NAME: a writable dataset that starts as the snapshot; the snapshot is kept while the clone lives." });
          return target ? api("clone", { snapshot: s.name, target }) : null;
        }));
        const br = h("a", { href: "#/browse/" + encodeURIComponent(s.name) + "/", text: "Browse" });
        acts.append(br);
        const del = h("button", { type: "button", class: "danger", text: "Destroy", "aria-label": "Destroy " + s.name });
        del.addEventListener("click", () => act(del, () => api("dataset_destroy", { name: s.name }),
          () => confirmAction({ title: "Destroy " + s.name + "?", lose: "The snapshot's copy of the files is lost (and the space only it holds is freed); the live dataset is unchanged.", typed: short.slice(1), verb: "Destroy", danger: true })));
        acts.append(rb, cl, del);
      }
      return h("tr", {}, h("td", { class: "mono", text: short }), h("td", { text: when(Number(prop(s, "creation"))) }),
        h("td", { class: "num", text: size(prop(s, "used")) }), h("td", { class: "num", text: size(prop(s, "referenced")) }), h("td", {}, acts));
    }))));
  return card;
}


/** The dataset's snapshot schedule: what it keeps of each period, edited. */
async function scheduleCard(ds) {
  const all = await api("schedule_list", {});
  const cur = all.find((x) => x.dataset === ds);
  const sch = cur ? cur.schedule : { hourly: 0, daily: 0, weekly: 0, monthly: 0, recursive: false };
  const card = h("section", { class: "card", "aria-labelledby": "sched-h" }, h("h2", { id: "sched-h", text: "Snapshot schedule" }));
  if (cur) {
    card.append(h("p", { class: "small" }, "Kept now: " + cur.kept.map(([p, n]) => n + " " + p).join(", ") +
      (cur.newest ? "; newest " + cur.newest : "") + (sch.recursive ? "; children included" : "")));
  } else {
    card.append(h("p", { class: "muted small", text: "No schedule: snapshots are taken only by hand." }));
  }
  const num = (name, label) => field(label, h("input", { name, type: "number", min: 0, max: 10000, value: sch[name] || 0 }));
  const form = h("form", { class: "stack" },
    h("p", { class: "hint", text: "How many of each to keep (0: none). Snapshots are named autosnap_DATE_PERIOD and taken at each period's start (UTC); the oldest beyond the count are destroyed." }),
    ...num("hourly", "Hourly"), ...num("daily", "Daily"), ...num("weekly", "Weekly"), ...num("monthly", "Monthly"),
    checkbox("recursive", "Include child datasets (atomic)", sch.recursive),
    h("div", { class: "row" }, h("button", { type: "submit", class: "primary", text: "Save schedule" }),
      cur ? h("button", { type: "button", class: "danger", text: "Remove schedule", onclick: (ev) => act(ev.currentTarget, () => api("schedule_set", { dataset: ds, schedule: null }),
        () => confirmAction({ title: "Remove the schedule of " + ds + "?", lose: "No more snapshots are taken or pruned on schedule; those taken stay.", verb: "Remove" })) }) : null));
  onSubmit(form, async (fd) => {
    const n = (k) => parseInt(fd.get(k), 10) || 0;
    const schedule = { hourly: n("hourly"), daily: n("daily"), weekly: n("weekly"), monthly: n("monthly"), recursive: fd.get("recursive") === "on" };
    const r = await api("schedule_set", { dataset: ds, schedule });
    toast(r.message || "Schedule saved.");
    refresh(form);
  });
  card.append(form);
  return card;
}

/** The files of a snapshot, a directory at a time. */
async function pageBrowse(view, args) {
  const snap = args[0];
  const path = "/" + args.slice(1).filter(Boolean).join("/");
  const ds = snap.split("@")[0];
  view.append(h("p", {}, h("a", { href: "#/datasets/" + ds.split("/").map(encodeURIComponent).join("/"), text: "← " + ds })));
  view.append(h("h1", { text: snap + ":" + path }));
  const list = h("div");
  const crumbs = h("p", { class: "mono small" });
  const parts = path.split("/").filter(Boolean);
  const link = (n) => "#/browse/" + encodeURIComponent(snap) + "/" + parts.slice(0, n).map(encodeURIComponent).join("/");
  crumbs.append(h("a", { href: link(0), text: snap.split("@")[1] }));
  parts.forEach((p, i) => crumbs.append(" / ", h("a", { href: link(i + 1), text: p })));
  view.append(crumbs, list);
  const more = h("button", { type: "button", text: "More", hidden: true });
  let rows = [];
  const load = async (cookie) => {
    const r = await api("snapshot_browse", { snapshot: snap, path, cookie, limit: 200 });
    rows = rows.concat(r.entries.map((e) => h("tr", {},
      h("td", { class: "mono" }, e.kind === "dir"
        ? h("a", { href: link(parts.length) + (parts.length ? "/" : "") + encodeURIComponent(e.name), text: e.name + "/" })
        : e.name),
      h("td", { text: e.kind }), h("td", { class: "num", text: e.kind === "file" ? size(e.size) : "" }),
      h("td", { class: "mono", text: (e.mode & 0o7777).toString(8).padStart(4, "0") }),
      h("td", { text: e.uid + ":" + e.gid }), h("td", { text: when(e.mtime) }))));
    clear(list).append(rows.length ? table(["Name", "Kind", { label: "Size", num: true }, "Mode", "Owner", "Modified"], rows)
      : h("p", { class: "muted", text: "Empty directory." }));
    more.hidden = r.next == null;
    more.onclick = () => load(r.next).catch((e) => list.append(errorBox(e)));
  };
  await load(0);
  view.append(more, h("p", { class: "hint", text: "Read-only: a snapshot never changes. Copy files out through a share's Previous Versions, the mount's .tank/snapshot directory, or roll back." }));
}

// ---- Shares --------------------------------------------------------------------------

// Each share kind's wizard: its fields (name, label, kind, default, hint), as the service
// takes them (docs/SMB.md, NFS.md, S3.md, ISCSI.md).
const SHARE_FIELDS = {
  smb: [
    ["timemachine", "Time Machine backups (Macs see it as a backup disk)", "check", false],
    ["timemachine_quota", "Time Machine size limit", "text", "", "e.g. 500G; empty: none"],
    ["previous_versions", "Previous Versions (Windows shows the snapshots)", "check", true],
    ["browseable", "Listed when browsing the server", "check", true],
    ["guest", "Guests may connect without a password", "check", false],
    ["users", "Users allowed", "text", "", "comma-separated; empty: every account"],
    ["groups", "Groups allowed", "text", "", "comma-separated"],
    ["comment", "Comment", "text", ""],
  ],
  nfs: [
    ["clients", "Clients allowed", "text", "", "addresses, networks (192.168.1.0/24) or host names, comma-separated; empty: anyone"],
    ["squash", "Squash", "select", "root_squash", "", [["root_squash", "root (root_squash)"], ["no_root_squash", "none (no_root_squash)"], ["all_squash", "everyone (all_squash)"]]],
    ["anonuid", "Anonymous uid", "text", "65534"],
    ["anongid", "Anonymous gid", "text", "65534"],
  ],
  s3: [
    ["users", "Users allowed", "text", "", "comma-separated; empty: administrators only (and anyone, if anonymous access is on)"],
    ["groups", "Groups allowed", "text", "", "comma-separated"],
    ["versioning", "Versioning", "select", "off", "", [["off", "off"], ["enabled", "enabled"], ["suspended", "suspended"]]],
    ["object_lock", "Object Lock (WORM retention; turns versioning on)", "check", false],
    ["public", "Anonymous access", "select", "off", "", [["off", "none"], ["read", "read and list"], ["objects", "read objects, no listing"]]],
  ],
  iscsi: [
    ["lun", "LUN", "text", "0"],
    ["iqn", "Target IQN", "text", "", "empty: iqn.2026-11.org.tank:POOL.VOLUME"],
    ["initiators", "Initiators allowed", "text", "", "IQNs, comma-separated; empty: any"],
    ["chap_users", "CHAP accounts", "text", "", "accounts whose CHAP secret an initiator must prove, comma-separated"],
    ["mutual_chap_user", "Mutual CHAP account", "text", "", "the account whose secret the target proves (needs CHAP accounts)"],
  ],
};

async function pageShares(view) {
  view.append(h("h1", { text: "Shares" }));
  const [shares, ds] = await Promise.all([api("share_list", {}), api("dataset_list", { recursive: true, types: ["filesystem", "volume"] })]);
  view.append(h("section", { class: "card" }, shares.length ? table(["Protocol", "Name", "Dataset", "State", "Options", ""],
    shares.map((s) => {
      const cell = h("td");
      if (me.admin) {
        const del = h("button", { type: "button", class: "danger", text: "Remove", "aria-label": "Remove share " + s.name });
        del.addEventListener("click", () => act(del, () => api("share_remove", { name: s.name }),
          () => confirmAction({ title: "Stop sharing " + s.name + "?", lose: "Clients lose access at once; the dataset and its files stay.", verb: "Remove share", danger: true })));
        cell.append(del);
      }
      return h("tr", {}, h("td", { text: s.protocol.toUpperCase() }), h("td", { class: "mono", text: s.name }), h("td", { class: "mono", text: s.dataset }),
        h("td", { class: "small", text: s.state || "" }),
        h("td", { class: "mono small", text: Object.entries(s.options).map(([k, v]) => k + "=" + v).join(" ") }), cell);
    })) : h("p", { class: "muted", text: "Nothing is shared yet." })));
  if (!me.admin) return;
  const all = (ds.datasets || []).filter((d) => d.kind !== "snapshot");
  const proto = h("select", { name: "protocol" }, [["smb", "SMB (Windows, macOS)"], ["nfs", "NFS (Linux, hypervisors)"], ["s3", "S3 (backup tools, apps)"], ["iscsi", "iSCSI (a volume as a disk)"]]
    .map(([p, t]) => h("option", { value: p, text: t })));
  const dataset = h("select", { name: "dataset" });
  const fields = h("div", { class: "stack" });
  const drawFields = () => {
    const p = proto.value;
    // iSCSI serves volumes; the others serve filesystems.
    const want = p === "iscsi" ? "volume" : "filesystem";
    clear(dataset).append(...all.filter((d) => d.kind === want).map((d) => h("option", { value: d.name, text: d.name })));
    if (!dataset.options.length) dataset.append(h("option", { value: "", text: "no " + want + " yet: create one under Datasets" }));
    clear(fields);
    for (const [key, label, kind, dflt, hint, choices] of SHARE_FIELDS[p]) {
      if (kind === "check") fields.append(checkbox("opt_" + key, label, dflt));
      else if (kind === "select") fields.append(...field(label, h("select", { name: "opt_" + key }, choices.map(([v, t]) => h("option", { value: v, text: t, selected: v === dflt })))));
      else fields.append(...field(label, h("input", { name: "opt_" + key, value: dflt, spellcheck: "false" }), hint));
    }
    fields.append(checkbox("opt_readonly", "Read-only", false));
  };
  proto.addEventListener("change", drawFields);
  const form = h("form", { class: "stack" },
    ...field("Protocol", proto),
    ...field("Share name", h("input", { name: "name", required: true, spellcheck: "false", autocomplete: "off" }), "What clients see: the SMB share, the NFS export, the S3 bucket or the iSCSI target."),
    ...field("Dataset", dataset),
    fields,
    ...field("Other options", h("textarea", { name: "options", rows: 2, spellcheck: "false" }), "KEY=VALUE, one a line (see tank share add --help)."),
    h("div", {}, h("button", { type: "submit", class: "primary", text: "Add share" })));
  drawFields();
  onSubmit(form, async (fd) => {
    const p = String(fd.get("protocol"));
    const options = {};
    for (const [key, , kind, dflt] of SHARE_FIELDS[p].concat([["readonly", "", "check", false]])) {
      if (kind === "check") {
        const on = fd.get("opt_" + key) === "on";
        if (on !== dflt) options[key] = on ? "on" : "off";
      } else {
        const v = String(fd.get("opt_" + key) || "").trim();
        if (v && v !== dflt) options[key] = v;
      }
    }
    for (const line of String(fd.get("options") || "").split("\n")) {
      const t = line.trim();
      if (!t) continue;
      const i = t.indexOf("=");
      if (i < 1) throw new Error("Option '" + t + "' is not KEY=VALUE.");
      options[t.slice(0, i).trim()] = t.slice(i + 1).trim();
    }
    await api("share_add", { protocol: p, name: String(fd.get("name") || "").trim(), dataset: String(fd.get("dataset")), options });
    toast("Share added.");
    refresh(form);
  });
  view.append(h("section", { class: "card" }, h("h2", { text: "Add a share" }), form));
}

// ---- Users and groups ----------------------------------------------------------------

async function pageUsers(view) {
  view.append(h("h1", { text: "Users" }));
  const [users, groups] = await Promise.all([api("user_list", {}), api("group_list", {})]);
  view.append(h("section", { class: "card" }, table(["Name", { label: "UID", num: true }, "Role", "Password", "Groups", ""],
    users.map((u) => {
      const del = h("button", { type: "button", class: "danger", text: "Remove", "aria-label": "Remove user " + u.name });
      del.addEventListener("click", () => act(del, () => api("user_remove", { name: u.name }),
        () => confirmAction({ title: "Remove the account " + u.name + "?", lose: "Its password, S3 keys and tokens stop working at once. Its files stay.", typed: u.name, verb: "Remove", danger: true })));
      return h("tr", {}, h("td", { text: u.name }), h("td", { class: "num", text: u.uid }), h("td", { text: u.admin ? "administrator" : "user" }),
        h("td", { text: u.password ? "set" : "none" }), h("td", { text: u.groups.join(", ") }), h("td", {}, del));
    }))));
  const form = h("form", { class: "stack" },
    ...field("User name", h("input", { name: "name", required: true, autocomplete: "off", spellcheck: "false" })),
    ...field("Password", h("input", { name: "password", type: "password", autocomplete: "new-password" }), "At least 8 characters; stored as an argon2id hash."),
    ...field("UID", h("input", { name: "uid", type: "number", min: 1 }), "Empty: the next free one from 1000."),
    ...field("Groups", h("input", { name: "groups", spellcheck: "false" }), "Comma-separated: " + (groups.map((g) => g.name).join(", ") || "none yet")),
    checkbox("admin", "Administrator (may change everything)"),
    h("div", {}, h("button", { type: "submit", class: "primary", text: "Add user" })));
  onSubmit(form, async (fd) => {
    const uid = parseInt(fd.get("uid"), 10);
    await api("user_add", { name: String(fd.get("name") || "").trim(), password: String(fd.get("password") || "") || null,
      uid: isNaN(uid) ? null : uid, admin: fd.get("admin") === "on",
      groups: String(fd.get("groups") || "").split(",").map((s) => s.trim()).filter(Boolean) });
    toast("User added.");
    refresh(form);
  });
  view.append(h("section", { class: "card" }, h("h2", { text: "Add a user" }), form));
  const gform = h("form", { class: "row" },
    h("label", { for: "g-name", text: "New group" }), h("input", { id: "g-name", name: "name", spellcheck: "false" }),
    h("button", { type: "submit", text: "Add group" }));
  onSubmit(gform, async (fd) => { await api("group_add", { name: String(fd.get("name") || "").trim() }); refresh(gform); });
  view.append(h("section", { class: "card" }, h("h2", { text: "Groups" }),
    groups.length ? table(["Name", { label: "GID", num: true }, "Members", ""], groups.map((g) => {
      const members = h("td");
      for (const m of g.members || []) {
        const rm = h("button", { type: "button", class: "link", text: "remove", "aria-label": "remove " + m + " from " + g.name });
        rm.addEventListener("click", () => act(rm, () => api("group_member", { group: g.name, user: m, add: false })));
        members.append(h("span", { class: "member" }, m + " ", rm), " ");
      }
      const others = users.filter((u) => !(g.members || []).includes(u.name));
      const pick = h("select", { "aria-label": "user to add to " + g.name }, others.map((u) => h("option", { value: u.name, text: u.name })));
      const addBtn = h("button", { type: "button", text: "Add member", disabled: !others.length });
      addBtn.addEventListener("click", () => act(addBtn, () => api("group_member", { group: g.name, user: pick.value, add: true })));
      const del = h("button", { type: "button", class: "danger", text: "Remove group", "aria-label": "remove group " + g.name });
      del.addEventListener("click", () => act(del, () => api("group_remove", { name: g.name }),
        () => confirmAction({ title: "Remove the group " + g.name + "?", lose: "Shares that allow it stop allowing its members (unless they are named themselves).", verb: "Remove", danger: true })));
      return h("tr", {}, h("td", { text: g.name }), h("td", { class: "num", text: g.gid }), members,
        h("td", { class: "row" }, pick, addBtn, del));
    }))
      : h("p", { class: "muted", text: "No groups." }), gform));
}

// ---- My account ----------------------------------------------------------------------

async function pageAccount(view) {
  view.append(h("h1", { text: "My account" }));
  const name = me.caller;
  view.append(h("p", {}, "Logged in as ", h("b", { text: name }), me.admin ? " (administrator)" : ""));
  const pw = h("form", { class: "stack" },
    ...field("New password", h("input", { name: "p1", type: "password", autocomplete: "new-password", required: true })),
    ...field("The same again", h("input", { name: "p2", type: "password", autocomplete: "new-password", required: true })),
    h("div", {}, h("button", { type: "submit", class: "primary", text: "Change password" })));
  onSubmit(pw, async (fd) => {
    if (fd.get("p1") !== fd.get("p2")) throw new Error("The two passwords differ.");
    await api("user_passwd", { name, password: String(fd.get("p1")) });
    toast("Password changed.");
    pw.reset();
  });
  view.append(h("section", { class: "card" }, h("h2", { text: "Password" }), pw));
  const [keys, tokens] = await Promise.all([api("key_list", { user: name }), api("token_list", { user: name })]);
  const secretBox = h("div", { "aria-live": "polite" });
  const keyAdd = h("button", { type: "button", text: "New S3 key" });
  keyAdd.addEventListener("click", () => act(keyAdd, async () => {
    const k = await api("key_add", { user: name });
    showSecret(secretBox, "S3 key", [["Access key", k.access_key], ["Secret key", k.secret_key]]);
  }));
  view.append(h("section", { class: "card" }, h("h2", { text: "S3 keys" }), secretBox,
    keys.length ? table(["Access key", "Created", ""], keys.map((k) => {
      const del = h("button", { type: "button", class: "danger", text: "Revoke", "aria-label": "Revoke " + k.access_key });
      del.addEventListener("click", () => act(del, () => api("key_remove", { access_key: k.access_key }),
        () => confirmAction({ title: "Revoke " + k.access_key + "?", lose: "Programs using it are refused at once.", verb: "Revoke", danger: true })));
      return h("tr", {}, h("td", { class: "mono", text: k.access_key }), h("td", { text: when(k.created) }), h("td", {}, del));
    })) : h("p", { class: "muted", text: "No keys." }), keyAdd));
  const tokBox = h("div", { "aria-live": "polite" });
  const tokAdd = h("button", { type: "button", text: "New API token" });
  tokAdd.addEventListener("click", () => act(tokAdd, async () => {
    const t = await api("token_add", { user: name });
    showSecret(tokBox, "API token", [["Token", t.token]]);
  }));
  view.append(h("section", { class: "card" }, h("h2", { text: "API tokens" }), tokBox,
    tokens.length ? table(["Id", "Created", ""], tokens.map((t) => {
      const del = h("button", { type: "button", class: "danger", text: "Revoke", "aria-label": "Revoke token " + t.id });
      del.addEventListener("click", () => act(del, () => api("token_remove", { id: t.id }),
        () => confirmAction({ title: "Revoke token " + t.id + "?", verb: "Revoke", danger: true })));
      return h("tr", {}, h("td", { class: "mono", text: t.id }), h("td", { text: when(t.created) }), h("td", {}, del));
    })) : h("p", { class: "muted", text: "No tokens." }), tokAdd));
}

/** A new secret, shown this once. `act` re-renders the page, so the box is kept outside
 *  it until the user dismisses it. */
function showSecret(box, what, rows) {
  const panel = h("div", { class: "secret", role: "status" },
    h("p", {}, h("b", { text: what + " made. It is shown this once: copy it now." })),
    rows.map(([k, v]) => h("p", {}, k + ": ", h("code", { class: "new-secret", text: v }))),
    h("button", { type: "button", text: "Done", onclick: () => panel.remove() }));
  document.getElementById("toast").before(panel);
}

// ---- Plan and bench ------------------------------------------------------------------

async function pageTools(view) {
  view.append(h("h1", { text: "Plan and bench" }));
  const form = h("form", { class: "stack" },
    ...field("Disks", h("input", { name: "disks", type: "number", min: 1, value: 7 })),
    ...field("Disk size", h("input", { name: "size", value: "8T" }), "Binary units: 8T is 8 TiB."),
    ...field("Disk type", h("select", { name: "type" }, ["hdd", "ssd", "nvme"].map((t) => h("option", { value: t, text: t })))),
    ...field("Workload", h("select", { name: "workload" }, [["mixed", "mixed"], ["seq", "streams (media, backups)"], ["random", "random (VMs, databases)"]].map(([v, t]) => h("option", { value: v, text: t })))),
    h("div", {}, h("button", { type: "submit", class: "primary", text: "Rank layouts" })));
  const out = h("div", { "aria-live": "polite" });
  const bench = await benchCard(view);
  onSubmit(form, async (fd) => {
    const r = (await api("layout_plan", { disks: parseInt(fd.get("disks"), 10), disk_bytes: parseSize(fd.get("size")), disk_type: String(fd.get("type")), workload: String(fd.get("workload")) })).plan;
    clear(out).append(h("p", {}, h("b", { text: "Recommended: " + r.recommended }), " — " + r.reason),
      table(["Layout", { label: "Usable", num: true }, "Survives", "MTTDL", "Resilver", "Seq read", "Seq write", { label: "Random read IOPS", num: true }, ""],
        r.layouts.map((a) => {
          // Measure it: the benchmark form below, set to this layout as an emulated build.
          const measure = h("button", { type: "button", text: "Measure", "aria-label": "Measure " + a.name + " as an emulated build" });
          measure.addEventListener("click", () => bench.measure(a.emulate));
          return h("tr", { class: a.name === r.recommended ? "best" : null },
            h("td", { class: "mono", text: a.name }), h("td", { class: "num", text: size(a.usable_bytes) }),
            h("td", { text: a.failures_tolerated }), h("td", { text: years(a.mttdl_years) }), h("td", { text: a.resilver_hours.toFixed(1) + " h" }),
            h("td", { text: rate(a.seq_read_bytes_per_s) }), h("td", { text: rate(a.seq_write_bytes_per_s) }), h("td", { class: "num", text: Math.round(a.random_read_iops) }),
            h("td", {}, measure));
        })));
  });
  view.append(h("section", { class: "card" }, h("h2", { text: "Layouts for your disks" }), form, out));
  view.append(bench.card);
}

/** The benchmark: runs on a mounted filesystem, or on an emulated build the daemon makes
 *  and removes, as a job; its progress and figures. Returns the card, and `measure(build)`
 *  that sets the form to an emulated build. */
async function benchCard(view) {
  const [ds, jobs] = await Promise.all([api("dataset_list", { recursive: true, types: ["filesystem", "volume"] }), api("job_list", {})]);
  const names = (ds.datasets || []).filter((d) => d.kind === "filesystem").map((d) => d.name);
  const target = h("select", { name: "target" }, [["dataset", "a filesystem of a pool"], ["emulated", "an emulated build"]].map(([v, t]) => h("option", { value: v, text: t })));
  const dsField = h("div", { class: "stack" }, ...field("Filesystem", h("select", { name: "dataset" }, names.map((n) => h("option", { value: n, text: n }))), "It must be mounted; the benchmark works in a directory of its own there and removes it after."));
  const buildInput = h("input", { name: "build", value: "7x hdd raidz2 + ssd log + ssd cache", spellcheck: "false" });
  const buildField = h("div", { class: "stack", hidden: true }, ...field("Build", buildInput,
    "Disks of a profile (hdd, ssd, nvme; overrides such as hdd:bw=200M) and a layout, then + log, cache or spare devices, as tank bench --emulate takes. The daemon makes its devices as sparse files in its data directory, paced to the profiles, and removes them after."));
  const sizeInput = h("input", { name: "size", value: "1G", spellcheck: "false" });
  const show = () => {
    const emulated = target.value === "emulated";
    dsField.hidden = emulated;
    buildField.hidden = !emulated;
  };
  target.addEventListener("change", show);
  const form = h("form", { class: "stack" },
    ...field("Measure", target), dsField, buildField,
    ...field("Size", sizeInput, "Bytes the stream phases write and read; on a filesystem, twice the RAM keeps the caches out of the figures (an emulated build caches metadata only)."),
    ...field("Runs", h("input", { name: "runs", type: "number", min: 1, max: 100, value: 3 }), "The figures are their median."),
    ...field("Small files", h("input", { name: "files", type: "number", min: 1, value: 16384 }), "Files the create, stat and delete phases make (16,384 as bonnie++)."),
    ...field("Tree files", h("input", { name: "tree_files", type: "number", min: 1, value: 2000 }), "Files of the tree copied in and out."),
    ...field("Name in the history", h("input", { name: "label", spellcheck: "false" }), "Empty: the filesystem's name, or the build."),
    h("div", {}, h("button", { type: "submit", class: "primary", text: "Run benchmark" })));
  // The jobs and the history are redrawn in place (the form keeps what was typed): every
  // two seconds while a benchmark runs, and the history when one ends.
  const jobsBox = h("div", { "aria-live": "polite" });
  const historyBox = h("div");
  let timer = null;
  const drawJobs = async (list) => {
    const benches = (list || await api("job_list", {}, { background: true })).filter((j) => j.kind === "benchmark");
    const live = benches.some((j) => j.state === "running" || j.state === "canceling");
    clear(jobsBox).append(jobsTable(benches, () => drawJobs()));
    if (live && !timer) timer = setInterval(() => drawJobs().catch((e) => clear(jobsBox).append(errorBox(e))), 2000);
    if (!live && timer) {
      clearInterval(timer);
      timer = null;
      clear(historyBox).append(await benchHistory());
    }
  };
  onLeave(view, () => timer && clearInterval(timer));
  onSubmit(form, async (fd) => {
    const label = String(fd.get("label") || "").trim();
    const int = (k) => parseInt(fd.get(k), 10) || null;
    const params = { size: parseSize(fd.get("size")), runs: int("runs"), files: int("files"), tree_files: int("tree_files"), label: label || null };
    const r = target.value === "emulated"
      ? await api("emulated_bench", { build: String(fd.get("build") || "").trim(), params })
      : await api("dataset_bench", { dataset: String(fd.get("dataset")), params });
    toast(r.message || "Benchmark started.");
    await drawJobs();
  });
  const card = h("section", { class: "card" }, h("h2", { text: "Benchmark" }), form, jobsBox, historyBox);
  historyBox.append(await benchHistory());
  await drawJobs(jobs);
  const measure = (build) => {
    target.value = "emulated";
    buildInput.value = build;
    show();
    card.scrollIntoView({ block: "start" });
    buildInput.focus();
  };
  return { card, measure };
}

const FIGURES = [
  ["seq_output_block_mb_s", "Sequential write", "MB/s"], ["rewrite_mb_s", "Rewrite", "MB/s"],
  ["seq_input_block_mb_s", "Sequential read", "MB/s"], ["random_seeks_per_s", "Random seeks", "/s"],
  ["seq_create_per_s", "File creates", "/s"], ["seq_stat_per_s", "File stats", "/s"], ["seq_delete_per_s", "File deletes", "/s"],
  ["tree_copy_in_mb_s", "Tree copy in", "MB/s"], ["tree_copy_out_mb_s", "Tree copy out", "MB/s"], ["tree_delete_files_per_s", "Tree delete", "files/s"],
];

/** The last runs of the history side by side: a bar per run for each figure, scaled to
 *  the best run of that figure. */
async function benchHistory() {
  const runs = (await api("bench_history", { limit: 6 })).runs.filter((r) => r.summary && r.summary.median);
  const box = h("div", {}, h("h3", { text: "History" }));
  if (!runs.length) return add(box, [h("p", { class: "muted", text: "No benchmark has been recorded yet." })]);
  box.append(h("p", { class: "hint", text: (runs.length === 1 ? "The last run" : "The last " + runs.length + " runs") + " (medians of each run's repeats); the bar is the share of the best run's figure." }));
  const rows = [];
  for (const [key, label, unit] of FIGURES) {
    const vals = runs.map((r) => Number(r.summary.median[key] || 0));
    const best = Math.max(...vals, 1e-9);
    runs.forEach((r, i) => {
      rows.push(h("tr", {},
        i === 0 ? h("th", { scope: "rowgroup", rowspan: runs.length, text: label }) : null,
        h("td", { class: "small", text: r.label + " · " + when(r.time) }),
        h("td", { class: "num", text: vals[i].toFixed(vals[i] >= 100 ? 0 : 1) + " " + unit }),
        h("td", { class: "barcell" }, h("div", { class: "bar", role: "img", "aria-label": Math.round(100 * vals[i] / best) + "% of the best" },
          h("span", { "data-width": Math.round(100 * vals[i] / best) })))));
    });
  }
  box.append(table(["Figure", "Run", { label: "Value", num: true }, ""], rows));
  return box;
}

/** Jobs with a progress bar while they run, and a Cancel button; `changed` after a cancel. */
function jobsTable(jobs, changed) {
  if (!jobs.length) return h("p", { class: "muted", text: "No runs yet." });
  return table(["Job", "Target", "State", "Progress", "Started", "Result", ""], jobs.slice().reverse().map((j) => {
    const p = pct(j.done_bytes, j.total_bytes);
    const cell = h("td");
    if (j.state === "running") {
      const stop = h("button", { type: "button", class: "danger", text: "Cancel", "aria-label": "Cancel job " + j.id });
      stop.addEventListener("click", async () => {
        stop.disabled = true;
        try {
          await api("job_cancel", { id: j.id });
          if (changed) await changed();
        } catch (e) {
          stop.after(errorBox(e));
          stop.disabled = false;
        }
      });
      cell.append(stop);
    }
    return h("tr", {}, h("td", { text: j.id }), h("td", { class: "mono", text: j.target }), h("td", { text: j.state }),
      h("td", {}, j.state === "running" ? [h("progress", { max: 100, value: p.toFixed(1), class: "job-progress", "aria-label": "job " + j.id }),
        h("span", { class: "small", text: " " + p.toFixed(0) + "%" + (j.rate ? ", " + rate(j.rate) : "") + (j.eta_secs != null ? ", " + duration(j.eta_secs) + " left" : "") })] : ""),
      h("td", { text: when(j.started) }), h("td", { class: "small", text: j.detail }), cell);
  }));
}

// ---- Start ---------------------------------------------------------------------------

document.getElementById("menu").addEventListener("click", (ev) => {
  const nav = document.getElementById("nav");
  nav.classList.toggle("open");
  ev.currentTarget.setAttribute("aria-expanded", nav.classList.contains("open"));
});
document.getElementById("logout").addEventListener("click", async () => {
  await fetch("/api/v1/logout", { method: "POST", headers: { "X-CSRF-Token": CSRF }, credentials: "same-origin" }).catch(() => {});
  location.replace("/login?why=out");
});
window.addEventListener("hashchange", () => { route(); main.focus(); });

(async () => {
  try {
    me = await api("hello", {});
  } catch (e) {
    clear(main).append(errorBox(e));
    return;
  }
  document.getElementById("who").textContent = me.caller + (me.admin ? " (administrator)" : "");
  if (!me.admin) for (const a of document.querySelectorAll("nav a[data-admin]")) a.remove();
  watchHealth();
  setInterval(watchHealth, 10000);
  await route();
})();
