// A small SVG line chart of one series; gaps (null values) break the line.

import { h, svg } from "./dom.js";

const W = 320;
const H = 120;
const PAD = { left: 40, right: 8, top: 8, bottom: 18 };

// Creates a chart figure; returns {el, update(samples)}.
export function lineChart({ key, title, unit, digits = 1 }) {
  const value = h("span", { class: "chart-value" });
  const plot = svg("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": title, class: "chart" });
  const el = h("figure", { class: "card chart-card", "data-testid": `chart-${key}` },
    h("figcaption", null, h("span", { class: "chart-title" }, title), value),
    plot);

  function update(samples) {
    const points = samples.map((s) => [s.at_ms, s[key]]);
    const values = points.map((p) => p[1]).filter((v) => v !== null && v !== undefined);
    const current = points.length ? points[points.length - 1][1] : null;
    const shown = current === null || current === undefined ? "–" : `${Number(current).toFixed(digits)} ${unit}`;
    value.textContent = shown;

    const max = Math.max(1e-9, ...values) * 1.1;
    const t0 = points.length ? points[0][0] : 0;
    const t1 = points.length ? points[points.length - 1][0] : 1;
    const x = (t) => PAD.left + ((t - t0) / Math.max(1, t1 - t0)) * (W - PAD.left - PAD.right);
    const y = (v) => H - PAD.bottom - (v / max) * (H - PAD.top - PAD.bottom);

    // Polylines, split wherever a value is missing.
    const lines = [];
    let run = [];
    for (const [t, v] of points) {
      if (v === null || v === undefined) {
        if (run.length) lines.push(run);
        run = [];
      } else {
        run.push(`${x(t).toFixed(1)},${y(v).toFixed(1)}`);
      }
    }
    if (run.length) lines.push(run);

    const span = Math.round((t1 - t0) / 1000);
    plot.setAttribute("aria-label", `${title}: ${shown} now; peak ${values.length ? Math.max(...values).toFixed(digits) : "–"} over the last ${span} s`);
    plot.replaceChildren(
      svg("line", { class: "axis", x1: PAD.left, y1: H - PAD.bottom, x2: W - PAD.right, y2: H - PAD.bottom }),
      svg("line", { class: "axis", x1: PAD.left, y1: PAD.top, x2: PAD.left, y2: H - PAD.bottom }),
      svg("text", { class: "tick", x: PAD.left - 4, y: PAD.top + 8, "text-anchor": "end" }, (max / 1.1).toFixed(digits)),
      svg("text", { class: "tick", x: PAD.left - 4, y: H - PAD.bottom, "text-anchor": "end" }, "0"),
      svg("text", { class: "tick", x: W - PAD.right, y: H - 4, "text-anchor": "end" }, "now"),
      svg("text", { class: "tick", x: PAD.left, y: H - 4 }, `-${span}s`),
      ...lines.map((pts) => (pts.length === 1
        ? svg("circle", { class: "dot", cx: pts[0].split(",")[0], cy: pts[0].split(",")[1], r: 2 })
        : svg("polyline", { class: "line", points: pts.join(" ") }))),
    );
  }

  return { el, update };
}
