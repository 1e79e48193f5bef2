/* Explorable figures (docs/_ext/explorables/, its widgets module): show the state the controls select.
 *
 * Each <figure class="explorable"> carries a JSON table of every state, computed by attention_ref when the
 * book was built. This script computes nothing: it reads the controls, joins their values into the state's
 * key, and writes that state's texts, table cells, bar lengths and status line into the figure.
 */
(() => {
  "use strict";

  function setUp(figure) {
    const data = JSON.parse(figure.querySelector("script.ex-data").textContent);
    const controls = name => figure.querySelector(`[data-control="${name}"]`);
    const value = control => (control.type === "checkbox" ? (control.checked ? "1" : "0") : control.value);
    let shown = null;

    function fill(cell, entry) {
      const [text, colour] = entry;
      cell.textContent = text;
      cell.classList.toggle("ex-masked", colour === -1);
      if (colour >= 0) {
        const [background, foreground] = data.palette[colour];
        cell.style.backgroundColor = background;
        cell.style.color = foreground;
      } else {
        cell.style.backgroundColor = "";
        cell.style.color = "";
      }
    }

    function show(announce) {
      const key = data.order.map(name => value(controls(name))).join("|");
      const state = data.states[key];
      if (!state || key === shown) return;
      shown = key;
      for (const slot of figure.querySelectorAll("[data-slot]")) {
        const name = slot.dataset.slot;
        if (name === "status") continue;
        const text = (state.text || {})[name];
        const row = slot.closest("tr, li");
        if (text === undefined) {
          if (row && slot.closest("tbody, ul")) row.hidden = true;
          continue;
        }
        if (row) row.hidden = false;
        slot.textContent = text;
      }
      for (const [name, text] of Object.entries(state.valuetext || {})) {
        controls(name).setAttribute("aria-valuetext", text);
      }
      for (const table of figure.querySelectorAll("[data-grid]")) {
        const grid = state.grids[table.dataset.grid];
        table.querySelectorAll("tbody tr").forEach((tr, i) => {
          tr.hidden = i >= grid.length;
          if (!tr.hidden) tr.querySelectorAll("td").forEach((td, j) => fill(td, grid[i][j]));
        });
      }
      for (const list of figure.querySelectorAll("[data-bars]")) {
        const bars = state.bars[list.dataset.bars];
        list.querySelectorAll("li").forEach((item, i) => {
          const [length, text] = bars[i];
          item.querySelector(".ex-bar").style.width = `${length}%`;
          item.querySelector(".ex-bar-value").textContent = text;
        });
      }
      for (const button of figure.querySelectorAll("[data-set]")) {
        const pressed = value(controls(button.dataset.set)) === button.dataset.value;
        button.setAttribute("aria-pressed", String(pressed));
        button.closest("tr")?.classList.toggle("ex-current", pressed);
      }
      const status = figure.querySelector('[data-slot="status"]');
      if (announce) status.textContent = state.status;
    }

    figure.querySelectorAll("[data-control]").forEach(control => {
      control.addEventListener("input", () => show(true));
      control.addEventListener("change", () => show(true));
    });
    for (const button of figure.querySelectorAll("[data-set]")) {
      const choose = () => {
        controls(button.dataset.set).value = button.dataset.value;
        show(true);
      };
      button.addEventListener("click", choose);
      button.addEventListener("focus", choose);
      button.closest("tr")?.addEventListener("mouseenter", choose);
    }
    figure.classList.add("ex-ready");
    show(false);
  }

  function start() {
    document.querySelectorAll("figure.explorable").forEach(setUp);
  }
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
  else start();
})();
