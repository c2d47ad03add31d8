// Drives Herald's web console (served by a node at /console/) in headless
// Chromium through playwright-core, for the Rust tests of the console.
//
//   node console.mjs <Chromium binary> <artefact dir>
//
// It reads commands as JSON objects, one per line, on stdin and answers
// each with exactly one JSON line on stdout, in order:
//
//   {"type":"answer","cmd":"...","ok":true, ...results}
//   {"type":"answer","cmd":"...","ok":false,"error":"..."}
//
// (a command's "id", when given, is echoed back). Between answers it may
// write {"type":"page_error","page":"A","text":"..."} for an uncaught
// exception in a page, a console.error() of a page or a Content Security
// Policy violation; the test fails on those. Resource load failures that
// Chromium logs as console errors ("Failed to load resource: ...", e.g. a
// 401 asked for on purpose or a stream cut by a node restart) go to stderr
// only. Each named page has its own browser context (its own
// sessionStorage). All waits are bounded by "timeout_ms" (default 30000).
//
// Commands:
//   {"cmd":"open","page":"A","url":"http://127.0.0.1:P/console/","key":"..."}
//       new context and page; signs in with the keyboard only (Tab until
//       the "Admin API key" field has focus, at most 10 presses, type the
//       key, Enter) -> {"signed_in":bool,"alert":"text"|null}
//   {"cmd":"cluster","page":"A"}
//       -> {"holder","token","nodes":[{"node_id","role","last_seen",
//           "reported_ms_ago","role_color"}],
//           "takeovers":[{"token","from","to","reason"}],"status",
//           "stale","cards":[{"title","stale","as_of"}],
//           "expiry":{"text","expires_in_ms"}}
//   {"cmd":"wait_holder","page":"A","not":"n1"}
//       until a holder other than "not" is shown with a takeover row to it
//       -> {"holder","token","takeover":{...},"elapsed_ms",
//           "nodes_then":[{"node_id","role"}] (the node rows in the same
//           rendering as the first takeover row to the new holder)}
//   {"cmd":"wait_cluster","page":"A","node":"n1","role":"gone",
//    "min_age_ms":N,"stale":bool,"reason":"released"}
//       until the cluster view shows all that is asked: the node's row
//       with that role (and a report at least min_age_ms old), the cards
//       stale or not, a takeover row with that reason -> as "cluster"
//   {"cmd":"goto","page":"A","view":"cluster"|"channels"|"rates"|"channel",
//    "channel":"x","search":"y"}
//       -> {"view"} once rendered; channels also {"rows":[names]}
//   {"cmd":"tail","page":"B","channel":"x"}
//       opens the channel page, starts the live tail with the keyboard
//       (from the head, or after the optional "after" offset)
//       -> {"status":"live"}
//   {"cmd":"publish","page":"A","channel":"x","data":"{\"n\":1}","idempotency_key":"k1"}
//       -> {"offset":N,"text":"..."}
//   {"cmd":"action","page":"A","channel":"x","action":"Remove history"|
//    "Delete channel"|"Disconnect user","user":"u"}
//       runs one of the channel page's admin actions with the keyboard
//       (its button, then the confirmation) -> {"text","alert"}
//   {"cmd":"presence","page":"A","channel":"x"}
//       -> {"clients":N|null,"text"}
//   {"cmd":"wait_tail","page":"B","count":N}
//       -> {"offsets":[...],"status":"live"|"reconnecting"|"stopped"}
//   {"cmd":"screenshot","page":"A","name":"cluster"}
//       full-page PNG <artefact dir>/<name>.png -> {"path"}
//   {"cmd":"a11y","page":"A"}
//       -> {"problems":[...],"tab_order":[accessible names]}
//   {"cmd":"fetch","page":"A","method":"DELETE","path":"/v1/channels/x","auth":false}
//       fetch() inside the page, with the stored key as Bearer unless
//       "auth" is false (optional "body": a string, or JSON to encode)
//       -> {"status":N,"body":JSON or text}
//   {"cmd":"close_page","page":"B"}
//   {"cmd":"quit"}
//
// On "quit", at the end of stdin (after answering what was read), or on
// SIGTERM/SIGINT it closes the browser and exits with status 0.

