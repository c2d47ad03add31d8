// Formatting of numbers, durations and times for display.

export function ms(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  const abs = Math.abs(value);
  if (abs < 10000) return `${Math.round(value)} ms`;
  return `${(value / 1000).toFixed(1)} s`;
}

// A duration in ms as seconds with one decimal ("27.8 s"): the lease
// card's one unit, so its figures compare at a glance.
export function seconds(value) {
  if (value === null || value === undefined || Number.isNaN(value)) return "–";
  return `${(value / 1000).toFixed(1)} s`;
}

export function uptime(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  let s = Math.floor(seconds);
  const d = Math.floor(s / 86400); s %= 86400;
  const hr = Math.floor(s / 3600); s %= 3600;
  const m = Math.floor(s / 60); s %= 60;
  if (d) return `${d}d ${hr}h ${m}m`;
  if (hr) return `${hr}h ${m}m ${s}s`;
  if (m) return `${m}m ${s}s`;
  return `${s}s`;
}

export function bytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return i === 0 ? `${v} B` : `${v.toFixed(1)} ${units[i]}`;
}

// "2026-12-02T14:00:00.123Z" -> "2026-12-02 14:00:00.123 UTC" (kept in UTC
// so that the times of different nodes read the same).
export function time(iso) {
  if (!iso) return "–";
  return String(iso).replace("T", " ").replace(/Z$/, " UTC");
}

// ms since the Unix epoch -> "14:00:03 UTC" (a time of day, in UTC as
// every time the console shows).
export function clock(msSinceEpoch) {
  if (msSinceEpoch === null || msSinceEpoch === undefined || Number.isNaN(msSinceEpoch)) return "–";
  return `${new Date(msSinceEpoch).toISOString().slice(11, 19)} UTC`;
}

export function rate(value, digits = 1) {
  if (value === null || value === undefined) return "–";
  return Number(value).toFixed(digits);
}

export function retention(r) {
  if (!r) return "keeps all";
  const parts = [];
  if (r.max_messages !== null && r.max_messages !== undefined) parts.push(`${r.max_messages} msgs`);
  if (r.max_age_s !== null && r.max_age_s !== undefined) parts.push(`${uptime(r.max_age_s)} age`);
  if (r.max_bytes !== null && r.max_bytes !== undefined) parts.push(bytes(r.max_bytes));
  return parts.length ? parts.join(", ") : "unlimited";
}
