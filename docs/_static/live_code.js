/* Live code for the attention_ref book (docs/_ext/live_code.py): the "Live code" button in a chapter's header
 * turns its code cells into editable cells run by one Jupyter kernel, over the Jupyter server's REST and
 * WebSocket API. Nothing is fetched before the button is pressed. The kernel comes from the server `make serve`
 * runs beside the book, else from Binder when the build knew the repository, else the page says that no kernel
 * can be had and how to get one. `make serve` writes a one-time link, ORIGIN/#live-key=KEY, into a page only the
 * reader can read (it shows that page's file:// address, never the link, which a browser's command line would
 * show every local user): the key is in the fragment, which the browser sends to no server. This script, on the
 * page the link opens, removes it from the address and trades it (POST _live/session, key in a header) for a
 * session secret kept in sessionStorage, which
 * only pages of this origin (scheme, host and port) can read: no cookie, which a browser would also send to
 * every other port of the host. The kernels are reached through `make serve` itself (_live/api/kernels), with
 * that secret in a header (or, for a WebSocket, which takes no header, as a subprotocol): the page never holds
 * the kernel server's token, and no secret goes in a URL. Without a live session the server answers 403, and
 * the page says how to get in; a tab that brings a link already used (by someone else, then) says so at once,
 * and a tab whose session ended (unused too long, or too old) asks for a new link. A page's kernel is deleted
 * when the page goes away (POST _live/release with
 * keepalive on pagehide). In a page framed by another (which `make serve` forbids: frame-ancestors 'none'),
 * this script reads no key and uses no session.
 * The cells are edited in CodeMirror 6, loaded with the button from the vendored bundle _static/live_editor.js
 * (MIT; built from vendor/live_editor/), coloured by the page's own Pygments classes; if that bundle cannot be
 * loaded, in plain text boxes. This file is the book's own code (BSD-3-Clause, like the rest of the repository). */