import { mkdir } from "node:fs/promises";
import path from "node:path";
import readline from "node:readline";
import { launchChromium } from "./chromium.mjs";

const [executablePath, artefactDir] = process.argv.slice(2);
if (!artefactDir) {
  process.stderr.write("usage: node console.mjs <chromium> <artefact dir> (commands on stdin)\n");
  process.exit(2);
}

const DEFAULT_TIMEOUT_MS = 30000;
// Where the console keeps the admin key (see console/api.js).
const KEY_STORAGE = "herald.console.key";

const emit = (record) => process.stdout.write(`${JSON.stringify(record)}\n`);
const note = (text) => process.stderr.write(`console.mjs: ${text}\n`);

// A fresh profile, off the network beyond loopback (chromium.mjs).
const browser = await launchChromium(executablePath);

// name -> {context, page}
const pages = new Map();

function pageNamed(name) {
  const entry = pages.get(name);
  if (!entry) throw new Error(`no open page named ${JSON.stringify(name)}`);
  return entry.page;
}

// A deadline for one command: left() is the time remaining, at least 1 ms.
function deadline(cmd) {
  const end = Date.now() + (Number(cmd.timeout_ms) > 0 ? Number(cmd.timeout_ms) : DEFAULT_TIMEOUT_MS);
  return () => Math.max(1, end - Date.now());
}

// ---- page helpers (the functions passed to evaluate run in the page)

const alertText = (page) => page.evaluate(() =>
  [...document.querySelectorAll("[role=alert]")].map((e) => e.textContent.trim()).filter(Boolean).join(" ") || null);

// Navigates by hash and waits for the view's section to be rendered.
async function showView(page, view, channel, left) {
  const hash = view === "channel" ? `#/channel/${encodeURIComponent(channel)}` : `#/${view}`;
  const signedIn = await page.evaluate((h) => {
    const nav = document.querySelector("nav");
    if (!nav || nav.hidden) return false;
    if (location.hash !== h) location.hash = h;
    return true;
  }, hash);
  if (!signedIn) throw new Error("not signed in");
  const handle = await page.waitForFunction(([v, c]) => {
    const section = document.querySelector(`[data-view="${v}"]`);
    if (!section || (c !== null && section.dataset.channel !== c)) return false;
    return section.dataset.ready === "true" || section.dataset.ready === "error" ? section.dataset.ready : false;
  }, [view, view === "channel" ? channel : null], { timeout: left(), polling: 50 });
  if ((await handle.jsonValue()) === "error") {
    throw new Error(`the ${view} view failed: ${(await alertText(page)) ?? "no message"}`);
  }
}

// Opens the channel page unless it is already shown (keeps a running tail).
async function showChannel(page, channel, left) {
  if (typeof channel !== "string" || !channel) throw new Error("\"channel\" is required");
  await showView(page, "channel", channel, left);
}

const readCluster = (page) => page.evaluate(() => {
  const text = (sel) => document.querySelector(sel)?.textContent.trim() || null;
  const token = text("[data-testid=token]");
  const expiry = document.querySelector("[data-view=cluster] [role=timer]");
  return {
    holder: text("[data-testid=holder]"),
    token: token === null ? null : Number(token),
    nodes: [...document.querySelectorAll("tr[data-testid=node]")]
      .map((r) => ({
        node_id: r.dataset.nodeId,
        role: r.dataset.role,
        last_seen: r.querySelector("[data-testid=last-seen]")?.textContent.trim() ?? null,
        reported_ms_ago: Number(r.dataset.reportedMsAgo),
        role_color: getComputedStyle(r.querySelector("td.role") ?? r).color,
      })),
    takeovers: [...document.querySelectorAll("tr[data-testid=takeover]")]
      .map((r) => ({ token: Number(r.dataset.token), from: r.dataset.from || null, to: r.dataset.to || null, reason: r.dataset.reason })),
    status: text("[data-testid=stream-status]"),
    stale: [...document.querySelectorAll("[data-feed=cluster]")].some((c) => c.classList.contains("stale")),
    cards: [...document.querySelectorAll("[data-feed=cluster]")].map((c) => {
      const note = c.querySelector("[data-testid=as-of]");
      return {
        title: c.querySelector("h2, figcaption")?.textContent.trim() ?? null,
        stale: c.classList.contains("stale"),
        as_of: note && !note.hidden ? note.textContent.trim() : null,
      };
    }),
    expiry: expiry ? { text: expiry.textContent.trim(), expires_in_ms: Number(expiry.dataset.expiresInMs) } : null,
  };
});

