// Starts the console. Kept out of index.html so the page's CSP can forbid inline scripts.
//
// Over a slow link the WebAssembly takes seconds to arrive. Meanwhile the page's shell shows
// the host's figures from `/api/host` (a few hundred bytes), refreshed each tick, until the
// console replaces the shell.
// The console's module is asked for at once, beside the host's figures: a static import would
// hold this script, and its first `/api/host`, until the module had arrived.
const console_module = import("/pkg/ringside_frontend.js");

function text(id, value) {
  const element = document.getElementById(id);
  if (element) element.textContent = value;
}

// As the console formats them (frontend/src/chart.rs `format_value`, format.rs `bytes`).
function percent(value) {
  const digits = Math.abs(value) >= 100 ? 0 : Math.abs(value) >= 10 ? 1 : 2;
  return value.toFixed(digits) + " %";
}

function bytes(b) {
  const gib = b / (1024 * 1024 * 1024);
  if (gib >= 1) return gib.toFixed(1) + " GiB";
  if (b < 1024 * 1024) return (b / 1024).toFixed(0) + " KiB";
  return (b / 1024 / 1024).toFixed(0) + " MiB";
}

let marked = false;

// Shows `/api/host`'s answer in the shell; returns the ms until the next tick.
function show(now) {
  const host = now && now.host;
  if (host && typeof host.cpu_utilization_pct === "number" && host.memory && typeof host.load1 === "number") {
    text("shell-cpu", percent(host.cpu_utilization_pct));
    text("shell-memory", bytes(host.memory.used_bytes) + " of " + bytes(host.memory.total_bytes));
    text("shell-load", [host.load1, host.load5, host.load15].map((l) => Number(l).toFixed(2)).join(" · "));
    document.getElementById("shell-host").hidden = false;
    text("shell-status", "Live · the console is loading…");
    if (!marked) {
      marked = true;
      // The first host figures on screen (`cargo xtask bench console` reads this mark).
      performance.mark("ringside-live");
    }
  }
  const interval = now && Number(now.interval_ms);
  return Math.min(Math.max(interval || 1000, 1000), 10000);
}

async function poll() {
  // The console has replaced the shell: it shows the figures from here on.
  if (!document.getElementById("shell")) return;
  let wait = 2000;
  try {
    const response = await fetch("/api/host", { credentials: "same-origin" });
    if (response.ok) wait = show(await response.json());
    else text("shell-status", "The daemon answered " + response.status + ": the console will say more when it runs.");
  } catch (_) {
    text("shell-status", "The daemon cannot be reached; retrying…");
  }
  setTimeout(poll, wait);
}

poll();

console_module.then(({ default: init }) => init({ module_or_path: "/pkg/ringside_frontend_bg.wasm" })).catch((error) => {
  const message = document.createElement("p");
  message.className = "banner banner-error";
  message.textContent = "The console could not start: " + error + ". Reload, or check that this browser supports WebAssembly.";
  document.body.prepend(message);
});
