// Cluster view: the writer lease, the nodes and the takeovers, rendered
// from the cluster event stream (store.cluster).

import { h, replace, table } from "./dom.js";
import { store } from "./store.js";
import * as fmt from "./format.js";
import { fedCard } from "./feed.js";

export function mount(container) {
  const section = h("section", { class: "view", "data-view": "cluster", "data-ready": "false", "aria-labelledby": "cluster-title" });
  const holder = h("span", { "data-testid": "holder", class: "holder" });
  const holderNote = h("span", { class: "muted" });
  const token = h("span", { "data-testid": "token" });
  const expiry = h("span", { role: "timer" });
  const renewed = h("span");
  const deadline = h("span");
  const exactness = h("span", { class: "muted" });
  const leaseBody = h("div");
  const nodes = table("Nodes", ["Node", "Role", "URL", "Uptime", "Connections", "Subscriptions", "Version", "Draining", "Last seen"], { class: "data" });
  const takeovers = table("Takeovers, newest first", ["Token", "From", "To", "Cause", "Time"], { class: "data" });

  const leaseList = h("dl", { class: "facts" },
    h("div", null, h("dt", null, "Holder"), h("dd", { "aria-live": "polite" }, holder, holderNote)),
    h("div", null, h("dt", null, "Fencing token"), h("dd", null, token)),
    h("div", null, h("dt", null, "Expires in"), h("dd", null, expiry)),
    h("div", null, h("dt", null, "Last renewal"), h("dd", null, renewed)),
    h("div", null, h("dt", null, "Safety deadline in"), h("dd", null, deadline)),
    h("div", null, h("dt", null, "Timing"), h("dd", null, exactness)),
  );

  section.append(
    h("h1", { id: "cluster-title" }, "Cluster"),
    fedCard(h("section", { class: "card", "aria-labelledby": "lease-title" }, h("h2", { id: "lease-title" }, "Lease"), leaseBody)),
    fedCard(h("section", { class: "card", "aria-labelledby": "nodes-title" }, h("h2", { id: "nodes-title" }, "Nodes"), h("div", { class: "scroll" }, nodes.table))),
    fedCard(h("section", { class: "card", "aria-labelledby": "takeovers-title" }, h("h2", { id: "takeovers-title" }, "Takeovers"), h("div", { class: "scroll" }, takeovers.table))),
  );
  container.append(section);

  // The countdowns tick locally between events, from the last event's
  // values; while the stream reconnects they stand still at them (the
  // cards say "as of" when).
  function tick() {
    const lease = store.cluster && store.cluster.lease;
    if (!lease) return;
    const elapsed = store.stale ? 0 : performance.now() - store.receivedAt;
    expiry.dataset.expiresInMs = String(lease.expires_in_ms);
    const left = lease.expires_in_ms - elapsed;
    expiry.textContent = left > 0 ? fmt.seconds(left) : "expired";
    expiry.classList.toggle("bad", left <= 0);
    renewed.textContent = lease.renewed_ms_ago === null || lease.renewed_ms_ago === undefined
      ? "–" : `${fmt.seconds(lease.renewed_ms_ago + elapsed)} ago`;
    const safety = lease.safety_deadline_in_ms;
    deadline.textContent = safety === null || safety === undefined ? "–" : fmt.seconds(safety - elapsed);
  }

  function render() {
    const view = store.cluster;
    if (!view) {
      replace(leaseBody, h("p", { class: "muted" }, "Waiting for the cluster stream…"));
      return;
    }
    const lease = view.lease;
    if (!lease) {
      holder.textContent = "";
      holder.removeAttribute("data-token");
      token.textContent = "";
      replace(leaseBody, h("p", null, "No lease: no lease row yet, or the storage is unreachable."), leaseList);
      leaseList.hidden = true;
    } else {
      leaseList.hidden = false;
      if (leaseBody.firstChild !== leaseList) replace(leaseBody, leaseList);
      holder.textContent = lease.holder ?? "";
      holder.dataset.token = String(lease.token);
      holderNote.textContent = lease.holder ? (lease.holder_url ? ` at ${lease.holder_url}` : "") : "none (released)";
      token.textContent = String(lease.token);
      exactness.textContent = lease.exact
        ? `exact (observed by the holder ${view.observed_by})`
        : `estimated by ${view.observed_by} from the lease row (TTL ${fmt.ms(lease.ttl_ms)})`;
      tick();
    }

    replace(nodes.tbody, (view.nodes || []).map((n) => h("tr", {
      "data-testid": "node", "data-node-id": n.node_id, "data-role": n.role,
      "data-reported-ms-ago": n.reported_ms_ago,
      class: `role-${n.role}${n.role === "holder" ? " current" : ""}`,
    },
      h("th", { scope: "row" }, n.node_id, n.node_id === view.observed_by ? h("span", { class: "muted" }, " (this node)") : null),
      h("td", { class: "role" }, n.role),
      h("td", { class: "mono" }, n.url ?? "–"),
      h("td", null, fmt.uptime(n.uptime_s)),
      h("td", { class: "num" }, n.connections ?? "–"),
      h("td", { class: "num" }, n.subscriptions ?? "–"),
      h("td", null, n.version ?? "–"),
      // Known only for the node serving the page.
      h("td", null, n.draining === null || n.draining === undefined ? "–" : n.draining ? "yes" : "no"),
      h("td", { "data-testid": "last-seen" }, lastSeen(n)),
    )));
    if (!view.nodes || !view.nodes.length) replace(nodes.tbody, h("tr", null, h("td", { colspan: "9", class: "muted" }, "No nodes reported.")));

    replace(takeovers.tbody, (view.takeovers || []).map((t) => h("tr", {
      "data-testid": "takeover", "data-token": t.token, "data-from": t.from ?? "", "data-to": t.to ?? "", "data-reason": t.reason,
    },
      h("th", { scope: "row", class: "num" }, t.token),
      h("td", null, t.from ?? "–"),
      h("td", null, t.to ?? "–"),
      h("td", null, t.reason),
      h("td", null, h("time", { datetime: t.at }, fmt.time(t.at))),
    )));
    if (!view.takeovers || !view.takeovers.length) replace(takeovers.tbody, h("tr", null, h("td", { colspan: "5", class: "muted" }, "No takeovers recorded.")));

    section.dataset.ready = "true";
  }

  render();
  const off = store.subscribe((kind) => { if (kind === "cluster") render(); else tick(); });
  const timer = setInterval(tick, 200);
  return () => { off(); clearInterval(timer); };
}

// A node's last report: its age, and for a node that stopped reporting
// (silent or gone) the time of day it was last seen.
function lastSeen(n) {
  if (n.reported_ms_ago === undefined || n.reported_ms_ago === null) return "–";
  const ago = `${fmt.ms(n.reported_ms_ago)} ago`;
  if (n.role !== "silent" && n.role !== "gone") return ago;
  return h("time", { datetime: n.last_seen }, `${fmt.clock(Date.parse(n.last_seen))} (${ago})`);
}
