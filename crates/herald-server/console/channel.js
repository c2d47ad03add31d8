// Channel page: history browser, live tail, publish form, presence and
// admin actions for one channel.

import { h, replace, table, field } from "./dom.js";
import { getJson, request, serverApi, channelPath } from "./api.js";
import { followSse } from "./sse.js";
import { setError } from "./alerts.js";
import { messageItem } from "./messages.js";

const MAX_TAIL_ROWS = 1000;

export function mount(container, route) {
  const name = route.channel;
  const base = channelPath(name);
  const cleanups = [];
  const section = h("section", { class: "view", "data-view": "channel", "data-channel": name, "data-ready": "false", "aria-labelledby": "channel-title" });
  section.append(
    h("p", { class: "crumbs" }, h("a", { href: "#/channels" }, "← All channels")),
    h("h1", { id: "channel-title" }, "Channel ", h("code", null, name)),
  );
  const history = historyPart(name, base, section);
  section.append(history.el, tailPart(base, cleanups), publishPart(base), presencePart(name), adminPart(name, base));
  container.append(section);
  history.loadNewest();
  return () => cleanups.forEach((fn) => fn());
}

// Reads the head and earliest offset with a one-message read.
async function bounds(base) {
  const body = await getJson(`${base}/messages?limit=1`);
  return { head: body.head, earliest: body.earliest };
}

// ---- history browser

function historyPart(name, base, section) {
  const after = h("input", { type: "number", min: "0", step: "1", inputmode: "numeric", placeholder: "newest" });
  const limit = h("input", { type: "number", min: "1", max: "1000", step: "1", value: "20", inputmode: "numeric" });
  const load = h("button", { type: "submit" }, "Load");
  const older = h("button", { type: "button", class: "secondary" }, "Older");
  const newer = h("button", { type: "button", class: "secondary" }, "Newer");
  const info = h("p", { class: "muted", "aria-live": "polite" });
  const list = h("ol", { class: "messages", "data-testid": "history-list", "aria-label": "History" });
  const form = h("form", { class: "toolbar" }, field("After offset", after), field("Limit", limit), h("div", { class: "buttons" }, load, older, newer));
  const el = h("section", { class: "card", "aria-labelledby": "history-title" }, h("h2", { id: "history-title" }, "History"), form, info, list);

  let page = null; // last answer and the `after` it was read with

  const limitValue = () => Math.min(1000, Math.max(1, Number(limit.value) || 20));

  async function read(afterOffset) {
    const n = limitValue();
    try {
      const body = await getJson(`${base}/messages?after=${afterOffset}&limit=${n}`);
      setError("history", null);
      page = { after: afterOffset, body };
      after.value = String(afterOffset);
      render();
    } catch (err) {
      // 409 offset_beyond_head and any other error: shown, page kept.
      info.textContent = `Could not read the history: ${err.message}`;
      setError("history", `History: ${err.message}`);
    }
    if (section.dataset.ready === "false") section.dataset.ready = "true";
  }

  function render() {
    const { body } = page;
    const msgs = body.messages || [];
    const range = msgs.length ? `offsets ${msgs[0].offset}–${msgs[msgs.length - 1].offset}` : "no messages";
    info.textContent = `Head ${body.head}, earliest ${body.earliest}: showing ${range} after ${page.after}.`
      + (body.truncated ? " Older messages were trimmed; the page starts at the earliest offset." : "");
    replace(list, msgs.map((m) => messageItem(m, "history-row")));
    older.disabled = page.after <= Math.max(0, body.earliest - 1);
  }

  // The newest page: the last `limit` messages.
  async function loadNewest() {
    try {
      const { head, earliest } = await bounds(base);
      await read(Math.max(earliest - 1, head - limitValue(), 0));
    } catch (err) {
      info.textContent = `Could not read the history: ${err.message}`;
      setError("history", `History: ${err.message}`);
      section.dataset.ready = "error";
    }
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    if (after.value.trim() === "") loadNewest();
    else read(Math.max(0, Math.floor(Number(after.value))));
  });
  older.addEventListener("click", () => {
    if (!page) return loadNewest();
    const floor = Math.max(0, page.body.earliest - 1);
    return read(Math.max(floor, page.after - limitValue()));
  });
  newer.addEventListener("click", () => {
    if (!page) return loadNewest();
    const msgs = page.body.messages || [];
    return read(msgs.length ? msgs[msgs.length - 1].offset : page.after);
  });

  return { el, loadNewest };
}

// ---- live tail

