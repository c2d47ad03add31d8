// Channels view: search and page through the channels
// (GET /v1/admin/channels?search=&after=&limit=).

import { h, replace, table, field } from "./dom.js";
import { getJson } from "./api.js";
import { setError } from "./alerts.js";
import * as fmt from "./format.js";

const PAGE_SIZE = 50;

export function mount(container) {
  const section = h("section", { class: "view", "data-view": "channels", "data-ready": "false", "aria-labelledby": "channels-title" });
  const search = h("input", { type: "search", autocomplete: "off", spellcheck: "false" });
  const summary = h("p", { class: "muted", "aria-live": "polite" });
  const list = table("Channels", ["Name", "Head", "Earliest", "Messages", "Bytes", "Retention", "Subscribers", "Last publish"], { class: "data", "data-testid": "channels-table" });
  const prev = h("button", { type: "button", class: "secondary" }, "Previous page");
  const next = h("button", { type: "button", class: "secondary" }, "Next page");

  section.append(
    h("h1", { id: "channels-title" }, "Channels"),
    h("form", { class: "toolbar", role: "search", onsubmit: (e) => { e.preventDefault(); restart(); } }, field("Search channels", search)),
    summary,
    h("div", { class: "scroll" }, list.table),
    h("div", { class: "pager" }, prev, next),
  );
  container.append(section);

  // cursors[i] is the `after` of page i; the last entry is the current page.
  let cursors = [null];
  let nextAfter = null;
  let query = "";
  let seq = 0; // drops answers to superseded requests
  let abort = null;
  let loading = false;

  async function load() {
    const mine = ++seq;
    abort?.abort();
    abort = new AbortController();
    section.dataset.ready = "false";
    loading = true;
    const params = new URLSearchParams({ limit: String(PAGE_SIZE) });
    if (query) params.set("search", query);
    const after = cursors[cursors.length - 1];
    if (after !== null) params.set("after", after);
    try {
      const body = await getJson(`/v1/admin/channels?${params}`, { signal: abort.signal });
      if (mine !== seq) return;
      loading = false;
      setError("view", null);
      render(body);
    } catch (err) {
      if (mine !== seq || err.name === "AbortError") return;
      loading = false;
      setError("view", `Could not list channels: ${err.message}`);
      section.dataset.ready = "error";
      prev.disabled = cursors.length <= 1;
    }
  }

  function render(body) {
    const rows = body.channels || [];
    nextAfter = body.next_after ?? null;
    replace(list.tbody, rows.map((c) => h("tr", { "data-testid": "channel-row", "data-name": c.name },
      h("th", { scope: "row" }, h("a", { href: `#/channel/${encodeURIComponent(c.name)}` }, c.name)),
      h("td", { class: "num" }, c.head),
      h("td", { class: "num" }, c.earliest),
      h("td", { class: "num" }, c.messages),
      h("td", { class: "num" }, fmt.bytes(c.bytes)),
      h("td", null, fmt.retention(c.retention)),
      h("td", { class: "num" }, c.subscribers ?? "–"),
      h("td", null, c.last_published_at ? h("time", { datetime: c.last_published_at }, fmt.time(c.last_published_at)) : "never"),
    )));
    if (!rows.length) replace(list.tbody, h("tr", null, h("td", { colspan: "8", class: "muted" }, query ? `No channel matches “${query}”.` : "No channels.")));
    const page = cursors.length;
    summary.textContent = `Page ${page}: ${rows.length} channel${rows.length === 1 ? "" : "s"}${query ? ` matching “${query}”` : ""}${nextAfter === null ? " (last page)" : ""}.`;
    // Keep keyboard focus on a pager button that becomes disabled.
    const focused = document.activeElement;
    prev.disabled = page <= 1;
    next.disabled = nextAfter === null;
    if (focused === prev || focused === next) {
      if (!focused.disabled) focused.focus();
      else if (!prev.disabled) prev.focus();
      else if (!next.disabled) next.focus();
      else search.focus();
    }
    list.table.dataset.search = query;
    section.dataset.ready = "true";
  }

  function restart() {
    query = search.value.trim();
    cursors = [null];
    load();
  }

  // Debounced search: waits for a pause in typing.
  let debounce = null;
  search.addEventListener("input", () => {
    clearTimeout(debounce);
    debounce = setTimeout(restart, 300);
  });
  next.addEventListener("click", () => {
    if (loading || nextAfter === null) return;
    cursors.push(nextAfter);
    load();
  });
  prev.addEventListener("click", () => {
    if (loading || cursors.length <= 1) return;
    cursors.pop();
    load();
  });

  load();
  return () => { clearTimeout(debounce); abort?.abort(); seq += 1; };
}