// ---- commands

const commands = {
  async open(cmd, left) {
    if (pages.has(cmd.page)) await commands.close_page(cmd);
    const context = await browser.newContext({ viewport: { width: 1280, height: 900 } });
    const page = await context.newPage();
    pages.set(cmd.page, { context, page });
    page.on("pageerror", (error) => emit({ type: "page_error", page: cmd.page, text: String(error?.stack || error) }));
    page.on("console", (message) => {
      if (message.type() !== "error") return;
      const text = message.text();
      if (text.startsWith("Failed to load resource")) note(`${cmd.page}: ${text}`);
      else emit({ type: "page_error", page: cmd.page, text });
    });
    // CSP violations, reported as console errors whatever Chromium logs.
    await context.addInitScript(() => {
      document.addEventListener("securitypolicyviolation", (e) =>
        console.error(`CSP violation: ${e.violatedDirective} blocked ${e.blockedURI || "inline content"} at ${e.sourceFile || "?"}:${e.lineNumber}`));
    });
    await page.goto(cmd.url, { timeout: left() });

    const field = page.getByLabel("Admin API key", { exact: true });
    await field.waitFor({ state: "visible", timeout: left() });
    let focused = false;
    for (let i = 0; i < 10 && !focused; i += 1) {
      await page.keyboard.press("Tab");
      focused = await field.evaluate((el) => el === document.activeElement);
    }
    if (!focused) throw new Error("the \"Admin API key\" field did not get the focus within 10 Tab presses");
    await page.keyboard.type(String(cmd.key ?? ""));
    await page.keyboard.press("Enter");
    const outcome = await page.waitForFunction(() => {
      const nav = document.querySelector("nav");
      if (nav && !nav.hidden && nav.checkVisibility()) return { signed_in: true, alert: null };
      const alert = [...document.querySelectorAll("[role=alert]")].map((e) => e.textContent.trim()).filter(Boolean).join(" ");
      return alert ? { signed_in: false, alert } : false;
    }, null, { timeout: left(), polling: 50 });
    return outcome.jsonValue();
  },

  async cluster(cmd, left) {
    const page = pageNamed(cmd.page);
    await showView(page, "cluster", null, left);
    return readCluster(page);
  },

  async wait_holder(cmd, left, receivedAt) {
    const page = pageNamed(cmd.page);
    await showView(page, "cluster", null, left);
    const not = cmd.not ?? null;
    // Polled on every animation frame: the node rows are read in the same
    // rendering as the first takeover row to the new holder.
    const first = await page.waitForFunction((unwanted) => {
      const holder = document.querySelector("[data-testid=holder]")?.textContent.trim();
      if (!holder || holder === unwanted) return false;
      if (![...document.querySelectorAll("tr[data-testid=takeover]")].some((r) => r.dataset.to === holder)) return false;
      return [...document.querySelectorAll("tr[data-testid=node]")]
        .map((r) => ({ node_id: r.dataset.nodeId, role: r.dataset.role }));
    }, not, { timeout: left(), polling: "raf" }).catch(async (error) => {
      const now = await readCluster(page).catch(() => null);
      const failure = new Error(`no holder other than ${JSON.stringify(not)} with a takeover to it (holder ${JSON.stringify(now?.holder ?? null)}, stream ${now?.status ?? "?"}): ${error.message.split("\n")[0]}`);
      failure.extra = now;
      throw failure;
    });
    const elapsed = Date.now() - receivedAt;
    const view = await readCluster(page);
    // Takeovers are newest first: the first one to the holder.
    const takeover = view.takeovers.find((t) => t.to === view.holder);
    const nodesThen = await first.jsonValue();
    return { holder: view.holder, token: view.token, takeover, elapsed_ms: elapsed, nodes_then: nodesThen };
  },

  async wait_cluster(cmd, left) {
    const page = pageNamed(cmd.page);
    await showView(page, "cluster", null, left);
    const want = {
      node: cmd.node ?? null,
      role: cmd.role ?? null,
      minAge: Number(cmd.min_age_ms ?? 0),
      stale: typeof cmd.stale === "boolean" ? cmd.stale : null,
      reason: cmd.reason ?? null,
    };
    await page.waitForFunction((w) => {
      if (w.node !== null) {
        const row = [...document.querySelectorAll("tr[data-testid=node]")].find((r) => r.dataset.nodeId === w.node);
        if (!row || (w.role !== null && row.dataset.role !== w.role)) return false;
        if (Number(row.dataset.reportedMsAgo) < w.minAge) return false;
      }
      if (w.stale !== null) {
        const cards = [...document.querySelectorAll("[data-feed=cluster]")];
        if (!cards.length || !cards.every((c) => c.classList.contains("stale") === w.stale)) return false;
      }
      if (w.reason !== null && ![...document.querySelectorAll("tr[data-testid=takeover]")].some((r) => r.dataset.reason === w.reason)) return false;
      return true;
    }, want, { timeout: left(), polling: 50 }).catch(async (error) => {
      const now = await readCluster(page).catch(() => null);
      const failure = new Error(`the cluster view did not show ${JSON.stringify(want)}: ${error.message.split("\n")[0]}`);
      failure.extra = now;
      throw failure;
    });
    return readCluster(page);
  },

  async goto(cmd, left) {
    const page = pageNamed(cmd.page);
    const view = cmd.view;
    if (!["cluster", "channels", "rates", "channel"].includes(view)) throw new Error(`unknown view ${JSON.stringify(view)}`);
    if (view === "channel") await showChannel(page, cmd.channel, left);
    else await showView(page, view, null, left);
    if (view !== "channels") return { view };
    if (typeof cmd.search === "string") {
      await page.getByLabel("Search channels", { exact: true }).fill(cmd.search);
      const handle = await page.waitForFunction((search) => {
        const section = document.querySelector("[data-view=channels]");
        const list = document.querySelector("[data-testid=channels-table]");
        if (section.dataset.ready === "error") return "error";
        return section.dataset.ready === "true" && list.dataset.search === search.trim();
      }, cmd.search, { timeout: left(), polling: 50 });
      if ((await handle.jsonValue()) === "error") throw new Error(`channel search failed: ${await alertText(page)}`);
    }
    const rows = await page.evaluate(() =>
      [...document.querySelectorAll("tr[data-testid=channel-row]")].map((r) => r.dataset.name));
    return { view, rows };
  },

  async tail(cmd, left) {
    const page = pageNamed(cmd.page);
    await showChannel(page, cmd.channel, left);
    const start = page.getByRole("button", { name: "Start live tail", exact: true });
    if (await start.count()) {
      // Optional start offset; by default the tail starts at the head.
      const from = cmd.after === undefined || cmd.after === null ? "" : String(cmd.after);
      await page.getByLabel("Tail from offset", { exact: true }).fill(from, { timeout: left() });
      await start.focus({ timeout: left() });
      await page.keyboard.press("Enter");
    }
    const status = page.locator("[data-testid=tail-status]");
    await page.waitForFunction(() => {
      const s = document.querySelector("[data-testid=tail-status]")?.textContent.trim();
      return s === "live";
    }, null, { timeout: left(), polling: 50 }).catch(async (error) => {
      throw new Error(`tail not live (status ${await status.textContent()}; ${(await alertText(page)) ?? "no alert"}): ${error.message.split("\n")[0]}`);
    });
    return { status: "live" };
  },

  async publish(cmd, left) {
    const page = pageNamed(cmd.page);
    await showChannel(page, cmd.channel, left);
    const data = typeof cmd.data === "string" ? cmd.data : JSON.stringify(cmd.data);
    await page.getByLabel("Data (JSON)", { exact: true }).fill(data, { timeout: left() });
    await page.getByLabel("Idempotency key", { exact: true }).fill(cmd.idempotency_key ?? "", { timeout: left() });
    const result = page.locator("[data-testid=publish-result]");
    const before = Number(await result.getAttribute("data-seq"));
    await page.getByRole("button", { name: "Publish", exact: true }).click({ timeout: left() });
    await page.waitForFunction((seq) =>
      Number(document.querySelector("[data-testid=publish-result]").dataset.seq) > seq,
    before, { timeout: left(), polling: 25 });
    const outcome = await result.evaluate((el) => ({ state: el.dataset.state, offset: el.dataset.offset, text: el.textContent.trim() }));
    if (outcome.state !== "done") throw new Error((await alertText(page)) ?? outcome.text);
    return { offset: Number(outcome.offset), text: outcome.text };
  },

  async action(cmd, left) {
    // One of the channel page's admin actions, with the keyboard: focus
    // its button, Enter, then Enter on the confirmation that takes focus.
    const page = pageNamed(cmd.page);
    await showChannel(page, cmd.channel, left);
    const label = String(cmd.action ?? "");
    if (!["Delete channel", "Remove history", "Disconnect user"].includes(label)) {
      throw new Error(`unknown action ${JSON.stringify(label)}`);
    }
    if (cmd.user !== undefined) {
      await page.getByLabel("User", { exact: true }).fill(String(cmd.user), { timeout: left() });
    }
    const status = page.locator("[data-testid=admin-status]");
    const before = (await status.textContent()) ?? "";
    await page.getByRole("button", { name: label, exact: true }).focus({ timeout: left() });
    await page.keyboard.press("Enter");
    const confirm = page.getByRole("button", { name: `Confirm ${label.toLowerCase()}`, exact: true });
    await confirm.waitFor({ state: "visible", timeout: left() });
    if (!(await confirm.evaluate((el) => el === document.activeElement))) {
      throw new Error("the confirmation button did not take the focus");
    }
    await page.keyboard.press("Enter");
    const handle = await page.waitForFunction((old) => {
      const text = document.querySelector("[data-testid=admin-status]")?.textContent.trim() ?? "";
      return text && text !== old && !text.endsWith("…") ? text : false;
    }, before.trim(), { timeout: left(), polling: 50 });
    return { text: await handle.jsonValue(), alert: await alertText(page) };
  },

  async presence(cmd, left) {
    const page = pageNamed(cmd.page);
    await showChannel(page, cmd.channel, left);
    await page.getByRole("button", { name: "Show presence", exact: true }).click({ timeout: left() });
    const handle = await page.waitForFunction(() => {
      const table = document.querySelector("[data-testid=presence-table]");
      const status = document.querySelector("[data-testid=presence-status]")?.textContent.trim();
      const alert = [...document.querySelectorAll("[role=alert]")].map((e) => e.textContent.trim()).filter(Boolean).join(" ");
      // "Loading…" is the request still running.
      if (status && status.endsWith("…")) return false;
      if (table) return { clients: table.querySelectorAll("tbody tr").length, text: status || null };
      if (status) return { clients: null, text: status };
      return alert ? { clients: null, text: alert } : false;
    }, null, { timeout: left(), polling: 50 });
    return handle.jsonValue();
  },

  async wait_tail(cmd, left) {
    const page = pageNamed(cmd.page);
    const read = () => page.evaluate(() => ({
      offsets: [...document.querySelectorAll("[data-testid=tail-row]")].map((r) => Number(r.dataset.offset)),
      status: document.querySelector("[data-testid=tail-status]")?.textContent.trim() ?? null,
    }));
    const count = Number(cmd.count ?? 1);
    try {
      await page.waitForFunction((n) => document.querySelectorAll("[data-testid=tail-row]").length >= n,
        count, { timeout: left(), polling: 50 });
    } catch (error) {
      const now = await read().catch(() => null);
      const failure = new Error(`fewer than ${count} tail rows: ${error.message.split("\n")[0]}`);
      failure.extra = now;
      throw failure;
    }
    return read();
  },

  async screenshot(cmd, left) {
    const page = pageNamed(cmd.page);
    const name = String(cmd.name ?? "screenshot").replace(/[^A-Za-z0-9._-]/g, "_");
    await mkdir(artefactDir, { recursive: true });
    const file = path.join(artefactDir, `${name}.png`);
    await page.screenshot({ path: file, fullPage: true, timeout: left() });
    return { path: file };
  },

  async a11y(cmd, left) {
    const page = pageNamed(cmd.page);
    // Static checks, and marks the elements that Tab must reach.
    const problems = await page.evaluate(() => {
      const found = [];
      const visible = (el) => el.checkVisibility({ visibilityProperty: true });
      const describe = (el) => `<${el.tagName.toLowerCase()}${el.id ? `#${el.id}` : ""}${el.getAttribute("data-testid") ? ` data-testid=${el.getAttribute("data-testid")}` : ""}>`;
      const name = (el) => {
        const label = el.getAttribute("aria-label");
        if (label && label.trim()) return label.trim();
        const by = el.getAttribute("aria-labelledby");
        if (by) {
          const text = by.split(/\s+/).map((id) => document.getElementById(id)?.textContent.trim() ?? "").join(" ").trim();
          if (text) return text;
        }
        if (el.labels && el.labels.length) {
          const text = [...el.labels].map((l) => l.textContent.trim()).join(" ").trim();
          if (text) return text;
        }
        if (el.tagName === "BUTTON" || el.tagName === "A") {
          const text = el.textContent.replace(/\s+/g, " ").trim();
          if (text) return text;
        }
        return (el.getAttribute("title") || "").trim();
      };
      window.__a11yName = name;

      for (const el of document.querySelectorAll("input, textarea, select, button")) {
        if (el.type === "hidden" || !visible(el)) continue;
        if (!name(el)) found.push(`no accessible name: ${describe(el)}`);
      }
      for (const el of document.querySelectorAll("img")) {
        if (visible(el) && !el.hasAttribute("alt")) found.push(`image without alt: ${describe(el)}`);
      }
      for (const el of document.querySelectorAll("svg")) {
        if (!visible(el) || el.closest("[aria-hidden=true]")) continue;
        if (el.getAttribute("role") !== "img" || !name(el)) found.push(`svg without role="img" and aria-label: ${describe(el)}`);
      }
      const main = document.querySelector("main");
      if (!main || !main.querySelector("h1, h2")) found.push("the view has no h1/h2 heading");
      for (const t of document.querySelectorAll("table")) {
        if (visible(t) && !t.querySelector("th")) found.push(`table without header cells: ${describe(t)}`);
      }
      // Nav links and the view's enabled buttons must be reachable by Tab.
      const targets = [...document.querySelectorAll("nav a[href], main button")]
        .filter((el) => visible(el) && !el.disabled);
      targets.forEach((el, i) => el.setAttribute("data-a11y-probe", String(i)));
      return found;
    });

    const order = [];
    const reached = new Set();
    let first = null;
    for (let i = 0; i < 60 && left() > 1; i += 1) {
      await page.keyboard.press("Tab");
      const step = await page.evaluate(() => {
        const el = document.activeElement;
        if (!el || el === document.body) return null;
        const style = getComputedStyle(el);
        return {
          probe: el.getAttribute("data-a11y-probe"),
          name: window.__a11yName(el) || `<${el.tagName.toLowerCase()}>`,
          tag: el.tagName.toLowerCase(),
          ring: style.outlineStyle !== "none" && parseFloat(style.outlineWidth) > 0 || style.boxShadow !== "none",
        };
      }).catch(() => null);
      if (!step) continue;
      order.push(step.name);
      if (step.probe !== null) reached.add(step.probe);
      if (!step.ring) problems.push(`no visible focus indicator: ${step.name}`);
      const id = `${step.tag}:${step.name}:${step.probe}`;
      if (first === null) first = id;
      else if (id === first) break; // a full cycle
    }

    const missed = await page.evaluate((seen) => {
      const out = [];
      for (const el of document.querySelectorAll("[data-a11y-probe]")) {
        if (!seen.includes(el.getAttribute("data-a11y-probe"))) out.push(`not reachable by Tab: ${window.__a11yName(el) || el.tagName.toLowerCase()}`);
        el.removeAttribute("data-a11y-probe");
      }
      delete window.__a11yName;
      return out;
    }, [...reached]);
    return { problems: [...new Set([...problems, ...missed])], tab_order: order };
  },

  async fetch(cmd) {
    const page = pageNamed(cmd.page);
    return page.evaluate(async ({ method, target, auth, body, keyName }) => {
      const headers = {};
      const key = sessionStorage.getItem(keyName);
      if (auth !== false && key) headers.Authorization = `Bearer ${key}`;
      let payload = body;
      if (payload !== undefined && payload !== null && typeof payload !== "string") {
        payload = JSON.stringify(payload);
        headers["Content-Type"] = "application/json";
      }
      const response = await fetch(target, { method, headers, body: payload ?? undefined, cache: "no-store" });
      const text = await response.text();
      let parsed = text;
      try { parsed = JSON.parse(text); } catch { /* kept as text */ }
      return { status: response.status, body: parsed };
    }, { method: cmd.method ?? "GET", target: cmd.path, auth: cmd.auth, body: cmd.body, keyName: KEY_STORAGE });
  },

  async close_page(cmd) {
    const entry = pages.get(cmd.page);
    if (!entry) throw new Error(`no open page named ${JSON.stringify(cmd.page)}`);
    pages.delete(cmd.page);
    await entry.context.close();
    return {};
  },

  async quit() {
    return {};
  },
};

