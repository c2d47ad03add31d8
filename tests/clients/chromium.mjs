// Starts Debian's Chromium headless for the browser tests, through
// playwright-core: Playwright gives it a fresh, temporary profile
// directory of its own (it refuses --user-data-dir in `args`) and removes
// it on close. The flags keep Chromium off the network beyond loopback
// (no background networking, component updates, sync or QUIC); it runs
// without its sandbox, which it cannot set up as root. Signals are left
// to the calling script, which closes the browser itself.

import { chromium } from "playwright-core";

export function launchChromium(executablePath) {
  return chromium.launch({
    executablePath,
    headless: true,
    chromiumSandbox: false,
    handleSIGINT: false,
    handleSIGTERM: false,
    handleSIGHUP: false,
    args: [
      "--no-sandbox",
      "--disable-gpu",
      "--disable-quic",
      "--no-first-run",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
}
