// durafn's dashboard: progressive enhancement only. Every page works without this file;
// with it: keyboard shortcuts ("g" then a page's key, "/" the filter, "?" the help).
(() => {
  "use strict";
  const typing = (el) =>
    el && (el.isContentEditable || ["INPUT", "SELECT", "TEXTAREA"].includes(el.tagName));

  // -- keyboard shortcuts ----------------------------------------------------------------
  let pending = null; // "g" pressed, waiting for the page's key
  const pageKey = (key) => document.querySelector(`nav.pages a[data-key="${key}"]`);
  const help = () => {
    let box = document.getElementById("keys-help");
    if (!box) {
      box = document.createElement("div");
      box.id = "keys-help";
      box.setAttribute("role", "dialog");
      box.setAttribute("aria-label", "Keyboard shortcuts");
      box.tabIndex = -1;
      const keys = document.querySelector("footer.keys p");
      box.innerHTML = "<strong>Keyboard shortcuts</strong>";
      const p = document.createElement("p");
      p.textContent = keys ? keys.textContent : "";
      box.appendChild(p);
      const close = document.createElement("button");
      close.textContent = "Close";
      close.addEventListener("click", () => { box.hidden = true; });
      box.appendChild(close);
      document.body.appendChild(box);
      box.hidden = true;
    }
    box.hidden = !box.hidden;
    if (!box.hidden) box.focus();
  };
  document.addEventListener("keydown", (e) => {
    if (e.ctrlKey || e.metaKey || e.altKey || typing(e.target)) return;
    if (pending) {
      clearTimeout(pending);
      pending = null;
      const link = pageKey(e.key);
      if (link) { e.preventDefault(); link.click(); }
      return;
    }
    if (e.key === "g") {
      pending = setTimeout(() => { pending = null; }, 1500);
    } else if (e.key === "/") {
      const field = document.querySelector("form.filters input, form.filters select");
      if (field) { e.preventDefault(); field.focus(); }
    } else if (e.key === "?") {
      e.preventDefault();
      help();
    } else if (e.key === "Escape") {
      const box = document.getElementById("keys-help");
      if (box) box.hidden = true;
    }
  });
})();
