// Small DOM helpers. Everything is built with createElement and text
// nodes (never innerHTML), so data from the server can never become markup.

const SVG_NS = "http://www.w3.org/2000/svg";

// Applies props to an element: `class`, `text`, `on<event>` handlers, and
// plain attributes (true -> present, false/null/undefined -> absent).
function apply(el, props) {
  for (const [name, value] of Object.entries(props || {})) {
    if (value === false || value === null || value === undefined) continue;
    if (name === "style") throw new Error("inline styles are not allowed (CSP)");
    if (name === "class") el.setAttribute("class", value);
    else if (name === "text") el.textContent = String(value);
    else if (name.startsWith("on") && typeof value === "function") el.addEventListener(name.slice(2), value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

// h("p", {class: "x"}, "text", child, ...) -> HTMLElement
export function h(tag, props, ...children) {
  const el = document.createElement(tag);
  apply(el, props);
  append(el, children);
  return el;
}

// Same for SVG elements.
export function svg(tag, props, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  apply(el, props);
  append(el, children);
  return el;
}

// Replaces all children of el.
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

// A table with a caption and column headers; returns {table, tbody}.
export function table(caption, headers, props = {}) {
  const tbody = h("tbody");
  const table = h(
    "table",
    props,
    h("caption", { class: "visually-hidden" }, caption),
    h("thead", null, h("tr", null, headers.map((name) => h("th", { scope: "col" }, name)))),
    tbody,
  );
  return { table, tbody };
}

// A labelled form control: a <div> with the <label for> and the control.
let uid = 0;
export function field(labelText, control) {
  if (!control.id) control.id = `f${++uid}`;
  return h("div", { class: "field" }, h("label", { for: control.id }, labelText), control);
}
