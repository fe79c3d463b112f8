// The guest upload page: page glue around PicpeakUploadQueue (upload-queue.js).
//
// One file per upload (a resumable tus upload, sent in pieces: upload-queue.js), so one slow or bad file does not hold up or sink the rest; three in flight. Each row
// shows its file's real state (sending %, processing, a thumbnail when ready, "Refused: <reason>" with no
// retry, "Not sent" with a retry), a 429 is waited out by the queue itself, and when the upload can no longer
// be followed (gallery unpublished or expired, password changed, session gone) a note on the page says why.
"use strict";

(() => {
  const _ = window.PicpeakHttp.t;
  const ngettext = window.PicpeakHttp.nt;
  const form = document.getElementById("upload-form");
  if (!form) return;

  const input = document.getElementById("file-input");
  const drop = document.getElementById("drop");
  const list = document.getElementById("files");
  const summary = document.getElementById("summary");
  const viewGallery = document.getElementById("view-gallery");
  const rowTemplate = document.getElementById("file-row");
  const ERROR_STATES = new Set(["failed", "refused", "unsent", "lost"]);

  // Resumable (tus) uploads in pieces of at most 8 MB, or less when the server says so (upload_chunk_mb).
  const CHUNK_BYTES = Math.min(8, Number(form.dataset.chunkMb) || 8) * 1024 * 1024;
  const queue = window.PicpeakUploadQueue.create({
    url: form.dataset.endpoint,
    tus: form.dataset.tusUrl ? { url: form.dataset.tusUrl, chunkBytes: CHUNK_BYTES } : null,
    batchFiles: 1, parallel: 3,
    maxFileBytes: Number(form.dataset.maxMb) * 1024 * 1024,
    fields: () => ({ guest_name: form.elements.guest_name.value.trim() }),
    follow: (uploadId) => ({ wsPath: `/ws/uploads/${uploadId}`, statusUrl: form.dataset.statusBase + uploadId }),
    onUpdate: draw,
    onLost: (uploadId, reason) => {
      let note = document.getElementById("upload-stopped");
      if (!note) {
        note = document.createElement("p");
        note.id = "upload-stopped";
        note.className = "notice";
        note.setAttribute("role", "alert");
        summary.after(note);
      }
      note.textContent = _("%(reason)s Reload the page to see where things stand.", { reason });
    },
  });

  function statusText(item) {
    switch (item.state) {
      case "queued": return item.retries ? _("Waiting to send again…") : _("Waiting…");
      case "waiting": return _("Waiting: %(reason)s", { reason: item.error });
      case "sending": {
        const sending = _("Uploading… %(percent)s %%", { percent: Math.round(100 * item.sent) });
        return item.paused && item.error ? `${sending} · ${item.error}` : sending;
      }
      case "pending": return _("Uploaded · processing…");
      case "processing": return _("Processing…");
      case "complete": return item.photo && item.photo.awaiting_approval ? _("Done · waiting for approval") : _("Done");
      case "duplicate": return _("Already in the gallery.");
      case "refused": return _("Refused: %(reason)s", { reason: item.error });
      default: return item.error || item.state;
    }
  }

  function draw(changed, s) {
    for (const item of changed) {
      if (!item.row) {
        item.row = rowTemplate.content.firstElementChild.cloneNode(true);
        item.row.querySelector(".file-name").textContent = item.name;
        item.row.querySelector(".retry").dataset.index = String(item.index);
        list.appendChild(item.row);
      }
      const row = item.row;
      const progress = row.querySelector("progress");
      progress.hidden = item.state !== "sending";
      progress.value = Math.round(100 * item.sent);
      row.querySelector(".file-status").textContent = statusText(item);
      row.querySelector(".retry").hidden = !queue.canRetry(item);
      const done = item.state === "complete" || item.state === "duplicate";
      row.classList.toggle("is-done", done);
      row.classList.toggle("is-error", ERROR_STATES.has(item.state));
      row.dataset.state = item.state;
      const thumb = row.querySelector(".file-thumb");
      if (item.state === "complete" && item.photo && item.photo.thumb_url && !thumb.querySelector("img")) {
        const img = document.createElement("img");
        img.src = item.photo.thumb_url;
        img.alt = "";
        if (item.photo.width && item.photo.height) { img.width = item.photo.width; img.height = item.photo.height; }
        thumb.replaceChildren(img);
      }
    }
    const failed = s.failed + s.refused + s.unsent;
    const parts = [ngettext("%(done)s of %(num)d done", "%(done)s of %(num)d done", s.total,
      { done: s.complete + s.duplicates })];
    if (failed) parts.push(_("%(num)s failed", { num: failed }));
    summary.textContent = s.total ? parts.join(" · ") : "";
    if (s.complete + s.duplicates) viewGallery.hidden = false;
  }

  list.addEventListener("click", (event) => {
    const button = event.target.closest("button.retry");
    if (button) queue.retry(queue.items[Number(button.dataset.index)]);
  });

  // ---- Choosing and dropping -------------------------------------------------------------------------------
  input.addEventListener("change", () => {
    queue.add(Array.from(input.files));
    input.value = "";
  });
  for (const type of ["dragenter", "dragover"]) {
    drop.addEventListener(type, (event) => { event.preventDefault(); drop.classList.add("is-over"); });
  }
  for (const type of ["dragleave", "drop"]) drop.addEventListener(type, () => drop.classList.remove("is-over"));
  drop.addEventListener("drop", (event) => {
    event.preventDefault();
    if (event.dataTransfer && event.dataTransfer.files.length) queue.add(Array.from(event.dataTransfer.files));
  });
  // A file dropped beside the zone must not navigate away from the page.
  window.addEventListener("dragover", (event) => event.preventDefault());
  window.addEventListener("drop", (event) => event.preventDefault());

  window.addEventListener("beforeunload", (event) => {
    if (queue.busy()) { event.preventDefault(); event.returnValue = ""; }
  });
})();
