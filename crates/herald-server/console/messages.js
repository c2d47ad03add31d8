// Rendering of one channel message: JSON data pretty-printed, binary data
// (data_base64) as a hex dump plus its text decoded as UTF-8.

import { h } from "./dom.js";
import * as fmt from "./format.js";

const HEX_LIMIT = 4096; // bytes shown in a hex dump

function decodeBase64(b64) {
  const bin = atob(b64);
  const bytes = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i += 1) bytes[i] = bin.charCodeAt(i);
  return bytes;
}

// 16 bytes a line: offset, hex bytes, printable ASCII.
function hexDump(bytes) {
  const lines = [];
  const end = Math.min(bytes.length, HEX_LIMIT);
  for (let at = 0; at < end; at += 16) {
    const chunk = bytes.subarray(at, Math.min(at + 16, end));
    const hex = [...chunk].map((b) => b.toString(16).padStart(2, "0")).join(" ");
    const ascii = [...chunk].map((b) => (b >= 0x20 && b < 0x7f ? String.fromCharCode(b) : ".")).join("");
    lines.push(`${at.toString(16).padStart(8, "0")}  ${hex.padEnd(47)}  ${ascii}`);
  }
  if (bytes.length > end) lines.push(`… ${bytes.length - end} more bytes`);
  return lines.join("\n");
}

function body(message) {
  if ("data_base64" in message) {
    let bytes;
    try {
      bytes = decodeBase64(message.data_base64 || "");
    } catch {
      return [h("p", { class: "bad" }, "Invalid base64 data.")];
    }
    const text = new TextDecoder("utf-8", { fatal: false }).decode(bytes);
    return [
      h("p", { class: "muted" }, `Binary, ${bytes.length} bytes:`),
      h("pre", { class: "data hex" }, hexDump(bytes)),
      h("p", { class: "muted" }, "As UTF-8 text:"),
      h("pre", { class: "data" }, text),
    ];
  }
  return [h("pre", { class: "data" }, JSON.stringify(message.data, null, 2) ?? "undefined")];
}

// One <li> for a message; `testid` names its list (history-row / tail-row).
export function messageItem(message, testid) {
  const tags = message.tags && Object.keys(message.tags).length
    ? h("span", { class: "tags" }, Object.entries(message.tags).map(([k, v]) => h("span", { class: "tag" }, `${k}=${v}`)))
    : null;
  return h("li", { class: "message", "data-testid": testid, "data-offset": message.offset },
    h("div", { class: "meta" },
      h("span", { class: "offset" }, `#${message.offset}`),
      " ",
      message.published_at ? h("time", { datetime: message.published_at }, fmt.time(message.published_at)) : null,
      tags),
    body(message));
}
