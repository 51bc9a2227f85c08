// The console's one script: live updates of the pending list (server-sent events), and the
// edited input checked against the tool's schema as it is typed (debounced). No inline script.
"use strict";

const csrf = document.querySelector('meta[name="csrf-token"]').content;

function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

async function checkInput(textarea) {
  const out = document.getElementById(textarea.getAttribute("aria-describedby"));
  try {
    const response = await fetch(textarea.dataset.check, {
      method: "POST",
      headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf },
      body: JSON.stringify({ input: textarea.value }),
      credentials: "same-origin",
    });
    const answer = await response.json();
    out.textContent = answer.message;
    out.className = answer.ok ? "check ok" : "check bad";
    textarea.setAttribute("aria-invalid", answer.ok ? "false" : "true");
    const approve = textarea.form.querySelector("button.approve");
    if (approve) approve.disabled = !answer.ok;
  } catch (e) {
    out.textContent = "Could not check the input (the console does not answer).";
    out.className = "check bad";
  }
}

function wireEditors(root) {
  root.querySelectorAll("textarea[data-check]").forEach((textarea) => {
    if (textarea.dataset.wired) return;
    textarea.dataset.wired = "1";
    textarea.addEventListener("input", debounce(() => checkInput(textarea), 300));
  });
}

// Bring the list in line with the server's: drop approvals no longer pending, add new ones in
// order, and leave the ones being edited alone.
async function refresh(list, say) {
  const response = await fetch(list.dataset.fragment, { credentials: "same-origin" });
  if (!response.ok) return;
  const fresh = document.createElement("div");
  fresh.innerHTML = await response.text();
  const wanted = new Map();
  fresh.querySelectorAll("li[data-approval]").forEach((li) => wanted.set(li.dataset.approval, li));
  let ol = list.querySelector("ol.approvals");
  list.querySelectorAll("li[data-approval]").forEach((li) => {
    if (!wanted.has(li.dataset.approval)) li.remove();
  });
  let added = 0;
  let before = null;
  for (const [id, li] of [...wanted.entries()].reverse()) {
    const existing = document.getElementById("approval-" + id);
    if (existing) {
      before = existing;
      continue;
    }
    ol.insertBefore(li, before);
    before = li;
    added += 1;
  }
  const empty = list.querySelector("[data-empty]");
  if (empty && wanted.size) empty.remove();
  if (!wanted.size && !empty) {
    const p = document.createElement("p");
    p.className = "empty";
    p.dataset.empty = "1";
    p.textContent = "No approval is waiting for you.";
    list.insertBefore(p, ol);
  }
  wireEditors(list);
  if (say) say(added);
}

function live() {
  const list = document.getElementById("pending");
  if (!list) return;
  const status = document.getElementById("live");
  const run = (message) => refresh(list, () => { status.textContent = message; });
  const source = new EventSource(list.dataset.events);
  source.addEventListener("requested", (e) => {
    const data = JSON.parse(e.data);
    run("New approval waiting: " + data.tool);
  });
  const decided = (e) => {
    const data = JSON.parse(e.data);
    run("Approval for " + data.tool + " " + e.type + ".");
  };
  source.addEventListener("approved", decided);
  source.addEventListener("denied", decided);
  source.addEventListener("completed", (e) => {
    const data = JSON.parse(e.data);
    status.textContent = "Call of " + data.tool + " completed: " + data.status + ".";
  });
  // On each (re)connection, catch up with what changed while not connected.
  source.addEventListener("open", () => {
    list.dataset.live = "on";
    refresh(list, null);
  });
  source.addEventListener("error", () => { list.dataset.live = "off"; });
}

wireEditors(document);
live();
