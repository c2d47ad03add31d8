// The cards that show what the cluster event stream brings (the lease,
// the nodes, the takeovers, the rates) say how old it is while the stream
// reconnects: greyed out, with "as of HH:MM:SS UTC", the time of the last
// view the serving node sent. What they show is then that view's, not
// the cluster's now.

import { h } from "./dom.js";
import { store } from "./store.js";
import * as fmt from "./format.js";

// Marks `card` as fed by the cluster stream and gives it its "as of"
// note (after its heading); returns the card.
export function fedCard(card) {
  card.dataset.feed = "cluster";
  const note = h("p", { class: "as-of", "data-testid": "as-of", hidden: true });
  const heading = card.querySelector("h2, figcaption");
  if (heading) heading.after(note);
  else card.prepend(note);
  return card;
}

// Greys out, or brings back, every fed card under `root`.
export function showFreshness(root) {
  const stale = Boolean(store.stale && store.cluster);
  const text = stale ? `as of ${fmt.clock(store.cluster.at_ms)}` : "";
  for (const card of root.querySelectorAll("[data-feed=cluster]")) {
    card.classList.toggle("stale", stale);
    const note = card.querySelector(".as-of");
    if (!note) continue;
    note.hidden = !stale;
    note.textContent = text;
  }
}
