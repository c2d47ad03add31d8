// Entry point: sign-in, the header, the cluster event stream and hash
// routing between the views.

import { getJson, getKey, setKey, clearKey } from "./api.js";
import { followSse } from "./sse.js";
import { store } from "./store.js";
import { setError, clearErrors } from "./alerts.js";
import { showFreshness } from "./feed.js";
import * as cluster from "./cluster.js";
import * as channels from "./channels.js";
import * as channel from "./channel.js";
import * as rates from "./rates.js";

const $ = (id) => document.getElementById(id);

let stream = null;     // the cluster event stream
let unmount = null;    // cleanup of the mounted view
let signedIn = false;

// ---- header

function renderHeader() {
  const view = store.cluster;
  const node = view ? view.observed_by : "…";
  const me = view && view.nodes ? view.nodes.find((n) => n.node_id === view.observed_by) : null;
  $("conn-node").textContent = node;
  $("conn-role").textContent = me ? `(${me.role}${me.draining ? ", draining" : ""})` : "";
  const status = $("stream-status");
  status.textContent = store.status;
  status.dataset.status = store.status;
}

store.subscribe(renderHeader);
store.subscribe(() => showFreshness($("view")));

// ---- cluster stream: drives the header, the cluster view and the rates

function startStream() {
  stream = followSse({
    url: () => "/v1/admin/cluster/events",
    retryMs: 1000,
    onStatus: (status) => {
      // A stopped cluster stream only happens on sign-out.
      if (status === "live") setError("stream", null);
      store.setStatus(status === "stopped" ? "reconnecting" : status);
    },
    // The server's heartbeat comes every 15 s; views every second.
    idleMs: 20000,
    onError: (err) => {
      if (err.status === 401 || err.status === 403) {
        // The key was revoked or lost its admin right (e.g. a reload of
        // the node's access control): back to the sign-in form.
        signOut();
        setError("signin", `Signed out: ${err.message}`);
        return;
      }
      setError("stream", `Cluster stream: ${err.message}`);
    },
    onEvent: (event) => {
      if (event.type !== "cluster") return undefined;
      try {
        store.setCluster(JSON.parse(event.data));
      } catch (e) {
        setError("stream", `Cluster stream: bad event (${e.message})`);
      }
      return undefined;
    },
  });
}

// ---- routing

const views = { cluster, channels, channel, rates };

function parseRoute() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [name, ...rest] = hash.split("/");
  if (name === "channel" && rest.length) {
    let channelName;
    try { channelName = decodeURIComponent(rest.join("/")); } catch { channelName = rest.join("/"); }
    return { name: "channel", channel: channelName };
  }
  if (name in views && name !== "channel") return { name };
  return null;
}

function route() {
  if (!signedIn) return;
  const r = parseRoute();
  if (!r) {
    location.replace("#/cluster");
    return;
  }
  if (unmount) unmount();
  unmount = null;
  clearErrors(["stream"]);
  const container = $("view");
  container.replaceChildren();
  // Mark the current nav link.
  for (const a of document.querySelectorAll("#nav a")) {
    if (a.getAttribute("href") === `#/${r.name}`) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  unmount = views[r.name].mount(container, r);
  showFreshness(container);
  // Move focus to the new view's heading, for keyboard and screen reader users.
  const heading = container.querySelector("h1");
  if (heading && document.activeElement !== $("key")) {
    heading.setAttribute("tabindex", "-1");
    heading.focus({ preventScroll: true });
  }
}

window.addEventListener("hashchange", route);

// ---- sign-in / sign-out

function showSignedIn(on) {
  signedIn = on;
  $("signin").hidden = on;
  $("view").hidden = !on;
  $("nav").hidden = !on;
  $("conn").hidden = !on;
  $("signout").hidden = !on;
}

// Checks the key with GET /v1/admin/cluster; on success enters the console.
async function signIn(key) {
  let view;
  try {
    view = await getJson("/v1/admin/cluster", { key });
  } catch (err) {
    setError("signin", err.status === 401 || err.status === 403
      ? `Sign-in failed: ${err.message}`
      : `Cannot reach the node: ${err.message}`);
    return false;
  }
  setKey(key);
  clearErrors();
  store.reset();
  store.setCluster(view);
  showSignedIn(true);
  startStream();
  renderHeader();
  if (!parseRoute()) location.replace("#/cluster");
  route();
  return true;
}

function signOut() {
  clearKey();
  stream?.stop();
  stream = null;
  if (unmount) unmount();
  unmount = null;
  $("view").replaceChildren();
  store.reset();
  clearErrors();
  showSignedIn(false);
  $("key").value = "";
  $("key").focus();
}

$("signin-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const input = $("key");
  const key = input.value.trim();
  if (!key) {
    setError("signin", "Enter the admin API key.");
    return;
  }
  const button = event.target.querySelector("button");
  button.disabled = true;
  try {
    if (await signIn(key)) input.value = "";
  } finally {
    button.disabled = false;
  }
});

$("signout").addEventListener("click", signOut);

// A key from earlier in this tab's session signs in again silently.
showSignedIn(false);
const saved = getKey();
if (saved) {
  signIn(saved).then((ok) => { if (!ok) clearKey(); });
}
