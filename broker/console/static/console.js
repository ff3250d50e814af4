// The console's live updates (SPEC S8). The pages read without this script; it adds the live overview,
// the live event timeline (the broker's own SSE route, resumed with Last-Event-ID by EventSource itself),
// the live job fields, and the Stop button. Everything it writes goes through textContent: never HTML.
"use strict";

const TERMINAL = new Set(["run.completed", "run.failed", "run.cancelled"]);
const SUMMARY_FIELDS = ["tool", "preview", "delta", "reason", "detail", "command", "choice", "error", "output"];
const SUMMARY_CHARS = 200;
const OVERVIEW_REFRESH_MS = 2000;
const SESSION_REFRESH_MS = 3000;

function when(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  return new Date(Math.round(seconds * 1000)).toISOString();
}

function shown(value) {
  if (value === null || value === undefined) return "—";
  return typeof value === "string" ? value : JSON.stringify(value);
}

function summary(payload) {
  const parts = [];
  for (const name of SUMMARY_FIELDS) {
    if (payload[name] === null || payload[name] === undefined) continue;
    const text = shown(payload[name]);
    parts.push(`${name}: ${text.slice(0, SUMMARY_CHARS)}${text.length > SUMMARY_CHARS ? "…" : ""}`);
  }
  return parts.join(" · ");
}

// Stream ids are `<ms>-<seq>`: compare them as numbers, never as text.
function idKey(id) {
  const [ms, seq] = id.split("-");
  return [BigInt(ms), BigInt(seq || "0")];
}

function after(a, b) {
  const [x, y] = [idKey(a), idKey(b)];
  return x[0] > y[0] || (x[0] === y[0] && x[1] > y[1]);
}

// Re-render the server's own page in the background and swap the given regions in: one template, no HTML here.
function refreshRegions(main) {
  return fetch(window.location.href, { headers: { Accept: "text/html" } })
    .then((answer) => (answer.ok ? answer.text() : null))
    .then((html) => {
      if (!html) return;
      const fresh = new DOMParser().parseFromString(html, "text/html");
      for (const region of main.querySelectorAll("[data-region]")) {
        const next = fresh.querySelector(`[data-region="${region.dataset.region}"]`);
        if (next) region.replaceWith(document.adoptNode(next));
      }
    })
    .catch(() => {});
}

function jobPage(main) {
  const jobId = main.dataset.jobId;
  const timeline = document.getElementById("timeline");
  const seen = new Set(Array.from(timeline.querySelectorAll("[data-event-id]"), (li) => li.dataset.eventId));
  let last = main.dataset.lastEventId || "";
  let source = null;
  const statusElement = main.querySelector('[data-field="status"]');
  let shownStatus = statusElement ? statusElement.textContent : "";

  function append(id, payload) {
    const li = document.createElement("li");
    li.dataset.eventId = id;
    const time = document.createElement("time");
    time.textContent = when(payload.timestamp);
    const name = document.createElement("span");
    name.className = "event";
    name.textContent = String(payload.event || "");
    const detail = document.createElement("span");
    detail.className = "summary";
    detail.textContent = summary(payload);
    li.append(time, " ", name, " ", detail);
    timeline.append(li);
  }

  function showJob(job) {
    for (const element of main.querySelectorAll("[data-field]")) {
      const name = element.dataset.field;
      if (!(name in job)) continue;
      const value = job[name];
      element.textContent = name === "created_at" || name === "updated_at" ? when(value) : shown(value);
      if (name === "status") element.className = `status status-${value}`;
    }
    for (const element of main.querySelectorAll("[data-callback-field]")) {
      const name = element.dataset.callbackField;
      if (job.callback && name in job.callback) element.textContent = shown(job.callback[name]);
    }
    if (["completed", "failed", "cancelled"].includes(job.status)) {
      for (const form of main.querySelectorAll("[data-stop-form]")) form.remove();
    }
    if (job.status && job.status !== shownStatus) {
      shownStatus = job.status;
      if (main.querySelector('[data-region="session"]')) refreshRegions(main); // the session's turns moved on
    }
  }

  let refreshing = null;
  function refresh() {
    if (refreshing) return refreshing;
    refreshing = fetch(`/v1/runs/${encodeURIComponent(jobId)}`, { headers: { Accept: "application/json" } })
      .then((answer) => (answer.ok ? answer.json() : null))
      .then((job) => { if (job) showJob(job); })
      .catch(() => {})
      .finally(() => { refreshing = null; });
    return refreshing;
  }

  function follow() {
    const query = last ? `?after=${encodeURIComponent(last)}` : "";
    source = new EventSource(`/v1/runs/${encodeURIComponent(jobId)}/events${query}`);
    source.onmessage = (message) => {
      const id = message.lastEventId;
      if (!id || seen.has(id) || (last && !after(id, last))) return; // each event once, in order
      let payload;
      try { payload = JSON.parse(message.data); } catch { return; }
      seen.add(id);
      last = id;
      append(id, payload);
      if (TERMINAL.has(payload.event)) {
        source.close(); // the stream ends here; EventSource would otherwise reconnect
        refresh().then(() => refresh());
      } else {
        refresh();
      }
    };
  }

  for (const form of main.querySelectorAll("[data-stop-form]")) {
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const button = form.querySelector("[data-action=stop]");
      button.disabled = true;
      fetch(form.action, { method: "POST" })
        .then((answer) => answer.json())
        .then((body) => { if (body && body.status) showJob({ status: body.status }); })
        .catch(() => { button.disabled = false; })
        .finally(() => refresh());
    });
  }

  if (main.dataset.terminal !== "true") follow();
  // A turn waiting for its session records nothing until its turn comes: look at the session now and then.
  setInterval(() => {
    if (!document.hidden && shownStatus === "queued" && main.querySelector('[data-region="session"]')) {
      refreshRegions(main);
    }
  }, SESSION_REFRESH_MS);
}

function overviewPage(main) {
  setInterval(() => {
    if (!document.hidden) refreshRegions(main);
  }, OVERVIEW_REFRESH_MS);
}

document.addEventListener("DOMContentLoaded", () => {
  const main = document.querySelector("main[data-page]");
  if (!main) return;
  if (main.dataset.page === "job") jobPage(main);
  if (main.dataset.page === "overview") overviewPage(main);
});