(() => {
  "use strict";
  const settings = window.attentionRefLiveCodeConfig || { binder: null };
  const root = new URL(document.documentElement.dataset.content_root || "./", location.href);
  const pageDir = decodeURIComponent(location.pathname).slice(decodeURIComponent(root.pathname).length)
    .split("/").slice(0, -1).join("/");
  const ANSI = /\x1b\[[0-9;?]*[A-Za-z]/g;
  const NO_KERNEL = "No kernel can be had for this copy of the book: it is served without a kernel server, and " +
    "its build did not know the book's repository (so Binder cannot be used). To run the code, serve the book " +
    "with `make serve` from a clone of the repository, or download this page's notebook (.ipynb) from the " +
    "download menu and open it in Jupyter.";

  const NEW_LINK = "Press Enter in the terminal of `make serve` for a new link, and open the file:// address it " +
    "shows (Ctrl+click it, or paste it into this tab's address bar); each link works once, for a few minutes.";
  const NOT_LET_IN = "This copy of the book is served by `make serve`, which runs code only in a browser tab " +
    "that opened the page whose file:// address it shows in its terminal, and its session lasts until it is " +
    `left unused for a while. To use Live code here: ${NEW_LINK} The book reads normally without it.`;
  const REFUSED = {
    used: "Live code: this link was already used: if not by you, stop `make serve` (Ctrl-C in its terminal), " +
      "since whoever used it can run code as you until then. To get a new link: " + NEW_LINK,
    expired: `Live code: this link has expired. ${NEW_LINK}`,
  };
  const ENDED = {
    idle: `Live code: this tab's session with \`make serve\` ended, unused for too long. ${NEW_LINK}`,
    lifetime: "Live code: this tab's session with `make serve` ended: it reached the longest life a session " +
      `has. ${NEW_LINK}`,
  };
  const FRAMED = "Live code does not run in a page shown inside another page. Open the book in a tab of its own.";
  const SESSION = "attentionRefLiveSession"; // sessionStorage key: this tab's session with `make serve`
  const SUBPROTOCOL = "attention-ref-live"; // the kernel WebSocket's subprotocol at `make serve`
  // Inside a frame a page may be another site's bait (clickjacking): no key is read and no session used there.
  const framed = (() => { try { return window.top !== window.self; } catch (error) { return true; } })();
  const session = () => {
    if (framed) return null;
    try { return sessionStorage.getItem(SESSION); } catch (error) { return null; }
  };
  const REFUSAL = "attentionRefLiveRefusal"; // sessionStorage key: why this tab's last link was refused
  const refusal = () => {
    try { return REFUSED[sessionStorage.getItem(REFUSAL)] || null; } catch (error) { return null; }
  };

  // An error the status line shows; a `complete` one is a whole explanation, shown without "Live code failed:".
  class LiveError extends Error {
    constructor(message, complete = false) {
      super(message);
      this.complete = complete;
    }
  }

  const uuid = () => (crypto.randomUUID ? crypto.randomUUID()
    : "xxxxxxxx-xxxx-4xxx-8xxx-xxxxxxxxxxxx".replace(/x/g, () => ((Math.random() * 16) | 0).toString(16)));
  const joinPath = (...parts) => parts.filter(Boolean).map((p) => p.replace(/^\/+|\/+$/g, "")).join("/");

  function element(tag, attributes = {}, text) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  // -- The editor ---------------------------------------------------------------------------------------------

  // CodeMirror from the vendored bundle: createEditor(parent, source, label, run) -> {value, focus()}.
  function loadEditor() {
    if (window.attentionRefEditor) return Promise.resolve(window.attentionRefEditor.createEditor);
    return new Promise((resolve, reject) => {
      const script = element("script", { src: new URL("_static/live_editor.js", root).href });
      script.onload = () => resolve(window.attentionRefEditor.createEditor);
      script.onerror = () => reject(new Error("_static/live_editor.js could not be loaded"));
      document.head.append(script);
    });
  }

  // The stand-in when the bundle cannot be loaded: a plain text box with the same interface.
  function plainEditor(parent, source, label, run) {
    const editor = element("textarea", {
      class: "live-code-plain", spellcheck: "false", autocapitalize: "off", autocomplete: "off",
      "aria-label": label, rows: String(Math.max(1, source.split("\n").length)),
    });
    editor.value = source;
    editor.addEventListener("input", () => { editor.rows = Math.max(1, editor.value.split("\n").length); });
    editor.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && (event.shiftKey || event.ctrlKey)) {
        event.preventDefault();
        run();
      }
    });
    parent.append(editor);
    return {
      get value() { return editor.value; },
      set value(text) { editor.value = text; },
      focus() { editor.focus(); },
    };
  }

  // -- Where the kernel comes from ----------------------------------------------------------------------------

  // A link of `make serve` opened in this tab: its key, out of the address, traded for a session.
  async function letIn() {
    if (framed) return false;
    const found = /^#live-key=([\w-]{1,128})$/.exec(location.hash);
    if (!found) return false;
    history.replaceState(history.state, "", location.pathname + location.search);
    try {
      const response = await fetch(new URL("_live/session", root), {
        method: "POST", cache: "no-store", headers: { "X-Live-Key": found[1] },
      });
      if (!response.ok) {
        const why = (await response.json().catch(() => ({}))).link;
        if (REFUSED[why]) {
          sessionStorage.setItem(REFUSAL, why); // said again by the Live code button of this tab's pages
          warn(REFUSED[why]); // a link used by someone else is said at once, not only when Live code is pressed
        }
        return false;
      }
      sessionStorage.setItem(SESSION, (await response.json()).session);
      sessionStorage.removeItem(REFUSAL);
      return true;
    } catch (error) {
      return false;
    }
  }

  // A notice at the top of the page, for what the reader must know before pressing Live code.
  function warn(text) {
    const article = document.querySelector("article.bd-article") || document.querySelector("main") || document.body;
    article.prepend(element("p", { class: "live-code-notice", role: "alert" }, text));
  }

  // Why the server refused this tab's session (403): it ended, or this tab never had one.
  async function refusedBecause(response) {
    const found = await response.json().catch(() => ({}));
    return ENDED[found.ended] || refusal() || NOT_LET_IN;
  }

  async function localServer() {
    if (framed) throw new LiveError(FRAMED, true);
    let response;
    const secret = session();
    try {
      response = await fetch(new URL("_live/config.json", root), {
        cache: "no-store", headers: secret ? { "X-Live-Session": secret } : {},
      });
    } catch (error) {
      return null;
    }
    if (response.status === 403) throw new LiveError(await refusedBecause(response), true);
    if (!response.ok) return null;
    const found = await response.json();
    return { where: "this machine", baseUrl: new URL(found.base_url, location.href).href, local: true,
             headers: { "X-Live-Session": secret }, protocols: [SUBPROTOCOL, `live-session.${secret}`] };
  }

  // The page's kernel is deleted when the page goes away: a same-origin request the browser still sends.
  function release(kernel) {
    const secret = session();
    if (!kernel || !kernel.id || !kernel.server.local || !secret) return;
    fetch(new URL("_live/release", root), {
      method: "POST", keepalive: true, cache: "no-store",
      headers: { "X-Live-Session": secret, "Content-Type": "application/json" },
      body: JSON.stringify({ kernel: kernel.id }),
    }).catch(() => null);
  }

  function binderServer(binder, report) {
    return new Promise((resolve, reject) => {
      report("connecting", "Live code: asking Binder for a kernel (a first start can take several minutes)…");
      const events = new EventSource(`${binder.url}/build/${binder.spec}`);
      events.onmessage = (event) => {
        const message = JSON.parse(event.data);
        if (message.phase === "ready") {
          events.close();
          resolve({ where: "Binder", baseUrl: message.url, token: message.token,
                    headers: { Authorization: `token ${message.token}` },
                    path: joinPath(binder.path_to_docs, pageDir) });
        } else if (message.phase === "failed") {
          events.close();
          reject(new LiveError(`Binder could not start the book's repository: ${message.message || "no reason given"}`));
        } else if (message.phase) {
          report("connecting", `Live code: Binder is ${message.phase === "built" ? "starting" : message.phase}…`);
        }
      };
      events.onerror = () => {
        events.close();
        reject(new LiveError(`Binder (${binder.url}) could not be reached, so no kernel can be had.`));
      };
    });
  }

  // -- One kernel, over the Jupyter server's API ----------------------------------------------------------------

  class Kernel {
    constructor(server, onState) {
      this.server = server;
      this.onState = onState;
      this.session = uuid();
      this.running = new Map(); // msg_id -> {output handlers, resolve}
      this.closing = false;
    }

    async request(method, path, body) {
      const response = await fetch(new URL(path, this.server.baseUrl), {
        method,
        headers: { ...this.server.headers, "Content-Type": "application/json" }, cache: "no-store",
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      if (response.status === 403 && this.server.local) throw new LiveError(await refusedBecause(response), true);
      if (!response.ok) {
        const reason = await response.json().then((found) => found.message, () => null);
        if (reason && reason.startsWith("Live code:")) throw new LiveError(reason, true); // e.g. the kernel cap
        throw new LiveError(`the kernel server refused ${method} ${path} (${response.status})`);
      }
      return response.status === 204 ? null : response.json();
    }

    async start() {
      // `make serve` chooses the working folder itself; Binder's is the page's folder in the repository.
      const model = await this.request("POST", "api/kernels",
        this.server.path === undefined ? { name: "python3" } : { name: "python3", path: this.server.path });
      this.id = model.id;
      const url = new URL(`api/kernels/${this.id}/channels`, this.server.baseUrl);
      url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
      url.searchParams.set("session_id", this.session);
      if (this.server.token) url.searchParams.set("token", this.server.token); // Binder's server only
      this.socket = new WebSocket(url, this.server.protocols || []);
      this.socket.onmessage = (event) => this.receive(JSON.parse(event.data));
      await new Promise((resolve, reject) => {
        this.socket.onopen = resolve;
        this.socket.onerror = () => reject(new LiveError("the kernel's WebSocket could not be opened"));
      });
      this.socket.onclose = async () => {
        if (this.closing) return;
        this.onState("failed", "Live code: the connection to the kernel was lost. Restart the kernel to try again.");
        if (!this.server.local) return;
        try {
          await localServer(); // a session that ended says so (the server closed its WebSockets)
        } catch (error) {
          if (error instanceof LiveError) this.onState("failed", error.message);
        }
      };
      await this.info();
    }

    send(channel, msgType, content) {
      const id = uuid();
      this.socket.send(JSON.stringify({
        header: { msg_id: id, msg_type: msgType, session: this.session, username: "", date: new Date().toISOString(), version: "5.3" },
        parent_header: {}, metadata: {}, content, channel, buffers: [],
      }));
      return id;
    }

    info() {
      return new Promise((resolve) => {
        const id = this.send("shell", "kernel_info_request", {});
        this.running.set(id, { output() {}, resolve, reply: true });
      });
    }

    execute(code, output) {
      return new Promise((resolve) => {
        const id = this.send("shell", "execute_request", {
          code, silent: false, store_history: true, user_expressions: {}, allow_stdin: false, stop_on_error: true,
        });
        this.running.set(id, { output, resolve });
      });
    }

    receive(message) {
      const type = message.header.msg_type;
      const parent = message.parent_header && message.parent_header.msg_id;
      const job = this.running.get(parent);
      if (type === "status") {
        const state = message.content.execution_state;
        if (state === "dead") this.onState("failed", "Live code: the kernel died. Restart it to go on.");
        else if (state === "busy" && job && !job.reply) this.onState("busy", "Live code: busy, running a cell…");
        else if (state === "idle" && job && !job.reply) {
          this.running.delete(parent);
          job.resolve();
          if (![...this.running.values()].some((j) => !j.reply)) this.onState("ready", "Live code: ready.");
        }
      } else if (type === "kernel_info_reply" && job) {
        this.running.delete(parent);
        job.resolve(message.content);
      } else if (job) {
        job.output(type, message.content);
      }
    }

    async restart() {
      for (const job of this.running.values()) {
        if (!job.reply) job.output("restarted", {});
        job.resolve();
      }
      this.running.clear();
      await this.request("POST", `api/kernels/${this.id}/restart`);
      await this.info();
    }
  }

  // -- The page -----------------------------------------------------------------------------------------------

  class LiveCode {
    constructor(button) {
      this.button = button;
      this.article = document.querySelector("article.bd-article") || document.querySelector("main") || document.body;
      this.cells = [];
      this.kernel = null;
      this.on = true;
      this.panel = this.makePanel();
      this.cellsReady = loadEditor().then((create) => this.makeCells(create), (error) => {
        this.hint.textContent += ` (Plain text boxes: the code editor could not be loaded: ${error.message}.)`;
        this.makeCells(plainEditor);
      });
      this.kernelReady = this.connect();
      this.kernelReady.catch(() => null); // the reason is in the status line
    }

    makePanel() {
      const panel = element("div", { class: "live-code-panel", role: "region", "aria-label": "Live code" });
      this.status = element("p", { class: "live-code-status", role: "status", "data-state": "connecting" },
        "Live code: connecting to a kernel…");
      const actions = element("div", { class: "live-code-actions" });
      this.runAllButton = element("button", { type: "button", class: "live-code-button" }, "Run all");
      this.restartButton = element("button", { type: "button", class: "live-code-button" }, "Restart kernel");
      this.runAllButton.addEventListener("click", () => this.runAll());
      this.restartButton.addEventListener("click", () => this.restart());
      actions.append(this.runAllButton, this.restartButton);
      const hint = this.hint = element("p", { class: "live-code-hint" },
        "Edit any code cell and press its Run button (or Shift+Enter in the cell). The cells share one kernel: " +
        "run them from the top, as in a notebook.");
      panel.append(this.status, actions, hint);
      this.article.prepend(panel);
      // The panel sticks just below the theme's sticky header (its height changes with the window's width).
      const header = document.querySelector(".bd-header-article");
      const below = () => {
        const sticky = header && ["sticky", "fixed"].includes(getComputedStyle(header).position);
        panel.style.top = `${(sticky ? header.getBoundingClientRect().height : 0) + 8}px`;
      };
      below();
      if (header && window.ResizeObserver) new ResizeObserver(below).observe(header);
      return panel;
    }

    makeCells(createEditor) {
      let number = 0;
      for (const cell of this.article.querySelectorAll("div.cell")) {
        const pre = cell.querySelector(".cell_input pre");
        if (!pre) continue;
        number += 1;
        const input = pre.closest(".cell_input");
        const source = pre.textContent.replace(/\n$/, "");
        const box = element("div", { class: "live-code-cell" });
        // Inside a `.highlight` box the page's Pygments colours apply to the editor's tokens, as to the page's.
        const frame = element("div", { class: "live-code-editor highlight" });
        const entry = { cell, input, box, number, staticOutputs: [...cell.querySelectorAll(".cell_output")] };
        entry.editor = box.liveEditor = createEditor(frame, source, `Code cell ${number}`, () => this.runCell(entry));
        const bar = element("div", { class: "live-code-bar" });
        const run = element("button", { type: "button", class: "live-code-button live-code-run" }, "Run");
        const count = element("span", { class: "live-code-count" }, "");
        bar.append(run, count);
        const output = element("div", { class: "live-code-output", "aria-live": "polite", "aria-label": `Output of code cell ${number}`, role: "region" });
        output.hidden = true;
        box.append(frame, bar, output);
        input.after(box); // inside a folded cell (hide-input, hide-cell) the editor stays folded with it
        Object.assign(entry, { run, count, output });
        run.addEventListener("click", () => this.runCell(entry));
        this.cells.push(entry);
      }
      this.show(this.on);
    }

    show(on) {
      this.on = on;
      this.button.setAttribute("aria-pressed", String(on));
      this.panel.hidden = !on;
      for (const entry of this.cells) {
        entry.input.hidden = on;
        entry.box.hidden = !on;
        for (const out of entry.staticOutputs) out.hidden = on && entry.ran;
      }
    }

    state(name, text) {
      this.status.dataset.state = name;
      this.status.textContent = text;
    }

    async connect() {
      const report = (name, text) => this.state(name, text);
      try {
        const server = (await localServer()) || (settings.binder ? await binderServer(settings.binder, report) : null);
        if (!server) throw new LiveError(NO_KERNEL, true);
        this.state("connecting", `Live code: starting a kernel on ${server.where}…`);
        this.kernel = new Kernel(server, report);
        await this.kernel.start();
        this.state("ready", `Live code: ready (a Python kernel on ${server.where}).`);
        return this.kernel;
      } catch (error) {
        const complete = error instanceof LiveError && error.complete;
        this.state("failed", complete ? error.message : `Live code failed: ${error.message || error}`);
        throw error;
      }
    }

    async runCell(entry) {
      entry.ran = true;
      for (const out of entry.staticOutputs) out.hidden = true;
      entry.output.hidden = false;
      entry.output.replaceChildren();
      const run = Number(entry.box.dataset.runs || 0) + 1; // this press; a later press supersedes it
      entry.box.dataset.runs = String(run); // presses of Run, for the tests
      const current = () => Number(entry.box.dataset.runs) === run;
      entry.box.dataset.state = "queued";
      entry.count.textContent = "queued";
      entry.drawing = [];
      let kernel;
      try {
        kernel = await this.kernelReady;
      } catch (error) {
        entry.box.dataset.state = "failed";
        entry.count.textContent = "";
        entry.output.append(element("pre", { class: "live-code-error" }, this.status.textContent));
        return;
      }
      if (!current()) return; // pressed again while waiting for the kernel: the later run reports
      entry.box.dataset.state = "running";
      entry.count.textContent = "running…";
      let stream = null;
      await kernel.execute(entry.editor.value, (type, content) => {
        if (!current()) return; // a later run of this cell cleared the output: this one's output is not shown
        if (type === "stream") {
          if (!stream || stream.dataset.name !== content.name) {
            stream = element("pre", { class: `live-code-stream live-code-${content.name}`, "data-name": content.name }, "");
            entry.output.append(stream);
          }
          stream.textContent += content.text;
          return;
        }
        stream = null;
        if (type === "execute_result" || type === "display_data") this.showData(entry, content.data || {});
        else if (type === "error") {
          const text = (content.traceback || []).join("\n").replace(ANSI, "") || `${content.ename}: ${content.evalue}`;
          entry.output.append(element("pre", { class: "live-code-error" }, text));
        } else if (type === "clear_output") entry.output.replaceChildren();
        else if (type === "restarted") entry.output.append(element("pre", { class: "live-code-error" }, "Stopped: the kernel was restarted."));
        if (type === "execute_input") entry.count.textContent = `run ${content.execution_count}`;
      });
      await Promise.all(entry.drawing); // "done" once the figures are decoded (their size known), not before
      if (current()) entry.box.dataset.state = "done";
    }

    showData(entry, data) {
      const figure = (src) => {
        const img = element("img", { class: "live-code-figure", src, alt: `Figure drawn by code cell ${entry.number}` });
        entry.output.append(img);
        entry.drawing.push(img.decode().catch(() => null)); // a figure that cannot be decoded shows its alt text
      };
      if (data["image/png"]) figure(`data:image/png;base64,${data["image/png"]}`);
      else if (data["image/svg+xml"]) figure(`data:image/svg+xml,${encodeURIComponent([].concat(data["image/svg+xml"]).join(""))}`);
      else if (data["text/plain"] !== undefined) {
        entry.output.append(element("pre", { class: "live-code-result" }, [].concat(data["text/plain"]).join("")));
      }
    }

    async runAll() {
      for (const entry of this.cells) {
        await this.runCell(entry);
        if (entry.box.dataset.state !== "done" || entry.output.querySelector(".live-code-error")) break;
      }
    }

    async restart() {
      let kernel;
      try {
        kernel = await this.kernelReady;
      } catch (error) {
        this.kernelReady = this.connect(); // try again from the start: the reason shows in the status line
        this.kernelReady.catch(() => null);
        return;
      }
      this.state("connecting", "Live code: restarting the kernel…");
      try {
        await kernel.restart();
        this.state("ready", "Live code: ready (kernel restarted: run the cells again from the top).");
      } catch (error) {
        this.state("failed", `Live code failed: ${error.message || error}`);
      }
    }
  }

  let live = null;
  const admitted = letIn();
  window.addEventListener("pagehide", () => { if (live) release(live.kernel); });
  window.attentionRefLiveCode = {
    admitted, // resolves to whether this page traded a link's key for a session
    get kernelId() { return live && live.kernel ? live.kernel.id || null : null; },
    toggle(button) {
      if (!live) live = new LiveCode(button);
      else live.show(!live.on);
      if (live.on) live.status.scrollIntoView({ block: "nearest" });
    },
    get state() { return live ? live.status.dataset.state : "off"; },
  };
})();
