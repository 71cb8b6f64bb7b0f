// durafn's dashboard: progressive enhancement only. Every page works without this file;
// with it: keyboard shortcuts ("g" then a page's key, "/" the filter, "?" the help), and
// the rows list kept live (below).
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
      const field = document.querySelector(
        "form.filters input, form.filters select, header form.search input");
      if (field) { e.preventDefault(); field.focus(); }
    } else if (e.key === "?") {
      e.preventDefault();
      help();
    } else if (e.key === "Escape") {
      const box = document.getElementById("keys-help");
      if (box) box.hidden = true;
    }
  });

  // -- the rows list, live ---------------------------------------------------------------
  // /rows/live sends the newest rows the filter matches ([id, state] pairs) as they
  // change; the list is then fetched again and its table swapped. It holds instead
  // (saying how many rows are new, with a button to show them) while rows change faster
  // than a reader can follow, while rows are selected, or while the tab is hidden.
  const table = document.querySelector("table#rows[data-live]");
  if (table && window.EventSource) {
    const FAST = 10; // rows changed per second beyond which the list holds
    const status = document.getElementById("live-status");
    let last = Date.now();
    let held = null;
    const shown = () => {
      const out = new Map();
      for (const tr of table.querySelectorAll("tr[data-id]")) {
        const state = tr.querySelector("td[class^=state-]");
        out.set(tr.dataset.id, state ? state.textContent : "");
      }
      return out;
    };
    const changed = (rows) => {
      const before = shown();
      let fresh = 0, moved = 0;
      for (const [id, state] of rows) {
        if (!before.has(id)) fresh += 1;
        else if (before.get(id) !== state) moved += 1;
      }
      return { fresh, moved };
    };
    const selected = () => table.querySelector("input[type=checkbox]:checked") !== null;
    const say = (text, button) => {
      status.textContent = text;
      if (button) {
        const b = document.createElement("button");
        b.type = "button";
        b.id = "show-new";
        b.className = "quiet";
        b.textContent = "show them";
        b.addEventListener("click", () => refresh(true));
        status.append(" ", b);
      }
    };
    const refresh = async (focus) => {
      held = null;
      const before = shown();
      const answer = await fetch(location.href, { headers: { accept: "text/html" } });
      if (!answer.ok) return;
      const page = new DOMParser().parseFromString(await answer.text(), "text/html");
      const fresh = page.querySelector("table#rows");
      if (!fresh) return;
      table.replaceChildren(...fresh.childNodes);
      for (const tr of table.querySelectorAll("tr[data-id]")) {
        if (!before.has(tr.dataset.id)) tr.classList.add("fresh");
      }
      say("live: updated " + new Date().toLocaleTimeString());
      if (focus) table.querySelector("a")?.focus();
    };
    const hold = (reason) => {
      const { fresh, moved } = changed(held);
      const what = fresh ? `${fresh} new row${fresh === 1 ? "" : "s"}` : `${moved} changed`;
      say(`paused (${reason}): ${what},`, true);
    };
    const events = new EventSource(table.dataset.live);
    document.addEventListener("submit", () => events.close());
    events.addEventListener("rows", (e) => {
      const rows = JSON.parse(e.data);
      const { fresh, moved } = changed(rows);
      const now = Date.now();
      const rate = (fresh + moved) / Math.max((now - last) / 1000, 1);
      last = now;
      if (!fresh && !moved) { if (!held) say("live"); return; }
      held = rows;
      if (document.visibilityState === "hidden") hold("tab hidden");
      else if (selected()) hold("rows selected");
      else if (rate > FAST) hold("rows change faster than they can be read");
      else refresh(false);
    });
    document.addEventListener("visibilitychange", () => {
      if (held && document.visibilityState === "visible") hold("while the tab was hidden");
    });
    say("live");
  }
})();