function tailPart(base, cleanups) {
  const from = h("input", { type: "number", min: "0", step: "1", inputmode: "numeric", placeholder: "head" });
  const toggle = h("button", { type: "button", "aria-pressed": "false" }, "Start live tail");
  const clear = h("button", { type: "button", class: "secondary" }, "Clear");
  const status = h("span", { class: "status", "data-testid": "tail-status", "aria-live": "polite" }, "stopped");
  const count = h("span", { class: "muted" }, "0 messages");
  const list = h("ol", { class: "messages tail", "data-testid": "tail-list", "aria-live": "polite", "aria-relevant": "additions", "aria-label": "Live messages", tabindex: "0" });
  const el = h("section", { class: "card", "aria-labelledby": "tail-title" },
    h("h2", { id: "tail-title" }, "Live tail"),
    h("div", { class: "toolbar" }, field("Tail from offset", from), h("div", { class: "buttons" }, toggle, clear)),
    h("p", null, "Status: ", status, " · ", count),
    list);

  let follower = null;
  let lastOffset = 0; // highest offset shown; anything at or below is a duplicate

  const setStatus = (s) => {
    status.textContent = s;
    status.dataset.status = s;
  };
  const note = (text) => add(h("li", { class: "note" }, text));
  const updateCount = () => {
    const n = list.querySelectorAll("[data-testid=tail-row]").length;
    count.textContent = `${n} message${n === 1 ? "" : "s"}`;
  };

  function add(item) {
    // Follow the bottom only when the reader is already there.
    const atBottom = list.scrollHeight - list.scrollTop - list.clientHeight < 8;
    list.append(item);
    while (list.children.length > MAX_TAIL_ROWS) list.firstElementChild.remove();
    if (atBottom) list.scrollTop = list.scrollHeight;
  }

  function onEvent(event) {
    let data = null;
    try { data = event.data ? JSON.parse(event.data) : null; } catch { /* shown raw below */ }
    switch (event.type) {
      case "message": {
        if (!data || typeof data.offset !== "number") {
          note(`Unreadable message event: ${event.data.slice(0, 200)}`);
          return undefined;
        }
        if (data.offset <= lastOffset) return undefined; // seen already (resume overlap)
        lastOffset = data.offset;
        add(messageItem(data, "tail-row"));
        updateCount();
        return undefined;
      }
      case "truncated":
        note(`Messages after ${data?.requested_after} were trimmed; going on from ${data?.earliest}.`);
        return undefined;
      case "history_withheld":
        note(`History after ${data?.requested_after} withheld; going on after the head ${data?.head}.`);
        return undefined;
      case "deleted":
        note(`The channel was deleted (head ${data?.head}).`);
        return "end";
      case "token_expired":
        note("The credentials expired.");
        return "end";
      default:
        return undefined;
    }
  }

  async function start() {
    toggle.disabled = true;
    setStatus("connecting");
    let startAt;
    try {
      startAt = from.value.trim() === "" ? (await bounds(base)).head : Math.max(0, Math.floor(Number(from.value)));
    } catch (err) {
      setError("tail", `Live tail: ${err.message}`);
      setStatus("stopped");
      toggle.disabled = false;
      return;
    }
    setError("tail", null);
    lastOffset = startAt;
    note(`Tailing after offset ${startAt}.`);
    follower = followSse({
      // First connection from ?after=; resumes send Last-Event-ID instead.
      url: (lastId) => (lastId === null ? `${base}/events?after=${startAt}` : `${base}/events`),
      retryMs: 500,
      onEvent,
      onStatus: (s) => {
        setStatus(s);
        if (s === "stopped") {
          follower = null;
          toggle.textContent = "Start live tail";
          toggle.setAttribute("aria-pressed", "false");
        }
      },
      onError: (err) => setError("tail", `Live tail: ${err.message}`),
    });
    toggle.textContent = "Stop live tail";
    toggle.setAttribute("aria-pressed", "true");
    toggle.disabled = false;
  }

  toggle.addEventListener("click", () => {
    if (follower) follower.stop();
    else start();
  });
  clear.addEventListener("click", () => { list.replaceChildren(); updateCount(); });
  cleanups.push(() => follower?.stop());
  return el;
}

// ---- publish

