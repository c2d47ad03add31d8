// Rates view: the recent samples (GET /v1/admin/rates), then each `rate`
// of the cluster event stream appended (see store.setCluster).

import { h } from "./dom.js";
import { getJson } from "./api.js";
import { store } from "./store.js";
import { setError } from "./alerts.js";
import { lineChart } from "./chart.js";
import { fedCard } from "./feed.js";

const SERIES = [
  { key: "publishes_per_s", title: "Publishes per second", unit: "/s" },
  { key: "deliveries_per_s", title: "Deliveries per second", unit: "/s" },
  { key: "renewal_ms", title: "Lease renewal latency", unit: "ms" },
  { key: "subscribers", title: "Subscribers", unit: "", digits: 0 },
];

export function mount(container) {
  const section = h("section", { class: "view", "data-view": "rates", "data-ready": "false", "aria-labelledby": "rates-title" });
  const charts = SERIES.map((s) => lineChart(s));
  for (const c of charts) fedCard(c.el);
  const info = h("p", { class: "muted" });
  section.append(h("h1", { id: "rates-title" }, "Rates"), info, h("div", { class: "charts" }, charts.map((c) => c.el)));
  container.append(section);

  let alive = true;
  function render() {
    if (!store.rates) return;
    const samples = store.rates.samples;
    info.textContent = `${samples.length} samples, one every ${store.rates.interval_ms} ms, oldest first.`;
    for (const c of charts) c.update(samples);
    section.dataset.ready = "true";
  }

  getJson("/v1/admin/rates").then((body) => {
    if (!alive) return;
    store.rates = { interval_ms: body.interval_ms ?? 1000, samples: (body.samples || []).slice(-300) };
    render();
  }).catch((err) => {
    if (!alive) return;
    setError("rates", `Could not read the rates: ${err.message}`);
    // Still chart what the stream brings.
    store.rates = store.rates || { interval_ms: 1000, samples: [] };
    render();
    section.dataset.ready = "error";
  });

  const off = store.subscribe((kind) => { if (kind === "cluster") render(); });
  return () => { alive = false; off(); };
}
