// Loads the console's WebAssembly; kept out of index.html so the page's CSP can forbid inline scripts.
import init from "/pkg/ringside_frontend.js";

init({ module_or_path: "/pkg/ringside_frontend_bg.wasm" }).catch((error) => {
  const message = document.createElement("p");
  message.className = "banner banner-error";
  message.textContent = "The console could not start: " + error + ". Reload, or check that this browser supports WebAssembly.";
  document.body.prepend(message);
});
