"use strict";
// The dashboard. Every value reaches the page through textContent or a DOM property, never
// through HTML parsing, so an error message with markup in it shows as text.
(() => {
  const SHORT = 90;
  const token = document.querySelector('meta[name="synclane-token"]').getAttribute("content");
  const expanded = new Set();
  const reasons = new Map(); // what was typed into each queue's pause box, kept across renders
  const views = {
    accounts: { search: "", page: 0 },
    lanes: { search: "", page: 0 },
    workers: { page: 0 },
    failures: { search: "" },
    jobs: { view: "", queue: "", owner: "", lane: "", cause_id: "", before: null },
  };
  let state = null; // the answer of api/state, shared by every viewer
  let shown = {}; // what each section shows: from the state, or from its own query
  let lastEvent = 0;
  let eventsEnabled = false;
  let online = true;
  let lastAnswer = null;
  let timer = null;
  let noticeTimer = null;
  let busy = false;

  function h(tag, props, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(props || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "data") for (const [k, v] of Object.entries(value)) node.dataset[k] = v;
      else if (key === "onclick") node.addEventListener("click", value);
      else node[key] = value;
    }
    for (const child of children) {
      if (child === null || child === undefined) continue;
      node.append(child instanceof Node ? child : String(child));
    }
    return node;
  }

  const dash = "—";
  const utc = (iso) => (iso ? iso.slice(0, 19).replace("T", " ") + " UTC" : "");
  const clock = (date) => date.toISOString().slice(11, 19) + " UTC";

  function relative(iso) {
    let seconds = Math.round((Date.parse(iso) - Date.parse(state.now)) / 1000);
    const future = seconds > 0;
    seconds = Math.abs(seconds);
    let text;
    if (seconds < 60) text = seconds + "s";
    else if (seconds < 3600) text = Math.floor(seconds / 60) + "m";
    else if (seconds < 86400)
      text = Math.floor(seconds / 3600) + "h " + Math.floor((seconds % 3600) / 60) + "m";
    else text = Math.floor(seconds / 86400) + "d";
    return future ? "in " + text : text + " ago";
  }

  // A time shown relative to the server's clock; refreshed in place on every poll. A due time
  // that has passed reads "due".
  const timeText = (span) =>
    span.dataset.due && Date.parse(span.dataset.iso) <= Date.parse(state.now)
      ? "due"
      : relative(span.dataset.iso);

  function when(iso, due) {
    if (!iso) return dash;
    const span = h("span", { class: "when", title: utc(iso), data: { iso } });
    if (due) span.dataset.due = "1";
    span.textContent = timeText(span);
    return span;
  }

  function day(iso) {
    if (!iso) return "…";
    return iso.slice(11, 19) === "00:00:00" ? iso.slice(0, 10) : iso.slice(0, 16).replace("T", " ");
  }
  // A window breaks after its arrow when the table is short of room, never inside a time.
  const windowText = (start, end) =>
    start || end
      ? h("span", null, h("span", { class: "nowrap" }, day(start) + " →"), " ",
          h("span", { class: "nowrap" }, day(end)))
      : dash;

  // A period in seconds as its largest whole unit: 1s, 90s, 1m, 1h, 1d.
  function period(seconds) {
    for (const [unit, size] of [["d", 86400], ["h", 3600], ["m", 60]]) {
      if (seconds >= size && seconds % size === 0) return seconds / size + unit;
    }
    return seconds + "s";
  }
  const rateText = (l) =>
    l.rate_count === null ? dash : l.rate_count + " / " + period(l.rate_period) + ", " +
      l.rate_left + " left";

  // Long text: the start in the table, everything on hover and when expanded.
  function longText(key, text) {
    if (!text) return "";
    const firstLine = text.split("\n")[0];
    if (text.length <= SHORT && firstLine === text) return h("span", { title: text }, text);
    const details = h(
      "details",
      { class: "long", title: text },
      h("summary", null, firstLine.slice(0, SHORT) + "…"),
      h("pre", null, text),
    );
    details.open = expanded.has(key);
    details.addEventListener("toggle", () => {
      if (details.open) expanded.add(key);
      else expanded.delete(key);
    });
    return details;
  }

  const cell = (content, cls) => h("td", { class: cls }, content === "" ? "" : content ?? dash);
  const badge = (status) => h("span", { class: "badge s-" + status }, status);
  const declared = (queue) => state.queues.includes(queue);

  function requeueButton(label, body, data) {
    const button = h("button", { type: "button", class: "requeue", data }, label);
    button.disabled = !online;
    button.addEventListener("click", () => requeue([body], button));
    return button;
  }

  // A link that narrows the jobs table to an account, a lane or a cause.
  function filterLink(text, filter) {
    const link = h("a", { class: "filter", title: "show its jobs", tabIndex: 0 }, text);
    link.addEventListener("click", () => {
      Object.assign(views.jobs, { queue: "", owner: "", lane: "", cause_id: "", before: null });
      Object.assign(views.jobs, filter);
      document.getElementById("jobs").scrollIntoView();
      refresh();
    });
    return link;
  }

  // Rows are kept when their data did not change, so a button under the pointer stays put.
  function sync(section, items, key, build) {
    const tbody = document.querySelector("#" + section + " tbody");
    const empty = document.querySelector("#" + section + " .empty");
    if (empty) empty.hidden = items.length > 0;
    const old = new Map();
    for (const row of tbody.children) old.set(row.dataset.key, row);
    const rows = items.map((item) => {
      const k = key(item);
      const signature = JSON.stringify(item);
      const previous = old.get(k);
      if (previous && previous.signature === signature) return previous;
      const row = build(item);
      row.dataset.key = k;
      row.signature = signature;
      return row;
    });
    const same =
      rows.length === tbody.children.length && rows.every((row, i) => row === tbody.children[i]);
    if (!same) tbody.replaceChildren(...rows);
  }

  function pager(section, part, view) {
    const node = document.querySelector("#" + section + " .pager");
    const first = part.page * part.page_size;
    node.querySelector(".count").textContent = part.total
      ? first + 1 + "–" + (first + part.rows.length) + " of " + part.total
      : "";
    node.querySelector(".prev").disabled = part.page === 0;
    node.querySelector(".next").disabled = first + part.rows.length >= part.total;
    node.querySelector(".prev").onclick = () => {
      view.page = Math.max(0, view.page - 1);
      refresh();
    };
    node.querySelector(".next").onclick = () => {
      view.page += 1;
      refresh();
    };
  }

  function renderSummary() {
    const statuses = ["running", "pending", "failed", "deferred", "abandoned"];
    sync("summary", state.summary.queues, (q) => q.queue, (q) =>
      h(
        "tr",
        { data: { queue: q.queue } },
        cell(q.pause ? h("span", null, q.queue + " ", badge("paused")) : q.queue),
        ...statuses.map((status) => {
          const found = q.statuses[status];
          if (!found) return cell("0", "num");
          const owners = found.owners === 1 ? "1 account" : found.owners + " accounts";
          return cell(found.jobs + " (" + owners + ")", "num s-" + status);
        }),
      ),
    );
    const size = state.summary.table_rows;
    document.getElementById("table-size").textContent = size.counted
      ? "The table holds " + size.rows.toLocaleString("en") + (size.rows === 1 ? " job" : " jobs") +
        " in all."
      : "The table holds about " + size.rows.toLocaleString("en") +
        " jobs in all (PostgreSQL's estimate).";
  }

  // A paused queue: since when, by whom, why, and Resume; one that takes jobs: a box for the
  // reason (required) and Pause.
  function renderQueues() {
    const items = state.summary.queues.map((q) => ({
      queue: q.queue,
      pause: q.pause,
      declared: declared(q.queue),
    }));
    sync("queues", items, (q) => q.queue, (q) => {
      const p = q.pause;
      return h(
        "tr",
        { data: { queue: q.queue, state: p ? "paused" : "taking" } },
        cell(q.queue),
        h("td", { class: "state" }, p ? badge("paused") : h("span", { class: "idle" }, "taking jobs")),
        cell(p ? when(p.paused_at) : ""),
        cell(p ? p.paused_by : "", "by"),
        cell(p ? longText("pause\u0000" + q.queue, p.reason) : "", "text why"),
        cell(q.declared ? (p ? resumeButton(q.queue) : pauseBox(q.queue)) : "", "action"),
      );
    });
  }

  function resumeButton(queue) {
    const button = h("button", { type: "button", class: "control resume" }, "Resume");
    button.disabled = !online;
    button.addEventListener("click", () =>
      act(button, "resume", async () =>
        (await post("api/resume", { queue })).resumed
          ? "queue " + queue + " resumed"
          : "queue " + queue + " was not paused",
      ),
    );
    return button;
  }

  function pauseBox(queue) {
    const input = h("input", {
      type: "text",
      class: "reason",
      placeholder: "why? (required)",
      maxLength: 1000, // app.pause keeps a reason of up to 1,000 characters
      autocomplete: "off",
      required: true,
      value: reasons.get(queue) || "",
    });
    input.setAttribute("aria-label", "why pause " + queue);
    const button = h("button", { type: "button", class: "control pause" }, "Pause");
    button.ready = () => input.value.trim() !== ""; // a reason is required
    button.disabled = !online || !button.ready();
    input.addEventListener("input", () => {
      reasons.set(queue, input.value);
      button.disabled = !online || !button.ready();
    });
    input.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !button.disabled) button.click();
    });
    button.addEventListener("click", () =>
      act(button, "pause", async () => {
        const paused = (await post("api/pause", { queue, reason: input.value.trim() })).paused;
        reasons.delete(queue);
        return "queue " + queue + " paused by " + paused.paused_by;
      }),
    );
    return h("span", null, input, " ", button);
  }

  function accountWhy(a) {
    const parts = [];
    if (a.abandoned) parts.push(a.abandoned + " abandoned");
    if (a.deferred) parts.push(a.deferred + " deferred");
    if (a.failing) parts.push(a.failing + " failed");
    const box = h("span", null, parts.join(", "));
    if (a.paused_until) box.append(parts.length ? "; " : "", "waits until ", when(a.paused_until));
    if (a.newest_error) {
      box.append(parts.length || a.paused_until ? ": " : "");
      box.append(longText("account\u0000" + a.queue + a.owner + a.type, a.newest_error));
    }
    if (!parts.length && !a.paused_until && a.history_since)
      box.append("first load waiting since ", when(a.history_since));
    return box;
  }

  function renderAccounts() {
    const part = shown.accounts;
    pager("accounts", part, views.accounts);
    const items = part.rows.map((a, i) => ({
      ...a,
      first: i === 0 || part.rows[i - 1].owner !== a.owner,
    }));
    sync("accounts", items, (a) => [a.queue, a.owner, a.type].join("\u0000"), (a) => {
      const bar = h("progress", { max: Math.max(a.slices_total, 1), value: a.slices_completed });
      const stuck = a.abandoned + a.deferred > 0 && declared(a.queue);
      return h(
        "tr",
        { class: a.first ? "first" : "", data: { owner: a.owner, state: a.state || "" } },
        cell(a.first ? h("strong", null, filterLink(a.owner, { owner: a.owner })) : ""),
        cell(a.queue),
        cell(a.type),
        h("td", { class: "state" }, a.state ? badge(a.state) : dash),
        cell(a.slices_total ? a.slices_completed + " / " + a.slices_total : dash),
        cell(h("span", null, bar, a.percent === null ? "" : " " + a.percent + "%")),
        cell(a.slices_failed, "num"),
        cell(a.records, "num"),
        cell(a.loaded_from ? windowText(a.loaded_from, a.loaded_to) : dash, "window"),
        cell(accountWhy(a), "text"),
        cell(
          stuck
            ? requeueButton("Requeue", { queue: a.queue, owner: a.owner, type: a.type }, {
                owner: a.owner,
              })
            : "",
          "action",
        ),
      );
    });
  }

  function renderLanes() {
    const part = shown.lanes;
    pager("lanes", part, views.lanes);
    sync("lanes", part.rows, (l) => l.queue + "\u0000" + l.lane, (l) =>
      h(
        "tr",
        { data: { lane: l.lane, queue: l.queue } },
        cell(l.queue),
        cell(filterLink(l.lane, { lane: l.lane })),
        l.job_id === null
          ? cell(h("span", { class: "idle" }, l.paused_until ? "throttled" : "idle"))
          : cell("#" + l.job_id + " " + l.type + " for " + l.owner),
        cell(l.job_id === null ? "" : windowText(l.window_start, l.window_end), "window"),
        cell(l.cursor),
        cell(l.processed_count, "num"),
        cell(l.leased_by),
        cell(when(l.since)),
        cell(when(l.lease_expires_at)),
        cell(l.waiting, "num"),
        cell(l.paused_until ? h("span", null, "paused until ", when(l.paused_until)) : when(l.next_due, true)),
        cell(rateText(l), "rate"),
      ),
    );
  }

  function renderWorkers() {
    const part = shown.workers;
    pager("workers", part, views.workers);
    sync("workers", part.rows, (w) => w.name, (w) =>
      h(
        "tr",
        { data: { worker: w.name, state: w.state } },
        cell(w.name),
        h("td", { class: "state" }, badge(w.state)),
        cell(w.host),
        cell(w.pid, "num"),
        cell(w.version),
        cell(w.queues.join(", ")),
        cell(w.busy, "num busy"),
        cell(w.slots, "num"),
        cell(when(w.started_at)),
        cell(when(w.last_seen_at)),
      ),
    );
  }

  function renderFailures() {
    const part = shown.failures;
    const stopped = part.rows.filter((f) => declared(f.queue));
    document.getElementById("requeue-all").disabled = !online || stopped.length === 0;
    document.querySelector("#failures .filters .count").textContent =
      part.total > part.rows.length ? part.rows.length + " of " + part.total + " causes" : "";
    sync("failures", part.rows, (f) => [f.queue, f.type, f.cause].join("\u0000"), (f) => {
      const key = "cause\u0000" + f.queue + "\u0000" + f.type + "\u0000" + f.cause;
      const owners = f.owners.join(", ") + (f.owner_count > f.owners.length ? ", …" : "");
      const counts = [];
      if (f.failed) counts.push(f.failed + " failed");
      if (f.deferred) counts.push(f.deferred + " deferred");
      if (f.abandoned) counts.push(f.abandoned + " abandoned");
      const human = f.waiting_for_a_human > 0 && declared(f.queue);
      return h(
        "tr",
        { data: { cause: f.cause, causeId: f.cause_id } },
        cell(
          h(
            "span",
            null,
            longText(key, f.cause),
            h("br"),
            h("span", { class: "cause-id", title: "the cause's id: requeue --cause-id" }, "id "),
            filterLink(f.cause_id, { cause_id: f.cause_id }),
          ),
          "text",
        ),
        cell(longText(key + "\u0000example", f.example), "text"),
        cell(f.queue),
        cell(f.type),
        cell(f.jobs + (counts.length ? " (" + counts.join(", ") + ")" : ""), "num"),
        cell(owners, "text"),
        cell(h("span", null, ...f.statuses.map(badge))),
        cell(when(f.first_seen)),
        cell(when(f.last_seen)),
        cell(
          human
            ? requeueButton("Requeue", { queue: f.queue, type: f.type, cause_id: f.cause_id }, {
                cause: f.cause,
              })
            : f.next_retry
              ? h("span", { class: "label" }, "retries by itself ", when(f.next_retry, true))
              : "",
          "action",
        ),
      );
    });
  }

  // An error where it is current: a stopped job's own; a running or pending job's is the one
  // its previous attempt left, labelled so; a completed job shows none.
  function errorCell(j) {
    const td = h("td", { class: "error text" });
    if (!j.error || j.status === "completed") return td;
    const text = longText("job\u0000" + j.id, j.error);
    if (j.status === "running" || j.status === "pending") {
      td.append(h("span", { class: "label" }, "previous attempt: "), h("span", { class: "previous" }, text));
    } else {
      td.append(text);
    }
    return td;
  }

  function renderJobs() {
    const part = shown.jobs;
    const view = views.jobs;
    const filter = view.owner
      ? "account " + view.owner
      : view.lane
        ? "lane " + view.lane
        : view.cause_id
          ? "cause " + view.cause_id
          : "";
    document.getElementById("job-filter").hidden = !filter;
    document.getElementById("job-filter-text").textContent = filter ? "only " + filter + " " : "";
    document.getElementById("jobs-count").textContent = part.default
      ? part.rows.length + " shown: every running or stopped job however old (older ones with " +
        "older →), and the newest"
      : part.rows.length + " shown, newest first";
    document.getElementById("jobs-older").hidden = part.next_before === null;
    document.getElementById("jobs-newest").hidden = view.before === null;
    sync("jobs", part.rows, (j) => String(j.id), (j) =>
      h(
        "tr",
        { data: { jobId: j.id, status: j.status } },
        cell("#" + j.id),
        h("td", { class: "status" }, badge(j.status)),
        cell(filterLink(j.owner, { owner: j.owner })),
        cell(j.lane),
        cell(j.type + (j.mode === "initial" ? "" : " (" + j.mode + ")")),
        cell(windowText(j.window_start, j.window_end), "window"),
        cell(j.cursor),
        cell(j.processed_count, "num"),
        cell(j.attempt_count + (j.throttle_count ? " +" + j.throttle_count + " throttled" : "")),
        // the server sends a next run only for a job that waits to be taken
        cell(j.next_run_at ? when(j.next_run_at, true) : "", "next-run"),
        errorCell(j),
        cell(
          j.offer_requeue && declared(j.queue)
            ? requeueButton("Requeue", { queue: j.queue, job: j.id }, { jobId: j.id })
            : "",
          "action",
        ),
      ),
    );
  }

  function renderEvents(found) {
    const section = document.getElementById("events");
    section.hidden = !eventsEnabled;
    if (!eventsEnabled) return;
    const list = document.getElementById("event-lines");
    const lines = found.map((e) =>
      h(
        "li",
        { data: { kind: e.kind, number: e.number } },
        h("time", { title: utc(e.at), dateTime: e.at }, e.at.slice(11, 19)),
        e.line,
      ),
    );
    list.prepend(...lines);
    while (list.children.length > 200) list.lastElementChild.remove();
    section.querySelector(".empty").hidden = list.children.length > 0;
  }

  function render() {
    const queues = state.queues.length ? state.queues.join(", ") : "none declared";
    document.getElementById("meta").textContent =
      "schema " + state.schema + " · queues: " + queues + " · updated " + utc(state.now);
    document.getElementById("logout").hidden = !state.login;
    renderSummary();
    renderQueues();
    renderAccounts();
    renderLanes();
    renderWorkers();
    renderFailures();
    renderJobs();
    for (const span of document.querySelectorAll("span.when")) {
      span.textContent = timeText(span);
    }
  }

  // When the page's server or its database stops answering, the page says so and turns its
  // buttons off: the rows are from the last answer and a click could not act.
  function setOnline(ok, message) {
    online = ok;
    const health = document.getElementById("health");
    health.textContent = ok ? "live" : "not answering";
    health.classList.toggle("down", !ok);
    document.body.classList.toggle("offline", !ok);
    const banner = document.getElementById("offline");
    banner.hidden = ok;
    if (!ok) {
      const since = lastAnswer ? " The rows below are from " + clock(lastAnswer) + "." : "";
      banner.textContent = message + "." + since + " The buttons are off; the page keeps trying.";
    }
    for (const button of document.querySelectorAll("button.requeue")) button.disabled = !ok;
    for (const button of document.querySelectorAll("button.control"))
      button.disabled = !ok || (button.ready !== undefined && !button.ready());
    if (ok && state) renderFailures();
  }

  function notice(message, bad) {
    const node = document.getElementById("notice");
    node.textContent = message;
    node.classList.toggle("bad", !!bad);
    node.hidden = false;
    clearTimeout(noticeTimer);
    noticeTimer = setTimeout(() => (node.hidden = true), 6000);
  }

  class Silent extends Error {}

  async function get(path) {
    let response;
    try {
      response = await fetch(path, { cache: "no-store", credentials: "same-origin" });
    } catch (error) {
      throw new Silent("the page's server is not answering (it stopped, or the network is down)");
    }
    const body = await response.json().catch(() => ({}));
    if (response.status === 401) window.location.assign("login");
    if (!response.ok) throw new Error(body.error || "HTTP " + response.status);
    return body;
  }

  const query = (params) =>
    new URLSearchParams(Object.entries(params).filter(([, v]) => v !== "" && v !== null)).toString();

  async function jobsPart() {
    const view = views.jobs;
    const narrowed = view.owner || view.lane || view.cause_id || view.queue;
    if (!view.view && !narrowed && view.before === null) {
      return { rows: state.jobs, next_before: state.stopped_before, default: true };
    }
    let status = view.view;
    if (status === "stopped") status = "deferred,abandoned";
    if (status === "all") status = "";
    if (!view.view && !narrowed) status = "running,failed,deferred,abandoned";
    const params = { status, queue: view.queue, owner: view.owner, lane: view.lane };
    Object.assign(params, { cause_id: view.cause_id, before: view.before });
    return get("api/jobs?" + query(params));
  }

  async function refresh() {
    clearTimeout(timer);
    try {
      state = await get("api/state");
      const a = views.accounts;
      const l = views.lanes;
      const f = views.failures;
      shown = {
        accounts:
          a.search || a.page
            ? await get("api/accounts?" + query({ search: a.search, page: a.page }))
            : state.accounts,
        lanes:
          l.search || l.page
            ? await get("api/lanes?" + query({ search: l.search, page: l.page }))
            : state.lanes,
        workers: views.workers.page
          ? await get("api/workers?" + query({ page: views.workers.page }))
          : state.workers,
        failures: f.search ? await get("api/failures?" + query({ search: f.search })) : state.failures,
        jobs: await jobsPart(),
      };
      const events = await get("api/events?after=" + lastEvent);
      eventsEnabled = events.enabled;
      lastEvent = events.last;
      lastAnswer = new Date();
      render();
      renderEvents(events.events);
      setOnline(true);
    } catch (error) {
      setOnline(false, error.message);
    } finally {
      const interval = state && state.interval ? state.interval * 1000 : 2000;
      timer = setTimeout(refresh, interval);
    }
  }

  async function post(path, body) {
    const response = await fetch(path, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-Synclane-Token": token },
      body: JSON.stringify(body),
      credentials: "same-origin",
      cache: "no-store",
    });
    const answer = await response.json().catch(() => ({}));
    if (!response.ok) throw new Error(answer.error || "HTTP " + response.status);
    return answer;
  }

  // One change at a time: `work` posts it and says what happened; then the page looks again.
  async function act(button, what, work) {
    if (busy || !online) return;
    busy = true;
    button.disabled = true;
    try {
      notice(await work());
    } catch (error) {
      notice(what + " failed: " + error.message, true);
    } finally {
      busy = false;
      button.disabled = !online || (button.ready !== undefined && !button.ready());
      await refresh();
    }
  }

  function requeue(bodies, button) {
    return act(button, "requeue", async () => {
      let count = 0;
      for (const body of bodies) count += (await post("api/requeue", body)).requeued;
      return "requeued " + count + " job(s)";
    });
  }

  function searchBox(id, view) {
    const input = document.getElementById(id);
    let pause = null;
    input.addEventListener("input", () => {
      clearTimeout(pause);
      pause = setTimeout(() => {
        view.search = input.value.trim();
        if ("page" in view) view.page = 0;
        refresh();
      }, 300);
    });
  }

  searchBox("account-search", views.accounts);
  searchBox("lane-search", views.lanes);
  searchBox("cause-search", views.failures);
  document.getElementById("requeue-all").addEventListener("click", (event) => {
    const queues = [...new Set(shown.failures.rows.map((f) => f.queue))].filter(declared);
    requeue(queues.map((queue) => ({ queue, all: true })), event.currentTarget);
  });
  document.getElementById("job-view").addEventListener("change", (event) => {
    views.jobs.view = event.currentTarget.value;
    views.jobs.before = null;
    refresh();
  });
  document.getElementById("job-filter-clear").addEventListener("click", () => {
    Object.assign(views.jobs, { queue: "", owner: "", lane: "", cause_id: "", before: null });
    refresh();
  });
  document.getElementById("jobs-older").addEventListener("click", () => {
    views.jobs.before = shown.jobs.next_before;
    if (!views.jobs.view && !views.jobs.owner && !views.jobs.lane && !views.jobs.cause_id)
      views.jobs.view = "";
    refresh();
  });
  document.getElementById("jobs-newest").addEventListener("click", () => {
    views.jobs.before = null;
    refresh();
  });
  document.getElementById("logout").addEventListener("click", async () => {
    await post("api/logout", {}).catch(() => null);
    window.location.assign("login");
  });
  document.addEventListener("visibilitychange", () => {
    if (!document.hidden) refresh();
  });
  refresh();
})();
