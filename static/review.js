// The review queue on the admin gallery page (templates/admin/_review.html): one key per action on the photo in
// focus or the selected ones (a approve, h hide, d delete), arrows move, and the queue follows the admin's
// gallery feed live (a guest's new photo appears, one reviewed in another tab goes). Without this file the
// buttons post the form. Needs http.js and live.js before it.
"use strict";

(() => {
  const _ = window.PicpeakHttp.t;
  const ngettext = window.PicpeakHttp.nt;
  const section = document.getElementById("review");
  if (!section) return;
  const list = document.getElementById("review-list");
  const form = document.getElementById("review-form");
  const countEl = document.getElementById("review-count");
  const empty = document.getElementById("review-empty");
  const selectAll = document.getElementById("review-select-all");
  const KEYS = { a: "approve", h: "hide", d: "delete" };

  function items() { return [...list.querySelectorAll("li.review-item")]; }
  function refresh() {
    const n = items().length;
    countEl.textContent = String(n);
    empty.hidden = n > 0;
  }

  function body(p) {
    if (p.status === "complete") {
      const img = document.createElement("img");
      img.className = "thumb"; img.loading = "lazy"; img.alt = p.filename || "";
      img.src = p.thumb_url || `/api/admin/photos/${p.id}/grid`;
      return img;
    }
    const box = document.createElement("div");
    box.className = "ph ph-waiting"; box.setAttribute("role", "status");
    box.textContent = p.status === "failed" ? _("Failed") : _("Processing…");
    return box;
  }

  function button(action, label, id) {
    const b = document.createElement("button");
    b.type = "submit"; b.name = "action"; b.value = action; b.textContent = label;
    if (action === "delete") b.className = "danger";
    b.setAttribute("formaction", `${form.getAttribute("action")}?only=${id}`);
    return b;
  }

  function upsert(p) {
    let li = list.querySelector(`li[data-id="${p.id}"]`);
    if (!li) {
      li = document.createElement("li");
      li.className = "tile review-item"; li.tabIndex = 0; li.dataset.id = String(p.id);
      const pick = document.createElement("label"); pick.className = "pick";
      const box = document.createElement("input"); box.type = "checkbox"; box.name = "ids"; box.value = String(p.id);
      pick.append(box);
      const meta = document.createElement("div"); meta.className = "meta";
      const name = document.createElement("span"); name.className = "name"; name.textContent = p.filename || "";
      const who = document.createElement("span"); who.className = "badge guest-name"; who.textContent = p.guest_name || _("a guest");
      meta.append(name, who);
      const actions = document.createElement("div"); actions.className = "review-actions";
      actions.append(button("approve", _("Approve"), p.id), button("hide", _("Hide"), p.id),
                     button("delete", _("Delete"), p.id));
      li.append(pick, body(p), meta, actions);
      list.append(li);
    } else if (li.dataset.status !== p.status) {
      const old = li.querySelector(".thumb, .ph");
      if (old) old.replaceWith(body(p));
    }
    li.dataset.status = p.status;
    if (p.guest_name) li.querySelector(".guest-name").textContent = p.guest_name;
    refresh();
  }

  function remove(id) {
    const li = list.querySelector(`li[data-id="${id}"]`);
    if (!li) return;
    const wasFocused = li.contains(document.activeElement);
    const next = li.nextElementSibling || li.previousElementSibling;
    li.remove();
    if (wasFocused && next) next.focus();
    refresh();
  }

  async function act(action, ids) {
    if (!ids.length) return;
    const answer = await window.PicpeakHttp.json(section.dataset.api, { method: "POST", body: { action, ids } });
    if (answer.ok) (answer.data.ids || []).forEach(remove);
    else window.alert(answer.data.error || _("The photos could not be reviewed."));
  }

  function targets(from) {
    const checked = [...list.querySelectorAll("input[name=ids]:checked")].map((b) => Number(b.value));
    if (checked.length) return checked;
    const li = from && from.closest("li.review-item");
    return li ? [Number(li.dataset.id)] : [];
  }

  form.addEventListener("submit", (event) => {
    const submitter = event.submitter;
    if (!submitter || !["approve", "hide", "delete"].includes(submitter.value)) return;
    event.preventDefault();
    const li = submitter.closest("li.review-item");
    const ids = li ? [Number(li.dataset.id)] : targets(null);
    if (submitter.value === "delete" && ids.length > 1 && !window.confirm(ngettext("Delete %(num)d photo for good?", "Delete %(num)d photos for good?", ids.length))) return;
    act(submitter.value, ids);
  });

  list.addEventListener("keydown", (event) => {
    if (event.ctrlKey || event.metaKey || event.altKey) return;
    const li = event.target.closest("li.review-item");
    if (!li) return;
    if (event.key === "ArrowRight" || event.key === "ArrowDown") {
      event.preventDefault(); (li.nextElementSibling || li).focus(); return;
    }
    if (event.key === "ArrowLeft" || event.key === "ArrowUp") {
      event.preventDefault(); (li.previousElementSibling || li).focus(); return;
    }
    const action = KEYS[event.key.toLowerCase()];
    if (!action) return;
    event.preventDefault();
    const ids = targets(li);
    if (action === "delete" && ids.length > 1 && !window.confirm(ngettext("Delete %(num)d photo for good?", "Delete %(num)d photos for good?", ids.length))) return;
    act(action, ids);
  });

  selectAll.addEventListener("change", () => {
    list.querySelectorAll("input[name=ids]").forEach((box) => { box.checked = selectAll.checked; });
  });

  async function resync() {
    const answer = await window.PicpeakHttp.json(section.dataset.api);
    if (!answer.ok) return;
    const seen = new Set(answer.data.photos.map((p) => p.id));
    items().forEach((li) => { if (!seen.has(Number(li.dataset.id))) remove(li.dataset.id); });
    answer.data.photos.forEach(upsert);
  }

  window.PicpeakLive.watchGallery({
    wsPath: section.dataset.wsPath,
    onPhoto: (p) => {
      if (p.awaiting_approval && p.status !== "deleted") upsert(p); else remove(p.id);
    },
    onResync: resync,
  });
  refresh();
})();