function publishPart(base) {
  const data = h("textarea", { rows: "5", spellcheck: "false", class: "mono" }, '{"hello": "world"}');
  const key = h("input", { type: "text", autocomplete: "off", spellcheck: "false" });
  const button = h("button", { type: "submit" }, "Publish");
  const result = h("p", { class: "result", "data-testid": "publish-result", "aria-live": "polite", "data-seq": "0" });
  const form = h("form", null, field("Data (JSON)", data), field("Idempotency key", key), h("div", { class: "buttons" }, button), result);
  const el = h("section", { class: "card", "aria-labelledby": "publish-title" }, h("h2", { id: "publish-title" }, "Publish"), form);

  // Each outcome bumps data-seq, so a watcher can tell answers apart.
  function done(state, text, offset) {
    result.dataset.state = state;
    result.textContent = text;
    if (offset === undefined) result.removeAttribute("data-offset");
    else result.dataset.offset = String(offset);
    result.dataset.seq = String(Number(result.dataset.seq) + 1);
  }

  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = data.value;
    try {
      JSON.parse(text);
    } catch (err) {
      setError("publish", `Not published: the data is not valid JSON (${err.message}).`);
      done("error", "Not published: invalid JSON.");
      return;
    }
    result.dataset.state = "pending";
    result.removeAttribute("data-offset");
    result.textContent = "Publishing…";
    const headers = { "Content-Type": "application/json" };
    if (key.value.trim()) headers["Idempotency-Key"] = key.value.trim();
    button.disabled = true;
    try {
      // The text is sent as typed (numbers, key order and spacing kept).
      const { status, body } = await request(`${base}/messages`, { method: "POST", headers, body: `{"data": ${text}}` });
      setError("publish", null);
      done("done", status === 200 ? `Already published at offset ${body.offset}` : `Published at offset ${body.offset}`, body.offset);
    } catch (err) {
      setError("publish", `Not published: ${err.message}`);
      done("error", `Not published: ${err.message}`);
    } finally {
      button.disabled = false;
    }
  });
  return el;
}

// ---- presence

function presencePart(name) {
  const button = h("button", { type: "button", class: "secondary" }, "Show presence");
  const status = h("p", { class: "muted", "aria-live": "polite", "data-testid": "presence-status" });
  const out = h("div");
  const el = h("section", { class: "card", "aria-labelledby": "presence-title" }, h("h2", { id: "presence-title" }, "Presence"), button, status, out);

  button.addEventListener("click", async () => {
    status.textContent = "Loading…";
    out.replaceChildren();
    try {
      const result = await serverApi("presence", { channel: name });
      const clients = Object.values((result && result.presence) || {});
      setError("presence", null);
      status.textContent = `${clients.length} client${clients.length === 1 ? "" : "s"} present.`;
      if (clients.length) {
        const t = table("Clients present", ["Client", "User"], { class: "data", "data-testid": "presence-table" });
        replace(t.tbody, clients.map((c) => h("tr", null, h("td", { class: "mono" }, c.client ?? "–"), h("td", null, c.user || "(anonymous)"))));
        out.append(t.table);
      }
    } catch (err) {
      if (err.code === 108) {
        setError("presence", null);
        status.textContent = "Presence is not enabled for this channel.";
      } else {
        status.textContent = "";
        setError("presence", `Presence: ${err.message}`);
      }
    }
  });
  return el;
}

// ---- admin actions (each asks for a confirmation first)

function confirmAction(label, run, status) {
  const trigger = h("button", { type: "button", class: "danger" }, label);
  const confirm = h("button", { type: "button", class: "danger" }, `Confirm ${label.toLowerCase()}`);
  const cancel = h("button", { type: "button", class: "secondary" }, "Cancel");
  const ask = h("span", { class: "confirm" }, confirm, cancel);
  ask.hidden = true;
  const show = (asking) => {
    ask.hidden = !asking;
    trigger.hidden = asking;
    (asking ? confirm : trigger).focus();
  };
  trigger.addEventListener("click", () => show(true));
  cancel.addEventListener("click", () => { show(false); status.textContent = `${label}: cancelled.`; });
  confirm.addEventListener("click", async () => {
    confirm.disabled = true;
    status.textContent = `${label}…`;
    try {
      status.textContent = await run();
      setError("admin", null);
    } catch (err) {
      status.textContent = `${label} failed: ${err.message}`;
      setError("admin", `${label} failed: ${err.message}`);
    } finally {
      confirm.disabled = false;
      show(false);
    }
  });
  return h("span", { class: "action" }, trigger, ask);
}

function adminPart(name, base) {
  const status = h("p", { class: "status-line", "data-testid": "admin-status", "aria-live": "polite" });
  const user = h("input", { type: "text", autocomplete: "off", spellcheck: "false" });
  const del = confirmAction("Delete channel", async () => {
    const { body } = await request(base, { method: "DELETE" });
    return `Deleted channel ${body.channel ?? name} (head ${body.head}, earliest ${body.earliest}).`;
  }, status);
  const remove = confirmAction("Remove history", async () => {
    await serverApi("history_remove", { channel: name });
    return `History of ${name} removed.`;
  }, status);
  const disconnect = confirmAction("Disconnect user", async () => {
    const who = user.value.trim();
    if (!who) throw new Error("enter the user to disconnect");
    await serverApi("disconnect", { user: who });
    return `User ${who} disconnected.`;
  }, status);
  return h("section", { class: "card", "aria-labelledby": "admin-title" },
    h("h2", { id: "admin-title" }, "Admin actions"),
    h("div", { class: "buttons" }, del, remove),
    h("div", { class: "toolbar" }, field("User", user), h("div", { class: "buttons" }, disconnect)),
    status);
}