// ---- command loop: one at a time, answers in order

let closing = false;
async function shutdown() {
  if (closing) return;
  closing = true;
  await browser.close().catch(() => {});
  process.exit(0);
}
for (const signal of ["SIGTERM", "SIGINT", "SIGHUP"]) process.on(signal, shutdown);

async function run(line) {
  const receivedAt = Date.now();
  let cmd;
  try {
    cmd = JSON.parse(line);
  } catch {
    emit({ type: "answer", ok: false, error: "not a JSON command" });
    return;
  }
  const echo = { type: "answer", cmd: cmd.cmd, ...(cmd.id !== undefined ? { id: cmd.id } : {}) };
  const handler = Object.hasOwn(commands, cmd.cmd) ? commands[cmd.cmd] : null;
  if (!handler) {
    emit({ ...echo, ok: false, error: `unknown command ${JSON.stringify(cmd.cmd)}` });
    return;
  }
  const left = deadline(cmd);
  try {
    // The whole command is bounded too, whatever step it is waiting in.
    let timer;
    const limit = new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`timed out after ${Date.now() - receivedAt} ms`)), left() + 250);
    });
    const result = await Promise.race([handler(cmd, left, receivedAt), limit]).finally(() => clearTimeout(timer));
    emit({ ...echo, ...result, ok: true });
  } catch (error) {
    emit({ ...echo, ...(error.extra || {}), ok: false, error: String(error?.message ?? error).split("\n")[0] });
  }
  if (cmd.cmd === "quit") await shutdown();
}

const lines = readline.createInterface({ input: process.stdin });
let queue = Promise.resolve();
lines.on("line", (line) => {
  if (!line.trim()) return;
  queue = queue.then(() => run(line));
});
lines.on("close", () => { queue.then(shutdown); });
