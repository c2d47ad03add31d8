// The page's role="alert" region: one message per source (sign-in, the
// current view, the cluster stream...), so one source clearing its error
// does not hide another's.

import { h, replace } from "./dom.js";

const messages = new Map();

function render() {
  const region = document.getElementById("alert");
  replace(region, [...messages.values()].map((text) => h("p", null, text)));
}

export function setError(source, error) {
  const text = error ? (typeof error === "string" ? error : error.message || String(error)) : null;
  if (text) messages.set(source, text);
  else messages.delete(source);
  render();
}

// Clears every message but those of the sources listed in `keep`.
export function clearErrors(keep = []) {
  for (const source of [...messages.keys()]) {
    if (!keep.includes(source)) messages.delete(source);
  }
  render();
}
